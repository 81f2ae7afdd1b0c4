"""A port-forward client for tests: kube's SPDY session in binary WebSocket messages, made of our codec."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aiohttp

from ambit.k8s import spdy


@dataclass
class ForwardClient:
    """kubectl's side of one session; :meth:`forward` opens one request's streams, the rest reads what came back."""

    ws: aiohttp.ClientWebSocketResponse
    out: spdy.SpdySerializer = field(default_factory=spdy.SpdySerializer)
    parser: spdy.SpdyParser = field(default_factory=spdy.SpdyParser)
    next_id: int = 1
    events: list[spdy.Event] = field(default_factory=list)

    async def forward(self, port: int, request_id: str) -> tuple[int, int]:
        """The (error, data) stream ids of a new request to ``port``."""
        error, data = self.next_id, self.next_id + 2
        self.next_id += 4
        common = (("port", str(port)), ("requestid", request_id))
        await self.ws.send_bytes(self.out.syn_stream(error, (("streamtype", "error"), *common), fin=True))
        await self.ws.send_bytes(self.out.syn_stream(data, (("streamtype", "data"), *common)))
        return error, data

    async def send(self, stream_id: int, data: bytes, *, fin: bool = False) -> None:
        await self.ws.send_bytes(self.out.data(stream_id, data, fin=fin))

    def data_of(self, stream_id: int) -> tuple[bytes, bool]:
        """What stream ``stream_id`` received so far, and whether it ended."""
        chunks = [e for e in self.events if isinstance(e, spdy.DataReceived) and e.stream_id == stream_id]
        return b"".join(e.data for e in chunks), any(e.fin for e in chunks)

    async def until_ended(self, stream_id: int, timeout: float = 10.0) -> bytes:  # noqa: ASYNC109
        async with asyncio.timeout(timeout):
            while not self.data_of(stream_id)[1]:
                msg = await self.ws.receive()
                if msg.type is not aiohttp.WSMsgType.BINARY:
                    raise AssertionError(f"the session ended: {msg.type} {msg.data!r}")
                self.events += self.parser.feed(msg.data)
        return self.data_of(stream_id)[0]
