"""HBONE server denial of service (issue 14), replayed over real sockets and real mutual TLS on loopback.

The attacker is a raw HTTP/2 client with a mesh certificate (the attacks need no more): it writes frames by hand
and, for the floods, never reads. Each attack is bounded in count and in time, and each is expected to end in
GOAWAY ENHANCE_YOUR_CALM well before it has cost the server what it did before the fix:

- "MadeYouReset" (CVE-2025-8671): CONNECT + WINDOW_UPDATE(0) pairs made 15,000 concurrent handlers and upstream
  dials on one connection. Now the connection ends after ``MAX_EARLY_RESETS`` such resets, handlers never exceed
  the stream limit, and no upstream dial is made beyond it.
- PING and SETTINGS floods from a client that never reads grew the proxy by 400 MiB in 30 s. Now the server stops
  reading while its writes are paused and owes at most ``MAX_QUEUED_CONTROL`` ACKs to a peer that does not read;
  the Python heap grows by less than ``FLOOD_HEAP_BOUND`` (tracemalloc, attacker included) and the flood gets
  GOAWAY ENHANCE_YOUR_CALM.
- CONTINUATION floods (empty frames, which the byte cap never sees) end after ``MAX_CONTINUATIONS`` frames.
- CONNECT to the proxy's own ports on the pod's address or loopback, through the real inbound path
  (:func:`ambit.proxy.inbound.serve_hbone`), is 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from hpack import Encoder
from tests.integration.inbound_rig import POD_IP, inbound_proxy

from ambit.hbone import wire
from ambit.hbone.budgets import MAX_CONTINUATIONS, MAX_EARLY_RESETS
from ambit.hbone.settings import HboneSettings
from ambit.identity.localca import LocalCa
from ambit.model.identity import SpiffeId
from ambit.proxy.hbone_client import HboneClient, TunnelRefusedError
from ambit.proxy.hbone_server import HboneServer, InboundRequest, TunnelResponder
from ambit.proxy.plans import ILLEGAL_PORTS
from ambit.proxy.sockets import HostSocketFactory, connect
from ambit.tls.workload import WorkloadCertificate

TD = "cluster.local"
ATTACKER = SpiffeId(TD, "evil", "default")
SERVER = SpiffeId(TD, "apps", "web")
FACTORY = HostSocketFactory(mark=None)
FLOOD_HEAP_BOUND = 8 * 1024 * 1024
"""Python heap growth allowed while a control-frame flood runs (before the fix: 400 MiB in 30 s)."""
FLOOD_SECONDS = 20.0


# --- the attacker ------------------------------------------------------------------------------------------------


class Attacker:
    """A raw HTTP/2 client over mutual TLS: writes frames, reads only when told to."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.encoder = Encoder()
        self.next_id = 1

    @classmethod
    async def connect(cls, cert: WorkloadCertificate, addr: tuple[str, int], *, rcvbuf: int = 0) -> Attacker:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:  # a small receive window: the kernel stops taking the server's bytes early
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, addr)
        reader, writer = await asyncio.open_connection(
            sock=sock, ssl=cert.client_context(), server_hostname="", limit=16 * 1024
        )
        attacker = cls(reader, writer)
        attacker.writer.write(wire.PREFACE + wire.settings_frame([]))
        return attacker

    def connect_frame(self, authority: str = "127.0.0.1:8080") -> tuple[int, bytes]:
        stream_id, self.next_id = self.next_id, self.next_id + 2
        block = self.encoder.encode([(":method", "CONNECT"), (":authority", authority)], huffman=False)
        return stream_id, wire.frame(wire.HEADERS, wire.END_HEADERS, stream_id, bytes(block))

    async def send(self, data: bytes, patience: float = 2.0) -> bool:
        """Write ``data``; False once the server stopped taking bytes (for ``patience`` s) or the connection is gone."""
        if self.writer.is_closing():
            return False
        self.writer.write(data)
        try:
            async with asyncio.timeout(patience):
                await self.writer.drain()
        except (TimeoutError, ConnectionError):
            return False
        return True

    async def frames_until_closed(self) -> list[tuple[int, int, int, bytes]]:
        """Read what the server sent until its GOAWAY or its close (15 s at most): (type, flags, stream, payload)."""
        data = bytearray()
        frames: list[tuple[int, int, int, bytes]] = []
        pos = 0
        with contextlib.suppress(TimeoutError, ConnectionError, OSError):
            async with asyncio.timeout(15):
                while chunk := await self.reader.read(1 << 20):
                    data += chunk
                    while pos + 9 <= len(data):
                        high, low, frame_type, flags, stream_id = wire.HEADER.unpack_from(data, pos)
                        end = pos + 9 + ((high << 8) | low)
                        if end > len(data):
                            break
                        frames.append((frame_type, flags, stream_id & wire.STREAM_ID_MASK, bytes(data[pos + 9 : end])))
                        pos = end
                    if any(frame[0] == wire.GOAWAY for frame in frames[-3:]):
                        break
        return frames

    def close(self) -> None:
        self.writer.transport.abort()


