"""The asyncio shell under the ZDS sessions: one SEQPACKET datagram at a time, with SCM_RIGHTS fds.

Theory of operation: :class:`ZdsSocket` wraps a connected, non-blocking ``AF_UNIX``/``SOCK_SEQPACKET`` socket.
``receive()`` reads into a 1024-byte buffer (spec §3.2) with MSG_CMSG_CLOEXEC, and reports a truncated datagram as
such rather than guessing; a zero-length read is end of stream (no valid ZDS message is empty). ``apply()`` is the
one dispatch function: it performs the transport commands a session returns and hands everything else (events, pod
commands) to the caller's handler. fds received here belong to the session's outputs (see ``ambit.zds.commands``).
"""

from __future__ import annotations

import array
import asyncio
import os
import socket
from collections.abc import Callable, Iterable

from ambit.zds.commands import CloseConnection, CloseFds, Output, SendMessage
from ambit.zds.protocol import MAX_MESSAGE_SIZE, Datagram

_FD_SIZE = array.array("i").itemsize
_MAX_FDS = 4  # more than the one an Add may carry, so that extras arrive (and are rejected) rather than vanish


class ZdsSocket:
    """A ZDS connection: send and receive whole datagrams, fds alongside."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._loop = asyncio.get_running_loop()

    @property
    def closed(self) -> bool:
        return self._sock.fileno() < 0

    async def send(self, data: bytes, fds: Iterable[int] = ()) -> None:
        fd_list = list(fds)
        while True:
            try:
                socket.send_fds(self._sock, [data], fd_list)
                return
            except BlockingIOError:
                await self._wait(self._loop.add_writer, self._loop.remove_writer)

    async def receive(self) -> Datagram | None:
        """The next datagram, or None at end of stream."""
        while True:
            try:
                # not socket.recv_fds: in 3.11 it silently drops its flags argument (so no MSG_CMSG_CLOEXEC)
                data, ancdata, flags, _ = self._sock.recvmsg(
                    MAX_MESSAGE_SIZE, socket.CMSG_SPACE(_MAX_FDS * _FD_SIZE), socket.MSG_CMSG_CLOEXEC
                )
                break
            except BlockingIOError:
                await self._wait(self._loop.add_reader, self._loop.remove_reader)
        fds = array.array("i")
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % _FD_SIZE])
        if not data and not fds:
            return None
        truncated = bool(flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC))
        return Datagram(data, tuple(fds), truncated)

    async def apply(self, outputs: Iterable[Output], handle: Callable[[Output], None]) -> None:
        """Perform transport commands in order; pass events and pod commands to ``handle``."""
        for output in outputs:
            match output:
                case SendMessage(data, fds):
                    if not self.closed:
                        await self.send(data, fds)
                case CloseFds(fds):
                    for fd in fds:
                        os.close(fd)
                case CloseConnection():
                    handle(output)
                    self.close()
                case _:
                    handle(output)

    def close(self) -> None:
        self._sock.close()

    async def aclose(self) -> None:
        self.close()

    async def _wait(
        self,
        add: Callable[[int, Callable[[], None]], object],
        remove: Callable[[int], object],
    ) -> None:
        fd = self._sock.fileno()
        waiter: asyncio.Future[None] = self._loop.create_future()

        def wake() -> None:
            if not waiter.done():
                waiter.set_result(None)

        add(fd, wake)
        try:
            await waiter
        finally:
            remove(fd)
