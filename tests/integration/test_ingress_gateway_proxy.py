"""The ingress gateway process on loopback with real sockets: its listeners from a GatewayConfig (applied as the
xDS client would), plain HTTP and HTTPS with SNI choosing between two certificates, a rotated certificate served
without a restart, and requests routed by virtual host to a mesh Service over HBONE, where the endpoint sees the
gateway's own identity as the peer.

Addresses: the gateway listens on 127.0.0.1; the endpoint (an HBONE server in front of an HTTP echo server, as a
node proxy would be) is 127.0.0.2; the Service VIP is a lab address the gateway resolves from its state.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import jwt
import pytest
from aiohttp import web
from cryptography import x509
from tests.integration.waypoint_rig import free_port, shared_free_port
from tests.unit.jwt_keys import Signer, claims, rsa_signer

from ambit.api.discovery_pb2 import DeltaDiscoveryRequest
from ambit.hbone.headers import parse_authority
from ambit.identity.localca import LocalCa
from ambit.model.extauthz import ExtAuthzProvider, ProviderKind
from ambit.model.identity import SpiffeId
from ambit.model.ingress import GatewayConfig, IngressCertificate, IngressListener, ListenerProtocol, VirtualHost
from ambit.model.localconfig import LocalConfig, render_local_config
from ambit.model.policy import Action, Clause, KeyedMatch, Match, Policy, Rule, Scope, StringMatch
from ambit.model.requestauth import JwtRule, RequestAuthentication
from ambit.model.route_matches import ClaimMatch, PathMatch, PathMatchType, RouteMatch, ValueMatch
from ambit.model.routes import BackendService, RouteRule, WeightedBackend
from ambit.model.workload import (
    AppProtocol,
    GatewayAddress,
    NamespacedHostname,
    NetworkAddress,
    PortMapping,
    Service,
    TunnelProtocol,
    WeightedWaypoint,
    Workload,
)
from ambit.proxy.hbone_server import HboneServer, InboundRequest, TunnelResponder
from ambit.proxy.sockets import HostSocketFactory, connect
from ambit.proxy.streams import SocketStream
from ambit.tls.certs import KeyPair, issue_server_cert, new_ca
from ambit.tls.socket_transport import TlsTransportKind
from ambit.waypoint.ingress import IngressGateway
from ambit.waypoint.settings import WaypointSettings
from ambit.waypoint.tcp import relay
from ambit.xds.client_session import ClientUpdate
from ambit.xds.gateway import GATEWAY_CONFIG_TYPE_URL

TD = "cluster.local"
GATEWAY_ID = SpiffeId(TD, "edge", "edge-istio")
ECHO = BackendService("app", "echo.app.svc.cluster.local", 80)
VIA = BackendService("app", "via.app.svc.cluster.local", 80)
WAYPOINT = GatewayAddress(NamespacedHostname("app", "waypoint.app.svc.cluster.local"))
FACTORY = HostSocketFactory(mark=None)
EDGE_CA = new_ca("edge test CA", now=time.time())


def server_cert(*names: str) -> KeyPair:
    return issue_server_cert(EDGE_CA, common_name=names[0], dns_names=list(names), ip_addresses=[], now=time.time())


def mesh() -> LocalConfig:
    return LocalConfig(
        workloads=(
            Workload(
                uid="Kubernetes//Pod/app/waypoint-1",
                name="waypoint-1",
                namespace="app",
                addresses=(ipaddress.ip_address("127.0.0.3"),),
                tunnel_protocol=TunnelProtocol.NONE,  # waypoint pods are not captured: HBONE all the same
                service_account="waypoint",
                services={"app/waypoint.app.svc.cluster.local": (PortMapping(15008, 15008),)},
            ),
            Workload(
                uid="Kubernetes//Pod/app/echo-1",
                name="echo-1",
                namespace="app",
                addresses=(ipaddress.ip_address("127.0.0.2"),),
                tunnel_protocol=TunnelProtocol.HBONE,
                service_account="echo",
                services={
                    "app/echo.app.svc.cluster.local": (PortMapping(80, 8080),),
                    "app/via.app.svc.cluster.local": (PortMapping(80, 8080),),
                },
            ),
        ),
        services=(
            Service(
                name="echo",
                namespace="app",
                hostname="echo.app.svc.cluster.local",
                vips=(NetworkAddress("", ipaddress.ip_address("198.18.1.1")),),
                ports=(PortMapping(80, 8080, AppProtocol.HTTP11),),
            ),
            Service(
                name="via",
                namespace="app",
                hostname="via.app.svc.cluster.local",
                vips=(NetworkAddress("", ipaddress.ip_address("198.18.1.3")),),
                ports=(PortMapping(80, 8080, AppProtocol.HTTP11),),
                waypoint=WAYPOINT,
                ingress_use_waypoint=True,
            ),
            Service(
                name="waypoint",
                namespace="app",
                hostname="waypoint.app.svc.cluster.local",
                vips=(NetworkAddress("", ipaddress.ip_address("198.18.1.4")),),
                ports=(PortMapping(15008, 15008, AppProtocol.UNKNOWN),),
            ),
        ),
    )


def rule(prefix: str, backend: BackendService = ECHO) -> RouteRule:
    return RouteRule(
        route=f"HTTPRoute/edge/{prefix.strip('/') or 'root'}",
        match=RouteMatch(path=PathMatch(PathMatchType.PATH_PREFIX, prefix)),
        backends=(WeightedBackend(backend),),
    )


def config(http_port: int, https_port: int, a: KeyPair, b: KeyPair) -> GatewayConfig:
    hosts = (
        VirtualHost("a.example", (rule("/"),)),
        VirtualHost("via.example", (rule("/", VIA),)),
        VirtualHost("*", (rule("/any"),)),
    )
    return GatewayConfig(
        "edge/edge",
        (
            IngressListener("http", http_port, ListenerProtocol.HTTP, "", (), hosts),
            IngressListener(
                "https-a",
                https_port,
                ListenerProtocol.HTTPS,
                "a.example",
                (IngressCertificate(a.cert_pem, a.key_pem),),
                (VirtualHost("a.example", (rule("/"),)),),
            ),
            IngressListener(
                "https-b",
                https_port,
                ListenerProtocol.HTTPS,
                "b.example",
                (IngressCertificate(b.cert_pem, b.key_pem),),
                (VirtualHost("b.example", (rule("/b"),)),),
            ),
        ),
    )


class EchoEndpoint:
    """An HBONE server (what a node proxy's inbound does) in front of an HTTP server answering who asked."""

    def __init__(self, ip: str, hbone_port: int, account: str = "echo") -> None:
        self.ip = ip
        self.account = account
        self.hbone_port = hbone_port
        self.peers: list[SpiffeId] = []
        self.authorities: list[str] = []
        self.waypoint: EchoEndpoint | None = None

    async def start(self, ca: LocalCa) -> None:
        self.cert = await ca.fetch_certificate(SpiffeId(TD, "app", self.account))
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._echo)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        self.http_port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.http_port).start()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((self.ip, self.hbone_port))
        self._listener.listen(16)
        self._listener.setblocking(False)
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepting = asyncio.create_task(self._accept())

    async def _echo(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "path": request.path,
                "host": request.headers.get("host", ""),
                "authorization": request.headers.get("authorization", ""),
                "xfcc": request.headers.getall("x-forwarded-client-cert", []),
                "xfp": request.headers.getall("x-forwarded-proto", []),
                "attempts": request.headers.getall("x-envoy-attempt-count", []),
                "request_ids": request.headers.getall("x-request-id", []),
                "envoy": sorted(n.lower() for n in request.headers if n.lower().startswith("x-envoy-")),
            }
        )

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(self._listener)
            task = asyncio.create_task(
                HboneServer.serve(sock, self._certificate, trust_domain=TD, handler=self._handle)
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _certificate(self) -> object:
        return self.cert

    async def _handle(self, request: InboundRequest, responder: TunnelResponder) -> None:
        self.peers.append(request.peer_identity)
        self.authorities.append(request.authority)
        host, port = parse_authority(request.authority)
        if self.account == "echo" and (host, port) != ("127.0.0.2", 8080):
            responder.reject(400)
            return
        upstream = SocketStream(await connect(FACTORY, ("127.0.0.1", self.http_port)))
        await relay(responder.accept(), upstream, 30.0)
        with contextlib.suppress(Exception):
            await upstream.aclose()

    async def aclose(self) -> None:
        self._accepting.cancel()
        await asyncio.gather(self._accepting, return_exceptions=True)
        self._listener.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._runner.cleanup()


@pytest.fixture
async def gateway(
    tmp_path: Path, tls_transport: TlsTransportKind
) -> AsyncIterator[tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]]]:
    async with started_gateway(tmp_path, tls_transport=tls_transport) as started:
        yield started


