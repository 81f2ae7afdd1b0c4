"""Which new xDS streams the server takes: graceful overload (issue 22), after istiod's request limit. Sans-IO.

Theory of operation: every node proxy holds one stream, and opening it is the expensive part: authentication (a
TokenReview against the API server) and the first answer (a wildcard client takes every resource). A restarted
control plane sees every client at once. istiod limits new streams with a token bucket
(``PILOT_MAX_REQUESTS_PER_SECOND``; by default 15 + 5 per CPU, at most 100 a second), waits up to a second for a
token, and otherwise refuses the stream with ``RESOURCE_EXHAUSTED``, so that the proxy comes back later (or goes to
another replica) while the streams already served stay healthy. :class:`Admission` does the same and adds a bound
on the streams held (each costs memory for as long as it lives) and a retry hint: the refusal's trailers carry
``grpc-retry-pushback-ms`` (gRPC's server pushback), which Ambit's client waits out before it reconnects
(:mod:`ambit.xds.client`); other clients fall back on their own back-off.

Rules:

1. A stream arriving while :attr:`Admission.max_streams` are held is refused at once: ``too many xDS clients``,
   with a hint of :attr:`Admission.full_hint` seconds, spread (rule 4).
2. Otherwise it takes a token from a bucket refilled at :attr:`Admission.rate` a second and holding at most
   :attr:`Admission.burst`. A token now admits it now; one that will be free within :attr:`Admission.max_wait`
   seconds is reserved and the stream waits for it, then is admitted; a later one is not reserved and the stream is
   refused (``rate limited``) with a hint of the time until a token would be free, spread. A waiting stream counts
   as held.
3. The decision comes before authentication: a refused stream costs the API server nothing.
4. Hints are spread over ``[hint, 2 hint)`` by a draw in ``[0, 1)``, so clients refused together do not all come
   back in the same instant; a hint is at least :data:`MIN_HINT` seconds.
5. Time and draws are passed in; nothing here reads a clock or a random source.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

__all__ = ["Admission", "Admit", "Refuse", "default_rate"]

MIN_HINT = 0.1
"""Seconds: the shortest retry hint (rule 4)."""


@dataclass(frozen=True, slots=True)
class Admit:
    """Take the stream after ``wait`` seconds (0: now)."""

    wait: float = 0.0


@dataclass(frozen=True, slots=True)
class Refuse:
    """Refuse the stream with ``RESOURCE_EXHAUSTED`` and ``reason``; the client may come back in ``hint`` seconds."""

    reason: str
    hint: float

    @property
    def pushback_ms(self) -> str:
        """The ``grpc-retry-pushback-ms`` trailer's value."""
        return str(max(1, round(self.hint * 1000)))


def default_rate(cpus: int | None = None) -> float:
    """istiod's default request limit for a machine of ``cpus`` CPUs (this one's when None): 15 + 5 per CPU, at
    most 100 a second."""
    count = cpus if cpus is not None else (os.cpu_count() or 1)
    return float(min(15 + 5 * max(1, count), 100))


@dataclass(slots=True)
class Admission:
    """The admission state of one server (rules 1 and 2): how many streams it holds, and its token bucket."""

    rate: float = field(default_factory=default_rate)
    """New streams a second, sustained (``PILOT_MAX_REQUESTS_PER_SECOND``)."""
    burst: float = 0.0
    """Tokens the bucket holds at most; 0: as many as :attr:`rate`."""
    max_streams: int = 20_000
    """Streams held at most, waiting ones included."""
    max_wait: float = 1.0
    """Seconds a stream may wait for a token (istiod's one second)."""
    full_hint: float = 5.0
    """Seconds a client refused for :attr:`max_streams` is asked to stay away."""
    held: int = 0
    _tokens: float | None = None
    _at: float = 0.0

    def __post_init__(self) -> None:
        if not self.rate > 0 or self.max_streams < 1 or self.max_wait < 0 or self.burst < 0:
            raise ValueError("admission needs rate > 0, max_streams >= 1, max_wait >= 0 and burst >= 0")

    @property
    def capacity(self) -> float:
        return self.burst or self.rate

    def arrive(self, now: float, draw: float) -> Admit | Refuse:
        """A new stream at ``now`` (seconds, any monotonic origin); ``draw`` in ``[0, 1)`` spreads the hint. An
        admitted stream is held from here until :meth:`leave`."""
        if self.held >= self.max_streams:
            return Refuse("too many xDS clients", _spread(self.full_hint, draw))
        tokens = self.capacity if self._tokens is None else self._tokens
        tokens = min(self.capacity, tokens + max(0.0, now - self._at) * self.rate)
        self._at = now
        wait = 0.0 if tokens >= 1 else (1 - tokens) / self.rate
        if wait > self.max_wait:
            self._tokens = tokens
            return Refuse("rate limited", _spread(wait, draw))
        self._tokens = tokens - 1  # reserved: a waiting stream owns its token
        self.held += 1
        return Admit(wait)

    def leave(self) -> None:
        """An admitted stream ended (or gave up waiting)."""
        self.held = max(0, self.held - 1)


def _spread(hint: float, draw: float) -> float:
    return max(MIN_HINT, hint) * (1 + min(max(draw, 0.0), 0.999))
