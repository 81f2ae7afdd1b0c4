"""DestinationRules at a real waypoint on loopback (istio TestServerRouting "subset", TestDestinationRule): subsets
filter the endpoints, TLS is originated to a real TLS backend (inside the HBONE tunnel), HTTP/1.1 requests go to
an h2c backend as HTTP/2, a PROXY header precedes the bytes; a subset nobody defines and a backend whose
certificate cannot be trusted answer 503, never the wrong endpoint nor plaintext. The rules are put into the
waypoint's config directly, as the control plane would send them (see :mod:`tests.integration.waypoint_rig`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from tests.integration.waypoint_rig import (
    ECHO_VIP,
    H2C_VIP,
    SECURE_HTTP_VIP,
    SECURE_VIP,
    TLS_TARGET_PORT,
    HttpOverTunnel,
    Rig,
    echo_of,
    free_port,
    h2c_backends,
    read_until_eof,
    started_rig,
)

from ambit.controlplane.translate import translate_all
from ambit.model.destination_policy import (
    ClientTls,
    ConnectionPool,
    DestinationPolicy,
    H2Upgrade,
    OutlierDetection,
    PortTrafficPolicy,
    ProxyProtocolVersion,
    Subset,
    TlsMode,
    TrafficPolicy,
)
from ambit.model.route_matches import RouteMatch
from ambit.model.routes import BackendService, RouteRule, RouteTable, WaypointConfig, WeightedBackend
from ambit.proxy.hbone_client import HboneClient, TunnelRefusedError
from ambit.tls.certs import KeyPair, issue_client_cert, issue_server_cert, new_ca
from ambit.waypoint.settings import WaypointLimits

LIMITS = WaypointLimits(max_head_bytes=8 * 1024, head_timeout=0.5, sniff_timeout=0.5, startup_wait=5.0)
ECHO = "echo.app.svc.cluster.local"
H2C = "h2c.app.svc.cluster.local"
SECURE = "secure.app.svc.cluster.local"
SECURE_HTTP = "secure-http.app.svc.cluster.local"
ECHO_1, ECHO_2 = "Kubernetes//Pod/app/echo-1", "Kubernetes//Pod/app/echo-2"


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path, LIMITS) as rig:
        yield rig


def configure(rig: Rig, *rules: DestinationPolicy, tables: tuple[RouteTable, ...] = ()) -> None:
    rig.waypoint.context.routes.replace(WaypointConfig("app/waypoint", tables, destination_rules=rules))


def to_subset(hostname: str, subset: str, port: int = 80) -> RouteTable:
    """A route table sending everything to one subset (what a VirtualService destination with ``subset`` is)."""
    backend = BackendService("app", hostname, port, subset)
    rule = RouteRule("VirtualService/app/route", RouteMatch(), backends=(WeightedBackend(backend),))
    return RouteTable(f"app/{hostname}", port, http=(rule,))


VERSIONS = (Subset("v1", frozenset({ECHO_1})), Subset("v2", frozenset({ECHO_2})))


async def test_a_subset_route_reaches_only_the_subsets_workload(rig: Rig) -> None:
    """TestServerRouting "subset": every response comes from the v1 pod; then v2 from the other."""
    for subset, expected in (("v1", "echo-1"), ("v2", "echo-2")):
        configure(
            rig, DestinationPolicy(f"app/{ECHO}", "app/route", subsets=VERSIONS), tables=(to_subset(ECHO, subset),)
        )
        client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
        http = HttpOverTunnel(stream)
        seen = set()
        for _ in range(8):
            status, _, body = await http.request("GET", "/echo")
            assert status == 200
            seen.add(echo_of(body)["endpoint"])
        assert seen == {expected}
        await client.aclose()


@pytest.mark.parametrize(
    "rules",
    [(DestinationPolicy(f"app/{ECHO}", "app/route", subsets=VERSIONS),), ()],
    ids=["rule without the subset", "no rule"],
)
async def test_a_subset_no_rule_defines_answers_503_and_never_falls_back(
    rig: Rig, rules: tuple[DestinationPolicy, ...]
) -> None:
    configure(rig, *rules, tables=(to_subset(ECHO, "v3"),))
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    status, _, _ = await HttpOverTunnel(stream).request("GET", "/echo")
    assert status == 503
    assert [e.tunnels for e in rig.endpoints] == [0, 0]
    await client.aclose()


async def test_a_subset_whose_workloads_are_gone_answers_503_no_healthy_upstream(rig: Rig) -> None:
    gone = (Subset("v1", frozenset({"Kubernetes//Pod/app/echo-9"})),)
    configure(rig, DestinationPolicy(f"app/{ECHO}", "app/route", subsets=gone), tables=(to_subset(ECHO, "v1"),))
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    status, _, body = await HttpOverTunnel(stream).request("GET", "/echo")
    assert (status, body) == (503, b"no healthy upstream")
    await client.aclose()


# TLS origination (TestDestinationRule "TLS", "port level TLS").


@dataclass
class TlsBackend:
    ca: KeyPair
    port: int
    requests: list[str] = field(default_factory=list)
    names: list[str | None] = field(default_factory=list)
    """The SNI of every handshake."""


@contextlib.asynccontextmanager
async def tls_backend(
    rig: Rig, *, names: tuple[str, ...] = (SECURE,), client_ca: KeyPair | None = None
) -> AsyncIterator[TlsBackend]:
    """An HTTPS echo server (its own CA) behind echo-1's target port 8443; with ``client_ca`` it requires a client
    certificate that CA issued, and answers the certificate's common name."""
    ca = new_ca("backend-ca", now=time.time())
    leaf = issue_server_cert(ca, common_name=names[0], dns_names=names, ip_addresses=(), now=time.time())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    certfile = rig.tmp / "backend.pem"
    certfile.write_bytes(leaf.cert_pem + leaf.key_pem)
    context.load_cert_chain(certfile)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=client_ca.cert_pem.decode())
    backend = TlsBackend(ca, free_port())
    context.sni_callback = lambda _sock, name, _ctx: backend.names.append(name)  # type: ignore[func-returns-value]

    async def echo(request: web.Request) -> web.Response:
        backend.requests.append(f"{request.method} {request.path} HTTP/{request.version.major}.{request.version.minor}")
        peer = request.transport.get_extra_info("peercert") if request.transport is not None else None
        client = next((v for rdn in (peer or {}).get("subject", ()) for k, v in rdn if k == "commonName"), "")
        return web.json_response({"tls": True, "path": request.path, "sni": backend.names[-1], "client": client})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", backend.port, ssl_context=context).start()
    rig.endpoints[0].extra[TLS_TARGET_PORT] = backend.port
    try:
        yield backend
    finally:
        await runner.cleanup()


