"""The request body an external authorizer is sent (``includeRequestBodyInCheck``, Envoy's ``with_request_body``):
read ahead of the check, then handed on untouched.

Theory of operation: :func:`read_ahead` tells a client waiting for ``100 Continue`` to send, reads the client's
body events until the body ends or :attr:`~ambit.model.extauthz.ExtAuthzProvider.max_request_bytes` bytes have come,
and returns them as a :class:`ReadAhead`: the bytes for the check, whether the body was longer (or broke off), and
a :class:`ReplayingSide` that gives the read events again, in order, before reading on from the client. The
forwarding (or a local answer's drain) reads through that side as it would through the client's own.

Rules:

1. At most ``max_request_bytes`` (itself at most :data:`~ambit.model.extauthz.MAX_CHECK_BODY`) plus one read's
   bytes are held per request; the events are replayed exactly as read (a piece that crossed the limit whole).
2. A body that ended within the limit is sent whole (``x-envoy-auth-partial-body: false``); a longer one is sent
   cut at the limit when the provider allows a partial message (``true``), else the request is answered
   ``413 Payload Too Large`` without asking (Envoy's buffer filter answer).
3. A body that broke off (the client went away or sent what does not parse) is sent as far as it came; the replayed
   events end with the same break, so the forwarding fails as it would have.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from ambit.waypoint.downstream import RequestSide, SideWrapper
from ambit.waypoint.http1 import BodyData, Event, MessageEnded

__all__ = ["ReadAhead", "ReplayingSide", "read_ahead"]


class ReplayingSide(SideWrapper):
    """A client's side whose first events were read ahead: they come again first (rule 1)."""

    __slots__ = ("_events",)

    def __init__(self, down: RequestSide, events: Iterable[Event]) -> None:
        super().__init__(down)
        self._events = deque(events)

    async def next_event(self, *, head: bool = False) -> Event:
        if self._events:
            return self._events.popleft()
        return await self._down.next_event(head=head)


@dataclass(frozen=True, slots=True)
class ReadAhead:
    body: bytes
    """What the check carries: at most the limit."""
    longer: bool
    """The body went on past the limit (rule 2)."""
    side: ReplayingSide


async def read_ahead(down: RequestSide, limit: int) -> ReadAhead:
    """Read the body up to ``limit`` bytes (rules 1-3)."""
    await down.continue_if_waited()
    events: list[Event] = []
    size = 0
    while True:
        event = await down.next_event()
        events.append(event)
        if isinstance(event, BodyData):
            size += len(event.data)
            if size > limit:
                break
        elif isinstance(event, MessageEnded):
            break
        else:  # rule 3: the body broke off
            break
    body = b"".join(e.data for e in events if isinstance(e, BodyData))
    return ReadAhead(body[:limit], size > limit, ReplayingSide(down, events))