def goaway_code(frames: list[tuple[int, int, int, bytes]]) -> int | None:
    codes = [wire.parse_goaway(payload)[1] for frame_type, _, _, payload in frames if frame_type == wire.GOAWAY]
    return codes[-1] if codes else None


# --- a bare HBONE server whose handler dials a real upstream and waits ------------------------------------------


class Rig:
    """:class:`HboneServer` on loopback; every handler dials the upstream listener, then waits to be cancelled."""

    def __init__(self, server_cert: WorkloadCertificate, settings: HboneSettings | None) -> None:
        self.server_cert = server_cert
        self.settings = settings
        self.handlers = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.cancelled = 0
        self.dials = 0
        self.serving: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.upstream = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.listener.setblocking(False)
        self.addr = self.listener.getsockname()[:2]
        self.accepting = asyncio.create_task(self._accept())

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(self.listener)
            # A small kernel send buffer: what the kernel holds for a client that does not read is the kernel's
            # memory, not ours; this makes the attacks reach the proxy's own buffers sooner.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
            task = asyncio.create_task(
                HboneServer.serve(sock, self._cert, trust_domain=TD, handler=self._handle, settings=self.settings)
            )
            self.serving.add(task)
            task.add_done_callback(self.serving.discard)

    async def _cert(self) -> WorkloadCertificate:
        return self.server_cert

    async def _handle(self, request: InboundRequest, responder: TunnelResponder) -> None:
        self.handlers += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            self.dials += 1
            sock = await connect(FACTORY, self.upstream.getsockname()[:2])
            try:
                await asyncio.sleep(3600)  # the upstream never answers: only a cancellation ends this
            finally:
                sock.close()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1

    async def aclose(self) -> None:
        self.accepting.cancel()
        await asyncio.gather(self.accepting, return_exceptions=True)
        for task in list(self.serving):
            task.cancel()
        await asyncio.gather(*self.serving, return_exceptions=True)
        self.listener.close()
        self.upstream.close()


@pytest.fixture
async def certs(tmp_path: Path) -> tuple[WorkloadCertificate, WorkloadCertificate]:
    ca = LocalCa(tmp_path / "ca", trust_domain=TD)
    attacker, server = await asyncio.gather(ca.fetch_certificate(ATTACKER), ca.fetch_certificate(SERVER))
    return attacker, server


@contextlib.asynccontextmanager
async def rig(server_cert: WorkloadCertificate, settings: HboneSettings | None = None) -> AsyncIterator[Rig]:
    running = Rig(server_cert, settings)
    await running.start()
    try:
        yield running
    finally:
        await running.aclose()


async def until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    """Poll (the conditions are loop callbacks' state, with no event to wait on)."""
    async with asyncio.timeout(seconds):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


# --- MadeYouReset ------------------------------------------------------------------------------------------------

PAIRS = 15_000
BATCH = 250


