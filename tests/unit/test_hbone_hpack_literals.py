"""HPACK blocks that index nothing: any decoder reads them back, and no dynamic table changes on either side."""

from __future__ import annotations

from hpack import Decoder
from hypothesis import given
from hypothesis import strategies as st

from ambit.hbone import HboneClientConnection, HboneServerConnection, TunnelRequested, hpack_literals

_NAMES = st.sampled_from([":method", ":authority", ":status", ":path", "forwarded", "baggage", "accept", "x-a"])
_NAME = st.one_of(_NAMES, st.from_regex(r"[a-z0-9-]{1,300}", fullmatch=True))
_VALUE = st.one_of(st.sampled_from(["", "200", "GET", "CONNECT", "/"]), st.text(max_size=300))


@given(st.lists(st.tuples(_NAME, _VALUE), max_size=12))
def test_any_decoder_reads_a_literal_block_back_and_its_table_stays_empty(fields: list[tuple[str, str]]) -> None:
    decoder = Decoder()
    decoded = decoder.decode(hpack_literals.encode(fields), raw=True)
    assert [(name.decode(), value.decode()) for name, value in decoded] == fields
    assert len(decoder.header_table.dynamic_entries) == 0


def test_a_200_is_one_indexed_octet_and_a_connect_names_its_pseudo_headers_by_index() -> None:
    assert hpack_literals.encode([(":status", "200")]) == b"\x88"
    block = hpack_literals.encode([(":method", "CONNECT"), (":authority", "198.18.0.7:80")])
    assert block == b"\x02\x07CONNECT" + b"\x01\x0d198.18.0.7:80"


def test_a_tunnel_crosses_with_literal_blocks_and_the_peers_tables_stay_empty() -> None:
    client, server = HboneClientConnection(), HboneServerConnection()
    for i in range(3):
        stream_id = client.open_tunnel("198.18.200.7:8080", [("forwarded", f'for="198.18.0.7:{40000 + i}"')])
        events = server.receive_data(client.data_to_send())
        requested = [e for e in events if isinstance(e, TunnelRequested)]
        assert requested and requested[0].authority == "198.18.200.7:8080"
        assert requested[0].headers == (("forwarded", f'for="198.18.0.7:{40000 + i}"'),)
        server.respond(stream_id, 200)
        client.receive_data(server.data_to_send())
    assert len(server._decoder.header_table.dynamic_entries) == 0
    assert len(client._decoder.header_table.dynamic_entries) == 0


def test_after_the_peer_shrinks_its_table_the_next_block_opens_with_the_size_update() -> None:
    client = HboneClientConnection()
    client.data_to_send()
    client._encoder.header_table_size = 0  # what a peer's SETTINGS_HEADER_TABLE_SIZE 0 makes the core do
    client.open_tunnel("198.18.200.7:8080")
    out = client.data_to_send()
    block = out[9:]  # one HEADERS frame: its 9-octet header, then the block
    assert block[0] == 0x20  # dynamic table size update to 0 (RFC 7541 §6.3), first in the block
    assert Decoder().decode(block, raw=True)[:2] == [(b":method", b"CONNECT"), (b":authority", b"198.18.200.7:8080")]
    client.open_tunnel("198.18.200.7:8081")
    assert client.data_to_send()[9] != 0x20  # only once


def _reference_encode(fields: list[tuple[str, str]]) -> bytes:
    """The block as §6.1 / §6.2.2 spell it, every integer through ``integer`` (what ``encode`` did before its
    one-octet cases were inlined)."""
    out = b""
    for name, value in fields:
        raw_name, raw_value = name.encode(), value.encode()
        index = hpack_literals._FIELD_INDEX.get((raw_name, raw_value))
        if index is not None:
            out += hpack_literals.integer(index, 7, 0x80)
            continue
        index = hpack_literals._NAME_INDEX.get(raw_name)
        if index is not None:
            out += hpack_literals.integer(index, 4, 0x00)
        else:
            out += b"\x00" + hpack_literals.integer(len(raw_name), 7, 0) + raw_name
        out += hpack_literals.integer(len(raw_value), 7, 0) + raw_value
    return out


_STATIC_NAMES = st.sampled_from(sorted({name.decode() for name, _ in hpack_literals._STATIC}))


@given(st.lists(st.tuples(st.one_of(_NAME, _STATIC_NAMES), st.one_of(_VALUE, st.text(min_size=120, max_size=400)))))
def test_a_block_is_the_octets_the_integer_rules_spell(fields: list[tuple[str, str]]) -> None:
    assert hpack_literals.encode(fields) == _reference_encode(fields)
