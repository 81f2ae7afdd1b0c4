"""What the hand-over opened on the ZDS socket (issue 21: ``SuccessorReady``, ``ZdsHello.successor_notice``), attacked.

Who can reach the socket: the node agent binds it 0600, owned by root (:class:`~ambit.zds.server.ZdsServer`), in a
host directory only the node agent's and the node proxy's pods mount (deploy/: ``/var/run/ztunnel``). A process that
is not root, and a pod's process (root in its own user namespace, a high uid on the host), cannot connect even where
the directory can be walked; root can (the control); and no manifest in deploy/ but those two DaemonSets mounts the
directory (or a parent of it) from the host. What a connected peer can do with the new message:

- a forged ``SuccessorReady`` to a live node proxy (from whatever plays the node agent) only changes how long its
  connections may run once it is told to stop (:mod:`ambit.inpod.drain`): it does not stop the proxy from accepting,
  and its listeners and tunnels go on serving;
- a forged message that carries a netns fd (a ``SuccessorReady``, a ``Keep``, a ``Del``, an ``Add`` with two fds)
  is refused with a nack and the connection closed: the proxy opens no listener in that namespace and keeps no
  descriptor of it; the pod it was given stays served across the reconnect;
- on the agent's side, a peer that is not a node proxy (sends requests instead of acks, garbage, or fds) is dropped
  and never counts as a successor: the real proxy is never told a successor holds its pods, and new pods go to it
  again.

The node proxy is a real ``ambit nodeproxy`` process in real namespaces (:mod:`tests.netns.nodeproxy_rig`), facing
an agent the test plays over a real SEQPACKET socket with :mod:`ambit.zds.transport`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.netns.nodeproxy_rig import POD_UID, DrainRig, Proxy, drain_rig, echo, listening, sh

from ambit.zds import ZDS_SOCKET
from ambit.zds.client import ZdsClient
from ambit.zds.protocol import (
    AddRequest,
    Datagram,
    DelRequest,
    KeepRequest,
    Request,
    SnapshotSentRequest,
    SuccessorReadyRequest,
    WorkloadInfo,
    decode_hello,
    decode_response,
    encode_hello,
    encode_request,
    encode_response,
)
from ambit.zds.server import ZdsLinkError, ZdsServer
from ambit.zds.transport import ZdsSocket

pytestmark = [pytest.mark.root, pytest.mark.timeout(120)]

WEB = WorkloadInfo("web-0", "apps", "web")
POD_LISTENERS = {"tcp 0.0.0.0:15001", "tcp 0.0.0.0:15006", "tcp 0.0.0.0:15008"}
CONNECT = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
    "try:\n"
    "    s.connect(sys.argv[1])\n"
    "except OSError as exc:\n"
    "    print(type(exc).__name__)\n"
    "else:\n"
    "    print('connected')\n"
)


# --- who can reach the socket ----------------------------------------------------------------------------------------


@pytest.fixture
async def walkable_agent() -> AsyncIterator[ZdsServer]:
    """The node agent's server in a directory anyone may walk (0755, as ``/var/run/ztunnel`` is), so that only the
    socket's own mode stands in the way."""
    directory = Path(tempfile.mkdtemp(prefix="ambit-zds-", dir="/tmp"))
    os.chmod(directory, 0o755)
    server = ZdsServer(directory / ZDS_SOCKET)
    await server.start()
    try:
        yield server
    finally:
        await server.aclose()
        os.rmdir(directory)


SYSTEM_PYTHON = "/usr/bin/python3"
"""The child's interpreter: one any user may run (the test's own may sit under root's home)."""


