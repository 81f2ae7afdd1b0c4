"""Protocol Buffers wire format, the writing side: varints, field keys and length-delimited fields, for the few
messages Ambit writes by hand rather than through generated code (the ext_authz ``CheckRequest`` and
``CheckResponse`` of :mod:`ambit.waypoint.ext_authz_wire`, the shared response bodies of :mod:`ambit.xds.frames`).

Theory of operation: a message is the concatenation of its fields; a field is its key (``number << 3 | wire
type``, a varint) followed by its value: a varint for integers, or for strings, bytes and messages a varint
length and that many bytes. Callers build a message from the inside out: the encoded body of a nested message is
the value of its parent's field. Pure, no state.

Rules:

1. :func:`varint` writes the least significant seven bits first, the high bit set on every byte but the last.
   An integer is taken modulo 2**64 first, so a negative ``int32`` or ``int64`` value becomes its 64-bit two's
   complement (ten bytes), as protobuf writes it, and any value gives at most ten bytes.
2. proto3 leaves a singular scalar at its default off the wire: :func:`varint_field` writes nothing for 0 and
   :func:`bytes_field` nothing for empty bytes (also usable for a message field whose reader takes an empty
   message and an absent one alike). An element of a repeated field, or a message that must be present even when
   empty, is written with :func:`length_delimited`, which always writes.
3. Decoding is not here: each reader bounds and blames in its own terms (:mod:`ambit.waypoint.ext_authz_wire`,
   :mod:`ambit.apiserver.protobuf`).
"""

from __future__ import annotations

__all__ = [
    "FIXED32",
    "FIXED64",
    "LENGTH",
    "VARINT",
    "bytes_field",
    "key",
    "length_delimited",
    "varint",
    "varint_field",
]

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
"""The wire types this codebase reads or writes (groups, 3 and 4, are not used by proto3)."""

_MASK64 = (1 << 64) - 1


def varint(value: int) -> bytes:
    """``value`` as a base-128 varint (rule 1)."""
    value &= _MASK64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def key(number: int, wire_type: int) -> bytes:
    """The key that starts field ``number`` of ``wire_type``."""
    return varint(number << 3 | wire_type)


def length_delimited(number: int, data: bytes) -> bytes:
    """Field ``number`` holding ``data`` (bytes, UTF-8 text or an encoded message), written even when empty."""
    return key(number, LENGTH) + varint(len(data)) + data


def bytes_field(number: int, data: bytes) -> bytes:
    """A singular length-delimited field: as :func:`length_delimited`, but nothing when ``data`` is empty (rule 2)."""
    return key(number, LENGTH) + varint(len(data)) + data if data else b""


def varint_field(number: int, value: int) -> bytes:
    """A singular integer field (``int32``, ``int64``, ``uint32``, ``uint64``, ``bool``, an enum): nothing when
    ``value`` is 0 (rule 2)."""
    return key(number, VARINT) + varint(value) if value else b""
