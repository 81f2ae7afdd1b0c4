"""gRPC calls over the HTTP/2 engine, sans-IO: request heads, length-prefixed messages and the call's status.

Theory of operation
-------------------
A gRPC call is an HTTP/2 POST (:class:`~ambit.hbone.messages.Http2ClientConnection` sends it): this module says
what goes in the head, how the DATA of each direction is cut into messages, and what the call's outcome is. It is
the sans-IO half of the node proxy's xDS and CA clients without grpcio (docs/node-proxy-footprint.md, step 2);
:mod:`ambit.xds.grpc_channel` is the asyncio shell that drives it.

Rules:

1. A request head is ``:method POST``, ``:scheme https``, ``:path /<service>/<method>``, ``:authority`` (the
   engine's ``send_request``), then ``content-type: application/grpc``, ``te: trailers``, ``grpc-timeout`` when
   the call has a deadline, and the caller's metadata (lower-case names; the reserved ``grpc-`` names,
   pseudo-headers and connection-specific names are refused with :class:`~ambit.hbone.errors.HboneError`: they are
   the layer's, not the caller's).
2. A message on the wire is a 1-byte flag, a 4-byte big-endian length and the payload. We offer no
   ``grpc-encoding``, so a flag other than 0 (compressed) is the peer's error; so is a length above the reader's
   bound, refused from the 5-byte prefix before any of the payload is buffered
   (:class:`~ambit.hbone.errors.GrpcMessageError`). What a :class:`MessageReader`
   holds is at most one prefix and one message of at most ``max_length`` bytes.
3. A timeout is sent as at most 8 digits and a unit (RFC-style ``grpc-timeout``: ``m`` milliseconds up to 99,999
   seconds, then ``S``, then ``M``, then ``H``), rounded up, so the server never sees a shorter deadline.
4. The status of a call is in its trailers, or in the response head of a trailers-only response. ``grpc-status``
   is a decimal code; a missing or malformed one is UNKNOWN (2) and, when the HTTP status is not 200, the code
   gRPC maps that HTTP status to. ``grpc-message`` is percent-decoded (invalid UTF-8 replaced) and cut to
   :data:`MAX_STATUS_MESSAGE` characters, with control characters shown escaped (and the escaped text cut to
   that length again), for one-line errors. ``grpc-retry-pushback-ms`` (the server's retry hint) is kept when it is
   a decimal of at most 10 digits, as seconds at most :data:`MAX_PUSHBACK`; anything else is no hint.
5. A :class:`CallResponse` reads one call's response side from the engine's events: a response head that is not
   HTTP 200 with a ``content-type`` of ``application/grpc`` ends the call (its status from the head, else the
   HTTP status's code, else UNKNOWN); messages are cut by rule 2 (a refused one ends the call: RESOURCE_EXHAUSTED
   for the size, INTERNAL for the flag, as gRPC says them); trailers give the status, and an OK status with part
   of a message still held is INTERNAL (a truncated message is never delivered); a stream that ends without
   trailers is UNKNOWN; a reset is the code gRPC maps the HTTP/2 error code to. The first outcome is final.
6. Flow control follows the consumer (:class:`MessageQueue`): bytes of a message still arriving are given back to
   the windows at once (else a message larger than the window could never complete), but once a complete message
   waits unread, everything that arrives after it is held back until the consumer has taken every waiting message.
   A consumer that stops reading thus holds at most one message plus one stream window.
"""

from __future__ import annotations

import collections
import enum
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from ambit.hbone import wire
from ambit.hbone.errors import GrpcMessageError, GrpcMessageTooLarge, HboneError

PREFIX = struct.Struct("!BI")
_GRPC_CONTENT_TYPES = ("application/grpc+", "application/grpc;")
MAX_PUSHBACK = 600.0
"""Seconds: the longest retry hint taken from a server (rule 4)."""
MAX_STATUS_MESSAGE = 512
_RESERVED = frozenset({"content-type", "te", "connection", "keep-alive", "transfer-encoding", "upgrade", "host"})


class StatusCode(enum.IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


_HTTP_TO_STATUS = {
    400: StatusCode.INTERNAL,
    401: StatusCode.UNAUTHENTICATED,
    403: StatusCode.PERMISSION_DENIED,
    404: StatusCode.UNIMPLEMENTED,
    429: StatusCode.UNAVAILABLE,
    502: StatusCode.UNAVAILABLE,
    503: StatusCode.UNAVAILABLE,
    504: StatusCode.UNAVAILABLE,
}


@dataclass(frozen=True, slots=True)
class CallStatus:
    code: StatusCode
    message: str = ""
    pushback: float | None = None
    """Seconds the server asked the client to wait before it tries again (``grpc-retry-pushback-ms``), if any."""

    @property
    def ok(self) -> bool:
        return self.code is StatusCode.OK

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}" if self.message else self.code.name


