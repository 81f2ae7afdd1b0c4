"""HPACK header blocks (RFC 7541) coded against the ``hpack`` package's dynamic tables, one block per call.

Theory of operation: the engine keeps an ``hpack.Encoder`` and an ``hpack.Decoder`` per connection for their
state (the dynamic table, its size limits, pending size updates). Coding a block through their own ``encode`` and
``decode`` costs a chain of method calls per field, a ``HeaderTuple`` per field, and a ``logging.debug`` call per
integer and per field, made even when debug logging is off. :func:`encode` and :func:`decode` code a whole block
in one loop over the same table, with the same results:

1. :func:`encode` gives the octets ``encoder.encode(fields, huffman=False)`` would give for plain ``(name,
   value)`` string pairs, and leaves the encoder's table as that would: a field in the table (static or dynamic)
   is sent indexed (§6.1); otherwise as a literal with incremental indexing (§6.2.1), its name by index when the
   table has the name, and it is added to the table. Strings are literal octets, not Huffman-coded. A block that
   must open with a dynamic table size update (the table was resized since the last block, §4.2) is left to
   ``encoder.encode``, which writes the update.
2. :func:`decode` gives what ``decoder.decode(block, raw=True)`` gives (``(name, value)`` octet pairs, in order;
   plain tuples, not ``HeaderTuple``: the never-indexed flag is not kept, nothing here re-encodes a decoded field)
   and leaves the table as that would; it raises ``hpack.HPACKDecodingError`` (or a subclass) for every block
   that one rejects: an index outside the tables, an integer of more than five continuation octets, a truncated
   string, bad Huffman code (the package's own decoder), a size update after a field or above
   ``decoder.max_allowed_table_size``, a table left above that size at the end of the block, or a header list
   larger than ``decoder.max_header_list_size`` (32 octets per field plus its name and value).

The differential tests (``tests/unit/test_hbone_hpack_blocks.py``) hold both functions to the package's own
coding over generated and corrupted blocks.
"""

from __future__ import annotations

from collections.abc import Iterable

from hpack import Decoder, Encoder
from hpack.exceptions import (
    HPACKDecodingError,
    InvalidTableIndexError,
    InvalidTableSizeError,
    OversizedHeaderListError,
)
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

from ambit.hbone.hpack_literals import integer

__all__ = ["decode", "encode"]

_STATIC = HeaderTable.STATIC_TABLE
_STATIC_LENGTH = len(_STATIC)
_STATIC_MAPPING = HeaderTable.STATIC_TABLE_MAPPING
_MAX_CONTINUATION = 5
"""Continuation octets of one integer the package's decoder accepts (its ``VARINT_MAX_LENGTH``)."""


def encode(encoder: Encoder, fields: Iterable[tuple[str, str]]) -> bytes:
    """The block of ``fields`` through ``encoder``'s table (rule 1)."""
    table = encoder.header_table
    if table.resized:
        return encoder.encode(fields, huffman=False)
    out: list[bytes] = []
    append = out.append
    dynamic = table.dynamic_entries
    for name_text, value_text in fields:
        name, value = name_text.encode("utf-8"), value_text.encode("utf-8")
        partial = 0
        static = _STATIC_MAPPING.get(name)
        if static is not None:
            index = static[1].get(value)
            if index is not None:
                append(integer(index, 7, 0x80))
                continue
            partial = static[0]
        if dynamic:
            found = 0
            for offset, (entry_name, entry_value) in enumerate(dynamic, _STATIC_LENGTH + 1):
                if entry_name == name:
                    if entry_value == value:
                        found = offset
                        break
                    if not partial:
                        partial = offset
            if found:
                append(integer(found, 7, 0x80))
                continue
        if partial:
            append(integer(partial, 6, 0x40))
        else:
            append(b"\x40")
            append(integer(len(name), 7, 0))
            append(name)
        append(integer(len(value), 7, 0))
        append(value)
        table.add(name, value)
    return b"".join(out)


def _read_integer(block: bytes, at: int, prefix_bits: int) -> tuple[int, int]:
    """The integer whose first octet is ``block[at]`` and the offset after it."""
    limit = (1 << prefix_bits) - 1
    value = block[at] & limit
    at += 1
    if value < limit:
        return value, at
    shift = 0
    for _ in range(_MAX_CONTINUATION):
        if at >= len(block):
            raise HPACKDecodingError("truncated HPACK integer")
        octet = block[at]
        at += 1
        value += (octet & 0x7F) << shift
        if octet < 0x80:
            return value, at
        shift += 7
    raise HPACKDecodingError("HPACK integer representation too long")


def _read_string(block: bytes, at: int) -> tuple[bytes, int]:
    """The string (§5.2) at ``block[at]`` and the offset after it."""
    if at >= len(block):
        raise HPACKDecodingError("truncated header block")
    huffman = block[at] & 0x80
    length = block[at] & 0x7F
    if length < 0x7F:  # ``_read_integer``'s one-octet case, inline (a Python call per string fewer)
        at += 1
    else:
        length, at = _read_integer(block, at, 7)
    end = at + length
    if end > len(block):
        raise HPACKDecodingError("truncated header block")
    octets = block[at:end]
    return (decode_huffman(octets) if huffman else octets), end


def _entry(table: HeaderTable, index: int) -> tuple[bytes, bytes]:
    if 0 < index <= _STATIC_LENGTH:
        return _STATIC[index - 1]
    dynamic = index - _STATIC_LENGTH - 1
    if 0 <= dynamic < len(table.dynamic_entries):
        return table.dynamic_entries[dynamic]
    raise InvalidTableIndexError(f"invalid table index {index}")


def decode(decoder: Decoder, block: bytes) -> list[tuple[bytes, bytes]]:
    """The fields of ``block`` through ``decoder``'s table (rule 2)."""
    table = decoder.header_table
    limit = decoder.max_header_list_size
    headers: list[tuple[bytes, bytes]] = []
    size = 0
    at = 0
    end = len(block)
    while at < end:
        first = block[at]
        if first & 0x80:  # indexed field (§6.1)
            index = first & 0x7F
            if index < 0x7F:  # ``_read_integer``'s one-octet case, inline (a Python call per field fewer)
                at += 1
            else:
                index, at = _read_integer(block, at, 7)
            field = _entry(table, index)
        elif first & 0x40 or not first & 0x20:  # a literal (§6.2)
            prefix = 6 if first & 0x40 else 4
            if first & ((1 << prefix) - 1):
                index, at = _read_integer(block, at, prefix)
                name = _entry(table, index)[0]
            else:
                name, at = _read_string(block, at + 1)
            value, at = _read_string(block, at)
            field = (name, value)
            if prefix == 6:
                table.add(name, value)
        else:  # dynamic table size update (§6.3)
            if headers:
                raise HPACKDecodingError("table size update not at the start of the block")
            new_size, at = _read_integer(block, at, 5)
            if new_size > decoder.max_allowed_table_size:
                raise InvalidTableSizeError("table size update above the allowed size")
            table.maxsize = new_size
            continue
        headers.append(field)
        size += 32 + len(field[0]) + len(field[1])
        if size > limit:
            raise OversizedHeaderListError(f"a header list larger than {limit} octets")
    if table.maxsize > decoder.max_allowed_table_size:
        raise InvalidTableSizeError("the encoder did not shrink the table to the allowed size")
    return headers
