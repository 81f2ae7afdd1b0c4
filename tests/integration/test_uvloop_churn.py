"""Connection-churn soak of the node proxy's data path, under uvloop and under the standard asyncio loop.

Why: a prototype with uvloop 0.23 aborted (double free) under connection churn (DESIGN.md §5), so uvloop may only be
the node proxy's default once this passes. Every test runs the same bounded churn on a fresh loop of each kind
(through :func:`ambit.inpod.eventloop.run`, exactly as ``ambit nodeproxy`` runs), on loopback with real mutual TLS
(HBONE on the socket TLS transport, the node proxy's; the abrupt endings on the loop's TLS transport as well):

- HBONE tunnels: a pooled :class:`HboneClient` → :class:`HboneServer` → a local TCP upstream, 50 at a time, ending
  in a clean half-close, a client abort (RST_STREAM) mid-transfer, an upstream reset (TCP RST), or a refusal (503).
- Abrupt TLS: connections dropped without close_notify after the handshake, during a tunnel, during the handshake
  and before it, and dials cancelled part way through the handshake.
- Plain TCP: :class:`SocketStream` pairs joined by :func:`relay`, with the same four endings.

Each checks that nothing crashed (the loop's exception handler saw nothing, no task failed), that every
connection ended the expected way (exact outcome counts; a hang fails on a deadline), that nothing is left behind
(no new fd in ``/proc/self/fd`` inside the loop after the churn nor after the loop is closed, no task, no live
transport, SSL object, session or stream), and that memory is bounded: the churn runs in rounds, and RSS may not
grow more than :data:`RSS_GROWTH_LIMIT` (16 MiB) from the end of the first round to the end of the last. The first
round pays for warm-up (allocator arenas, SSL contexts); after it, working memory is bounded by the connections
alive at once (50 clients, at most 100 server-side connections: each TLS protocol holds a 256 KiB buffer, so about
40 MiB at most, reused round after round), while a leak grows with every round: the later rounds churn 2,000
tunnels, 200 TLS connections and 1,500 TCP connections, so leaking a TLS buffer per connection (> 50 MiB) or
8 KiB per tunnel would fail. Smaller leaks of connection objects are caught by the live-object check. RSS is read
after a collection and ``malloc_trim``, so memory glibc merely kept after a round (more when a loaded machine made
more connections overlap) does not count as growth.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import gc
import os
import socket
import struct
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from bench.relaying import relay

from ambit.identity.localca import LocalCa
from ambit.inpod.eventloop import EventLoopError, loop_factory, run
from ambit.model.identity import SpiffeId
from ambit.proxy.errors import ProxyConnectError, StreamClosedError
from ambit.proxy.hbone_client import HboneClient, TunnelRefusedError
from ambit.proxy.hbone_server import HboneServer, InboundRequest, TunnelResponder
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.pool import ConnectionPool, PoolKey
from ambit.proxy.sockets import HostSocketFactory, connect
from ambit.proxy.streams import SocketStream
from ambit.tls.socket_transport import TLS_TRANSPORTS, TlsTransportKind
from ambit.tls.workload import WorkloadCertificate

LOOPS = ["asyncio", "uvloop"]
TD = "cluster.local"
CLIENT = SpiffeId(TD, "client-ns", "client-sa")
SERVER = SpiffeId(TD, "server-ns", "server-sa")
FACTORY = HostSocketFactory(mark=None)
CONCURRENCY = 50
ENDINGS = ("clean", "client_abort", "upstream_reset", "refused")
RSS_GROWTH_LIMIT = 16 * 1024 * 1024
"""RSS growth allowed from the end of the first round to the end of the last (see the module docstring)."""
DEADLINE = 40.0
HANDSHAKE_TIMEOUT = 1.0
"""The TLS handshake timeout of the dials the soak cancels (see :meth:`Soak.check`)."""
_LINGER_ZERO = struct.pack("ii", 1, 0)


def _open_fds() -> dict[int, str]:
    """This process's open fds and what each is (``socket:[inode]``, a path, ``anon_inode:[eventpoll]``...)."""
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the directory listing's own fd, closed by now
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    return fds


