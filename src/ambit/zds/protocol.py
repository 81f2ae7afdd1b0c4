"""ZDS framing (spec §3.2): one protobuf message per SOCK_SEQPACKET datagram, fds carried alongside.

Theory of operation: the transport hands over a :class:`Datagram` (bytes, the SCM_RIGHTS fds that came with it and
whether the kernel truncated anything); the decoders here turn it into a typed request, response or hello, or raise
:class:`ProtocolError` blamed on the peer. Nothing here touches a socket, a clock or an fd: fds are plain ints whose
fate (hand over, close) is decided by the session that called the decoder.

Invariants:
- a datagram is at most :data:`MAX_MESSAGE_SIZE` bytes, both ways; an encoder refuses a bigger message (local blame),
  a decoder rejects one (peer blame), and so does a datagram the kernel truncated;
- ``AddWorkload`` carries exactly one fd, every other message none;
- decoders raise nothing but :class:`ProtocolError`, whatever the bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from google.protobuf.message import DecodeError

from ambit.api import zds_pb2
from ambit.zds.errors import Blame, ProtocolError

MAX_MESSAGE_SIZE = 1024
"""Both sides read into a buffer of this size; a bigger message cannot be delivered (spec §3.2)."""


@dataclass(frozen=True, slots=True)
class Datagram:
    """One received SEQPACKET datagram. ``truncated`` is set when MSG_TRUNC or MSG_CTRUNC came back."""

    data: bytes
    fds: tuple[int, ...] = ()
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class WorkloadInfo:
    """Pod name, namespace and ``spec.serviceAccountName``."""

    name: str
    namespace: str
    service_account: str


@dataclass(frozen=True, slots=True)
class AddRequest:
    uid: str
    info: WorkloadInfo
    fd: int


@dataclass(frozen=True, slots=True)
class KeepRequest:
    uid: str


@dataclass(frozen=True, slots=True)
class DelRequest:
    uid: str


@dataclass(frozen=True, slots=True)
class SnapshotSentRequest:
    pass


@dataclass(frozen=True, slots=True)
class SuccessorReadyRequest:
    """Ambit's extension (only to a proxy whose hello asked for it): whether a later proxy holds every pod."""

    ready: bool


Request = AddRequest | KeepRequest | DelRequest | SnapshotSentRequest | SuccessorReadyRequest


_M = TypeVar("_M", zds_pb2.ZdsHello, zds_pb2.WorkloadRequest, zds_pb2.WorkloadResponse)


def _checked(data: bytes) -> bytes:
    if len(data) > MAX_MESSAGE_SIZE:
        raise ProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_SIZE}", Blame.LOCAL)
    return data


def _parse(message: _M, datagram: Datagram) -> _M:
    if datagram.truncated or len(datagram.data) > MAX_MESSAGE_SIZE:
        raise ProtocolError(f"datagram truncated or over {MAX_MESSAGE_SIZE} bytes")
    try:
        message.ParseFromString(datagram.data)
    except DecodeError as exc:
        raise ProtocolError(f"undecodable {type(message).__name__}: {exc}") from None
    return message


def _without_fds(datagram: Datagram, what: str) -> None:
    if datagram.fds:
        raise ProtocolError(f"{what} must carry no fd, got {len(datagram.fds)}")


def encode_hello(successor_notice: bool = True) -> bytes:
    """Our hello; ``successor_notice`` asks the agent for :class:`SuccessorReadyRequest` (Ambit's extension)."""
    return _checked(zds_pb2.ZdsHello(version=zds_pb2.V1, successor_notice=successor_notice).SerializeToString())


def decode_hello(datagram: Datagram) -> bool:
    """Accept a ``ZdsHello{version: V1}`` without fds, or raise; returns whether it asked for successor notices."""
    hello = _parse(zds_pb2.ZdsHello(), datagram)
    _without_fds(datagram, "ZdsHello")
    if hello.version != zds_pb2.V1:
        raise ProtocolError(f"unsupported ZDS version {hello.version}")
    return hello.successor_notice


def encode_request(request: Request) -> tuple[bytes, tuple[int, ...]]:
    """Serialize a request; returns the datagram bytes and the fds to send with it."""
    message = zds_pb2.WorkloadRequest()
    fds: tuple[int, ...] = ()
    match request:
        case AddRequest(uid, info, fd):
            message.add.uid = uid
            message.add.workload_info.name = info.name
            message.add.workload_info.namespace = info.namespace
            message.add.workload_info.service_account = info.service_account
            fds = (fd,)
        case KeepRequest(uid):
            message.keep.uid = uid
        case DelRequest(uid):
            getattr(message, "del").uid = uid
        case SnapshotSentRequest():
            message.snapshot_sent.SetInParent()
        case SuccessorReadyRequest(ready):
            message.successor_ready.SetInParent()
            message.successor_ready.ready = ready
    return _checked(message.SerializeToString()), fds


def decode_request(datagram: Datagram) -> Request:
    """Turn a datagram into a request, enforcing the fd rule; raise :class:`ProtocolError` otherwise."""
    message = _parse(zds_pb2.WorkloadRequest(), datagram)
    kind = message.WhichOneof("payload")
    if kind == "add":
        if len(datagram.fds) != 1:
            raise ProtocolError(f"AddWorkload must carry exactly one fd, got {len(datagram.fds)}")
        if not message.add.HasField("workload_info"):
            raise ProtocolError("AddWorkload without workload_info")
        info = message.add.workload_info
        return AddRequest(
            message.add.uid, WorkloadInfo(info.name, info.namespace, info.service_account), datagram.fds[0]
        )
    if kind == "keep":
        _without_fds(datagram, "KeepWorkload")
        return KeepRequest(message.keep.uid)
    if kind == "del":
        _without_fds(datagram, "DelWorkload")
        return DelRequest(getattr(message, "del").uid)
    if kind == "snapshot_sent":
        _without_fds(datagram, "SnapshotSent")
        return SnapshotSentRequest()
    if kind == "successor_ready":
        _without_fds(datagram, "SuccessorReady")
        return SuccessorReadyRequest(message.successor_ready.ready)
    raise ProtocolError("WorkloadRequest without a payload")


def encode_response(error: str = "") -> bytes:
    """An Ack; a non-empty ``error`` makes it a nack."""
    message = zds_pb2.WorkloadResponse()
    message.ack.error = error
    return _checked(message.SerializeToString())


def decode_response(datagram: Datagram) -> str:
    """Return the Ack's error string (empty = success), or raise."""
    message = _parse(zds_pb2.WorkloadResponse(), datagram)
    _without_fds(datagram, "WorkloadResponse")
    if message.WhichOneof("payload") != "ack":
        raise ProtocolError("WorkloadResponse without an ack")
    return message.ack.error
