"""Per-user fairness: a token bucket of requests per user, and counts of each user's open watches and port-forwards.

Pure bookkeeping: no I/O, time passed in as ``now`` (monotonic seconds). The HTTP shell asks before serving and
answers a refusal with 429 TooManyRequests and ``Retry-After``, as kube-apiserver's API Priority and Fairness does
(which this is not: one bucket per user, no priority levels, no queuing).

Rules:

1. Users in an exempt group (``system:masters`` by default: the admin kubeconfig, which the lab, the controllers,
   kubectl-driven tests and the benchmark use) are never limited, neither their requests nor their watches.
2. Every other user has a bucket of ``burst`` tokens that refills at ``requests_per_second``; a request takes one
   token. With less than one left, the request is refused with the whole seconds until one is back (at least 1).
3. A user holds at most ``max_watches_per_user`` open watches and ``max_port_forwards_per_user`` open
   port-forward sessions (each a relay to a kubelet); one more is refused (Retry-After 1) until one ends.
4. Users are told apart by name (a service account's token and a second token for it are one user).
5. Memory is bounded by the users active recently: a bucket that would be full again is forgotten (a new bucket is
   full too, so forgetting changes nothing), and a user with no open watch (port-forward) has no such entry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ambit.apiserver.requests import User


@dataclass(frozen=True, slots=True)
class LimitSettings:
    """How much one user may ask of the API server."""

    requests_per_second: float = 100.0
    """Sustained requests per second per user (the bucket's refill rate)."""
    burst: int = 200
    """Requests a user may make at once after being idle (the bucket's size)."""
    max_watches_per_user: int = 100
    """Open watches per user; one more is answered 429."""
    max_port_forwards_per_user: int = 32
    """Open ``pods/portforward`` sessions per user; one more is answered 429."""
    exempt_groups: tuple[str, ...] = ("system:masters",)
    """Groups never limited."""
    watch_send_timeout: float = 10.0
    """Seconds a watch may go without delivering a pending write before it is closed (its client relists)."""
    watch_queue_bytes: int = 16 * 1024 * 1024
    """Encoded bytes of events one watch may have waiting; beyond them it is closed."""


@dataclass(slots=True)
class _Bucket:
    tokens: float
    stamp: float


class UserLimiter:
    """Rules 1-5 for every user of one server."""

    def __init__(self, settings: LimitSettings) -> None:
        self.settings = settings
        self._buckets: dict[str, _Bucket] = {}
        self._watches: dict[str, int] = {}
        self._forwards: dict[str, int] = {}
        self._last_sweep = -math.inf

    def exempt(self, user: User) -> bool:
        return any(group in self.settings.exempt_groups for group in user.groups)

    def admit(self, user: User, now: float) -> int | None:
        """None when ``user`` may make a request now (taking a token), else the seconds to wait (rules 1, 2)."""
        if self.exempt(user):
            return None
        s = self.settings
        self._sweep(now)
        bucket = self._buckets.get(user.username)
        if bucket is None:
            bucket = self._buckets[user.username] = _Bucket(float(s.burst), now)
        else:
            bucket.tokens = min(float(s.burst), bucket.tokens + (now - bucket.stamp) * s.requests_per_second)
            bucket.stamp = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        return max(1, math.ceil((1.0 - bucket.tokens) / s.requests_per_second))

    def open_watch(self, user: User) -> bool:
        """Count a new watch of ``user``; False (nothing counted) when the user is at the limit (rule 3)."""
        return self._hold(self._watches, user, self.settings.max_watches_per_user)

    def close_watch(self, user: User) -> None:
        self._release(self._watches, user)

    def watches(self, user: User) -> int:
        return self._watches.get(user.username, 0)

    def open_port_forward(self, user: User) -> bool:
        """Count a new port-forward session of ``user``; False (nothing counted) at the limit (rule 3)."""
        return self._hold(self._forwards, user, self.settings.max_port_forwards_per_user)

    def close_port_forward(self, user: User) -> None:
        self._release(self._forwards, user)

    def port_forwards(self, user: User) -> int:
        return self._forwards.get(user.username, 0)

    def _hold(self, table: dict[str, int], user: User, limit: int) -> bool:
        if self.exempt(user):
            return True
        held = table.get(user.username, 0)
        if held >= limit:
            return False
        table[user.username] = held + 1
        return True

    def _release(self, table: dict[str, int], user: User) -> None:
        if self.exempt(user):
            return
        held = table.get(user.username, 0) - 1
        if held > 0:
            table[user.username] = held
        else:
            table.pop(user.username, None)

    def _sweep(self, now: float) -> None:
        """Forget buckets that are full again (rule 5), at most once per refill time."""
        s = self.settings
        refill = s.burst / s.requests_per_second
        if now - self._last_sweep < refill:
            return
        self._last_sweep = now
        self._buckets = {name: b for name, b in self._buckets.items() if now - b.stamp < refill}
