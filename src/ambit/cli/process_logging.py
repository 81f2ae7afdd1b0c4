"""The mesh processes' logging set-up: one line per record, to stderr or a file."""

from __future__ import annotations

import logging
from pathlib import Path

from ambit.telemetry.log_format import LOG_FORMAT, LogFormatter

__all__ = ["LOG_FORMAT", "LogFormatter", "configure_logging"]


def configure_logging(filename: Path | None = None) -> None:
    """The mesh processes' logging: INFO and up to stderr (or ``filename``), one line per record.

    Log records skip what no line shows: the process id (a ``getpid`` system call per record), the thread and the
    multiprocessing process name. The node proxy makes a record per connection (the access log).
    """
    logging.logProcesses = logging.logThreads = logging.logMultiprocessing = False
    handler: logging.Handler = logging.StreamHandler() if filename is None else logging.FileHandler(filename)
    handler.setFormatter(LogFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
