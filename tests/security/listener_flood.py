"""The attacker and the witness of the listener flood tests (``test_listener_floods.py``).

:class:`Flood` opens idle TCP connections to a listener from chosen loopback addresses and never sends a byte;
:func:`closed_by_server` tells which of them the server has closed (reset or EOF) within a bound. :class:`Witness`
keeps an established tunnel busy with echo round trips while the flood runs and records the slowest one. The
trickling TLS client of the slowloris test sends a real ClientHello a byte at a time (:func:`client_hello`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import Awaitable, Callable

from ambit.tls.workload import WorkloadCertificate


def loopback_addresses(count: int, third: int = 2) -> list[str]:
    """``count`` attacker addresses, 127.0.<third>.1 and up (the whole of 127/8 is local)."""
    return [f"127.0.{third}.{n}" for n in range(1, count + 1)]


async def dial_from(source: str, addr: tuple[str, int], *, refused_ok: bool = False) -> socket.socket:
    """A TCP connection from ``source``; with ``refused_ok`` one the server reset before the connect call returned
    is returned too (a refused flood connection can be reset that quickly)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.bind((source, 0))
    try:
        await asyncio.get_running_loop().sock_connect(sock, addr)
    except ConnectionResetError:
        if not refused_ok:
            sock.close()
            raise
    except BaseException:
        sock.close()
        raise
    return sock


class Flood:
    """Idle TCP connections to ``addr``: ``per_address`` from each of ``sources``, opened in that order."""

    def __init__(self) -> None:
        self.sockets: list[socket.socket] = []

    @classmethod
    async def open(cls, addr: tuple[str, int], sources: list[str], per_address: int) -> Flood:
        flood = cls()
        try:
            for source in sources:
                for _ in range(per_address):
                    flood.sockets.append(await dial_from(source, addr, refused_ok=True))
        except BaseException:
            flood.close()
            raise
        return flood

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


async def closed_by_server(sockets: list[socket.socket], within: float) -> list[socket.socket]:
    """Those of ``sockets`` the server closed (reset, or EOF after whatever it sent) within ``within`` seconds; the
    others stay open."""
    loop = asyncio.get_running_loop()

    async def ended(sock: socket.socket) -> bool:
        with contextlib.suppress(OSError):  # reset (or reset before the connect was through: not connected)
            while await loop.sock_recv(sock, 65536):  # what the server says before it closes (a ServerHello)
                pass
        return True

    tasks = {asyncio.create_task(ended(sock)): sock for sock in sockets}
    done, pending = await asyncio.wait(tasks, timeout=within)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return [tasks[task] for task in done if task.result()]


class Witness:
    """Echo round trips on an established tunnel, one after the other, until stopped; the slowest is kept."""

    def __init__(self, round_trip: Callable[[bytes], Awaitable[bytes]]) -> None:
        self._round_trip = round_trip
        self.count = 0
        self.slowest = 0.0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while not self._stop.is_set():
            payload = f"ping {self.count}".encode()
            started = time.monotonic()
            assert await self._round_trip(payload) == payload
            self.slowest = max(self.slowest, time.monotonic() - started)
            self.count += 1
            await asyncio.sleep(0)  # let the flood's accepts in between: a busy loop of our own is no witness

    async def stop(self) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task


def client_hello(cert: WorkloadCertificate) -> bytes:
    """The first flight a mesh client sends: a complete TLS 1.3 ClientHello record."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = cert.client_context().wrap_bio(incoming, outgoing, server_side=False)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


async def trickle_until_closed(sock: socket.socket, data: bytes, interval: float, give_up: float) -> float:
    """Send ``data`` a byte per ``interval`` seconds (then keep sending zeros) until the server closes the
    connection; the seconds that took. Fails after ``give_up`` seconds."""
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    sent = 0
    closed = asyncio.ensure_future(closed_by_server([sock], give_up))
    try:
        while not closed.done():
            byte = data[sent : sent + 1] or b"\0"
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                await loop.sock_sendall(sock, byte)
            sent += 1
            await asyncio.wait([closed], timeout=interval)  # the attack's pace, not synchronisation
        assert closed.result() == [sock], f"the server kept a trickling handshake for {give_up} s"
    finally:
        closed.cancel()
    return time.monotonic() - started
