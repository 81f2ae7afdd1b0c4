"""The ingress gateway's TLS passthrough, TCP and HTTP/2 listeners with real sockets (tests/integration/ingress_rig.py):
TLS relayed undecrypted to the backend the ClientHello's server name picks (exact beats wildcard), connections no
route takes closed, TCP relayed by weight, and HTTP/2 downstream by ALPN on HTTPS and by prior knowledge on HTTP."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import pytest
from tests.integration.ingress_rig import EDGE_CA, GATEWAY_ID, backend, ingress_rig, tls_ask
from tests.integration.waypoint_rig import free_port, http_get

from ambit.model.ingress import GatewayConfig, IngressCertificate, IngressListener, ListenerProtocol, VirtualHost
from ambit.model.route_matches import PathMatch, PathMatchType, RouteMatch
from ambit.model.routes import RouteRule, WeightedBackend
from ambit.tls.certs import issue_server_cert

EDGE_CERT = issue_server_cert(
    EDGE_CA, common_name="web.example", dns_names=["web.example"], ip_addresses=[], now=time.time()
)


def web_rule(service: str = "web") -> RouteRule:
    return RouteRule(
        route=f"HTTPRoute/edge/{service}",
        match=RouteMatch(path=PathMatch(PathMatchType.PATH_PREFIX, "/")),
        backends=(WeightedBackend(backend(service)),),
    )


def config() -> GatewayConfig:
    return GatewayConfig(
        "edge/edge",
        (
            IngressListener(
                "tls",
                free_port(),
                ListenerProtocol.TLS,
                "",
                (),
                (
                    VirtualHost("a.example.com", (), (WeightedBackend(backend("one")),)),
                    VirtualHost("*.example.com", (), (WeightedBackend(backend("two")),)),
                    VirtualHost("gone.example.org", (), (WeightedBackend(None),)),
                ),
            ),
            IngressListener(
                "tcp",
                free_port(),
                ListenerProtocol.TCP,
                "",
                (),
                (VirtualHost("*", (), (WeightedBackend(backend("tcp"), 1), WeightedBackend(backend("one"), 0))),),
            ),
            IngressListener(
                "tcp-none",
                free_port(),
                ListenerProtocol.TCP,
                "",
                (),
                (VirtualHost("*", (), (WeightedBackend(backend("tcp"), 0),)),),
            ),
            IngressListener("http", free_port(), ListenerProtocol.HTTP, "", (), (VirtualHost("*", (web_rule(),)),)),
            IngressListener(
                "http-web2", free_port(), ListenerProtocol.HTTP, "", (), (VirtualHost("*", (web_rule("web2"),)),)
            ),
            IngressListener(
                "https",
                free_port(),
                ListenerProtocol.HTTPS,
                "web.example",
                (IngressCertificate(EDGE_CERT.cert_pem, EDGE_CERT.key_pem),),
                (VirtualHost("web.example", (web_rule(),)),),
            ),
        ),
    )


async def closed_without_answer(port: int, data: bytes) -> bool:
    """Whether the gateway closes a connection that sent ``data`` without sending anything back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10) == b""
    except ConnectionResetError:
        return True
    finally:
        writer.close()


async def test_tls_is_passed_through_to_the_backend_the_server_name_picks(tmp_path: Path) -> None:
    async with ingress_rig(tmp_path, config()) as rig:
        port = rig.port("tls")
        assert await tls_ask(port, "a.example.com") == "one hello"  # exact beats the wildcard
        assert await tls_ask(port, "z.example.com", "hi") == "two hi"
        assert await tls_ask(port, "A.Example.COM") == "one hello"
        assert rig.endpoint.peers == [GATEWAY_ID] * 3  # over HBONE with the gateway's own identity
        metrics = rig.proc.metrics.render().decode()
        opened = [line for line in metrics.splitlines() if line.startswith("istio_tcp_connections_opened_total{")]
        assert opened and all('reporter="source"' in line for line in opened)
        assert any('destination_service="one.app.svc.cluster.local"' in line for line in opened)


