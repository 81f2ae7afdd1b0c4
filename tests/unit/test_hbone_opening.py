"""What a new HBONE connection costs before its first tunnel: its opening bytes are built once per settings value
(and checked then), and its HPACK encoder is made only when a peer's SETTINGS needs one (issue 23, cold
connections)."""

from __future__ import annotations

import pytest
from hpack import Decoder

from ambit.hbone import HboneClientConnection, HboneServerConnection, TunnelRequested, wire
from ambit.hbone.errors import HboneError
from ambit.hbone.settings import OPENINGS_CACHED, HboneSettings, opening


def _expected_opening(settings: HboneSettings, *, client: bool) -> bytes:
    """The opening built field by field, as the connection did for each connection before it was cached."""
    values = [
        (wire.HEADER_TABLE_SIZE, 4096),
        (wire.MAX_CONCURRENT_STREAMS, settings.max_concurrent_streams),
        (wire.INITIAL_WINDOW_SIZE, settings.stream_window),
        (wire.MAX_FRAME_SIZE, settings.max_frame_size),
        (wire.MAX_HEADER_LIST_SIZE, 64 * 1024),
    ]
    if client:
        values.insert(1, (wire.ENABLE_PUSH, 0))
    out = (wire.PREFACE if client else b"") + wire.settings_frame(values)
    if settings.connection_window > wire.DEFAULT_WINDOW:
        out += wire.window_update(0, settings.connection_window - wire.DEFAULT_WINDOW)
    return out


@pytest.mark.parametrize(
    "settings",
    [HboneSettings(), HboneSettings(stream_window=65535, connection_window=65535, max_concurrent_streams=1)],
    ids=["default", "small windows"],
)
def test_each_end_opens_with_its_preface_settings_and_window_update(settings: HboneSettings) -> None:
    assert HboneClientConnection(settings).data_to_send() == _expected_opening(settings, client=True)
    assert HboneServerConnection(settings).data_to_send() == _expected_opening(settings, client=False)


def test_connections_with_equal_settings_share_one_opening() -> None:
    first, second = HboneServerConnection(HboneSettings()), HboneServerConnection(HboneSettings())
    assert first.outgoing == [_expected_opening(HboneSettings(), client=False)]
    assert first.outgoing[0] is second.outgoing[0]  # built once, not per connection


def test_invalid_settings_are_refused_every_time_never_cached() -> None:
    for _ in range(2):
        with pytest.raises(HboneError, match="stream_window"):
            HboneClientConnection(HboneSettings(stream_window=0))


def test_the_opening_cache_keeps_a_bounded_number_of_settings() -> None:
    for window in range(2 * OPENINGS_CACHED):
        settings = HboneSettings(stream_window=65535 + window)
        assert HboneServerConnection(settings).data_to_send() == _expected_opening(settings, client=False)
    assert opening.cache_info().currsize <= OPENINGS_CACHED


def _pair() -> tuple[HboneClientConnection, HboneServerConnection]:
    client, server = HboneClientConnection(), HboneServerConnection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())  # the client's SETTINGS ACK
    return client, server


def test_a_tunnel_between_our_own_ends_makes_no_hpack_encoder() -> None:
    client, server = _pair()
    stream_id = client.open_tunnel("198.18.200.7:8080", [("forwarded", 'for="198.18.0.7:40000"')])
    events = server.receive_data(client.data_to_send())
    assert any(isinstance(e, TunnelRequested) for e in events)
    server.respond(stream_id, 200)
    client.receive_data(server.data_to_send())
    assert client._hpack_encoder is None and server._hpack_encoder is None  # the literal blocks needed none


def test_a_peer_that_shrinks_the_table_by_settings_gets_the_size_update_in_the_next_block() -> None:
    client = HboneClientConnection()
    client.data_to_send()
    peer_settings = wire.settings_frame([(wire.HEADER_TABLE_SIZE, 0)])
    client.receive_data(peer_settings)
    client.data_to_send()  # our ACK
    assert client._hpack_encoder is not None  # made for the size change
    client.open_tunnel("198.18.200.7:8080")
    block = client.data_to_send()[9:]
    assert block[0] == 0x20  # dynamic table size update to 0 (RFC 7541 §6.3), first in the block
    assert Decoder().decode(block, raw=True)[:2] == [(b":method", b"CONNECT"), (b":authority", b"198.18.200.7:8080")]
    client.open_tunnel("198.18.200.7:8081")
    assert client.data_to_send()[9] != 0x20  # only once


def test_a_peer_announcing_the_default_table_size_changes_nothing() -> None:
    client = HboneClientConnection()
    client.data_to_send()
    client.receive_data(wire.settings_frame([(wire.HEADER_TABLE_SIZE, 4096)]))
    client.data_to_send()
    assert client._hpack_encoder is None
    client.open_tunnel("198.18.200.7:8080")
    assert client.data_to_send()[9] != 0x20  # no size update: the table never changed
