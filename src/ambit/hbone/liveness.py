"""How long an accepted HBONE connection may hold its place without doing its part: a pure plan, time passed in.

Theory of operation: once TLS is done, an HTTP/2 server connection holds a place at its listener (and memory)
until someone closes it, and the peer decides whether it ever sends anything. :class:`LivenessTimer` is the
connection's one timer: the shell calls :meth:`LivenessTimer.due` when the deadline it last named has passed,
with what it saw since (bytes from the peer, whether HTTP/2 has started, since when no stream is open), and acts
on the answer: :class:`SendPing`, :class:`Expire`, or nothing until :attr:`LivenessTimer.next_at`.

Rules (each deadline is a setting of :class:`LivenessSettings`):

1. Preface. A client must send the HTTP/2 preface and its first SETTINGS within ``preface_timeout`` of the end of
   the TLS handshake, else the connection expires (``Expiry.PREFACE``): it never spoke HTTP/2, nothing was open.
2. Idle. A connection with no open stream for ``idle_timeout`` (since its last stream ended, or since it started
   if it never had one) expires (``Expiry.IDLE``). The shell closes it gracefully (GOAWAY, then close once drained),
   so a CONNECT the client sent before hearing the GOAWAY is still served; a connection with an open stream never
   expires by this rule, however quiet its tunnels are. A draining connection is not timed again.
3. Keepalive. Once HTTP/2 has started, when nothing was heard from the peer for ``keepalive_interval`` a PING is
   sent; if its ACK has not come ``keepalive_timeout`` after it was sent, the peer is gone (a dead host, a cut
   path, a client that stopped reading) and the connection expires (``Expiry.KEEPALIVE``), with or without open
   streams: nothing can flow on it any more. A peer whose bytes keep arriving is never pinged, and bytes that
   arrive while a PING waits count as its answer: the peer is alive (its ACK may sit unread behind them while the
   shell, its output backed up, has stopped reading).
4. Bytes from the peer are noticed at the timer's next call (the shell keeps a flag, not a clock read per read),
   so a ping may leave up to one interval later than the last byte warrants; never earlier. The shell also raises
   the flag when its backed-up output drains: the peer took our bytes, which a slow reader of a long download does
   while it has nothing to send.

A setting of 0 turns its rule off (the preface rule cannot be: a silent TLS connection must end).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from ambit.hbone.errors import HboneError

DEFAULT_PREFACE_TIMEOUT = 10.0
"""Go's HTTP/2 server waits 10 s for a client's preface; a legitimate client sends it with its first TLS flight."""
DEFAULT_IDLE_TIMEOUT = 600.0
"""Twice the client pools' own idle release (ztunnel's ``POOL_UNUSED_RELEASE_TIMEOUT`` and ours, 5 min): a pooled
connection is normally closed by its client, which knows whether it will reuse it; the server's timer reclaims the
places of connections nobody uses any more (Envoy's HTTP connection idle timeout is 1 h)."""
DEFAULT_KEEPALIVE_INTERVAL = 10.0
"""ztunnel pings every HTTP/2 connection, client and server side, every 10 s."""
DEFAULT_KEEPALIVE_TIMEOUT = 20.0
"""... and drops it when the answer takes more than 20 s."""


class LivenessSettingsError(HboneError):
    """A liveness deadline that cannot work (negative, not a number, or a preface timeout of 0)."""


@dataclass(frozen=True, slots=True)
class LivenessSettings:
    """The server-side deadlines of an HBONE connection after its TLS handshake (rules 1-3), in seconds."""

    preface_timeout: float = DEFAULT_PREFACE_TIMEOUT
    """From the end of the TLS handshake to the client's HTTP/2 preface and first SETTINGS (rule 1)."""
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    """With no open stream, before a graceful GOAWAY and close (rule 2); 0: never."""
    keepalive_interval: float = DEFAULT_KEEPALIVE_INTERVAL
    """Silence from the peer before a PING (rule 3); 0: no keepalive."""
    keepalive_timeout: float = DEFAULT_KEEPALIVE_TIMEOUT
    """From a PING to its ACK before the connection is dropped (rule 3)."""

    def __post_init__(self) -> None:
        values = (self.preface_timeout, self.idle_timeout, self.keepalive_interval, self.keepalive_timeout)
        if not all(0 <= value < float("inf") for value in values):  # also refuses NaN
            raise LivenessSettingsError(f"liveness deadlines must be finite and 0 seconds or more: {self}")
        if self.preface_timeout == 0:
            raise LivenessSettingsError("the preface timeout cannot be 0: a silent connection would stay for ever")
        if self.keepalive_interval and not self.keepalive_timeout:
            raise LivenessSettingsError("a keepalive needs a timeout for its PING's answer")


class Expiry(enum.StrEnum):
    """Why the timer ended a connection (a metric label and a log word)."""

    PREFACE = "preface_timeout"
    IDLE = "idle_timeout"
    KEEPALIVE = "keepalive_timeout"


@dataclass(frozen=True, slots=True)
class SendPing:
    """Send a PING with this payload (rule 3)."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class Expire:
    """End the connection: gracefully for ``Expiry.IDLE`` (GOAWAY, streams in flight served), at once otherwise."""

    expiry: Expiry

    @property
    def graceful(self) -> bool:
        return self.expiry is Expiry.IDLE


Action = SendPing | Expire | None


class LivenessTimer:
    """One connection's deadlines (rules 1-4); ``started`` is when its TLS handshake ended."""

    __slots__ = ("_heard_at", "_ping_sent", "_pings", "_started", "next_at", "settings")

    def __init__(self, settings: LivenessSettings, started: float) -> None:
        self.settings = settings
        self._started = started
        self._heard_at = started
        self._ping_sent: float | None = None  # when the PING awaiting its ACK left
        self._pings = 0
        self.next_at = started + settings.preface_timeout
        """When :meth:`due` next has something to decide (the shell's timer)."""

    def acknowledged(self) -> None:
        """The peer answered our PING."""
        self._ping_sent = None

    def due(self, now: float, *, heard: bool, ready: bool, idle_since: float | None, draining: bool) -> Action:
        """What to do at ``now``, and :attr:`next_at` updated. ``heard``: bytes arrived since the last call;
        ``ready``: the peer's preface and first SETTINGS arrived; ``idle_since``: since when no stream is open
        (None while one is); ``draining``: a graceful GOAWAY was sent or received."""
        settings = self.settings
        if heard:
            self._heard_at = now
            self._ping_sent = None  # rule 3: the peer is alive
        if not ready:  # rule 1
            deadline = self._started + settings.preface_timeout
            if now >= deadline:
                return Expire(Expiry.PREFACE)
            self.next_at = deadline
            return None
        candidates: list[float] = []
        action: Action = None
        if settings.idle_timeout and idle_since is not None and not draining:  # rule 2
            deadline = idle_since + settings.idle_timeout
            if now >= deadline:
                return Expire(Expiry.IDLE)
            candidates.append(deadline)
        if settings.keepalive_interval:  # rule 3
            if self._ping_sent is not None:
                deadline = self._ping_sent + settings.keepalive_timeout
                if now >= deadline:
                    return Expire(Expiry.KEEPALIVE)
                candidates.append(deadline)
            else:
                deadline = self._heard_at + settings.keepalive_interval
                if now >= deadline:
                    self._ping_sent = now
                    self._pings += 1
                    action = SendPing(struct.pack(">Q", self._pings))
                    candidates.append(now + settings.keepalive_timeout)
                else:
                    candidates.append(deadline)
        # Nothing timed (keepalive off, and a stream open or draining): look again after an idle period anyway, as
        # the shell calls only at ``next_at`` and a stream may end meanwhile.
        self.next_at = min(candidates) if candidates else now + (settings.idle_timeout or settings.preface_timeout)
        return action
