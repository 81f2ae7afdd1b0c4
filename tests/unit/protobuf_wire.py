"""A tiny protobuf encoder for hand-built Kubernetes bodies (``application/vnd.kubernetes.protobuf``), shared by the
tests of the API server's protobuf decoder."""

from __future__ import annotations

from typing import Any

from ambit.apiserver.protobuf import MAGIC, decode_protobuf_body


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative numbers go out as 10-byte two's complement, as Go writes them
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def num(field: int, n: int) -> bytes:
    return varint(field << 3) + varint(n)


def ln(field: int, *parts: bytes | str) -> bytes:
    payload = b"".join(p.encode() if isinstance(p, str) else p for p in parts)
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def entry(field: int, key: str, value: bytes | str) -> bytes:
    return ln(field, ln(1, key), ln(2, value))


def envelope(api_version: str, kind: str, *raw: bytes, encoding: str = "", content_type: str = "") -> bytes:
    body = ln(1, ln(1, api_version), ln(2, kind)) + ln(2, *raw)
    if encoding:
        body += ln(3, encoding)
    if content_type:
        body += ln(4, content_type)
    return MAGIC + body


def meta(name: str = "x", namespace: str = "", **extra: bytes) -> bytes:
    fields = ln(1, name) + (ln(3, namespace) if namespace else b"")
    return ln(1, fields, *extra.values())


def time(seconds: int, nanos: int = 0) -> bytes:
    return num(1, seconds) + (num(2, nanos) if nanos else b"")


def int_or_string(value: int | str) -> bytes:
    return num(1, 1) + ln(3, value) if isinstance(value, str) else num(1, 0) + num(2, value)


def decode(body: bytes) -> dict[str, Any]:
    return decode_protobuf_body(body)
