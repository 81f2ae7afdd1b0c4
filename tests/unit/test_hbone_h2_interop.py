"""Our HTTP/2 engine against an independent one: h2 4.4 as the peer of both our client and our server."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from ambit.hbone import (
    ConnectionDraining,
    ConnectionTerminated,
    DataReceived,
    Event,
    HboneClientConnection,
    HboneServerConnection,
    StreamEnded,
    StreamReset,
    TunnelEstablished,
    TunnelRefused,
    TunnelRequested,
)

MiB = 1024 * 1024


def _h2(client: bool) -> h2.connection.H2Connection:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=client, header_encoding=None))
    conn.initiate_connection()
    return conn


class WithH2Server:
    """Our client, h2's server; ``pump`` moves bytes until both are quiet."""

    def __init__(self) -> None:
        self.ours = HboneClientConnection()
        self.peer = _h2(client=False)
        self.our_events: list[Event] = []
        self.peer_events: list[h2.events.Event] = []
        self.pump()

    def pump(self) -> None:
        while True:
            to_peer, to_us = self.ours.data_to_send(), self.peer.data_to_send()
            if not to_peer and not to_us:
                return
            if to_peer:
                for event in self.peer.receive_data(to_peer):
                    self.peer_events.append(event)
                    if isinstance(event, h2.events.DataReceived):
                        self.peer.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id or 0)
            if to_us:
                for ours in self.ours.receive_data(to_us):
                    self.our_events.append(ours)
                    if isinstance(ours, DataReceived):
                        self.ours.consumed(ours.stream_id, ours.flow_length)


class WithH2Client:
    """h2's client, our server."""

    def __init__(self) -> None:
        self.ours = HboneServerConnection()
        self.peer = _h2(client=True)
        self.our_events: list[Event] = []
        self.peer_events: list[h2.events.Event] = []
        self.pump()

    pump = WithH2Server.pump


def _ours_data(events: list[Event]) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, DataReceived))


def _peer_data(events: list[h2.events.Event]) -> bytes:
    return b"".join(e.data or b"" for e in events if isinstance(e, h2.events.DataReceived))


def test_our_client_tunnels_through_an_h2_server_both_ways_with_flow_control() -> None:
    pair = WithH2Server()
    stream_id = pair.ours.open_tunnel("198.18.200.7:8080", [("x-test", "1")])
    pair.pump()
    request = next(e for e in pair.peer_events if isinstance(e, h2.events.RequestReceived))
    assert dict(request.headers or [])[b":method"] == b"CONNECT"
    assert dict(request.headers or [])[b":authority"] == b"198.18.200.7:8080"
    pair.peer.send_headers(stream_id, [(":status", "200")])
    pair.pump()
    assert any(isinstance(e, TunnelEstablished) for e in pair.our_events)
    payload = bytes(range(256)) * 8192  # 2 MiB: several h2 windows of 64 KiB
    pair.ours.send_data(stream_id, payload)
    pair.ours.end_stream(stream_id)
    for _ in range(200):
        pair.pump()
        if pair.ours.pending_bytes(stream_id) == 0:
            break
    assert _peer_data(pair.peer_events) == payload
    assert any(isinstance(e, h2.events.StreamEnded) for e in pair.peer_events)
    reply = b"r" * (MiB + 7)
    sent = 0
    while sent < len(reply):
        window = min(pair.peer.local_flow_control_window(stream_id), pair.peer.max_outbound_frame_size)
        chunk = reply[sent : sent + window]
        pair.peer.send_data(stream_id, chunk, end_stream=sent + len(chunk) == len(reply))
        sent += len(chunk)
        pair.pump()
    assert _ours_data(pair.our_events) == reply
    assert pair.our_events[-1] == StreamEnded(stream_id)
    assert pair.ours.active_streams == 0


def test_h2_client_tunnels_through_our_server_both_ways() -> None:
    pair = WithH2Client()
    pair.peer.send_headers(1, [(":method", "CONNECT"), (":authority", "198.18.200.7:8080")])
    pair.pump()
    assert pair.our_events == [TunnelRequested(1, "198.18.200.7:8080", ())]
    pair.ours.respond(1, 200)
    pair.pump()
    response = next(e for e in pair.peer_events if isinstance(e, h2.events.ResponseReceived))
    assert dict(response.headers or [])[b":status"] == b"200"
    pair.peer.send_data(1, b"hello", end_stream=True)
    pair.pump()
    assert _ours_data(pair.our_events) == b"hello"
    pair.ours.send_data(1, b"z" * 300_000)  # beyond h2's default 64 KiB receive window
    pair.ours.end_stream(1)
    for _ in range(50):
        pair.pump()
    assert _peer_data(pair.peer_events) == b"z" * 300_000
    assert any(isinstance(e, h2.events.StreamEnded) for e in pair.peer_events)
    assert pair.ours.active_streams == 0