async def _plain_http_over_tls_port(rig: Rig) -> bytes:
    client, stream = await rig.tunnel(f"{SECURE_VIP}:443")
    await stream.write(b"GET /hello HTTP/1.0\r\nHost: secure\r\n\r\n")
    answer = await read_until_eof(stream)
    await client.aclose()
    return answer


async def test_plain_http_to_the_https_port_is_sent_over_tls_the_waypoint_originates(rig: Rig) -> None:
    """TestDestinationRule "TLS": SIMPLE with insecureSkipVerify; the client speaks plain HTTP to the https port
    (declared TLS: the waypoint relays bytes) and the backend gets them over TLS, inside the HBONE tunnel."""
    async with tls_backend(rig) as backend:
        configure(
            rig,
            DestinationPolicy(
                f"app/{SECURE}", "app/secure", TrafficPolicy(tls=ClientTls(TlsMode.SIMPLE, insecure_skip_verify=True))
            ),
        )
        answer = await _plain_http_over_tls_port(rig)
        assert answer.startswith(b"HTTP/1.0 200") and b'"tls": true' in answer
        assert b'"sni": "secure.app.svc.cluster.local"' in answer  # the Service's hostname by default
        assert backend.requests == ["GET /hello HTTP/1.0"]
        assert rig.endpoints[0].authorities == [f"127.0.0.2:{TLS_TARGET_PORT}"]  # through the endpoint's tunnel


