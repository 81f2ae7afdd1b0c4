"""gRPC calls on the HTTP/2 engine (hbone/grpc_calls.py): the pure rules, with hypothesis on the message reader, the
timeout and the status parser (tests/integration/test_grpc_calls_interop.py makes real calls to grpcio)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.hbone import wire
from ambit.hbone.errors import GrpcMessageError, HboneError
from ambit.hbone.grpc_calls import (
    MAX_STATUS_MESSAGE,
    PREFIX,
    CallResponse,
    CallStatus,
    MessageQueue,
    MessageReader,
    StatusCode,
    call_status,
    encode_message,
    encode_timeout,
    request_headers,
)

# -- messages (rule 2) --------------------------------------------------------------------------------------------


@given(st.lists(st.binary(max_size=300), max_size=8), st.lists(st.integers(1, 50), min_size=1, max_size=20))
def test_messages_cut_anywhere_come_back_whole_and_in_order(payloads: list[bytes], cuts: list[int]) -> None:
    wire = b"".join(encode_message(p) for p in payloads)
    reader = MessageReader(max_length=300)
    got: list[bytes] = []
    at, i = 0, 0
    while at < len(wire):
        step = cuts[i % len(cuts)]
        got += reader.feed(wire[at : at + step])
        at, i = at + step, i + 1
    assert got == payloads and reader.pending == 0


def test_a_length_past_the_bound_is_refused_from_its_prefix_before_any_payload() -> None:
    reader = MessageReader(max_length=1000)
    with pytest.raises(GrpcMessageError, match="1001 bytes"):
        reader.feed(PREFIX.pack(0, 1001))
    assert reader.pending <= PREFIX.size


def test_a_compressed_message_is_refused() -> None:
    with pytest.raises(GrpcMessageError, match="flag 1"):
        MessageReader(max_length=10).feed(PREFIX.pack(1, 3) + b"abc")


@given(st.binary(max_size=200))
def test_any_bytes_give_messages_or_our_error_and_hold_at_most_one_message(data: bytes) -> None:
    reader = MessageReader(max_length=64)
    try:
        for message in reader.feed(data):
            assert len(message) <= 64
    except GrpcMessageError:
        return
    assert reader.pending <= PREFIX.size + 64


# -- heads and timeouts (rules 1 and 3) ---------------------------------------------------------------------------


def test_a_request_head_carries_the_grpc_fields_the_timeout_and_the_metadata() -> None:
    headers = request_headers("/istio.v1.auth.IstioCertificateService/CreateCertificate", [("clusterid", "c1")], 2.5)
    assert headers == [
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("grpc-timeout", "2500m"),
        ("clusterid", "c1"),
    ]


@pytest.mark.parametrize("name", ["grpc-status", ":path", "te", "content-type", "Authorization", "connection"])
def test_reserved_or_upper_case_metadata_is_refused(name: str) -> None:
    with pytest.raises(HboneError, match="cannot be call metadata"):
        request_headers("/a.B/C", [(name, "x")])


@pytest.mark.parametrize("path", ["", "a.B/C", "/a.B", "/a/b/c", "/a.B/"])
def test_a_path_that_is_not_service_and_method_is_refused(path: str) -> None:
    with pytest.raises(HboneError, match="gRPC path"):
        request_headers(path)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0001, "1m"), (1.5, "1500m"), (99_999.999, "99999999m"), (100_000, "100000S"), (1e9, "16666667M")],
)
def test_timeouts_are_at_most_eight_digits_rounded_up(seconds: float, text: str) -> None:
    assert encode_timeout(seconds) == text


@given(st.floats(min_value=1e-6, max_value=3e11))  # 99,999,999 hours is the most gRPC can say
def test_a_timeout_never_says_less_than_the_deadline(seconds: float) -> None:
    text = encode_timeout(seconds)
    match = re.fullmatch(r"(\d{1,8})([mSMH])", text)
    assert match is not None
    per = {"m": 0.001, "S": 1, "M": 60, "H": 3600}[match.group(2)]
    assert int(match.group(1)) * per >= seconds * (1 - 1e-12)


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf")])
def test_a_timeout_that_is_not_positive_is_refused(seconds: float) -> None:
    with pytest.raises(HboneError, match="timeout"):
        encode_timeout(seconds)


# -- status (rule 4) ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "http_status", "expected"),
    [
        ([("grpc-status", "0")], 200, CallStatus(StatusCode.OK)),
        ([("grpc-status", "14"), ("grpc-message", "no%20healthy%20upstream")], 200,
         CallStatus(StatusCode.UNAVAILABLE, "no healthy upstream")),
        ([("grpc-status", "16"), ("grpc-message", "bad%0Atoken")], 200,
         CallStatus(StatusCode.UNAUTHENTICATED, "bad\\ntoken")),
        ([("grpc-status", "99")], 200, CallStatus(StatusCode.UNKNOWN)),
        ([("grpc-status", "x")], 200, CallStatus(StatusCode.UNKNOWN)),
        ([], 200, CallStatus(StatusCode.UNKNOWN, "the call ended without a grpc-status")),
        ([], 503, CallStatus(StatusCode.UNAVAILABLE, "HTTP status 503")),
        ([], 401, CallStatus(StatusCode.UNAUTHENTICATED, "HTTP status 401")),
    ],
)  # fmt: skip
def test_the_status_of_a_call(headers: list[tuple[str, str]], http_status: int, expected: CallStatus) -> None:
    assert call_status(headers, http_status) == expected


@given(st.lists(st.tuples(st.sampled_from(["grpc-status", "grpc-message", "x"]), st.text(max_size=2000))))
def test_any_trailers_give_a_status_with_a_one_line_message(headers: list[tuple[str, str]]) -> None:
    status = call_status(headers)
    assert isinstance(status.code, StatusCode)
    assert "\n" not in str(status) and len(status.message) <= MAX_STATUS_MESSAGE * 10


# -- one call's response side (rule 5) ----------------------------------------------------------------------------

OK_HEAD = [("content-type", "application/grpc")]


def test_a_response_gives_its_messages_then_the_status_of_its_trailers() -> None:
    response = CallResponse(1024)
    response.head(200, OK_HEAD)
    assert response.data(encode_message(b"one") + encode_message(b"tw")[:4]) == [b"one"]
    assert response.data(encode_message(b"tw")[4:]) == [b"tw"]
    response.trailers([("grpc-status", "0")])
    response.ended()
    assert response.status == CallStatus(StatusCode.OK)


def test_a_trailers_only_refusal_is_its_code_and_message() -> None:
    response = CallResponse(1024)
    response.head(200, [*OK_HEAD, ("grpc-status", "16"), ("grpc-message", "bad%20token")])
    assert response.status == CallStatus(StatusCode.UNAUTHENTICATED, "bad token")
    assert response.data(encode_message(b"late")) == []


@pytest.mark.parametrize(
    ("status", "headers", "code"),
    [
        (503, [("content-type", "text/plain")], StatusCode.UNAVAILABLE),
        (404, [], StatusCode.UNIMPLEMENTED),
        (200, [("content-type", "text/html")], StatusCode.UNKNOWN),
        (200, [], StatusCode.UNKNOWN),
    ],
)
def test_a_head_that_is_not_grpc_ends_the_call(status: int, headers: list[tuple[str, str]], code: StatusCode) -> None:
    response = CallResponse(1024)
    response.head(status, headers)
    assert response.status is not None and response.status.code is code


def test_an_oversized_message_is_resource_exhausted_and_a_compressed_one_internal() -> None:
    big = CallResponse(10)
    big.head(200, OK_HEAD)
    assert big.data(PREFIX.pack(0, 11)) == []
    assert big.status is not None and big.status.code is StatusCode.RESOURCE_EXHAUSTED
    squeezed = CallResponse(10)
    squeezed.head(200, OK_HEAD)
    assert squeezed.data(PREFIX.pack(1, 3) + b"abc") == []
    assert squeezed.status is not None and squeezed.status.code is StatusCode.INTERNAL


def test_an_ok_status_in_the_middle_of_a_message_is_internal_and_the_part_is_never_delivered() -> None:
    response = CallResponse(1024)
    response.head(200, OK_HEAD)
    assert response.data(encode_message(b"truncated")[:8]) == []
    response.trailers([("grpc-status", "0")])
    assert response.status is not None and response.status.code is StatusCode.INTERNAL


def test_a_stream_that_ends_without_trailers_is_unknown_and_a_reset_is_mapped_as_grpc_maps_it() -> None:
    ended = CallResponse(1024)
    ended.head(200, OK_HEAD)
    ended.ended()
    assert ended.status is not None and ended.status.code is StatusCode.UNKNOWN
    for code, expected in [
        (wire.REFUSED_STREAM, StatusCode.UNAVAILABLE),
        (wire.CANCEL, StatusCode.CANCELLED),
        (wire.ENHANCE_YOUR_CALM, StatusCode.RESOURCE_EXHAUSTED),
        (wire.PROTOCOL_ERROR, StatusCode.INTERNAL),
    ]:
        reset = CallResponse(1024)
        reset.reset(code, remote=True)
        assert reset.status is not None and reset.status.code is expected


def test_the_first_outcome_of_a_call_is_final() -> None:
    response = CallResponse(1024)
    response.head(200, OK_HEAD)
    response.trailers([("grpc-status", "5"), ("grpc-message", "first")])
    response.reset(wire.CANCEL, remote=True)
    response.fail(CallStatus(StatusCode.UNAVAILABLE, "later"))
    assert response.status == CallStatus(StatusCode.NOT_FOUND, "first")


_EVENTS = st.one_of(
    st.tuples(
        st.just("head"),
        st.integers(100, 599),
        st.lists(
            st.tuples(st.sampled_from(["content-type", "grpc-status", "grpc-message", "x"]), st.text(max_size=40)),
            max_size=4,
        ),
    ),
    st.tuples(st.just("data"), st.binary(max_size=64)),
    st.tuples(
        st.just("trailers"),
        st.lists(st.tuples(st.sampled_from(["grpc-status", "grpc-message", "x"]), st.text(max_size=40)), max_size=3),
    ),
    st.tuples(st.just("ended")),
    st.tuples(st.just("reset"), st.integers(0, 2**32 - 1)),
)


@given(st.lists(_EVENTS, max_size=12))
def test_any_sequence_of_events_ends_in_one_status_without_raising(events: list[tuple]) -> None:  # type: ignore[type-arg]
    response = CallResponse(32)
    delivered = 0
    for event in events:
        kind, *args = event
        if kind == "data":
            delivered += sum(len(m) for m in response.data(args[0]))
        else:
            getattr(response, kind)(*args, **({"remote": True} if kind == "reset" else {}))
    response.ended()
    assert response.status is not None and "\n" not in response.status.message
    assert delivered <= 32 * 64


# -- flow control by the consumer (rule 6) -------------------------------------------------------------------------


def test_bytes_of_a_message_still_arriving_are_given_back_at_once() -> None:
    queue = MessageQueue()
    assert queue.arrived([], 1000) == 1000


def test_after_a_complete_message_waits_everything_is_held_until_the_consumer_takes_all() -> None:
    queue = MessageQueue()
    assert queue.arrived([b"a"], 10) == 0
    assert queue.arrived([], 500) == 0
    assert queue.arrived([b"b", b"c"], 20) == 0
    assert queue.take() == (b"a", 0)
    assert queue.take() == (b"b", 0)
    assert queue.take() == (b"c", 530)
    assert queue.held == 0 and len(queue) == 0


def test_a_cancelled_call_gives_back_what_its_unread_messages_held() -> None:
    queue = MessageQueue()
    queue.arrived([b"a"], 10)
    queue.arrived([b"b"], 20)
    assert queue.drop() == 30
    assert (len(queue), queue.held, queue.arrived([], 5)) == (0, 0, 5)


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1000), st.booleans()), max_size=40))
def test_credit_given_back_is_exactly_what_arrived_once_the_consumer_is_done(
    steps: list[tuple[int, int, bool]],
) -> None:
    """Nothing is lost or given twice, and while a message waits unread no credit is given back at all."""
    queue = MessageQueue()
    arrived = given_back = 0
    for count, flow, take in steps:
        waiting = len(queue) > 0
        credit = queue.arrived([b"m"] * count, flow)
        arrived += flow
        given_back += credit
        assert not (waiting and credit)
        if take and len(queue):
            given_back += queue.take()[1]
    while len(queue):
        given_back += queue.take()[1]
    assert given_back == arrived
