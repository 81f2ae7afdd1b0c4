"""A ``DYNAMIC_DNS`` wildcard ServiceEntry bound to an egress waypoint (upstream
TestWaypointAsEgressGatewayForWildcardEntries), with real sockets on loopback: the entry, its waypoint binding and
the wildcard DestinationRule go through the control plane's translation; the real waypoint process gets the
resulting Services and WaypointConfig, resolves every name through a scripted DNS server
(:mod:`tests.integration.dns_upstream`), and reaches "external" servers outside the mesh (plain HTTP and HTTPS on
127.0.0.81). The upstream cases: basic (200, at L7), a Host outside the wildcard (404), TLS and HTTPS on the TLS
port routed by SNI, and TLS origination on the HTTP port whose target port is the TLS one (ALPN http/1.1). The
last test puts the client side in front: the pod's DNS proxy answers any name under the wildcard with its allocated
address, and a node proxy (the outbound handler, fed the same translation) carries the connection over HBONE to
the waypoint (upstream "overriding with matching Host header": another name's address, the Host decides). Upstream's
"basic" name is a real Service in a namespace its install's ``discoverySelectors`` exclude: the last test puts that
Service and the selector through the translation, and the DNS proxy answers the name with the wildcard's address.

The attacks: the waypoint must not become an open proxy. A trap server listens on 127.0.0.82 at the same ports and a
name outside the wildcard resolves there; a Host or SNI outside the wildcard, an IP literal, a name with odd
characters or too long is answered 404 (a TLS connection closed), and neither looked up nor dialled; a name that
does not resolve, or resolves to ``0.0.0.0``, answers 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import os
import socket
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dns.message
import pytest
from aiohttp import web
from tests.integration.dns_upstream import ScriptedDns, scripted_dns
from tests.integration.fake_waypoint import call_outbound
from tests.integration.waypoint_rig import (
    CLIENT_ID,
    TD,
    WAYPOINT_ID,
    HttpOverTunnel,
    echo_of,
    shared_free_port,
    waypoint_settings,
)

from ambit.controlplane.translate import Translation, translate_all
from ambit.controlplane.translate.autoallocate import AddressAllocator, plan_addresses
from ambit.dns.answer import Answered, DnsClient, decide
from ambit.hbone.headers import hostport
from ambit.identity.localca import LocalCa
from ambit.identity.manager import CertificateManager
from ambit.model.localconfig import LocalConfig, render_local_config
from ambit.model.state import WorkloadState
from ambit.model.workload import NetworkAddress, PortMapping, Service, TunnelProtocol, Workload
from ambit.proxy.context import LocalPod, ProxyContext
from ambit.proxy.errors import StreamClosedError
from ambit.proxy.hbone_client import HboneClient
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.pool import ConnectionPool
from ambit.proxy.settings import ProxySettings
from ambit.proxy.sockets import HostSocketFactory
from ambit.telemetry.accesslog import AccessLog
from ambit.telemetry.metrics import ProxyMetrics
from ambit.tls.certs import issue_server_cert, new_ca
from ambit.waypoint.origination import TlsStream
from ambit.waypoint.process import Waypoint
from ambit.waypoint.settings import WaypointLimits
from ambit.zds.protocol import WorkloadInfo

pytestmark = pytest.mark.timeout(90)

EXTERNAL_IP, TRAP_IP, CLIENT_IP = "127.0.0.81", "127.0.0.82", "127.0.0.4"
WILDCARD = "*.external.svc.cluster.local"
NAME = "external.external.svc.cluster.local"
OTHER = "other.external.svc.cluster.local"
DUAL = "dual.external.svc.cluster.local"
"""A name with an A and an AAAA record: dialled in the family of the entry's address the client called."""
LIMITS = WaypointLimits(max_head_bytes=8 * 1024, head_timeout=2.0, sniff_timeout=1.0, startup_wait=5.0)
SCRIPT: dict[str, list[str] | str] = {
    NAME: [EXTERNAL_IP],
    OTHER: [EXTERNAL_IP],
    DUAL: [EXTERNAL_IP, "::1"],
    "zero.external.svc.cluster.local": ["0.0.0.0"],
    "trap.example.com": [TRAP_IP],
    "external.non-existent.svc.cluster.local": [TRAP_IP],
    **{f"slow{i}.external.svc.cluster.local": "silent" for i in range(6)},
}


