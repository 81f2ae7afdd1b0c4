"""The lab's ``multi-echo`` app on loopback: one process serving Istio's echo kinds of port (HTTP, HTTPS, gRPC, TCP
echo, server-first TCP), each reporting the client's address as it saw it, on the address each listener asks for;
a bad ``--listen`` is a usage error, not a traceback."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ambit.lab import apps


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


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