def test_h2_ping_is_answered_and_settings_are_acknowledged() -> None:
    pair = WithH2Client()
    pair.peer.ping(b"12345678")
    pair.peer.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1000})
    pair.pump()
    assert any(isinstance(e, h2.events.PingAckReceived) and e.ping_data == b"12345678" for e in pair.peer_events)
    assert any(isinstance(e, h2.events.SettingsAcknowledged) for e in pair.peer_events)


def test_a_smaller_peer_window_mid_stream_is_obeyed() -> None:
    pair = WithH2Server()
    stream_id = pair.ours.open_tunnel("198.18.200.7:8080")
    pair.pump()
    pair.peer.send_headers(stream_id, [(":status", "200")])
    pair.peer.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 100})
    pair.pump()
    pair.ours.send_data(stream_id, b"a" * 1000)
    pair.pump()  # h2 acknowledges at once, so the whole kilobyte arrives in pieces of at most 100 octets
    frames = [e for e in pair.peer_events if isinstance(e, h2.events.DataReceived)]
    assert b"".join(e.data or b"" for e in frames) == b"a" * 1000
    assert max(len(e.data or b"") for e in frames) <= 100


def test_h2_server_resets_reach_our_client_as_remote_resets() -> None:
    pair = WithH2Server()
    stream_id = pair.ours.open_tunnel("198.18.200.7:8080")
    pair.pump()
    pair.peer.send_headers(stream_id, [(":status", "200")])
    pair.peer.reset_stream(stream_id, 0x8)
    pair.pump()
    assert StreamReset(stream_id, 0x8, remote=True) in pair.our_events
    assert pair.ours.active_streams == 0


@pytest.mark.parametrize("status", ["403", "503"])
def test_h2_server_refusal_with_headers_spread_over_continuations(status: str) -> None:
    pair = WithH2Server()
    stream_id = pair.ours.open_tunnel("198.18.200.7:8080")
    pair.pump()
    big = [(f"x-filler-{i}", "v" * 1000) for i in range(30)]  # about 30 KiB: HEADERS plus a CONTINUATION
    pair.peer.send_headers(stream_id, [(":status", "100")])
    pair.peer.send_headers(stream_id, [(":status", status), *big], end_stream=True)
    pair.pump()
    refused = [e for e in pair.our_events if isinstance(e, TunnelRefused)]
    assert len(refused) == 1 and refused[0].status == int(status)
    assert ("x-filler-29", "v" * 1000) in refused[0].headers
    assert not any(isinstance(e, ConnectionTerminated) for e in pair.our_events)


def test_h2_graceful_goaway_drains_our_client() -> None:
    """h2's GOAWAY(NO_ERROR) naming our stream: that tunnel goes on, no new one is opened (RFC 9113 §6.8)."""
    pair = WithH2Server()
    stream_id = pair.ours.open_tunnel("198.18.200.7:8080")
    pair.pump()
    pair.peer.close_connection(error_code=0, additional_data=b"bye", last_stream_id=stream_id)
    pair.pump()
    assert ConnectionDraining(stream_id, "bye") in pair.our_events
    assert not any(isinstance(e, ConnectionTerminated) for e in pair.our_events)
    assert not pair.ours.closed and pair.ours.active_streams == 1 and not pair.ours.can_open_tunnel


def test_h2_goaway_with_an_error_terminates_our_client() -> None:
    pair = WithH2Server()
    pair.ours.open_tunnel("198.18.200.7:8080")
    pair.pump()
    pair.peer.close_connection(error_code=2, additional_data=b"bye")
    pair.pump()
    terminated = [e for e in pair.our_events if isinstance(e, ConnectionTerminated)]
    assert len(terminated) == 1 and terminated[0].reason == "bye"
    assert pair.ours.closed and not pair.ours.can_open_tunnel


def test_our_client_closing_sends_a_goaway_h2_understands() -> None:
    pair = WithH2Server()
    pair.ours.close()
    pair.pump()
    assert any(isinstance(e, h2.events.ConnectionTerminated) and e.error_code == 0 for e in pair.peer_events)
