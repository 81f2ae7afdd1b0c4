"""The bidirectional relay between two byte streams (ztunnel's ``copy_bidirectional``; spec §6.5 step 6, §6.6).

Theory of operation: two pumps run concurrently, downstream → upstream ("upstream" bytes) and upstream →
downstream ("downstream" bytes). A pump reads a chunk, writes it, counts it, and only then reads again, so each
direction holds at most one chunk: a slow reader stalls the writer's ``write``, the pump stops reading, and the
sender's kernel buffers fill (TCP backpressure end to end). Memory is bounded by the streams' chunk size.

Rules:

1. EOF on one side is passed on as ``write_eof`` on the other, and that direction is done; the other keeps going
   (half-close works both ways: a client that shut down its sending side still gets the whole reply).
2. The relay is done when both directions reached EOF. It does not close the streams then: they are the caller's.
3. Any error in either direction (a reset, a failed write) aborts *both* streams, so each peer sees a reset, and is
   reported in :attr:`RelayResult.error`; the relay never raises for what peers do.
4. Cancelling the relay aborts both streams and re-raises :class:`asyncio.CancelledError`.

When both streams are :class:`~ambit.proxy.streams.PushStream` (sockets and HBONE tunnels are), the same rules
run on callbacks instead of two pump tasks: a chunk from one end goes straight to the other's ``write_nowait``;
when that says the other end is over its bound, the source is paused until it drains (still one chunk held per
direction). A direction is done when EOF was passed on and the writer holds nothing of ours any more. This
saves a future and a task switch per chunk in each direction, which was most of the proxy's Python time per
request/response round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from ambit.proxy.errors import ProxyError
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.streams import ByteStream, PushStream, SocketStream

_PUSH_TYPES = (SocketStream, HboneStream)
"""The :class:`~ambit.proxy.streams.PushStream` kinds the relay drives by callbacks."""


@dataclass(slots=True)
class RelayResult:
    """Bytes copied downstream → upstream and upstream → downstream, and why the relay failed ("" if it did not)."""

    upstream_bytes: int
    downstream_bytes: int
    error: str = ""


async def _pump(src: ByteStream, dst: ByteStream, name: str, count: Callable[[int], None]) -> str:
    """Copy ``src`` to ``dst`` until EOF; return "" when done, or what went wrong."""
    step = "read"
    try:
        while True:
            step = "read"
            data = await src.read()
            if not data:
                step = "write_eof"
                dst.write_eof()
                return ""
            step = "write"
            await dst.write(data)
            count(len(data))
    except (ProxyError, OSError) as exc:
        return f"{name} {step}: {exc}"


async def close_both(a: ByteStream, b: ByteStream) -> None:
    """Close both streams (after the relay: they are the caller's), ignoring their errors.

    What ``asyncio.gather(a.aclose(), b.aclose(), return_exceptions=True)`` does, without its two tasks and
    gathering future per connection: a :class:`~ambit.proxy.streams.SocketStream` closes without suspending, so
    it is closed first and the other stream awaited after; two streams that may both wait still close concurrently.
    """
    if type(b) is SocketStream:
        a, b = b, a
    if type(a) is not SocketStream:
        await asyncio.gather(a.aclose(), b.aclose(), return_exceptions=True)
        return
    with contextlib.suppress(Exception):
        await a.aclose()
    with contextlib.suppress(Exception):
        await b.aclose()


def _abort_both(a: ByteStream, b: ByteStream) -> None:
    a.abort()
    b.abort()


async def relay(
    downstream: ByteStream,
    upstream: ByteStream,
    *,
    on_upstream: Callable[[int], None] | None = None,
    on_downstream: Callable[[int], None] | None = None,
) -> RelayResult:
    """Copy both ways until both directions reached EOF, or an error aborts both (see the module's rules)."""
    result = RelayResult(0, 0)
    if type(downstream) in _PUSH_TYPES and type(upstream) in _PUSH_TYPES:  # cheaper than a Protocol isinstance
        # Awaited here rather than in a helper coroutine: an idle connection keeps this one frame, not two.
        push = _PushRelay(cast(PushStream, downstream), cast(PushStream, upstream), result)
        try:
            push.start(on_upstream, on_downstream)
            await push.finished
        except BaseException:  # cancelled: nothing may outlive the relay
            push.cancel()
            raise
        return result

    def count_up(n: int) -> None:
        result.upstream_bytes += n
        if on_upstream is not None:
            on_upstream(n)

    def count_down(n: int) -> None:
        result.downstream_bytes += n
        if on_downstream is not None:
            on_downstream(n)

    pending = {
        asyncio.ensure_future(_pump(downstream, upstream, "downstream->upstream", count_up)),
        asyncio.ensure_future(_pump(upstream, downstream, "upstream->downstream", count_down)),
    }
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            errors = [error for error in (task.result() for task in done) if error]
            if errors:
                result.error = errors[0]
                _abort_both(downstream, upstream)
                for task in pending:  # a stream whose abort does not wake its reader must not hang the relay
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                pending = set()
    except BaseException:  # cancelled (or a stream's bug): nothing may outlive the relay
        _abort_both(downstream, upstream)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        raise
    return result


class _PushRelay:
    """The relay on callbacks (see the module docstring); same rules, same result.

    One slotted object per relay and one per direction, whose bound methods are the streams' callbacks: an idle
    connection holds these few small objects rather than a closure (and its cells) per callback.
    """

    __slots__ = ("downstream", "finished", "open_directions", "over", "result", "upstream")

    def __init__(
        self,
        downstream: PushStream,
        upstream: PushStream,
        result: RelayResult,
    ) -> None:
        self.downstream, self.upstream, self.result = downstream, upstream, result
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.over = False  # ``finished`` is done (a plain flag: checked for every chunk)
        self.open_directions = 2

    def start(self, on_upstream: Callable[[int], None] | None, on_downstream: Callable[[int], None] | None) -> None:
        _Direction(self, self.downstream, self.upstream, True, on_upstream).start()
        _Direction(self, self.upstream, self.downstream, False, on_downstream).start()

    def finish(self, error: str = "") -> None:
        if self.over or self.finished.done():
            return
        self.over = True
        self.finished.set_result(None)  # first: aborting calls back into on_error
        if error:
            self.result.error = error
            _abort_both(self.downstream, self.upstream)

    def direction_done(self) -> None:
        self.open_directions -= 1
        if self.open_directions == 0:
            self.finish()

    def cancel(self) -> None:
        self.over = True
        if not self.finished.done():
            self.finished.cancel()
        _abort_both(self.downstream, self.upstream)


class _Direction:
    """One direction of a :class:`_PushRelay`: ``src``'s chunks, EOF and failure go to ``dst``."""

    __slots__ = ("count", "dst", "relay", "src", "upward")

    def __init__(
        self, relay: _PushRelay, src: PushStream, dst: PushStream, upward: bool, count: Callable[[int], None] | None
    ) -> None:
        self.relay, self.src, self.dst, self.upward, self.count = relay, src, dst, upward, count

    def start(self) -> None:
        self.src.start_push(self.on_data, self.on_eof, self.on_error)

    @property
    def name(self) -> str:
        return "downstream->upstream" if self.upward else "upstream->downstream"

    def on_data(self, data: bytes | memoryview) -> None:
        relay = self.relay
        if relay.over:
            return
        dst = self.dst
        try:
            below_bound = dst.write_nowait(data)
        except (ProxyError, OSError) as exc:
            relay.finish(f"{self.name} write: {exc}")
            return
        n = len(data)
        if self.upward:
            relay.result.upstream_bytes += n
        else:
            relay.result.downstream_bytes += n
        if self.count is not None:
            self.count(n)
        if not below_bound:
            src = self.src
            src.pause_reading()
            dst.when_drained(src.resume_reading)

    def on_eof(self) -> None:
        relay = self.relay
        if relay.over:
            return
        dst = self.dst
        try:
            dst.write_eof()
        except (ProxyError, OSError) as exc:
            relay.finish(f"{self.name} write_eof: {exc}")
            return
        if dst.flushed:
            relay.direction_done()
        else:
            dst.when_drained(relay.direction_done)

    def on_error(self, reason: str) -> None:
        self.relay.finish(f"{self.name} read: {reason}")