async def test_a_connection_no_route_takes_is_closed_unrelayed(tmp_path: Path) -> None:
    async with ingress_rig(tmp_path, config()) as rig:
        port = rig.port("tls")
        for name in ("other.example.org", "gone.example.org"):
            with pytest.raises((ssl.SSLError, ConnectionResetError, asyncio.IncompleteReadError, OSError)):
                await tls_ask(port, name)
        context = ssl.create_default_context(cadata=EDGE_CA.cert_pem.decode())
        context.check_hostname = False
        with pytest.raises((ssl.SSLError, ConnectionResetError, OSError)):
            _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)  # no SNI at all
            writer.close()
        assert await closed_without_answer(port, b"GET / HTTP/1.1\r\nHost: a.example.com\r\n\r\n")
        assert rig.endpoint.peers == []
        assert await closed_without_answer(rig.port("tcp-none"), b"ping\n")
        refusals = rig.proc.config_dump()["gateway"]["connection_refusals"]
        assert refusals == {"hello": 1, "no route": 4}, refusals
        assert await tls_ask(port, "a.example.com") == "one hello"  # the listener still serves


async def test_tcp_is_relayed_by_weight(tmp_path: Path) -> None:
    async with ingress_rig(tmp_path, config()) as rig:
        for _ in range(5):  # weight 0 is never chosen
            reader, writer = await asyncio.open_connection("127.0.0.1", rig.port("tcp"))
            writer.write(b"ping\n")
            await writer.drain()
            assert await asyncio.wait_for(reader.readline(), 10) == b"ping\n"
            writer.close()
        assert rig.endpoint.peers == [GATEWAY_ID] * 5


def h2_get(port: int, authority: str, path: str, context: ssl.SSLContext | None) -> tuple[int, dict[str, str], str]:
    """One HTTP/2 GET with h2 (blocking; run in a thread): over TLS with ALPN h2 when ``context``, else h2c prior
    knowledge. Returns status, the JSON body and the ALPN protocol ("" for h2c)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock: socket.socket = context.wrap_socket(raw, server_hostname=authority) if context else raw
    alpn = sock.selected_alpn_protocol() or "" if isinstance(sock, ssl.SSLSocket) else ""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    conn.send_headers(
        1,
        [(":method", "GET"), (":path", path), (":authority", authority), (":scheme", "https" if context else "http")],
        end_stream=True,
    )
    sock.sendall(conn.data_to_send())
    status, body, done = 0, b"", False
    with sock:
        while not done:
            data = sock.recv(65536)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    status = int(dict(event.headers)[":status"])
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset | h2.events.ConnectionTerminated):
                    done = True
            sock.sendall(conn.data_to_send())
    return status, json.loads(body) if body else {}, alpn


async def test_http2_downstream_by_alpn_on_https_and_by_prior_knowledge_on_http(tmp_path: Path) -> None:
    async with ingress_rig(tmp_path, config()) as rig:
        context = ssl.create_default_context(cadata=EDGE_CA.cert_pem.decode())
        context.set_alpn_protocols(["h2", "http/1.1"])
        status, body, alpn = await asyncio.to_thread(h2_get, rig.port("https"), "web.example", "/over/tls", context)
        assert (status, body["path"], alpn) == (200, "/over/tls", "h2")
        status, body, alpn = await asyncio.to_thread(h2_get, rig.port("http"), "any.example", "/h2c", None)
        assert (status, body["path"], alpn) == (200, "/h2c", "")
        metrics = rig.proc.metrics.render().decode()
        counted = [line for line in metrics.splitlines() if line.startswith("istio_requests_total{")]
        assert sum('response_code="200"' in line for line in counted) >= 1


async def test_the_gateway_speaks_http2_to_a_port_declared_http2_whatever_the_client_spoke(tmp_path: Path) -> None:
    """Istio's gateway cluster for an HTTP/2 port is HTTP/2 (cluster_builder.go setUpstreamProtocol); to a port
    of unknown protocol it speaks HTTP/1.1, also to an h2 client (the test above: the ``web`` backend speaks only
    HTTP/1.1)."""
    async with ingress_rig(tmp_path, config()) as rig:
        status, text = await http_get(f"http://127.0.0.1:{rig.port('http-web2')}/h1")
        assert status == 200 and json.loads(text)["proto"] == "HTTP/2.0", text
        status, body, _ = await asyncio.to_thread(h2_get, rig.port("http-web2"), "any.example", "/h2", None)
        assert (status, body["proto"], body["path"]) == (200, "HTTP/2.0", "/h2")
        assert rig.web2.protocols == ["HTTP/2.0", "HTTP/2.0"]
