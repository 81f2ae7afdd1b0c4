"""The connection manager's base response headers (ambit.waypoint.response_base rules 1-3), pure."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ambit.waypoint.downstream import Outcome
from ambit.waypoint.response_base import SERVER_NAME, finalized, http_date, service_time

NOW = 1_796_647_200.0  # Mon, 07 Dec 2026 12:40:00 GMT


def test_the_endpoints_server_is_replaced_and_a_date_added() -> None:
    fields = finalized([("content-type", "text/plain"), ("server", "gunicorn"), ("x-a", "1")], NOW)
    assert fields == [
        ("content-type", "text/plain"),
        ("x-a", "1"),
        ("date", "Mon, 07 Dec 2026 12:40:00 GMT"),
        ("server", SERVER_NAME),
    ]


def test_an_endpoints_own_date_is_kept() -> None:
    fields = finalized([("date", "Sun, 06 Dec 2026 00:00:00 GMT"), ("server", "a"), ("server", "b")], NOW)
    assert fields == [("date", "Sun, 06 Dec 2026 00:00:00 GMT"), ("server", SERVER_NAME)]


def test_the_date_is_an_imf_fixdate_of_the_second() -> None:
    assert http_date(NOW + 0.999) == "Mon, 07 Dec 2026 12:40:00 GMT"
    assert http_date(NOW + 1) == "Mon, 07 Dec 2026 12:40:01 GMT"
    assert http_date(0) == "Thu, 01 Jan 1970 00:00:00 GMT"


def test_service_time_counts_whole_milliseconds_from_the_requests_end() -> None:
    assert service_time(None, 5.0) is None  # the request still streamed up when the head came
    assert service_time(1.0, 1.0259) == ("x-envoy-upstream-service-time", "25")
    assert service_time(2.0, 1.0) == ("x-envoy-upstream-service-time", "0")  # never negative


@given(st.lists(st.tuples(st.sampled_from(["server", "date", "x-a", "content-length"]), st.text(max_size=5))))
def test_one_server_and_one_date_at_most_added_whatever_came(headers: list[tuple[str, str]]) -> None:
    fields = finalized(headers, NOW)
    assert [v for n, v in fields if n == "server"] == [SERVER_NAME]
    dates = [v for n, v in headers if n == "date"]
    assert [v for n, v in fields if n == "date"] == (dates or [http_date(NOW)])
    assert [f for f in fields if f[0] not in ("server", "date")] == [
        f for f in headers if f[0] not in ("server", "date")
    ]


def test_an_injected_delay_is_reported_beside_the_other_flags_in_envoys_order() -> None:
    outcome = Outcome("r")
    assert outcome.reported_flags() == "-"
    outcome.delay_injected = True
    assert outcome.reported_flags() == "DI"
    outcome.flags = "FI"
    assert outcome.reported_flags() == "DI,FI"
    outcome.flags = "UT"
    assert outcome.reported_flags() == "UT,DI"
    outcome.flags = "UF,URX"
    assert outcome.reported_flags() == "UF,DI,URX"
