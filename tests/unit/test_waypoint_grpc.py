"""The waypoint's gRPC specifics without sockets: how local answers and retries read gRPC statuses."""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from hypothesis import given
from hypothesis import strategies as st

from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.forwarded_response import retry_status
from ambit.waypoint.http1 import ResponseStarted
from ambit.waypoint.http2_proxy import _percent_encoded, grpc_status_of
from ambit.waypoint.http2_upstream import request_fields


def test_http_statuses_map_to_grpc_statuses_as_grpc_maps_them() -> None:
    assert [grpc_status_of(s) for s in (400, 401, 403, 404, 429, 502, 503, 504, 500, 418)] == [
        13, 16, 7, 12, 14, 14, 14, 14, 2, 2,
    ]  # fmt: skip


def test_unavailable_and_cancelled_in_a_response_head_are_judged_as_503() -> None:
    def head(status: int, grpc: str | None) -> ResponseStarted:
        return ResponseStarted(
            status, (("content-type", "application/grpc"),) + ((("grpc-status", grpc),) if grpc else ())
        )

    assert retry_status(head(200, "14")) == 503
    assert retry_status(head(200, "1")) == 503
    assert retry_status(head(200, "5")) == 200
    assert retry_status(head(200, None)) == 200
    assert retry_status(head(503, None)) == 503


def test_te_trailers_is_the_one_hop_by_hop_field_an_http2_request_keeps() -> None:
    head = RequestHead(
        "POST", "/a.B/C", "a:1", (("te", "trailers"), ("connection", "close"), ("content-type", "application/grpc"))
    )
    assert request_fields(head) == [("content-type", "application/grpc"), ("te", "trailers")]


@given(st.text(max_size=64))
def test_grpc_messages_are_percent_encoded_to_printable_ascii(text: str) -> None:
    encoded = _percent_encoded(text)
    assert all(0x20 <= ord(c) <= 0x7E for c in encoded)
    assert unquote_to_bytes(encoded) == text.encode("utf-8", "replace")
