"""The node proxy's data path in both IP families, with real namespaces, real IPv4 and IPv6 redirection rules and
two in-process node proxies (ztunnel's dual-stack ``namespaced.rs`` cases).

The rig: a client pod ``dsc<hex>`` served by the proxy of ``node-1`` and a server pod ``dss<hex>`` served by the
proxy of ``node-2``, joined by a veth pair, each with 198.18.253.x/24 and a per-run ULA ``fd00:ab:<hex>::x/64``
(no duplicate address detection: the addresses are usable at once), and the node agent's in-pod rules for both
families. The server runs the lab's TCP echo on port 9000 in both families (``whoami`` answers with the client's
address as the server saw it). A third pod ``dsl<hex>`` on ``node-1`` has IPv6 turned off in its netns. Both
proxies sign with one local CA, so each checks the other's SPIFFE identity. Everything is removed in the fixture's
finalizer.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ambit.commands import SubprocessRunner
from ambit.dns.server import DnsServerSettings
from ambit.identity.localca import LocalCa
from ambit.identity.manager import CertificateManager
from ambit.inpod.workloads import DnsProxySettings, PodListenerManager
from ambit.model.identity import SpiffeId
from ambit.model.state import WorkloadState
from ambit.model.workload import NetworkAddress, PortMapping, Service, TunnelProtocol, Workload, parse_ip
from ambit.proxy.context import ProxyContext, workload_uid
from ambit.proxy.hbone_client import HboneClient, TunnelRefusedError
from ambit.proxy.pool import ConnectionPool
from ambit.proxy.settings import ProxySettings
from ambit.proxy.sockets import NetnsSocketFactory, connect
from ambit.redirect import InPodSettings
from ambit.redirect.apply import apply_inpod
from ambit.telemetry.accesslog import AccessLog
from ambit.telemetry.metrics import ProxyMetrics
from ambit.zds.protocol import WorkloadInfo

pytestmark = [pytest.mark.root, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]
TD = "cluster.local"
PORT = 9000
CLIENT = WorkloadInfo("client-0", "apps", "client")
SERVER = WorkloadInfo("server-0", "apps", "server")
LEGACY = WorkloadInfo("legacy-0", "apps", "legacy")
CLIENT_V4, SERVER_V4, LEGACY_V4 = "198.18.253.1", "198.18.253.2", "198.18.253.3"
HOSTNAME = "server.apps.svc.cluster.local"
SERVICE_KEY = f"apps/{HOSTNAME}"
LEGACY_HOSTNAME = "legacy.apps.svc.cluster.local"
"""An IPv6 VIP whose only endpoint, the legacy pod on the client's node, has IPv4 only."""

CALL = r"""
import json, socket, sys
host, port, mark = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
if mark:  # outside the mesh: the pod's own rules let a marked connection leave as it is
    s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark)
s.settimeout(10)
try:
    s.connect((host, port))
    s.sendall(b"whoami\n")
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    print(json.dumps({"local": s.getsockname()[0], "reply": data.decode()}))
except OSError as exc:
    print(json.dumps({"error": repr(exc)}))
"""

ASK = r"""
import json, sys
import dns.message, dns.query, dns.rdatatype
out = []
for spec in json.loads(sys.argv[1]):
    query = dns.message.make_query(spec["name"], spec["type"])
    call = dns.query.tcp if spec["proto"] == "tcp" else dns.query.udp
    r = call(query, spec["server"], port=15053, timeout=5)
    out.append(sorted(f"{dns.rdatatype.to_text(rr.rdtype)} {x}" for rr in r.answer for x in rr))
print(json.dumps(out))
"""


def sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def listening(ns: str) -> set[str]:
    text = sh("ip", "netns", "exec", ns, "ss", "-Hltnu")
    return {f"{line.split()[0]} {line.split()[4]}" for line in text.splitlines() if line.strip()}


