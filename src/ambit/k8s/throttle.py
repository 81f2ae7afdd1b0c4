"""The client's side of the API server's fairness: a request budget, and waiting out a 429.

Why: the API server refuses a user who asks too fast with 429 TooManyRequests and ``Retry-After`` (kube-apiserver's
API Priority and Fairness; the embedded server's per-user bucket, :mod:`ambit.apiserver.limits`). A client that
treats the refusal as a failure and goes on (a status writer with 10,000 objects to patch) turns one refusal into
thousands, each a round trip that costs both sides CPU, and gets nothing done meanwhile. client-go avoids this in two
ways, and so does :class:`~ambit.k8s.client.KubeClient`:

1. **Budget** (client-go's ``rest.Config`` QPS and Burst, istiod's ``--kubernetesApiQPS 80`` and
   ``--kubernetesApiBurst 160``): :class:`RequestBudget` is a token bucket of ``burst`` tokens refilled at ``qps``
   per second; each request takes one, waiting (:meth:`RequestBudget.reserve` says how long) when none is left.
   Reservations are made in arrival order, so concurrent callers queue fairly. ``qps`` None is no budget (every
   request goes at once), the default: most clients of this package ask little, and the lab's own run exempt.
2. **Waiting out a refusal** (client-go's ``maxRetries`` 10 for a 429 carrying Retry-After): a request answered
   429 with a ``Retry-After`` header is sent again after :func:`retry_after` seconds, at most ``max_retries``
   times; then the 429 is the caller's, as is a 429 without the header (client-go does not retry those either).
   The server did not act on a refused request, so any verb may be sent again.

Pure: no I/O, time passed in (monotonic seconds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_RETRY_AFTER = 30.0
"""The longest wait a server's Retry-After gets from us (a hostile or broken server cannot park a client longer)."""
DEFAULT_RETRY_AFTER = 1.0
"""The wait when a 429's Retry-After is not a number of seconds (an HTTP date, garbage)."""


@dataclass(slots=True)
class RequestBudget:
    """Rule 1: a token bucket of ``burst`` requests refilled at ``qps`` per second."""

    qps: float
    burst: int
    _tokens: float = 0.0
    _stamp: float | None = None

    def __post_init__(self) -> None:
        if not self.qps > 0:
            raise ValueError(f"qps must be positive, not {self.qps!r}")
        if self.burst < 1:
            raise ValueError(f"burst must be at least 1, not {self.burst!r}")
        self._tokens = float(self.burst)

    def reserve(self, now: float) -> float:
        """Take a token for a request made at ``now``; the seconds to wait before sending it (0: at once).

        A caller that must wait has its token already: the bucket goes below zero, and the next caller's wait is
        counted from there, so waits queue in the order reservations were made."""
        if self._stamp is not None:
            self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.qps)
        self._stamp = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps


def retry_after(header: str | None) -> float | None:
    """Rule 2's wait for a 429's ``Retry-After`` header: None (no retry) without one; else its seconds (whole or
    fractional), at least 0.1 and at most :data:`MAX_RETRY_AFTER`, or :data:`DEFAULT_RETRY_AFTER` when it is not a
    number (an HTTP date is not used: the API server sends seconds)."""
    if header is None:
        return None
    try:
        seconds = float(header.strip())
    except ValueError:
        return DEFAULT_RETRY_AFTER
    if math.isnan(seconds):
        return DEFAULT_RETRY_AFTER
    return min(MAX_RETRY_AFTER, max(0.1, seconds))