async def test_port_level_tls_verifies_against_the_rules_ca_and_names_the_sni(rig: Rig) -> None:
    async with tls_backend(rig, names=("backend.example.com",)) as backend:
        tls = ClientTls(TlsMode.SIMPLE, sni="backend.example.com", ca_certificates=backend.ca.cert_pem.decode())
        policy = TrafficPolicy(port_level=(PortTrafficPolicy(443, tls=tls),))
        configure(rig, DestinationPolicy(f"app/{SECURE}", "app/secure", policy))
        answer = await _plain_http_over_tls_port(rig)
        assert answer.startswith(b"HTTP/1.0 200") and b'"sni": "backend.example.com"' in answer


@pytest.mark.parametrize(
    "tls",
    [
        ClientTls(TlsMode.SIMPLE),  # the system store does not know the backend's CA
        ClientTls(TlsMode.SIMPLE, sni="other.example.com", ca_certificates="CA"),  # the name does not match
        ClientTls(TlsMode.SIMPLE, ca_certificates="CA", subject_alt_names=("nope.example.com",)),
        ClientTls(TlsMode.MUTUAL, insecure_skip_verify=True),  # no client certificate to present
    ],
    ids=["unknown CA", "SNI mismatch", "SAN mismatch", "MUTUAL without a certificate"],
)
async def test_a_backend_the_rule_cannot_trust_is_refused_never_sent_plaintext(rig: Rig, tls: ClientTls) -> None:
    async with tls_backend(rig) as backend:
        if tls.ca_certificates == "CA":
            tls = ClientTls(tls.mode, tls.sni, False, backend.ca.cert_pem.decode(), tls.subject_alt_names)
        configure(rig, DestinationPolicy(f"app/{SECURE}", "app/secure", TrafficPolicy(tls=tls)))
        with pytest.raises(TunnelRefusedError):
            await _plain_http_over_tls_port(rig)
        assert backend.requests == []


# TLS mode MUTUAL (TestDestinationRule "MUTUAL"): the backend requires a client certificate.


def _client_pair(ca: KeyPair, name: str = "waypoint-client") -> KeyPair:
    return issue_client_cert(ca, common_name=name, now=time.time())


async def _mutual_request(rig: Rig, tls: ClientTls) -> tuple[int, bytes]:
    configure(rig, DestinationPolicy(f"app/{SECURE_HTTP}", "app/mutual", TrafficPolicy(tls=tls)))
    client, stream = await rig.tunnel(f"{SECURE_HTTP_VIP}:80")
    try:
        status, _, body = await HttpOverTunnel(stream, host=SECURE_HTTP).request("GET", "/m")
    finally:
        await client.aclose()
    return status, body


async def test_mutual_with_a_secrets_certificate_presents_it_to_a_backend_that_requires_one(rig: Rig) -> None:
    client_ca = new_ca("client-ca", now=time.time())
    pair = _client_pair(client_ca)
    async with tls_backend(rig, names=(SECURE_HTTP,), client_ca=client_ca) as backend:
        tls = ClientTls(
            TlsMode.MUTUAL,
            ca_certificates=backend.ca.cert_pem.decode(),
            client_certificate=pair.cert_pem.decode(),
            private_key=pair.key_pem.decode(),
        )
        status, body = await _mutual_request(rig, tls)
        assert status == 200 and json.loads(body)["client"] == "waypoint-client", body
        assert backend.requests == ["GET /m HTTP/1.1"]