@dataclass
class Rig:
    client: str
    server: str
    legacy: str
    client_v6: str
    server_v6: str
    legacy_vip: str
    node1: ProxyContext
    node2: ProxyContext
    tmp: Path

    def address(self, family: str, of: str) -> str:
        v4 = {"client": CLIENT_V4, "server": SERVER_V4}
        v6 = {"client": self.client_v6, "server": self.server_v6}
        return (v4 if family == "ipv4" else v6)[of]


def _workloads(client_v6: str, server_v6: str) -> list[Workload]:
    def pod(info: WorkloadInfo, node: str, *ips: str, **extra: Any) -> Workload:
        return Workload(
            workload_uid(info),
            info.name,
            info.namespace,
            tuple(parse_ip(ip) for ip in ips),
            tunnel_protocol=TunnelProtocol.HBONE,
            service_account=info.service_account,
            node=node,
            **extra,
        )

    return [
        pod(CLIENT, "node-1", CLIENT_V4, client_v6),
        pod(SERVER, "node-2", SERVER_V4, server_v6, services={SERVICE_KEY: (PortMapping(PORT, PORT),)}),
        pod(LEGACY, "node-1", LEGACY_V4, services={f"apps/{LEGACY_HOSTNAME}": (PortMapping(PORT, PORT),)}),
    ]


def _state(workloads: list[Workload], legacy_vip: str) -> WorkloadState:
    state = WorkloadState()
    state.upsert_service(Service("server", "apps", HOSTNAME, ports=(PortMapping(PORT, PORT),)))  # headless
    vip = (NetworkAddress("", parse_ip(legacy_vip)),)  # on the client's subnet: routed there, then redirected
    state.upsert_service(Service("legacy", "apps", LEGACY_HOSTNAME, vips=vip, ports=(PortMapping(PORT, PORT),)))
    for workload in workloads:
        state.upsert_workload(workload)
    return state


