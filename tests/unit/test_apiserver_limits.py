"""The per-user limiter's rules (``ambit.apiserver.limits``), with time passed in."""

from __future__ import annotations

from ambit.apiserver.limits import LimitSettings, UserLimiter
from ambit.apiserver.requests import User

ALICE = User("alice", groups=("system:authenticated",))
BOB = User("bob", groups=("system:authenticated",))
ADMIN = User("kubernetes-admin", groups=("system:masters",))


def test_a_user_gets_its_burst_then_waits_for_the_refill() -> None:
    limiter = UserLimiter(LimitSettings(requests_per_second=2.0, burst=3))
    assert [limiter.admit(ALICE, 0.0) for _ in range(3)] == [None, None, None]
    assert limiter.admit(ALICE, 0.0) == 1
    assert limiter.admit(BOB, 0.0) is None  # fair: one user's burst is not another's
    assert limiter.admit(ALICE, 0.5) is None  # one token back after 1/qps
    assert limiter.admit(ALICE, 0.5) == 1


def test_retry_after_is_whole_seconds_until_a_token_is_back() -> None:
    limiter = UserLimiter(LimitSettings(requests_per_second=0.25, burst=1))
    assert limiter.admit(ALICE, 0.0) is None
    assert limiter.admit(ALICE, 0.0) == 4


def test_exempt_groups_are_never_limited() -> None:
    limiter = UserLimiter(LimitSettings(requests_per_second=1.0, burst=1, max_watches_per_user=1))
    assert all(limiter.admit(ADMIN, 0.0) is None for _ in range(1000))
    assert all(limiter.open_watch(ADMIN) for _ in range(1000))


def test_watches_are_counted_per_user_and_freed_when_closed() -> None:
    limiter = UserLimiter(LimitSettings(max_watches_per_user=2))
    assert limiter.open_watch(ALICE) and limiter.open_watch(ALICE)
    assert not limiter.open_watch(ALICE)
    assert limiter.open_watch(BOB)
    limiter.close_watch(ALICE)
    assert limiter.watches(ALICE) == 1
    assert limiter.open_watch(ALICE)
    for _ in range(2):
        limiter.close_watch(ALICE)
    assert limiter.watches(ALICE) == 0


def test_buckets_of_idle_users_are_forgotten() -> None:
    limiter = UserLimiter(LimitSettings(requests_per_second=10.0, burst=10))
    for i in range(1000):
        limiter.admit(User(f"u{i}"), 0.0)
    limiter.admit(ALICE, 5.0)  # every other bucket is full again by now
    assert len(limiter._buckets) == 1


def test_port_forwards_are_counted_per_user_apart_from_watches_and_freed_when_closed() -> None:
    limiter = UserLimiter(LimitSettings(max_watches_per_user=1, max_port_forwards_per_user=2))
    assert limiter.open_watch(ALICE)
    assert limiter.open_port_forward(ALICE) and limiter.open_port_forward(ALICE)
    assert not limiter.open_port_forward(ALICE)
    assert limiter.open_port_forward(BOB)
    assert all(limiter.open_port_forward(ADMIN) for _ in range(100))
    limiter.close_port_forward(ALICE)
    assert limiter.port_forwards(ALICE) == 1 and limiter.watches(ALICE) == 1
    limiter.close_port_forward(ALICE)
    assert limiter.port_forwards(ALICE) == 0 and "alice" not in limiter._forwards
