"""The few fields of ``envoy.service.auth.v3`` (``Authorization/Check``) an external authorizer and the waypoint
exchange, hand-encoded (pure; no generated code for Envoy's API, whose imports reach half of it).

Theory of operation: :func:`encode_check_request` writes a ``CheckRequest`` from a :class:`CheckAttributes`;
:func:`decode_check_response` reads a ``CheckResponse`` into a :class:`CheckAnswer`. The reverse pair
(:func:`decode_check_request`, :func:`encode_check_response`) is the authorizer's side, for the lab's sample
authorizer (:mod:`ambit.lab.ext_authz_app`) and the tests. Field numbers are those of Envoy's
``api/envoy/service/auth/v3/external_auth.proto`` and ``attribute_context.proto``::

    CheckRequest        { AttributeContext attributes = 1; }
    AttributeContext    { Peer source = 1; Peer destination = 2; Request request = 4; }
    Peer                { config.core.v3.Address address = 1; string principal = 4; }
    Address             { SocketAddress socket_address = 1; }
    SocketAddress       { string address = 2; uint32 port_value = 3; }
    Request             { HttpRequest http = 2; }
    HttpRequest         { string id = 1; string method = 2; map<string, string> headers = 3; string path = 4;
                          string host = 5; string scheme = 6; int64 size = 9; string protocol = 10;
                          string body = 11; bytes raw_body = 12; }
    CheckResponse       { google.rpc.Status status = 1; DeniedHttpResponse denied_response = 2;
                          OkHttpResponse ok_response = 3; }
    google.rpc.Status   { int32 code = 1; string message = 2; }
    DeniedHttpResponse  { type.v3.HttpStatus status = 1; repeated HeaderValueOption headers = 2; string body = 3; }
    HttpStatus          { StatusCode code = 1; }
    OkHttpResponse      { repeated HeaderValueOption headers = 2; repeated string headers_to_remove = 5;
                          repeated HeaderValueOption response_headers_to_add = 6; }
    HeaderValueOption   { HeaderValue header = 1; google.protobuf.BoolValue append = 2;
                          HeaderAppendAction append_action = 3; }
    HeaderValue         { string key = 1; string value = 2; }
    BoolValue           { bool value = 1; }

Rules:

1. Decoding trusts only the wire format: a truncated varint or field, a wire type that does not fit, or text that
   is not UTF-8 raises :class:`ExtAuthzWireError`; unknown fields are skipped unparsed, so nesting is bounded by
   this schema. Repeated headers are bounded by :data:`MAX_HEADERS` (more is an error). A message field that
   occurs twice is merged as protobuf merges it (a later scalar wins), so ``header`` and ``append`` read last-wins.
2. A ``HeaderValueOption`` is read as written (:class:`HeaderOption`): ``append`` None when the wrapper is absent,
   ``append_action`` as its number, unknown numbers kept. What they mean is :mod:`ambit.waypoint.ext_authz`'s.
3. Encoding writes fields in number order and leaves out zero values (proto3; an element of a repeated field is
   always written: :mod:`ambit.protowire` rule 2), so equal inputs give equal bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ambit.errors import AmbitError
from ambit.protowire import FIXED32, FIXED64, LENGTH, VARINT, bytes_field, length_delimited, varint_field

__all__ = [
    "ADD_IF_ABSENT",
    "APPEND_IF_EXISTS_OR_ADD",
    "MAX_HEADERS",
    "OVERWRITE_IF_EXISTS",
    "OVERWRITE_IF_EXISTS_OR_ADD",
    "CheckAnswer",
    "CheckAttributes",
    "ExtAuthzWireError",
    "HeaderOption",
    "decode_check_request",
    "decode_check_response",
    "encode_check_request",
    "encode_check_response",
    "options",
]

MAX_HEADERS = 1_000
APPEND_IF_EXISTS_OR_ADD, ADD_IF_ABSENT, OVERWRITE_IF_EXISTS_OR_ADD, OVERWRITE_IF_EXISTS = 0, 1, 2, 3
"""``HeaderValueOption.HeaderAppendAction`` numbers (Envoy's ``config/core/v3/base.proto``)."""
_I64 = 1 << 64

Headers = tuple[tuple[str, str], ...]


class ExtAuthzWireError(AmbitError):
    """A ``CheckRequest`` or ``CheckResponse`` that is not well-formed protobuf of its schema."""


@dataclass(frozen=True, slots=True)
class CheckAttributes:
    """What the waypoint tells the authorizer about one request (``AttributeContext``)."""

    method: str
    path: str
    host: str
    headers: Headers
    """Lower-case names; repeated names are joined with ``,`` on the wire (a map)."""
    request_id: str = ""
    scheme: str = "http"
    protocol: str = "HTTP/1.1"
    size: int = -1
    """The body's length when known, else -1."""
    source_address: str = ""
    source_port: int = 0
    source_principal: str = ""
    destination_address: str = ""
    destination_port: int = 0
    destination_principal: str = ""
    body: bytes = b""
    http: bool = True
    """False for a TCP connection's check (Envoy's network filter): no ``request`` at all, only the peers."""
    raw_body: bool = False
    """The body goes in ``raw_body`` (bytes) rather than ``body`` (a string field holding the same bytes, as
    Envoy fills it)."""


@dataclass(frozen=True, slots=True)
class HeaderOption:
    """One ``HeaderValueOption`` as written on the wire (rule 2)."""

    name: str
    value: str
    append: bool | None = None
    """The deprecated ``append`` (a ``BoolValue``); None: not set."""
    action: int = APPEND_IF_EXISTS_OR_ADD
    """``append_action``'s number (0 when not set)."""


Options = tuple[HeaderOption, ...]


def options(headers: Headers) -> Options:
    """Plain options (neither ``append`` nor ``append_action`` set) for ``headers``."""
    return tuple(HeaderOption(name, value) for name, value in headers)


@dataclass(frozen=True, slots=True)
class CheckAnswer:
    """A ``CheckResponse``: ``code`` 0 (OK) allows."""

    code: int
    message: str = ""
    denied_status: int = 0
    """``denied_response.status.code``; 0: not set (Envoy answers 403)."""
    denied_headers: Options = ()
    denied_body: str = ""
    ok_headers: Options = ()
    """``ok_response.headers``: edits of the request."""
    ok_headers_to_remove: tuple[str, ...] = ()
    ok_response_headers: Options = ()
    """``ok_response.response_headers_to_add``: edits of the response."""


# Encoding.


def _text(number: int, text: str) -> bytes:
    return bytes_field(number, text.encode("utf-8", "surrogatepass"))


def _peer(address: str, port: int, principal: str) -> bytes:
    socket_address = _text(2, address) + varint_field(3, port)
    return bytes_field(1, bytes_field(1, socket_address)) + _text(4, principal)


def _merged(headers: Headers) -> list[tuple[str, str]]:
    merged: dict[str, str] = {}
    for name, value in headers:
        key = name.lower()
        merged[key] = f"{merged[key]},{value}" if key in merged else value
    return sorted(merged.items())


def encode_check_request(attributes: CheckAttributes) -> bytes:
    a = attributes
    headers = b"".join(length_delimited(3, _text(1, k) + _text(2, v)) for k, v in _merged(a.headers))
    http = (
        _text(1, a.request_id)
        + _text(2, a.method)
        + headers
        + _text(4, a.path)
        + _text(5, a.host)
        + _text(6, a.scheme)
        + varint_field(9, a.size)
        + _text(10, a.protocol)
        + bytes_field(12 if a.raw_body else 11, a.body)
    )
    context = (
        bytes_field(1, _peer(a.source_address, a.source_port, a.source_principal))
        + bytes_field(2, _peer(a.destination_address, a.destination_port, a.destination_principal))
        + (length_delimited(4, length_delimited(2, http)) if a.http else b"")
    )
    return length_delimited(1, context)


def _header_option(option: HeaderOption) -> bytes:
    header = length_delimited(1, _text(1, option.name) + _text(2, option.value))
    append = b"" if option.append is None else length_delimited(2, varint_field(1, int(option.append)))
    return header + append + varint_field(3, option.action)


def _header_options(number: int, headers: Options) -> bytes:
    return b"".join(length_delimited(number, _header_option(option)) for option in headers)


def encode_check_response(answer: CheckAnswer) -> bytes:
    status = varint_field(1, answer.code) + _text(2, answer.message)
    out = length_delimited(1, status)
    if answer.code != 0:
        denied = (
            bytes_field(1, varint_field(1, answer.denied_status))
            + _header_options(2, answer.denied_headers)
            + _text(3, answer.denied_body)
        )
        return out + length_delimited(2, denied)
    remove = answer.ok_headers_to_remove
    ok = (
        _header_options(2, answer.ok_headers)
        + b"".join(length_delimited(5, name.encode("utf-8", "surrogatepass")) for name in remove)
        + _header_options(6, answer.ok_response_headers)
    )
    return out + length_delimited(3, ok)


# Decoding.


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ExtAuthzWireError("a truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of every field; fixed-width fields are skipped (none are read here)."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            value, pos = _read_varint(buf, pos)
            yield number, wire, value
        elif wire == LENGTH:
            length, pos = _read_varint(buf, pos)
            if pos + length > len(buf):
                raise ExtAuthzWireError("a length-delimited field runs past its message")
            yield number, wire, buf[pos : pos + length]
            pos += length
        elif wire == FIXED64:
            pos += 8
        elif wire == FIXED32:
            pos += 4
        else:
            raise ExtAuthzWireError(f"wire type {wire} is not supported")
        if pos > len(buf):
            raise ExtAuthzWireError("a fixed-width field runs past its message")


def _as_bytes(wire: int, value: int | bytes) -> bytes:
    if wire != LENGTH or not isinstance(value, bytes):
        raise ExtAuthzWireError("expected a length-delimited field")
    return value


def _as_text(wire: int, value: int | bytes) -> str:
    try:
        return _as_bytes(wire, value).decode("utf-8")
    except UnicodeDecodeError:
        raise ExtAuthzWireError("a string field is not UTF-8") from None


def _as_int(wire: int, value: int | bytes) -> int:
    if wire != VARINT or not isinstance(value, int):
        raise ExtAuthzWireError("expected a varint field")
    return value


def _signed32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _pair(buf: bytes) -> tuple[str, str]:
    key = value = ""
    for number, wire, field in _fields(buf):
        if number == 1:
            key = _as_text(wire, field)
        elif number == 2:
            value = _as_text(wire, field)
    return key, value


def _option(buf: bytes) -> HeaderOption:
    """Rule 2."""
    key = value = ""
    append: bool | None = None
    action = APPEND_IF_EXISTS_OR_ADD
    for number, wire, field in _fields(buf):
        if number == 1:
            for n, w, f in _fields(_as_bytes(wire, field)):
                if n == 1:
                    key = _as_text(w, f)
                elif n == 2:
                    value = _as_text(w, f)
        elif number == 2:
            append = bool(append)  # present: false unless its value says otherwise (merged, rule 1)
            for n, w, f in _fields(_as_bytes(wire, field)):
                if n == 1:
                    append = _as_int(w, f) != 0
        elif number == 3:
            action = _signed32(_as_int(wire, field))
    return HeaderOption(key, value, append, action)


def _bounded(headers: list[tuple[str, str]] | list[HeaderOption] | list[str]) -> None:
    if len(headers) > MAX_HEADERS:
        raise ExtAuthzWireError(f"more than {MAX_HEADERS} headers")


def decode_check_response(data: bytes) -> CheckAnswer:
    """Rule 1."""
    code, message, denied_status, denied_body = 0, "", 0, ""
    denied: list[HeaderOption] = []
    ok: list[HeaderOption] = []
    remove: list[str] = []
    added: list[HeaderOption] = []
    for number, wire, field in _fields(data):
        if number == 1:
            for n, w, f in _fields(_as_bytes(wire, field)):
                if n == 1:
                    code = _signed32(_as_int(w, f))
                elif n == 2:
                    message = _as_text(w, f)
        elif number == 2:
            for n, w, f in _fields(_as_bytes(wire, field)):
                if n == 1:
                    for n2, w2, f2 in _fields(_as_bytes(w, f)):
                        if n2 == 1:
                            denied_status = _signed32(_as_int(w2, f2))
                elif n == 2:
                    denied.append(_option(_as_bytes(w, f)))
                    _bounded(denied)
                elif n == 3:
                    denied_body = _as_text(w, f)
        elif number == 3:
            for n, w, f in _fields(_as_bytes(wire, field)):
                if n == 2:
                    ok.append(_option(_as_bytes(w, f)))
                    _bounded(ok)
                elif n == 5:
                    remove.append(_as_text(w, f))
                    _bounded(remove)
                elif n == 6:
                    added.append(_option(_as_bytes(w, f)))
                    _bounded(added)
    return CheckAnswer(code, message, denied_status, tuple(denied), denied_body, tuple(ok), tuple(remove), tuple(added))


def _peer_of(buf: bytes) -> tuple[str, int, str]:
    address, port, principal = "", 0, ""
    for number, wire, field in _fields(buf):
        if number == 1:
            for n, w, f in _fields(_as_bytes(wire, field)):
                if n == 1:
                    for n2, w2, f2 in _fields(_as_bytes(w, f)):
                        if n2 == 2:
                            address = _as_text(w2, f2)
                        elif n2 == 3:
                            port = _as_int(w2, f2) & 0xFFFFFFFF
        elif number == 4:
            principal = _as_text(wire, field)
    return address, port, principal


def decode_check_request(data: bytes) -> CheckAttributes:
    """The authorizer's side of rule 1."""
    http = b""
    has_request = False
    source, destination = ("", 0, ""), ("", 0, "")
    for number, wire, field in _fields(data):
        if number != 1:
            continue
        for n, w, f in _fields(_as_bytes(wire, field)):
            if n == 1:
                source = _peer_of(_as_bytes(w, f))
            elif n == 2:
                destination = _peer_of(_as_bytes(w, f))
            elif n == 4:
                has_request = True
                for n2, w2, f2 in _fields(_as_bytes(w, f)):
                    if n2 == 2:
                        http = _as_bytes(w2, f2)
    text: dict[int, str] = {}
    headers: list[tuple[str, str]] = []
    size = 0
    body, raw = b"", False
    for number, wire, field in _fields(http):
        if number == 3:
            headers.append(_pair(_as_bytes(wire, field)))
            _bounded(headers)
        elif number == 9:
            size = _as_int(wire, field)
            size = size - _I64 if size >= 1 << 63 else size
        elif number in (1, 2, 4, 5, 6, 10):
            text[number] = _as_text(wire, field)
        elif number in (11, 12):
            body, raw = _as_bytes(wire, field), number == 12
    return CheckAttributes(
        method=text.get(2, ""),
        path=text.get(4, ""),
        host=text.get(5, ""),
        headers=tuple(headers),
        request_id=text.get(1, ""),
        scheme=text.get(6, ""),
        protocol=text.get(10, ""),
        size=size,
        source_address=source[0],
        source_port=source[1],
        source_principal=source[2],
        destination_address=destination[0],
        destination_port=destination[1],
        destination_principal=destination[2],
        body=body,
        http=has_request,
        raw_body=raw,
    )
