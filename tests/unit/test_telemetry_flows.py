"""The flow ring and its pages (ambit.telemetry.flows): paging rules, verdicts, filters, and hostile pages."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.telemetry.accesslog import AccessLog, ConnectionRecord
from ambit.telemetry.flows import (
    MAX_PAGE,
    POLICY_CHANGE,
    Flow,
    FlowError,
    FlowFilter,
    FlowRing,
    page_json,
    parse_query,
    read_page,
    render_line,
    request_verdict,
)


def record(i: int = 0, **fields: object) -> ConnectionRecord:
    base: dict[str, object] = {"direction": "inbound", "src_addr": f"198.18.0.{i % 250}:4000", "dst_addr": "d:80"}
    base.update(fields)
    return ConnectionRecord(**base)  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


def test_pages_follow_the_cursor_and_count_what_fell_out_of_the_ring() -> None:
    ring = FlowRing(4, clock=Clock())
    assert read_page(page_json(ring.page())).flows == ()
    for i in range(3):
        ring.add(record(i))
    first = ring.page(0, 2)
    assert [f.seq for f in first.flows] == [1, 2] and first.next == 2 and first.dropped == 0
    second = ring.page(first.next)
    assert [f.seq for f in second.flows] == [3] and second.next == 3
    assert ring.page(3).flows == () and ring.page(3).next == 3
    for i in range(6):
        ring.add(record(i))  # seq 4..9; the ring keeps 6..9
    behind = ring.page(3)
    assert [f.seq for f in behind.flows] == [6, 7, 8, 9] and behind.dropped == 2
    restarted = ring.page(500)  # a cursor from a previous process
    assert [f.seq for f in restarted.flows] == [6, 7, 8, 9] and restarted.dropped == 0
    assert [f.time for f in behind.flows] == sorted(f.time for f in behind.flows)


def test_verdicts_and_mutual_tls() -> None:
    ring = FlowRing()
    ring.add(record(src_identity="spiffe://cluster.local/ns/a/sa/x"))
    ring.add(record(error="explicitly denied by: pol/deny"), "DENY")
    ring.add(record(error="cannot reach 1.2.3.4:80"), "CONNECT")
    ring.add(record(error=f"{POLICY_CHANGE}: explicitly denied by: pol/deny"))
    flows = ring.page().flows
    assert [f.verdict for f in flows] == ["allowed", "denied", "failed", "denied"]
    assert [f.mtls for f in flows] == [True, False, False, False]
    assert flows[1].flag == "DENY" and flows[1].reason == "explicitly denied by: pol/deny"
    assert request_verdict(200, "-") == "allowed"
    assert request_verdict(403, "RBAC") == "denied" and request_verdict(401, "-") == "denied"
    assert request_verdict(503, "UH") == "failed" and request_verdict(404, "NR") == "failed"


def test_the_access_log_feeds_the_ring_whatever_the_log_level() -> None:
    ring = FlowRing()
    log = AccessLog(flows=ring)
    log.write(record(1), "-")
    log.write(record(2, error="x"), "DENY")
    assert [f.verdict for f in ring.page().flows] == ["allowed", "denied"]
    assert ring.page().flows[0].flag == ""  # "-" is no flag


def test_filters_select_either_side() -> None:
    a = Flow(1, 0.0, "inbound", "allowed", True, src_workload="cli", src_namespace="x", dst_namespace="y")
    b = Flow(2, 0.0, "inbound", "denied", False, src_workload="other", src_namespace="z", dst_workload="cli")
    assert FlowFilter(namespace="y")(a) and not FlowFilter(namespace="y")(b)
    assert FlowFilter(pod="cli")(a) and FlowFilter(pod="cli")(b)
    assert [f.seq for f in (a, b) if FlowFilter(verdict="denied")(f)] == [2]
    with pytest.raises(FlowError, match="verdict"):
        FlowFilter(verdict="maybe")


def test_a_line_says_who_to_whom_and_why() -> None:
    flow = Flow(
        1,
        1_700_000_000.5,
        "inbound",
        "denied",
        True,
        src_workload="cli-x",
        src_namespace="pol-x",
        dst_workload="srv-1",
        dst_namespace="pol",
        reason="explicitly denied by: pol/deny-x\n",
        proxy="node-1",
    )
    line = render_line(flow)
    assert "pol-x/cli-x -> pol/srv-1 DENIED mTLS" in line and "node-1 inbound" in line
    assert '"explicitly denied by: pol/deny-x\\n"' in line and "\n" not in line


@pytest.mark.parametrize(
    ("query", "message"),
    [({"after": "-1"}, "after"), ({"after": "1e3"}, "after"), ({"limit": "0"}, "limit"), ({"limit": "1001"}, "limit")],
)
def test_bad_queries_are_refused(query: dict[str, str], message: str) -> None:
    with pytest.raises(FlowError, match=message):
        parse_query(query)


def test_queries() -> None:
    assert parse_query({}) == (0, MAX_PAGE)
    assert parse_query({"after": "12", "limit": "5"}) == (12, 5)


def test_long_fields_are_cut_so_a_reader_takes_the_page() -> None:
    ring = FlowRing()
    ring.add(record(error="x" * 5000), "DENY")
    assert len(read_page(page_json(ring.page())).flows[0].reason) == 1024


TEXT = st.text(max_size=40)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.builds(
            ConnectionRecord,
            direction=st.sampled_from(["inbound", "outbound"]),
            src_addr=TEXT,
            dst_addr=TEXT,
            src_workload=TEXT,
            src_namespace=TEXT,
            src_identity=TEXT,
            dst_identity=TEXT,
            bytes_sent=st.integers(0, 2**40),
            bytes_recv=st.integers(0, 2**40),
            duration_seconds=st.floats(0, 1e6),
            error=TEXT,
        ),
        max_size=8,
    ),
    st.sampled_from(["", "-", "DENY", "CONNECT"]),
)
def test_a_page_reads_back_as_written(records: list[ConnectionRecord], flag: str) -> None:
    ring = FlowRing()
    for r in records:
        ring.add(r, flag)
    page = ring.page()
    assert read_page(page_json(page).encode()) == page


@settings(max_examples=200, deadline=None)
@given(
    st.binary(max_size=300)
    | st.recursive(
        st.none() | st.integers() | st.text(max_size=5),
        lambda c: (
            st.lists(c, max_size=3)
            | st.dictionaries(st.sampled_from(["flows", "next", "seq", "verdict", "time", "mtls"]), c, max_size=4)
        ),
    ).map(lambda o: json.dumps(o).encode())
)
def test_anything_else_is_a_page_or_a_flow_error(body: bytes) -> None:
    with contextlib.suppress(FlowError):
        read_page(body)
