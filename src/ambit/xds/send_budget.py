"""How many large responses the xDS server writes at once across all its streams (issue 22's initial sync).

Theory of operation: a stream's write waits until its client's HTTP/2 window took the message, and until then
gRPC holds a copy of it. One stream thus holds at most one response (a client that stops reading stalls only its
own stream), but a thousand node proxies opening at once would each be handed a whole wildcard answer (~18 MiB at
100,000 workloads) at the same moment, and the control plane's memory would peak at their sum. A
:class:`SendBudget` lets :attr:`SendBudgetSettings.slots` large writes run at once; the others wait their turn.

Rules:

1. A write smaller than :attr:`SendBudgetSettings.large` bytes (a push of a few changes) never waits.
2. A large write takes a slot, first come first served, and gives it back when it is done.
3. A large write still running after :attr:`SendBudgetSettings.stall` seconds gives its slot back and goes on
   without one, so that a client that stopped reading holds its own message, not the others' turn, as long as the
   bytes of the writes that gave their slot back stay within :attr:`SendBudgetSettings.stalled_bytes`; past that
   it keeps its slot until it is done. Memory is then bounded by ``slots`` messages plus ``stalled_bytes``. (Before
   the bound, 1,000 clients slower to parse an 18 MiB answer than 2 s each had the control plane hold ~5 GiB of
   copies at once, issue 22.) A client that never reads again keeps its slot until its stream ends (keepalive
   ends a dead peer); ``slots`` of them at once would hold up every large write.
4. Cancelling the caller cancels its write; a write's failure is the caller's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass

__all__ = ["DEFAULT_SEND_BUDGET", "SendBudget", "SendBudgetSettings"]


@dataclass(frozen=True, slots=True)
class SendBudgetSettings:
    """Limits of a :class:`SendBudget`."""

    slots: int = 8
    """Large writes at once, across all streams."""
    large: int = 1024 * 1024
    """Bytes from which a write needs a slot (rule 1)."""
    stall: float = 2.0
    """Seconds after which a large write gives its slot back (rule 3)."""
    stalled_bytes: int = 256 * 1024 * 1024
    """Bytes of the writes that gave their slot back, at most (rule 3)."""


DEFAULT_SEND_BUDGET = SendBudgetSettings()


class SendBudget:
    """The server's shared limit on large writes in flight (rules 1-4)."""

    __slots__ = ("_settings", "_slots", "stalled", "waited")

    def __init__(self, settings: SendBudgetSettings = DEFAULT_SEND_BUDGET) -> None:
        self._settings = settings
        self._slots = asyncio.Semaphore(settings.slots)
        self.waited = 0
        """Large writes that found every slot taken."""
        self.stalled = 0
        """Bytes of the writes running without a slot now (rule 3)."""

    async def write(self, size: int, write: Awaitable[None]) -> None:
        """Carry out ``write`` (of ``size`` bytes) within the budget."""
        if size < self._settings.large:
            await write
            return
        if self._slots.locked():
            self.waited += 1
        settings, without_slot = self._settings, 0
        async with self._slots:
            task = asyncio.ensure_future(write)
            try:
                await asyncio.wait((task,), timeout=settings.stall)
                while not task.done() and self.stalled + size > settings.stalled_bytes:
                    await asyncio.wait((task,), timeout=settings.stall)  # over the bound: keep the slot
            except BaseException:
                task.cancel()
                raise
            if not task.done():
                without_slot = size
                self.stalled += size
        try:
            await task
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            self.stalled -= without_slot