async def made_you_reset(attacker: Attacker, pairs: int = PAIRS) -> int:
    """Send up to ``pairs`` CONNECT + WINDOW_UPDATE(0) pairs in batches; return how many went out."""
    sent = 0
    deadline = time.monotonic() + FLOOD_SECONDS
    while sent < pairs and time.monotonic() < deadline:
        batch = bytearray()
        for _ in range(BATCH):
            stream_id, headers = attacker.connect_frame()
            batch += headers + wire.frame(wire.WINDOW_UPDATE, 0, stream_id, struct.pack(">L", 0))
        if not await attacker.send(bytes(batch)):
            break
        sent += BATCH
        await asyncio.sleep(0)  # let the server run its handlers between batches, as a network would
    return sent


async def test_made_you_reset_ends_in_goaway_well_before_15000_handlers(certs: tuple[WorkloadCertificate, ...]) -> None:
    attacker_cert, server_cert = certs
    async with rig(server_cert) as server:
        attacker = await Attacker.connect(attacker_cert, server.addr)
        try:
            await made_you_reset(attacker)
            frames = await attacker.frames_until_closed()
        finally:
            attacker.close()
        assert goaway_code(frames) == wire.ENHANCE_YOUR_CALM
        resets = [f for f in frames if f[0] == wire.RST_STREAM]
        assert len(resets) <= MAX_EARLY_RESETS + 1
        assert server.handlers <= MAX_EARLY_RESETS + 1 and server.dials <= MAX_EARLY_RESETS + 1
        assert server.most_in_flight <= 100  # the stream limit
        await until(lambda: server.in_flight == 0)  # every handler of a reset stream was cancelled
        assert server.cancelled == server.handlers