@pytest.fixture
async def dual_stack_gateway(tmp_path: Path) -> AsyncIterator[tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]]]:
    async with started_gateway(tmp_path, instance_ips=("127.0.0.1", "::1")) as started:
        yield started


@contextlib.asynccontextmanager
async def started_gateway(
    tmp_path: Path, instance_ips: tuple[str, ...] = (), tls_transport: TlsTransportKind = "loop"
) -> AsyncIterator[tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]]]:
    """The gateway, its upstream HBONE pool on ``tls_transport``, with an endpoint and a stand-in waypoint."""
    ca = LocalCa(tmp_path / "ca", trust_domain=TD)
    state = tmp_path / "mesh.yaml"
    state.write_text(render_local_config(mesh()), encoding="utf-8")
    hbone_port = shared_free_port(("127.0.0.2", "127.0.0.3"))
    endpoint = EchoEndpoint("127.0.0.2", hbone_port)
    await endpoint.start(ca)
    waypoint = EchoEndpoint("127.0.0.3", hbone_port, "waypoint")  # stands in for the waypoint: it answers too
    await waypoint.start(ca)
    endpoint.waypoint = waypoint
    settings = WaypointSettings(
        namespace="edge",
        gateway_name="edge",
        service_account="edge-istio",
        pod_name="edge-istio-0",
        instance_ip="127.0.0.1",
        instance_ips=instance_ips,
        config_file=state,
        local_ca_dir=tmp_path / "ca",
        admin_port=free_port(),
        stats_port=free_port(),
        readiness_port=free_port(),
        upstream_hbone_port=endpoint.hbone_port,
        tls_transport=tls_transport,
    )
    proc = IngressGateway(settings)
    certs = {"a": server_cert("a.example"), "b": server_cert("b.example")}
    proc.apply(config(free_port(), free_port(), certs["a"], certs["b"]))
    await proc.start()
    try:
        yield proc, endpoint, certs
    finally:
        await proc.aclose()
        await endpoint.aclose()
        await waypoint.aclose()


