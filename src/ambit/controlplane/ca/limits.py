"""How much one caller may ask of the CA: a token bucket per authenticated caller, and the CSR's size.

Theory of operation: a node proxy signs for every identity on its node at start, so it needs a burst; an attacker
with a token must not make the CA sign (ECDSA, one thread each) without bound. :class:`CallerRateLimiter` keeps one
token bucket per caller key (the authenticated service account and the pod its token is bound to; unauthenticated
requests never reach it) and is pure: time is passed in.

Rule 1. A bucket starts full, holding ``burst`` tokens, and refills at ``rate`` tokens a second up to ``burst``.
Rule 2. A request takes one token; with less than one, it is refused (the CA answers RESOURCE_EXHAUSTED) and takes
        nothing, so a caller that keeps asking is served again at ``rate`` a second, no more.
Rule 3. Memory is bounded: at most ``max_callers`` buckets are kept. When a new caller would exceed it, buckets
        that have refilled (which behave exactly as new ones) are forgotten first, then the least recently used.

:func:`check_csr_size` is the CSR's limit, applied before any parsing: a PEM P-256 CSR is about 500 bytes, so
:data:`MAX_CSR_BYTES` (64 KiB) leaves room for any honest key type and refuses megabyte CSRs cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass

from ambit.controlplane.ca.errors import CsrError

MAX_CSR_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A token bucket's shape."""

    rate: float = 10.0
    """Requests a second a caller is granted, sustained."""
    burst: int = 50
    """Requests a caller may make at once (a node proxy's start-up prefetch)."""


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float


class CallerRateLimiter:
    """Token buckets by caller key, by rules 1-3 of the module docstring."""

    def __init__(self, limit: RateLimit, *, max_callers: int = 10_000) -> None:
        if limit.rate <= 0 or limit.burst < 1 or max_callers < 1:
            raise ValueError("a rate limit needs a positive rate, a burst of at least 1 and room for a caller")
        self.limit = limit
        self.max_callers = max_callers
        self._buckets: dict[str, _Bucket] = {}  # insertion order is recency of use: least recent first

    def __len__(self) -> int:
        return len(self._buckets)

    def admit(self, key: str, now: float) -> bool:
        """Whether ``key`` may make one more request at ``now``; if so, it is charged for it."""
        bucket = self._buckets.pop(key, None)
        if bucket is None:
            self._make_room(now)
            bucket = _Bucket(float(self.limit.burst), now)
        elapsed = max(0.0, now - bucket.updated)
        bucket.tokens = min(float(self.limit.burst), bucket.tokens + elapsed * self.limit.rate)
        bucket.updated = now
        self._buckets[key] = bucket
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    def _make_room(self, now: float) -> None:
        if len(self._buckets) < self.max_callers:
            return
        burst, rate = float(self.limit.burst), self.limit.rate
        full = [k for k, b in self._buckets.items() if b.tokens + max(0.0, now - b.updated) * rate >= burst]
        for key in full:
            del self._buckets[key]
        while len(self._buckets) >= self.max_callers:
            del self._buckets[next(iter(self._buckets))]


def check_csr_size(csr: str, limit: int = MAX_CSR_BYTES) -> None:
    """Refuse a CSR longer than ``limit`` (counted in characters: an honest PEM is ASCII) before it is parsed."""
    if len(csr) > limit:
        raise CsrError(f"the CSR is {len(csr)} bytes long; the limit is {limit}")