_LIBC = ctypes.CDLL(None)


def _rss() -> int:
    """Resident memory after a collection and ``malloc_trim``: what live objects hold, not what glibc keeps of
    memory already freed (whose amount depends on how the connections of a round happened to overlap)."""
    gc.collect()
    _LIBC.malloc_trim(0)
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _payload(i: int) -> bytes:
    return b"%06d|" % i * (1 + i % 40) if i % 10 else os.urandom(48 * 1024)  # every tenth crosses many frames


def _reset(writer: asyncio.StreamWriter) -> None:
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
    writer.transport.abort()


class Soak:
    """Loopback upstreams (echo, resetter, a refusing port), failure recorders and the fd/RSS bookkeeping."""

    def __init__(self) -> None:
        self.loop_errors: list[str] = []
        self.task_errors: list[str] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.rss_by_round: list[int] = []
        self._slots = asyncio.Semaphore(2 * CONCURRENCY)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: self.loop_errors.append(str(context)))
        self.tasks_at_start = len(asyncio.all_tasks())
        self._echo = await asyncio.start_server(_guarded(_echo), "127.0.0.1", 0)
        self._resetter = await asyncio.start_server(_guarded(_reset_after_first_bytes), "127.0.0.1", 0)
        self.echo_addr = self._echo.sockets[0].getsockname()[:2]
        self.reset_addr = self._resetter.sockets[0].getsockname()[:2]
        self._refusing = socket.socket()  # bound, never listening: connecting is refused
        self._refusing.bind(("127.0.0.1", 0))
        self.refused_addr = self._refusing.getsockname()[:2]
        # After the first listen: libuv keeps one /dev/null fd per loop from then on, in reserve for EMFILE.
        self.fds_at_start = _open_fds()

    async def admit(self) -> None:
        """Wait for a free server-side slot, which the next :meth:`spawn` takes.

        Without it the servers would fall behind clients that churn faster than handshakes complete, and hold
        every connection of a round at once (asyncio's and uvloop's TLS protocols each hold a 256 KiB buffer):
        memory would measure the backlog, not a leak.
        """
        await self._slots.acquire()

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._slots.release()
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.task_errors.append(f"{task.get_name()}: {task.exception()!r}")

    async def rounds(
        self,
        count: int,
        per_round: int,
        one: Callable[[int], Awaitable[str]],
        end_round: Callable[[], Awaitable[None]] | None = None,
    ) -> collections.Counter[str]:
        """Run ``one(i)`` for ``count * per_round`` indices, ``CONCURRENCY`` at a time; the outcomes counted.

        After each round ``end_round`` (closing what the clients keep, like pooled connections) runs, and then every
        server-side task must finish.
        """
        outcomes: collections.Counter[str] = collections.Counter()
        for round_number in range(count):
            indices = iter(range(round_number * per_round, (round_number + 1) * per_round))

            async def worker(indices: Iterator[int] = indices) -> None:
                for i in indices:  # shared by the workers: each index is taken once
                    try:
                        outcomes[await one(i)] += 1
                    except Exception as exc:  # counted, and the counts are compared exactly
                        outcomes[f"raised {exc!r}"] += 1

            async with asyncio.timeout(DEADLINE):
                await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
                if end_round is not None:
                    await end_round()
                await self.settle()
            gc.collect()
            self.rss_by_round.append(_rss())
        return outcomes

    async def settle(self) -> None:
        """Wait until every server-side task of ours has finished (they end when their peers are gone)."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)

    async def aclose(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await self.settle()
        self._refusing.close()
        for server in (self._echo, self._resetter):
            server.close()
            await server.wait_closed()

    async def check(self) -> None:
        """No crash report, no leaked fd, task or connection object, RSS flat after the first round."""
        assert self.loop_errors == []
        assert self.task_errors == []
        gc.collect()
        new_fds = _open_fds().items() - self.fds_at_start.items()  # the upstreams' own sockets are closed by now
        assert not new_fds
        assert len(asyncio.all_tasks()) == self.tasks_at_start
        # uvloop keeps the objects of a TLS dial cancelled mid-handshake (transport, SSL protocol, SSLObject, our
        # session; not the fd) until the handshake timeout fires; asyncio frees them at once.
        async with asyncio.timeout(HANDSHAKE_TIMEOUT + 5):
            while live := _live_connection_objects():  # noqa: ASYNC110 - garbage has no event to wait on
                await asyncio.sleep(0.1)
        assert not live
        growth = self.rss_by_round[-1] - self.rss_by_round[0]
        assert growth < RSS_GROWTH_LIMIT, [f"{rss / 2**20:.1f} MiB" for rss in self.rss_by_round]


_CONNECTION_TYPES = frozenset(
    {"HboneSession", "HboneStream", "HboneClient", "SocketStream", "SSLObject", "StreamWriter"}
    | {"SSLProtocol", "_SSLProtocolTransport", "_SelectorSocketTransport", "TCPTransport", "UVSocketHandle"}
)
"""Per-connection objects of ours, the standard library's and uvloop's; none may outlive the churn."""


def _live_connection_objects() -> dict[str, int]:
    gc.collect()
    live = collections.Counter(type(obj).__name__ for obj in gc.get_objects())
    return {name: count for name, count in live.items() if name in _CONNECTION_TYPES and count}


def _guarded(
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """An upstream handler whose peer may reset it at any moment (that is the point of the soak)."""

    async def guarded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        except ConnectionError:
            pass
        finally:
            writer.close()
            # Collect the reset here: left in the stream's "closed" future, it can be reported as never retrieved
            # when a garbage-collection cycle finalizes the future before its protocol.
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    return guarded


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.write_eof()
    await writer.drain()


async def _reset_after_first_bytes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read(1)
    _reset(writer)


async def _nothing() -> None:
    pass


def _soak(loop_name: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``main`` on a fresh loop of the kind named, and check no fd outlived the loop."""
    run(_nothing, loop_name)  # once per process, libuv keeps a pipe for its signal lock: not ours to count
    gc.collect()
    fds_before = _open_fds()
    run(main, loop_name)
    gc.collect()
    assert _open_fds() == fds_before


