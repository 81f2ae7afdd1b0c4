"""The PROXY protocol (HAProxy's proxy-protocol.txt), version 1 to send and version 2 both ways, with TLVs.

Theory of operation: a sender writes one header before the first byte of a connection, naming the connection's
real source and destination (and, in version 2, typed TLV values: Istio puts the client's SPIFFE identity in TLV
:data:`TLV_PEER_IDENTITY`, ``0xD0``). The encoders are pure functions. :class:`ProxyHeaderDecoder` is a sans-IO
incremental decoder: feed it bytes with :meth:`~ProxyHeaderDecoder.receive_data` until it returns a
:class:`ProxyHeader` (``None`` means "send more"); the bytes after the header are then in
:attr:`~ProxyHeaderDecoder.trailing`.

Decoding rules (version 2 only; whoever reads a header must insist on one, it is never optional):

1. The first 12 bytes are the signature; the first byte that differs from it fails at once (a client that is not
   a PROXY sender is told so without waiting for 12 bytes).
2. Byte 13: version 2 (high nibble) and command LOCAL (0) or PROXY (1); anything else fails.
3. Byte 14: address family and transport. PROXY needs TCP over IPv4 (``0x11``, 12 address bytes) or IPv6
   (``0x21``, 36 bytes); LOCAL takes any value and its addresses are ignored, as the specification says.
4. Bytes 15-16: the length of the rest, at most the decoder's ``max_length`` (:data:`MAX_HEADER_LENGTH` unless
   given); a longer header fails before its body is awaited, so a peer cannot make the decoder buffer more.
5. After the addresses, TLVs (type byte, 16-bit length, value) fill the rest exactly; one that runs past the end
   fails, and a type that appears twice fails (a second identity must not override or shadow the first).
6. :attr:`~ProxyHeaderDecoder.needed` is how many more bytes the header takes at least: a reader that receives
   no more than that never reads past the header (the connection's payload stays in the socket, for a TLS
   handshake for example).
7. Nothing but :class:`ProxyHeaderError` escapes :meth:`~ProxyHeaderDecoder.receive_data`; after an error, or after
   the header, the decoder takes no more input (:class:`ProxyProtocolError`, local misuse).

Encoding: :func:`encode_v2` writes command PROXY for two addresses of one family, with the TLVs in the order given;
:func:`encode_v2_local` the LOCAL form (no addresses); :func:`encode_v1` the text form. Values that cannot be
encoded (a TLV longer than 65535 bytes, a header longer than the length field holds, families that differ) raise
:class:`ProxyProtocolError`.
"""

from __future__ import annotations

import enum
import ipaddress
import struct
from dataclasses import dataclass

from ambit.errors import AmbitError

SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
MAX_HEADER_LENGTH = 4096
"""The default cap on bytes 15-16 (the addresses and TLVs): an identity TLV is some hundred bytes."""
TLV_PEER_IDENTITY = 0xD0
"""Istio's TLV: the SPIFFE identity of the client that the node proxy authenticated (UTF-8)."""
TLV_SERVICE_HOSTNAME = 0xD1
"""Reserved by Istio's proto comment for the service hostname (not written today)."""

_FIXED = 16  # signature, version/command, family/transport, length
_ADDRESS_BLOCK = {0x11: 12, 0x21: 36}

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class ProxyProtocolError(AmbitError):
    """A PROXY header that cannot be encoded, or a decoder used after it finished."""


class ProxyHeaderError(ProxyProtocolError):
    """The peer sent bytes that are not a valid PROXY version 2 header (the peer's fault)."""


class Command(enum.IntEnum):
    LOCAL = 0
    PROXY = 1


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """One decoded header; ``source`` and ``destination`` are ``(ip, port)``, None for LOCAL."""

    command: Command
    source: tuple[Address, int] | None = None
    destination: tuple[Address, int] | None = None
    tlvs: tuple[tuple[int, bytes], ...] = ()

    def tlv(self, kind: int) -> bytes | None:
        """The value of TLV ``kind``, None when absent (rule 5: there is at most one)."""
        for found, value in self.tlvs:
            if found == kind:
                return value
        return None


# --- encoding --------------------------------------------------------------------------------------------------


def encode_v1(source: tuple[Address, int] | None, destination: tuple[Address, int] | None) -> bytes:
    """The text header: ``PROXY TCP4|TCP6 src dst sport dport``, or ``PROXY UNKNOWN`` without two addresses of one
    family."""
    if source is None or destination is None or source[0].version != destination[0].version:
        return b"PROXY UNKNOWN\r\n"
    family = "TCP4" if source[0].version == 4 else "TCP6"
    return f"PROXY {family} {source[0]} {destination[0]} {source[1]} {destination[1]}\r\n".encode()


def encode_v2_local() -> bytes:
    """The binary header with command LOCAL and no addresses."""
    return SIGNATURE + bytes((0x20, 0x00)) + struct.pack("!H", 0)


