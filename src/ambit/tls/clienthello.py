"""The server name (SNI) of a TLS ClientHello, read from the first bytes a client sent, without terminating TLS.

A gateway listener in TLS passthrough mode routes a connection by the name the client asks for and relays the raw
bytes, the ClientHello included, to the backend that terminates TLS. Sans-IO and pure: the shell feeds the bytes
read so far to :func:`read_client_hello` and reads more while it answers None.

Rules:

1. The bytes are TLS records (RFC 8446 §5.1): content type 22 (handshake), a legacy version whose major byte is 3,
   a length of 1..16384. Records of any other type before the ClientHello is complete are an error.
2. The handshake messages in those records begin with a ClientHello (type 1); its body may span records, and is
   read as soon as its bytes are there (a record may still be cut short). Bytes after it are not looked at.
3. The body is parsed as RFC 8446 §4.1.2 (which TLS 1.0-1.2 share): version, random, session id (≤ 32 bytes),
   cipher suites (an even, non-zero length), compression methods (at least one), then extensions, which may be
   absent. Every length must fit in the field that holds it; an extension type may appear once.
4. ``server_name`` (type 0) holds a list of names; the first ``host_name`` (type 0) entry is the server name: a
   DNS name of letters, digits, hyphens and dots (≤ 253 octets, labels 1..63), returned lower-case without a
   trailing dot. An IP literal or anything else there is an error (RFC 6066 §3 forbids both). No extension: no name.
5. ``limit`` bounds the bytes read: a ClientHello not complete within ``limit`` bytes is an error (a listener
   that waited for more would hold memory for whoever sends slowly or sends a lot).
6. Whatever the bytes, the answer is a :class:`ClientHello`, None (read more) or :class:`ClientHelloError`;
   nothing else is raised.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ambit.errors import AmbitError

__all__ = ["HELLO_LIMIT", "ClientHello", "ClientHelloError", "read_client_hello"]

HELLO_LIMIT = 16 * 1024
"""The default bound on the bytes read for a ClientHello (rule 5)."""

_HANDSHAKE = 22
_CLIENT_HELLO = 1
_RECORD_MAX = 16384
_SERVER_NAME = 0
_ALPN = 16
_LABEL = re.compile(rb"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


class ClientHelloError(AmbitError):
    """The peer sent bytes that are not the start of a TLS ClientHello we can route by (blame: the peer)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ClientHello:
    server_name: str | None
    """The requested host name (rule 4), lower-case; None when the client sent none."""
    alpn: tuple[str, ...] = ()
    """The protocols the client offers (``application_layer_protocol_negotiation``), as sent."""


def _handshake_bytes(data: bytes, limit: int) -> bytes:
    """The handshake payload of the leading records (rule 1), the last one possibly cut short."""
    payload = bytearray()
    offset = 0
    while offset < len(data):
        header = data[offset : offset + 5]
        if header[:1] and header[0] != _HANDSHAKE:
            raise ClientHelloError(f"not a TLS handshake record (content type {header[0]})")
        if len(header) >= 2 and header[1] != 3:
            raise ClientHelloError(f"not a TLS record (version major {header[1]})")
        if len(header) < 5:
            return bytes(payload)
        size = int.from_bytes(header[3:5], "big")
        if not 0 < size <= _RECORD_MAX:
            raise ClientHelloError(f"TLS record length {size} out of range")
        if offset + 5 + size > limit:
            raise ClientHelloError(f"the ClientHello does not fit in {limit} bytes")
        payload += data[offset + 5 : offset + 5 + size]
        if offset + 5 + size > len(data):
            return bytes(payload)
        offset += 5 + size
        if len(payload) >= 4 and len(payload) >= 4 + int.from_bytes(payload[1:4], "big"):
            break
    return bytes(payload)


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > len(self.data):
            raise ClientHelloError(f"ClientHello truncated in {what}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def number(self, n: int, what: str) -> int:
        return int.from_bytes(self.take(n, what), "big")

    def vector(self, n: int, what: str) -> bytes:
        return self.take(self.number(n, what), what)

    @property
    def left(self) -> int:
        return len(self.data) - self.pos


def _host_name(raw: bytes) -> str:
    name = raw.lower()
    if name.endswith(b"."):
        name = name[:-1]
    if not name or len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(b".")):
        raise ClientHelloError(f"server name is not a DNS name: {raw[:64]!r}")
    if all(label.isdigit() for label in name.split(b".")):
        raise ClientHelloError("server name is an IP address literal")
    return name.decode("ascii")


