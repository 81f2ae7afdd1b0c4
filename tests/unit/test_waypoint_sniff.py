"""Protocol detection of tunnelled streams at the waypoint (ambit.waypoint.sniff)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.model.workload import AppProtocol
from ambit.waypoint.errors import HttpProtocolError
from ambit.waypoint.http1 import RequestStarted, ServerSide
from ambit.waypoint.sniff import (
    H2_PREFACE,
    SNIFF_LIMIT,
    Protocol,
    declared_protocol,
    h2_prior_knowledge,
    protocol_for,
    sniff,
)

TLS_CLIENT_HELLO = bytes.fromhex("160301020001000200030300")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (H2_PREFACE, Protocol.HTTP2),
        (H2_PREFACE + b"\x00\x00\x12\x04\x00", Protocol.HTTP2),
        (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", Protocol.HTTP1),
        (b"GET / HTTP/1.1\r\n", Protocol.HTTP1),
        (b"GET / HTTP/1.0\n", Protocol.HTTP1),
        (b"POST /api/v1?x=y HTTP/1.1\r\n", Protocol.HTTP1),
        (b"OPTIONS * HTTP/1.1\r\n", Protocol.HTTP1),
        (b"CONNECT example.com:443 HTTP/1.1\r\n", Protocol.HTTP1),
        (b"GET http://a/b HTTP/1.1\r\n", Protocol.HTTP1),
        (b"M-SEARCH * HTTP/1.1\r\n", Protocol.HTTP1),
        (b"PRI * HTTP/1.1\r\n", Protocol.HTTP1),
        (b"PRI * HTTP/2.0\r\n\r\nXX", Protocol.TCP),
        (TLS_CLIENT_HELLO, Protocol.TCP),
        (b"\x16", Protocol.TCP),
        (b"SSH-2.0-OpenSSH_9.6\r\n", Protocol.TCP),
        (b"GET  / HTTP/1.1\r\n", Protocol.TCP),
        (b" GET / HTTP/1.1\r\n", Protocol.TCP),
        (b"\r\nGET / HTTP/1.1\r\n", Protocol.TCP),
        (b"GET / HTTP/2.0\r\n", Protocol.TCP),
        (b"GET / HTTP/1.x\r\n", Protocol.TCP),
        (b"GET / HTTP/1.1\rX", Protocol.TCP),
        (b"GET / HTTP/1.1 \r\n", Protocol.TCP),
        (b"GET /\x00 HTTP/1.1\r\n", Protocol.TCP),
        (b"G\xc3T / HTTP/1.1\r\n", Protocol.TCP),
        (b"*1\r\n$4\r\nPING\r\n", Protocol.TCP),
    ],
)
def test_sniff_decides(data: bytes, expected: Protocol) -> None:
    assert sniff(data) is expected


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"P",
        b"PRI * HTTP/2",
        H2_PREFACE[:-1],
        b"GET",
        b"GET ",
        b"GET /a",
        b"GET / ",
        b"GET / HTTP/1.",
        b"GET / HTTP/1.1",
        b"GET / HTTP/1.1\r",
    ],
)
def test_sniff_asks_for_more_while_the_bytes_could_still_be_either(data: bytes) -> None:
    assert sniff(data) is None
    assert sniff(data, final=True) is Protocol.TCP


def test_every_prefix_of_a_request_line_or_the_preface_waits_and_the_whole_decides() -> None:
    for whole, protocol in [(b"DELETE /items/7 HTTP/1.1\r\n", Protocol.HTTP1), (H2_PREFACE, Protocol.HTTP2)]:
        assert [sniff(whole[:n]) for n in range(len(whole))] == [None] * len(whole)
        assert sniff(whole) is protocol


def test_an_undecided_stream_turns_tcp_at_the_limit() -> None:
    long_target = b"GET /" + b"a" * SNIFF_LIMIT
    assert sniff(long_target[: SNIFF_LIMIT - 1]) is None
    assert sniff(long_target[:SNIFF_LIMIT]) is Protocol.TCP
    assert sniff(long_target + b" HTTP/1.1\r\n") is Protocol.TCP
    assert sniff(b"GET /abc", limit=8) is Protocol.TCP


@pytest.mark.parametrize(
    ("name", "app_protocol", "port", "expected"),
    [
        ("http", None, 80, Protocol.HTTP1),
        ("http-web", None, 8080, Protocol.HTTP1),
        ("HTTP2", None, 80, Protocol.HTTP2),
        ("grpc-api", None, 9000, Protocol.HTTP2),
        ("tcp-db", None, 5432, Protocol.TCP),
        ("https", None, 443, Protocol.TCP),
        ("tls", None, 443, Protocol.TCP),
        ("web", None, 8080, None),
        ("", None, 8080, None),
        ("mysql", None, 3306, None),
        ("", None, 3306, Protocol.TCP),
        ("grpc-web", None, 8080, None),
        ("tcp", "http", 80, Protocol.HTTP1),
        ("web", "kubernetes.io/h2c", 80, Protocol.HTTP2),
        ("web", "kubernetes.io/ws", 80, Protocol.HTTP1),
        ("web", "kubernetes.io/wss", 443, Protocol.TCP),
        ("http", "grpc", 80, Protocol.HTTP2),
    ],
)
def test_protocol_for_reads_the_port_as_istiod_does(
    name: str, app_protocol: str | None, port: int, expected: Protocol | None
) -> None:
    assert protocol_for(name, app_protocol, port) is expected


def test_declared_protocol_maps_the_workload_states_app_protocol() -> None:
    assert {a: declared_protocol(a) for a in AppProtocol} == {
        AppProtocol.UNKNOWN: None,
        AppProtocol.HTTP11: Protocol.HTTP1,
        AppProtocol.HTTP2: Protocol.HTTP2,
        AppProtocol.GRPC: Protocol.HTTP2,
        AppProtocol.TCP: Protocol.TCP,
        AppProtocol.TLS: Protocol.TCP,
    }


@given(st.binary(max_size=300), st.booleans(), st.integers(1, 400))
def test_sniff_never_raises_and_final_always_decides(data: bytes, final: bool, limit: int) -> None:
    decided = sniff(data, final=final, limit=limit)
    assert decided is None or isinstance(decided, Protocol)
    assert sniff(data, final=True, limit=limit) is not None


@given(st.binary(max_size=64))
def test_sniff_is_consistent_as_bytes_arrive(tail: bytes) -> None:
    for whole in (b"GET /x HTTP/1.1\r\n" + tail, H2_PREFACE + tail, tail):
        decisions = [sniff(whole[:n]) for n in range(len(whole) + 1)]
        settled = [d for d in decisions if d is not None]
        assert all(d is settled[0] for d in settled)


@pytest.mark.parametrize(
    ("data", "final", "expected"),
    [
        (H2_PREFACE, False, True),
        (H2_PREFACE + b"\x00\x00\x12\x04\x00", False, True),
        (b"", False, None),
        (b"PRI * HTTP/2.0\r\n", False, None),
        (H2_PREFACE[:-1], False, None),
        (H2_PREFACE[:-1], True, False),
        (b"", True, False),
        (b"GET / HTTP/1.1\r\n", False, False),
        (b"POST", False, False),
        (b"PRI * HTTP/1.1\r\n", False, False),
        (H2_PREFACE[:-2] + b"XX", False, False),
        (bytes.fromhex("160301"), False, False),
    ],
)
def test_h2_prior_knowledge_decides_on_the_preface_alone(data: bytes, final: bool, expected: bool | None) -> None:
    assert h2_prior_knowledge(data, final=final) is expected


@given(st.binary(max_size=64))
def test_h2_prior_knowledge_never_raises_waits_only_on_a_preface_prefix_and_settles_once(tail: bytes) -> None:
    for whole in (H2_PREFACE + tail, tail, H2_PREFACE[: len(tail) % 24] + tail):
        decisions = [h2_prior_knowledge(whole[:n]) for n in range(len(whole) + 1)]
        waited = [n for n, d in enumerate(decisions) if d is None]
        assert all(H2_PREFACE.startswith(whole[:n]) and n < len(H2_PREFACE) for n in waited)
        settled = [d for d in decisions if d is not None]
        assert all(d is settled[0] for d in settled)
        assert h2_prior_knowledge(whole, final=True) is (whole[:24] == H2_PREFACE)


# A port declared HTTP/2 or gRPC takes HTTP/1.1 too (rule 5): Envoy's automatic codec at Istio's waypoint, which
# istio's TestServices relies on (an HTTP/1.1 client on the ``http2`` port through a waypoint gets L7 handling).


def _first_event(data: bytes) -> Protocol | HttpProtocolError | RequestStarted | None:
    """What a declared-HTTP port makes of a stream that began with ``data`` and then ended: HTTP/2 for the
    preface, else the HTTP/1.1 side's first request or its refusal; None when it would wait for more."""
    if h2_prior_knowledge(data, final=True):
        return Protocol.HTTP2
    server = ServerSide(8192)
    try:
        server.receive_data(data)
        server.receive_data(b"")
        event = server.next_event()
    except HttpProtocolError as exc:
        return exc
    return event if isinstance(event, RequestStarted) else None


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (H2_PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00", Protocol.HTTP2),
        (b"GET /echo HTTP/1.1\r\nHost: web\r\n\r\n", "GET /echo"),
        (b"POST /x HTTP/1.1\r\nHost: web\r\nContent-Length: 0\r\n\r\n", "POST /x"),
        (TLS_CLIENT_HELLO, 400),
        (b"\x00\x01\x02\x03 garbage\r\n\r\n", 400),
        (b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n", 505),  # a broken preface is not HTTP/2; HTTP/1.1 refuses it
    ],
)
def test_a_declared_http2_port_serves_the_preface_as_h2_and_everything_else_as_http1(
    data: bytes, expected: Protocol | str | int
) -> None:
    got = _first_event(data)
    if isinstance(expected, Protocol):
        assert got is expected
    elif isinstance(expected, str):
        assert isinstance(got, RequestStarted) and f"{got.head.method} {got.head.path}" == expected
    else:
        assert isinstance(got, HttpProtocolError) and got.status == expected, got


@given(st.binary(max_size=256))
def test_any_first_bytes_on_a_declared_http2_port_are_h2_a_request_or_a_clear_refusal(data: bytes) -> None:
    got = _first_event(data)
    if isinstance(got, HttpProtocolError):
        assert 400 <= got.status < 600 and got.reason
    elif got is None:  # ended before a head: nothing to answer (the client went away)
        assert data[:24] != H2_PREFACE
    else:
        assert got is Protocol.HTTP2 or isinstance(got, RequestStarted)
        assert (got is Protocol.HTTP2) == (data[:24] == H2_PREFACE)