def port_of(proc: IngressGateway, name: str) -> int:
    return next(item.port for item in proc.router.config.listeners if item.name == name)


async def get(port: int, host: str, path: str, *, tls_name: str | None = None) -> tuple[int, dict[str, object], bytes]:
    """One HTTP/1.1 request to 127.0.0.1:port; with ``tls_name`` over TLS with that SNI, verifying the edge CA.
    Returns status, the JSON body (or {}) and the DER of the server's certificate (b"" for plain HTTP)."""
    context = None
    if tls_name is not None:
        context = ssl.create_default_context(cadata=EDGE_CA.cert_pem.decode())
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname=tls_name if context else None
    )
    der = b""
    if context is not None:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True) or b""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = {}
    return status, parsed if isinstance(parsed, dict) else {}, der


async def ready(proc: IngressGateway) -> None:
    async with asyncio.timeout(15):
        await proc.startup.ready.wait()


async def test_http_is_routed_by_host_to_the_mesh_service_with_the_gateway_s_identity(
    gateway: tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]],
) -> None:
    proc, endpoint, _ = gateway
    await ready(proc)
    status, body, _ = await get(port_of(proc, "http"), "a.example", "/hello")
    assert status == 200 and body["path"] == "/hello"
    assert endpoint.peers == [GATEWAY_ID]  # the server sees the gateway as its peer
    status, body, _ = await get(port_of(proc, "http"), "other.example:8080", "/any/thing")
    assert status == 200 and body["path"] == "/any/thing"
    status, _, _ = await get(port_of(proc, "http"), "other.example", "/hello")
    assert status == 404  # the "*" host has no rule for /hello
    metrics = proc.metrics.render().decode()
    counted = [line for line in metrics.splitlines() if line.startswith("istio_requests_total{")]
    assert counted and all('reporter="source"' in line for line in counted)
    assert any(
        'response_code="200"' in line and 'destination_service="echo.app.svc.cluster.local"' in line for line in counted
    )
    # Istio's gateway reports client-side: the gateway is the source (its identity, as it reached the upstream over
    # mutual TLS), the policy unknown; a request no route took is NR with no destination service.
    (ok,) = [line for line in counted if 'response_code="200"' in line]
    assert f'source_principal="{GATEWAY_ID}"' in ok and 'destination_principal="spiffe://' in ok
    assert 'connection_security_policy="unknown"' in ok
    (missed,) = [line for line in counted if 'response_code="404"' in line]
    assert 'response_flags="NR"' in missed and 'destination_service_name="unknown"' in missed


