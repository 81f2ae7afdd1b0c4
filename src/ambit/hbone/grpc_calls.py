"""gRPC calls over the HTTP/2 engine, sans-IO: request heads, length-prefixed messages and the call's status.

Theory of operation
-------------------
A gRPC call is an HTTP/2 POST (:class:`~ambit.hbone.messages.Http2ClientConnection` sends it): this module says
what goes in the head, how the DATA of each direction is cut into messages, and what the call's outcome is. It is
the first piece of the plan in docs/node-proxy-footprint.md (the node proxy's xDS and CA clients without grpcio);
nothing calls it yet.

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
   :data:`MAX_STATUS_MESSAGE` characters, with control characters shown escaped, for one-line errors.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from ambit.hbone.errors import GrpcMessageError, HboneError

PREFIX = struct.Struct("!BI")
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
                    raise GrpcMessageError(f"the peer sent a message of {length} bytes (at most {self.max_length})")
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
    code = StatusCode.UNKNOWN
    if code_text is not None and code_text.isascii() and code_text.isdigit() and len(code_text) <= 3:
        code = StatusCode(int(code_text)) if int(code_text) in StatusCode._value2member_map_ else StatusCode.UNKNOWN
    elif http_status != 200:
        code = _HTTP_TO_STATUS.get(http_status, StatusCode.UNKNOWN)
        message = message or f"HTTP status {http_status}"
    elif code_text is None:
        message = message or "the call ended without a grpc-status"
    return CallStatus(code, _readable(message))


def _readable(message: str) -> str:
    text = unquote_to_bytes(message[: MAX_STATUS_MESSAGE * 3]).decode("utf-8", "replace")[:MAX_STATUS_MESSAGE]
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
