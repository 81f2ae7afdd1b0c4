"""Bounds in time on the reads and writes of one connection side, with one timer for many of them.

Theory of operation: a waypoint connection bounds each read and each write in time (``idle_timeout``, and a
request head's ``head_timeout``). ``asyncio.timeout`` around each one arms and cancels a timer handle per
operation, several per request. An :class:`OperationBound` keeps one: an operation only notes its due time
(``loop.time() + seconds``) and the task that waits, and a timer handle, armed when none is, looks at the
operation in progress when it fires. Rules:

1. :meth:`OperationBound.run` awaits one operation; it raises :class:`TimeoutError` when the operation has not
   finished ``seconds`` after it began, and cancels it; otherwise it returns what the operation returned
   or raises what it raised. Cancellation from elsewhere is passed on unchanged (as ``asyncio.timeout`` does: the
   task's cancel count tells ours from theirs).
2. At most one timer handle is alive per bound. An operation arms it only when none is armed, or when the armed one
   is due after the operation is (a shorter limit); a handle that fires early for the operation in progress (it
   was armed for an earlier one) arms itself again for that operation's due time; one that fires while no
   operation is in progress arms nothing. So a busy connection sets about one timer per ``idle_timeout``,
   whatever its request rate.
3. One operation at a time: a second task that runs an operation while another's is in progress gets a plain
   ``asyncio.timeout`` of its own (correct, not cheaper). A connection side uses one bound for its reads and one
   for its writes, which a duplex exchange does at once from two tasks.
4. :meth:`OperationBound.close` cancels the handle; a connection calls it when it ends. A handle left behind (a
   pooled connection dropped without it) fires once, finds nothing in progress and arms nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["OperationBound"]

T = TypeVar("T")


class OperationBound:
    """Each operation run through it may take at most the seconds it is run with (see the module rules)."""

    __slots__ = ("_due", "_expired", "_handle", "_loop", "_task")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[object] | None = None
        self._due = 0.0
        self._expired = False

    async def run(self, operation: Awaitable[T], seconds: float) -> T:
        """Await ``operation`` within ``seconds``; rule 1."""
        if self._task is not None:  # rule 3
            async with asyncio.timeout(seconds):
                return await operation
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None
        due = loop.time() + seconds
        handle = self._handle
        if handle is None or handle.when() > due:  # rule 2
            if handle is not None:
                handle.cancel()
            self._handle = loop.call_at(due, self._check)
        self._task, self._due, self._expired = task, due, False
        cancelling = task.cancelling()
        try:
            return await operation
        except asyncio.CancelledError:
            if self._expired and task.uncancel() <= cancelling:
                raise TimeoutError from None
            raise
        finally:
            self._task = None

    def _check(self) -> None:
        self._handle = None
        task = self._task
        if task is None:
            return  # nothing in progress: the next operation arms anew
        loop = self._loop
        assert loop is not None
        if loop.time() < self._due:
            self._handle = loop.call_at(self._due, self._check)
            return
        self._expired = True
        task.cancel()

    def close(self) -> None:
        """Rule 4: cancel the handle (an operation in progress is no longer bounded)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
