"""SPDY/3.1 framing, sans-IO: the session layer under Kubernetes' port-forward (and kubectl's older exec) streams.

Theory of operation. A SPDY session is a byte stream of frames. :class:`SpdyParser` is fed bytes and returns the
frames they complete as events (past-tense facts: :class:`StreamOpened`, :class:`DataReceived`, ...);
:class:`SpdySerializer` returns the bytes of frames to send. Neither does I/O, nor tracks streams: the protocol on
top (:mod:`ambit.k8s.portforward`) keeps the stream table and decides what to send.

Rules:
1. Framing. A control frame starts with bit 1, version 3 (15 bits), a type (16 bits), flags (8) and a payload
   length (24); a data frame with bit 0, a stream id (31 bits), flags and a length. A frame whose length exceeds
   the parser's ``max_frame`` (at most the format's 16 MiB - 1) is refused before it is buffered.
2. Header blocks (SYN_STREAM, SYN_REPLY, HEADERS) are a count and length-prefixed names and values, compressed with
   zlib over :data:`DICTIONARY`. Each direction of a session has one compression context for its whole life (a
   block's compressed bytes depend on every block before it), so a parser and a serializer each belong to one
   direction of one session and a corrupt block ends the session. A block inflating to more than
   ``max_header_block`` bytes is refused without inflating further (a zlib bomb allocates no more than the cap).
   Names are non-empty, lowercase and unique; a value holds several values separated by NUL.
3. Types 1-9 are parsed (SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE; 5 was
   NOOP before SPDY/3 and is ignored like any unknown type, as the spec asks). A frame of a known type with the
   wrong length, a zero stream id where one is needed, or a control frame of another version is the peer's
   protocol error, :class:`SpdyProtocolError`, which the caller answers with GOAWAY and by closing.
4. Errors are raised only as :class:`SpdyProtocolError` (or :class:`SpdyUsageError` for a frame we were asked to
   build that the format cannot carry); no other exception leaves :meth:`SpdyParser.feed` for any input.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from ambit.errors import AmbitError

VERSION = 3
FORMAT_MAX_LENGTH = (1 << 24) - 1
"""The largest payload a frame's 24-bit length can describe."""
DEFAULT_MAX_HEADER_BLOCK = 64 * 1024
MAX_STREAM_ID = (1 << 31) - 1
INITIAL_WINDOW = 64 * 1024

FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02
FLAG_CLEAR_SETTINGS = 0x01


class FrameType(enum.IntEnum):
    SYN_STREAM = 1
    SYN_REPLY = 2
    RST_STREAM = 3
    SETTINGS = 4
    PING = 6
    GOAWAY = 7
    HEADERS = 8
    WINDOW_UPDATE = 9


class RstStatus(enum.IntEnum):
    PROTOCOL_ERROR = 1
    INVALID_STREAM = 2
    REFUSED_STREAM = 3
    UNSUPPORTED_VERSION = 4
    CANCEL = 5
    INTERNAL_ERROR = 6
    FLOW_CONTROL_ERROR = 7
    STREAM_IN_USE = 8
    STREAM_ALREADY_CLOSED = 9
    FRAME_TOO_LARGE = 11


class GoAwayStatus(enum.IntEnum):
    OK = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2


def _dictionary() -> bytes:
    # SPDY/3's header compression dictionary (draft 3, section 2.6.10.1): length-prefixed words, then literal text.
    words = [
        "options",
        "head",
        "post",
        "put",
        "delete",
        "trace",
        "accept",
        "accept-charset",
        "accept-encoding",
        "accept-language",
        "accept-ranges",
        "age",
        "allow",
        "authorization",
        "cache-control",
        "connection",
        "content-base",
        "content-encoding",
        "content-language",
        "content-length",
        "content-location",
        "content-md5",
        "content-range",
        "content-type",
        "date",
        "etag",
        "expect",
        "expires",
        "from",
        "host",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-range",
        "if-unmodified-since",
        "last-modified",
        "location",
        "max-forwards",
        "pragma",
        "proxy-authenticate",
        "proxy-authorization",
        "range",
        "referer",
        "retry-after",
        "server",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "vary",
        "via",
        "warning",
        "www-authenticate",
        "method",
        "get",
        "status",
    ]
    words += ["200 OK", "version", "HTTP/1.1", "url", "public", "set-cookie", "keep-alive", "origin"]
    codes = "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    reasons = (
        "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized"
        "403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service Unavailable"
    )
    dates = "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT"
    types = (
        "chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,"
        "text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
    )
    prefixed = b"".join(struct.pack(">I", len(w)) + w.encode() for w in words)
    return prefixed + (codes + reasons + dates + types).encode()


