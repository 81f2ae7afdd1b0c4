"""The waypoint process on loopback: HBONE in, HTTP/1.1 routed per request, HBONE out, telemetry, refusals and
a hostile client (see :mod:`tests.integration.waypoint_rig` for the addresses)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import os
import re
import socket
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from tests.integration.waypoint_rig import (
    CLIENT_ID,
    DEAD_VIP,
    ECHO_VIP,
    PLAIN_VIP,
    RAW_DEAD_VIP,
    RAW_VIP,
    TCP_VIP,
    TLS_VIP,
    HttpOverTunnel,
    Rig,
    echo_of,
    free_port,
    http_get,
    mirroring_router,
    read_until_eof,
    started_rig,
)

from ambit.identity.localca import LocalCa
from ambit.model.routes import BackendService, RouteTable, Timeouts, WaypointConfig, WeightedBackend
from ambit.proxy import hbone_client, hbone_server
from ambit.proxy.hbone_client import HboneConnectError, TunnelRefusedError
from ambit.tls.socket_transport import TlsTransportKind
from ambit.waypoint.decisions import Decision, Forward, RequestHead, Respond
from ambit.waypoint.mirror import MAX_MIRROR_BODY
from ambit.waypoint.process import Waypoint
from ambit.waypoint.settings import WaypointLimits

LIMITS = WaypointLimits(max_head_bytes=8 * 1024, head_timeout=0.5, sniff_timeout=0.5, startup_wait=5.0)


@pytest.fixture
async def rig(tmp_path: Path, tls_transport: TlsTransportKind) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path, LIMITS, tls_transport) as rig:
        yield rig


get = http_get


async def until_ready(rig: Rig) -> None:
    async with asyncio.timeout(10):
        while (await get(f"http://127.0.0.1:{rig.settings.readiness_port}/healthz/ready"))[0] != 200:  # noqa: ASYNC110 - polling another process's endpoint
            await asyncio.sleep(0.05)


async def test_requests_on_one_keep_alive_tunnel_are_balanced_per_request_and_get_a_request_id(rig: Rig) -> None:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    seen = []
    for _ in range(6):
        status, _, body = await http.request("GET", "/echo")
        assert status == 200
        answer = echo_of(body)
        uuid.UUID(str(answer["request_id"]))  # added by the waypoint
        assert answer["host"] == "echo.app.svc.cluster.local"
        seen.append(answer["endpoint"])
    assert seen == ["echo-1", "echo-2"] * 3
    # a request id the client sent is kept
    status, _, body = await http.request("GET", "/echo", headers=[("x-request-id", "mine")])
    assert echo_of(body)["request_id"] == "mine"
    # upstream HTTP/1.1 connections were reused: one tunnel per endpoint for seven requests
    assert sorted(e.tunnels for e in rig.endpoints) == [1, 1]
    assert all(a.endswith(":8080") for e in rig.endpoints for a in e.authorities)
    await stream.aclose()
    await client.aclose()


async def test_both_hbone_legs_of_the_waypoint_run_on_its_tls_transport(
    rig: Rig, tls_transport: TlsTransportKind, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener's connection and the upstream pool's open TLS on the socket exactly when the settings say so
    (the rig's own client and endpoints stay on the loop's transport)."""
    opened: list[bool] = []

    def counting(real: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def open_tls(*args: Any, server_side: bool, **kwargs: Any) -> Any:
            opened.append(server_side)
            return await real(*args, server_side=server_side, **kwargs)

        return open_tls

    monkeypatch.setattr(hbone_client, "open_tls", counting(hbone_client.open_tls))
    monkeypatch.setattr(hbone_server, "open_tls", counting(hbone_server.open_tls))
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    status, _, body = await HttpOverTunnel(stream).request("GET", "/echo")
    assert status == 200 and echo_of(body)["host"] == "echo.app.svc.cluster.local"
    assert sorted(opened) == ([False, True] if tls_transport == "socket" else [])
    await stream.aclose()
    await client.aclose()


def _waypoint_tcp_nodelay(rig: Rig) -> dict[str, list[int]]:
    """TCP_NODELAY of the waypoint's connections in this process, by side: ``down`` (accepted on its HBONE port)
    and ``up`` (to an endpoint's HBONE port). Read from the sockets themselves (``/proc/self/fd``)."""
    found: dict[str, list[int]] = {"down": [], "up": []}
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
                continue  # a listener
            nodelay = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            if local[1] == rig.settings.hbone_port:
                found["down"].append(nodelay)
            elif peer[1] == rig.hbone_port and local[0] == "127.0.0.1":
                found["up"].append(nodelay)
    return found


async def test_small_requests_on_a_keep_alive_tunnel_are_not_held_by_nagle(rig: Rig) -> None:
    """A Nagle / delayed-ACK stall costs ~40 ms a small request; rather than time requests (which a loaded machine
    slows as much), check what prevents it: every connection of the waypoint, both sides, has TCP_NODELAY."""
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    for _ in range(5):
        assert (await http.request("GET", "/echo"))[0] == 200
    sides = _waypoint_tcp_nodelay(rig)
    assert sides["down"] and sides["up"], sides
    assert all(sides["down"]) and all(sides["up"]), sides
    await client.aclose()


async def test_a_workload_addressed_tunnel_goes_to_that_workload_only(rig: Rig) -> None:
    client, stream = await rig.tunnel("127.0.0.3:8080")  # echo-2 uses the waypoint for its own address
    http = HttpOverTunnel(stream)
    seen = {echo_of((await http.request("GET", "/echo"))[2])["endpoint"] for _ in range(4)}
    assert seen == {"echo-2"}
    await client.aclose()


async def test_pipelined_requests_are_answered_in_order(rig: Rig) -> None:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    one = b"GET /echo HTTP/1.1\r\nhost: echo\r\nx-request-id: first\r\n\r\n"
    two = b"GET /echo HTTP/1.1\r\nhost: echo\r\nx-request-id: second\r\nconnection: close\r\n\r\n"
    await stream.write(one + two)
    answer = await read_until_eof(stream)
    assert answer.count(b"HTTP/1.1 200 ") == 2
    assert answer.index(b'"first"') < answer.index(b'"second"')
    await client.aclose()


async def test_a_client_of_another_ca_is_dropped_at_the_handshake(rig: Rig, tmp_path: Path) -> None:
    stranger_ca = LocalCa(tmp_path / "other-ca", trust_domain="cluster.local")
    rig.client_cert = await stranger_ca.fetch_certificate(CLIENT_ID)
    with pytest.raises(HboneConnectError):
        await rig.client()
    async with asyncio.timeout(10):
        while rig.waypoint.refusals.handshake_failures == 0:  # noqa: ASYNC110 - the server's side, after ours
            await asyncio.sleep(0.01)


async def test_request_bodies_cross_both_ways(rig: Rig) -> None:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    status, _, body = await http.request("POST", "/echo", body=b"x" * 100_000)
    assert status == 200 and echo_of(body)["body"] == 100_000 and echo_of(body)["method"] == "POST"
    await client.aclose()


async def test_requests_are_counted_with_reporter_waypoint_and_logged(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="access")
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    for _ in range(4):
        assert (await http.request("GET", "/echo"))[0] == 200
    await client.aclose()
    status, text = await get(f"http://127.0.0.1:{rig.settings.stats_port}/metrics")
    assert status == 200
    lines = [line for line in text.splitlines() if line.startswith("istio_requests_total{")]
    per_endpoint = {}
    for line in lines:
        assert 'reporter="waypoint"' in line
        assert 'source_workload="client"' in line
        assert 'source_principal="spiffe://cluster.local/ns/app/sa/client"' in line
        assert 'connection_security_policy="mutual_tls"' in line
        assert 'request_protocol="http"' in line and 'response_code="200"' in line
        assert 'destination_service="echo.app.svc.cluster.local"' in line
        workload = re.search(r'destination_workload="([^"]+)"', line)
        assert workload is not None
        per_endpoint[workload.group(1)] = float(line.rsplit(" ", 1)[1])
    assert per_endpoint == {"echo-1": 2.0, "echo-2": 2.0}
    assert "istio_request_duration_milliseconds_bucket{" in text
    completes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("request complete")]
    assert len(completes) == 4 and all("response_code=200" in line for line in completes)


