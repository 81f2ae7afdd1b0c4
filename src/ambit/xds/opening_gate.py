"""How many xDS streams read their opening request at once, and what the server holds for streams it turns away.

Theory of operation: a node proxy reconnecting after a restart opens with every resource it holds named
(``initial_resource_versions``: ~6.5 MB at 100,000 workloads), so a thousand of them at once would hold gigabytes
if each stream's opening were read as soon as it arrived. An admitted stream therefore reads its opening request
only with one of :data:`MAX_OPENINGS` slots of the service's :class:`OpeningGate` (:meth:`OpeningGate.enter`), and
gives the slot back (:meth:`OpeningGate.give_back`) as soon as the session has decided the request; until then its
client's bytes wait at the client (HTTP/2 flow control, with the receive windows kept at their initial size:
:data:`~ambit.xds.server.RECEIVE_WINDOW_OPTIONS`). A stream holding a slot that does not send its opening within
:data:`OPENING_READ_TIMEOUT` is ended. Once no opening has been in flight for a quiet second after a burst of them,
glibc's ``malloc_trim`` gives the allocator's free memory back, on a worker thread (:mod:`ambit.xds.server_trim`
decides when).

A stream about to be refused (admission) or found unauthenticated has its first request let land before the status
goes out (:meth:`OpeningGate.let_land`: aborting while the client is still writing can reach it as a reset), but for
at most :data:`MAX_TURNED_AWAY` such streams at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from ambit.xds.server_trim import TrimPolicy
from ambit.xds.service_metrics import XdsStats

__all__ = ["MAX_OPENINGS", "MAX_TURNED_AWAY", "OPENING_READ_TIMEOUT", "OpeningGate"]

log = logging.getLogger("ambit.xds.server")  # one logger for the whole xDS server, whichever module logs
MAX_OPENINGS = 4
"""Admitted streams whose opening request is read and decided at once (:meth:`OpeningGate.enter`). A stream
waiting for one of these slots has not asked gRPC for its first message, so its client's bytes stay at the client
(HTTP/2 flow control lets only a stream window's worth through); a reading one holds the message (up to
:data:`~ambit.xds.server.MAX_REQUEST_BYTES`) in gRPC's buffers, as bytes and parsed, until the session has decided
it."""
OPENING_READ_TIMEOUT = 10.0
"""Seconds an admitted stream may take to send its opening request once it holds a slot (:data:`MAX_OPENINGS`); a
stream slower than that is ended (``DEADLINE_EXCEEDED``), so that a few silent clients cannot stop every other
stream from opening."""
MAX_TURNED_AWAY = 8
"""Streams about to be refused or found unauthenticated whose first request is read at once (at most
:data:`~ambit.xds.server.MAX_REQUEST_BYTES` each; :meth:`OpeningGate.let_land`)."""


class OpeningGate:
    """The opening slots, the streams in an opening, the trim after a burst, and the turned-away streams' reads."""

    __slots__ = ("_in_opening", "_malloc_trim", "_slots", "_stats", "_timer", "_trim", "_trim_timer", "_turned_away")

    def __init__(
        self,
        openings: int,
        trim: TrimPolicy,
        malloc_trim: Callable[[], int] | None,
        timer: Callable[[], float],
        stats: XdsStats,
    ) -> None:
        """``malloc_trim`` None: never trim; ``stats`` counts the trims."""
        self._slots = asyncio.Semaphore(openings)
        self._in_opening = 0
        """Streams waiting for an opening slot or holding one (:meth:`enter`)."""
        self._trim, self._malloc_trim, self._timer, self._stats = trim, malloc_trim, timer, stats
        self._trim_timer: asyncio.TimerHandle | None = None
        self._turned_away = 0
        """Refused or unauthenticated streams whose first request is being let land (:func:`_first_request`)."""

    async def enter(self) -> asyncio.Semaphore:
        """Wait for an opening slot and return it: the opening request is not even read before one is free."""
        self._in_opening += 1
        if self._trim_timer is not None:  # an opening again: the quiet time starts over when it is decided
            self._trim_timer.cancel()
            self._trim_timer = None
        try:
            await self._slots.acquire()
        except BaseException:
            self._over(None)
            raise
        return self._slots

    def read(self, size: int) -> None:
        """An opening request of ``size`` held bytes was read (it counts towards the next trim)."""
        self._trim.read(size)

    def give_back(self, slot: asyncio.Semaphore | None) -> None:
        """The stream's opening was decided: its ``slot`` (None: already given back) is free again."""
        if slot is not None:
            self._over(slot)

    def _over(self, slot: asyncio.Semaphore | None) -> None:
        """A stream's opening was decided (its ``slot`` given back) or it stopped waiting for a slot; once none has
        been in flight for a while after a burst, the allocator's free memory is given back on a worker thread
        (:mod:`ambit.xds.server_trim`)."""
        if slot is not None:
            slot.release()
        self._in_opening -= 1
        if not self._in_opening and self._malloc_trim is not None:
            loop = asyncio.get_running_loop()
            self._trim_timer = loop.call_later(self._trim.quiet, self._quiet)

    def _quiet(self) -> None:
        self._trim_timer = None
        if self._in_opening or self._malloc_trim is None or not self._trim.idle():
            return
        trim, timer = self._malloc_trim, self._timer

        def timed() -> float:
            started = timer()
            trim()
            return timer() - started

        done = asyncio.get_running_loop().run_in_executor(None, timed)
        done.add_done_callback(self._trimmed)

    def _trimmed(self, done: asyncio.Future[float]) -> None:
        self._trim.trimmed()
        if done.cancelled() or done.exception() is not None:
            log.warning("xds: giving free memory back failed: %r", None if done.cancelled() else done.exception())
            return
        self._stats.trims += 1
        self._stats.trim_seconds = done.result()
        log.debug("xds: gave free memory back after a burst of openings in %.3f s", self._stats.trim_seconds)

    async def let_land(self, context: Any) -> None:
        """The first request of a stream about to be turned away, let land (:func:`_first_request`) for at most
        :data:`MAX_TURNED_AWAY` such streams at once: a request may be up to
        :data:`~ambit.xds.server.MAX_REQUEST_BYTES`, and a flood of refused or unauthenticated streams must not make
        the server hold that much for each (the rest are aborted at once; their clients may see a reset rather than
        the status)."""
        if self._turned_away >= MAX_TURNED_AWAY:
            return
        self._turned_away += 1
        try:
            await _first_request(context)
        finally:
            self._turned_away -= 1


async def _first_request(context: Any) -> None:
    """Let the client's first request land before refusing it: aborting while it is still writing can reach it as
    a reset (INTERNAL) instead of our status. Nothing is sent either way."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(1.0):
            await context.read()  # not kept: read straight from the call, not through an iterator's frame
