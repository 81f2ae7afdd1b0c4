"""The waypoint's errors: :class:`WaypointError` and its subtree (see :mod:`ambit.errors`).

- :class:`HttpProtocolError`: a peer sent HTTP the waypoint cannot accept (blame: the peer); ``status`` is the
  answer a downstream client gets (400, 431), ``upstream`` says the far side was the culprit.
- :class:`HelloRefusedError`: a client of a TLS passthrough listener sent no ClientHello the gateway can route
  by (blame: the peer).
- :class:`WaypointSettingsError`: the process was started with settings that cannot work (local misuse).
"""

from __future__ import annotations

from ambit.errors import AmbitError


class WaypointError(AmbitError):
    """Base class of the waypoint's errors."""


class HttpProtocolError(WaypointError):
    """A peer broke HTTP/1.1 (malformed head, oversized head, bad framing)."""

    def __init__(self, reason: str, status: int = 400, *, upstream: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.upstream = upstream


class HelloRefusedError(WaypointError):
    """A TLS passthrough client sent a malformed or oversized ClientHello, or none in time."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class WaypointSettingsError(WaypointError):
    """The waypoint's settings are incomplete or inconsistent."""
