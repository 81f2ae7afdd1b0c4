"""ZDS framing: message encoding, the fd rules and the size limit (spec §3.1, §3.2)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.api import zds_pb2
from ambit.zds.errors import Blame, ProtocolError
from ambit.zds.protocol import (
    MAX_MESSAGE_SIZE,
    AddRequest,
    Datagram,
    DelRequest,
    KeepRequest,
    SnapshotSentRequest,
    SuccessorReadyRequest,
    WorkloadInfo,
    decode_hello,
    decode_request,
    decode_response,
    encode_hello,
    encode_request,
    encode_response,
)

INFO = WorkloadInfo("web-0", "default", "web")


def _request_datagram(request: zds_pb2.WorkloadRequest, fds: tuple[int, ...] = ()) -> Datagram:
    return Datagram(request.SerializeToString(), fds)


def test_field_numbers_match_the_spec() -> None:
    fields = {f.name: f.number for f in zds_pb2.WorkloadRequest.DESCRIPTOR.fields}
    assert fields == {"add": 1, "keep": 5, "del": 2, "snapshot_sent": 3, "successor_ready": 1000}  # ours: 1000
    assert zds_pb2.ZdsHello.DESCRIPTOR.fields_by_name["successor_notice"].number == 1000
    assert zds_pb2.DelWorkload.DESCRIPTOR.fields_by_name["uid"].number == 2
    assert zds_pb2.WorkloadInfo.DESCRIPTOR.fields_by_name["service_account"].number == 3
    assert zds_pb2.DESCRIPTOR.package == "istio.workload.zds"


@pytest.mark.parametrize(
    "request_",
    [
        AddRequest("u1", INFO, 7),
        KeepRequest("u2"),
        DelRequest("u3"),
        SnapshotSentRequest(),
        SuccessorReadyRequest(True),
        SuccessorReadyRequest(False),
    ],
)
def test_requests_round_trip_with_their_fds(request_: AddRequest | KeepRequest | DelRequest) -> None:
    data, fds = encode_request(request_)
    assert decode_request(Datagram(data, fds)) == request_


def test_add_with_info_is_parsed() -> None:
    message = zds_pb2.WorkloadRequest()
    message.add.uid = "u1"
    message.add.workload_info.name = "web-0"
    message.add.workload_info.namespace = "default"
    message.add.workload_info.service_account = "web"
    assert decode_request(_request_datagram(message, (9,))) == AddRequest("u1", INFO, 9)


def test_add_without_info_is_rejected() -> None:
    message = zds_pb2.WorkloadRequest()
    message.add.uid = "u1"
    with pytest.raises(ProtocolError, match="workload_info") as info:
        decode_request(_request_datagram(message, (9,)))
    assert info.value.blame is Blame.PEER


@pytest.mark.parametrize("fds", [(), (3, 4)])
def test_add_without_exactly_one_fd_is_rejected(fds: tuple[int, ...]) -> None:
    data, _ = encode_request(AddRequest("u1", INFO, 3))
    with pytest.raises(ProtocolError, match="exactly one fd"):
        decode_request(Datagram(data, fds))


@pytest.mark.parametrize("request_", [DelRequest("u1"), KeepRequest("u1"), SnapshotSentRequest()])
def test_non_add_with_fds_is_rejected(request_: DelRequest | KeepRequest | SnapshotSentRequest) -> None:
    data, _ = encode_request(request_)
    with pytest.raises(ProtocolError, match="no fd"):
        decode_request(Datagram(data, (5,)))


def test_oversized_or_truncated_datagrams_are_rejected() -> None:
    with pytest.raises(ProtocolError, match="over 1024"):
        decode_request(Datagram(b"\x00" * (MAX_MESSAGE_SIZE + 1)))
    data, fds = encode_request(KeepRequest("u"))
    with pytest.raises(ProtocolError, match="truncated"):
        decode_request(Datagram(data, fds, truncated=True))


def test_encoding_an_oversized_message_is_local_misuse() -> None:
    with pytest.raises(ProtocolError) as info:
        encode_request(AddRequest("u", WorkloadInfo("x" * 2000, "ns", "sa"), 3))
    assert info.value.blame is Blame.LOCAL


def test_hello_and_ack_round_trip() -> None:
    assert decode_hello(Datagram(encode_hello())) is True
    assert decode_hello(Datagram(encode_hello(successor_notice=False))) is False
    assert decode_response(Datagram(encode_response())) == ""
    assert decode_response(Datagram(encode_response("bind failed"))) == "bind failed"


def test_hello_with_another_version_is_rejected() -> None:
    with pytest.raises(ProtocolError, match="version"):
        decode_hello(Datagram(zds_pb2.ZdsHello(version=zds_pb2.NOT_USED).SerializeToString()))


def test_an_upstream_hello_asks_for_no_successor_notice_and_an_upstream_decoder_reads_ours() -> None:
    """Backward compatibility both ways: ztunnel's hello has no field 1000; ours parses as a plain V1 hello."""
    assert decode_hello(Datagram(zds_pb2.ZdsHello(version=zds_pb2.V1).SerializeToString())) is False
    upstream = zds_pb2.ZdsHello()
    upstream.ParseFromString(encode_hello())
    assert upstream.version == zds_pb2.V1


def test_a_successor_notice_with_an_fd_is_rejected() -> None:
    data, _ = encode_request(SuccessorReadyRequest(True))
    with pytest.raises(ProtocolError, match="SuccessorReady must carry no fd"):
        decode_request(Datagram(data, (5,)))


def test_request_without_payload_is_rejected() -> None:
    with pytest.raises(ProtocolError, match="without a payload"):
        decode_request(Datagram(b""))


datagrams = st.builds(
    Datagram,
    st.binary(max_size=MAX_MESSAGE_SIZE + 8),
    st.lists(st.integers(0, 1000), max_size=3).map(tuple),
    st.booleans(),
)


@given(datagrams)
def test_arbitrary_datagrams_raise_only_protocol_error(datagram: Datagram) -> None:
    for decode in (decode_request, decode_response, decode_hello):
        with contextlib.suppress(ProtocolError):
            decode(datagram)