def namespace(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}}}


def gateway() -> dict[str, Any]:
    """The rigs' waypoint ``app/waypoint``, accepting routes from namespace ``apps`` (upstream's egress namespace)."""
    selector = {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}
    listener = {
        "name": "mesh",
        "port": 15008,
        "protocol": "HBONE",
        "allowedRoutes": {"namespaces": {"from": "Selector", "selector": selector}},
    }
    return {
        "metadata": {"name": "waypoint", "namespace": "app"},
        "spec": {"gatewayClassName": "istio-waypoint", "listeners": [listener]},
        "status": {"addresses": [{"type": "Hostname", "value": "waypoint.app.svc.cluster.local"}]},
    }


def wildcard_entry(http_port: int, tls_port: int) -> dict[str, Any]:
    """Upstream's entry, its target ports the test servers' (upstream: 80, 443 and 8080 → 443)."""
    obj: dict[str, Any] = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {
            "name": "external-wildcard",
            "namespace": "apps",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"istio.io/use-waypoint": "waypoint", "istio.io/use-waypoint-namespace": "app"},
        },
        "spec": {
            "hosts": [WILDCARD],
            "ports": [
                {"name": "http", "number": 80, "protocol": "HTTP", "targetPort": http_port},
                {"name": "tls", "number": 443, "protocol": "TLS", "targetPort": tls_port},
                {"name": "http-for-tls", "number": 8080, "protocol": "HTTP", "targetPort": tls_port},
            ],
            "location": "MESH_EXTERNAL",
            "resolution": "DYNAMIC_DNS",
        },
    }
    allocator = AddressAllocator()
    allocator.warm([obj])
    obj["status"] = {"addresses": plan_addresses(obj, allocator)}
    return obj


TLS_ORIGINATION = {
    "apiVersion": "networking.istio.io/v1",
    "kind": "DestinationRule",
    "metadata": {"name": "wildcard-tls-origination", "namespace": "apps"},
    "spec": {"host": WILDCARD, "trafficPolicy": {"tls": {"mode": "SIMPLE", "insecureSkipVerify": True}}},
}


@dataclass
class Seen:
    """What each external server got: (server address, Host, x-request-id, SNI, ALPN) per request."""

    requests: list[dict[str, str]] = field(default_factory=list)
    sni: list[str | None] = field(default_factory=list)

    def at(self, ip: str) -> list[dict[str, str]]:
        return [r for r in self.requests if r["at"] == ip]


