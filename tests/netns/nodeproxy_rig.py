"""Real ``ambit nodeproxy`` processes serving one pod, for the drain and hand-over tests (ztunnel's
``test_shutdown_drain`` shape, with processes and namespaces instead of an in-process proxy).

:class:`DrainRig` makes three network namespaces: ``node`` (where the proxies run: their admin, stats and readiness
ports), ``pod`` (eth0 ``POD_IP``, a TCP echo server on ``ECHO_PORT``, the proxies' in-pod listeners) and ``client``
(``CLIENT_IP``, the peer's side of the pod's veth). A minimal lab directory gives the proxies their ZDS socket,
local config file and local CA; the test plays the node agent (:class:`~ambit.zds.server.ZdsServer`) and an HBONE
client of the pod with a certificate of the same CA. Proxies start with ``--notify-fd`` and are ready when they
write ``READY=1``; each is stopped (SIGTERM, then SIGKILL after a bound) if the test has not.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ambit.commands import SubprocessRunner
from ambit.identity.localca import LocalCa
from ambit.lab.network.topology import Topology
from ambit.model.identity import SpiffeId
from ambit.proxy.hbone_client import HboneClient
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.sockets import NetnsSocketFactory, connect
from ambit.redirect import InPodSettings
from ambit.redirect.apply import apply_inpod
from ambit.zds import ZDS_SOCKET
from ambit.zds.server import ZdsServer

POD_IP, CLIENT_IP = "198.18.252.1", "198.18.252.9"
ECHO_PORT = 9000
TD = "cluster.local"
POD_ID = SpiffeId(TD, "apps", "web")
CLIENT_ID = SpiffeId(TD, "apps", "client")
POD_UID = "3f0c0d1e-0000-4000-8000-00000000web0"
WORKLOADS = f"""\
workloads:
- uid: Kubernetes//Pod/apps/web-0
  name: web-0
  namespace: apps
  workloadIps: [{POD_IP}]
  protocol: HBONE
  serviceAccount: web
  node: node-1
- uid: Kubernetes//Pod/apps/client-0
  name: client-0
  namespace: apps
  workloadIps: [{CLIENT_IP}]
  protocol: HBONE
  serviceAccount: client
  node: node-2
"""
READY_TIMEOUT = 60.0
REPO = Path(__file__).resolve().parents[2]


def sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def listening(ns: str) -> set[str]:
    """``proto local-address:port`` of every listening socket in ``ns``."""
    text = sh("ip", "netns", "exec", ns, "ss", "-Hltnu")
    return {f"{line.split()[0]} {line.split()[4]}" for line in text.splitlines() if line.strip()}


@dataclass
class Proxy:
    proc: subprocess.Popen[bytes]
    log: Path
    ready_fd: int

    async def ready(self) -> None:
        """Until the proxy wrote READY=1 on its notify fd; fails with its log if it exits or takes too long."""
        loop = asyncio.get_running_loop()
        try:
            data = await asyncio.wait_for(loop.run_in_executor(None, os.read, self.ready_fd, 64), READY_TIMEOUT)
        except TimeoutError:
            raise AssertionError(f"node proxy not ready in {READY_TIMEOUT:g} s:\n{self.tail()}") from None
        assert data == b"READY=1\n", f"node proxy said {data!r}:\n{self.tail()}"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    async def exited(self, within: float) -> int:
        """The exit status, once the process exited within ``within`` seconds."""
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(None, self.proc.wait), within)
        except TimeoutError:
            raise AssertionError(f"node proxy still running after {within:g} s:\n{self.tail()}") from None

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@dataclass
class DrainRig:
    directory: Path
    node: str
    pod: str
    client: str
    topology: Topology
    proxies: list[Proxy] = field(default_factory=list)
    client_ports: dict[int, int] = field(default_factory=dict)
    """id() of each HBONE client -> its local port (which process serves it: ``ss`` in the pod names the peer)."""

    def start_proxy(self, *flags: str, env: dict[str, str] | None = None) -> Proxy:
        read_end, write_end = os.pipe()
        log = self.directory / f"nodeproxy-{len(self.proxies)}.log"
        argv = ["ip", "netns", "exec", self.node, sys.executable, "-m", "ambit.cli", "nodeproxy"]
        argv += ["--node", "node-1", "--lab-dir", str(self.topology.path), "--notify-fd", str(write_end), *flags]
        environ = {k: v for k, v in os.environ.items() if "TERMINATION" not in k} | (env or {})
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv, cwd=REPO, stdout=out, stderr=out, stdin=subprocess.DEVNULL, pass_fds=(write_end,), env=environ
            )
        os.close(write_end)
        proxy = Proxy(proc, log, read_end)
        self.proxies.append(proxy)
        return proxy

    async def hbone_client(self) -> HboneClient:
        """A new HBONE connection from the client namespace to the pod's 15008, as ``CLIENT_ID``."""
        ca = LocalCa(self.topology.mesh_ca_dir, trust_domain=TD)
        cert = await ca.fetch_certificate(CLIENT_ID)
        fd = os.open(f"/run/netns/{self.client}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            factory = NetnsSocketFactory(fd, name="test client", mark=0)
            await factory.start()
            try:
                sock = await connect(factory, (POD_IP, 15008))
            finally:
                await factory.aclose()
        finally:
            os.close(fd)
        port = sock.getsockname()[1]
        client = await HboneClient.connect(sock, cert, frozenset({POD_ID}), trust_domain=TD)
        self.client_ports[id(client)] = port
        return client

    async def tunnel(self, client: HboneClient) -> HboneStream:
        return await client.open_tunnel(f"{POD_IP}:{ECHO_PORT}", [])


async def echo(stream: HboneStream, data: bytes) -> None:
    await stream.write(data)
    got = b""
    async with asyncio.timeout(10):
        while len(got) < len(data):
            chunk = await stream.read()
            assert chunk, f"the tunnel ended after {got!r}"
            got += chunk
    assert got == data


@contextlib.contextmanager
def namespaces() -> Iterator[tuple[str, str, str]]:
    tag = secrets.token_hex(2)
    node, pod, client = f"npn{tag}", f"npp{tag}", f"npc{tag}"
    try:
        for ns in (node, pod, client):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", pod, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", client)
        for ns, ip in ((pod, POD_IP), (client, CLIENT_IP)):
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
        # The node agent's in-pod rules: what routes the replies of the proxy's spoofed-source connections back.
        apply_inpod(pod, InPodSettings(), "nftables", SubprocessRunner())
        yield node, pod, client
    finally:
        for ns in (node, pod, client):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