async def test_handlers_in_flight_never_exceed_the_stream_limit_even_under_the_reset_budget(
    certs: tuple[WorkloadCertificate, ...],
) -> None:
    attacker_cert, server_cert = certs
    async with rig(server_cert, HboneSettings(max_concurrent_streams=10)) as server:
        attacker = await Attacker.connect(attacker_cert, server.addr)
        try:
            await made_you_reset(attacker, pairs=MAX_EARLY_RESETS // 2)  # within the budget: the connection stays
            await until(lambda: server.in_flight == 0)
        finally:
            attacker.close()
        assert server.most_in_flight <= 10 and server.dials <= server.handlers <= MAX_EARLY_RESETS // 2
        assert server.cancelled == server.handlers


async def test_a_client_reset_cancels_the_pending_handler_and_its_dial_promptly(
    certs: tuple[WorkloadCertificate, ...],
) -> None:
    attacker_cert, server_cert = certs
    async with rig(server_cert) as server:
        attacker = await Attacker.connect(attacker_cert, server.addr)
        try:
            streams = [attacker.connect_frame() for _ in range(20)]
            assert await attacker.send(b"".join(frame for _, frame in streams))
            await until(lambda: server.in_flight == 20)
            resets = b"".join(wire.rst_stream(stream_id, wire.CANCEL) for stream_id, _ in streams)
            assert await attacker.send(resets)
            started = time.monotonic()
            await until(lambda: server.in_flight == 0, seconds=2.0)
            assert time.monotonic() - started < 1.0
            assert server.cancelled == 20
        finally:
            attacker.close()


async def test_handlers_that_answer_are_not_cancelled_by_the_budget_and_legit_tunnels_still_work(
    certs: tuple[WorkloadCertificate, ...], tmp_path: Path
) -> None:
    _, server_cert = certs
    ca = LocalCa(tmp_path / "ca", trust_domain=TD)
    client_cert = await ca.fetch_certificate(SpiffeId(TD, "apps", "client"))
    async with rig(server_cert) as server:

        async def answer(request: InboundRequest, responder: TunnelResponder) -> None:
            responder.reject(503)

        server._handle = answer  # type: ignore[method-assign]
        client = await HboneClient.connect(
            await connect(FACTORY, server.addr), client_cert, frozenset({SERVER}), trust_domain=TD
        )
        try:
            for _ in range(3 * MAX_EARLY_RESETS):
                with pytest.raises(TunnelRefusedError) as refused:
                    await client.open_tunnel("127.0.0.1:8080", [])
                assert refused.value.status == 503
            assert not client.closed
        finally:
            await client.aclose()


# --- control-frame floods from a client that never reads ---------------------------------------------------------

PING = wire.frame(wire.PING, 0, 0, b"flooding")
SETTINGS = wire.settings_frame([])
FLOOD_FRAMES = 3_000_000


async def flood(attacker: Attacker, frame: bytes) -> int:
    """Write ``frame`` over and over without reading, until the server stops taking it; return how many."""
    batch = frame * 2048
    sent = 0
    deadline = time.monotonic() + FLOOD_SECONDS
    while sent < FLOOD_FRAMES and time.monotonic() < deadline:
        if not await attacker.send(batch, patience=3.0):
            break
        sent += 2048
    return sent


@pytest.mark.parametrize("frame", [PING, SETTINGS], ids=["ping", "settings"])
async def test_a_control_flood_from_a_client_that_never_reads_is_bounded_and_ends_in_goaway(
    certs: tuple[WorkloadCertificate, ...], frame: bytes
) -> None:
    attacker_cert, server_cert = certs
    async with rig(server_cert) as server:
        attacker = await Attacker.connect(attacker_cert, server.addr, rcvbuf=32 * 1024)
        already = tracemalloc.is_tracing()  # PYTHONTRACEMALLOC=N, as when hunting a ResourceWarning's origin
        if not already:
            tracemalloc.start()
        try:
            tracemalloc.reset_peak()  # the peak of this flood, not of the session so far
            baseline = tracemalloc.get_traced_memory()[0]
            sent = await flood(attacker, frame)
            peak = tracemalloc.get_traced_memory()[1] - baseline
        finally:
            if not already:
                tracemalloc.stop()
        try:
            frames = await attacker.frames_until_closed()
        finally:
            attacker.close()
        print(f"flood of {sent} frames: heap peak +{peak / 1024:.0f} KiB")
        assert sent < FLOOD_FRAMES  # the server stopped taking them
        assert peak < FLOOD_HEAP_BOUND
        assert goaway_code(frames) == wire.ENHANCE_YOUR_CALM


# --- CONTINUATION flood ------------------------------------------------------------------------------------------


async def test_a_continuation_flood_ends_in_goaway(certs: tuple[WorkloadCertificate, ...]) -> None:
    attacker_cert, server_cert = certs
    async with rig(server_cert) as server:
        attacker = await Attacker.connect(attacker_cert, server.addr)
        try:
            _, headers = attacker.connect_frame()
            start = bytearray(headers)
            start[4] = 0  # no END_HEADERS: the block goes on in CONTINUATION frames
            empty = wire.frame(wire.CONTINUATION, 0, 1) * 1000
            sent = 0
            if await attacker.send(bytes(start)):
                while sent < 100_000 and await attacker.send(empty, patience=1.0):
                    sent += 1000
                    await asyncio.sleep(0)
            frames = await attacker.frames_until_closed()
        finally:
            attacker.close()
        assert goaway_code(frames) == wire.ENHANCE_YOUR_CALM
        assert server.handlers == 0 and sent < 100_000
        assert MAX_CONTINUATIONS < 100


# --- CONNECT to the proxy's own ports, through the real inbound path ------------------------------------------------


async def test_connect_to_the_proxys_own_ports_on_the_pod_ip_or_loopback_is_400(tmp_path: Path) -> None:
    ca = LocalCa(tmp_path / "ca", trust_domain=TD)
    client_cert = await ca.fetch_certificate(SpiffeId(TD, "apps", "client"))
    app = socket.create_server((POD_IP, 0))  # an application port on the pod: the control
    async with inbound_proxy(tmp_path) as proxy:
        addr = proxy.hbone
        client = await HboneClient.connect(
            await connect(FACTORY, addr), client_cert, frozenset({SERVER}), trust_domain=TD
        )
        try:
            ports = sorted(ILLEGAL_PORTS - {15080})
            assert ports == [15000, 15001, 15006, 15008, 15020, 15021]
            for host in (POD_IP, "127.0.0.1"):
                for port in ports:
                    with pytest.raises(TunnelRefusedError) as refused:
                        await client.open_tunnel(f"{host}:{port}", [])
                    assert refused.value.status == 400, f"{host}:{port}"
            stream = await client.open_tunnel(f"{POD_IP}:{app.getsockname()[1]}", [])
            stream.abort()
        finally:
            await client.aclose()
            app.close()
