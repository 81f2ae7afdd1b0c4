"""The bidirectional relay between two byte streams (ztunnel's ``copy_bidirectional``; spec §6.5 step 6, §6.6).

Theory of operation: a :class:`Splice` joins two push streams (:class:`~ambit.proxy.streams.PushStream`: sockets
and HBONE tunnels) on callbacks. A chunk from one end goes straight to the other's ``write_nowait``; when that says
the other end is over its bound, the source is paused until it drains, so each direction holds at most one chunk:
a slow reader stalls the writer, the source stops reading, and the sender's kernel buffers fill (TCP backpressure
end to end).

Rules:

1. EOF on one side is passed on as ``write_eof`` on the other, and that direction is done once the writer holds
   nothing of ours any more; the other direction keeps going (half-close works both ways: a client that shut down
   its sending side still gets the whole reply).
2. The relay is done when both directions are done. It does not close the streams then: they are the caller's.
3. Any error in either direction (a reset, a failed write) aborts *both* streams, so each peer sees a reset, and is
   reported in :attr:`RelayResult.error`; the relay never raises for what peers do.
4. :meth:`Splice.cancel` aborts both streams and finishes with the error "cancelled".
5. A chunk is counted in the splice's :class:`RelayResult` once the other end took it; that running total is the
   only count kept per chunk. A :class:`ByteCounter` (the connection's accounting) is handed it when the splice
   starts and reads it when it needs the bytes, so counting adds no call per chunk.

:func:`splice` starts a relay and returns at once. The node proxy's connection handlers set a connection up, splice
it and return; the splice's ``on_done`` does the rest (accounting, closing both streams, forgetting the
connection), so a held idle connection is a few small objects, with no task, coroutine frame or future.

The plain socket side in C (step 3 of docs/native-data-path.md): where the process runs the native DATA path
(``ambit.native.selection().relay_sockets``) and a direction joins a :class:`SocketStream` and an
:class:`HboneStream` whose session has a ``DataPath``, with no per-chunk callbacks, the direction gets a
``native`` callable from ``relay_socket.c``: the HBONE stream attaches a ``SocketSink`` (payloads sent on the socket
and counted in C) in place of :meth:`_Direction.on_data`, and the socket registers a ``SocketReader`` (a read handed
to ``DataPath.send`` and counted in C) in place of its ``_push_readable``. Each reads this module's state and the
streams' on every call and falls back, from the octet it stopped at, to the Python methods here
(:meth:`_Direction.on_data`, :meth:`_Direction.hold_source`, :meth:`_Direction.write_failed`,
:meth:`_Direction.send_failed`) and the streams' own: the rules above hold on both paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ambit import native
from ambit.proxy.errors import ProxyError, StreamClosedError
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.streams import ByteStream, PushStream, SocketStream, describe

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RelayResult:
    """Bytes copied downstream → upstream and upstream → downstream, and why the relay failed ("" if it did not)."""

    upstream_bytes: int
    downstream_bytes: int
    error: str = ""


def _abort_both(a: ByteStream, b: ByteStream) -> None:
    a.abort()
    b.abort()


class SpliceRegistry(Protocol):
    """Where a running splice is kept (a set, or a set with bookkeeping of its own)."""

    def discard(self, splice: Splice, /) -> None: ...


class Splice:
    """The relay on callbacks (see the module docstring), left running: same rules, and its result goes to ``on_done``.

    :func:`splice` starts one and returns at once, so nothing has to wait for it: an idle relayed connection is this
    object, one :class:`_Direction` per direction and the two streams, with no task or suspended coroutine frame.
    ``on_done(splice)`` runs exactly once, when both directions reached EOF, when one failed (both streams are then
    aborted), or when :meth:`cancel` was called (``result.error`` is then "cancelled"). The streams are still the
    caller's when ``on_done`` runs (:func:`close_now` closes them without waiting).

    ``registry``, when set, is a set this splice belongs to while it runs (a pod's live connections, so that
    removing the pod can cancel them); the splice removes itself from it when done.
    """

    __slots__ = (
        "callbacks",
        "directions",
        "downstream",
        "on_done",
        "open_directions",
        "over",
        "registry",
        "result",
        "upstream",
    )

    def __init__(
        self,
        downstream: PushStream,
        upstream: PushStream,
        on_done: Callable[[Splice], None] | None = None,
        counter: ByteCounter | None = None,
        callbacks: _Callbacks | None = None,
    ) -> None:
        self.downstream, self.upstream = downstream, upstream
        self.result = RelayResult(0, 0)
        self.on_done = on_done
        if counter is not None:
            counter.count_from(self.result)
        self.callbacks = callbacks  # called per chunk (tests, benchmarks); a counter reads the totals instead
        self.over = False  # done: checked for every chunk
        self.open_directions = 2
        self.registry: SpliceRegistry | None = None
        self.directions: tuple[_Direction, ...] = ()

    def start(self) -> None:
        up = _Direction(self, self.downstream, self.upstream, True)
        self.directions = (up,)
        up.start()
        if not self.over:  # the first direction may have failed at once (a stream that was already reset)
            down = _Direction(self, self.upstream, self.downstream, False)
            self.directions = (up, down)
            down.start()

    def finish(self, error: str = "") -> None:
        if self.over:
            return
        self.over = True  # first: aborting calls back into on_error
        if error:
            self.result.error = error
            _abort_both(self.downstream, self.upstream)
        if self.registry is not None:
            self.registry.discard(self)
            self.registry = None
        on_done, self.on_done = self.on_done, None
        if on_done is not None:
            try:
                on_done(self)
            except Exception:  # a bug in the owner's bookkeeping must not break the stream that called us
                log.exception("relay: on_done failed")
        # A stream keeps its sink (a direction) after this, and the directions pointed back here: the splice,
        # both streams and what they hold were a cycle left to the collector, per connection.
        for direction in self.directions:
            direction.relay = None
            direction.native = None  # it holds the direction: one more cycle, let go here
        self.directions = ()

    def direction_done(self) -> None:
        self.open_directions -= 1
        if self.open_directions == 0:
            self.finish()

    def cancel(self) -> None:
        """Abort both streams and finish with the error "cancelled" (nothing happens if already done)."""
        self.finish("cancelled")


def splice(
    downstream: PushStream,
    upstream: PushStream,
    on_done: Callable[[Splice], None],
    *,
    counter: ByteCounter | None = None,
    on_upstream: Callable[[int], None] | None = None,
    on_downstream: Callable[[int], None] | None = None,
) -> Splice:
    """Start relaying between two push streams and return at once; ``on_done(splice)`` runs when it is over.

    ``counter`` (an accounting object) is handed the splice's running totals (``result``) at once and reads them
    when it needs to: no call per chunk. The ``on_upstream``/``on_downstream`` callbacks are called per chunk.
    """
    callbacks = None
    if on_upstream is not None or on_downstream is not None:
        callbacks = _Callbacks(on_upstream, on_downstream)
    running = Splice(downstream, upstream, on_done, counter, callbacks)
    running.start()
    return running


class ByteCounter(Protocol):
    """What counts a splice's bytes: given the splice's running totals once, it reads them when it needs them."""

    def count_from(self, totals: RelayResult) -> None: ...


class _Callbacks:
    """Per-chunk counting by two optional callbacks."""

    __slots__ = ("on_downstream", "on_upstream")

    def __init__(self, on_upstream: Callable[[int], None] | None, on_downstream: Callable[[int], None] | None) -> None:
        self.on_upstream, self.on_downstream = on_upstream, on_downstream

    def up(self, n: int) -> None:
        if self.on_upstream is not None:
            self.on_upstream(n)

    def down(self, n: int) -> None:
        if self.on_downstream is not None:
            self.on_downstream(n)


def close_now(a: ByteStream, b: ByteStream) -> None:
    """Close both streams without waiting (after a splice), ignoring their errors.

    A socket closes at once; a tunnel half-closes and is reset if its peer still sends, also at once, unless bytes
    of ours are still queued behind HTTP/2 flow control: only then a task waits for them (``aclose``).
    """
    for stream in (a, b):
        try:
            if type(stream) is SocketStream:
                stream.close()
                continue
            if type(stream) is HboneStream and stream.close_nowait():
                continue
        except Exception:
            log.debug("closing %r failed", stream, exc_info=True)
            continue
        task = asyncio.get_running_loop().create_task(_close_quietly(stream))
        _closing.add(task)
        task.add_done_callback(_closing.discard)


_closing: set[asyncio.Task[None]] = set()
"""Closes that wait for queued bytes, kept referenced until they end."""


async def _close_quietly(stream: ByteStream) -> None:
    with contextlib.suppress(Exception):
        await stream.aclose()


class _Direction:
    """One direction of a :class:`Splice`: ``src``'s chunks, EOF and failure go to ``dst``."""

    __slots__ = ("dst", "native", "relay", "src", "upward")

    def __init__(self, relay: Splice, src: PushStream, dst: PushStream, upward: bool) -> None:
        self.relay: Splice | None = relay
        """None once the splice finished (it lets its directions go; see :meth:`Splice.finish`)."""
        self.src, self.dst, self.upward = src, dst, upward
        self.native: Callable[..., None] | None = None
        """What ``src`` calls instead of the Python path where the relay's socket side runs in C (see the module
        docstring): a ``SocketSink`` (an HBONE source's attached sink) or a ``SocketReader`` (a socket source's
        reader callback); None otherwise, and once the splice finished."""

    def start(self) -> None:
        module = native.selection().relay_sockets
        if module is not None and self.relay is not None and self.relay.callbacks is None:
            src, dst = self.src, self.dst
            if type(src) is SocketStream and type(dst) is HboneStream and dst.native_data:
                self.native = module.SocketReader(self)
            elif type(src) is HboneStream and type(dst) is SocketStream and src.native_data:
                self.native = module.SocketSink(self)
        self.src.start_push(self)

    @property
    def name(self) -> str:
        return "downstream->upstream" if self.upward else "upstream->downstream"

    def on_data(self, data: bytes | memoryview) -> None:
        relay = self.relay
        if relay is None or relay.over:
            return
        dst = self.dst
        try:
            below_bound = dst.write_nowait(data)
        except (ProxyError, OSError) as exc:
            relay.finish(f"{self.name} write: {exc}")
            return
        n = len(data)
        callbacks = relay.callbacks
        if self.upward:
            relay.result.upstream_bytes += n
            if callbacks is not None:
                callbacks.up(n)
        else:
            relay.result.downstream_bytes += n
            if callbacks is not None:
                callbacks.down(n)
        if not below_bound:
            self.hold_source()

    def hold_source(self) -> None:
        """``dst`` is over its bound: stop reading ``src`` until it drains (also called from C)."""
        src = self.src
        src.pause_reading()
        self.dst.when_drained(src.resume_reading)

    def write_failed(self, exc: BaseException) -> None:
        """``dst``'s write raised ``exc`` (called from C): the splice fails, as in :meth:`on_data`; anything else
        than a stream's or a socket's error is raised again, as it would have left :meth:`on_data`."""
        if not isinstance(exc, (ProxyError, OSError)):
            raise exc
        relay = self.relay
        if relay is not None:
            relay.finish(f"{self.name} write: {exc}")

    def send_failed(self, exc: OSError) -> None:
        """The C sink's ``send`` on ``dst``'s socket failed: what the socket's ``write_nowait`` would have raised."""
        self.write_failed(StreamClosedError(f"write: {describe(exc)}"))

    def on_eof(self) -> None:
        relay = self.relay
        if relay is None or relay.over:
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
        relay = self.relay
        if relay is not None:
            relay.finish(f"{self.name} read: {reason}")
