"""Long-lived tasks of the daemons: how they survive a failed iteration, and how their end is seen at once.

Theory of operation: asyncio keeps the exception of a finished task inside the task and reports it, at best, when
the task is garbage-collected; a daemon whose loop died that way runs on half-alive (a node proxy that no longer
talks to its node agent takes no pod). Two tools keep that from happening silently:

1. A loop that may fail in one iteration (a poll of a file or directory, one peer's connection) catches around that
   iteration, logs one line, and goes on after its interval: :func:`poll_every`. Only cancellation ends it.
2. A failure that repeats is logged once, not at every poll: the next line is logged when the message changes or
   after a success (``... works again``).
3. Every long-lived task gets :func:`watch` as a done callback: an end by an exception is logged at once, with its
   traceback, naming the task; an end by cancellation is not logged.
4. A task the process is useless without is *essential*: :func:`watch` with ``on_failure`` also tells its owner,
   for any end but cancellation (a clean return of a loop meant to run forever too), and the owner stops the
   daemon, which exits non-zero so that its supervisor (the kubelet) starts it again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ambit.errors import AmbitError

log = logging.getLogger("ambit.supervision")


class TaskEndedError(AmbitError):
    """An essential task ended other than by cancellation (rule 4); the message names it and says why."""


def watch(task: asyncio.Task[None], on_failure: Callable[[TaskEndedError], None] | None = None) -> asyncio.Task[None]:
    """Log ``task``'s end by an exception at once (rule 3); with ``on_failure`` the task is essential (rule 4)."""

    def done(finished: asyncio.Task[None]) -> None:
        if finished.cancelled():
            return
        exc = finished.exception()
        if exc is not None:
            log.error("task %r ended by an error: %r", finished.get_name(), exc, exc_info=exc)
            error = TaskEndedError(f"task {finished.get_name()!r} ended by an error: {exc!r}")
        elif on_failure is not None:
            log.error("task %r ended; it should run until the process stops", finished.get_name())
            error = TaskEndedError(f"task {finished.get_name()!r} ended")
        else:
            return
        if on_failure is not None:
            on_failure(error)

    task.add_done_callback(done)
    return task


async def poll_every(interval: float, poll: Callable[[], object], what: str) -> None:
    """Call ``poll`` every ``interval`` seconds until cancelled, first at once; an error of one call is logged
    (rules 1 and 2) and the next call comes after the interval as usual."""
    failing = ""
    while True:
        try:
            poll()
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            if message != failing:
                # A defect gets its traceback; an OSError (a file, a directory) is one clear line.
                log.error("%s failed: %s", what, message, exc_info=None if isinstance(exc, OSError) else exc)
            failing = message
        else:
            if failing:
                log.info("%s works again", what)
            failing = ""
        await asyncio.sleep(interval)
