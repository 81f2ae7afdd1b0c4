"""Malformed ZDS messages around the hand-over's fields (``ZdsHello.successor_notice`` and
``WorkloadRequest.successor_ready``, both field 1000), generated at the wire level: field numbers, wire types and
values a peer may send, in any order, with or without descriptors.

What must hold whatever comes: the decoders raise nothing but :class:`ProtocolError`; a hello's notice is the last
field-1000 value as proto3 reads a bool; a ``SuccessorReady`` is only ever read from a datagram without descriptors;
and a node proxy's session opens listeners only for an ``Add`` that came with exactly one descriptor (that one, for
that uid), hears of a successor only from a ``SuccessorReady`` without descriptors, and closes every other
descriptor it is sent.
"""

from __future__ import annotations

import contextlib

from hypothesis import given
from hypothesis import strategies as st

from ambit.api import zds_pb2
from ambit.zds.commands import CloseFds, OpenPodListeners
from ambit.zds.errors import ProtocolError
from ambit.zds.events import SuccessorReported
from ambit.zds.protocol import (
    AddRequest,
    Datagram,
    SuccessorReadyRequest,
    decode_hello,
    decode_request,
    encode_request,
)
from ambit.zds.proxy import ProxySession

SUCCESSOR = 1000


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number: int, wire: int, value: int | bytes) -> bytes:
    tag = varint(number << 3 | wire)
    if wire == 0:
        assert isinstance(value, int)
        return tag + varint(value)
    if wire == 2:
        assert isinstance(value, bytes)
        return tag + varint(len(value)) + value
    if wire == 1:
        assert isinstance(value, bytes)
        return tag + value[:8].ljust(8, b"\0")
    assert isinstance(value, bytes)
    return tag + value[:4].ljust(4, b"\0")


numbers = st.sampled_from([1, 2, 3, 4, 5, SUCCESSOR, 999, 1001, 2**29 - 1])
values = st.one_of(st.integers(0, 2**64 - 1), st.binary(max_size=40))


@st.composite
def fields(draw: st.DrawFn) -> bytes:
    number, wire = draw(numbers), draw(st.sampled_from([0, 1, 2, 5]))
    if wire == 0:
        return field(number, 0, draw(st.integers(0, 2**64 - 1)))
    inner = draw(
        st.one_of(
            st.binary(max_size=40),
            st.builds(lambda ready: field(1, 0, ready), st.integers(0, 2**64 - 1)),  # a SuccessorReady's body
            st.builds(lambda uid: field(1, 2, uid.encode()), st.text(max_size=8)),  # a uid
        )
    )
    return field(number, wire, inner)


messages = st.lists(fields(), max_size=6).map(b"".join)
fd_sets = st.lists(st.integers(3, 60), max_size=3, unique=True).map(tuple)


@given(messages, fd_sets, st.booleans())
def test_a_request_decodes_to_a_typed_request_or_a_protocol_error_and_never_takes_fds_it_may_not(
    data: bytes, fds: tuple[int, ...], truncated: bool
) -> None:
    try:
        request = decode_request(Datagram(data, fds, truncated))
    except ProtocolError:
        return
    assert not truncated
    if isinstance(request, AddRequest):
        assert len(fds) == 1 and request.fd == fds[0]
    else:
        assert fds == ()
    if isinstance(request, SuccessorReadyRequest):
        assert isinstance(request.ready, bool)
        assert varint(SUCCESSOR << 3 | 2) in data


@given(st.lists(st.tuples(st.sampled_from([1, SUCCESSOR, 7]), st.integers(0, 2**64 - 1)), max_size=6))
def test_a_hellos_notice_is_its_last_field_1000_read_as_a_proto3_bool(pairs: list[tuple[int, int]]) -> None:
    data = b"".join(field(number, 0, value) for number, value in pairs)
    # An enum field is an int32: protobuf (and ztunnel's prost) keep a longer varint's low 32 bits, signed.
    versions = [((v & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000 for n, v in pairs if n == 1]
    notices = [v for n, v in pairs if n == SUCCESSOR]
    try:
        notice = decode_hello(Datagram(data))
    except ProtocolError:
        assert not versions or versions[-1] != zds_pb2.V1
        return
    assert versions and versions[-1] == zds_pb2.V1
    assert notice is bool(notices and notices[-1])


@given(messages)
def test_a_hello_with_any_extra_fields_is_a_bool_or_a_protocol_error(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        assert isinstance(decode_hello(Datagram(data)), bool)


def _valid(kind: str, uid: str, ready: bool) -> bytes:
    message = zds_pb2.WorkloadRequest()
    if kind == "add":
        message.add.uid = uid
        message.add.workload_info.name = "web-0"
        message.add.workload_info.namespace = "apps"
    elif kind == "keep":
        message.keep.uid = uid
    elif kind == "del":
        getattr(message, "del").uid = uid
    elif kind == "snapshot":
        message.snapshot_sent.SetInParent()
    else:
        return encode_request(SuccessorReadyRequest(ready))[0]
    return message.SerializeToString()


steps = st.lists(
    st.tuples(
        st.one_of(
            st.builds(
                _valid,
                st.sampled_from(["add", "keep", "del", "snapshot", "successor"]),
                st.sampled_from(["a", "b"]),
                st.booleans(),
            ),
            messages,
        ),
        fd_sets,
        st.booleans(),  # whether the shell opens the listeners of an Add (else they fail)
    ),
    max_size=12,
)


@given(steps)
def test_a_proxy_session_opens_listeners_only_for_an_add_with_one_fd_and_closes_every_other_fd(
    sequence: list[tuple[bytes, tuple[int, ...], bool]],
) -> None:
    session = ProxySession()
    session.connection_made()
    for data, fds, opens in sequence:
        outs = session.datagram_received(Datagram(data, fds))
        opened = [o for o in outs if isinstance(o, OpenPodListeners)]
        closed = {fd for o in outs if isinstance(o, CloseFds) for fd in o.fds}
        reported = [o for o in outs if isinstance(o, SuccessorReported)]
        try:
            request = decode_request(Datagram(data, fds))
        except ProtocolError:
            request = None
        if opened:
            assert isinstance(request, AddRequest) and len(opened) == 1
            assert (opened[0].uid, opened[0].fd) == (request.uid, request.fd) and fds == (request.fd,)
        else:
            assert closed == set(fds) or not fds, (outs, fds)  # every fd sent is closed unless handed over
        for event in reported:
            assert isinstance(request, SuccessorReadyRequest) and fds == () and event.ready == request.ready
        for o in opened:
            if opens:
                session.listeners_opened(o.uid)
            else:
                session.listeners_failed(o.uid, "bind failed")
        if session.state.value == "disconnected":
            session.connection_made()
