"""Request bodies in ``application/vnd.kubernetes.protobuf``, turned into the JSON form of the same object (pure).

client-go's typed clients, and so kubectl's imperative commands (``create configmap``, ``create token``,
``create deployment``, ...), send protobuf. The body is an envelope: the magic ``k8s\\x00``, then a
``runtime.Unknown`` message::

    Unknown  { TypeMeta typeMeta = 1; bytes raw = 2; string contentEncoding = 3; string contentType = 4; }
    TypeMeta { string apiVersion = 1; string kind = 2; }

``raw`` is the object, a message of the kind named by ``typeMeta``. We read it with the table in
:mod:`ambit.apiserver.protobuf_schema` and build exactly what kube-apiserver's JSON serializer would print for it,
so the rest of the server never learns which encoding the client used.

Rules:

1. Only the wire format is trusted, never the bytes: a truncated varint or field, a wire type that does not fit
   the field's type, a bad time or an impossible ``IntOrString`` is a 400 naming where it was found. A kind we have
   no schema for, or a compressed or foreign ``raw``, is a 415. No other exception leaves this module.
2. Unknown field numbers are skipped, never an error (newer clients send fields we do not know yet).
3. Zero values of plain Go fields are left out (gogo-protobuf writes every such field, ``omitempty`` drops them);
   Go pointers are written only when set and so are kept even when zero.
4. The schema has no cycles and unknown fields are skipped without being parsed, so nesting is bounded by the
   schema's depth, not by the input.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ambit.apiserver import errors
from ambit.apiserver.protobuf_schema import ANY_VERSION_KINDS, KINDS, MESSAGES

MAGIC = b"k8s\x00"
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
_MAX_FIELD = (1 << 29) - 1
_U64 = (1 << 64) - 1
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MIN_SECONDS = -62135596800  # 0001-01-01T00:00:00Z, Go's zero time
_MAX_SECONDS = 253402300799  # 9999-12-31T23:59:59Z


class Kind(Enum):
    STRING = "string"
    BYTES = "bytes"
    BOOL = "bool"
    INT32 = "int32"
    INT64 = "int64"
    TIME = "Time"
    MICRO_TIME = "MicroTime"
    QUANTITY = "Quantity"
    INT_OR_STRING = "IntOrString"
    EXTRA_VALUE = "ExtraValue"
    MESSAGE = "message"


_NUMERIC = frozenset({Kind.BOOL, Kind.INT32, Kind.INT64})


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    kind: Kind
    message: str = ""  # for Kind.MESSAGE
    pointer: bool = False
    repeated: bool = False
    is_map: bool = False
    inline: bool = False


def decode_protobuf_body(data: bytes) -> dict[str, Any]:
    """The JSON form of a Kubernetes protobuf request body; raises :class:`~ambit.apiserver.errors.ApiError`."""
    data = bytes(data)
    if not data.startswith(MAGIC):
        raise errors.bad_request("the protobuf body does not start with the Kubernetes magic bytes 'k8s\\x00'")
    api_version = kind = content_encoding = content_type = ""
    raw = b""
    for number, wire, value in _fields(data[len(MAGIC) :], "the envelope"):
        if number == 1:
            for sub_number, sub_wire, sub_value in _fields(_expect_bytes(wire, value, "typeMeta"), "typeMeta"):
                if sub_number == 1:
                    api_version = _text(_expect_bytes(sub_wire, sub_value, "typeMeta.apiVersion"))
                elif sub_number == 2:
                    kind = _text(_expect_bytes(sub_wire, sub_value, "typeMeta.kind"))
        elif number == 2:
            raw = _expect_bytes(wire, value, "raw")
        elif number == 3:
            content_encoding = _text(_expect_bytes(wire, value, "contentEncoding"))
        elif number == 4:
            content_type = _text(_expect_bytes(wire, value, "contentType"))
    if not kind or not api_version:
        raise errors.bad_request("the protobuf body does not name its apiVersion and kind")
    if content_encoding:
        raise _unsupported(f"protobuf bodies with contentEncoding {content_encoding!r} are not supported")
    if content_type and content_type != CONTENT_TYPE:
        raise _unsupported(f"protobuf envelopes carrying {content_type!r} are not supported")
    message = KINDS.get((api_version, kind)) or ANY_VERSION_KINDS.get(kind)
    if message is None:
        raise _unsupported(f"{kind} ({api_version}) cannot be sent as protobuf here; send it as application/json")
    return {"apiVersion": api_version, "kind": kind, **_message(message, raw, "")}


def _unsupported(message: str) -> errors.ApiError:
    return errors.ApiError(415, "UnsupportedMediaType", message)


def _malformed(path: str, what: str) -> errors.ApiError:
    where = path or "the object"
    return errors.bad_request(f"the protobuf body is malformed at {where}: {what}")


# -- the wire format ----------------------------------------------------------------------------------------------
def _varint(buf: bytes, pos: int, path: str) -> tuple[int, int]:
    result = shift = 0
    for i in range(pos, min(pos + 10, len(buf))):
        byte = buf[i]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & _U64, i + 1
        shift += 7
    if len(buf) - pos >= 10:
        raise _malformed(path, "a varint is longer than 10 bytes")
    raise _malformed(path, "the body ends inside a varint")


def _fields(buf: bytes, path: str) -> Iterator[tuple[int, int, int | bytes]]:
    """Each field of one message as (number, wire type, value): an int for varints and fixed-width values, the
    payload for length-delimited ones."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos, path)
        number, wire = key >> 3, key & 7
        if number == 0 or number > _MAX_FIELD:
            raise _malformed(path, f"field number {number} is out of range")
        if wire == VARINT:
            value, pos = _varint(buf, pos, path)
            yield number, wire, value
        elif wire in (FIXED64, FIXED32):
            width = 8 if wire == FIXED64 else 4
            if pos + width > len(buf):
                raise _malformed(path, f"the body ends inside field {number}")
            yield number, wire, int.from_bytes(buf[pos : pos + width], "little")
            pos += width
        elif wire == LENGTH:
            size, pos = _varint(buf, pos, path)
            if size > len(buf) - pos:
                raise _malformed(path, f"field {number} is longer than what is left of the body")
            yield number, wire, buf[pos : pos + size]
            pos += size
        else:
            raise _malformed(path, f"field {number} has wire type {wire}, which Kubernetes never uses")


