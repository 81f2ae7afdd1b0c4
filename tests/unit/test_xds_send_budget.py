"""The xDS server's budget of large writes in flight: small writes pass, large ones take turns, a stalled one gives
its turn back, and cancelling a caller cancels its write."""

from __future__ import annotations

import asyncio

import pytest

from ambit.xds.send_budget import SendBudget, SendBudgetSettings

MIB = 1024 * 1024


class Writes:
    """Writes that finish when the test says, recording how many run at once."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.gates: list[asyncio.Event] = []

    async def write(self, gate: asyncio.Event) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await gate.wait()
        finally:
            self.running -= 1

    def start(self, budget: SendBudget, size: int) -> asyncio.Task[None]:
        gate = asyncio.Event()
        self.gates.append(gate)
        return asyncio.create_task(budget.write(size, self.write(gate)))


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_large_writes_take_turns_and_small_ones_never_wait() -> None:
    budget, writes = SendBudget(SendBudgetSettings(slots=2, large=MIB, stall=60.0)), Writes()
    large = [writes.start(budget, 2 * MIB) for _ in range(5)]
    small = [writes.start(budget, 100) for _ in range(3)]
    await _settle()
    assert writes.running == 2 + 3 and budget.waited == 3
    for gate in writes.gates[5:]:
        gate.set()
    await asyncio.gather(*small)
    for gate in writes.gates[:5]:
        gate.set()
        await _settle()
    await asyncio.gather(*large)
    assert writes.most == 5  # two large and three small at once, never more large than the slots


async def test_a_stalled_large_write_gives_its_slot_back_and_goes_on() -> None:
    budget, writes = SendBudget(SendBudgetSettings(slots=1, large=MIB, stall=0.05)), Writes()
    stalled = writes.start(budget, MIB)
    await _settle()
    after = writes.start(budget, MIB)
    await _settle()
    assert writes.running == 1  # the second waits for the slot
    await asyncio.sleep(0.1)
    assert writes.running == 2 and not stalled.done()  # the stalled one gave the slot back, still writing
    writes.gates[1].set()
    await after
    writes.gates[0].set()
    await stalled


async def test_cancelling_the_caller_cancels_its_write_and_frees_its_slot() -> None:
    budget, writes = SendBudget(SendBudgetSettings(slots=1, large=MIB, stall=60.0)), Writes()
    first = writes.start(budget, MIB)
    await _settle()
    waiting = writes.start(budget, MIB)
    await _settle()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await _settle()
    assert writes.running == 1  # the waiting write got the slot
    writes.gates[1].set()
    await waiting
    assert writes.running == 0


async def test_a_failed_write_is_the_callers() -> None:
    budget = SendBudget(SendBudgetSettings(slots=1, large=MIB))

    async def failing() -> None:
        raise ConnectionError("stream reset")

    with pytest.raises(ConnectionError):
        await budget.write(MIB, failing())
    await budget.write(MIB, asyncio.sleep(0))  # the slot was given back


async def test_stalled_writes_give_their_slot_back_only_within_the_byte_bound() -> None:
    settings = SendBudgetSettings(slots=1, large=MIB, stall=0.05, stalled_bytes=3 * MIB)
    budget, writes = SendBudget(settings), Writes()
    first = writes.start(budget, 2 * MIB)
    second = writes.start(budget, 2 * MIB)
    third = writes.start(budget, 2 * MIB)
    await asyncio.sleep(0.2)
    # The first stalled and gave its slot back (2 MiB without a slot); the second may not (4 MiB > 3): it keeps
    # the slot, and the third waits for it.
    assert writes.running == 2 and budget.stalled == 2 * MIB
    writes.gates[0].set()
    await first
    await asyncio.sleep(0.2)  # now the second's bytes fit: it gives the slot back and the third starts
    assert writes.running == 2 and budget.stalled == 2 * MIB
    writes.gates[1].set()
    writes.gates[2].set()
    await asyncio.gather(second, third)
    assert budget.stalled == 0 and writes.most == 2
