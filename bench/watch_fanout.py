"""Watch fan-out: W concurrent watches, then a burst of K creates; when has every watcher seen every create?

All watches are open (response headers received) before the first write. Each watcher records when each of the
K names arrived; a write's acknowledgement time is when its 201 reached the writer. Delivery latency is arrival
minus acknowledgement, so it can be slightly negative when an event overtakes the writer's own response.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from bench.kube_client import CreateRun, Endpoint, create_pods, follow_watch


class FanoutError(RuntimeError):
    """The watches could not be opened."""


@dataclass
class FanoutResult:
    watchers: int
    events: int
    writes: CreateRun
    delivered: int = 0
    incomplete_watchers: int = 0
    until_all_delivered: float = float("nan")
    """Seconds from the first write to the last watcher receiving its last event."""
    latencies: list[float] = field(default_factory=list)

    @property
    def delivery_rate(self) -> float:
        return self.delivered / self.until_all_delivered if self.until_all_delivered > 0 else 0.0


async def fan_out(
    endpoint: Endpoint,
    watch_path: str,
    namespace: str,
    *,
    watchers: int,
    events: int,
    writers: int,
    prefix: str,
    patience: float = 300.0,
) -> FanoutResult:
    names = [f"{prefix}-{i:05d}" for i in range(events)]
    want = frozenset(names)
    opened = 0
    all_open = asyncio.Event()

    def on_open() -> None:
        nonlocal opened
        opened += 1
        if opened == watchers:
            all_open.set()

    async with endpoint.session(watchers) as session:
        tasks = [
            asyncio.create_task(follow_watch(session, watch_path, want, on_open), name=f"bench watcher {i}")
            for i in range(watchers)
        ]
        try:
            try:
                await asyncio.wait_for(all_open.wait(), 60)
            except TimeoutError:
                failed = [t.exception() for t in tasks if t.done() and not t.cancelled()]
                raise FanoutError(f"only {opened}/{watchers} watches opened; {failed[:1]}") from None
            began = time.monotonic()
            writes = await create_pods(endpoint, namespace, names, clients=writers)
            done, _ = await asyncio.wait(tasks, timeout=patience)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    result = FanoutResult(watchers, events, writes)
    last_arrival = began
    for task in tasks:
        seen = task.result() if task in done and task.exception() is None else {}
        result.delivered += len(seen)
        if len(seen) < events:
            result.incomplete_watchers += 1
        for name, arrived in seen.items():
            last_arrival = max(last_arrival, arrived)
            ack = writes.acked.get(name)
            if ack is not None:
                result.latencies.append(arrived - ack[0])
    if result.incomplete_watchers == 0:
        result.until_all_delivered = last_arrival - began
    return result