async def test_mutual_with_file_paths_reads_the_files_on_the_waypoint(rig: Rig) -> None:
    client_ca = new_ca("client-ca", now=time.time())
    pair = _client_pair(client_ca, "from-files")
    async with tls_backend(rig, names=(SECURE_HTTP,), client_ca=client_ca) as backend:
        files = {"ca.pem": backend.ca.cert_pem, "cert.pem": pair.cert_pem, "key.pem": pair.key_pem}
        rig.tmp.chmod(0o700)
        for name, data in files.items():
            (rig.tmp / name).write_bytes(data)
        tls = ClientTls(
            TlsMode.MUTUAL,
            ca_certificates_path=str(rig.tmp / "ca.pem"),
            client_certificate_path=str(rig.tmp / "cert.pem"),
            private_key_path=str(rig.tmp / "key.pem"),
        )
        status, body = await _mutual_request(rig, tls)
        assert status == 200 and json.loads(body)["client"] == "from-files", body


def _fifo(rig: Rig) -> str:
    path = rig.tmp / "fifo.pem"
    os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize(
    "hostile",
    [
        "backend's CA unknown",
        "client CA not the backend's",
        "no certificate",
        "key of another",
        "missing files",
        "fifo",
    ],
)
async def test_mutual_that_cannot_complete_answers_503_and_the_backend_gets_nothing(rig: Rig, hostile: str) -> None:
    """Fail closed: a backend whose certificate the rule's CA did not issue (a hostile endpoint), a backend that
    refuses our certificate, or a certificate that is missing or does not load: 503, never plaintext, and a FIFO
    as a path does not hang the waypoint."""
    client_ca, other_ca = new_ca("client-ca", now=time.time()), new_ca("other", now=time.time())
    pair = _client_pair(other_ca if hostile == "client CA not the backend's" else client_ca)
    async with tls_backend(rig, names=(SECURE_HTTP,), client_ca=client_ca) as backend:
        anchor = (other_ca if hostile == "backend's CA unknown" else backend.ca).cert_pem.decode()
        tls = ClientTls(
            TlsMode.MUTUAL,
            ca_certificates=anchor,
            client_certificate=pair.cert_pem.decode(),
            private_key=_client_pair(client_ca).key_pem.decode()
            if hostile == "key of another"
            else pair.key_pem.decode(),
        )
        if hostile == "no certificate":
            tls = ClientTls(TlsMode.MUTUAL, ca_certificates=anchor)
        elif hostile == "missing files":
            tls = ClientTls(TlsMode.MUTUAL, client_certificate_path="/nonexistent/c.pem", private_key_path="/k.pem")
        elif hostile == "fifo":
            fifo = _fifo(rig)
            tls = ClientTls(TlsMode.MUTUAL, client_certificate_path=fifo, private_key_path=fifo)
        status, _ = await asyncio.wait_for(_mutual_request(rig, tls), 10)
        assert status == 503
        assert backend.requests == []


async def test_an_http_port_with_tls_forwards_each_request_over_originated_tls(rig: Rig) -> None:
    async with tls_backend(rig, names=(SECURE_HTTP,)) as backend:
        tls = ClientTls(TlsMode.SIMPLE, ca_certificates=backend.ca.cert_pem.decode())
        configure(rig, DestinationPolicy(f"app/{SECURE_HTTP}", "app/secure", TrafficPolicy(tls=tls)))
        client, stream = await rig.tunnel(f"{SECURE_HTTP_VIP}:80")
        http = HttpOverTunnel(stream, host=SECURE_HTTP)
        for path in ("/a", "/b"):
            status, _, body = await http.request("GET", path)
            assert status == 200 and json.loads(body) == {"tls": True, "path": path, "sni": SECURE_HTTP, "client": ""}
        assert backend.requests == ["GET /a HTTP/1.1", "GET /b HTTP/1.1"]
        assert rig.endpoints[0].tunnels == 1  # the TLS connection was kept and reused
        await client.aclose()


# HTTP/2 upgrade (TestDestinationRule "Subset policy", "H2").


UPGRADE = TrafficPolicy(connection_pool=ConnectionPool(h2_upgrade=H2Upgrade.UPGRADE))


