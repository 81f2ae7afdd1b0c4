"""The kubelet API's port-forward (:mod:`ambit.lab.runtime.port_forward`): a SPDY client over a WebSocket on the
kubelet's unix socket, to a "pod" whose localhost is this machine's (:class:`LocalDialer`) and whose port is a real
listener."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web
from tests.integration.kubelet_fakes import FakePods, NoExec, short_directory
from tests.integration.spdy_client import ForwardClient

from ambit.k8s import spdy
from ambit.k8s.portforward import WEBSOCKET_PROTOCOL
from ambit.lab.runtime.kubelet_server import KubeletServer
from ambit.lab.runtime.port_forward import LocalDialer, PortForwardRelay, _ClientGone, _Connection


async def _upper_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The pod's server: echoes what it reads in upper case, and ends its output when its input ends."""
    while chunk := await reader.read(65536):
        writer.write(chunk.upper())
        await writer.drain()
    writer.close()


@pytest.fixture
def socket_path() -> Iterator[Path]:
    with short_directory("pf") as path:
        yield path / "node-a" / "kubelet.sock"


@dataclass
class Rig:
    path: Path
    pods: FakePods
    pod_port: int

    async def connect(self, session: aiohttp.ClientSession, pod: str = "web", **kw: Any) -> ForwardClient:
        ws = await session.ws_connect(f"http://node-a/portForward/default/{pod}", protocols=(WEBSOCKET_PROTOCOL,), **kw)
        return ForwardClient(ws)

    def session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(self.path)))


@pytest.fixture
async def rig(socket_path: Path, unused_tcp_port: int) -> AsyncIterator[Rig]:
    server = await asyncio.start_server(_upper_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pods = FakePods()
    pods.pods[("default", "web")] = {
        "metadata": {"name": "web", "namespace": "default", "uid": "uid-web"},
        "status": {"phase": "Running"},
    }
    pods.pods[("default", "done")] = {"metadata": {"name": "done", "uid": "uid-done"}, "status": {"phase": "Succeeded"}}
    kubelet = KubeletServer(
        pods, NoExec(), lambda uid, c: socket_path.parent / "logs", dialer=LocalDialer({80: port, 81: unused_tcp_port})
    )
    await kubelet.serve(socket_path)
    try:
        yield Rig(socket_path, pods, port)
    finally:
        await kubelet.aclose()
        server.close()
        await server.wait_closed()


async def test_bytes_cross_both_ways_and_the_error_stream_ends_empty(rig: Rig) -> None:
    async with rig.session() as session:
        client = await rig.connect(session)
        error, data = await client.forward(80, "0")
        await client.send(data, b"hello through the pod", fin=True)
        assert await client.until_ended(data) == b"HELLO THROUGH THE POD"
        assert await client.until_ended(error) == b""


async def test_more_than_a_window_of_bytes_crosses_without_window_updates(rig: Rig) -> None:
    payload = bytes(range(97, 123)) * 40_000  # ~1 MiB: kubectl sends no WINDOW_UPDATE, so nothing may wait for one
    async with rig.session() as session:
        client = await rig.connect(session)
        _, data = await client.forward(80, "0")
        for at in range(0, len(payload), 32 * 1024):
            await client.send(data, payload[at : at + 32 * 1024])
        await client.send(data, b"", fin=True)
        assert await client.until_ended(data, timeout=30) == payload.upper()


async def test_many_forwards_share_one_session(rig: Rig) -> None:
    async with rig.session() as session:
        client = await rig.connect(session)
        streams = [await client.forward(80, str(i)) for i in range(20)]
        for i, (_, data) in enumerate(streams):
            await client.send(data, f"request {i}".encode(), fin=True)
        for i, (error, data) in enumerate(streams):
            assert await client.until_ended(data) == f"REQUEST {i}".encode()
            assert await client.until_ended(error) == b""


async def test_a_port_nobody_listens_on_is_reported_as_kube_words_it(rig: Rig) -> None:
    async with rig.session() as session:
        client = await rig.connect(session)
        error, data = await client.forward(81, "0")
        message = (await client.until_ended(error)).decode()
        assert message.startswith("error forwarding port 81 to pod uid-web, uid : failed to connect to localhost:81")
        assert "IPv4: dial tcp4 127.0.0.1:" in message and "connection refused" in message
        assert await client.until_ended(data) == b""
        # The session survives a failed forward.
        _, data = await client.forward(80, "1")
        await client.send(data, b"still here", fin=True)
        assert await client.until_ended(data) == b"STILL HERE"


async def test_a_pod_that_is_not_running_or_a_plain_request_is_refused(rig: Rig) -> None:
    async with rig.session() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await rig.connect(session, "done")
        assert refused.value.status == 400
        with pytest.raises(aiohttp.WSServerHandshakeError) as missing:
            await rig.connect(session, "nope")
        assert missing.value.status == 404
        async with session.get("http://node-a/portForward/default/web") as plain:
            assert plain.status == 400
            assert "Upgrade request required" in await plain.text()


async def test_garbage_ends_the_session_with_goaway(rig: Rig) -> None:
    async with rig.session() as session:
        client = await rig.connect(session)
        await client.forward(80, "0")
        await client.ws.send_bytes(b"\x80\x09" + bytes(30))  # a control frame of SPDY version 9
        while True:
            msg = await asyncio.wait_for(client.ws.receive(), 10)
            if msg.type is not aiohttp.WSMsgType.BINARY:
                break
            client.events += client.parser.feed(msg.data)
        assert spdy.GoAwayReceived(3, spdy.GoAwayStatus.PROTOCOL_ERROR) in client.events


async def test_a_pod_that_never_reads_holds_its_session_only_while_the_client_stays() -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    sink = await asyncio.start_server(never_read, "127.0.0.1", 0)
    _reader, writer = await asyncio.open_connection("127.0.0.1", sink.sockets[0].getsockname()[1])
    gone = False
    relay = PortForwardRelay(
        cast(web.WebSocketResponse, None),
        "uid",
        LocalDialer(),
        max_streams=4,
        client_gone=lambda: gone,
        poll_interval=0.05,
    )
    relay._connections["0"] = _Connection(writer, asyncio.get_running_loop().create_task(asyncio.sleep(3600)))
    writer.write(bytes(16 * 1024 * 1024))  # far beyond what the socket buffers hold: drain waits on the pod
    draining = asyncio.create_task(relay._drain(writer))
    await asyncio.sleep(0.3)
    assert not draining.done()
    gone = True
    with pytest.raises(_ClientGone):
        await asyncio.wait_for(draining, 5)
    await relay._close("0")
    assert writer.transport.is_closing()
    sink.close()
    for w in accepted:
        w.close()
