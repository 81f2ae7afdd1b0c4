"""A gRPC request's deadline as Envoy's router takes it with istiod's ``max_grpc_timeout``
(:mod:`ambit.waypoint.grpc_timeout`): the header read, capped by the route, and written back for each try."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ambit.model.routes import Timeouts
from ambit.waypoint.envoy_request_headers import expected_timeout
from ambit.waypoint.grpc_timeout import MAX_VALUE, format_grpc_timeout, grpc_timeouts, is_grpc, parse_grpc_timeout


@pytest.mark.parametrize(
    ("content_type", "grpc"),
    [
        ("application/grpc", True),
        ("application/grpc+proto", True),
        ("application/grpc+json", True),
        ("application/grpc-web", False),  # grpc-web is not gRPC to Envoy's router
        ("application/grpc-web+proto", False),
        ("application/grpcx", False),
        ("application/json", False),
        ("Application/grpc", False),  # compared as sent, as Envoy compares it
        ("", False),
        (None, False),
    ],
)
def test_grpc_is_told_by_the_content_type_as_envoy_tells_it(content_type: str | None, grpc: bool) -> None:
    assert is_grpc(content_type) is grpc


@pytest.mark.parametrize(
    ("value", "millis"),
    [
        ("1H", 3_600_000),
        ("2M", 120_000),
        ("3S", 3_000),
        ("250m", 250),
        ("1500u", 2),  # 1.5 ms rounds up
        ("1000u", 1),
        ("1u", 1),
        ("0u", 0),
        ("1n", 1),  # any nanosecond is a whole millisecond
        ("2000000n", 2),
        ("2000001n", 3),
        ("0S", 0),  # a deadline of none
        ("00000005S", 5_000),  # leading zeros: absl::SimpleAtoi reads them
        ("000000000000000000000005S", 5_000),
        ("+5S", 5_000),
        ("-0S", 0),
        (" 5S", 5_000),
        ("5 S", 5_000),  # blanks around the number are SimpleAtoi's to skip
        ("99999999m", 99_999_999),
        ("99999999H", 99_999_999 * 3_600_000),
        # Malformed: as if no header had been sent.
        ("100000000m", None),  # nine digits
        ("-5S", None),
        ("5", None),
        ("S", None),
        ("", None),
        ("5s", None),  # units are case-sensitive: s is no unit
        ("5h", None),
        ("1.5S", None),
        ("5SS", None),
        ("0x5S", None),
        ("\u0665S", None),  # an Arabic-Indic five is no ASCII digit
        ("+-5S", None),
        ("+S", None),
    ],
)
def test_the_header_is_read_as_envoy_reads_it(value: str, millis: int | None) -> None:
    assert parse_grpc_timeout(value) == millis


@pytest.mark.parametrize(
    ("millis", "written"),
    [
        (1, "1m"),
        (250, "250m"),
        (99_999_999, "99999999m"),
        (100_000_000, "100000S"),  # past 8 digits of milliseconds: seconds, rounded down
        (99_999_999_999, "99999999S"),
        (100_000_000_000, "1666666M"),
        (6_000_000_000_000, "1666666H"),
        (10**30, "99999999H"),  # clipped at 8 digits of hours
    ],
)
def test_the_rewritten_header_is_written_as_envoy_writes_it(millis: int, written: str) -> None:
    assert format_grpc_timeout(millis) == written


@pytest.mark.parametrize(
    ("route", "header", "deadline"),
    [
        # A route without a timeout (istiod: max_grpc_timeout 0): the client's deadline, or none.
        (Timeouts(), None, None),
        (Timeouts(), "2S", 2.0),
        (Timeouts(), "0S", None),
        (Timeouts(), "garbage", None),
        (Timeouts(request=0.0), "2S", 2.0),  # a route timeout of 0 caps nothing
        # A route timeout of 5 s is max_grpc_timeout: it caps the client's, and stands in for none.
        (Timeouts(request=5.0), None, 5.0),
        (Timeouts(request=5.0), "2S", 2.0),
        (Timeouts(request=5.0), "10S", 5.0),
        (Timeouts(request=5.0), "5000m", 5.0),
        (Timeouts(request=5.0), "0S", 5.0),
        (Timeouts(request=5.0), "1X", 5.0),  # malformed: as none
        (Timeouts(request=5.0), "1500u", 0.002),
        (Timeouts(request=0.25), "1H", 0.25),
    ],
)
def test_the_deadline_is_the_header_capped_by_the_route(
    route: Timeouts, header: str | None, deadline: float | None
) -> None:
    headers = [("content-type", "application/grpc")] + ([("grpc-timeout", header)] if header is not None else [])
    assert grpc_timeouts(route, headers).request == deadline


def test_the_first_grpc_timeout_counts() -> None:
    headers = [("grpc-timeout", "1S"), ("grpc-timeout", "9S")]
    assert grpc_timeouts(Timeouts(), headers).request == 1.0


@pytest.mark.parametrize(
    ("route", "header", "expected"),
    [
        (Timeouts(backend_request=2.0), "10S", ("2000", "2000m")),  # the per-try timeout is the try's time
        (Timeouts(backend_request=2.0), "1S", ("1000", "1000m")),  # not shorter than the deadline: none
        (Timeouts(backend_request=2.0), None, ("2000", "2000m")),  # no deadline: the per-try alone
        (Timeouts(request=5.0, backend_request=2.0), "3S", ("2000", "2000m")),
        (Timeouts(request=5.0), "3S", ("3000", "3000m")),
        (Timeouts(), "3S", ("3000", "3000m")),
        (Timeouts(), None, None),  # neither: the client's header goes on unchanged
    ],
)
def test_the_per_try_timeout_stays_the_route_s_and_the_try_is_told_its_time(
    route: Timeouts, header: str | None, expected: tuple[str, str] | None
) -> None:
    headers = [("grpc-timeout", header)] if header is not None else []
    timeouts = grpc_timeouts(route, headers)
    assert timeouts.backend_request == route.backend_request
    told = expected_timeout(timeouts.request, timeouts.backend_request, 0.0)
    if expected is None:
        assert told is None
    else:
        assert told is not None and told[1] == expected[0]
        assert format_grpc_timeout(int(told[1])) == expected[1]


def test_a_retry_is_told_what_is_left() -> None:
    timeouts = grpc_timeouts(Timeouts(), [("grpc-timeout", "3S")])
    told = expected_timeout(timeouts.request, timeouts.backend_request, 1.2)
    assert told is not None and format_grpc_timeout(int(told[1])) == "1800m"


@given(st.text(max_size=64))
@example("9" * 100_000 + "S")  # a hostile header: bounded work, no int conversion of 100,000 digits
@example("0" * 100_000 + "1S")
def test_any_header_reads_as_a_bounded_deadline_or_none(value: str) -> None:
    millis = parse_grpc_timeout(value)
    assert millis is None or 0 <= millis <= MAX_VALUE * 3_600_000


@given(st.integers(min_value=1, max_value=10**15))
def test_a_written_deadline_reads_back_no_longer_than_it_was(millis: int) -> None:
    written = format_grpc_timeout(millis)
    read = parse_grpc_timeout(written)
    assert read is not None and 0 < read <= millis  # units are only ever rounded down or clipped