async def test_a_subset_policy_upgrades_http1_requests_to_h2c_at_the_v1_workload(rig: Rig) -> None:
    """TestDestinationRule "Subset policy": subset v1 with h2UpgradePolicy UPGRADE; the backend sees HTTP/2."""
    async with h2c_backends(rig) as backends:
        subsets = (Subset("v1", frozenset({ECHO_1}), UPGRADE), Subset("v2", frozenset({ECHO_2})))
        configure(rig, DestinationPolicy(f"app/{H2C}", "app/h2c", subsets=subsets), tables=(to_subset(H2C, "v1"),))
        client, stream = await rig.tunnel(f"{H2C_VIP}:80")
        http = HttpOverTunnel(stream, host=H2C)
        for _ in range(4):
            status, _, body = await http.request("GET", "/proto")
            assert status == 200 and json.loads(body) == {"endpoint": "echo-1", "proto": "HTTP/2.0", "path": "/proto"}
        assert [b.protocols for b in backends] == [["HTTP/2.0"] * 4, []]
        assert backends[0].connections == 1  # one multiplexed upstream connection
        await client.aclose()


async def test_without_the_upgrade_the_same_backend_gets_http1(rig: Rig) -> None:
    async with h2c_backends(rig) as backends:
        configure(rig, DestinationPolicy(f"app/{H2C}", "app/h2c", subsets=VERSIONS), tables=(to_subset(H2C, "v2"),))
        client, stream = await rig.tunnel(f"{H2C_VIP}:80")
        status, _, _ = await HttpOverTunnel(stream, host=H2C).request("GET", "/proto")
        assert status == 505 and backends[1].protocols == ["HTTP/1.1"]
        await client.aclose()


async def test_a_top_level_upgrade_applies_to_every_endpoint(rig: Rig) -> None:
    """TestDestinationRule "H2"."""
    async with h2c_backends(rig) as backends:
        configure(rig, DestinationPolicy(f"app/{H2C}", "app/h2c", UPGRADE))
        client, stream = await rig.tunnel(f"{H2C_VIP}:80")
        http = HttpOverTunnel(stream, host=H2C)
        for _ in range(4):
            status, _, body = await http.request("GET", "/x")
            assert status == 200 and json.loads(body)["proto"] == "HTTP/2.0"
        assert [len(b.protocols) for b in backends] == [2, 2]
        await client.aclose()


# PROXY protocol (TestDestinationRule "PROXY").


async def test_a_proxy_protocol_rule_sends_the_clients_address_first(rig: Rig) -> None:
    lines: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lines.append(await reader.readline())
        request = await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.0 200 OK\r\n\r\n" + request.split(b"\r\n")[0])
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    rig.endpoints[0].extra[TLS_TARGET_PORT] = server.sockets[0].getsockname()[1]
    try:
        policy = TrafficPolicy(proxy_protocol=ProxyProtocolVersion.V1)
        configure(rig, DestinationPolicy(f"app/{SECURE}", "app/proxy", policy))
        answer = await _plain_http_over_tls_port(rig)
    finally:
        server.close()
    assert answer.endswith(b"GET /hello HTTP/1.0")
    (line,) = lines
    assert line.startswith(b"PROXY TCP4 127.0.0.4 127.0.0.2 ") and line.endswith(f" {TLS_TARGET_PORT}\r\n".encode())


async def test_istio_mutual_changes_nothing(rig: Rig) -> None:
    """TestDestinationRule "ISTIO_MUTUAL": the waypoint just does HBONE."""
    configure(rig, DestinationPolicy(f"app/{ECHO}", "app/mutual", TrafficPolicy(tls=ClientTls(TlsMode.ISTIO_MUTUAL))))
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    status, _, _ = await HttpOverTunnel(stream).request("GET", "/echo")
    assert status == 200
    await client.aclose()


# Connection pool limits (circuit breakers).


@contextlib.asynccontextmanager
async def held_backend(rig: Rig) -> AsyncIterator[tuple[list[bytes], asyncio.Event]]:
    """An HTTP/1.1 server behind secure-http (echo-1, port 8443) that holds every request until released, and
    answers each on its own connection."""
    arrived: list[bytes] = []
    release = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                arrived.append(head.split(b"\r\n")[0])
                await release.wait()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    rig.endpoints[0].extra[TLS_TARGET_PORT] = server.sockets[0].getsockname()[1]
    try:
        yield arrived, release
    finally:
        release.set()
        server.close()


