"""HTTP/2 on the wire (RFC 9113 §4, §6): frame layout, codes and the few frame builders HBONE needs.

Everything here is a constant or a pure function of its arguments. A frame is a 9-octet header (24-bit length,
type, flags, reserved bit + 31-bit stream id) followed by ``length`` octets of payload; ``HEADER.unpack_from``
returns ``(length >> 8, length & 0xFF, type, flags, stream id with the reserved bit)``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER = struct.Struct(">HBBBL")
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")
_GOAWAY = struct.Struct(">LL")

# Frame types (§6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)

# Flags (§6).
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Error codes (§7).
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB
INADEQUATE_SECURITY = 0xC

# Settings (§6.5.2, RFC 8441 §3).
HEADER_TABLE_SIZE = 0x1
ENABLE_PUSH = 0x2
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4
MAX_FRAME_SIZE = 0x5
MAX_HEADER_LIST_SIZE = 0x6
ENABLE_CONNECT_PROTOCOL = 0x8

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
LARGEST_FRAME = 2**24 - 1
LARGEST_WINDOW = 2**31 - 1
STREAM_ID_MASK = 0x7FFF_FFFF


def frame_header(length: int, frame_type: int, flags: int, stream_id: int) -> bytes:
    return HEADER.pack(length >> 8, length & 0xFF, frame_type, flags, stream_id)


def frame(frame_type: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload) >> 8, len(payload) & 0xFF, frame_type, flags, stream_id) + payload


def settings_frame(values: Iterable[tuple[int, int]]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(key, value) for key, value in values))


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    """The (id, value) pairs of a SETTINGS payload whose length the caller checked is a multiple of 6."""
    return [_SETTING.unpack_from(payload, offset) for offset in range(0, len(payload), 6)]


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _GOAWAY.pack(last_stream_id, code) + debug)


def parse_goaway(payload: bytes | memoryview) -> tuple[int, int, bytes]:
    """(last stream id, error code, debug data) of a GOAWAY payload of at least 8 octets."""
    last, code = _GOAWAY.unpack_from(payload)
    return last & STREAM_ID_MASK, code, bytes(payload[8:])


def u32(payload: bytes | memoryview) -> int:
    """The first four octets as an unsigned integer (RST_STREAM's code, WINDOW_UPDATE's increment)."""
    value: int = _U32.unpack_from(payload)[0]
    return value


def header_block(stream_id: int, block: bytes, *, end_stream: bool, max_frame: int) -> list[bytes]:
    """A HEADERS frame, plus CONTINUATION frames when ``block`` is larger than the peer's ``max_frame``."""
    first, rest = block[:max_frame], block[max_frame:]
    flags = (END_STREAM if end_stream else 0) | (0 if rest else END_HEADERS)
    out = [frame(HEADERS, flags, stream_id, first)]
    while rest:
        piece, rest = rest[:max_frame], rest[max_frame:]
        out.append(frame(CONTINUATION, 0 if rest else END_HEADERS, stream_id, piece))
    return out
