"""The drain signal of one proxy process: who must hear that it is going away (ztunnel's ``DrainWatcher``).

Theory of operation: a :class:`DrainSignal` is raised once (:meth:`DrainSignal.start`) when the process starts its
graceful drain. Long-lived parts that must change behaviour then (each accepted HBONE connection says GOAWAY, so its
client opens new tunnels elsewhere while the tunnels in flight go on) register a callback with :meth:`watch` while
they live and drop it when they end. Synchronous and pure: callbacks run inside :meth:`start`, in registration
order; one raising does not keep the others from running (it is logged by the caller's loop, not here).

Rules:

1. :meth:`start` runs every registered callback once; later calls do nothing.
2. :meth:`watch` after the start runs the callback at once (a connection accepted in the last instant still hears
   the drain) and returns a no-op canceller.
3. A cancelled callback is never run.
"""

from __future__ import annotations

from collections.abc import Callable


class DrainSignal:
    """Raised once when the proxy starts draining; see the module docstring."""

    __slots__ = ("_callbacks", "_next", "started")

    def __init__(self) -> None:
        self.started = False
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._next = 0

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` when the drain starts (now, if it has); returns what cancels that."""
        if self.started:  # rule 2
            callback()
            return _nothing
        key = self._next
        self._next += 1
        self._callbacks[key] = callback

        def cancel() -> None:  # rule 3
            self._callbacks.pop(key, None)

        return cancel

    def start(self) -> list[BaseException]:
        """Start the drain (rule 1); returns what callbacks raised, for the caller to log."""
        if self.started:
            return []
        self.started = True
        callbacks, self._callbacks = list(self._callbacks.values()), {}
        failures: list[BaseException] = []
        for callback in callbacks:
            try:
                callback()
            except Exception as exc:  # one part's bug must not keep the others from draining
                failures.append(exc)
        return failures

    @property
    def watchers(self) -> int:
        return len(self._callbacks)


def _nothing() -> None:
    return None