def _expect_bytes(wire: int, value: int | bytes, path: str) -> bytes:
    if wire != LENGTH or not isinstance(value, bytes):
        raise _malformed(path, f"expected a length-delimited field, got wire type {wire}")
    return value


def _expect_int(wire: int, value: int | bytes, path: str) -> int:
    if wire != VARINT or not isinstance(value, int):
        raise _malformed(path, f"expected a varint, got wire type {wire}")
    return value


def _text(raw: bytes) -> str:
    # Go strings may hold any bytes; its JSON encoder replaces invalid UTF-8 with U+FFFD, and so do we.
    return raw.decode("utf-8", errors="replace")


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


# -- messages -----------------------------------------------------------------------------------------------------
def _compile(type_name: str, json_name: str) -> Field:
    if type_name.startswith("inline "):
        return Field(json_name, Kind.MESSAGE, type_name.removeprefix("inline "), inline=True)
    if type_name.startswith("map[string]"):
        kind, message = _kind(type_name.removeprefix("map[string]"))
        return Field(json_name, kind, message, is_map=True)
    repeated = type_name.startswith("[]")
    pointer = type_name.startswith("*")
    kind, message = _kind(type_name.lstrip("[]*"))
    return Field(json_name, kind, message, pointer=pointer, repeated=repeated)


def _kind(name: str) -> tuple[Kind, str]:
    for kind in Kind:
        if kind.value == name and kind is not Kind.MESSAGE:
            return kind, ""
    if name not in MESSAGES:
        raise ValueError(f"protobuf schema names an unknown message {name!r}")
    return Kind.MESSAGE, name


SCHEMA: dict[str, dict[int, Field]] = {
    message: {number: _compile(go_type, json_name) for number, (json_name, go_type) in fields.items()}
    for message, fields in MESSAGES.items()
}


def _message(name: str, buf: bytes, path: str) -> dict[str, Any]:
    schema = SCHEMA[name]
    out: dict[str, Any] = {}
    for number, wire, value in _fields(buf, path or "the object"):
        field = schema.get(number)
        if field is None:
            continue
        where = f"{path}.{field.name}" if path and field.name else (field.name or path)
        if field.inline:
            out.update(_message(field.message, _expect_bytes(wire, value, where), path))
        elif field.is_map:
            key, item = _map_entry(field, _expect_bytes(wire, value, where), where)
            out.setdefault(field.name, {})[key] = item
        elif field.repeated:
            items = out.setdefault(field.name, [])
            if field.kind in _NUMERIC and wire == LENGTH:  # a packed list of varints
                packed = _expect_bytes(wire, value, where)
                pos = 0
                while pos < len(packed):
                    number_value, pos = _varint(packed, pos, where)
                    items.append(_numeric(field.kind, number_value))
            else:
                items.append(_value(field, wire, value, f"{where}[{len(items)}]"))
        else:
            decoded = _value(field, wire, value, where)
            if field.pointer and decoded is not None:
                out[field.name] = decoded
            elif _is_zero(decoded):
                out.pop(field.name, None)
            elif isinstance(decoded, dict) and isinstance(out.get(field.name), dict):
                out[field.name] = {**out[field.name], **decoded}  # a repeated message field merges
            else:
                out[field.name] = decoded
    return out