@contextlib.contextmanager
def _namespaces(tag: str, prefix: str) -> Iterator[tuple[str, str, str]]:
    client, server, legacy = f"dsc{tag}", f"dss{tag}", f"dsl{tag}"
    try:
        for ns in (client, server, legacy):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "netns", "exec", legacy, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
        sh("ip", "netns", "exec", legacy, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
        sh("ip", "netns", "exec", legacy, "sysctl", "-qw", "net.ipv6.conf.lo.disable_ipv6=1")
        # The server's eth0 goes to the client, its eth1 to the legacy pod (a /32 route each way for that one).
        sh("ip", "-n", client, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", server)
        sh("ip", "-n", legacy, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1", "netns", server)
        for ns, dev, v4, v6 in (
            (client, "eth0", CLIENT_V4, f"{prefix}1"),
            (server, "eth0", SERVER_V4, f"{prefix}2"),
            (legacy, "eth0", LEGACY_V4, None),
        ):
            sh("ip", "-n", ns, "addr", "add", f"{v4}/24", "dev", dev)
            if v6 is not None:
                sh("ip", "-n", ns, "addr", "add", f"{v6}/64", "dev", dev, "nodad")
            sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", server, "link", "set", "eth1", "up")
        sh("ip", "-n", server, "route", "add", f"{LEGACY_V4}/32", "dev", "eth1", "src", SERVER_V4)
        sh("ip", "-n", legacy, "route", "replace", f"{SERVER_V4}/32", "dev", "eth0")
        for ns, ipv6 in ((client, True), (server, True), (legacy, False)):
            apply_inpod(ns, InPodSettings(ipv6=ipv6), "nftables", SubprocessRunner())
        yield client, server, legacy
    finally:
        for ns in (client, server, legacy):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        left = sh("ip", "netns", "list")
        assert not {client, server, legacy} & set(line.split()[0] for line in left.splitlines() if line.strip())


def _context(node: str, state: WorkloadState, ca: Path) -> ProxyContext:
    return ProxyContext(
        settings=ProxySettings(node=node, trust_domain=TD),
        state=state,
        certs=CertificateManager(LocalCa(ca, trust_domain=TD)),
        pool=ConnectionPool(),
        metrics=ProxyMetrics(),
        access_log=AccessLog(logger=logging.getLogger(f"ambit.test.access.{node}")),
    )


async def _enrol(manager: PodListenerManager, info: WorkloadInfo, ns: str) -> None:
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        await manager.open_listeners(workload_uid(info), info, fd)
    finally:
        os.close(fd)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    tag = secrets.token_hex(2)
    prefix = f"fd00:ab:{secrets.randbelow(0xFFFF) + 1:x}::"
    with _namespaces(tag, prefix) as (client, server, legacy):
        client_v6, server_v6 = f"{prefix}1", f"{prefix}2"
        workloads = _workloads(client_v6, server_v6)
        context1 = _context("node-1", _state(workloads, f"{prefix}99"), tmp_path / "ca")
        context2 = _context("node-2", _state(workloads, f"{prefix}99"), tmp_path / "ca")
        dns = DnsProxySettings(DnsServerSettings(), explicit=True)  # mesh names only: nothing is forwarded here
        node1, node2 = PodListenerManager(context1, dns), PodListenerManager(context2, dns)
        echoes = [
            _echo(server, tmp_path / "server-echo.log", f"tcp:{PORT}@0.0.0.0", f"tcp:{PORT}@::"),
            _echo(legacy, tmp_path / "legacy-echo.log", f"tcp:{PORT}@0.0.0.0"),
        ]
        try:
            async with asyncio.timeout(30):
                for ns, log, wanted in (
                    (server, tmp_path / "server-echo.log", {f"tcp 0.0.0.0:{PORT}", f"tcp [::]:{PORT}"}),
                    (legacy, tmp_path / "legacy-echo.log", {f"tcp 0.0.0.0:{PORT}"}),
                ):
                    while not wanted <= listening(ns):
                        assert all(echo.poll() is None for echo in echoes), log.read_text()
                        await asyncio.sleep(0.05)
            await _enrol(node1, CLIENT, client)
            await _enrol(node1, LEGACY, legacy)
            await _enrol(node2, SERVER, server)
            yield Rig(client, server, legacy, client_v6, server_v6, f"{prefix}99", context1, context2, tmp_path)
        finally:
            await node1.aclose()
            await node2.aclose()
            await context1.certs.aclose()
            await context2.certs.aclose()
            for echo in echoes:
                echo.terminate()
                echo.wait(10)


def _echo(ns: str, log: Path, *listen: str) -> subprocess.Popen[bytes]:
    """The lab's TCP echo in ``ns`` (``whoami`` tells the client's address), its output in ``log``."""
    argv = ["ip", "netns", "exec", ns, sys.executable, "-m", "ambit.lab.apps", "multi-echo"]
    for spec in listen:
        argv += ["--listen", spec]
    with open(log, "wb") as out:
        return subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=out)


async def in_pod(ns: str, script: str, *args: str) -> dict[str, Any] | list[Any]:
    proc = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", ns, sys.executable, "-I", "-c", script, *args,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    result: dict[str, Any] | list[Any] = json.loads(out)
    return result


async def call(ns: str, host: str, *, mark: int = 0) -> dict[str, Any]:
    result = await in_pod(ns, CALL, host, str(PORT), str(mark))
    assert isinstance(result, dict)
    return result


def sample(metrics: ProxyMetrics, name: str, **labels: str) -> float:
    total = 0.0
    for line in metrics.render().decode().splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def principal(info: WorkloadInfo) -> str:
    return f"spiffe://{TD}/ns/{info.namespace}/sa/{info.service_account}"


async def until_counted(metrics: ProxyMetrics, name: str, at_least: float, **labels: str) -> None:
    """The proxies count a connection as its relay starts: wait for it (the client may be done first)."""
    try:
        async with asyncio.timeout(10):
            while sample(metrics, name, **labels) < at_least:  # noqa: ASYNC110 - no event for a counter
                await asyncio.sleep(0.02)
    except TimeoutError:
        lines = [line for line in metrics.render().decode().splitlines() if line.startswith(name)]
        raise AssertionError(f"no {name} with {labels} in:\n" + "\n".join(lines)) from None


@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
async def test_a_pod_calling_a_pod_on_another_node_goes_out_on_15001_over_hbone_and_in_on_15008_with_identities(
    rig: Rig, family: str
) -> None:
    """The client's connection to the server's address of ``family`` is captured by the client's 15001 of that
    family, carried in a CONNECT to ``[server]:15008`` (mutual TLS, each side checking the other's SPIFFE ID), and
    delivered to the server from the client's own address of that family."""
    client, server = rig.address(family, "client"), rig.address(family, "server")
    result = await call(rig.client, server)
    assert "error" not in result, result
    seen = json.loads(result["reply"])
    host, _, _ = seen["client"].rpartition(":")
    assert ipaddress.ip_address(host) == ipaddress.ip_address(client), seen  # the source kept, in its own family
    assert result["local"] == client
    identities = {"source_principal": principal(CLIENT), "destination_principal": principal(SERVER)}
    opened = "istio_tcp_connections_opened_total"
    await until_counted(rig.node1.metrics, opened, 1, reporter="source", **identities)
    await until_counted(
        rig.node2.metrics, opened, 1, reporter="destination", connection_security_policy="mutual_tls", **identities
    )
    hbone = f"[{rig.server_v6}]:15008" if family == "ipv6" else f"{SERVER_V4}:15008"
    pooled = rig.node1.pool.stats()["keys"]
    assert [(key["source_ip"], key["destination_addr"]) for key in pooled] == [(client, hbone)], pooled


@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
async def test_a_plaintext_client_outside_the_mesh_is_captured_by_15006_and_delivered_from_its_own_address(
    rig: Rig, family: str
) -> None:
    """A connection that leaves the client pod untouched (marked, as the proxy's own are) reaches the server pod in
    plaintext: its rules send it to the server's 15006 of that family, which reads the original destination
    (``SO_ORIGINAL_DST`` or ``IP6T_SO_ORIGINAL_DST``) and delivers it from the client's address."""
    client, server = rig.address(family, "client"), rig.address(family, "server")
    result = await call(rig.client, server, mark=0x539)
    assert "error" not in result, result
    host, _, _ = json.loads(result["reply"])["client"].rpartition(":")
    assert ipaddress.ip_address(host) == ipaddress.ip_address(client)
    await until_counted(
        rig.node2.metrics,
        "istio_tcp_connections_opened_total",
        1,
        reporter="destination",
        connection_security_policy="unknown",  # no mutual TLS: no principals either, as in Istio
        source_workload=CLIENT.name,  # known by its address, in either family
        destination_workload=SERVER.name,
    )
    assert sample(rig.node1.metrics, "istio_tcp_connections_opened_total") == 0  # the client's proxy never saw it


async def test_a_pod_without_ipv6_beside_dual_stack_pods_has_ipv4_listeners_only_and_still_reaches_the_mesh(
    rig: Rig,
) -> None:
    assert {"tcp [::]:15001", "tcp [::]:15006", "tcp [::]:15008", "udp [::1]:15053"} <= listening(rig.client)
    legacy = listening(rig.legacy)
    assert {"tcp 0.0.0.0:15001", "tcp 0.0.0.0:15006", "tcp 0.0.0.0:15008", "udp 127.0.0.1:15053"} <= legacy
    assert not any("[" in socket for socket in legacy), legacy
    result = await call(rig.legacy, SERVER_V4)
    assert "error" not in result, result
    assert json.loads(result["reply"])["client"].startswith(f"{LEGACY_V4}:")
    await until_counted(
        rig.node2.metrics,
        "istio_tcp_connections_opened_total",
        1,
        reporter="destination",
        connection_security_policy="mutual_tls",
        source_principal=principal(LEGACY),
    )


async def test_the_dns_proxy_answers_on_ipv6_localhost_with_the_workloads_ipv6_address(rig: Rig) -> None:
    """``[::1]:15053`` answers like ``127.0.0.1:15053``: AAAA with the headless service's endpoint's IPv6
    address, A with its IPv4 one, over UDP and TCP."""
    asked = [
        {"name": HOSTNAME, "type": "AAAA", "proto": "udp", "server": "::1"},
        {"name": HOSTNAME, "type": "AAAA", "proto": "tcp", "server": "::1"},
        {"name": HOSTNAME, "type": "A", "proto": "udp", "server": "::1"},
        {"name": HOSTNAME, "type": "AAAA", "proto": "udp", "server": "127.0.0.1"},
    ]
    answers = await in_pod(rig.client, ASK, json.dumps(asked))
    aaaa = [f"AAAA {rig.server_v6}"]
    assert answers == [aaaa, aaaa, [f"A {SERVER_V4}"], aaaa]


async def test_a_pod_calling_an_ipv6_vip_whose_endpoint_on_its_node_has_ipv4_only_is_delivered_from_its_ipv4_address(
    rig: Rig,
) -> None:
    """Same node, other family: the client's IPv6 connection to a Service VIP goes to the endpoint's IPv4 address
    (its only one) without a tunnel, from the client's own IPv4 address, as a tunnel from the client would be."""
    result = await call(rig.client, rig.legacy_vip)
    assert "error" not in result, result
    seen = json.loads(result["reply"])
    assert seen["client"].startswith(f"{CLIENT_V4}:"), seen
    await until_counted(
        rig.node1.metrics,
        "istio_tcp_connections_opened_total",
        1,
        reporter="destination",
        connection_security_policy="mutual_tls",
        source_principal=principal(CLIENT),
        destination_principal=principal(LEGACY),
    )


async def test_an_hbone_connect_over_ipv6_for_the_pods_ipv4_address_is_refused_with_400(rig: Rig) -> None:
    """The CONNECT must name the address the HBONE connection arrived on (ztunnel's rule), in IPv6 as in IPv4."""
    ca = LocalCa(rig.tmp / "ca", trust_domain=TD)
    cert = await ca.fetch_certificate(SpiffeId(TD, CLIENT.namespace, CLIENT.service_account))
    fd = os.open(f"/run/netns/{rig.client}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        factory = NetnsSocketFactory(fd, name="test hbone client")  # marked: the client pod's rules let it out
        await factory.start()
        try:
            sock = await connect(factory, (rig.server_v6, 15008))
        finally:
            await factory.aclose()
    finally:
        os.close(fd)
    expected = frozenset({SpiffeId(TD, SERVER.namespace, SERVER.service_account)})
    client = await HboneClient.connect(sock, cert, expected, trust_domain=TD)
    try:
        with pytest.raises(TunnelRefusedError) as refused:
            await client.open_tunnel(f"{SERVER_V4}:{PORT}", [])
        assert refused.value.status == 400
        stream = await client.open_tunnel(f"[{rig.server_v6}]:{PORT}", [])  # its own address: served
        await stream.write(b"whoami\n")
        reply = b""
        async with asyncio.timeout(10):
            while not reply.endswith(b"\n"):
                chunk = await stream.read()
                assert chunk, f"the tunnel ended after {reply!r}"
                reply += chunk
        host, _, _ = json.loads(reply)["client"].rpartition(":")
        assert ipaddress.ip_address(host) == ipaddress.ip_address(rig.client_v6)
        await stream.aclose()
    finally:
        await client.aclose()
