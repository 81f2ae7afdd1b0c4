"""The x-envoy-* request headers (ambit.waypoint.envoy_request_headers): what the connection manager removes on
arrival at a waypoint and at a gateway, and the router's x-envoy-expected-rq-timeout-ms."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.waypoint.envoy_request_headers import EDGE_ONLY, INTERNAL_ONLY, expected_timeout, without_internal_headers

CLIENT_CONTROLS = (
    ("x-envoy-retry-on", "5xx"),
    ("x-envoy-max-retries", "10"),
    ("x-envoy-upstream-rq-timeout-ms", "1"),
    ("x-envoy-upstream-rq-per-try-timeout-ms", "1"),
    ("x-envoy-expected-rq-timeout-ms", "1"),
    ("x-envoy-internal", "true"),
    ("x-envoy-force-trace", "1"),
)


def test_a_client_cannot_send_the_router_its_own_retries_or_timeouts_through_a_waypoint() -> None:
    headers = (("host", "echo"), *CLIENT_CONTROLS, ("x-request-id", "client-1"), ("x-envoy-attempt-count", "3"))
    assert without_internal_headers(headers, edge=False) == (
        ("host", "echo"),
        ("x-request-id", "client-1"),  # a waypoint keeps the id: one id follows the request
        ("x-envoy-attempt-count", "3"),  # not the connection manager's: the gateway's router replaces it
    )


def test_the_gateway_also_drops_the_client_s_request_id_and_downstream_names() -> None:
    headers = (
        ("x-request-id", "client-1"),
        ("x-envoy-decorator-operation", "op"),
        ("x-envoy-downstream-service-cluster", "c"),
        ("x-envoy-downstream-service-node", "n"),
        ("accept", "*/*"),
        *CLIENT_CONTROLS,
    )
    assert without_internal_headers(headers, edge=True) == (("accept", "*/*"),)
    assert len(without_internal_headers(headers, edge=False)) == 5


def test_a_request_without_them_is_not_copied() -> None:
    headers = (("host", "echo"), ("x-request-id", "r"), ("x-envoy-external-address", "1.2.3.4"))
    assert without_internal_headers(headers, edge=False) is headers


@given(
    st.lists(
        st.tuples(st.sampled_from([*sorted(EDGE_ONLY), "a", "x-envoy-peer-metadata", "x-envoy-"]), st.text(max_size=3))
    ),
    st.booleans(),
)
def test_what_is_kept_is_the_request_less_the_removed_names_in_order(fields: list[tuple[str, str]], edge: bool) -> None:
    headers = tuple(fields)
    removed = EDGE_ONLY if edge else INTERNAL_ONLY
    assert without_internal_headers(headers, edge=edge) == tuple(f for f in headers if f[0] not in removed)


@pytest.mark.parametrize(
    ("request_timeout", "per_try", "elapsed", "expected"),
    [
        (None, None, 0.0, None),
        (0.0, None, 0.0, None),  # 0 is no limit
        (15.0, None, 0.0, "15000"),
        (15.0, 2.0, 0.0, "2000"),
        (None, 2.0, 9.0, "2000"),  # no route timeout: nothing runs out
        (2.0, 2.0, 0.0, "2000"),  # a per-try timeout not shorter than the route's is ignored
        (1.0, None, 0.4, "600"),
        (1.0, 0.5, 0.7, "300"),
        (1.0, 0.5, 1.0, "1"),  # ran out: 1, since 0 would say "no limit"
        (1.0, None, 3.0, "1"),
        (0.57, None, 0.0, "570"),  # whole milliseconds of the route's duration
    ],
)
def test_the_expected_timeout_is_the_try_s_share_of_what_is_left(
    request_timeout: float | None, per_try: float | None, elapsed: float, expected: str | None
) -> None:
    found = expected_timeout(request_timeout, per_try, elapsed)
    assert found == (None if expected is None else ("x-envoy-expected-rq-timeout-ms", expected))