async def _requests(
    rig: Rig, n: int
) -> tuple[list[asyncio.Task[tuple[int, dict[str, str], bytes]]], list[HboneClient]]:
    """``n`` requests at once, each on its own tunnel."""
    tasks, clients = [], []
    for i in range(n):
        client, stream = await rig.tunnel(f"{SECURE_HTTP_VIP}:80")
        http = HttpOverTunnel(stream, host=SECURE_HTTP)
        tasks.append(asyncio.create_task(http.request("GET", f"/r{i}")))
        clients.append(client)
    return tasks, clients


@pytest.mark.parametrize(
    ("pool", "statuses"),
    [
        (ConnectionPool(max_connections=1, http1_max_pending_requests=1), [200, 200, 503]),
        (ConnectionPool(http2_max_requests=2), [200, 200, 503]),
    ],
    ids=["maxConnections with one pending", "http2MaxRequests"],
)
async def test_requests_over_the_pool_limits_overflow_with_503(
    rig: Rig, pool: ConnectionPool, statuses: list[int]
) -> None:
    async with held_backend(rig) as (arrived, release):
        configure(rig, DestinationPolicy(f"app/{SECURE_HTTP}", "app/limits", TrafficPolicy(connection_pool=pool)))
        tasks, clients = await _requests(rig, 3)
        reaching = 1 if pool.max_connections else 2  # with maxConnections the pending one waits at the waypoint
        async with asyncio.timeout(10):
            while not any(t.done() for t in tasks) or len(arrived) < reaching:  # noqa: ASYNC110 - the waypoint's
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)
        done = [t for t in tasks if t.done()]
        assert [(t.result()[0], t.result()[2]) for t in done] == [(503, OVERFLOW)]
        overflowed = done[0].result()[1]
        assert (overflowed["x-envoy-overloaded"], overflowed["server"]) == ("true", "istio-envoy")
        assert "x-envoy-upstream-service-time" not in overflowed  # a local answer
        assert len(arrived) == reaching
        release.set()
        answers = [await t for t in tasks]
        assert sorted(status for status, _, _ in answers) == sorted(statuses)
        for status, headers, _ in answers:
            if status == 200:  # held ~0.1 s at the endpoint: the router's service time says so
                assert int(headers["x-envoy-upstream-service-time"]) >= 100, headers
                assert (headers["server"], "x-envoy-overloaded" in headers) == ("istio-envoy", False)
                assert headers["date"].endswith(" GMT")
        assert len(arrived) == 2
        for client in clients:
            await client.aclose()


OVERFLOW = b"upstream connect error or disconnect/reset before headers. reset reason: overflow"


async def test_max_requests_per_connection_closes_kept_connections(rig: Rig) -> None:
    async with held_backend(rig) as (arrived, release):
        release.set()
        pool = ConnectionPool(max_requests_per_connection=1)
        configure(rig, DestinationPolicy(f"app/{SECURE_HTTP}", "app/limits", TrafficPolicy(connection_pool=pool)))
        client, stream = await rig.tunnel(f"{SECURE_HTTP_VIP}:80")
        http = HttpOverTunnel(stream, host=SECURE_HTTP)
        for i in range(3):
            assert (await http.request("GET", f"/{i}"))[0] == 200
        assert len(arrived) == 3 and rig.endpoints[0].tunnels == 3  # a new upstream connection per request
        await client.aclose()


