"""The lab's ``https-echo`` app over real TLS on loopback: it reports the ALPN protocol it negotiated (``http/1.1``,
the only one it speaks), as Istio's echo server does for ``check.Alpn``, and a client offering only ``h2`` gets no
ALPN rather than a failed handshake."""

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


@pytest.fixture
async def https_echo() -> AsyncIterator[int]:
    port = free_port()
    server = asyncio.create_task(apps._http_echo(port, apps._self_signed_context("external")))
    deadline = time.monotonic() + 10
    while True:  # bounded: the server is listening once a connection is accepted
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            break
        except OSError:
            assert time.monotonic() < deadline, "https-echo did not listen within 10 s"
            await asyncio.sleep(0.05)
    yield port
    server.cancel()
    with pytest.raises(asyncio.CancelledError):
        await server


async def answer(port: int, offer: list[str] | None) -> dict[str, Any]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if offer is not None:
        context.set_alpn_protocols(offer)
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    writer.write(b"GET / HTTP/1.1\r\nHost: external\r\nConnection: close\r\n\r\n")
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    body: dict[str, Any] = json.loads(data.split(b"\r\n\r\n", 1)[1])
    return body


@pytest.mark.parametrize(
    ("offer", "negotiated"),
    [(["http/1.1"], "http/1.1"), (["h2", "http/1.1"], "http/1.1"), (["h2"], None), (None, None)],
)
async def test_https_echo_reports_the_negotiated_alpn(
    https_echo: int, offer: list[str] | None, negotiated: str
) -> None:
    body = await answer(https_echo, offer)
    assert body["alpn"] == negotiated and body["path"] == "/"