def _map_entry(field: Field, buf: bytes, path: str) -> tuple[str, Any]:
    key = ""
    item: Any = None
    for number, wire, value in _fields(buf, path):
        if number == 1:
            key = _text(_expect_bytes(wire, value, path))
        elif number == 2:
            item = _value(field, wire, value, f"{path}[{key!r}]")
    if item is None:  # an entry without a value holds the type's zero value
        item = {Kind.STRING: "", Kind.BYTES: "", Kind.QUANTITY: "0", Kind.EXTRA_VALUE: []}.get(field.kind, {})
    return key, item


def _value(field: Field, wire: int, value: int | bytes, path: str) -> Any:
    kind = field.kind
    if kind in _NUMERIC:
        return _numeric(kind, _expect_int(wire, value, path))
    raw = _expect_bytes(wire, value, path)
    if kind is Kind.STRING:
        return _text(raw)
    if kind is Kind.BYTES:
        return base64.b64encode(raw).decode("ascii")
    if kind is Kind.MESSAGE:
        return _message(field.message, raw, path)
    if kind in (Kind.TIME, Kind.MICRO_TIME):
        return _time(raw, path, micro=kind is Kind.MICRO_TIME)
    if kind is Kind.QUANTITY:
        return _quantity(raw, path)
    if kind is Kind.INT_OR_STRING:
        return _int_or_string(raw, path)
    return [_text(_expect_bytes(w, v, path)) for n, w, v in _fields(raw, path) if n == 1]  # ExtraValue


def _numeric(kind: Kind, value: int) -> bool | int:
    if kind is Kind.BOOL:
        return value != 0
    return _signed(value, 32 if kind is Kind.INT32 else 64)


def _is_zero(value: Any) -> bool:
    return value is None or value is False or value in ("", 0, {}, [])


# -- apimachinery's special types ---------------------------------------------------------------------------------
def _time(raw: bytes, path: str, *, micro: bool) -> str | None:
    """``metav1.Time``/``MicroTime`` ({int64 seconds = 1; int32 nanos = 2}) as kube-apiserver prints it; the zero
    time, which Go writes as an empty message, is ``None`` (``null``)."""
    seconds = nanos = 0
    for number, wire, value in _fields(raw, path):
        if number == 1:
            seconds = _signed(_expect_int(wire, value, path), 64)
        elif number == 2:
            nanos = _signed(_expect_int(wire, value, path), 32)
    if not raw or (seconds == _MIN_SECONDS and nanos == 0):
        return None
    if not _MIN_SECONDS <= seconds <= _MAX_SECONDS or not 0 <= nanos <= 999_999_999:
        raise _malformed(path, f"the time {seconds}s {nanos}ns is out of range")
    moment = _EPOCH + dt.timedelta(seconds=seconds)
    text = f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}T{moment:%H:%M:%S}"
    return f"{text}.{nanos // 1000:06d}Z" if micro else f"{text}Z"


def _quantity(raw: bytes, path: str) -> str | None:
    """``resource.Quantity`` ({string string = 1}) is its canonical string in JSON."""
    text = ""
    for number, wire, value in _fields(raw, path):
        if number == 1:
            text = _text(_expect_bytes(wire, value, path))
    return text or None


def _int_or_string(raw: bytes, path: str) -> int | str:
    """``intstr.IntOrString`` ({int64 type = 1; int32 intVal = 2; string strVal = 3}): a JSON int or string."""
    kind = int_value = 0
    str_value = ""
    for number, wire, value in _fields(raw, path):
        if number == 1:
            kind = _expect_int(wire, value, path)
        elif number == 2:
            int_value = _signed(_expect_int(wire, value, path), 32)
        elif number == 3:
            str_value = _text(_expect_bytes(wire, value, path))
    if kind == 0:
        return int_value
    if kind == 1:
        return str_value
    raise _malformed(path, f"an IntOrString has type {kind}; only 0 (int) and 1 (string) exist")
