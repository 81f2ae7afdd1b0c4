"""The topology page's metrics scraper: each proxy's ``/metrics``, read as Prometheus reads it, into a rate book.

Theory of operation
-------------------
:class:`MetricsScraper` asks its ``targets`` callable for ``(name, URL)`` pairs (the lab's node proxies and
waypoints, or the ``--metrics-url`` ones), GETs each URL every ``interval`` seconds and gives each body it could
read to :func:`ambit.telemetry.rates.read_scrape` and the :class:`~ambit.telemetry.rates.RateBook` (with the time
the scrape ended). The rates themselves are the pure module's. Rules:

1. At most :data:`MAX_CONCURRENT` scrapes run at once; each is one bounded GET (:mod:`ambit.httpfetch`: one
   deadline of ``within`` seconds for connecting and the whole body, at most :data:`MAX_BODY` bytes, no redirects)
   and a parse in a worker thread (at most :data:`MAX_CONCURRENT` threads, and :data:`~ambit.telemetry.rates.
   MAX_SERIES` samples, so a huge body costs bounded time and never stalls the page's event loop).
2. A target that cannot be read (unreachable, slow, too large, not Prometheus text) is reported in its source
   status (``metrics <name>``) with one line, and adds no interval: its edges keep their last rates until the
   window passes them. A target that is no longer listed is forgotten.
3. At most :data:`MAX_TARGETS` targets are scraped; more are reported and left out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import aiohttp

from ambit.httpfetch import HttpFetchError, fetch_body
from ambit.telemetry.rates import ScrapeError, read_scrape

if TYPE_CHECKING:
    from ambit.observe.dashboard import DashboardState

MAX_CONCURRENT = 8
MAX_BODY = 8 * 1024 * 1024
MAX_TARGETS = 500

Targets = Callable[[], Awaitable[Sequence[tuple[str, str]]]]
"""``(name, metrics URL)`` of each proxy to scrape now."""


class MetricsScraper:
    """Rules 1 to 3: scrapes every target each ``interval`` seconds into ``state.rates``."""

    def __init__(self, targets: Targets, *, interval: float = 1.0, within: float = 5.0) -> None:
        self.targets = targets
        self.interval = interval
        self.within = within
        self._slots = asyncio.Semaphore(MAX_CONCURRENT)

    async def run(self, state: DashboardState) -> None:
        known: set[str] = set()
        async with aiohttp.ClientSession(trust_env=False) as session:
            while True:
                await self.scrape_all(state, session, known)
                await asyncio.sleep(self.interval)

    async def scrape_all(self, state: DashboardState, session: aiohttp.ClientSession, known: set[str]) -> None:
        listing = state.status("metrics targets")
        try:
            targets = list(await self.targets())
            listing.error = ""
        except (OSError, ValueError) as exc:
            listing.error = (str(exc) or type(exc).__name__)[:500]
            return
        if len(targets) > MAX_TARGETS:
            listing.error = f"{len(targets)} targets, only the first {MAX_TARGETS} scraped"
            targets = targets[:MAX_TARGETS]
        names = {name for name, _ in targets}
        for gone in known - names:
            state.rates.forget(gone)
            state.sources.pop(f"metrics {gone}", None)
        known.clear()
        known.update(names)
        await asyncio.gather(*(self.scrape(state, session, name, url) for name, url in targets))

    async def scrape(self, state: DashboardState, session: aiohttp.ClientSession, name: str, url: str) -> None:
        status = state.status(f"metrics {name}")
        async with self._slots:
            try:
                body = await fetch_body(session, url, within=self.within, max_bytes=MAX_BODY)
                series = await asyncio.to_thread(read_scrape, body)
            except (HttpFetchError, ScrapeError) as exc:
                status.error = str(exc)[:500]
                return
        now = state.clock()
        state.rates.observe(name, now, series)
        status.error, status.last_ok = "", now


def fixed_targets(targets: Sequence[tuple[str, str]]) -> Targets:
    """The same targets every time (``--metrics-url``)."""
    chosen = list(targets)

    async def listing() -> Sequence[tuple[str, str]]:
        return chosen

    return listing


__all__ = ["MAX_BODY", "MAX_CONCURRENT", "MAX_TARGETS", "MetricsScraper", "Targets", "fixed_targets"]