@dataclass
class Egress:
    waypoint: Waypoint
    dns: ScriptedDns
    ca: LocalCa
    seen: Seen
    vip: str
    entry: dict[str, Any]
    vip6: str = ""

    def configure(self, **objects: list[dict[str, Any]]) -> Translation:
        """Translate the entry and the waypoint (plus ``objects``); the waypoint gets its WaypointConfig."""
        translation = translate_all(
            [],
            [],
            [],
            [namespace("app"), namespace("apps")],
            service_entries=[self.entry],
            gateways=[gateway()],
            **objects,
        )
        (config,) = translation.waypoint_configs
        self.waypoint.context.routes.replace(config)
        return translation

    def looked_up(self, name: str) -> bool:
        return any(asked == name for asked, _ in self.dns.asked)

    @contextlib.asynccontextmanager
    async def tunnel(self, port: int, vip: str = "") -> AsyncIterator[HboneStream]:
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setsockopt(
            socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
        )  # as a node proxy dials (else Nagle: 48 ms a TLS relay)
        sock.setblocking(False)
        sock.bind((CLIENT_IP, 0))
        await loop.sock_connect(sock, ("127.0.0.1", self.waypoint.settings.hbone_port))
        cert = await self.ca.fetch_certificate(CLIENT_ID)
        client = await HboneClient.connect(sock, cert, frozenset({WAYPOINT_ID}), trust_domain=TD)
        try:
            authority = hostport(vip or self.vip, port)
            yield await client.open_tunnel(authority, [("forwarded", f'for="{CLIENT_IP}:1"')])
        finally:
            await client.aclose()

    async def get(self, host: str, port: int = 80, vip: str = "") -> tuple[int, bytes]:
        async with self.tunnel(port, vip) as stream:
            status, _, body = await HttpOverTunnel(stream, host=host).request("GET", "/echo")
            return status, body

    async def get_over_tls(self, server_name: str | None, vip: str = "") -> tuple[int, bytes]:
        """HTTPS through the TLS port: the client's own TLS, the waypoint reading only its ClientHello."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.set_alpn_protocols(["http/1.1"])
        async with self.tunnel(443, vip) as stream:
            tls = TlsStream(stream, context, server_name or "")
            async with asyncio.timeout(10):
                await tls.handshake()
            status, _, body = await HttpOverTunnel(tls, host=server_name or "none").request("GET", "/echo")  # type: ignore[arg-type]
            return status, body


@contextlib.asynccontextmanager
async def external_servers(tmp_path: Path, seen: Seen) -> AsyncIterator[tuple[int, int]]:
    """An HTTP and an HTTPS echo server on both the external address and the trap (same ports each)."""
    ca = new_ca("external-ca", now=time.time())
    leaf = issue_server_cert(ca, common_name=NAME, dns_names=[NAME, OTHER], ip_addresses=[], now=time.time())
    certfile = tmp_path / "external.pem"
    certfile.write_bytes(leaf.cert_pem + leaf.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certfile)
    context.set_alpn_protocols(["http/1.1"])
    context.sni_callback = lambda _sock, name, _ctx: seen.sni.append(name)  # type: ignore[func-returns-value]

    async def echo(request: web.Request) -> web.Response:
        transport = request.transport
        local = str(transport.get_extra_info("sockname")[0]) if transport else ""
        tls = transport.get_extra_info("ssl_object") if transport else None
        answer = {
            "at": local,
            "host": request.headers.get("host", ""),
            "id": request.headers.get("x-request-id", ""),
            "tls": "yes" if tls is not None else "no",
            "alpn": (tls.selected_alpn_protocol() or "") if tls is not None else "",
        }
        seen.requests.append(answer)
        return web.json_response(answer)

    app = web.Application()
    app.router.add_get("/echo", echo)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    hosts = (EXTERNAL_IP, TRAP_IP, "::1")
    http_port, tls_port = shared_free_port(hosts), shared_free_port(hosts)
    for ip in hosts:
        await web.TCPSite(runner, ip, http_port).start()
        await web.TCPSite(runner, ip, tls_port, ssl_context=context).start()
    try:
        yield http_port, tls_port
    finally:
        await runner.cleanup()


@pytest.fixture
async def egress(tmp_path: Path) -> AsyncIterator[Egress]:
    seen = Seen()
    async with external_servers(tmp_path, seen) as (http_port, tls_port), scripted_dns(SCRIPT, ttl=30) as dns:
        entry = wildcard_entry(http_port, tls_port)
        translation = translate_all(
            [], [], [], [namespace("app"), namespace("apps")], service_entries=[entry], gateways=[gateway()]
        )
        (service,) = [s for s in translation.config.services if s.hostname == WILDCARD]
        client = Workload(
            uid="Kubernetes//Pod/apps/client",
            name="client",
            namespace="apps",
            addresses=(ipaddress.ip_address(CLIENT_IP),),
            tunnel_protocol=TunnelProtocol.HBONE,
            service_account=CLIENT_ID.service_account,
        )
        config = tmp_path / "mesh.yaml"
        config.write_text(render_local_config(LocalConfig(workloads=(client,), services=(service,))), encoding="utf-8")
        settings = waypoint_settings(config, tmp_path / "ca", LIMITS, dns_nameservers=("127.0.0.1",), dns_port=dns.port)
        waypoint = Waypoint(settings)
        await waypoint.start()
        try:
            ca = LocalCa(tmp_path / "ca", trust_domain=TD)
            vip, vip6 = (str(v.ip) for v in service.vips)
            rig = Egress(waypoint, dns, ca, seen, vip, entry, vip6)
            rig.configure()
            yield rig
        finally:
            await waypoint.aclose()


async def test_basic_a_request_goes_at_l7_to_the_name_its_host_gives(egress: Egress) -> None:
    status, body = await egress.get(NAME)
    assert status == 200
    answer = echo_of(body)
    assert answer["at"] == EXTERNAL_IP and answer["host"] == NAME and answer["tls"] == "no"
    assert answer["id"], "the waypoint handled it at L7 (IsL7)"
    status, body = await egress.get(f"{OTHER}:80")  # another name under the wildcard, the port in the Host
    assert status == 200 and echo_of(body)["host"] == f"{OTHER}:80"


async def test_a_name_with_both_versions_is_dialled_in_the_family_of_the_entry_address_called(egress: Egress) -> None:
    """TestWaypointDNS's two legs on the wildcard: the entry's IPv4 address called reaches the name's IPv4 address,
    its IPv6 address the name's IPv6 one, at L7 (the Host names it), by SNI on the TLS port, and with TLS
    originated by the wildcard DestinationRule."""
    for _ in range(2):  # the second HTTP call of each family on a kept connection, never the other family's
        for vip, at in ((egress.vip, EXTERNAL_IP), (egress.vip6, "::1")):
            status, body = await egress.get(DUAL, vip=vip)
            assert status == 200 and echo_of(body)["at"] == at, (vip, body)
    for vip, at in ((egress.vip, EXTERNAL_IP), (egress.vip6, "::1")):
        status, body = await egress.get_over_tls(DUAL, vip=vip)
        assert status == 200 and echo_of(body)["at"] == at and echo_of(body)["tls"] == "yes", (vip, body)
    egress.configure(destination_rules=[TLS_ORIGINATION])
    for vip, at in ((egress.vip, EXTERNAL_IP), (egress.vip6, "::1")):
        status, body = await egress.get(DUAL, 8080, vip=vip)
        assert status == 200 and echo_of(body)["at"] == at and echo_of(body)["tls"] == "yes", (vip, body)


async def test_a_host_outside_the_wildcard_is_404_and_neither_looked_up_nor_dialled(egress: Egress) -> None:
    status, _ = await egress.get("external.non-existent.svc.cluster.local")  # upstream: "invalid Host header"
    assert status == 404
    for host in ("trap.example.com", TRAP_IP, f"{TRAP_IP}:80", "[::1]:80", "127.1", "a b.external.svc.cluster.local"):
        status, _ = await egress.get(host)
        assert status == 404, host
    status, _ = await egress.get("a" * 300 + ".external.svc.cluster.local")
    assert status == 404
    assert egress.seen.at(TRAP_IP) == [] and egress.seen.at(EXTERNAL_IP) == []
    assert not egress.looked_up("external.non-existent.svc.cluster.local")
    assert not egress.looked_up("trap.example.com")


async def test_a_name_that_does_not_resolve_or_resolves_to_nothing_dialable_is_503(
    egress: Egress, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 19: a name that does not resolve is Envoy's DNS resolution failure (503, flag ``DF``, not retried); one
    that resolves to an address that may not be dialled is a connect failure (``UF``), in the access log and in
    ``istio_requests_total``'s ``response_flags``."""
    caplog.set_level("INFO", logger="access")
    for host, flag in (("gone.external.svc.cluster.local", "DF"), ("zero.external.svc.cluster.local", "UF")):
        status, body = await egress.get(host)
        assert status == 503, host
        assert egress.looked_up(host)
        assert (body == b"DNS resolution failure") == (flag == "DF"), body
        logged = [r.getMessage() for r in caplog.records if host in r.getMessage()]
        assert any(f"response_flags={flag}" in line and "response_code=503" in line for line in logged), logged
    assert egress.seen.requests == []
    assert sum(1 for name, _ in egress.dns.asked if name == "gone.external.svc.cluster.local") <= 2  # A, AAAA: once
    text = egress.waypoint.context.metrics.render().decode()
    counted = [line for line in text.splitlines() if line.startswith("istio_requests_total{")]
    for flag in ("DF", "UF"):
        assert any('response_code="503"' in line and f'response_flags="{flag}' in line for line in counted), counted


