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
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from ambit.proxy.errors import ProxyError
from ambit.proxy.streams import ByteStream


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
