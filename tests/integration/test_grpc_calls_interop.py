"""Our HTTP/2 engine with hbone/grpc_calls.py's rules makes real unary calls to a grpcio server (h2c on loopback):
the first interoperability check of the plan in docs/node-proxy-footprint.md."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc  # type: ignore[import-untyped]
import grpc.aio  # type: ignore[import-untyped]
import pytest

from ambit.hbone.events import DataReceived, ResponseReceived, StreamEnded, TrailersReceived
from ambit.hbone.grpc_calls import CallStatus, MessageReader, StatusCode, call_status, encode_message, request_headers
from ambit.hbone.messages import Http2ClientConnection

# -- one real call: our engine and these rules against grpcio's server -------------------------------------------


@pytest.fixture
async def grpc_server() -> AsyncIterator[int]:
    async def reverse(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        metadata = dict(context.invocation_metadata())
        if metadata.get("clusterid") != "c1":
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "wrong cluster: é")
        return request[::-1]

    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Reverse": grpc.unary_unary_rpc_method_handler(reverse)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(None)


async def unary(port: int, payload: bytes, metadata: list[tuple[str, str]]) -> tuple[list[bytes], CallStatus]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = Http2ClientConnection()
    sid = conn.send_request(
        "POST", "http", f"127.0.0.1:{port}", "/test.Echo/Reverse", request_headers("/test.Echo/Reverse", metadata, 5)
    )
    conn.send_data(sid, encode_message(payload))
    conn.end_stream(sid)
    messages, status, http_status = MessageReader(1 << 20), None, 0
    got: list[bytes] = []
    try:
        async with asyncio.timeout(10):
            while status is None:
                writer.write(conn.data_to_send())
                data = await reader.read(65536)
                assert data, "grpcio closed the connection"
                for event in conn.receive_data(data):
                    if isinstance(event, ResponseReceived):
                        http_status = event.status
                        if any(n == "grpc-status" for n, _ in event.headers):  # trailers-only
                            status = call_status(event.headers, http_status)
                    elif isinstance(event, DataReceived) and event.stream_id == sid:
                        got += messages.feed(bytes(event.data))
                        conn.consumed(sid, event.flow_length)
                    elif isinstance(event, TrailersReceived):
                        status = call_status(event.headers, http_status)
                    elif isinstance(event, StreamEnded) and status is None:
                        status = call_status([], http_status)
    finally:
        writer.close()
    return got, status


async def test_a_unary_call_to_grpcio_is_answered_and_its_status_read(grpc_server: int) -> None:
    got, status = await unary(grpc_server, b"hello", [("clusterid", "c1")])
    assert (got, status) == ([b"olleh"], CallStatus(StatusCode.OK))


async def test_a_refusal_from_grpcio_is_its_code_and_decoded_message(grpc_server: int) -> None:
    got, status = await unary(grpc_server, b"hello", [("clusterid", "other")])
    assert (got, status) == ([], CallStatus(StatusCode.PERMISSION_DENIED, "wrong cluster: é"))


async def test_a_bidirectional_stream_carries_a_large_message_through_flow_control() -> None:
    """What the ADS stream needs: requests and responses interleaved on one stream, and a response (8 MiB) far
    larger than the HTTP/2 windows, which our side's ``consumed`` reopens as the message reader takes the data."""

    async def sizes(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for request in requests:
            yield bytes([request[0]]) * int(request[1:])

    handler = grpc.method_handlers_generic_handler("test.Ads", {"Stream": grpc.stream_stream_rpc_method_handler(sizes)})
    server = grpc.aio.server(options=[("grpc.max_send_message_length", 16 << 20)])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        conn = Http2ClientConnection()
        sid = conn.send_request(
            "POST", "http", f"127.0.0.1:{port}", "/test.Ads/Stream", request_headers("/test.Ads/Stream")
        )
        messages = MessageReader(16 << 20)
        wanted = [(b"a", 10), (b"b", 8 << 20), (b"c", 3)]
        got: list[bytes] = []
        async with asyncio.timeout(30):
            for letter, size in wanted:  # one request, then its answer, as ACK and response alternate in ADS
                conn.send_data(sid, encode_message(letter + str(size).encode()))
                while len(got) < len(wanted) and len(got) <= wanted.index((letter, size)):
                    writer.write(conn.data_to_send())
                    data = await reader.read(1 << 16)
                    assert data, "grpcio closed the connection"
                    for event in conn.receive_data(data):
                        if isinstance(event, DataReceived) and event.stream_id == sid:
                            got += messages.feed(bytes(event.data))
                            conn.consumed(sid, event.flow_length)
            writer.write(conn.data_to_send())
        assert [(m[:1], len(m)) for m in got] == wanted
    finally:
        writer.close()
        await server.stop(None)