async def test_a_dual_stack_gateway_serves_its_listeners_on_each_pod_address(
    dual_stack_gateway: tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]],
) -> None:
    """INSTANCE_IPS names the pod's IPv4 and IPv6 addresses: a client reaching the gateway's Service over either
    family is served (Envoy's listeners take both), and a removed port closes on both."""
    proc, endpoint, _ = dual_stack_gateway
    await ready(proc)
    port = port_of(proc, "http")
    for host in ("127.0.0.1", "::1"):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /hello HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n")
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert data.startswith(b"HTTP/1.1 200"), (host, data[:80])
    assert set(endpoint.peers) == {GATEWAY_ID}
    assert proc.listening_ports().count(port) == 1
    proc.apply(dataclasses.replace(proc.router.config, listeners=()))
    await asyncio.sleep(0)
    for host in ("127.0.0.1", "::1"):
        with pytest.raises(OSError):
            await asyncio.open_connection(host, port)


async def test_https_sni_picks_the_certificate_and_the_listener(
    gateway: tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]],
) -> None:
    proc, _, certs = gateway
    await ready(proc)
    port = port_of(proc, "https-a")
    status, body, der = await get(port, "a.example", "/x", tls_name="a.example")
    assert status == 200 and body["path"] == "/x"
    assert der == certs["a"].certificate.public_bytes(serialization_der())
    status, body, der = await get(port, "b.example", "/b/y", tls_name="b.example")
    assert status == 200 and body["path"] == "/b/y"
    assert der == certs["b"].certificate.public_bytes(serialization_der())
    status, _, _ = await get(port, "b.example", "/x", tls_name="b.example")
    assert status == 404  # listener b routes only /b
    with pytest.raises((ssl.SSLError, ConnectionResetError)):  # no listener for that name: no handshake
        await get(port, "c.example", "/", tls_name="c.example")


