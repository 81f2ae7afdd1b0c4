"""What the waypoint's HTTP/1.1 sides (:mod:`ambit.waypoint.http1`) say happened: a message head, body pieces and
the end of a message, or a :class:`Signal` (feed more bytes, wait for the other side, the peer closed).

The same events carry a request taken over HTTP/2 (:mod:`ambit.waypoint.http2`), so the exchange
(:mod:`ambit.waypoint.exchange`) handles one vocabulary whatever the downstream protocol.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ambit.waypoint.decisions import RequestHead

Headers = tuple[tuple[str, str], ...]


class Signal(enum.Enum):
    NEED_DATA = "need data"
    """Feed more bytes (``receive_data``; ``b""`` is EOF)."""
    PAUSED = "paused"
    """A message is complete and the other side must act first (answer it, or finish the upgrade)."""
    CLOSED = "closed"
    """The peer closed the connection cleanly between messages."""


@dataclass(frozen=True, slots=True)
class RequestStarted:
    head: RequestHead
    version: str
    """``"1.1"`` or ``"1.0"``; ``"2"`` for a request taken over HTTP/2."""
    upgrade: bool
    """The request asks to switch protocols (``Connection: upgrade`` and ``Upgrade``)."""
    has_body: bool


@dataclass(frozen=True, slots=True)
class ResponseStarted:
    status: int
    headers: Headers
    reason: str = ""


@dataclass(frozen=True, slots=True)
class InterimResponse:
    """A 1xx answer other than 100 (which the waypoint handles itself); 101 switches protocols."""

    status: int
    headers: Headers


@dataclass(frozen=True, slots=True)
class BodyData:
    data: bytes


@dataclass(frozen=True, slots=True)
class MessageEnded:
    trailers: Headers = ()


Event = RequestStarted | ResponseStarted | InterimResponse | BodyData | MessageEnded | Signal
