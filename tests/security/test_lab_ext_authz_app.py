"""The lab's ``ext-authz`` app (:mod:`ambit.lab.ext_authz_app`) against a hostile client: any pod of the lab can
reach its two ports. An endless head, a body announced larger than it will read, a length that is no number and
garbage on the gRPC port each cost one connection or one call, never the server: an honest check is answered after
each of them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc  # type: ignore[import-untyped]
import grpc.aio  # type: ignore[import-untyped]
import pytest

from ambit.lab.ext_authz_app import MAX_BODY, MAX_HEAD, serve


@pytest.fixture
async def ports() -> AsyncIterator[tuple[int, int]]:
    started: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(0, 0, host="127.0.0.1", started=started))
    try:
        yield await asyncio.wait_for(started, 10)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def exchange(port: int, data: bytes) -> bytes:
    """What the server sends back for ``data`` until it closes (at most 10 s)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionError:
        return b""
    finally:
        writer.close()


HONEST = b"GET /check HTTP/1.1\r\nhost: httpbin\r\nconnection: close\r\n\r\n"


@pytest.mark.parametrize(
    "attack",
    [
        b"GET / HTTP/1.1\r\nx-fill: " + b"a" * (MAX_HEAD * 2),  # a head that never ends
        f"POST / HTTP/1.1\r\ncontent-length: {MAX_BODY + 1}\r\n\r\n".encode(),  # a body over the bound
        b"POST / HTTP/1.1\r\ncontent-length: -1\r\n\r\n",
        b"POST / HTTP/1.1\r\ncontent-length: 1e9\r\n\r\n",
    ],
    ids=["endless-head", "huge-body", "negative-length", "not-a-number"],
)
async def test_a_hostile_http_client_loses_its_connection_and_the_server_keeps_answering(
    ports: tuple[int, int], attack: bytes
) -> None:
    assert await exchange(ports[0], attack) == b"", "nothing answered, nothing read past the bound"
    answer = await exchange(ports[0], HONEST)
    assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n") and b"x-ext-authz-check-result: denied" in answer


async def test_garbage_on_the_grpc_port_is_refused_and_the_server_keeps_answering(ports: tuple[int, int]) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{ports[1]}") as channel:
        check = channel.unary_unary("/envoy.service.auth.v3.Authorization/Check")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await check(b"\xff\xff\xff\xff garbage", timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as huge:
            await check(b"\x0a" + b"\xff" * (5 * 1024 * 1024), timeout=10)  # over grpcio's 4 MiB receive bound
        assert huge.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        answer = await check(b"", timeout=10)  # an empty CheckRequest: no header, so a denial is answered
        assert isinstance(answer, bytes) and answer
