"""A loopback TCP relay for tests that need a peer to go silent: frozen connections swallow every byte, in both
directions, without closing anything (what a partition or a dropped-packet firewall looks like to both ends).
New connections after :meth:`Relay.freeze` are forwarded normally, so a client that reconnects gets through.
"""

from __future__ import annotations

import asyncio
import contextlib


class Relay:
    """Forwards 127.0.0.1:<port> to a target; :meth:`freeze` makes the open connections drop every byte silently."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.frozen: set[int] = set()
        self.closed_by_client: set[int] = set()
        """Connections (by number, from 1) the client side has closed (read EOF), frozen or not."""
        self.connections = 0
        self._open: list[tuple[int, asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    def freeze(self) -> None:
        self.frozen.update(cid for cid, _, _ in self._open)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        cid = self.connections
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._open.append((cid, writer, up_writer))
        for src, dst, upstream in ((reader, up_writer, True), (up_reader, writer, False)):
            task = asyncio.create_task(self._pipe(cid, src, dst, upstream=upstream), name=f"relay {cid}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, cid: int, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, upstream: bool) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await src.read(65536):
                if cid not in self.frozen:
                    dst.write(data)
                    await dst.drain()
            if upstream:
                self.closed_by_client.add(cid)
            if cid not in self.frozen:
                dst.close()

    async def aclose(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for _, a, b in self._open:
            a.close()
            b.close()