async def test_admin_and_metrics_are_not_reachable_through_a_tunnel(rig: Rig) -> None:
    client = await rig.client()
    for port in (rig.settings.admin_port, rig.settings.stats_port, rig.settings.readiness_port, 15000, 15020):
        with pytest.raises(TunnelRefusedError) as caught:
            await client.open_tunnel(f"127.0.0.1:{port}", [])
        assert caught.value.status == 400
    await client.aclose()
    assert rig.waypoint.refusals.by_status[400] == 5


async def test_unknown_and_foreign_destinations_are_refused_and_counted(rig: Rig) -> None:
    client = await rig.client()
    for authority in ("198.18.9.9:80", f"{PLAIN_VIP}:80", f"{ECHO_VIP}:81", "127.0.0.2:8080"):
        with pytest.raises(TunnelRefusedError) as caught:
            await client.open_tunnel(authority, [])
        assert caught.value.status == 400, authority
    await client.aclose()
    _, text = await get(f"http://127.0.0.1:{rig.settings.stats_port}/metrics")
    failed = [line for line in text.splitlines() if line.startswith("istio_tcp_connections_failed_total{")]
    assert any('reporter="waypoint"' in line and 'response_flags="NR"' in line for line in failed)


async def test_malformed_http_gets_400_and_the_tunnel_closes(rig: Rig) -> None:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    await stream.write(b"GET / HTTP/1.1\r\nbad header line\r\n\r\n")
    answer = await read_until_eof(stream)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"connection: close" in answer and answer.endswith(b"\r\n\r\nBad Request")  # Envoy's: the phrase
    await client.aclose()
    _, text = await get(f"http://127.0.0.1:{rig.settings.stats_port}/metrics")
    counted = [line for line in text.splitlines() if line.startswith("istio_requests_total{")]
    assert any('response_code="400"' in line and 'response_flags="DPE"' in line for line in counted)