async def test_a_flood_of_names_under_the_wildcard_holds_at_most_the_resolvers_bound_of_lookups(egress: Egress) -> None:
    resolver = egress.waypoint.context.upstreams.hostnames
    assert resolver is not None
    resolver.max_pending = 2
    started = time.monotonic()
    statuses = await asyncio.gather(*(egress.get(f"slow{i}.external.svc.cluster.local") for i in range(6)))
    assert statuses and all(status == 503 for status, _ in statuses)
    asked = [name for name, _ in egress.dns.asked if name.startswith("slow")]
    assert len(set(asked)) <= 2, asked  # the other names failed at once ("too many lookups"), never asked
    assert time.monotonic() - started < 15
    assert egress.seen.requests == []


async def test_without_the_waypoint_config_nothing_is_forwarded_by_name(egress: Egress) -> None:
    (config,) = egress.configure().waypoint_configs
    egress.waypoint.context.routes.replace(dataclasses.replace(config, dynamic_dns=()))
    status, _ = await egress.get(NAME)
    assert status == 503  # no endpoints: "no healthy upstream", never a name from the request
    assert egress.seen.requests == [] and not egress.looked_up(NAME)


async def test_tls_and_https_on_the_tls_port_go_to_the_name_the_sni_gives(egress: Egress) -> None:
    status, body = await egress.get_over_tls(NAME)
    assert status == 200
    answer = echo_of(body)
    assert answer["at"] == EXTERNAL_IP and answer["tls"] == "yes" and answer["id"] == ""  # relayed, not terminated
    assert egress.seen.sni == [NAME]