# HBONE over mutual TLS.


class Hbone:
    """An HBONE listener on loopback whose handler dials the soak's upstreams, and a client pool in front."""

    def __init__(
        self,
        soak: Soak,
        client_cert: WorkloadCertificate,
        server_cert: WorkloadCertificate,
        tls_transport: TlsTransportKind = "socket",
    ) -> None:
        self.soak = soak
        self.tls_transport: TlsTransportKind = tls_transport
        self.client_cert = client_cert
        self.server_cert = server_cert
        self.pool = ConnectionPool()
        self.failures: list[str] = []
        self.handled: collections.Counter[str] = collections.Counter()

    async def start(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(512)
        self._listener.setblocking(False)
        self.addr = self._listener.getsockname()[:2]
        self._accepting = asyncio.create_task(self._accept())

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.soak.admit()
            sock, peer = await loop.sock_accept(self._listener)
            serve = HboneServer.serve(
                sock,
                self._cert,
                trust_domain=TD,
                handler=self._handle,
                on_failure=self.failures.append,
                tls_transport=self.tls_transport,
            )
            self.soak.spawn(serve, f"hbone server <- {peer[0]}:{peer[1]}")

    async def _cert(self) -> WorkloadCertificate:
        return self.server_cert

    async def _handle(self, request: InboundRequest, responder: TunnelResponder) -> None:
        host, _, port = request.authority.rpartition(":")
        try:
            sock = await connect(FACTORY, (host, int(port)))
        except ProxyConnectError:
            responder.reject(503)
            self.handled["refused"] += 1
            return
        upstream = SocketStream(sock)
        try:
            result = await relay(responder.accept(), upstream)
        finally:
            await upstream.aclose()
        self.handled["relay failed" if result.error else "relayed"] += 1

    async def dial(self) -> HboneClient:
        sock = await connect(FACTORY, self.addr)
        return await HboneClient.connect(
            sock, self.client_cert, frozenset({SERVER}), trust_domain=TD, tls_transport=self.tls_transport
        )

    async def open(self, addr: tuple[str, int]) -> HboneStream:
        key = PoolKey(CLIENT, frozenset({SERVER}), "127.0.0.1", self.addr)
        return await self.pool.open_tunnel(key, "{}:{}".format(*addr), [("forwarded", 'for="127.0.0.1:1"')], self.dial)

    async def recycle(self) -> None:
        """Close the pooled connections (their servers finish) and start a fresh pool."""
        pool, self.pool = self.pool, ConnectionPool()
        await pool.aclose()

    async def aclose(self) -> None:
        await self.pool.aclose()
        self._accepting.cancel()
        await asyncio.gather(self._accepting, return_exceptions=True)
        self._listener.close()


async def _hbone(soak: Soak, tmp_path: Path, tls_transport: TlsTransportKind = "socket") -> Hbone:
    ca = LocalCa(tmp_path / "ca", trust_domain=TD)
    client_cert, server_cert = await asyncio.gather(ca.fetch_certificate(CLIENT), ca.fetch_certificate(SERVER))
    hbone = Hbone(soak, client_cert, server_cert, tls_transport)
    await hbone.start()
    return hbone


async def _read_all(stream: HboneStream) -> bytes:
    parts = []
    while chunk := await stream.read():
        parts.append(chunk)
    return b"".join(parts)


async def _tunnel(hbone: Hbone, i: int) -> str:
    ending, payload, soak = ENDINGS[i % 4], _payload(i), hbone.soak
    if ending == "refused":
        try:
            await hbone.open(soak.refused_addr)
        except TunnelRefusedError as exc:
            return f"refused {exc.status}"
        return "opened a refused upstream"
    stream = await hbone.open(soak.reset_addr if ending == "upstream_reset" else soak.echo_addr)
    try:
        await stream.write(payload)
        if ending == "clean":
            stream.write_eof()
            return "clean" if await _read_all(stream) == payload else "corrupted"
        if ending == "client_abort":  # the echo has started answering; we never half-close
            if not await stream.read():
                return "early EOF"
            stream.abort()
            return "client_abort"
        try:
            await _read_all(stream)
        except StreamClosedError:
            return "upstream_reset"
        return "EOF instead of a reset"
    finally:
        await stream.aclose()  # idempotent after an abort or a reset


@pytest.mark.parametrize("loop_name", LOOPS)
def test_three_thousand_hbone_tunnels_with_every_ending_leak_nothing(loop_name: str, tmp_path: Path) -> None:
    async def main() -> None:
        soak = Soak()
        await soak.start()
        hbone = await _hbone(soak, tmp_path)
        try:
            outcomes = await soak.rounds(3, 1000, lambda i: _tunnel(hbone, i), hbone.recycle)
        finally:
            await hbone.aclose()
            await soak.aclose()
        assert outcomes == {"clean": 750, "client_abort": 750, "upstream_reset": 750, "refused 503": 750}
        assert hbone.handled["refused"] == 750
        assert hbone.handled["relayed"] + hbone.handled["relay failed"] == 2250
        assert hbone.failures == []
        await soak.check()

    _soak(loop_name, main)


# Abrupt TLS: no close_notify, at every stage of a connection.


class _Quiet(asyncio.Protocol):
    pass


async def _abrupt(hbone: Hbone, i: int) -> str:
    loop = asyncio.get_running_loop()
    sock = await connect(FACTORY, hbone.addr)
    match i % 5:
        case 0:  # handshake done, then an RST before any HTTP/2
            transport, _ = await loop.create_connection(
                _Quiet, sock=sock, ssl=hbone.client_cert.client_context(), server_hostname=""
            )
            transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
            transport.abort()
            return "dropped after handshake"
        case 1:  # a tunnel mid-transfer, then the TCP connection dies under the TLS transport
            killer = sock.dup()
            client = await HboneClient.connect(
                sock, hbone.client_cert, frozenset({SERVER}), trust_domain=TD, tls_transport=hbone.tls_transport
            )
            stream = await client.open_tunnel("{}:{}".format(*hbone.soak.echo_addr), [])
            await stream.write(_payload(i))
            await stream.read()
            killer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
            killer.shutdown(socket.SHUT_RDWR)
            killer.close()
            try:
                await _read_all(stream)
            except StreamClosedError:
                return "tunnel lost with its connection"
            finally:
                await client.aclose()
            return "EOF instead of a lost connection"
        case 2:  # a truncated ClientHello, then an RST
            sock.send(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(32))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
            sock.close()
            return "dropped during handshake"
        case 3:  # connected, then an RST before any byte
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
            sock.close()
            return "dropped before handshake"
        case _:  # the dialer gives up at some point of the handshake (a cancelled task closes the socket)
            try:
                async with asyncio.timeout(0.0005 * (i % 7)):
                    client = await HboneClient.connect(
                        sock,
                        hbone.client_cert,
                        frozenset({SERVER}),
                        trust_domain=TD,
                        timeout=HANDSHAKE_TIMEOUT,
                        tls_transport=hbone.tls_transport,
                    )
            except TimeoutError:
                return "cancelled during handshake"
            await client.aclose()
            return "cancelled during handshake"  # (too late: it had finished)


@pytest.mark.parametrize("tls_transport", TLS_TRANSPORTS)
@pytest.mark.parametrize("loop_name", LOOPS)
def test_tls_connections_dropped_without_close_notify_leak_nothing(
    loop_name: str, tls_transport: TlsTransportKind, tmp_path: Path
) -> None:
    async def main() -> None:
        soak = Soak()
        await soak.start()
        hbone = await _hbone(soak, tmp_path, tls_transport)
        try:
            outcomes = await soak.rounds(3, 100, lambda i: _abrupt(hbone, i))
        finally:
            await hbone.aclose()
            await soak.aclose()
        assert outcomes == {
            "dropped after handshake": 60,
            "tunnel lost with its connection": 60,
            "dropped during handshake": 60,
            "dropped before handshake": 60,
            "cancelled during handshake": 60,
        }
        # Every server-side connection ended. The 120 dropped before or during the handshake failed it; so did
        # those dropped right after the client's handshake whose RST overtook the client's Finished (TLS 1.3: the
        # client is done one flight before the server), and the dials cancelled early enough.
        assert 120 <= len(hbone.failures) <= 240, hbone.failures
        assert all(failure.startswith("TLS handshake failed") for failure in hbone.failures)
        await soak.check()

    _soak(loop_name, main)


# Plain TCP: SocketStream pairs joined by relay.


class Relay:
    """A plain TCP proxy on loopback: each accepted connection relayed to the upstream its listener stands for."""

    def __init__(self, soak: Soak) -> None:
        self.soak = soak
        self.handled: collections.Counter[str] = collections.Counter()
        self._listeners: list[socket.socket] = []
        self._accepting: list[asyncio.Task[None]] = []

    async def listen(self, upstream: tuple[str, int]) -> tuple[str, int]:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(512)
        listener.setblocking(False)
        self._listeners.append(listener)
        self._accepting.append(asyncio.create_task(self._accept(listener, upstream)))
        addr: tuple[str, int] = listener.getsockname()[:2]
        return addr

    async def _accept(self, listener: socket.socket, upstream: tuple[str, int]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.soak.admit()
            sock, peer = await loop.sock_accept(listener)
            self.soak.spawn(self._relay(sock, upstream), f"relay {peer[0]}:{peer[1]}")

    async def _relay(self, sock: socket.socket, target: tuple[str, int]) -> None:
        downstream = SocketStream(sock)
        try:
            try:
                upstream = SocketStream(await connect(FACTORY, target))
            except ProxyConnectError:
                downstream.abort()
                self.handled["refused"] += 1
                return
            try:
                result = await relay(downstream, upstream)
            finally:
                await upstream.aclose()
            self.handled["relay failed" if result.error else "relayed"] += 1
        finally:
            await downstream.aclose()

    async def aclose(self) -> None:
        for task in self._accepting:
            task.cancel()
        await asyncio.gather(*self._accepting, return_exceptions=True)
        for listener in self._listeners:
            listener.close()


async def _read_to_eof(stream: SocketStream) -> bytes:
    parts = []
    while chunk := await stream.read():
        parts.append(chunk)
    return b"".join(parts)


async def _plain(addrs: dict[str, tuple[str, int]], i: int) -> str:
    ending, payload = ENDINGS[i % 4], _payload(i)
    stream = SocketStream(await connect(FACTORY, addrs[ending]))
    try:
        if ending == "refused":
            try:
                await stream.write(payload)
                await _read_to_eof(stream)
            except StreamClosedError:
                return "refused"
            return "refused"  # the proxy's reset may land after our write, as a plain EOF: both are clean
        await stream.write(payload)
        if ending == "clean":
            stream.write_eof()
            return "clean" if await _read_to_eof(stream) == payload else "corrupted"
        if ending == "client_abort":
            if not await stream.read():
                return "early EOF"
            stream.abort()
            return "client_abort"
        try:
            await _read_to_eof(stream)
        except StreamClosedError:
            return "upstream_reset"
        return "EOF instead of a reset"
    finally:
        await stream.aclose()


@pytest.mark.parametrize("loop_name", LOOPS)
def test_two_thousand_relayed_tcp_connections_with_resets_leak_nothing(loop_name: str) -> None:
    async def main() -> None:
        soak = Soak()
        await soak.start()
        proxy = Relay(soak)
        addrs = {
            "clean": await proxy.listen(soak.echo_addr),
            "client_abort": await proxy.listen(soak.echo_addr),
            "upstream_reset": await proxy.listen(soak.reset_addr),
            "refused": await proxy.listen(soak.refused_addr),
        }
        try:
            outcomes = await soak.rounds(4, 500, lambda i: _plain(addrs, i))
        finally:
            await proxy.aclose()
            await soak.aclose()
        assert outcomes == {"clean": 500, "client_abort": 500, "upstream_reset": 500, "refused": 500}
        assert proxy.handled["refused"] == 500
        assert proxy.handled["relayed"] + proxy.handled["relay failed"] == 1500
        await soak.check()

    _soak(loop_name, main)


# The loop choice itself.


def test_an_unknown_event_loop_name_is_a_clear_error() -> None:
    with pytest.raises(EventLoopError, match=r"unknown event loop 'trio'.*asyncio, uvloop"):
        loop_factory("trio")


@pytest.mark.parametrize("loop_name", LOOPS)
def test_run_drives_the_coroutine_on_the_named_loop_and_closes_it(loop_name: str) -> None:
    seen: list[asyncio.AbstractEventLoop] = []

    async def main() -> str:
        seen.append(asyncio.get_running_loop())
        return type(seen[0]).__module__

    module = run(main, loop_name)
    assert module.startswith(loop_name)
    assert seen[0].is_closed()
