"""The CA's limits: token buckets per caller, the CSR size, the certificate TTL; pure, with time passed in."""

from __future__ import annotations

import asyncio

import grpc  # type: ignore[import-untyped]
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from ambit.api import ca_pb2
from ambit.controlplane.ca.errors import CsrError
from ambit.controlplane.ca.limits import MAX_CSR_BYTES, CallerRateLimiter, RateLimit, check_csr_size
from ambit.controlplane.ca.server import (
    DEFAULT_WORKLOAD_CERT_TTL,
    MAX_RECEIVE_MESSAGE_BYTES,
    MAX_WORKLOAD_CERT_TTL,
    CaService,
    OversizedRequest,
    effective_ttl,
    read_request,
)

DAY = 86400


def test_a_caller_gets_its_burst_at_once_then_nothing() -> None:
    limiter = CallerRateLimiter(RateLimit(rate=10, burst=50))
    assert [limiter.admit("zt", 0.0) for _ in range(51)] == [True] * 50 + [False]


def test_a_refused_request_costs_nothing_and_the_bucket_refills_at_the_rate() -> None:
    limiter = CallerRateLimiter(RateLimit(rate=10, burst=50))
    for _ in range(50):
        limiter.admit("zt", 0.0)
    assert not limiter.admit("zt", 0.05)  # half a token
    assert limiter.admit("zt", 0.1)  # refusals took nothing: one token after 0.1 s
    assert not limiter.admit("zt", 0.1)
    assert sum(limiter.admit("zt", 10.0) for _ in range(100)) == 50  # never more than the burst


def test_callers_have_their_own_buckets() -> None:
    limiter = CallerRateLimiter(RateLimit(rate=1, burst=1))
    assert limiter.admit("a", 0.0) and not limiter.admit("a", 0.0)
    assert limiter.admit("b", 0.0)


def test_a_clock_going_backwards_grants_nothing() -> None:
    limiter = CallerRateLimiter(RateLimit(rate=1, burst=1))
    assert limiter.admit("a", 100.0)
    assert not limiter.admit("a", 50.0)


def test_memory_is_bounded_forgetting_refilled_buckets_first() -> None:
    limiter = CallerRateLimiter(RateLimit(rate=1, burst=2), max_callers=3)
    limiter.admit("busy", 0.0)
    limiter.admit("busy", 0.0)  # empty until t=2
    limiter.admit("idle", 0.0)
    limiter.admit("other", 1.0)
    assert len(limiter) == 3
    limiter.admit("new", 1.5)  # idle has refilled (behaves as new); busy has not
    assert len(limiter) == 3
    assert limiter.admit("busy", 1.5) and not limiter.admit("busy", 1.5)  # 1.5 tokens, not a fresh 2: remembered


@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.floats(0, 5)), max_size=200))
def test_no_caller_is_granted_more_than_its_burst_plus_rate_times_time(calls: list[tuple[str, float]]) -> None:
    limiter = CallerRateLimiter(RateLimit(rate=2, burst=3))
    granted: dict[str, int] = {}
    first: dict[str, float] = {}
    for key, now in sorted(calls, key=lambda c: c[1]):
        first.setdefault(key, now)
        granted[key] = granted.get(key, 0) + limiter.admit(key, now)
        assert granted[key] <= 3 + 2 * (now - first[key]) + 1e-9


@given(st.lists(st.tuples(st.integers(0, 50), st.floats(0, 5)), max_size=300))
def test_the_number_of_buckets_never_exceeds_the_bound(calls: list[tuple[int, float]]) -> None:
    limiter = CallerRateLimiter(RateLimit(rate=2, burst=3), max_callers=4)
    for key, now in sorted(calls, key=lambda c: c[1]):
        limiter.admit(str(key), now)
        assert len(limiter) <= 4


@pytest.mark.parametrize(
    ("size", "refused"), [(500, False), (MAX_CSR_BYTES, False), (MAX_CSR_BYTES + 1, True), (3_900_000, True)]
)
def test_csrs_above_the_limit_are_refused_before_parsing(size: int, refused: bool) -> None:
    csr = "x" * size  # not a CSR at all: the size is all that is looked at
    if refused:
        with pytest.raises(CsrError, match=f"the limit is {MAX_CSR_BYTES}"):
            check_csr_size(csr)
    else:
        check_csr_size(csr)


@pytest.mark.parametrize(
    ("requested", "granted"),
    [
        (0, DEFAULT_WORKLOAD_CERT_TTL),
        (-1, DEFAULT_WORKLOAD_CERT_TTL),
        (3600, 3600),
        (90 * DAY, 90 * DAY),
        (90 * DAY + 1, MAX_WORKLOAD_CERT_TTL),
        (2**62, MAX_WORKLOAD_CERT_TTL),
    ],
)
def test_the_ttl_defaults_to_a_day_and_is_capped_at_90_days(requested: int, granted: int) -> None:
    assert DEFAULT_WORKLOAD_CERT_TTL == DAY
    assert effective_ttl(requested, default=DAY, maximum=MAX_WORKLOAD_CERT_TTL) == granted


# The CA's own request limit on a server whose gRPC limit is the xDS stream's (ca.server step 0).


@given(st.binary(max_size=256))
def test_the_ca_reads_a_small_request_or_fails_to_parse_it(data: bytes) -> None:
    try:
        request = read_request(data)
    except DecodeError:
        return
    assert isinstance(request, ca_pb2.IstioCertificateRequest)


def test_the_ca_leaves_a_request_over_its_limit_unparsed_and_refuses_it() -> None:
    huge = ca_pb2.IstioCertificateRequest(csr="A" * (MAX_RECEIVE_MESSAGE_BYTES + 1)).SerializeToString()
    assert read_request(huge) == OversizedRequest(len(huge))

    class Context:
        aborted: tuple[object, str] | None = None

        def peer(self) -> str:
            return "ipv4:127.0.0.1:1"

        async def abort(self, code: object, message: str) -> None:
            self.aborted = (code, message)
            raise grpc.aio.AbortError()

    context = Context()
    service = CaService(None, None, None)  # type: ignore[arg-type]  # never reached for an oversized request
    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(service.CreateCertificate(OversizedRequest(len(huge)), context))
    assert context.aborted is not None and context.aborted[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(MAX_RECEIVE_MESSAGE_BYTES) in context.aborted[1]