async def test_max_requests_per_connection_retires_http2_upstream_sessions(rig: Rig) -> None:
    """Envoy applies ``max_requests_per_connection`` to HTTP/2 upstreams too (istio's applyDrainingWorkaround, 1):
    each request goes on a session of its own, and a spent session is ended (GOAWAY, EOF), not left idle."""
    async with h2c_backends(rig) as backends:
        pool = ConnectionPool(h2_upgrade=H2Upgrade.UPGRADE, max_requests_per_connection=1)
        configure(rig, DestinationPolicy(f"app/{H2C}", "app/h2c", TrafficPolicy(connection_pool=pool)))
        client, stream = await rig.tunnel(f"{H2C_VIP}:80")
        http = HttpOverTunnel(stream, host=H2C)
        for _ in range(4):
            status, _, body = await http.request("GET", "/x")
            assert status == 200 and json.loads(body)["proto"] == "HTTP/2.0"
        assert sum(b.connections for b in backends) == 4
        sessions = rig.waypoint.context.http2
        async with asyncio.timeout(5):
            while sum(b.h2_ended for b in backends) < 4 or sessions.tasks:  # noqa: ASYNC110 - both ends' readers
                await asyncio.sleep(0.02)
        assert sessions.count() == 0
        await client.aclose()


async def test_without_max_requests_per_connection_one_http2_session_carries_every_request(rig: Rig) -> None:
    async with h2c_backends(rig) as backends:
        configure(rig, DestinationPolicy(f"app/{H2C}", "app/h2c", UPGRADE))
        client, stream = await rig.tunnel(f"{H2C_VIP}:80")
        http = HttpOverTunnel(stream, host=H2C)
        for _ in range(4):
            assert (await http.request("GET", "/x"))[0] == 200
        assert [b.connections for b in backends] == [1, 1] and [b.h2_ended for b in backends] == [0, 0]
        await client.aclose()


async def test_outlier_detection_ejects_an_endpoint_after_consecutive_5xx(rig: Rig) -> None:
    rig.endpoints[1].fail_status = 503
    detection = OutlierDetection(consecutive_5xx=2, interval=1.0, base_ejection_time=30.0, max_ejection_percent=50)
    configure(rig, DestinationPolicy(f"app/{ECHO}", "app/outliers", TrafficPolicy(outlier_detection=detection)))
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    for _ in range(20):
        status, _, body = await http.request("GET", "/echo")
        assert status == 200 and echo_of(body)["endpoint"] == "echo-1"  # the 503s were retried on echo-1
    assert rig.endpoints[1].seen == ["GET /echo"] * 2  # then ejected for 30 s
    await client.aclose()


async def test_tcp_connections_over_max_connections_are_refused(rig: Rig) -> None:
    async with held_backend(rig) as (arrived, release):
        pool = ConnectionPool(max_connections=1)
        configure(rig, DestinationPolicy(f"app/{SECURE}", "app/limits", TrafficPolicy(connection_pool=pool)))
        client = await rig.client()
        first = await client.open_tunnel(f"{SECURE_VIP}:443", [])  # declared TLS: relayed as TCP
        await first.write(b"GET /held HTTP/1.1\r\nhost: x\r\n\r\n")
        async with asyncio.timeout(5):
            while not arrived:  # noqa: ASYNC110 - the backend's side
                await asyncio.sleep(0.02)
        with pytest.raises(TunnelRefusedError):
            await client.open_tunnel(f"{SECURE_VIP}:443", [])
        release.set()
        await first.aclose()
        async with asyncio.timeout(5):
            while rig.waypoint.context.balancer.active:  # noqa: ASYNC110 - the waypoint's side
                await asyncio.sleep(0.02)
        again = await client.open_tunnel(f"{SECURE_VIP}:443", [])
        await again.write(b"GET /again HTTP/1.0\r\n\r\n")
        answer = b""
        async with asyncio.timeout(5):
            while not answer.endswith(b"ok"):
                answer += await again.read()
        assert answer.startswith(b"HTTP/1.1 200")
        await client.aclose()