def encode_timeout(seconds: float) -> str:
    """Rule 3: the ``grpc-timeout`` value of a deadline ``seconds`` from now (at least 1 ms)."""
    if not seconds > 0 or math.isinf(seconds):
        raise HboneError(f"a call timeout must be a positive number of seconds, not {seconds!r}")
    for unit, per_second in (("m", 1000), ("S", 1), ("M", 1 / 60), ("H", 1 / 3600)):
        value = max(1, math.ceil(seconds * per_second))
        if value <= 99_999_999:
            return f"{value}{unit}"
    raise HboneError(f"a call timeout of {seconds} s is longer than gRPC can say")


def request_headers(
    path: str, metadata: Sequence[tuple[str, str]] = (), timeout: float | None = None
) -> list[tuple[str, str]]:
    """Rule 1: the regular fields of a call to ``path`` (``/package.Service/Method``), which the caller sends with
    ``Http2ClientConnection.send_request("POST", "https", authority, path, ...)``."""
    if not path.startswith("/") or path.count("/") != 2 or path.endswith("/"):
        raise HboneError(f"a gRPC path is /<service>/<method>, not {path!r}")
    headers = [("content-type", "application/grpc"), ("te", "trailers")]
    if timeout is not None:
        headers.append(("grpc-timeout", encode_timeout(timeout)))
    for name, value in metadata:
        if name != name.lower() or name.startswith((":", "grpc-")) or name in _RESERVED:
            raise HboneError(f"{name!r} cannot be call metadata")
        headers.append((name, value))
    return headers


def encode_message(payload: bytes) -> bytes:
    """Rule 2: one uncompressed message."""
    if len(payload) > 0xFFFFFFFF:
        raise HboneError("a gRPC message is at most 4 GiB")
    return PREFIX.pack(0, len(payload)) + payload


class MessageReader:
    """Cuts one direction's DATA into messages (rule 2); :class:`GrpcMessageError` on what breaks it."""

    __slots__ = ("_buffer", "_need", "max_length")

    def __init__(self, max_length: int) -> None:
        self.max_length = max_length
        self._buffer = bytearray()
        self._need: int | None = None  # the payload length once the prefix is read

    @property
    def pending(self) -> int:
        """Bytes held of a message not yet complete (0 between messages: the stream may end there)."""
        return len(self._buffer) + (PREFIX.size if self._need is not None else 0)

    def feed(self, data: bytes) -> list[bytes]:
        """The messages ``data`` completes, in order."""
        messages: list[bytes] = []
        view = memoryview(data)
        while view:
            if self._need is None:
                take = PREFIX.size - len(self._buffer)
                self._buffer += view[:take]
                view = view[take:]
                if len(self._buffer) < PREFIX.size:
                    break
                flag, length = PREFIX.unpack(self._buffer)
                if flag != 0:
                    raise GrpcMessageError(f"the peer sent a message with flag {flag} (we accept no compression)")
                if length > self.max_length:
                    raise GrpcMessageTooLarge(f"the peer sent a message of {length} bytes (at most {self.max_length})")
                self._buffer.clear()
                self._need = length
            take = self._need - len(self._buffer)
            self._buffer += view[:take]
            view = view[take:]
            if len(self._buffer) == self._need:
                messages.append(bytes(self._buffer))
                self._buffer.clear()
                self._need = None
        return messages


def call_status(headers: Sequence[tuple[str, str]], http_status: int = 200) -> CallStatus:
    """Rule 4: the status in a call's trailers (or its trailers-only head)."""
    code_text = next((v for n, v in headers if n == "grpc-status"), None)
    message = next((v for n, v in headers if n == "grpc-message"), "")
    pushback_text = next((v for n, v in headers if n == "grpc-retry-pushback-ms"), "")
    pushback = None
    if pushback_text.isascii() and pushback_text.isdigit() and len(pushback_text) <= 10:
        pushback = min(int(pushback_text) / 1000, MAX_PUSHBACK)
    code = StatusCode.UNKNOWN
    if code_text is not None and code_text.isascii() and code_text.isdigit() and len(code_text) <= 3:
        code = StatusCode(int(code_text)) if int(code_text) in StatusCode._value2member_map_ else StatusCode.UNKNOWN
    elif http_status != 200:
        code = _HTTP_TO_STATUS.get(http_status, StatusCode.UNKNOWN)
        message = message or f"HTTP status {http_status}"
    elif code_text is None:
        message = message or "the call ended without a grpc-status"
    return CallStatus(code, _readable(message), pushback)