def connect_as(path: Path, *wrapper: str) -> str:
    argv = [*wrapper, SYSTEM_PYTHON, "-c", CONNECT, str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


async def test_only_root_can_connect_to_the_node_agents_zds_socket_not_a_user_nor_a_pods_root(
    walkable_agent: ZdsServer,
) -> None:
    path = walkable_agent.socket_path
    loop = asyncio.get_running_loop()
    nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    # A pod's root: uid 0 in a user namespace of its own, mapped to a high uid on the host (as the lab's pods).
    pod_root = ("setpriv", "--reuid=200000", "--regid=200000", "--clear-groups", "unshare", "--user", "--map-root-user")
    assert await loop.run_in_executor(None, connect_as, path) == "connected"  # the control: root gets in
    assert await loop.run_in_executor(None, connect_as, path, *nobody) == "PermissionError"
    assert await loop.run_in_executor(None, connect_as, path, *pod_root) == "PermissionError"


REPO = Path(__file__).resolve().parents[2]
ZDS_HOST_DIR = "/var/run/ztunnel"
MOUNTERS = {("istio-system", "DaemonSet", "istio-cni-node"), ("istio-system", "DaemonSet", "ztunnel")}


def host_paths(document: dict[str, Any]) -> list[str]:
    """The hostPath volumes' paths of a manifest's pod template (or pod)."""
    spec = document.get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or spec
    return [str(v["hostPath"].get("path", "")) for v in pod.get("volumes") or [] if isinstance(v.get("hostPath"), dict)]


def test_only_the_node_agent_and_the_node_proxy_mount_the_zds_sockets_host_directory() -> None:
    found = set()
    for path in sorted((REPO / "deploy").rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if not isinstance(document, dict):
                continue
            for mounted in host_paths(document):
                reaches = ZDS_HOST_DIR.startswith(mounted.rstrip("/") + "/") or mounted.rstrip("/") == ZDS_HOST_DIR
                if reaches or mounted in ("/", ""):
                    meta = document.get("metadata") or {}
                    found.add((str(meta.get("namespace", "")), str(document.get("kind")), str(meta.get("name"))))
    assert found == MOUNTERS, found


# --- a real node proxy facing a forger -------------------------------------------------------------------------------


class ForgedAgent:
    """Plays the node agent on the rig's ZDS socket, speaking raw ZDS datagrams to the real proxy."""

    def __init__(self, path: Path) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self.listener.bind(str(path))
        self.listener.listen(4)
        self.listener.setblocking(False)
        self.conn: ZdsSocket | None = None

    async def accept(self) -> bool:
        """The next connection from the proxy; whether its hello asked for successor notices."""
        async with asyncio.timeout(30):
            sock, _ = await asyncio.get_running_loop().sock_accept(self.listener)
        if self.conn is not None:
            self.conn.close()
        self.conn = ZdsSocket(sock)
        return decode_hello(await self.receive())

    async def receive(self) -> Datagram:
        assert self.conn is not None
        async with asyncio.timeout(15):
            datagram = await self.conn.receive()
        assert datagram is not None, "the proxy closed the connection"
        return datagram

    async def send(self, request: Request, fds: tuple[int, ...] | None = None) -> None:
        assert self.conn is not None
        data, own = encode_request(request)
        await self.conn.send(data, own if fds is None else fds)

    async def ask(self, request: Request, fds: tuple[int, ...] | None = None) -> str:
        """Send a request, return the proxy's Ack error ('' for success)."""
        await self.send(request, fds)
        return decode_response(await self.receive())

    async def closed_by_proxy(self) -> bool:
        assert self.conn is not None
        async with asyncio.timeout(15):
            return await self.conn.receive() is None

    async def snapshot(self, pod_fd: int) -> None:
        """A fresh connection's snapshot: the one pod the proxy is given, then SnapshotSent."""
        assert await self.accept()  # our proxies ask for the notice
        assert await self.ask(AddRequest(POD_UID, WEB, pod_fd)) == ""
        assert await self.ask(SnapshotSentRequest()) == ""

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.listener.close()


@pytest.fixture
async def forged(tmp_path: Path) -> AsyncIterator[tuple[DrainRig, Proxy, ForgedAgent, int]]:
    """A ready proxy given the rig's pod by a forged agent; the pod's netns fd (the agent's)."""
    async with drain_rig(tmp_path) as (rig, agent):
        await agent.aclose()  # the test plays the agent
        fake = ForgedAgent(agent.socket_path)
        pod_fd = os.open(f"/run/netns/{rig.pod}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            proxy = rig.start_proxy("--drain-deadline", "5")
            await fake.snapshot(pod_fd)
            await proxy.ready()
            yield rig, proxy, fake, pod_fd
        finally:
            fake.close()
            os.close(pod_fd)


async def serves(rig: DrainRig, text: bytes) -> None:
    """A new HBONE connection and tunnel to the pod, and an echo through it."""
    client = await rig.hbone_client()
    try:
        await echo(await rig.tunnel(client), text)
    finally:
        await client.aclose()


def netns_fds(pid: int, path: str) -> list[str]:
    """The descriptors of process ``pid`` that refer to the network namespace at ``path`` (however they were
    opened: the link's text may be a path or ``net:[inode]``, the file it leads to is the namespace)."""
    wanted = os.stat(path)
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            seen = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if (seen.st_dev, seen.st_ino) == (wanted.st_dev, wanted.st_ino):
            found.append(fd)
    return found


async def test_a_forged_successor_notice_does_not_stop_a_live_proxy_from_accepting(
    forged: tuple[DrainRig, Proxy, ForgedAgent, int],
) -> None:
    rig, proxy, fake, _ = forged
    await serves(rig, b"before the notice")
    assert await fake.ask(SuccessorReadyRequest(True)) == ""  # the proxy takes the agent's word
    for _ in range(3):  # and keeps accepting all along: the notice only lengthens a drain it is told to start
        await asyncio.sleep(1.0)
        assert listening(rig.pod) >= POD_LISTENERS
        await serves(rig, b"after the notice")
    assert await fake.ask(SuccessorReadyRequest(False)) == ""
    await serves(rig, b"after the withdrawal")
    assert proxy.proc.poll() is None
    log = proxy.tail()
    assert "successor holds every pod" in log and "draining" not in log, log


@pytest.mark.parametrize(
    "message",
    ["successor_ready_with_fd", "keep_with_fd", "del_with_fd", "add_with_two_fds"],
)
async def test_a_forged_message_carrying_another_netns_opens_nothing_there_and_leaves_the_pod_served(
    forged: tuple[DrainRig, Proxy, ForgedAgent, int], message: str
) -> None:
    rig, proxy, fake, pod_fd = forged
    victim = f"ambit-f{secrets.token_hex(3)}-victim"
    sh("ip", "netns", "add", victim)
    victim_fd = os.open(f"/run/netns/{victim}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        sh("ip", "-n", victim, "link", "set", "lo", "up")
        forgeries: dict[str, tuple[Request, tuple[int, ...]]] = {
            "successor_ready_with_fd": (SuccessorReadyRequest(True), (victim_fd,)),
            "keep_with_fd": (KeepRequest("victim-uid"), (victim_fd,)),
            "del_with_fd": (DelRequest(POD_UID), (victim_fd,)),
            "add_with_two_fds": (AddRequest("victim-uid", WEB, victim_fd), (victim_fd, pod_fd)),
        }
        request, fds = forgeries[message]
        assert netns_fds(os.getpid(), f"/run/netns/{victim}") != []  # the probe's controls: the test holds one,
        assert netns_fds(proxy.proc.pid, f"/run/netns/{rig.pod}") != []  # and the proxy one of the pod it serves
        assert await fake.ask(request, fds) != ""  # a nack
        assert await fake.closed_by_proxy()  # then the connection is closed

        # Nothing in the victim's namespace, no descriptor of it kept; the given pod still served.
        assert listening(victim) == set()
        assert netns_fds(proxy.proc.pid, f"/run/netns/{victim}") == []
        assert listening(rig.pod) >= POD_LISTENERS
        await serves(rig, b"still served")

        # The proxy reconnects; a snapshot that still holds its pod keeps it, and the victim stays untouched.
        assert await fake.accept()
        assert await fake.ask(KeepRequest(POD_UID)) == ""
        assert await fake.ask(SnapshotSentRequest()) == ""
        await serves(rig, b"after the reconnect")
        assert listening(victim) == set() and netns_fds(proxy.proc.pid, f"/run/netns/{victim}") == []
        assert proxy.proc.poll() is None and "Traceback" not in proxy.tail(), proxy.tail()
    finally:
        os.close(victim_fd)
        with contextlib.suppress(subprocess.CalledProcessError):
            sh("ip", "netns", "del", victim)


# --- the agent facing a peer that is not a node proxy ----------------------------------------------------------------


class Rogue:
    """A connected peer of the agent that is not a node proxy: raw datagrams of the test's choosing."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self.sock.connect(str(path))
        self.sock.settimeout(10)

    def send(self, data: bytes, fds: tuple[int, ...] = ()) -> None:
        socket.send_fds(self.sock, [data], list(fds))

    def dropped(self) -> bool:
        """Whether the agent closed the connection (after whatever it sent before)."""
        try:
            while self.sock.recv(2048):
                pass
        except ConnectionResetError:
            pass
        return True

    def close(self) -> None:
        self.sock.close()


class Recorded:
    """A pod handler that records what it is asked (no listeners: the agent's side is under test)."""

    def __init__(self) -> None:
        self.opened: list[str] = []

    async def open_listeners(self, uid: str, info: WorkloadInfo, netns_fd: int) -> None:
        self.opened.append(uid)

    async def stop(self, uid: str) -> None:
        pass


ROGUE_SCRIPTS = {
    "a request instead of an ack": lambda: [encode_hello(), encode_request(SuccessorReadyRequest(True))[0]],
    "a second hello": lambda: [encode_hello(), encode_hello()],
    "garbage after the hello": lambda: [encode_hello(), b"\xff\x01\x02"],
    "an ack carrying an fd": lambda: [encode_hello(), encode_response()],
}
FD_CARRYING = "an ack carrying an fd"


@pytest.mark.parametrize("script", sorted(ROGUE_SCRIPTS))
async def test_a_peer_that_is_not_a_node_proxy_is_dropped_and_never_counts_as_a_successor(
    tmp_path: Path, script: str
) -> None:
    server = ZdsServer(tmp_path / ZDS_SOCKET)
    await server.start()
    heard: list[bool] = []
    pods = Recorded()
    client = ZdsClient(server.socket_path, pods, on_successor=heard.append)
    await client.start()
    rogue: Rogue | None = None
    try:
        async with asyncio.timeout(10):
            while not client.ready:  # noqa: ASYNC110 - the client's own state
                await asyncio.sleep(0.01)
        fds_before = len(os.listdir("/proc/self/fd"))
        rogue = Rogue(server.socket_path)
        loop = asyncio.get_running_loop()
        messages = ROGUE_SCRIPTS[script]()
        spare = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        try:
            for n, data in enumerate(messages):  # one script's last message carries an fd: closed, not kept
                fds = (spare,) if script == FD_CARRYING and n == len(messages) - 1 else ()
                await loop.run_in_executor(None, rogue.send, data, fds)
        finally:
            os.close(spare)
        assert await loop.run_in_executor(None, rogue.dropped)
        rogue.close()
        rogue = None
        async with asyncio.timeout(10):
            while server.connections != 1:  # noqa: ASYNC110 - the server's own bookkeeping
                await asyncio.sleep(0.01)
        assert len(os.listdir("/proc/self/fd")) <= fds_before  # the agent kept neither the rogue's fd nor socket
        await server.add("uid-new", "/proc/self/ns/net", {"name": "new-0", "namespace": "apps"})  # to the real one
        assert pods.opened == ["uid-new"]
        assert True not in heard, heard  # never told that a successor holds its pods
    finally:
        if rogue is not None:
            rogue.close()
        await client.aclose()
        await server.aclose()


async def test_a_peer_that_says_hello_and_never_acks_is_dropped_and_never_counts_as_a_successor(
    tmp_path: Path,
) -> None:
    server = ZdsServer(tmp_path / ZDS_SOCKET)
    await server.start()
    heard: list[bool] = []
    pods = Recorded()
    client = ZdsClient(server.socket_path, pods, on_successor=heard.append)
    await client.start()
    try:
        async with asyncio.timeout(10):
            while not client.ready:  # noqa: ASYNC110 - the client's own state
                await asyncio.sleep(0.01)
        await server.add("uid-a", "/proc/self/ns/net", {"name": "a-0", "namespace": "apps"})
        rogue = Rogue(server.socket_path)
        try:
            rogue.send(encode_hello())
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(10):
                while server.connections != 2:  # noqa: ASYNC110 - the server's own bookkeeping
                    await asyncio.sleep(0.01)
            # It is the newest connection, so a pod added now goes to it and fails (it never acks): the agent's rule
            # as istio-cni's; the rogue is dropped at the 5 s ack deadline.
            with pytest.raises(ZdsLinkError):
                await server.add("uid-b", "/proc/self/ns/net", {"name": "b-0", "namespace": "apps"})
            assert await loop.run_in_executor(None, rogue.dropped)
        finally:
            rogue.close()
        await server.add("uid-c", "/proc/self/ns/net", {"name": "c-0", "namespace": "apps"})
        assert pods.opened == ["uid-a", "uid-c"]
        assert True not in heard, heard
    finally:
        await client.aclose()
        await server.aclose()
