"""A port shared by TLS passthrough and terminating listeners at the ingress gateway: the router's view of it (rule 7
of :mod:`ambit.waypoint.ingress_routing`) and the peek at the ClientHello that picks between them
(:func:`ambit.waypoint.ingress_connections.peek_hello`), on real socket pairs: split hellos, a hello cut short by
the client's end of stream, an oversized one, silence, and bytes left in the socket for whoever serves next.
"""

from __future__ import annotations

import asyncio
import socket

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.tls_hello import record_with_name

from ambit.model.ingress import GatewayConfig, IngressCertificate, IngressListener, ListenerProtocol, VirtualHost
from ambit.model.routes import BackendService, WeightedBackend
from ambit.waypoint.errors import HelloRefusedError
from ambit.waypoint.ingress_connections import peek_hello, plan_backend
from ambit.waypoint.ingress_routing import IngressRouter


def backend(name: str) -> BackendService:
    return BackendService("app", f"{name}.app.svc.cluster.local", 443)


SHARED = GatewayConfig(
    "edge/edge",
    (
        IngressListener(
            "terminate",
            443,
            ListenerProtocol.TLS_TERMINATE,
            "echo.example.com",
            (IngressCertificate(b"cert", b"key"),),
            (
                VirtualHost("echo.example.com", tcp_backends=(WeightedBackend(backend("echo")),)),
                VirtualHost("*", tcp_backends=(WeightedBackend(backend("raw")),)),
            ),
        ),
        IngressListener(
            "passthrough",
            443,
            ListenerProtocol.TLS,
            "",
            (),
            (VirtualHost("a.example.com", tcp_backends=(WeightedBackend(backend("one")),)),),
        ),
        IngressListener("alone", 8443, ListenerProtocol.TLS_TERMINATE, "", (IngressCertificate(b"c", b"k"),)),
    ),
)


def test_a_shared_port_is_a_tls_port_that_needs_certificates_and_the_server_name_picks_the_listener() -> None:
    router = IngressRouter(SHARED)
    assert router.ports() == {443: ListenerProtocol.TLS, 8443: ListenerProtocol.TLS_TERMINATE}
    assert router.terminates_on(443) and router.terminates_on(8443)
    picked = router.pick_listener(443, "echo.example.com")
    assert picked is not None and picked.protocol is ListenerProtocol.TLS_TERMINATE
    for other in ("a.example.com", "b.example.com", ""):
        picked = router.pick_listener(443, other)
        assert picked is not None and picked.name == "passthrough", other
    # the terminated connection's virtual host: by the server name the handshake read, within the listener it picked
    assert plan_backend(router, 443, "echo.example.com", 0.5, "terminate") == backend("echo")
    assert plan_backend(router, 443, "", 0.5, "terminate") == backend("raw")
    assert plan_backend(router, 443, "a.example.com", 0.5) == backend("one")


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Both ends of a loopback TCP connection, non-blocking (the gateway's listeners are TCP)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    server.setblocking(False)
    client.setblocking(False)
    return server, client


async def _peek_over(
    parts: list[bytes], *, eof: bool = False, pause: float = 0.05, bound: float = 5.0
) -> tuple[object, bytes]:
    """Send ``parts`` into one end of a TCP connection (pausing between them) while the other end peeks; returns the
    peek's result (a ClientHello or the error) and what the socket still holds afterwards."""
    server, client = _tcp_pair()
    loop = asyncio.get_running_loop()

    async def send() -> None:
        for i, part in enumerate(parts):
            if i:
                await asyncio.sleep(pause)
            await loop.sock_sendall(client, part)
        if eof:
            client.shutdown(socket.SHUT_WR)

    sending = asyncio.create_task(send())
    try:
        result: object = await peek_hello(server, bound)
    except HelloRefusedError as exc:
        result = exc
    await sending
    left = b""
    try:
        while chunk := server.recv(65536):
            left += chunk
    except BlockingIOError:
        pass
    server.close()
    client.close()
    return result, left


async def test_a_hello_split_in_pieces_is_peeked_whole_and_left_in_the_socket() -> None:
    hello = record_with_name(b"echo.example.com")
    result, left = await _peek_over([hello[:3], hello[3:9], hello[9:40], hello[40:]])
    assert getattr(result, "server_name", None) == "echo.example.com"
    assert left == hello  # nothing taken: the handshake or the relay reads it all


async def test_a_hello_cut_short_by_the_client_s_end_of_stream_is_refused_at_once() -> None:
    hello = record_with_name(b"echo.example.com")
    started = asyncio.get_running_loop().time()
    result, _ = await _peek_over([hello[:20]], eof=True, bound=5.0)
    assert isinstance(result, HelloRefusedError) and "closed" in str(result)
    assert asyncio.get_running_loop().time() - started < 2  # not the whole timeout


async def test_silence_and_a_slow_trickle_end_at_the_timeout() -> None:
    hello = record_with_name(b"echo.example.com")
    result, _ = await _peek_over([hello[:5]], bound=0.3)
    assert isinstance(result, HelloRefusedError) and "within" in str(result)
    result, _ = await _peek_over([hello[i : i + 1] for i in range(len(hello))], pause=0.05, bound=0.3)
    assert isinstance(result, HelloRefusedError)


async def test_an_oversized_or_malformed_hello_is_refused() -> None:
    huge = b"\x16\x03\x01\xff\xff" + b"\x01" + (0xFFFFFF).to_bytes(3, "big") + b"\x00" * 20000
    result, _ = await _peek_over([huge])
    assert isinstance(result, HelloRefusedError)
    result, _ = await _peek_over([b"GET / HTTP/1.1\r\nHost: echo.example.com\r\n\r\n"])
    assert isinstance(result, HelloRefusedError)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=6))
def test_any_split_of_a_hello_peeks_the_same_name(cuts: list[int]) -> None:
    hello = record_with_name(b"a.example.com")
    parts, at = [], 0
    for cut in cuts:
        if at < len(hello):
            parts.append(hello[at : at + cut])
            at += cut
    if at < len(hello):
        parts.append(hello[at:])
    result, left = asyncio.run(_peek_over(parts, pause=0.002))
    assert getattr(result, "server_name", None) == "a.example.com"
    assert left == hello


async def test_a_long_name_is_peeked_and_an_empty_one_refused_as_the_passthrough_read_refuses_it() -> None:
    name = b".".join([b"x" * 60] * 4)
    result, _ = await _peek_over([record_with_name(name)])
    assert getattr(result, "server_name", None) == name.decode()
    result, _ = await _peek_over([record_with_name(b"")])
    assert isinstance(result, HelloRefusedError)