def _readable(message: str) -> str:
    text = unquote_to_bytes(message[: MAX_STATUS_MESSAGE * 3]).decode("utf-8", "replace")[:MAX_STATUS_MESSAGE]
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)[:MAX_STATUS_MESSAGE]


_RESET_TO_STATUS = {
    wire.REFUSED_STREAM: StatusCode.UNAVAILABLE,
    wire.CANCEL: StatusCode.CANCELLED,
    wire.ENHANCE_YOUR_CALM: StatusCode.RESOURCE_EXHAUSTED,
    wire.INADEQUATE_SECURITY: StatusCode.PERMISSION_DENIED,
}


class CallResponse:
    """One call's response side (rule 5): feed it the stream's events; :attr:`status` is set once it is over."""

    __slots__ = ("_head_seen", "_reader", "status")

    def __init__(self, max_length: int) -> None:
        self._reader = MessageReader(max_length)
        self._head_seen = False
        self.status: CallStatus | None = None

    def head(self, http_status: int, headers: Sequence[tuple[str, str]]) -> None:
        if self.status is not None:
            return
        self._head_seen = True
        content_type = next((v for n, v in headers if n == "content-type"), "")
        has_status = any(n == "grpc-status" for n, _ in headers)
        if http_status != 200 or has_status:  # an error, or a trailers-only response
            self.status = call_status(headers, http_status)
        elif content_type != "application/grpc" and not content_type.startswith(
            ("application/grpc+", "application/grpc;")
        ):
            self.status = CallStatus(StatusCode.UNKNOWN, _readable(f"the response's content-type is {content_type!r}"))

    def data(self, data: bytes | memoryview) -> list[bytes]:
        """The messages ``data`` completes; none once the call is over."""
        if self.status is not None:
            return []
        if not self._head_seen:  # the engine resets such a stream itself; never deliver it
            self.status = CallStatus(StatusCode.INTERNAL, "data before the response head")
            return []
        try:
            return self._reader.feed(bytes(data))
        except GrpcMessageTooLarge as exc:
            self.status = CallStatus(StatusCode.RESOURCE_EXHAUSTED, str(exc))
            return []
        except GrpcMessageError as exc:
            self.status = CallStatus(StatusCode.INTERNAL, str(exc))
            return []

    def trailers(self, headers: Sequence[tuple[str, str]]) -> None:
        if self.status is not None:
            return
        status = call_status(headers)
        if status.ok and self._reader.pending:
            status = CallStatus(StatusCode.INTERNAL, f"the call ended inside a message ({self._reader.pending} bytes)")
        self.status = status

    def ended(self) -> None:
        """The peer ended the stream (after trailers, which set the status, or without them)."""
        if self.status is None:
            self.status = CallStatus(StatusCode.UNKNOWN, "the server ended the call without a status")

    def reset(self, error_code: int, *, remote: bool) -> None:
        if self.status is None:
            who = "the server" if remote else "us, for the server's error,"
            code = _RESET_TO_STATUS.get(error_code, StatusCode.INTERNAL)
            self.status = CallStatus(code, f"the stream was reset by {who} (HTTP/2 error code {error_code})")

    def fail(self, status: CallStatus) -> None:
        """The call ended for a reason outside its stream (the connection failed, a deadline passed)."""
        if self.status is None:
            self.status = status


class MessageQueue:
    """Complete messages waiting for the consumer, and the window credit they hold back (rule 6)."""

    __slots__ = ("_held", "_messages")

    def __init__(self) -> None:
        self._messages: collections.deque[bytes] = collections.deque()
        self._held = 0

    def __len__(self) -> int:
        return len(self._messages)

    def arrived(self, messages: list[bytes], flow: int) -> int:
        """``flow`` octets of DATA completed ``messages``: the credit to give back now (the rest is held)."""
        if not self._messages and not messages:
            return flow
        self._messages.extend(messages)
        self._held += flow
        return 0

    def take(self) -> tuple[bytes, int]:
        """The next message and the credit to give back now (all that was held, once none waits)."""
        message = self._messages.popleft()
        if self._messages:
            return message, 0
        credit, self._held = self._held, 0
        return message, credit

    def drop(self) -> int:
        """The consumer is gone (the call was cancelled): forget the messages; the credit to give back now."""
        self._messages.clear()
        credit, self._held = self._held, 0
        return credit

    @property
    def held(self) -> int:
        return self._held
