"""What one xDS stream has yet to push, when its pusher pushes it, and how a write to the stream fails.

Theory of operation: each stream's :class:`Changes` listens to every served
:class:`~ambit.xds.table.ResourceSource` and collects the changed names per type, remembering since when the oldest
of them waited (the owner's :attr:`~ambit.xds.service.XdsService.change_started` when it set it, else when the
stream heard of the change). The stream's pusher waits in :meth:`Changes.settled` until changes have been quiet for
``debounce`` seconds (at most ``max_debounce`` after the first), then pushes each type that changed. A write to the
stream that fails (the client went away, or gRPC ended the call) raises :class:`StreamWriteError`, which the service
tells apart from a defect: one line in the log, not a traceback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from typing import Any

from ambit.api import discovery_pb2 as dpb
from ambit.xds.frames import Frame

__all__ = ["Changes", "StreamWriteError", "write_response"]


class StreamWriteError(Exception):
    """A push could not be written to its stream: the client went away, or gRPC ended the call (not a defect)."""


async def write_response(context: Any, response: Frame | dpb.DeltaDiscoveryResponse) -> None:
    try:
        await context.write(response)
    except Exception as exc:  # grpc's own types (ExecuteBatchError, UsageError...) are not all public
        raise StreamWriteError(f"{type(exc).__name__}: {exc}") from exc


class Changes:
    """What one stream has yet to push: the changed names per type, since when, and the event that wakes it."""

    __slots__ = ("_began", "names", "since", "wake")

    def __init__(self, type_urls: Collection[str], began: Callable[[], float]) -> None:
        """``began`` tells, when a change arrives with none waiting, since when it waits."""
        self.names: dict[str, set[str]] = {type_url: set() for type_url in type_urls}
        self.since: float | None = None
        """When the oldest change not yet pushed began (see :attr:`~ambit.xds.service.XdsService.change_started`)."""
        self.wake = asyncio.Event()
        self._began = began

    def listener(self, type_url: str) -> Callable[[frozenset[str]], None]:
        names = self.names[type_url]

        def on_change(changed: frozenset[str]) -> None:
            names.update(changed)
            if self.since is None:
                self.since = self._began()
            self.wake.set()

        return on_change

    async def settled(self, debounce: float, max_debounce: float) -> float | None:
        """Wait for a change, then until changes have been quiet for ``debounce`` seconds, or ``max_debounce`` after
        the first; return since when the oldest of them waited (:attr:`since`, which starts over)."""
        loop = asyncio.get_running_loop()
        wake = self.wake
        await wake.wait()
        deadline = loop.time() + max_debounce
        while True:
            wake.clear()
            quiet = min(debounce, deadline - loop.time())
            if quiet <= 0:
                break
            try:
                await asyncio.wait_for(wake.wait(), quiet)
            except TimeoutError:
                break
        wake.clear()
        since, self.since = self.since, None
        return since
