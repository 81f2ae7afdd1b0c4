"""The lab's ``multi-echo`` app on loopback: one process serving Istio's echo kinds of port (HTTP, HTTPS, gRPC, TCP
echo, server-first TCP), each reporting the client's address as it saw it, on the address each listener asks for;
a bad ``--listen`` is a usage error, not a traceback."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.harness import free_port  # below the ephemeral range: no outgoing connection takes it first

from ambit.lab import apps


async def wait_listening(port: int) -> None:
    deadline = time.monotonic() + 10
    while True:  # bounded: the server is listening once a connection is accepted
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"multi-echo did not listen on {port} within 10 s"
            await asyncio.sleep(0.05)


@pytest.fixture
async def multi_echo() -> AsyncIterator[dict[str, int]]:
    ports = {kind: free_port() for kind in ("http", "https", "grpc", "tcp", "server-first")}
    listeners = [apps.parse_listener(f"{kind}:{port}@127.0.0.1", "") for kind, port in ports.items()]
    server = asyncio.create_task(apps._multi_echo(listeners, "echo.example"))
    for port in ports.values():
        await wait_listening(port)
    yield ports
    server.cancel()
    with pytest.raises(asyncio.CancelledError):
        await server


async def http_answer(port: int, context: ssl.SSLContext | None = None) -> dict[str, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    writer.write(b"GET /x HTTP/1.1\r\nHost: echo\r\nX-Request-Id: abc\r\nConnection: close\r\n\r\n")
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    body: dict[str, Any] = json.loads(data.split(b"\r\n\r\n", 1)[1])
    return body


async def test_http_and_https_listeners_echo_the_request(multi_echo: dict[str, int]) -> None:
    plain = await http_answer(multi_echo["http"])
    assert plain["path"] == "/x" and plain["headers"]["X-Request-Id"] == "abc"
    assert plain["client"].startswith("127.0.0.1:")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    secure = await http_answer(multi_echo["https"], context)
    assert secure["path"] == "/x" and secure["alpn"] is None


async def test_tcp_listeners_echo_and_report_the_client(multi_echo: dict[str, int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", multi_echo["tcp"])
    writer.write(b"ping\n")
    assert await asyncio.wait_for(reader.readline(), 10) == b"ping\n"
    writer.write(b"whoami\n")
    who = json.loads(await asyncio.wait_for(reader.readline(), 10))
    assert who["client"].startswith("127.0.0.1:") and "pod" in who
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", multi_echo["server-first"])
    assert (await asyncio.wait_for(reader.readline(), 10)).startswith(b"HELLO from ")
    writer.close()


async def test_the_grpc_listener_reports_metadata_and_peer(multi_echo: dict[str, int]) -> None:
    import grpc.aio  # type: ignore[import-untyped]

    async with grpc.aio.insecure_channel(f"127.0.0.1:{multi_echo['grpc']}") as channel:
        who = json.loads(await channel.unary_unary("/echo.Echo/Who")(b"", metadata=(("x-request-id", "r1"),)))
        said = await channel.unary_unary("/echo.Echo/Say")(b"hi")
    assert who["headers"]["x-request-id"] == "r1" and who["client"].startswith("127.0.0.1:")
    assert said.endswith(b":hi")


def test_listener_specs() -> None:
    assert apps.parse_listener("http:18080", "") == ("http", "0.0.0.0", 18080)
    assert apps.parse_listener("http:18082@pod", "10.0.0.5") == ("http", "10.0.0.5", 18082)
    assert apps.parse_listener("grpc:17070@127.0.0.1", "") == ("grpc", "127.0.0.1", 17070)
    for bad, why in (
        ("ftp:21", "kind 'ftp'"),
        ("http:x", "not a port number"),
        ("http:70000", "not a port number"),
        ("http:80@pod", "POD_IP is not set"),
    ):
        with pytest.raises(ValueError, match=why):
            apps.parse_listener(bad, "")


def test_a_bad_listener_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        apps.main(["multi-echo", "--listen", "http:nope"])
    assert exited.value.code == 2 and "not a port number" in capsys.readouterr().err


def test_grpc_peers_are_plain_addresses() -> None:
    assert apps._grpc_peer("ipv4:10.0.0.1:5000") == "10.0.0.1:5000"
    assert apps._grpc_peer("ipv6:[::1]:5000") == "::1:5000"
    assert apps._grpc_peer("unix:/tmp/s") == "unix:/tmp/s"


async def test_http_listeners_speak_h2c_with_prior_knowledge(multi_echo: dict[str, int]) -> None:
    """What a waypoint does to a port declared ``http2`` or ``grpc``: two requests on one HTTP/2 connection (the
    independent h2 library as the client), each answered with what the server saw."""
    import h2.config
    import h2.connection
    import h2.events

    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    for stream_id in (1, 3):
        request = [(":method", "GET"), (":scheme", "http"), (":authority", "echo:85"), (":path", f"/s{stream_id}")]
        client.send_headers(stream_id, [*request, ("x-request-id", f"r{stream_id}")], end_stream=True)
    reader, writer = await asyncio.open_connection("127.0.0.1", multi_echo["http"])
    writer.write(client.data_to_send())
    bodies: dict[int, bytes] = {1: b"", 3: b""}
    statuses: dict[int, str] = {}
    ended: set[int] = set()
    while ended != {1, 3}:
        data = await asyncio.wait_for(reader.read(65536), 10)
        assert data, "the server closed the connection before answering both streams"
        for event in client.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                statuses[event.stream_id] = dict(event.headers or ())[b":status"].decode()
            elif isinstance(event, h2.events.DataReceived):
                bodies[event.stream_id] += event.data
                client.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                ended.add(event.stream_id)
        writer.write(client.data_to_send())
    writer.close()
    assert statuses == {1: "200", 3: "200"}
    for stream_id, body in bodies.items():
        answer = json.loads(body)
        assert answer["proto"] == "HTTP/2.0" and answer["path"] == f"/s{stream_id}", answer
        assert answer["headers"]["x-request-id"] == f"r{stream_id}" and answer["headers"]["host"] == "echo:85"
        assert answer["client"].startswith("127.0.0.1:")


async def test_a_short_http1_request_is_not_mistaken_for_the_h2_preface(multi_echo: dict[str, int]) -> None:
    """A request shorter than the preface that starts as it does, sent in pieces, is still answered as HTTP/1.1."""
    reader, writer = await asyncio.open_connection("127.0.0.1", multi_echo["http"])
    for piece in (b"PR", b"I /pri HTTP/1.1\r\n", b"\r\n"):
        writer.write(piece)
        await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 200 OK")
    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
    answer = json.loads(await asyncio.wait_for(reader.readexactly(length), 10))
    assert answer["method"] == "PRI" and answer["path"] == "/pri" and answer["proto"] == "HTTP/1.1"
    writer.close()
