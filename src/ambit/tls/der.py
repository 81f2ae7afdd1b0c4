"""The few pieces of ASN.1 DER the node proxy reads and writes itself, so that its data path needs no X.509 library.

Theory of operation: :func:`read` splits one tag-length-value element off a buffer and :func:`children` walks the
elements inside a constructed one; :func:`encode` builds one. Only what certificates and certificate requests use
is supported: one-byte tags (numbers up to 30) and definite lengths.

Invariants:

- Reading is strict DER: an indefinite length, a length in more bytes than it needs, a long form for a length
  below 128, a multi-byte tag or an element running past its container is a :class:`DerError`, never a guess.
- Nothing here allocates more than the input's size or recurses: a hostile buffer costs one pass over it.

PEM, the text armour of DER, is here too (:func:`pem`). Pure: no I/O.
"""

from __future__ import annotations

import base64

from ambit.errors import AmbitError

SEQUENCE = 0x30
SET = 0x31
INTEGER = 0x02
BIT_STRING = 0x03
OCTET_STRING = 0x04
NULL = 0x05
OBJECT_IDENTIFIER = 0x06
BOOLEAN = 0x01
UTC_TIME = 0x17
GENERALIZED_TIME = 0x18


class DerError(AmbitError):
    """A buffer is not the strict DER this module reads."""


def read(data: bytes, start: int = 0, end: int | None = None) -> tuple[int, int, int]:
    """The element at ``data[start:]`` within ``end``: ``(tag, content_start, content_end)``."""
    end = len(data) if end is None else end
    if end - start < 2:
        raise DerError("truncated element")
    tag = data[start]
    if tag & 0x1F == 0x1F:
        raise DerError("multi-byte tags are not supported")
    first = data[start + 1]
    position = start + 2
    if first < 0x80:
        length = first
    else:
        count = first & 0x7F
        if count == 0:
            raise DerError("indefinite length")
        if count > 4 or position + count > end:
            raise DerError("length out of range")
        length = int.from_bytes(data[position : position + count], "big")
        position += count
        if length < 0x80 or length >> (8 * (count - 1)) == 0:
            raise DerError("length not in its shortest form")
    if position + length > end:
        raise DerError("element runs past its container")
    return tag, position, position + length


def read_all(data: bytes, tag: int) -> tuple[int, int]:
    """The content bounds of ``data``, which must be exactly one element of ``tag``."""
    found, start, end = read(data)
    if found != tag or end != len(data):
        raise DerError(f"expected one element of tag {tag:#04x}")
    return start, end


def children(data: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    """The elements that fill ``data[start:end]`` exactly, in order, as :func:`read` gives them."""
    found = []
    position = start
    while position < end:
        element = read(data, position, end)
        found.append(element)
        position = element[2]
    return found


def encode(tag: int, *contents: bytes) -> bytes:
    """One element of ``tag`` holding ``contents`` concatenated, with its length in the shortest form."""
    body = b"".join(contents)
    length = len(body)
    if length < 0x80:
        return bytes((tag, length)) + body
    octets = length.to_bytes((length.bit_length() + 7) // 8, "big")
    return bytes((tag, 0x80 | len(octets))) + octets + body


def pem(label: bytes, data: bytes) -> bytes:
    """``data`` as a PEM block of ``label`` (``CERTIFICATE``, ``PRIVATE KEY``...), in 64-character lines."""
    body = base64.b64encode(data)
    lines = b"\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return b"-----BEGIN " + label + b"-----\n" + lines + b"\n-----END " + label + b"-----\n"