async def test_a_tls_connection_naming_a_server_outside_the_wildcard_or_none_is_closed(egress: Egress) -> None:
    for name in ("trap.example.com", "external.non-existent.svc.cluster.local", None):
        with pytest.raises(StreamClosedError, match="reset by peer"):  # the tunnel is reset mid-handshake
            await egress.get_over_tls(name)
    assert egress.seen.sni == [] and egress.seen.requests == []
    assert not egress.looked_up("trap.example.com")


def _nodelay_of_sockets_to(port: int, peer_ip: str | None = None) -> list[int]:
    """TCP_NODELAY of this process's connected TCP sockets whose local (``peer_ip`` None) or peer port is ``port``
    (read from the sockets themselves, ``/proc/self/fd``)."""
    found: list[int] = []
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        with sock:
            if sock.family != socket.AF_INET or sock.type != socket.SOCK_STREAM:
                continue
            try:
                local, peer = sock.getsockname(), sock.getpeername()
            except OSError:
                continue
            if (peer_ip is None and local[1] == port) or (peer_ip is not None and peer == (peer_ip, port)):
                found.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
    return found


async def test_a_relayed_client_hello_is_never_held_by_nagle_on_either_side_of_the_waypoint(egress: Egress) -> None:
    """The hello the waypoint read goes to the server as its own first write, and the handshake's later small
    records follow it: without TCP_NODELAY each would wait for a delayed ACK (~40 ms a connection). Rather than
    time connections, check what prevents it on a live relay: the waypoint's sockets, both sides, have it."""
    tls_port = int(egress.entry["spec"]["ports"][1]["targetPort"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    async with egress.tunnel(443) as stream:
        tls = TlsStream(stream, context, NAME)
        async with asyncio.timeout(10):
            await tls.handshake()
        down = _nodelay_of_sockets_to(egress.waypoint.settings.hbone_port)
        up = _nodelay_of_sockets_to(tls_port, EXTERNAL_IP)  # only the waypoint dials the external server
        assert down and all(down), down
        assert up and all(up), up


async def test_bytes_that_are_no_client_hello_on_the_tls_port_close_the_tunnel_and_dial_nothing(egress: Egress) -> None:
    for garbage in (f"GET /echo HTTP/1.1\r\nhost: {NAME}\r\n\r\n".encode(), b"\x16\x03\x01\xff\xff" + b"x" * 64):
        async with egress.tunnel(443) as stream:
            await stream.write(garbage)
            with pytest.raises(StreamClosedError, match="reset by peer"):
                async with asyncio.timeout(10):
                    while await stream.read():
                        pass
    assert egress.seen.sni == [] and egress.seen.requests == [] and not egress.looked_up(NAME)


async def test_tls_origination_on_the_http_port_whose_target_is_the_tls_port_speaks_http_1_1(egress: Egress) -> None:
    egress.configure(destination_rules=[TLS_ORIGINATION])
    status, body = await egress.get(NAME, port=8080)
    assert status == 200
    answer = echo_of(body)
    assert answer["at"] == EXTERNAL_IP and answer["tls"] == "yes" and answer["alpn"] == "http/1.1"
    assert answer["id"], "at L7"
    assert egress.seen.sni == [NAME], "the originated TLS names the resolved host (Envoy's auto_sni)"


# The whole client side: the pod's DNS proxy answers the name, its node proxy sends the connection to the waypoint.


def node_proxy(tmp_path: Path, egress: Egress, translation: Translation | None = None) -> tuple[ProxyContext, LocalPod]:
    """A node proxy serving pod ``apps/client-0`` with the translated state (``translation``, else the entry and the
    waypoint's alone), plus the waypoint's instance (this test's waypoint process, its HBONE port as the Service's
    target port)."""
    translation = translation if translation is not None else egress.configure()
    waypoint_host = "waypoint.app.svc.cluster.local"
    instance = Workload(
        uid="Kubernetes//Pod/app/waypoint-0",
        name="waypoint-0",
        namespace="app",
        addresses=(ipaddress.ip_address("127.0.0.1"),),
        tunnel_protocol=TunnelProtocol.NONE,  # waypoint pods are not captured: HBONE all the same
        service_account="waypoint",
        services={f"app/{waypoint_host}": (PortMapping(15008, egress.waypoint.settings.hbone_port),)},
    )
    waypoint_service = Service(
        name="waypoint",
        namespace="app",
        hostname=waypoint_host,
        vips=(NetworkAddress("", ipaddress.ip_address("240.240.200.1")),),
        ports=(PortMapping(15008, 15008),),
    )
    client = Workload(
        uid="Kubernetes//Pod/apps/client-0",
        name="client-0",
        namespace="apps",
        addresses=(ipaddress.ip_address(CLIENT_IP),),
        tunnel_protocol=TunnelProtocol.HBONE,
        service_account=CLIENT_ID.service_account,
        node="node1",
    )
    ctx = ProxyContext(
        settings=ProxySettings(node="node1", trust_domain=TD),
        state=WorkloadState(),
        certs=CertificateManager(LocalCa(tmp_path / "ca", trust_domain=TD)),
        pool=ConnectionPool(),
        metrics=ProxyMetrics(),
        access_log=AccessLog(logger=logging.getLogger("tests.wildcard.access")),
    )
    ctx.state.replace_all(
        [client, instance, *translation.config.workloads], [waypoint_service, *translation.config.services]
    )
    local = LocalPod("uid-client", WorkloadInfo("client-0", "apps", "client"), HostSocketFactory(mark=None), TD)
    ctx.add_pod(local)
    return ctx, local


def resolve(ctx: ProxyContext, name: str) -> str:
    """The address the pod's DNS proxy gives ``name`` (the wildcard's allocated address for any name under it)."""
    decision = decide(ctx.state, DnsClient("apps"), dns.message.make_query(name, "A"))
    assert isinstance(decision, Answered), f"{name} was not answered by the DNS proxy"
    (address,) = [str(r) for rrset in decision.response.answer for r in rrset]
    return address


async def test_through_the_node_proxy_any_name_under_the_wildcard_reaches_the_host_the_request_names(
    egress: Egress, tmp_path: Path
) -> None:
    ctx, local = node_proxy(tmp_path, egress)
    try:
        address = resolve(ctx, NAME)
        assert address == egress.vip and resolve(ctx, "non-existent.external.svc.cluster.local") == egress.vip

        def request(host: str) -> bytes:
            return f"GET /echo HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n".encode()

        basic = await call_outbound(ctx, local, CLIENT_IP, (address, 80), request(NAME))
        assert basic.startswith(b"HTTP/1.1 200"), basic[:200]
        # Upstream "overriding with matching Host header": another name's address, the Host names the server.
        other = resolve(ctx, "non-existent.external.svc.cluster.local")
        matching = await call_outbound(ctx, local, CLIENT_IP, (other, 80), request(NAME))
        assert matching.startswith(b"HTTP/1.1 200"), matching[:200]
        invalid = await call_outbound(ctx, local, CLIENT_IP, (address, 80), request("external.non-existent.svc"))
        assert invalid.startswith(b"HTTP/1.1 404"), invalid[:200]
        assert [r["at"] for r in egress.seen.requests] == [EXTERNAL_IP, EXTERNAL_IP]
        assert all(r["id"] for r in egress.seen.requests), "both at L7, through the waypoint"
    finally:
        await ctx.pool.aclose()
        await ctx.certs.aclose()


# Upstream "basic" calls external.<ExternalNamespace>.svc.cluster.local: a real Service, in a namespace the upstream
# install's discoverySelectors exclude (label istio.io/test-exclude-namespace). The control plane does not see it, so
# the pod's DNS proxy falls through to the wildcard entry and the request goes at L7 through its waypoint.

EXCLUDE = "istio.io/test-exclude-namespace"
EXTERNAL_SERVICE = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "external", "namespace": "external", "uid": "svc-external", "resourceVersion": "1"},
    "spec": {"clusterIP": "198.19.5.5", "selector": {"app": "external"}, "ports": [{"name": "http", "port": 80}]},
}
UPSTREAM_MESH = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "istio", "namespace": "istio-system", "uid": "cm-istio", "resourceVersion": "1"},
    "data": {"mesh": f"discoverySelectors:\n- matchExpressions:\n  - key: {EXCLUDE}\n    operator: DoesNotExist\n"},
}


