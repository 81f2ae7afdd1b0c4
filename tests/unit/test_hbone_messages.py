"""HTTP/2 requests on our engine (``ambit.hbone.messages``) against h2 4.4 as the independent peer of both ends."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import h2.exceptions
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.hbone import wire
from ambit.hbone.budgets import MAX_EARLY_RESETS
from ambit.hbone.events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    RequestReceived,
    RequestRejected,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    TrailersReceived,
)
from ambit.hbone.messages import Http2ClientConnection, Http2ServerConnection
from ambit.hbone.settings import HboneSettings

GRPC_REQUEST = [
    (":method", "POST"),
    (":scheme", "http"),
    (":authority", "echo.app.svc.cluster.local:50051"),
    (":path", "/echo.Echo/Say"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def _h2(client: bool) -> h2.connection.H2Connection:
    config = h2.config.H2Configuration(client_side=client, header_encoding="utf-8", validate_inbound_headers=True)
    conn = h2.connection.H2Connection(config)
    conn.initiate_connection()
    return conn


class Pair:
    """One of ours and h2 on the other end; ``pump`` moves bytes until both are quiet."""

    def __init__(self, ours: Http2ServerConnection | Http2ClientConnection, client_peer: bool) -> None:
        self.ours = ours
        self.peer = _h2(client=client_peer)
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

    def our(self, kind: type) -> list:  # type: ignore[type-arg]
        return [e for e in self.our_events if isinstance(e, kind)]

    def peers(self, kind: type) -> list:  # type: ignore[type-arg]
        return [e for e in self.peer_events if isinstance(e, kind)]


def test_a_grpc_exchange_from_an_h2_client_carries_body_and_trailers_both_ways() -> None:
    pair = Pair(Http2ServerConnection(), client_peer=True)
    pair.peer.send_headers(1, GRPC_REQUEST)
    pair.peer.send_data(1, b"\0\0\0\0\5hello", end_stream=True)
    pair.pump()
    request = pair.our(RequestReceived)[0]
    assert (request.method, request.scheme, request.path) == ("POST", "http", "/echo.Echo/Say")
    assert request.authority == "echo.app.svc.cluster.local:50051"
    assert ("te", "trailers") in request.headers
    assert b"".join(bytes(e.data) for e in pair.our(DataReceived)) == b"\0\0\0\0\5hello"
    assert pair.our(StreamEnded)
    pair.ours.respond(1, 200, [("content-type", "application/grpc")])
    pair.ours.send_data(1, b"\0\0\0\0\2hi")
    pair.ours.send_trailers(1, [("grpc-status", "0"), ("grpc-message", "")])
    pair.pump()
    response = pair.peers(h2.events.ResponseReceived)[0]
    assert (":status", "200") in response.headers
    trailers = pair.peers(h2.events.TrailersReceived)[0]
    assert ("grpc-status", "0") in trailers.headers
    assert pair.peers(h2.events.StreamEnded)
    assert pair.ours.active_streams == 0


def test_trailers_held_back_by_flow_control_follow_the_data() -> None:
    pair = Pair(Http2ServerConnection(), client_peer=True)
    pair.peer.send_headers(1, GRPC_REQUEST, end_stream=True)
    pair.pump()
    pair.peer_events.clear()
    body = b"x" * 200_000  # beyond h2's default 65,535 window: part of it waits for WINDOW_UPDATE
    pair.ours.respond(1, 200)
    pair.ours.send_data(1, body)
    pair.ours.send_trailers(1, [("grpc-status", "0")])
    pair.pump()
    got = b"".join(e.data for e in pair.peers(h2.events.DataReceived))
    assert got == body
    kinds = [type(e) for e in pair.peer_events if not isinstance(e, h2.events.WindowUpdated)]
    assert kinds.index(h2.events.TrailersReceived) > max(i for i, k in enumerate(kinds) if k is h2.events.DataReceived)


def test_our_client_against_an_h2_server_gets_the_response_and_its_trailers() -> None:
    pair = Pair(Http2ClientConnection(), client_peer=False)
    sid = pair.ours.send_request("POST", "http", "echo:50051", "/echo.Echo/Say", [("content-type", "application/grpc")])
    pair.ours.send_data(sid, b"ping")
    pair.ours.send_trailers(sid, [("x-end", "1")])
    pair.pump()
    received = pair.peers(h2.events.RequestReceived)[0]
    assert (":path", "/echo.Echo/Say") in received.headers
    assert pair.peers(h2.events.TrailersReceived)[0].headers == [("x-end", "1")]
    pair.peer.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
    pair.peer.send_data(sid, b"pong")
    pair.peer.send_headers(sid, [("grpc-status", "7")], end_stream=True)
    pair.pump()
    assert pair.our(ResponseReceived)[0].status == 200
    assert pair.our(TrailersReceived)[0].headers == (("grpc-status", "7"),)
    assert pair.our(StreamEnded)
    assert pair.ours.active_streams == 0


def test_data_before_the_response_head_resets_only_that_stream() -> None:
    client = Http2ClientConnection()
    server = Http2ServerConnection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    sid = client.send_request("GET", "http", "a", "/", end_stream=True)
    server.receive_data(client.data_to_send())
    # A raw DATA frame for the stream, before any HEADERS: a broken server.
    events = client.receive_data(wire.frame(wire.DATA, 0, sid, b"early"))
    assert [type(e) for e in events] == [StreamReset]
    assert not client.closed


def test_malformed_request_heads_are_reset_and_a_flood_of_them_ends_the_connection() -> None:
    pair = Pair(Http2ServerConnection(), client_peer=True)
    pair.peer.config.validate_outbound_headers = False
    pair.peer.config.normalize_outbound_headers = False
    sid = 1
    for _ in range(MAX_EARLY_RESETS + 1):
        try:
            pair.peer.send_headers(sid, [(":method", "GET"), (":path", "/")], end_stream=True)  # no :scheme
        except h2.exceptions.ProtocolError:
            break
        pair.pump()
        sid += 2
    assert pair.our(RequestRejected)
    assert pair.our(ConnectionTerminated)
    assert pair.ours.closed


def test_streams_beyond_the_concurrency_limit_are_refused_and_hold_nothing() -> None:
    pair = Pair(Http2ServerConnection(HboneSettings(max_concurrent_streams=4)), client_peer=True)
    pair.peer.remote_settings.max_concurrent_streams = 1000  # h2 honours our limit; ignore it as an attacker would
    pair.peer.remote_settings.acknowledge()
    for sid in range(1, 20, 2):
        pair.peer.send_headers(sid, GRPC_REQUEST)
        pair.pump()
    assert len(pair.our(RequestReceived)) == 4
    assert pair.ours.active_streams == 4
    refused = [e for e in pair.peers(h2.events.StreamReset) if e.error_code == wire.REFUSED_STREAM]
    assert len(refused) == 6


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=12), st.binary(max_size=12)), max_size=8))
def test_any_decoded_header_list_is_a_request_or_a_clean_rejection(fields: list[tuple[bytes, bytes]]) -> None:
    server = Http2ServerConnection()
    events: list[Event] = []
    server._on_headers(1, fields, True, events)  # the reading of a decoded block, as HPACK hands it over
    assert len(events) >= 1
    assert isinstance(events[0], RequestReceived | RequestRejected)


def test_a_trailers_only_answer_is_one_header_block_both_ways() -> None:
    server = Pair(Http2ServerConnection(), client_peer=True)
    server.peer.send_headers(1, GRPC_REQUEST, end_stream=True)
    server.pump()
    server.ours.respond(1, 200, [("content-type", "application/grpc"), ("grpc-status", "14")], end_stream=True)
    server.pump()
    assert not server.peers(h2.events.DataReceived) and server.peers(h2.events.StreamEnded)
    assert ("grpc-status", "14") in server.peers(h2.events.ResponseReceived)[0].headers
    assert server.ours.active_streams == 0

    client = Pair(Http2ClientConnection(), client_peer=False)
    sid = client.ours.send_request("POST", "http", "a", "/echo.Echo/Say", end_stream=True)
    client.pump()
    assert client.ours.is_open(sid)
    client.peer.send_headers(sid, [(":status", "200"), ("grpc-status", "5")], end_stream=True)
    client.pump()
    assert [type(e) for e in client.our_events if not isinstance(e, DataReceived)][-2:] == [
        ResponseReceived,
        StreamEnded,
    ]
    assert not client.our(TrailersReceived)
    assert not client.ours.is_open(sid)


def test_trailers_with_a_pseudo_header_or_without_end_stream_reset_the_stream() -> None:
    pair = Pair(Http2ServerConnection(), client_peer=True)
    pair.peer.send_headers(1, GRPC_REQUEST)
    pair.pump()
    events: list[Event] = []
    pair.ours._on_headers(1, [(b":path", b"/x")], True, events)
    assert [type(e) for e in events] == [StreamReset]
    assert not pair.ours.is_open(1)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_after_the_preface_never_raise_out_of_the_request_server(junk: bytes) -> None:
    client = Http2ClientConnection()
    server = Http2ServerConnection()
    start = client.data_to_send()  # preface and SETTINGS
    events = server.receive_data(start + junk)
    assert all(not isinstance(e, DataReceived) or e.stream_id % 2 == 1 for e in events)
    server.data_to_send()
