"""A relay that can be awaited, for tests and benchmarks: :func:`relay` copies between two byte streams until both
directions are done, with the rules of :mod:`ambit.proxy.relay`, and returns its :class:`RelayResult`.

Push streams (sockets, HBONE tunnels) are relayed by a :class:`~ambit.proxy.relay.Splice`, as the node proxy does;
any other :class:`~ambit.proxy.streams.ByteStream` (a test's wrapper) by two pump tasks that read a chunk, write
it, count it, and only then read again. Cancelling :func:`relay` aborts both streams and re-raises.
:func:`close_both` closes two streams, ignoring their errors.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TypeGuard

from ambit.proxy.errors import ProxyError
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.relay import ByteCounter, RelayResult, Splice, splice
from ambit.proxy.streams import ByteStream, PushStream, SocketStream

__all__ = ["RelayResult", "close_both", "relay"]


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


async def relay(
    downstream: ByteStream,
    upstream: ByteStream,
    *,
    on_upstream: Callable[[int], None] | None = None,
    on_downstream: Callable[[int], None] | None = None,
    counter: ByteCounter | None = None,
) -> RelayResult:
    """Copy both ways until both directions reached EOF, or an error aborts both (see the module's rules).

    ``counter`` (push streams only) counts as the node proxy's accounting does (see :func:`ambit.proxy.relay.splice`).
    """
    if counter is not None and not (_can_splice(downstream) and _can_splice(upstream)):
        raise TypeError("a counter needs two push streams")
    if _can_splice(downstream) and _can_splice(upstream):
        finished: asyncio.Future[RelayResult] = asyncio.get_running_loop().create_future()

        def settle(over: Splice) -> None:
            if not finished.done():
                finished.set_result(over.result)

        running = splice(
            downstream, upstream, settle, counter=counter, on_upstream=on_upstream, on_downstream=on_downstream
        )
        try:
            return await finished
        except BaseException:  # cancelled: nothing may outlive the relay
            running.cancel()
            raise

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
                downstream.abort()
                upstream.abort()
                for task in pending:  # a stream whose abort does not wake its reader must not hang the relay
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                pending = set()
    except BaseException:  # cancelled (or a stream's bug): nothing may outlive the relay
        downstream.abort()
        upstream.abort()
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        raise
    return result


def _can_splice(stream: ByteStream) -> TypeGuard[PushStream]:
    """Whether ``stream`` is a push stream the relay drives on callbacks (sockets and HBONE tunnels are)."""
    return type(stream) in (SocketStream, HboneStream)
