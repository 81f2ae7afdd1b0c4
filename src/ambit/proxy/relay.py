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

    def count_up(n: int) -> None:
        result.upstream_bytes += n
        if on_upstream is not None:
            on_upstream(n)

    def count_down(n: int) -> None:
        result.downstream_bytes += n
        if on_downstream is not None:
            on_downstream(n)

    if type(downstream) in _PUSH_TYPES and type(upstream) in _PUSH_TYPES:  # cheaper than a Protocol isinstance
        return await _push_relay(cast(PushStream, downstream), cast(PushStream, upstream), result, count_up, count_down)
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


async def _push_relay(
    downstream: PushStream,
    upstream: PushStream,
    result: RelayResult,
    count_up: Callable[[int], None],
    count_down: Callable[[int], None],
) -> RelayResult:
    """The relay on callbacks (see the module docstring); same rules, same result."""
    finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    open_directions = 2

    def finish(error: str = "") -> None:
        if finished.done():
            return
        finished.set_result(None)  # first: aborting calls back into on_error
        if error:
            result.error = error
            _abort_both(downstream, upstream)

    def direction_done() -> None:
        nonlocal open_directions
        open_directions -= 1
        if open_directions == 0:
            finish()

    def wire(src: PushStream, dst: PushStream, name: str, count: Callable[[int], None]) -> None:
        def on_data(data: bytes) -> None:
            if finished.done():
                return
            try:
                below_bound = dst.write_nowait(data)
            except (ProxyError, OSError) as exc:
                finish(f"{name} write: {exc}")
                return
            count(len(data))
            if not below_bound:
                src.pause_reading()
                dst.when_drained(src.resume_reading)

        def on_eof() -> None:
            if finished.done():
                return
            try:
                dst.write_eof()
            except (ProxyError, OSError) as exc:
                finish(f"{name} write_eof: {exc}")
                return
            if dst.flushed:
                direction_done()
            else:
                dst.when_drained(direction_done)

        def on_error(reason: str) -> None:
            finish(f"{name} read: {reason}")

        src.start_push(on_data, on_eof, on_error)

    try:
        wire(downstream, upstream, "downstream->upstream", count_up)
        wire(upstream, downstream, "upstream->downstream", count_down)
        await finished
    except BaseException:  # cancelled: nothing may outlive the relay
        if not finished.done():
            finished.cancel()
        _abort_both(downstream, upstream)
        raise
    return result
