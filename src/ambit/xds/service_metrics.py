"""What the delta ADS service reports: an injected observer for metrics, and counters of its own.

Theory of operation: an injected :class:`XdsObserver` (the control plane's monitoring; :data:`NO_OBSERVER` by
default) is told of each authenticated stream (connected at its first request, with the proxy version its node
states, and disconnected when it ends), of each response of a served type (the time from asking the session to the
end of the write, and the response's size), of each write's duration, of each push round (the types it pushed, and
the time from the first change to the last write, measured from
:attr:`~ambit.xds.service.XdsService.change_started` when the owner set it, else from when the stream heard of the
change), of NACKs, of ACKs of a nonce no longer in flight, and of streams that failed. Each call is a counter or
histogram update; nothing is built per response for it. Only served types are reported: a type URL a client makes
up never becomes a label value (a client could otherwise grow the series). :class:`XdsStats` are the service's own
counters, for tests and the admin endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

__all__ = ["NO_OBSERVER", "XdsObserver", "XdsStats"]


class XdsObserver(Protocol):
    """What the server reports for metrics (istiod's ``pilot_xds*`` series; see the module docstring)."""

    def client_connected(self, version: str) -> None: ...
    def client_disconnected(self, version: str) -> None: ...
    def response_written(self, type_url: str, seconds: float) -> None: ...
    def write_took(self, seconds: float) -> None: ...
    def config_sent(self, type_url: str, size: int) -> None: ...
    def push_round(self, changed: Mapping[str, int], converged: float | None) -> None: ...
    def rejected(self, type_url: str) -> None: ...
    def nonce_expired(self, type_url: str) -> None: ...
    def stream_failed(self) -> None: ...


class _NoObserver:
    def client_connected(self, version: str) -> None:
        pass

    def client_disconnected(self, version: str) -> None:
        pass

    def response_written(self, type_url: str, seconds: float) -> None:
        pass

    def write_took(self, seconds: float) -> None:
        pass

    def config_sent(self, type_url: str, size: int) -> None:
        pass

    def push_round(self, changed: Mapping[str, int], converged: float | None) -> None:
        pass

    def rejected(self, type_url: str) -> None:
        pass

    def nonce_expired(self, type_url: str) -> None:
        pass

    def stream_failed(self) -> None:
        pass


NO_OBSERVER: XdsObserver = _NoObserver()


@dataclass(slots=True)
class XdsStats:
    """Counters for tests, metrics and the admin endpoint."""

    streams: int = 0
    unauthenticated: int = 0
    acks: int = 0
    nacks: int = 0
    pushes: int = 0
    stream_errors: int = 0
    debug_answers: int = 0
    debug_refused: int = 0
    refused: int = 0
    """Streams refused by admission (overload)."""
    oversized: int = 0
    """Responses larger than a node proxy accepts (:data:`~ambit.xds.frames.LARGEST_CLIENT_MESSAGE`)."""
    trims: int = 0
    """Times the allocator's free memory was given back after a burst of openings (:mod:`ambit.xds.server_trim`)."""
    trim_seconds: float = 0.0
    """How long the last of those took (on a worker thread)."""