def encode_v2(
    source: tuple[Address, int], destination: tuple[Address, int], tlvs: tuple[tuple[int, bytes], ...] = ()
) -> bytes:
    """The binary header with command PROXY over TCP, then ``tlvs`` (type, value) in order."""
    (src, src_port), (dst, dst_port) = source, destination
    if src.version != dst.version:
        raise ProxyProtocolError(f"source {src} and destination {dst} are of different address families")
    for port in (src_port, dst_port):
        if not 0 <= port <= 65535:
            raise ProxyProtocolError(f"port out of range: {port}")
    body = bytearray(src.packed + dst.packed + struct.pack("!HH", src_port, dst_port))
    for kind, value in tlvs:
        if not 0 <= kind <= 255 or len(value) > 65535:
            raise ProxyProtocolError(f"TLV {kind:#x} of {len(value)} bytes cannot be encoded")
        body += struct.pack("!BH", kind, len(value)) + value
    if len(body) > 65535:
        raise ProxyProtocolError(f"a header of {len(body)} bytes does not fit its length field")
    return SIGNATURE + bytes((0x21, 0x11 if src.version == 4 else 0x21)) + struct.pack("!H", len(body)) + bytes(body)


# --- decoding --------------------------------------------------------------------------------------------------


class ProxyHeaderDecoder:
    """Decodes one version 2 header from the start of a byte stream (the module's rules)."""

    def __init__(self, max_length: int = MAX_HEADER_LENGTH) -> None:
        self._max_length = max_length
        self._buffer = bytearray()
        self._done = False
        self.trailing = b""
        """The bytes received after the header (the connection's first payload), once it is decoded."""

    @property
    def needed(self) -> int:
        """Rule 6: at least this many more bytes complete the header (0 once it is complete or failed)."""
        if self._done:
            return 0
        have = len(self._buffer)
        if have < _FIXED:
            return _FIXED - have
        length: int = struct.unpack_from("!H", self._buffer, 14)[0]
        return _FIXED + length - have

    def receive_data(self, data: bytes) -> ProxyHeader | None:
        """The header once ``data`` completes it, None while more is needed; raises :class:`ProxyHeaderError`."""
        if self._done:
            raise ProxyProtocolError("the decoder has finished")
        self._buffer += data
        try:
            header = self._parse()
        except ProxyHeaderError:
            self._done = True
            raise
        if header is not None:
            self._done = True
        return header

    def _parse(self) -> ProxyHeader | None:
        buffer = self._buffer
        seen = bytes(buffer[: len(SIGNATURE)])
        if not SIGNATURE.startswith(seen):
            raise ProxyHeaderError("not a PROXY protocol version 2 header (bad signature)")
        if len(buffer) < _FIXED:
            return None
        version, command = buffer[12] >> 4, buffer[12] & 0x0F
        if version != 2:
            raise ProxyHeaderError(f"PROXY protocol version {version}, expected 2")
        if command not in (Command.LOCAL, Command.PROXY):
            raise ProxyHeaderError(f"unknown PROXY command {command}")
        family = buffer[13]
        (length,) = struct.unpack_from("!H", buffer, 14)
        if length > self._max_length:
            raise ProxyHeaderError(f"PROXY header of {length} bytes exceeds the limit of {self._max_length}")
        if command == Command.PROXY and family not in _ADDRESS_BLOCK:
            raise ProxyHeaderError(f"PROXY header for address family/transport {family:#04x}, expected TCP over IP")
        if len(buffer) < _FIXED + length:
            return None
        body = bytes(buffer[_FIXED : _FIXED + length])
        self.trailing = bytes(buffer[_FIXED + length :])
        self._buffer = bytearray()
        if command == Command.LOCAL:
            return ProxyHeader(Command.LOCAL)
        size = _ADDRESS_BLOCK[family]
        if length < size:
            raise ProxyHeaderError(f"PROXY header of {length} bytes is too short for its addresses ({size})")
        half = (size - 4) // 2
        make = ipaddress.IPv4Address if family == 0x11 else ipaddress.IPv6Address
        src, dst = make(body[:half]), make(body[half : 2 * half])
        src_port, dst_port = struct.unpack_from("!HH", body, 2 * half)
        return ProxyHeader(Command.PROXY, (src, src_port), (dst, dst_port), _tlvs(body[size:]))


def _tlvs(data: bytes) -> tuple[tuple[int, bytes], ...]:
    """Rule 5."""
    found: list[tuple[int, bytes]] = []
    kinds: set[int] = set()
    offset = 0
    while offset < len(data):
        if len(data) - offset < 3:
            raise ProxyHeaderError("PROXY header ends inside a TLV's type and length")
        kind, size = struct.unpack_from("!BH", data, offset)
        offset += 3
        if size > len(data) - offset:
            raise ProxyHeaderError(f"TLV {kind:#04x} of {size} bytes runs past the header's end")
        if kind in kinds:
            raise ProxyHeaderError(f"TLV {kind:#04x} appears twice")
        kinds.add(kind)
        found.append((kind, data[offset : offset + size]))
        offset += size
    return tuple(found)
