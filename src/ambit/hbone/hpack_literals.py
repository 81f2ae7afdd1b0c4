"""HPACK header blocks that touch no dynamic table (RFC 7541): what an HBONE CONNECT and its answer are sent as.

Theory of operation: every field is sent either as an indexed field of the static table, when the static table
holds that exact name and value (``:status 200``), or as a "literal header field without indexing" (§6.2.2), with
the name given by its static-table index when the table has the name (``:method``, ``:authority``) and as a
literal otherwise; strings are literal octets, not Huffman-coded (§5.2, H = 0). Neither representation adds an
entry to the peer's dynamic table, so a block made here can be sent between blocks of a stateful encoder (the
``hpack`` package's) without either side's table drifting, and any HPACK decoder reads it.

Why: the fields of an HBONE CONNECT differ per tunnel (the client's address in ``forwarded``), so indexing them buys
nothing but evictions, and the general encoder's table search costs more than the tunnel's own framing.

The caller must not use this for a block that has to carry a dynamic table size update (§4.2: the first block after
the peer lowered SETTINGS_HEADER_TABLE_SIZE); :meth:`ambit.hbone.state.ConnectionState._send_headers` sends
that block through the stateful encoder.
"""

from __future__ import annotations

from collections.abc import Iterable

from hpack.table import HeaderTable

_STATIC = HeaderTable.STATIC_TABLE
_NAME_INDEX: dict[bytes, int] = {}
_FIELD_INDEX: dict[tuple[bytes, bytes], int] = {}
for _index, (_name, _value) in enumerate(_STATIC, 1):
    _NAME_INDEX.setdefault(_name, _index)
    _FIELD_INDEX.setdefault((_name, _value), _index)


_OCTETS = [bytes((octet,)) for octet in range(256)]
"""Each one-octet ``bytes``, made once: most integers of a CONNECT block fit their prefix (one octet)."""


def integer(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (§5.1) with ``prefix_bits`` of prefix, OR-ed into the first octet's high bits ``first``."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(octets: bytes) -> bytes:
    return integer(len(octets), 7, 0) + octets


def encode(fields: Iterable[tuple[str, str]]) -> bytes:
    """The header block of ``fields`` (names lower-case, as HTTP/2 requires), in order, indexing nothing."""
    out = []
    for name, value in fields:
        raw_name, raw_value = name.encode("utf-8"), value.encode("utf-8")
        # Each integer that fits its prefix is its one octet, inline (``integer`` would return the same); a
        # Python call each fewer, several per tunnel.
        index = _FIELD_INDEX.get((raw_name, raw_value))
        if index is not None:  # indexed field (§6.1); the static table's 61 entries all fit 7 bits
            out.append(_OCTETS[0x80 | index] if index < 0x7F else integer(index, 7, 0x80))
            continue
        index = _NAME_INDEX.get(raw_name)
        if index is not None:  # literal without indexing, indexed name (§6.2.2)
            out.append(_OCTETS[index] if index < 0x0F else integer(index, 4, 0x00))
        else:
            out.append(b"\x00" + _string(raw_name))  # literal without indexing, new name
        length = len(raw_value)
        out.append((_OCTETS[length] if length < 0x7F else integer(length, 7, 0)) + raw_value)
    return b"".join(out)
