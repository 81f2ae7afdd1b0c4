"""A command's terminal as the kubelet holds it: the pseudo-terminal's master end, read, written and resized.

Theory of operation. ``kubectl exec -t`` asks for a terminal. The kubelet runs ``runc exec --tty --detach
--console-socket S`` (:class:`ambit.lab.runtime.kubelet_server.RuncExec`): runc makes the pseudo-terminal inside
the container (its ``/dev/pts``), gives the command the slave end as its controlling terminal and stdio, and sends
the master end over the unix socket ``S`` as an ``SCM_RIGHTS`` message; :func:`receive_console` takes it.
:class:`Terminal` then owns that descriptor: output is read from it, input written to it, and a resize is the
``TIOCSWINSZ`` ioctl on it (the kernel tells the command with ``SIGWINCH``).

Rules:
1. The master is non-blocking and driven by the event loop's reader and writer callbacks; a read waits for data, a
   write waits until the terminal took every byte (the terminal's buffer is the flow control, as a pipe's is).
2. A read returns ``b""`` at the terminal's end: Linux answers ``EIO`` once every slave descriptor is closed
   (the command and whatever it left holding the terminal have exited), after what was written was read.
3. A console socket that sends no descriptor, or more than one, or nothing within :data:`CONSOLE_WAIT`, is a
   :class:`TerminalError`; descriptors beyond the first are closed.
4. :meth:`Terminal.close` is idempotent; closing the master hangs the terminal up (the command gets ``SIGHUP``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import socket
import struct
import termios

from ambit.errors import AmbitError
from ambit.k8s.remotecommand import TerminalSize

CHUNK = 32 * 1024
CONSOLE_WAIT = 10.0
"""Seconds runc gets to hand over the terminal's master end."""


class TerminalError(AmbitError):
    """The command's terminal could not be had (rule 3)."""


class Terminal:
    """Rules 1, 2 and 4 for one master descriptor, which this object owns."""

    def __init__(self, master: int) -> None:
        os.set_blocking(master, False)
        self._fd = master

    @property
    def closed(self) -> bool:
        return self._fd < 0

    async def read(self) -> bytes:
        """The next output, up to :data:`CHUNK` bytes; ``b""`` at the terminal's end (rule 2)."""
        while self._fd >= 0:
            try:
                return os.read(self._fd, CHUNK)
            except BlockingIOError:
                await self._ready(writing=False)
            except OSError as exc:
                if exc.errno == errno.EIO:
                    return b""
                raise
        return b""

    async def write(self, data: bytes) -> None:
        """Write all of ``data`` (rule 1); a terminal already closed drops it."""
        view = memoryview(data)
        while view and self._fd >= 0:
            try:
                view = view[os.write(self._fd, view) :]
            except BlockingIOError:
                await self._ready(writing=True)
            except OSError as exc:
                if exc.errno == errno.EIO:  # the command is gone: its input has nowhere to go
                    return
                raise

    def resize(self, size: TerminalSize) -> None:
        """Set the window size (rows, then columns, as ``struct winsize`` holds them)."""
        if self._fd >= 0:
            fcntl.ioctl(self._fd, termios.TIOCSWINSZ, struct.pack("HHHH", size.height, size.width, 0, 0))

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    async def _ready(self, *, writing: bool) -> None:
        """Wait until the master can be written (or read)."""
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        fd = self._fd
        if writing:
            loop.add_writer(fd, wake)
        else:
            loop.add_reader(fd, wake)
        try:
            await ready
        finally:
            if writing:
                loop.remove_writer(fd)
            else:
                loop.remove_reader(fd)


def size_of(fd: int) -> TerminalSize:
    """The window size of the terminal ``fd`` (either end)."""
    rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, bytes(8)))
    return TerminalSize(cols, rows)


async def receive_console(listener: socket.socket, wait: float = CONSOLE_WAIT) -> int:
    """Accept runc's connection on ``listener`` and take the master descriptor it sends (rule 3)."""
    loop = asyncio.get_running_loop()
    listener.setblocking(False)
    try:
        async with asyncio.timeout(wait):
            conn, _ = await loop.sock_accept(listener)
    except TimeoutError:
        raise TerminalError("the runtime handed over no terminal") from None
    with conn:
        conn.settimeout(wait)
        try:
            _, fds, _, _ = await asyncio.to_thread(socket.recv_fds, conn, 4096, 4)
        except OSError as exc:
            raise TerminalError(f"receiving the terminal failed: {exc}") from None
    for extra in fds[1:]:
        with contextlib.suppress(OSError):
            os.close(extra)
    if len(fds) != 1:
        if fds:
            os.close(fds[0])
        raise TerminalError(f"the runtime sent {len(fds)} descriptors for the terminal, not 1")
    return fds[0]