def _server_name(body: bytes) -> str | None:
    names = _Reader(body)
    listed = _Reader(names.vector(2, "server_name list"))
    if names.left:
        raise ClientHelloError("bytes after the server_name list")
    while listed.left:
        kind = listed.number(1, "server_name entry")
        value = listed.vector(2, "server_name entry")
        if kind == 0:
            return _host_name(value)
    return None


def _alpn(body: bytes) -> tuple[str, ...]:
    outer = _Reader(body)
    listed = _Reader(outer.vector(2, "ALPN list"))
    protocols = []
    while listed.left:
        value = listed.vector(1, "ALPN protocol")
        if not value:
            raise ClientHelloError("empty ALPN protocol name")
        protocols.append(value.decode("latin-1"))
    return tuple(protocols)


def _parse(body: bytes) -> ClientHello:
    reader = _Reader(body)
    version = reader.take(2, "version")
    if version[0] != 3:
        raise ClientHelloError(f"ClientHello version {version.hex()} is not TLS")
    reader.take(32, "random")
    if len(reader.vector(1, "session id")) > 32:
        raise ClientHelloError("session id longer than 32 bytes")
    suites = reader.vector(2, "cipher suites")
    if not suites or len(suites) % 2:
        raise ClientHelloError("cipher suites of odd or zero length")
    if not reader.vector(1, "compression methods"):
        raise ClientHelloError("no compression method")
    server_name: str | None = None
    alpn: tuple[str, ...] = ()
    if reader.left:
        extensions = _Reader(reader.vector(2, "extensions"))
        if reader.left:
            raise ClientHelloError("bytes after the extensions")
        seen: set[int] = set()
        while extensions.left:
            kind = extensions.number(2, "extension type")
            value = extensions.vector(2, "extension")
            if kind in seen:
                raise ClientHelloError(f"extension {kind} appears twice")
            seen.add(kind)
            if kind == _SERVER_NAME:
                server_name = _server_name(value)
            elif kind == _ALPN:
                alpn = _alpn(value)
    return ClientHello(server_name, alpn)


def read_client_hello(data: bytes, *, limit: int = HELLO_LIMIT) -> ClientHello | None:
    """The ClientHello the stream beginning with ``data`` starts with; None while more bytes are needed
    (rules 1-6). :class:`ClientHelloError` when the bytes cannot become one within ``limit`` bytes."""
    try:
        payload = _handshake_bytes(data, limit)
        if payload and payload[0] != _CLIENT_HELLO:
            raise ClientHelloError(f"the first handshake message is type {payload[0]}, not a ClientHello")
        if len(payload) < 4 or len(payload) < 4 + int.from_bytes(payload[1:4], "big"):
            too_long = len(payload) >= 4 and 4 + int.from_bytes(payload[1:4], "big") > limit
            if too_long or len(data) >= limit:
                raise ClientHelloError(f"the ClientHello does not fit in {limit} bytes")
            return None
        size = int.from_bytes(payload[1:4], "big")
        return _parse(payload[4 : 4 + size])
    except ClientHelloError:
        raise
    except (ValueError, IndexError, UnicodeError) as exc:  # rule 6: a slip in the reader is still a clear error
        raise ClientHelloError(f"malformed ClientHello: {exc}") from None