@pytest.mark.parametrize("reply", [b"HTTP/1.1 200 OK\r\n\r\n" * 100, b"\x16\x03\x03\xff\xff" + b"\x00" * 4096, b""])
async def test_a_hostile_backend_breaking_the_tls_handshake_is_refused_quickly(rig: Rig, reply: bytes) -> None:
    """A backend answering the ClientHello with plaintext, a forged oversized record or nothing (closing): the
    connection fails within the handshake, and nothing the client sent reaches it in the clear."""
    received: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.read(65536))
        writer.write(reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    rig.endpoints[0].extra[TLS_TARGET_PORT] = server.sockets[0].getsockname()[1]
    try:
        insecure = TrafficPolicy(tls=ClientTls(TlsMode.SIMPLE, insecure_skip_verify=True))
        configure(rig, DestinationPolicy(f"app/{SECURE}", "app/secure", insecure))
        async with asyncio.timeout(5):
            with pytest.raises(TunnelRefusedError):
                await _plain_http_over_tls_port(rig)
    finally:
        server.close()
    assert len(received) == 1 and received[0].startswith(b"\x16\x03")  # a ClientHello, never the request
    assert b"GET /hello" not in received[0]


# BackendTLSPolicy (translate/backendtls.py): the settings the control plane derives from a policy and its CA
# ConfigMap, applied by the waypoint; a backend whose certificate that CA did not issue is refused.


def _backend_tls_policy_settings(ca_pem: str | None) -> ClientTls:
    """The TLS settings a BackendTLSPolicy on Service ``secure`` (SNI ``secure``'s hostname, CA from ConfigMap
    ``backend-ca``: ``ca_pem``, or no such ConfigMap) becomes, through the whole translation."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "app"}}
    service = {"metadata": {"name": "secure", "namespace": "app", "labels": {"istio.io/use-waypoint": "waypoint"}},
               "spec": {"clusterIP": SECURE_VIP, "ports": [{"name": "https", "port": 443}]}}  # fmt: skip
    policy = {
        "metadata": {"name": "secure-tls", "namespace": "app"},
        "spec": {
            "targetRefs": [{"group": "", "kind": "Service", "name": "secure"}],
            "validation": {"hostname": SECURE, "caCertificateRefs": [{"kind": "ConfigMap", "name": "backend-ca"}]},
        },
    }
    gateway = {
        "metadata": {"name": "waypoint", "namespace": "app"},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "m", "port": 15008, "protocol": "HBONE"}],
        },
        "status": {"addresses": [{"type": "Hostname", "value": "waypoint.app.svc.cluster.local"}]},
    }
    maps = (
        [] if ca_pem is None else [{"metadata": {"name": "backend-ca", "namespace": "app"}, "data": {"ca.crt": ca_pem}}]
    )
    waypoint_class = {"metadata": {"name": "istio-waypoint"}, "spec": {"controllerName": "istio.io/mesh-controller"}}
    translation = translate_all(
        [], [service], [], [namespace], gateways=[gateway], gateway_classes=[waypoint_class],
        backend_tls_policies=[policy], config_maps=maps,
    )  # fmt: skip
    (config,) = translation.waypoint_configs
    tls = config.destination_rules[0].traffic_policy.tls
    assert tls is not None
    return tls


async def test_a_backend_tls_policy_with_the_backends_ca_reaches_it(rig: Rig) -> None:
    async with tls_backend(rig) as backend:
        tls = _backend_tls_policy_settings(backend.ca.cert_pem.decode())
        configure(rig, DestinationPolicy(f"app/{SECURE}", "app/secure", TrafficPolicy(tls=tls)))
        answer = await _plain_http_over_tls_port(rig)
        assert answer.startswith(b"HTTP/1.0 200") and f'"sni": "{SECURE}"'.encode() in answer


@pytest.mark.parametrize("ca", ["another issuer", "missing ConfigMap"])
async def test_a_backend_tls_policy_refuses_a_backend_its_ca_did_not_issue(rig: Rig, ca: str) -> None:
    async with tls_backend(rig) as backend:
        other = new_ca("impostor-ca", now=time.time()).cert_pem.decode() if ca == "another issuer" else None
        tls = _backend_tls_policy_settings(other)
        assert tls.trust_unresolved is (other is None)
        configure(rig, DestinationPolicy(f"app/{SECURE}", "app/secure", TrafficPolicy(tls=tls)))
        with pytest.raises(TunnelRefusedError):
            await _plain_http_over_tls_port(rig)
        assert backend.requests == []
