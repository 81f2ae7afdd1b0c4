"""The bounded GET (ambit.httpfetch) against a raw asyncio server on loopback that writes exactly the bytes a test
says: a body is returned whole up to the limit and refused past it (declared or not), a dripping server is cut off
by the deadline, and a non-200, a redirect or a closed port is one clear line."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.harness import free_port

from ambit.httpfetch import HttpFetchError, fetch_body

Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(answer: Answer) -> AsyncIterator[str]:
    """A loopback server that reads one request head, then lets ``answer`` write; yields its base URL."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            await answer(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/thing"
    finally:
        server.close()
        # Handlers still writing (the drip) are cancelled with the server.
        await asyncio.wait_for(server.wait_closed(), 5.0)


def ok_with(body: bytes, *, declared: int | None = None) -> Answer:
    async def answer(writer: asyncio.StreamWriter) -> None:
        length = len(body) if declared is None else declared
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % length + body)
        await writer.drain()

    return answer


def until_close(body: bytes) -> Answer:
    """A 200 without Content-Length: the size shows only while reading."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
        for start in range(0, len(body), 65536):
            writer.write(body[start : start + 65536])
            await writer.drain()

    return answer


async def get(url: str, *, within: float = 5.0, max_bytes: int = 1024) -> bytes:
    async with aiohttp.ClientSession(trust_env=False) as session:
        return await fetch_body(session, url, within=within, max_bytes=max_bytes)


async def test_a_body_within_the_limit_is_returned_whole() -> None:
    async with raw_server(ok_with(b"x" * 1024)) as url:
        assert await get(url, max_bytes=1024) == b"x" * 1024


async def test_a_declared_oversized_body_is_refused_before_reading() -> None:
    async with raw_server(ok_with(b"", declared=1 << 40)) as url:
        with pytest.raises(HttpFetchError, match=rf"^{url}: the answer is {1 << 40} bytes, over 1024$"):
            await get(url)


async def test_an_undeclared_oversized_body_is_refused_while_reading() -> None:
    async with raw_server(until_close(b"y" * (8 << 20))) as url:
        with pytest.raises(HttpFetchError, match=rf"^{url}: the answer is over 1024 bytes$"):
            await get(url)


async def test_a_dripping_body_is_cut_off_at_the_deadline() -> None:
    async def drip(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(1000):  # well within the size limit, but 100 s at this pace
            writer.write(b"z")
            await writer.drain()
            await asyncio.sleep(0.1)

    async with raw_server(drip) as url:
        started = time.monotonic()
        with pytest.raises(HttpFetchError, match=rf"^{url}: no complete answer within 0.5 s$"):
            await get(url, within=0.5, max_bytes=1 << 20)
        assert time.monotonic() - started < 2.0


async def test_a_server_that_never_answers_is_cut_off_at_the_deadline() -> None:
    async def silent(writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    async with raw_server(silent) as url:
        with pytest.raises(HttpFetchError, match=r"no complete answer within 0\.3 s"):
            await get(url, within=0.3)


async def test_a_non_200_is_one_line_quoting_the_start_of_its_body() -> None:
    async def not_found(writer: asyncio.StreamWriter) -> None:
        body = b"\x1b[31mgone\x1b[0m\nsecond line" + b"." * 10_000
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()

    async with raw_server(not_found) as url:
        with pytest.raises(HttpFetchError) as caught:
            await get(url)
    assert str(caught.value) == f"{url}: HTTP 404 Not Found: '\\x1b[31mgone\\x1b[0m'"


async def test_a_redirect_is_not_followed() -> None:
    async def moved(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 302 Found\r\nLocation: http://192.0.2.1/\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    async with raw_server(moved) as url:
        with pytest.raises(HttpFetchError, match=rf"^{url}: HTTP 302 Found$"):
            await get(url)


async def test_a_closed_port_names_the_peer() -> None:
    port = free_port()
    with pytest.raises(HttpFetchError, match=rf"cannot connect to 127.0.0.1:{port}"):
        await get(f"http://127.0.0.1:{port}/")


async def test_garbage_instead_of_an_answer_is_one_line() -> None:
    async def garbage(writer: asyncio.StreamWriter) -> None:
        writer.write(b"\x00\xffnot http at all\r\n\r\n")
        await writer.drain()

    async with raw_server(garbage) as url:
        with pytest.raises(HttpFetchError, match=rf"^{url}: \w+"):
            await get(url)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(0, 4096), limit=st.integers(0, 4096), declared=st.booleans())
def test_a_body_is_returned_exactly_when_it_fits(size: int, limit: int, declared: bool) -> None:
    body = bytes(i % 251 for i in range(size))

    async def once() -> None:
        async with raw_server(ok_with(body) if declared else until_close(body)) as url:
            if size <= limit:
                assert await get(url, max_bytes=limit) == body
            else:
                with pytest.raises(HttpFetchError, match=f"over {limit}"):
                    await get(url, max_bytes=limit)

    asyncio.run(once())