async def test_a_scheme_match_holds_for_http_on_plain_listeners_and_https_where_the_gateway_terminated_tls(
    gateway: tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]],
) -> None:
    # upstream routing.go "HTTP scheme match" / "HTTPS scheme match": a VirtualService match on scheme, translated
    # to a :scheme header match.
    proc, _, _ = gateway
    await ready(proc)
    config = proc.router.config

    def on(scheme: str) -> RouteRule:
        return dataclasses.replace(rule("/"), match=RouteMatch(headers=(ValueMatch(":scheme", scheme),)))

    listeners = []
    for listener in config.listeners:
        host = listener.hostname or "a.example"
        scheme = "http" if listener.protocol is ListenerProtocol.HTTP else "https"
        listeners.append(dataclasses.replace(listener, virtual_hosts=(VirtualHost(host, (on(scheme),)),)))
    proc.apply(dataclasses.replace(config, listeners=tuple(listeners)))
    assert (await get(port_of(proc, "http"), "a.example", "/x"))[0] == 200
    assert (await get(port_of(proc, "https-a"), "a.example", "/x", tls_name="a.example"))[0] == 200
    swapped = [
        dataclasses.replace(x, virtual_hosts=(VirtualHost(x.hostname or "a.example", (on("https"),)),))
        if x.protocol is ListenerProtocol.HTTP
        else dataclasses.replace(x, virtual_hosts=(VirtualHost(x.hostname, (on("http"),)),))
        for x in config.listeners
    ]
    proc.apply(dataclasses.replace(config, listeners=tuple(swapped)))
    assert (await get(port_of(proc, "http"), "a.example", "/x"))[0] == 404  # plaintext is not https
    assert (await get(port_of(proc, "https-a"), "a.example", "/x", tls_name="a.example"))[0] == 404


async def test_a_rotated_certificate_is_served_without_a_restart(
    gateway: tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]],
) -> None:
    proc, _, certs = gateway
    await ready(proc)
    port, http_port = port_of(proc, "https-a"), port_of(proc, "http")
    _, _, before = await get(port, "a.example", "/", tls_name="a.example")
    rotated = server_cert("a.example")
    proc.apply(config(http_port, port, rotated, certs["b"]))
    status, _, after = await get(port, "a.example", "/", tls_name="a.example")
    assert status == 200
    assert before != after
    assert x509.load_der_x509_certificate(after).serial_number == rotated.certificate.serial_number
    assert proc.listening_ports() == sorted({port, http_port})


def serialization_der() -> object:
    from cryptography.hazmat.primitives.serialization import Encoding

    return Encoding.DER


async def test_a_service_marked_ingress_use_waypoint_is_reached_through_its_waypoint(
    gateway: tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]],
) -> None:
    proc, endpoint, _ = gateway
    await ready(proc)
    status, body, _ = await get(port_of(proc, "http"), "via.example", "/through")
    assert status == 200 and body["path"] == "/through"
    waypoint = endpoint.waypoint
    assert waypoint is not None
    assert waypoint.authorities == ["198.18.1.3:80"]  # the Service's VIP and port, as a node proxy sends it
    assert waypoint.peers == [GATEWAY_ID]
    assert endpoint.authorities == []  # never straight to the endpoint


# -- RequestAuthentication and AuthorizationPolicy at the gateway ---------------------------------------------------
ISSUER = "https://issuer.example"


def with_policies(
    proc: IngressGateway, signer: Signer, *policies: Policy, rule: JwtRule | None = None
) -> tuple[int, GatewayConfig]:
    """The running config with a RequestAuthentication trusting ``signer`` and ``policies``; its HTTP port."""
    jwt_rule = rule or JwtRule(ISSUER, jwks=signer.jwks())
    config = dataclasses.replace(
        proc.router.config,
        policies=policies,
        request_authentications=(RequestAuthentication("jwt", "edge", (jwt_rule,)),),
    )
    proc.apply(config)
    return port_of(proc, "http"), config