@contextlib.asynccontextmanager
async def drain_rig(tmp_path: Path) -> AsyncIterator[tuple[DrainRig, ZdsServer]]:
    with namespaces() as (node, pod, client):
        topology = Topology.new(1, tmp_path / "lab")
        topology.path.mkdir(parents=True)
        topology.save()
        topology.mesh_config_file.parent.mkdir(parents=True, exist_ok=True)
        topology.mesh_config_file.write_text(WORKLOADS)
        run = topology.node_dir("node-1") / "run"
        run.mkdir(parents=True)
        echo_log = open(tmp_path / "echo.log", "wb")  # noqa: SIM115, ASYNC230 - closed below; a local file
        echo_server = subprocess.Popen(  # noqa: ASYNC220 - started, not waited for
            ["ip", "netns", "exec", pod, sys.executable, "-m", "ambit.lab.apps", "tcp-echo", "--port", str(ECHO_PORT)],
            cwd=REPO,
            stdout=echo_log,
            stderr=echo_log,
        )
        agent = ZdsServer(run / ZDS_SOCKET)
        await agent.start()
        rig = DrainRig(tmp_path, node, pod, client, topology)
        try:
            async with asyncio.timeout(30):
                while f"tcp 0.0.0.0:{ECHO_PORT}" not in listening(pod):
                    assert echo_server.poll() is None, (tmp_path / "echo.log").read_text()
                    await asyncio.sleep(0.05)
            yield rig, agent
        finally:
            for proxy in rig.proxies:
                proxy.stop(signal.SIGKILL)
                proxy.proc.wait(10)
                os.close(proxy.ready_fd)
            await agent.aclose()
            echo_server.terminate()
            echo_server.wait(10)
            echo_log.close()


async def add_pod(agent: ZdsServer, rig: DrainRig, proxies: int = 1) -> None:
    """Play the node agent: once ``proxies`` node proxies are connected, hand the pod to the newest."""
    async with asyncio.timeout(30):
        while agent.connections < proxies:  # noqa: ASYNC110 - the server's own bookkeeping
            await asyncio.sleep(0.02)
    await agent.add(POD_UID, f"/run/netns/{rig.pod}", {"name": "web-0", "namespace": "apps", "service_account": "web"})
