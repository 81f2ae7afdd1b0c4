"""Access-log lines to the process's log stream, batched per event-loop iteration, without the ``logging`` module
on the way when the process's logging lets that be done unseen.

Theory of operation: a proxy writes one access-log line per request or connection. Through ``logging`` each line
costs a :class:`logging.LogRecord`, the handler chain, a lock, the formatter and a write plus flush of its own.
:class:`AccessSink` writes the same bytes itself when the ``access`` logger's records would end, unchanged, in one
plain stream handler of the process's :class:`~ambit.telemetry.log_format.LogFormatter`
(:func:`~ambit.cli.process_logging.configure_logging`), and hands each line to ``logging`` otherwise (a test's
capture handler, a filter, a custom configuration): what is written never depends on which way it went.

Rules:

1. A line is written only when the logger is enabled for its level (INFO for a success, WARNING for a failure),
   so ``/logging`` levels and ``logging.disable`` hold; nothing is formatted for a disabled logger.
2. The direct way is taken when the logger is not disabled and has no filters, and the handlers its records reach
   (its own, then its ancestors' while ``propagate`` holds) are exactly one :class:`logging.StreamHandler` or
   :class:`logging.FileHandler` (not a subclass) with no filters, a level at or below the line's, an open stream
   and a formatter of type :class:`~ambit.telemetry.log_format.LogFormatter`. The check is made per line, so a
   handler added or removed at run time is followed at once (pending lines are written first).
3. A direct line is ``formatter.line_prefix(now, level, name) + line + handler.terminator``: byte for byte what
   the handler would write for that record. Its time is when it was written, not when it was flushed.
4. Direct lines wait in one batch, written with one ``write`` and one ``flush`` under the handler's lock at the
   end of the current event-loop iteration (a ``call_soon``), or at once when no loop runs. The batch holds at
   most ``max_pending`` characters: a line past that is dropped and counted (:attr:`AccessSink.dropped`), never
   waited for; the next flush reports the drops in one WARNING line of the sink's logger.
5. :meth:`AccessSink.flush` writes the batch now; the process calls it when it stops, and a finalizer does at
   interpreter exit, so a clean stop loses no line. A write that fails (a closed stream, a full disk) drops the
   batch and counts its lines; it never raises into the request that wrote the line.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ambit.telemetry.log_format import LogFormatter

__all__ = ["MAX_PENDING_CHARS", "AccessSink"]

MAX_PENDING_CHARS = 256 * 1024
"""The most text one batch holds between flushes (rule 4): some 800 request lines in one loop iteration."""
_DIRECT_HANDLERS = (logging.StreamHandler, logging.FileHandler)


@dataclass(slots=True)
class _Batch:
    """The lines waiting for the next flush, and the handler whose stream they go to."""

    lines: list[str] = field(default_factory=list)
    size: int = 0
    handler: logging.StreamHandler[Any] | None = None
    dropped: int = 0
    """Lines dropped since the last flush (reported by it)."""


def _write_batch(batch: _Batch) -> int:
    """Write and forget the batch; the number of lines lost because the write failed (rule 5)."""
    lines, handler = batch.lines, batch.handler
    if not lines or handler is None:
        return 0
    text = "".join(lines)
    count = len(lines)
    batch.lines, batch.size, batch.handler = [], 0, None
    handler.acquire()
    try:
        stream = handler.stream
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):
        return count
    finally:
        handler.release()
    return 0


class AccessSink:
    """One logger's access lines; see the module rules."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        max_pending: int = MAX_PENDING_CHARS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._logger = logger
        self._max_pending = max_pending
        self._clock = clock
        self._batch = _Batch()
        self._scheduled = False
        self.dropped = 0
        """Lines dropped so far (rules 4 and 5)."""
        self.at_exit = weakref.finalize(self, _write_batch, self._batch)
        """Writes what waits when the interpreter exits (rule 5), or when called."""

    @property
    def logger(self) -> logging.Logger:
        return self._logger

    def enabled(self, level: int) -> bool:
        """Rule 1: whether a line of ``level`` would be written (format it only then)."""
        return self._logger.isEnabledFor(level)

    def emit(self, level: int, line: str) -> None:
        """Write ``line`` at ``level``: directly and batched when rule 2 allows, else through ``logging``."""
        logger = self._logger
        handler = self._direct_handler(level)
        if handler is None:
            if self._batch.lines:
                self.flush()
            logger.handle(logger.makeRecord(logger.name, level, __file__, 0, line, (), None, "emit"))
            return
        batch = self._batch
        if batch.handler is not handler and batch.lines:
            self.flush()
        formatter = handler.formatter
        assert isinstance(formatter, LogFormatter)
        text = formatter.line_prefix(self._clock(), level, logger.name) + line + handler.terminator
        if batch.size + len(text) > self._max_pending:
            batch.dropped += 1
            self.dropped += 1
            return
        batch.lines.append(text)
        batch.size += len(text)
        batch.handler = handler
        if not self._scheduled:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.flush()
                return
            self._scheduled = True
            loop.call_soon(self._flush_scheduled)

    def _flush_scheduled(self) -> None:
        self._scheduled = False
        self.flush()

    def flush(self) -> None:
        """Rule 5: write what waits now."""
        batch = self._batch
        lost = _write_batch(batch)
        self.dropped += lost
        dropped, batch.dropped = batch.dropped + lost, 0
        if dropped:
            logging.getLogger(__name__).warning(
                "access log: %d lines dropped (more than %d characters waited in one loop iteration, or the write "
                "failed)",
                dropped,
                self._max_pending,
            )

    def _direct_handler(self, level: int) -> logging.StreamHandler[Any] | None:
        """Rule 2: the one plain stream handler the logger's records would reach, or None."""
        logger: logging.Logger | None = self._logger
        assert logger is not None
        if logger.disabled or logger.filters:
            return None
        found: logging.Handler | None = None
        while logger is not None:
            for handler in logger.handlers:
                if found is not None:
                    return None
                found = handler
            if not logger.propagate:
                break
            logger = logger.parent
        if (
            found is None
            or type(found) not in _DIRECT_HANDLERS
            or found.filters
            or found.level > level
            or type(found.formatter) is not LogFormatter
        ):
            return None
        assert isinstance(found, logging.StreamHandler)
        return found if found.stream is not None else None