async def send(port: int, path: str, headers: list[tuple[str, str]]) -> tuple[int, bytes]:
    """One HTTP/1.1 request for a.example with ``headers``; status and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: a.example\r\n{extra}Connection: close\r\n\r\n".encode())
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def require(match: Match, name: str = "need") -> Policy:
    return Policy(name, "edge", Scope.WAYPOINT, Action.ALLOW, (Rule((Clause((match,)),)),))


@pytest.fixture(scope="module")
def signer() -> Signer:
    return rsa_signer()


async def test_at_the_gateway_a_policy_needing_a_principal_forbids_no_token_and_a_valid_one_passes(
    gateway: tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]], signer: Signer
) -> None:
    proc, endpoint, _ = gateway
    await ready(proc)
    port, _ = with_policies(proc, signer, require(Match(request_principals=(StringMatch.exact(f"{ISSUER}/alice"),))))
    assert await send(port, "/x", []) == (403, b"RBAC: access denied")
    status, body = await send(port, "/x", bearer(signer.sign(claims(ISSUER, now=time.time()))))
    assert status == 200
    assert json.loads(body)["authorization"] == ""  # the verified token is not forwarded
    status, _ = await send(port, "/x", bearer(signer.sign(claims(ISSUER, "mallory", now=time.time()))))
    assert status == 403  # valid, but not the principal the policy names
    assert endpoint.peers == [GATEWAY_ID]  # only the admitted request reached the mesh


async def test_at_the_gateway_hostile_tokens_are_401_and_never_reach_the_backend(
    gateway: tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]], signer: Signer
) -> None:
    proc, endpoint, _ = gateway
    await ready(proc)
    port, _ = with_policies(proc, signer)  # no AuthorizationPolicy: only the tokens are judged
    now = time.time()
    good = signer.sign(claims(ISSUER, now=now))
    other = rsa_signer(kid=signer.jwk["kid"])  # same kid, another key
    hostile = {
        "garbage": "not-a-jwt",
        "oversized": "e30." + "A" * (17 * 1024) + ".AAAA",
        "alg none": jwt.encode(claims(ISSUER, now=now), None, algorithm="none"),
        "wrong key": other.sign(claims(ISSUER, now=now)),
        "expired": signer.sign(claims(ISSUER, now=now - 7200)),
        "not yet valid": signer.sign(claims(ISSUER, now=now, nbf=int(now) + 3600)),
        "tampered": good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB"),
        "unknown issuer": signer.sign(claims("https://elsewhere.example", now=now)),
    }
    for case, token in hostile.items():
        status, body = await send(port, "/x", bearer(token))
        assert status == 401, (case, body)
    assert endpoint.peers == []
    assert (await send(port, "/x", []))[0] == 200  # no token and no policy needing one: it passes
    assert (await send(port, "/x", bearer(good)))[0] == 200


async def test_at_the_gateway_a_policy_on_a_claim_reads_the_validated_token(
    gateway: tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]], signer: Signer
) -> None:
    proc, _, _ = gateway
    await ready(proc)
    admins = Match(request_claims=(KeyedMatch(("groups",), (StringMatch.exact("admin"),)),))
    port, _ = with_policies(proc, signer, require(admins))
    now = time.time()
    assert (await send(port, "/x", bearer(signer.sign(claims(ISSUER, now=now, groups=["admin", "dev"])))))[0] == 200
    assert (await send(port, "/x", bearer(signer.sign(claims(ISSUER, now=now, groups=["dev"])))))[0] == 403
    assert (await send(port, "/x", []))[0] == 403


async def test_at_the_gateway_a_route_on_a_jwt_claim_reads_the_validated_token_not_the_headers(
    gateway: tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]], signer: Signer
) -> None:
    # upstream routing.go jwtClaimRoute, which runs through the ingress gateway: a route matching
    # @request.auth.claims.nested.key1 == valueA (translated to a ClaimMatch), 404 for anything else.
    proc, endpoint, _ = gateway
    await ready(proc)
    port, config = with_policies(proc, signer)
    on_claim = dataclasses.replace(rule("/"), match=RouteMatch(claims=(ClaimMatch(("nested", "key1"), "valueA"),)))
    (listener, *others) = config.listeners
    hosts = (VirtualHost("a.example", (on_claim,)),)
    proc.apply(dataclasses.replace(config, listeners=(dataclasses.replace(listener, virtual_hosts=hosts), *others)))
    now = time.time()
    good = signer.sign(claims(ISSUER, now=now, nested={"key1": "valueA"}))
    other = signer.sign(claims(ISSUER, now=now, nested={"key1": "valueB"}))
    assert (await send(port, "/x", bearer(good)))[0] == 200
    assert (await send(port, "/x", bearer(other)))[0] == 404
    assert (await send(port, "/x", [("request.auth.claims.nested.key1", "valueA")]))[0] == 404
    assert (await send(port, "/x", bearer(signer.sign(claims(ISSUER, now=now - 7200)))))[0] == 401
    assert endpoint.peers == [GATEWAY_ID]  # only the matching request reached the mesh


async def test_at_the_gateway_policies_survive_the_config_s_removal(
    gateway: tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]], signer: Signer
) -> None:
    proc, _, _ = gateway
    await ready(proc)
    with_policies(proc, signer, require(Match(request_principals=(StringMatch.presence(),))))
    removal = ClientUpdate(GATEWAY_CONFIG_TYPE_URL, (), (proc.config_name,), DeltaDiscoveryRequest())
    proc._config_changed(removal)  # what the xDS client calls when the control plane removes the resource
    assert proc.listening_ports() == []
    kept = proc.context.routes.current
    assert [p.name for p in kept.policies] == ["need"] and [p.name for p in kept.request_authentications] == ["jwt"]


async def test_at_the_gateway_a_client_s_x_forwarded_client_cert_is_dropped(
    gateway: tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]],
) -> None:
    proc, _, _ = gateway
    await ready(proc)
    forged = [("x-forwarded-client-cert", "URI=spiffe://cluster.local/ns/app/sa/admin")]
    status, body = await send(port_of(proc, "http"), "/x", forged)
    assert status == 200 and json.loads(body)["xfcc"] == []


async def test_at_the_gateway_each_try_says_which_it_is_in_x_envoy_attempt_count(
    gateway: tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]],
) -> None:
    """istiod sets include_request_attempt_count on a gateway's virtual hosts: the first try says 1, whatever the
    client sent."""
    proc, _, _ = gateway
    await ready(proc)
    status, body = await send(port_of(proc, "http"), "/x", [("x-envoy-attempt-count", "7")])
    assert status == 200 and json.loads(body)["attempts"] == ["1"]


async def test_at_the_gateway_a_client_s_request_id_and_envoy_controls_are_replaced_or_dropped(
    gateway: tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]],
) -> None:
    """The edge (use_remote_address, no internal addresses) gives each request a new x-request-id and removes the
    x-envoy-* headers a client may not set: the backend sees only what the gateway itself added."""
    proc, _, _ = gateway
    await ready(proc)
    forged = [
        ("x-request-id", "chosen-by-client"),
        ("x-envoy-retry-on", "5xx"),
        ("x-envoy-upstream-rq-timeout-ms", "1"),
        ("x-envoy-internal", "true"),
        ("x-envoy-downstream-service-cluster", "admin"),
    ]
    status, body = await send(port_of(proc, "http"), "/x", forged)
    echoed = json.loads(body)
    assert status == 200 and len(echoed["request_ids"]) == 1 and echoed["request_ids"] != ["chosen-by-client"]
    assert echoed["envoy"] == ["x-envoy-attempt-count", "x-envoy-external-address"]


async def test_at_the_gateway_the_backend_sees_the_connection_s_scheme_as_x_forwarded_proto_not_the_client_s(
    gateway: tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]],
) -> None:
    proc, _, _ = gateway
    await ready(proc)
    status, body = await send(port_of(proc, "http"), "/x", [("x-forwarded-proto", "https")])
    assert status == 200 and json.loads(body)["xfp"] == ["http"]  # an untrusted client's claim is replaced
    status, echoed, _ = await get(port_of(proc, "https-a"), "a.example", "/x", tls_name="a.example")
    assert status == 200 and echoed["xfp"] == ["https"]


REQUESTS = 30


async def test_a_service_with_a_canary_waypoint_is_split_per_request_by_the_draw(
    gateway: tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]], tmp_path: Path
) -> None:
    # Upstream TestWeightedWaypointIngressTrafficShift: a second waypoint (127.0.0.6, its own identity) is the
    # canary of "via" at 50; each request draws anew, so over REQUESTS both waypoints serve some (all on one side:
    # probability 2**-29).
    proc, endpoint, _ = gateway
    await ready(proc)
    primary = endpoint.waypoint
    assert primary is not None
    canary = EchoEndpoint("127.0.0.6", endpoint.hbone_port, "canary")
    await canary.start(LocalCa(tmp_path / "ca", trust_domain=TD))
    try:
        base = mesh()
        canary_address = GatewayAddress(NamespacedHostname("app", "canary.app.svc.cluster.local"))
        canary_pod = dataclasses.replace(
            base.workloads[0],
            uid="Kubernetes//Pod/app/canary-1",
            name="canary-1",
            addresses=(ipaddress.ip_address("127.0.0.6"),),
            service_account="canary",
            services={"app/canary.app.svc.cluster.local": (PortMapping(15008, 15008),)},
        )
        canary_service = dataclasses.replace(
            base.services[2],
            name="canary",
            hostname="canary.app.svc.cluster.local",
            vips=(NetworkAddress("", ipaddress.ip_address("198.18.1.6")),),
        )
        via = dataclasses.replace(
            base.services[1], weighted_waypoints=(WeightedWaypoint(WAYPOINT, 50), WeightedWaypoint(canary_address, 50))
        )
        proc.state.replace_all((*base.workloads, canary_pod), (base.services[0], via, base.services[2], canary_service))
        for i in range(REQUESTS):
            status, body, _ = await get(port_of(proc, "http"), "via.example", f"/split/{i}")
            assert status == 200 and body["path"] == f"/split/{i}"
        # Each request is drawn anew, so both waypoints got tunnels (kept open and reused by later requests).
        assert set(primary.authorities) == set(canary.authorities) == {"198.18.1.3:80"}
        assert set(canary.peers) == {GATEWAY_ID}
        assert endpoint.authorities == []  # never straight to the endpoint
    finally:
        await canary.aclose()


async def test_at_the_gateway_a_custom_policy_asks_its_authorizer_first(
    gateway: tuple[IngressGateway, EchoEndpoint, dict[str, KeyPair]], signer: Signer
) -> None:
    """CUSTOM at an ingress gateway (Istio's External Authorization task, gateway variant): the echo Service stands
    in for an authorizer that allows everything; one the gateway cannot reach is an error (403, flag UAEX) unless
    failOpen."""
    proc, endpoint, _ = gateway
    await ready(proc)

    def custom(service: str, fail_open: bool = False) -> Policy:
        ext = ExtAuthzProvider("authz", ProviderKind.HTTP, service, 80, timeout=5.0, fail_open=fail_open)
        return Policy("ext-authz", "edge", Scope.WAYPOINT, Action.CUSTOM, (Rule(),), ext_authz=ext)

    port, _ = with_policies(proc, signer, custom("app/echo.app.svc.cluster.local"))
    assert (await send(port, "/x", []))[0] == 200
    assert endpoint.peers == [GATEWAY_ID]  # the check and the request, on one kept connection
    port, _ = with_policies(proc, signer, custom("app/nothing.app.svc.cluster.local"))
    assert await send(port, "/x", []) == (403, b"")
    port, _ = with_policies(proc, signer, custom("app/nothing.app.svc.cluster.local", fail_open=True))
    assert (await send(port, "/x", []))[0] == 200
