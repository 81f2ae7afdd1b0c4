"""The mesh processes' log line format: ``<date> <time>,<ms> <LEVEL> <logger>: <message>``.

:class:`LogFormatter` is the standard :class:`logging.Formatter` of :data:`LOG_FORMAT`, with each second's date
and time formatted once rather than once per record, and :meth:`LogFormatter.line_prefix`: the text it puts
before a message, for writers that make a line without a :class:`logging.LogRecord`
(:mod:`ambit.telemetry.access_sink`). Rules:

1. ``format(record)`` is exactly ``logging.Formatter(LOG_FORMAT).format(record)``.
2. ``line_prefix(created, level, name) + message`` is exactly what ``format`` gives for a record of that level,
   logger name and creation time, carrying ``message`` without arguments, exception or stack.
"""

from __future__ import annotations

import logging
import time

__all__ = ["LOG_FORMAT", "LogFormatter"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LogFormatter(logging.Formatter):
    """:data:`LOG_FORMAT`'s formatter; see the module rules."""

    def __init__(self) -> None:
        super().__init__(LOG_FORMAT)
        self._second = -1
        self._second_text = ""

    def _second_of(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._second_text = time.strftime(self.default_time_format, self.converter(created))
            self._second = second
        return self._second_text

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt or not self.default_msec_format:
            return super().formatTime(record, datefmt)
        return self.default_msec_format % (self._second_of(record.created), record.msecs)

    def line_prefix(self, created: float, level: int, name: str) -> str:
        """Rule 2: what precedes the message of a record made at ``created`` (``time.time()``)."""
        msecs = int((created - int(created)) * 1000)  # as LogRecord computes it
        stamp = (self.default_msec_format or "%s,%03d") % (self._second_of(created), msecs)
        return f"{stamp} {logging.getLevelName(level)} {name}: "