def with_external_namespace(egress: Egress, *, excluded: bool) -> Translation:
    """The rig's translation plus upstream's external namespace and its Service, under the upstream mesh config."""
    external = namespace("external")
    if excluded:
        external["metadata"]["labels"][EXCLUDE] = "true"
    translation = translate_all(
        [],
        [EXTERNAL_SERVICE],
        [],
        [namespace("istio-system"), namespace("app"), namespace("apps"), external],
        service_entries=[egress.entry],
        gateways=[gateway()],
        config_maps=[UPSTREAM_MESH],
    )
    (config,) = translation.waypoint_configs
    egress.waypoint.context.routes.replace(config)
    return translation


async def test_basic_the_excluded_namespaces_service_name_is_answered_with_the_wildcard_and_goes_at_l7(
    egress: Egress, tmp_path: Path
) -> None:
    seen = with_external_namespace(egress, excluded=False)
    assert NAME in {s.hostname for s in seen.config.services}
    ctx, _ = node_proxy(tmp_path, egress, seen)
    try:
        assert resolve(ctx, NAME) == "198.19.5.5", "a discovered Service's own name wins over the wildcard"
    finally:
        await ctx.pool.aclose()
        await ctx.certs.aclose()

    translation = with_external_namespace(egress, excluded=True)
    assert NAME not in {s.hostname for s in translation.config.services}
    ctx, local = node_proxy(tmp_path, egress, translation)
    try:
        address = resolve(ctx, NAME)
        assert address == egress.vip
        request = f"GET /echo HTTP/1.1\r\nhost: {NAME}\r\nconnection: close\r\n\r\n".encode()
        basic = await call_outbound(ctx, local, CLIENT_IP, (address, 80), request)
        assert basic.startswith(b"HTTP/1.1 200"), basic[:200]
        (seen_request,) = egress.seen.requests
        assert seen_request["at"] == EXTERNAL_IP and seen_request["host"] == NAME
        assert seen_request["id"], "at L7, through the wildcard entry's waypoint"
    finally:
        await ctx.pool.aclose()
        await ctx.certs.aclose()


async def test_a_tls_connection_to_a_name_that_does_not_resolve_is_closed_and_counted_df(
    egress: Egress, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="access")
    with pytest.raises(StreamClosedError, match="reset by peer"):
        await egress.get_over_tls("gone.external.svc.cluster.local")
    assert egress.looked_up("gone.external.svc.cluster.local") and egress.seen.sni == []
    logged = [r.getMessage() for r in caplog.records if "gone.external.svc.cluster.local" in r.getMessage()]
    assert any("connection failed" in line and "NXDOMAIN" in line for line in logged), logged
    text = egress.waypoint.context.metrics.render().decode()
    failed = [line for line in text.splitlines() if line.startswith("istio_tcp_connections_failed_total{")]
    assert any('response_flags="DF"' in line for line in failed), failed