async def _head_of_answer(stream: Any) -> tuple[list[str], dict[str, str]]:
    """The status line and fields of the next answer on ``stream`` (one with no body)."""
    data = b""
    async with asyncio.timeout(10):
        while b"\r\n\r\n" not in data:
            chunk = await stream.read()
            assert chunk, data
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    assert rest == b""
    lines = head.decode().split("\r\n")
    return lines, dict(line.split(": ", 1) for line in lines[1:])


async def test_http10_gets_envoy_s_426_unless_accepted_and_is_served_once_accepted(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """Istio's default (no PILOT_HTTP10, no HTTP10 metadata): Envoy's connection manager answers an HTTP/1.0
    request 426 with no body and no response flag, no endpoint is reached, and the connection closes unless the
    client asked to keep it; with ``accept_http_10`` on, HTTP/1.0 is served and answered in HTTP/1.0."""
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    await stream.write(b"GET /echo HTTP/1.0\r\nhost: echo\r\n\r\n")
    answer = await read_until_eof(stream)
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 426 Upgrade Required" and body == b""
    fields = dict(line.split(": ", 1) for line in lines[1:])
    assert fields["content-length"] == "0" and fields["server"] == "istio-envoy" and "date" in fields
    assert fields["connection"] == "close" and "content-type" not in fields
    await client.aclose()

    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")  # keep-alive asked: the 426 leaves the connection open
    await stream.write(b"GET /echo HTTP/1.0\r\nhost: echo\r\nconnection: keep-alive\r\n\r\n")
    lines, fields = await _head_of_answer(stream)
    assert lines[0] == "HTTP/1.1 426 Upgrade Required" and fields["connection"] == "keep-alive"
    status, _, body = await HttpOverTunnel(stream).request("GET", "/echo")
    assert status == 200 and echo_of(body)["host"] == "echo.app.svc.cluster.local"
    await client.aclose()
    assert sum(e.tunnels for e in rig.endpoints) == 1  # only the HTTP/1.1 request reached an endpoint
    _, text = await get(f"http://127.0.0.1:{rig.settings.stats_port}/metrics")
    counted = [line for line in text.splitlines() if line.startswith("istio_requests_total{")]
    refused = [line for line in counted if 'response_code="426"' in line]
    assert refused and all('response_flags="-"' in line for line in refused), counted
    logged = [r.getMessage() for r in caplog.records if "response_code=426" in r.getMessage()]
    assert len(logged) == 2 and all("protocol=HTTP/1.0" in m and "error=low_version" in m for m in logged), logged

    rig.waypoint.context.accept_http10 = True
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    await stream.write(b"GET /echo HTTP/1.0\r\nhost: echo\r\n\r\n")
    answer = await read_until_eof(stream)
    assert answer.startswith(b"HTTP/1.0 200 OK\r\n")  # Envoy's codec answers an accepted HTTP/1.0 in kind
    assert echo_of(answer.partition(b"\r\n\r\n")[2])["endpoint"] in ("echo-1", "echo-2")
    await client.aclose()
    reached = sum(e.tunnels for e in rig.endpoints)
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")  # no Host: istiod sets no default_host_for_http_10
    await stream.write(b"GET /echo HTTP/1.0\r\n\r\n")
    answer = await read_until_eof(stream)
    assert answer.startswith(b"HTTP/1.0 400 Bad Request\r\n") and b"\r\ncontent-length: 0\r\n" in answer
    assert answer.endswith(b"\r\n\r\n") and b"content-type" not in answer  # no body
    await client.aclose()
    assert sum(e.tunnels for e in rig.endpoints) == reached  # answered by the waypoint alone


async def test_a_huge_head_gets_431_and_close_without_reaching_an_endpoint(rig: Rig) -> None:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    await stream.write(b"GET /echo HTTP/1.1\r\nhost: a\r\n")
    for _ in range(64):  # 64 KiB of headers against an 8 KiB bound, never finished
        try:
            await stream.write(b"x-junk: " + b"a" * 1000 + b"\r\n")
        except Exception:
            break
    answer = await read_until_eof(stream)
    assert answer.startswith(b"HTTP/1.1 431 ") and answer.endswith(b"\r\n\r\nRequest Header Fields Too Large")
    assert sum(e.tunnels for e in rig.endpoints) == 0
    await client.aclose()


async def test_a_slowloris_head_gets_408_after_the_head_timeout(rig: Rig) -> None:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    await stream.write(b"GET /echo HTTP/1.1\r\nhost: a\r\n")
    loop = asyncio.get_running_loop()
    began = loop.time()

    async def trickle() -> None:
        for _ in range(40):  # a byte every 0.1 s: each read is in time, the whole head is not
            await asyncio.sleep(0.1)
            await stream.write(b"x")

    trickling = asyncio.create_task(trickle())
    answer = await read_until_eof(stream)
    trickling.cancel()
    await asyncio.gather(trickling, return_exceptions=True)
    assert answer.startswith(b"HTTP/1.1 408 ") and answer.endswith(b"\r\n\r\nstream timeout")
    assert loop.time() - began < 3.0
    await client.aclose()
    _, text = await get(f"http://127.0.0.1:{rig.settings.stats_port}/metrics")
    counted = [line for line in text.splitlines() if line.startswith("istio_requests_total{")]
    assert any('response_code="408"' in line and 'response_flags="SI"' in line for line in counted)


async def test_junk_on_a_port_of_unknown_protocol_is_relayed_as_tcp(rig: Rig) -> None:
    client, stream = await rig.tunnel(f"{TCP_VIP}:80")
    # not HTTP: sniffed as TCP and relayed to the endpoint (an HTTP server, which answers 400 to junk)
    await stream.write(b"\x00\x01junk that is not http\r\n\r\n")
    answer = await read_until_eof(stream)
    assert answer.startswith(b"HTTP/1.") and b" 400 " in answer.split(b"\r\n", 1)[0]
    assert [e.tunnels for e in rig.endpoints] == [1, 0]  # the endpoint answered, not the waypoint
    await client.aclose()


async def test_a_port_declared_tcp_is_answered_200_only_once_its_endpoint_is_reached(rig: Rig) -> None:
    client = await rig.client()
    with pytest.raises(TunnelRefusedError) as caught:
        await client.open_tunnel(f"{RAW_DEAD_VIP}:80", [])
    assert caught.value.status == 503
    stream = await client.open_tunnel(f"{RAW_VIP}:80", [])
    await stream.write(b"GET /echo?raw=tcp HTTP/1.0\r\n\r\n")  # bytes, relayed as they are
    answer = await read_until_eof(stream)
    assert answer.startswith(b"HTTP/1.") and answer.endswith(b"tcp")
    await client.aclose()


async def test_a_websocket_upgrade_becomes_a_relay_after_101(rig: Rig) -> None:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    key = base64.b64encode(os.urandom(16)).decode()
    await stream.write(
        b"GET /ws HTTP/1.1\r\nhost: echo\r\nconnection: Upgrade\r\nupgrade: websocket\r\n"
        + f"sec-websocket-version: 13\r\nsec-websocket-key: {key}\r\n\r\n".encode()
    )
    head = b""
    async with asyncio.timeout(10):
        while b"\r\n\r\n" not in head:
            head += await stream.read()
    status_line, _, rest = head.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 101 ")
    accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
    assert b"sec-websocket-accept: " + accept in rest
    mask = os.urandom(4)
    payload = b"hello through the waypoint"
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    await stream.write(bytes([0x81, 0x80 | len(payload)]) + mask + masked)
    frame = rest.partition(b"\r\n\r\n")[2]
    async with asyncio.timeout(10):
        while len(frame) < 2 + len(payload):
            frame += await stream.read()
    assert frame[:2] == bytes([0x81, len(payload)]) and frame[2:] == payload
    await client.aclose()


async def test_no_reachable_endpoint_answers_503_like_envoy(rig: Rig) -> None:
    client, stream = await rig.tunnel(f"{DEAD_VIP}:80")
    status, _, body = await HttpOverTunnel(stream).request("GET", "/echo")
    assert status == 503
    assert body.startswith(b"upstream connect error or disconnect/reset before headers")
    await client.aclose()


async def test_a_request_timeout_answers_504_and_a_local_answer_is_written(rig: Rig) -> None:
    def router(table: RouteTable | None, destination: BackendService, request: RequestHead, r: float) -> Decision:
        if request.path == "/teapot":
            return Respond(418, (("x-why", "local"),), b"short and stout", route="HTTPRoute/app/teapot")
        if request.path == "/gone":
            return Forward(BackendService("app", "gone.app.svc.cluster.local", 80), request)
        if request.path == "/gone-vs":  # a VirtualService's route: istiod leaves the cluster-not-found code at 503
            return Forward(BackendService("app", "gone.app.svc.cluster.local", 80), request, missing_backend_status=503)
        return Forward(destination, request, timeouts=Timeouts(request=0.3))

    rig.waypoint.context.router = router
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    status, headers, body = await http.request("GET", "/teapot")
    assert (status, headers["x-why"], body) == (418, "local", b"short and stout")
    assert (await http.request("GET", "/gone"))[:3:2] == (500, b"")  # Envoy's cluster not found: no body
    assert (await http.request("GET", "/gone-vs"))[:3:2] == (503, b"")
    status, _, body = await http.request("GET", "/slow")
    assert status == 504 and body == b"upstream request timeout"
    await client.aclose()


async def test_a_mirrored_request_reaches_the_mirror_backend_and_the_client_sees_one_answer(rig: Rig) -> None:
    rig.waypoint.context.router = mirroring_router
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    status, _, body = await HttpOverTunnel(stream).request("GET", "/echo")
    assert status == 200 and echo_of(body)["host"] == "echo.app.svc.cluster.local"
    async with asyncio.timeout(10):
        while not any(h.endswith("-shadow") for e in rig.endpoints for h in e.hosts):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    shadows = [h for e in rig.endpoints for h in e.hosts if h.endswith("-shadow")]
    assert shadows == ["echo.app.svc.cluster.local-shadow"]
    await client.aclose()


async def test_a_request_with_a_body_is_mirrored_whole_and_a_body_over_the_bound_is_not(rig: Rig) -> None:
    """Mirror rule 1: the copy carries the whole body (content-length and chunked alike) once the real request's
    has passed; a body over MAX_MIRROR_BODY goes to the real backend only."""
    rig.waypoint.context.router = mirroring_router
    small, large = os.urandom(70_000), os.urandom(MAX_MIRROR_BODY + 1)
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    for body, chunked in ((small, False), (small, True)):
        headers = [("transfer-encoding", "chunked")] if chunked else None
        status, _, answer = await http.request("POST", "/echo", body=body, headers=headers)
        assert status == 200 and echo_of(answer)["sha256"] == hashlib.sha256(body).hexdigest()
    digest = hashlib.sha256(small).hexdigest()
    async with asyncio.timeout(10):
        while len([h for e in rig.endpoints for h, _ in e.bodies if h.endswith("-shadow")]) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    copies = [(h, d) for e in rig.endpoints for h, d in e.bodies if h.endswith("-shadow")]
    assert copies == [("echo.app.svc.cluster.local-shadow", digest)] * 2
    posts = sum(e.seen.count("POST /echo") for e in rig.endpoints)
    status, _, _ = await http.request("POST", "/echo", body=large)
    assert status == 413  # the echo server's own bound (aiohttp's 1 MiB): the real request reached it
    await asyncio.sleep(0.5)  # a copy, had one gone out, would be there by now
    assert sum(e.seen.count("POST /echo") for e in rig.endpoints) == posts + 1
    await client.aclose()


async def test_a_backend_request_timeout_answers_504_too(rig: Rig) -> None:
    def router(table: RouteTable | None, destination: BackendService, request: RequestHead, r: float) -> Decision:
        # The first request also opens the tunnel to the endpoint: on a loaded machine that may outlast 0.3 s.
        timeouts = Timeouts(backend_request=0.3) if request.path == "/slow" else Timeouts()
        return Forward(destination, request, timeouts=timeouts)

    rig.waypoint.context.router = router
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    assert (await http.request("GET", "/echo"))[0] == 200
    status, _, body = await http.request("GET", "/slow")
    assert status == 504 and body == b"upstream request timeout"
    await client.aclose()


async def test_the_endpoint_sees_the_router_s_timeout_and_none_of_the_client_s_envoy_controls(rig: Rig) -> None:
    """A route timeout of 5 s with 2 s per try: the endpoint is told 2000 ms (x-envoy-expected-rq-timeout-ms); the
    client's own retry, timeout and internal claims never pass the waypoint's connection manager."""

    def router(table: RouteTable | None, destination: BackendService, request: RequestHead, r: float) -> Decision:
        return Forward(destination, request, timeouts=Timeouts(request=5.0, backend_request=2.0))

    rig.waypoint.context.router = router
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    controls = [
        ("x-envoy-retry-on", "5xx"),
        ("x-envoy-max-retries", "9"),
        ("x-envoy-upstream-rq-timeout-ms", "1"),
        ("x-envoy-expected-rq-timeout-ms", "7"),
        ("x-envoy-internal", "true"),
    ]
    status, _, body = await HttpOverTunnel(stream).request("GET", "/echo", headers=[*controls, ("x-request-id", "r")])
    seen = echo_of(body)["headers"]
    assert status == 200 and seen["x-envoy-expected-rq-timeout-ms"] == "2000" and seen["x-request-id"] == "r"
    assert not {name for name, _ in controls[:3]} & set(seen) and "x-envoy-internal" not in seen
    await client.aclose()


async def test_a_tcp_route_sends_connections_to_its_weighted_backends(rig: Rig) -> None:
    echo = BackendService("app", "echo.app.svc.cluster.local", 80)
    dead = BackendService("app", "rawdead.app.svc.cluster.local", 80)
    table = RouteTable(
        "app/raw.app.svc.cluster.local", 80, tcp_backends=(WeightedBackend(echo, 1), WeightedBackend(dead, 0))
    )
    rig.waypoint.context.routes.replace(WaypointConfig("app/waypoint", (table,)))
    client = await rig.client()
    for _ in range(2):
        stream = await client.open_tunnel(f"{RAW_VIP}:80", [])
        await stream.write(b"GET /echo HTTP/1.0\r\n\r\n")
        assert b'"endpoint"' in await read_until_eof(stream)
    assert [e.tunnels for e in rig.endpoints] == [1, 1]  # both endpoints of echo, none of rawdead (weight 0)
    await client.aclose()


def client_hello(server_name: str) -> bytes:
    """The first flight of a real TLS client naming ``server_name`` (SNI)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=server_name)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


@pytest.mark.parametrize("vip", [RAW_VIP, TLS_VIP], ids=["tcp-port", "tls-port"])
async def test_a_tls_route_splits_connections_3_1_1_by_weight_and_reads_no_sni(rig: Rig, vip: str) -> None:
    """Istio's TestTLSRoute: 40 connections to a port whose Service has a TLSRoute (weights 3:1:1) split 24:8:8. The
    waypoint reads no SNI: a ClientHello naming another host goes by the route all the same."""
    service = "raw" if vip == RAW_VIP else "tls"
    backends = (
        WeightedBackend(BackendService("app", "raw.app.svc.cluster.local", 80), 3),  # echo-1
        WeightedBackend(BackendService("app", "raw-two.app.svc.cluster.local", 80), 1),  # echo-2
        WeightedBackend(BackendService("app", "rawdead.app.svc.cluster.local", 80), 1),  # nothing answers: 503
    )
    table = RouteTable(f"app/{service}.app.svc.cluster.local", 80, tcp_backends=backends)
    rig.waypoint.context.routes.replace(WaypointConfig("app/waypoint", (table,)))
    draws = iter([(i + 0.5) / 40 for i in range(40)])  # evenly spread: the split is exact, the test not flaky
    rig.waypoint.context.random = lambda: next(draws)
    opening = b"GET /echo HTTP/1.0\r\n\r\n" if vip == RAW_VIP else client_hello("elsewhere.example.com")
    client = await rig.client()
    refused = 0
    for _ in range(40):
        try:
            stream = await client.open_tunnel(f"{vip}:80", [])
        except TunnelRefusedError as exc:
            assert exc.status == 503
            refused += 1
            continue
        await stream.write(opening)
        answer = await read_until_eof(stream)
        assert answer.startswith(b"HTTP/1.")  # the echo server's answer (400 to a ClientHello), relayed
    assert [e.tunnels for e in rig.endpoints] == [24, 8]
    assert refused == 8
    await client.aclose()


async def test_readiness_and_config_dump(rig: Rig) -> None:
    await until_ready(rig)
    status, text = await get(f"http://127.0.0.1:{rig.settings.admin_port}/config_dump")
    assert status == 200
    assert '"app/echo.app.svc.cluster.local"' in text
    assert "spiffe://cluster.local/ns/app/sa/waypoint" in text


async def test_tunnels_beyond_the_limit_are_refused_503(tmp_path: Path) -> None:
    rig = Rig(tmp_path, WaypointLimits(max_tunnels=1))
    try:
        await rig.start()
        client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
        assert (await HttpOverTunnel(stream).request("GET", "/echo"))[0] == 200  # the one tunnel, kept open
        with pytest.raises(TunnelRefusedError) as caught:
            await client.open_tunnel(f"{ECHO_VIP}:80", [])
        assert caught.value.status == 503
        await stream.aclose()
        async with asyncio.timeout(10):
            while rig.waypoint.context.tunnels:  # noqa: ASYNC110 - the waypoint's side of the close
                await asyncio.sleep(0.01)
        second = await client.open_tunnel(f"{ECHO_VIP}:80", [])  # a slot is free again
        assert (await HttpOverTunnel(second).request("GET", "/echo"))[0] == 200
        await client.aclose()
    finally:
        await rig.aclose()


async def test_before_its_first_xds_sync_the_waypoint_is_not_ready_and_tunnels_wait_then_get_503(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, WaypointLimits(startup_wait=0.5))
    # A control plane that never answers: the state never syncs (the local CA still signs the certificate).
    rig.settings = dataclasses.replace(
        rig.settings, config_file=None, xds_address=f"127.0.0.1:{free_port()}", root_cert_file=tmp_path / "ca/root.crt"
    )
    rig.waypoint = Waypoint(rig.settings)
    try:
        await rig.start()
        status, text = await get(f"http://127.0.0.1:{rig.settings.readiness_port}/healthz/ready")
        assert status == 500 and "state manager" in text
        client = await rig.client()  # the listener accepts at once
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(TunnelRefusedError) as caught:
            await client.open_tunnel(f"{ECHO_VIP}:80", [])
        assert caught.value.status == 503
        assert loop.time() - began >= 0.4  # it waited for the state, boundedly
        await client.aclose()
    finally:
        await rig.aclose()