DICTIONARY = _dictionary()

Headers = tuple[tuple[str, str], ...]
"""A header block's names and values in order (a value may hold several, NUL-separated)."""


class SpdyError(AmbitError):
    """Root of this module's errors."""


class SpdyProtocolError(SpdyError):
    """What the peer sent is not SPDY/3.1 we accept; the session ends with GOAWAY ``status``."""

    def __init__(self, message: str, status: GoAwayStatus = GoAwayStatus.PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.status = status


class SpdyUsageError(SpdyError):
    """A frame we were asked to build cannot be encoded (local misuse)."""


# -- events ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StreamOpened:
    stream_id: int
    associated_to: int
    priority: int
    headers: Headers
    fin: bool
    unidirectional: bool


@dataclass(frozen=True, slots=True)
class ReplyReceived:
    stream_id: int
    headers: Headers
    fin: bool


@dataclass(frozen=True, slots=True)
class HeadersReceived:
    stream_id: int
    headers: Headers
    fin: bool


@dataclass(frozen=True, slots=True)
class DataReceived:
    stream_id: int
    data: bytes
    fin: bool


@dataclass(frozen=True, slots=True)
class StreamReset:
    stream_id: int
    status: int


@dataclass(frozen=True, slots=True)
class SettingsReceived:
    entries: tuple[tuple[int, int, int], ...]
    """(flags, id, value) per entry."""
    clear: bool


@dataclass(frozen=True, slots=True)
class PingReceived:
    ping_id: int


@dataclass(frozen=True, slots=True)
class GoAwayReceived:
    last_good_stream_id: int
    status: int


@dataclass(frozen=True, slots=True)
class WindowUpdated:
    stream_id: int
    delta: int


Event = (
    StreamOpened
    | ReplyReceived
    | HeadersReceived
    | DataReceived
    | StreamReset
    | SettingsReceived
    | PingReceived
    | GoAwayReceived
    | WindowUpdated
)


# -- header blocks (rule 2) ------------------------------------------------------------------------------------
def encode_header_block(headers: Headers) -> bytes:
    """The uncompressed block; raises :class:`SpdyUsageError` for names the format forbids."""
    out = [struct.pack(">I", len(headers))]
    seen: set[str] = set()
    for name, value in headers:
        if not name or name != name.lower() or name in seen:
            raise SpdyUsageError(f"header name {name!r} is empty, not lowercase or repeated")
        seen.add(name)
        n, v = name.encode("latin-1"), value.encode("latin-1")
        out += [struct.pack(">I", len(n)), n, struct.pack(">I", len(v)), v]
    return b"".join(out)


def decode_header_block(block: bytes) -> Headers:
    """The names and values of an uncompressed block; raises :class:`SpdyProtocolError`."""
    if len(block) < 4:
        raise SpdyProtocolError("header block shorter than its count")
    (count,) = struct.unpack_from(">I", block)
    if count * 8 > len(block) - 4:  # every pair takes two lengths at least: no list sized by a lie
        raise SpdyProtocolError(f"header block claims {count} pairs in {len(block)} bytes")
    pos, pairs, seen = 4, [], set()
    for _ in range(count):
        fields = []
        for _part in ("name", "value"):
            if pos + 4 > len(block):
                raise SpdyProtocolError("header block truncated")
            (length,) = struct.unpack_from(">I", block, pos)
            pos += 4
            if pos + length > len(block):
                raise SpdyProtocolError("header block truncated")
            fields.append(block[pos : pos + length].decode("latin-1"))
            pos += length
        name, value = fields
        if not name or name != name.lower() or name in seen:
            raise SpdyProtocolError(f"header name {name!r} is empty, not lowercase or repeated")
        seen.add(name)
        pairs.append((name, value))
    if pos != len(block):
        raise SpdyProtocolError("bytes after the header block's last pair")
    return tuple(pairs)


def header_value(headers: Headers, name: str) -> str | None:
    """The value of ``name`` (compared without case, as kube's peers canonicalize names), or None."""
    wanted = name.lower()
    return next((v for n, v in headers if n == wanted), None)


class _Inflater:
    """One direction's decompression context (rule 2)."""

    def __init__(self, limit: int) -> None:
        self._z = zlib.decompressobj(zdict=DICTIONARY)
        self._limit = limit

    def inflate(self, compressed: bytes) -> bytes:
        try:
            out = self._z.decompress(compressed, self._limit + 1)
        except zlib.error as exc:
            raise SpdyProtocolError(f"header block does not inflate: {exc}") from None
        if len(out) > self._limit or self._z.unconsumed_tail:
            raise SpdyProtocolError(f"header block inflates beyond {self._limit} bytes")
        return out


# -- parser (rules 1, 3, 4) ------------------------------------------------------------------------------------
_HEADER = struct.Struct(">IB3s")


class SpdyParser:
    """Frames from one direction of a session's bytes."""

    def __init__(self, *, max_frame: int = FORMAT_MAX_LENGTH, max_header_block: int = DEFAULT_MAX_HEADER_BLOCK):
        self.max_frame = min(max_frame, FORMAT_MAX_LENGTH)
        self._buffer = bytearray()
        self._inflater = _Inflater(max_header_block)
        self._failed: SpdyProtocolError | None = None

    def feed(self, data: bytes) -> list[Event]:
        """The events ``data`` completes; raises :class:`SpdyProtocolError` (then, and ever after, for any feed)."""
        if self._failed is not None:
            raise self._failed
        self._buffer += data
        events: list[Event] = []
        try:
            while len(self._buffer) >= 8:
                word, flags, raw_length = _HEADER.unpack_from(self._buffer)
                length = int.from_bytes(raw_length, "big")
                if length > self.max_frame:
                    raise SpdyProtocolError(f"frame of {length} bytes exceeds {self.max_frame}")
                if len(self._buffer) < 8 + length:
                    break
                payload = bytes(self._buffer[8 : 8 + length])
                del self._buffer[: 8 + length]
                event = self._frame(word, flags, payload)
                if event is not None:
                    events.append(event)
        except SpdyProtocolError as exc:
            self._failed = exc
            raise
        return events

    def _frame(self, word: int, flags: int, payload: bytes) -> Event | None:
        if not word & 0x80000000:
            if word == 0:
                raise SpdyProtocolError("data frame on stream 0")
            return DataReceived(word, payload, bool(flags & FLAG_FIN))
        version, kind = (word >> 16) & 0x7FFF, word & 0xFFFF
        if version != VERSION:
            raise SpdyProtocolError(f"control frame of SPDY version {version}")
        if kind not in FrameType._value2member_map_:
            return None  # rule 3: unknown (and NOOP) control frames are ignored
        frame_type = FrameType(kind)
        fin = bool(flags & FLAG_FIN)
        if frame_type is FrameType.SYN_STREAM:
            self._expect(payload, 10, frame_type, at_least=True)
            stream_id, associated, priority = _stream_id(payload, 0), _u31(payload, 4), payload[8] >> 5
            headers = decode_header_block(self._inflater.inflate(payload[10:]))
            return StreamOpened(stream_id, associated, priority, headers, fin, bool(flags & FLAG_UNIDIRECTIONAL))
        if frame_type in (FrameType.SYN_REPLY, FrameType.HEADERS):
            self._expect(payload, 4, frame_type, at_least=True)
            stream_id = _stream_id(payload, 0)
            headers = decode_header_block(self._inflater.inflate(payload[4:]))
            cls = ReplyReceived if frame_type is FrameType.SYN_REPLY else HeadersReceived
            return cls(stream_id, headers, fin)
        if frame_type is FrameType.RST_STREAM:
            self._expect(payload, 8, frame_type)
            return StreamReset(_stream_id(payload, 0), struct.unpack_from(">I", payload, 4)[0])
        if frame_type is FrameType.SETTINGS:
            self._expect(payload, 4, frame_type, at_least=True)
            (count,) = struct.unpack_from(">I", payload)
            if len(payload) != 4 + 8 * count:
                raise SpdyProtocolError(f"SETTINGS of {count} entries in {len(payload)} bytes")
            entries = tuple(
                (payload[4 + 8 * i], int.from_bytes(payload[5 + 8 * i : 8 + 8 * i], "big"), _u32(payload, 8 + 8 * i))
                for i in range(count)
            )
            return SettingsReceived(entries, bool(flags & FLAG_CLEAR_SETTINGS))
        if frame_type is FrameType.PING:
            self._expect(payload, 4, frame_type)
            return PingReceived(_u32(payload, 0))
        if frame_type is FrameType.GOAWAY:
            self._expect(payload, 8, frame_type)
            return GoAwayReceived(_u31(payload, 0), _u32(payload, 4))
        self._expect(payload, 8, frame_type)  # WINDOW_UPDATE; stream 0 is the session's window in 3.1
        delta = _u31(payload, 4)
        if delta == 0:
            raise SpdyProtocolError("WINDOW_UPDATE of 0")
        return WindowUpdated(_u31(payload, 0), delta)

    @staticmethod
    def _expect(payload: bytes, size: int, frame_type: FrameType, *, at_least: bool = False) -> None:
        if len(payload) < size or (not at_least and len(payload) != size):
            raise SpdyProtocolError(f"{frame_type.name} frame of {len(payload)} bytes")


def _u32(payload: bytes, at: int) -> int:
    return int(struct.unpack_from(">I", payload, at)[0])


def _u31(payload: bytes, at: int) -> int:
    return _u32(payload, at) & MAX_STREAM_ID


def _stream_id(payload: bytes, at: int) -> int:
    stream_id = _u31(payload, at)
    if stream_id == 0:
        raise SpdyProtocolError("stream id 0 in a stream's frame")
    return stream_id


# -- serializer ------------------------------------------------------------------------------------------------
class SpdySerializer:
    """Frames of one direction of a session (one compression context: rule 2)."""

    def __init__(self) -> None:
        self._z = zlib.compressobj(
            zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, DICTIONARY
        )

    def _compress(self, headers: Headers) -> bytes:
        block = encode_header_block(headers)
        return self._z.compress(block) + self._z.flush(zlib.Z_SYNC_FLUSH)

    def syn_stream(
        self, stream_id: int, headers: Headers, *, fin: bool = False, associated_to: int = 0, priority: int = 0
    ) -> bytes:
        body = struct.pack(">IIBB", _id(stream_id), associated_to & MAX_STREAM_ID, (priority & 7) << 5, 0)
        return _control(FrameType.SYN_STREAM, FLAG_FIN if fin else 0, body + self._compress(headers))

    def syn_reply(self, stream_id: int, headers: Headers = (), *, fin: bool = False) -> bytes:
        return _control(
            FrameType.SYN_REPLY, FLAG_FIN if fin else 0, struct.pack(">I", _id(stream_id)) + self._compress(headers)
        )

    def headers(self, stream_id: int, headers: Headers, *, fin: bool = False) -> bytes:
        return _control(
            FrameType.HEADERS, FLAG_FIN if fin else 0, struct.pack(">I", _id(stream_id)) + self._compress(headers)
        )

    def data(self, stream_id: int, data: bytes, *, fin: bool = False) -> bytes:
        if len(data) > FORMAT_MAX_LENGTH:
            raise SpdyUsageError(f"data frame of {len(data)} bytes")
        return struct.pack(">IB", _id(stream_id), FLAG_FIN if fin else 0) + len(data).to_bytes(3, "big") + data

    def rst_stream(self, stream_id: int, status: int) -> bytes:
        return _control(FrameType.RST_STREAM, 0, struct.pack(">II", _id(stream_id), status))

    def settings(self, entries: Sequence[tuple[int, int, int]], *, clear: bool = False) -> bytes:
        body = struct.pack(">I", len(entries)) + b"".join(
            struct.pack(">B", flags) + key.to_bytes(3, "big") + struct.pack(">I", value)
            for flags, key, value in entries
        )
        return _control(FrameType.SETTINGS, FLAG_CLEAR_SETTINGS if clear else 0, body)

    def ping(self, ping_id: int) -> bytes:
        return _control(FrameType.PING, 0, struct.pack(">I", ping_id))

    def goaway(self, last_good_stream_id: int, status: int = GoAwayStatus.OK) -> bytes:
        return _control(FrameType.GOAWAY, 0, struct.pack(">II", last_good_stream_id & MAX_STREAM_ID, status))

    def window_update(self, stream_id: int, delta: int) -> bytes:
        if not 0 < delta <= MAX_STREAM_ID:
            raise SpdyUsageError(f"window delta {delta}")
        return _control(FrameType.WINDOW_UPDATE, 0, struct.pack(">II", stream_id & MAX_STREAM_ID, delta))


def _id(stream_id: int) -> int:
    if not 0 < stream_id <= MAX_STREAM_ID:
        raise SpdyUsageError(f"stream id {stream_id}")
    return stream_id


def _control(frame_type: FrameType, flags: int, body: bytes) -> bytes:
    if len(body) > FORMAT_MAX_LENGTH:
        raise SpdyUsageError(f"{frame_type.name} frame of {len(body)} bytes")
    word = 0x80000000 | (VERSION << 16) | frame_type
    return struct.pack(">IB", word, flags) + len(body).to_bytes(3, "big") + body
