"""The mesh processes' logging set-up: one line per record, to stderr or a file."""

from __future__ import annotations

import logging
import time
from pathlib import Path

__all__ = ["LOG_FORMAT", "LogFormatter", "configure_logging"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LogFormatter(logging.Formatter):
    """:data:`LOG_FORMAT`'s formatter, with each second's date and time formatted once, not once per record.

    The node proxy writes an access-log line per connection, so ``localtime`` plus ``strftime`` per line would
    count in its cost per connection. The text is the standard formatter's exactly.
    """

    def __init__(self) -> None:
        super().__init__(LOG_FORMAT)
        self._second = -1
        self._second_text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt or not self.default_msec_format:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:
            self._second_text = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = second
        return self.default_msec_format % (self._second_text, record.msecs)


def configure_logging(filename: Path | None = None) -> None:
    """The mesh processes' logging: INFO and up to stderr (or ``filename``), one line per record.

    Log records skip what no line shows: the process id (a ``getpid`` system call per record), the thread and the
    multiprocessing process name. The node proxy makes a record per connection (the access log).
    """
    logging.logProcesses = logging.logThreads = logging.logMultiprocessing = False
    handler: logging.Handler = logging.StreamHandler() if filename is None else logging.FileHandler(filename)
    handler.setFormatter(LogFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
