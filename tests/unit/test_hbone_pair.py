"""Pair tests: an HBONE client and server joined in memory by a pump (h11's ConnectionPair style)."""

from __future__ import annotations

import pytest

from ambit.hbone import (
    ConnectionDraining,
    ConnectionTerminated,
    DataReceived,
    Event,
    HboneClientConnection,
    HboneError,
    HboneServerConnection,
    HboneSettings,
    StreamEnded,
    StreamReset,
    StreamWritable,
    TunnelEstablished,
    TunnelRefused,
    TunnelRejected,
    TunnelRequested,
    connect_headers,
    wire,
)
from ambit.hbone.budgets import MAX_EARLY_RESETS

MiB = 1024 * 1024


class Pair:
    """Moves bytes between the two ends until both are quiet; collects each side's events."""

    def __init__(self, settings: HboneSettings | None = None) -> None:
        self.client = HboneClientConnection(settings or HboneSettings())
        self.server = HboneServerConnection(settings or HboneSettings())
        self.client_events: list[Event] = []
        self.server_events: list[Event] = []
        self.pump()

    def pump(self, *, auto_consume: bool = False) -> None:
        while True:
            to_server = self.client.data_to_send()
            to_client = self.server.data_to_send()
            if not to_server and not to_client:
                return
            if to_server:
                new = self.server.receive_data(to_server)
                self.server_events += new
                if auto_consume:
                    _consume(self.server, new)
            if to_client:
                new = self.client.receive_data(to_client)
                self.client_events += new
                if auto_consume:
                    _consume(self.client, new)

    def take(self) -> tuple[list[Event], list[Event]]:
        client, server = self.client_events, self.server_events
        self.client_events, self.server_events = [], []
        return client, server

    def tunnel(self, authority: str = "198.18.200.7:8080") -> int:
        stream_id = self.client.open_tunnel(authority)
        self.pump()
        self.server.respond(stream_id, 200)
        self.pump()
        self.take()
        return stream_id


def _consume(conn: HboneClientConnection | HboneServerConnection, events: list[Event]) -> None:
    for event in events:
        if isinstance(event, DataReceived):
            conn.consumed(event.stream_id, event.flow_length)


def _raw_request(client: HboneClientConnection, fields: list[tuple[str, str]], *, end_stream: bool = False) -> int:
    """Send any header block on the client's next stream, bypassing ``open_tunnel``'s checks."""
    stream_id = client._next_id
    client._next_id += 2
    client._send_headers(stream_id, fields, end_stream=end_stream)
    return stream_id


def _data(events: list[Event], stream_id: int) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, DataReceived) and e.stream_id == stream_id)


def test_connect_is_requested_with_authority_and_headers_then_established_by_200() -> None:
    pair = Pair()
    headers = connect_headers(
        forwarded_for="198.18.200.5:43122",
        host="echo.default.svc.cluster.local",
        baggage={"k8s.namespace.name": "default"},
        traceparent="00-" + "ab" * 16 + "-" + "cd" * 8 + "-00",
    )
    stream_id = pair.client.open_tunnel("198.18.200.7:8080", headers)
    assert stream_id % 2 == 1
    pair.pump()
    _, server_events = pair.take()
    assert server_events == [TunnelRequested(stream_id, "198.18.200.7:8080", tuple(headers))]
    pair.server.respond(stream_id, 200, [("baggage", "service.name=echo")])
    pair.pump()
    client_events, _ = pair.take()
    assert client_events == [TunnelEstablished(stream_id, (("baggage", "service.name=echo"),))]
    assert pair.client.active_streams == 1
    assert pair.server.active_streams == 1


def test_data_flows_both_ways() -> None:
    pair = Pair()
    stream_id = pair.tunnel()
    pair.client.send_data(stream_id, b"ping")
    pair.server.send_data(stream_id, memoryview(b"pong"))
    pair.pump(auto_consume=True)
    client_events, server_events = pair.take()
    assert _data(server_events, stream_id) == b"ping"
    assert _data(client_events, stream_id) == b"pong"


def test_data_sent_before_the_200_waits_for_it() -> None:
    pair = Pair()
    stream_id = pair.client.open_tunnel("198.18.200.7:8080")
    pair.client.send_data(stream_id, b"early")
    pair.pump()
    _, server_events = pair.take()
    assert not _data(server_events, stream_id)
    pair.server.respond(stream_id, 200)
    pair.pump(auto_consume=True)
    _, server_events = pair.take()
    assert _data(server_events, stream_id) == b"early"


def test_send_data_returns_what_the_stream_still_holds_unframed() -> None:
    pair = Pair()
    early = pair.client.open_tunnel("198.18.200.7:8080")
    assert pair.client.send_data(early, b"early") == 5  # before the 200 nothing is framed
    assert pair.client.send_data(early, b"") == 5
    stream_id = pair.tunnel()
    assert pair.client.send_data(stream_id, b"x" * 1024) == 0  # within the windows: framed at once
    pair.client.send_data(stream_id, b"y" * (4 * MiB - 1024))  # exactly the stream window
    assert pair.client.send_data(stream_id, b"z" * 10) == 10 == pair.client.pending_bytes(stream_id)
    assert pair.client.send_data(99, b"unknown stream") == 0


@pytest.mark.parametrize("direction", ["client_to_server", "server_to_client"])
def test_ten_mebibytes_flow_only_as_fast_as_the_receiver_consumes(direction: str) -> None:
    pair = Pair()
    stream_id = pair.tunnel()
    sender, receiver = (pair.client, pair.server) if direction == "client_to_server" else (pair.server, pair.client)
    payload = bytes(range(256)) * (10 * MiB // 256)
    for offset in range(0, len(payload), 64 * 1024):
        sender.send_data(stream_id, payload[offset : offset + 64 * 1024])
    pair.pump()  # nobody consumes: the stream window (4 MiB) must stop the sender
    client_events, server_events = pair.take()
    received = client_events if receiver is pair.client else server_events
    got = _data(received, stream_id)
    assert len(got) == 4 * MiB
    assert sender.pending_bytes(stream_id) == len(payload) - 4 * MiB
    pair.pump()  # still nothing consumed: still blocked
    client_events, server_events = pair.take()
    assert not _data(client_events + server_events, stream_id)
    parts = [got]
    writable: list[Event] = []
    while sender.pending_bytes(stream_id) or len(b"".join(parts)) < len(payload):
        _consume(receiver, received)
        pair.pump()
        client_events, server_events = pair.take()
        received = client_events if receiver is pair.client else server_events
        sent_side = server_events if receiver is pair.client else client_events
        writable += [e for e in sent_side if isinstance(e, StreamWritable)]
        chunk = _data(received, stream_id)
        assert chunk, "consuming must reopen the window"
        parts.append(chunk)
    assert b"".join(parts) == payload
    assert writable == [StreamWritable(stream_id)]


def test_connection_window_blocks_many_streams_until_consumed() -> None:
    pair = Pair()
    streams = [pair.tunnel() for _ in range(5)]
    for stream_id in streams:
        pair.client.send_data(stream_id, b"x" * (4 * MiB))
    pair.pump()
    _, server_events = pair.take()
    assert sum(len(e.data) for e in server_events if isinstance(e, DataReceived)) == 16 * MiB
    assert sum(pair.client.pending_bytes(s) for s in streams) == 4 * MiB
    _consume(pair.server, server_events)
    pair.pump(auto_consume=True)
    assert sum(pair.client.pending_bytes(s) for s in streams) == 0


def test_client_half_close_reaches_the_server_and_the_server_can_still_send() -> None:
    pair = Pair()
    stream_id = pair.tunnel()
    pair.client.send_data(stream_id, b"request")
    pair.client.end_stream(stream_id)
    pair.pump(auto_consume=True)
    _, server_events = pair.take()
    assert server_events[-1] == StreamEnded(stream_id)
    assert _data(server_events, stream_id) == b"request"
    pair.server.send_data(stream_id, b"response")
    pair.server.end_stream(stream_id)
    pair.pump(auto_consume=True)
    client_events, _ = pair.take()
    assert _data(client_events, stream_id) == b"response"
    assert client_events[-1] == StreamEnded(stream_id)
    assert pair.client.active_streams == 0
    assert pair.server.active_streams == 0


def test_server_half_close_reaches_the_client() -> None:
    pair = Pair()
    stream_id = pair.tunnel()
    pair.server.end_stream(stream_id)
    pair.pump()
    client_events, _ = pair.take()
    assert client_events == [StreamEnded(stream_id)]
    pair.client.send_data(stream_id, b"still writable")
    pair.pump(auto_consume=True)
    _, server_events = pair.take()
    assert _data(server_events, stream_id) == b"still writable"


def test_end_stream_waits_for_queued_data() -> None:
    pair = Pair()
    stream_id = pair.tunnel()
    pair.client.send_data(stream_id, b"y" * (5 * MiB))
    pair.client.end_stream(stream_id)
    pair.pump()
    _, server_events = pair.take()
    assert StreamEnded(stream_id) not in server_events
    _consume(pair.server, server_events)
    pair.pump(auto_consume=True)
    _, server_events = pair.take()
    assert server_events[-1] == StreamEnded(stream_id)
    with pytest.raises(HboneError):
        pair.client.send_data(stream_id, b"too late")


@pytest.mark.parametrize("resetter", ["client", "server"])
def test_reset_reaches_the_other_side_and_later_data_is_ignored(resetter: str) -> None:
    pair = Pair()
    stream_id = pair.tunnel()
    local, remote = (pair.client, pair.server) if resetter == "client" else (pair.server, pair.client)
    remote.send_data(stream_id, b"in flight")
    local.reset_stream(stream_id)
    pair.pump(auto_consume=True)
    client_events, server_events = pair.take()
    remote_events = server_events if resetter == "client" else client_events
    assert StreamReset(stream_id, 0x8, remote=True) in remote_events
    assert local.active_streams == 0
    assert remote.active_streams == 0
    remote.send_data(stream_id, b"after reset")  # a no-op, not an error
    local.send_data(stream_id, b"after reset")
    pair.pump()
    assert pair.take() == ([], [])
    assert not pair.client.closed and not pair.server.closed


@pytest.mark.parametrize("status", [401, 503])
def test_non_200_response_refuses_the_tunnel(status: int) -> None:
    pair = Pair()
    stream_id = pair.client.open_tunnel("198.18.200.7:8080")
    pair.pump()
    pair.server.respond(stream_id, status)
    pair.pump()
    client_events, _server_events = pair.take()
    assert client_events == [TunnelRefused(stream_id, status, ())]
    assert pair.client.active_streams == 0
    assert pair.server.active_streams == 0
    assert pair.client.can_open_tunnel


def test_get_with_a_path_is_rejected_with_400() -> None:
    pair = Pair()
    request = [(":method", "GET"), (":scheme", "https"), (":path", "/"), (":authority", "198.18.200.7:80")]
    stream_id = _raw_request(pair.client, request, end_stream=True)
    pair.pump()
    _client_events, server_events = pair.take()
    assert len(server_events) == 1
    rejected = server_events[0]
    assert isinstance(rejected, TunnelRejected)
    assert (rejected.stream_id, rejected.status) == (stream_id, 400)
    assert ":scheme" in rejected.reason
    assert pair.server.active_streams == 0
    assert not pair.server.closed


@pytest.mark.parametrize(
    ("request_headers", "reason"),
    [
        ([(":method", "CONNECT")], "missing :authority"),
        ([(":method", "CONNECT"), (":authority", "no-port")], "bad :authority"),
        ([(":method", "CONNECT"), (":authority", "198.18.200.7:80"), (":protocol", "websocket")], ":protocol"),
        ([(":method", "CONNECT"), (":authority", "198.18.200.7:80"), ("connection", "close")], "connection"),
    ],
)
def test_bad_connect_requests_are_rejected_without_killing_the_connection(
    request_headers: list[tuple[str, str]], reason: str
) -> None:
    pair = Pair()
    stream_id = _raw_request(pair.client, request_headers)
    pair.pump()
    _, server_events = pair.take()
    assert len(server_events) == 1
    assert isinstance(server_events[0], TunnelRejected)
    assert reason in server_events[0].reason
    assert pair.tunnel() > stream_id  # the connection still works


def test_hundred_streams_then_no_more_until_one_ends() -> None:
    pair = Pair()
    streams = [pair.tunnel() for _ in range(100)]
    assert pair.client.active_streams == 100
    assert not pair.client.can_open_tunnel
    with pytest.raises(HboneError):
        pair.client.open_tunnel("198.18.200.7:8080")
    pair.client.end_stream(streams[0])
    pair.server.end_stream(streams[0])
    pair.pump()
    assert pair.client.can_open_tunnel
    pair.tunnel()
    assert not pair.client.can_open_tunnel


def test_peer_limit_on_concurrent_streams_is_respected() -> None:
    pair = Pair()
    pair.server = HboneServerConnection(HboneSettings(max_concurrent_streams=2))
    pair.client = HboneClientConnection()
    pair.pump()
    pair.tunnel()
    pair.tunnel()
    assert not pair.client.can_open_tunnel


@pytest.mark.parametrize("closer", ["client", "server"])
def test_close_says_goaway_and_no_new_tunnels(closer: str) -> None:
    """``close`` drops our streams and says GOAWAY(NO_ERROR); the peer hears a graceful GOAWAY (its streams end
    when the transport closes, the shell's business) and opens nothing more."""
    pair = Pair()
    pair.tunnel()
    local, remote = (pair.client, pair.server) if closer == "client" else (pair.server, pair.client)
    local.close()
    assert local.closed and local.active_streams == 0
    pair.pump()
    client_events, server_events = pair.take()
    remote_events = server_events if closer == "client" else client_events
    assert remote_events == [ConnectionDraining(1 if closer == "server" else 0, "GOAWAY received")]
    assert remote.draining
    assert not pair.client.can_open_tunnel
    with pytest.raises(HboneError):
        pair.client.open_tunnel("198.18.200.7:8080")


def test_goaway_with_an_error_terminates_every_stream() -> None:
    pair = Pair()
    pair.tunnel()
    pair.server.close(error_code=0x2)  # INTERNAL_ERROR
    pair.pump()
    client_events, _ = pair.take()
    assert len(client_events) == 1 and isinstance(client_events[0], ConnectionTerminated)
    assert client_events[0].error_code == 0x2
    assert pair.client.closed and pair.client.active_streams == 0


def test_server_go_away_lets_tunnels_in_flight_finish_and_the_client_opens_no_more() -> None:
    pair = Pair()
    stream_id = pair.tunnel()
    pair.server.go_away("draining")
    pair.pump()
    client_events, _ = pair.take()
    assert client_events == [ConnectionDraining(wire.STREAM_ID_MASK, "draining")]  # step 1: open nothing more
    pair.server.finish_going_away()
    pair.pump()
    client_events, _ = pair.take()
    assert client_events == [ConnectionDraining(stream_id, "GOAWAY received")]  # step 2: the last one served
    assert pair.client.draining and pair.server.draining
    assert pair.client.drained_when_idle and pair.server.drained_when_idle
    assert not pair.client.can_open_tunnel
    with pytest.raises(HboneError):
        pair.client.open_tunnel("198.18.200.7:8080")
    # The tunnel in flight carries data both ways and ends normally.
    pair.client.send_data(stream_id, b"ping")
    pair.server.send_data(stream_id, b"pong")
    pair.pump(auto_consume=True)
    client_events, server_events = pair.take()
    assert [e.data for e in server_events if isinstance(e, DataReceived)] == [b"ping"]
    assert [e.data for e in client_events if isinstance(e, DataReceived)] == [b"pong"]
    pair.client.end_stream(stream_id)
    pair.server.end_stream(stream_id)
    pair.pump()
    client_events, server_events = pair.take()
    assert StreamEnded(stream_id) in client_events and StreamEnded(stream_id) in server_events
    assert pair.client.active_streams == 0 and pair.server.active_streams == 0
    assert not pair.client.closed and not pair.server.closed  # closing it now is the shells' business


def test_a_tunnel_crossing_the_first_goaway_is_still_served() -> None:
    """The client sent CONNECT before it heard GOAWAY: the first step names no last stream, so it is served."""
    pair = Pair()
    pair.tunnel()
    crossing = pair.client.open_tunnel("198.18.200.7:8080")
    pair.server.go_away()
    assert not pair.server.drained_when_idle
    pair.pump()
    client_events, server_events = pair.take()
    assert TunnelRequested(crossing, "198.18.200.7:8080", ()) in server_events
    assert not [e for e in client_events if isinstance(e, StreamReset)]
    pair.server.respond(crossing, 200)
    pair.server.finish_going_away()
    pair.pump()
    client_events, _ = pair.take()
    assert TunnelEstablished(crossing, ()) in client_events
    assert ConnectionDraining(crossing, "GOAWAY received") in client_events
    assert pair.client.active_streams == 2 and pair.server.active_streams == 2


def test_a_tunnel_crossing_the_last_goaway_is_refused_on_both_ends_and_safe_to_retry() -> None:
    pair = Pair()
    first = pair.tunnel()
    pair.server.go_away()
    crossing = _raw_request(pair.client, [(":method", "CONNECT"), (":authority", "198.18.200.7:8080")])
    pair.client._new_stream(crossing)  # a client that had not heard the first GOAWAY yet
    pair.server.finish_going_away()
    pair.server.receive_data(pair.client.data_to_send())
    client_events = pair.client.receive_data(pair.server.data_to_send())
    assert StreamReset(crossing, 0x7, remote=True) in client_events  # REFUSED_STREAM: never processed
    assert ConnectionDraining(first, "GOAWAY received") in client_events
    assert pair.client.active_streams == 1 and pair.server.active_streams == 1


def test_a_client_ignoring_goaway_gets_every_new_stream_refused() -> None:
    """A hostile client that keeps opening streams after our GOAWAY gets nothing processed: each is refused."""
    pair = Pair()
    pair.server.go_away()
    pair.server.finish_going_away()
    pair.pump()
    pair.take()
    ids = [_raw_request(pair.client, [(":method", "CONNECT"), (":authority", "198.18.200.7:8080")]) for _ in range(5)]
    server_events = pair.server.receive_data(pair.client.data_to_send())
    assert server_events == []
    assert pair.server.active_streams == 0 and not pair.server.closed
    answer = pair.server.data_to_send()
    assert answer == b"".join(wire.rst_stream(sid, wire.REFUSED_STREAM) for sid in ids)


def test_stream_writable_after_the_window_reopens() -> None:
    pair = Pair(HboneSettings(stream_window=65535, connection_window=65535))
    stream_id = pair.tunnel()
    pair.server.send_data(stream_id, b"z" * 100_000)
    pair.pump()
    client_events, server_events = pair.take()
    assert pair.server.pending_bytes(stream_id) == 100_000 - 65535
    assert not [e for e in server_events if isinstance(e, StreamWritable)]
    _consume(pair.client, client_events)
    pair.pump(auto_consume=True)
    client_events, server_events = pair.take()
    assert StreamWritable(stream_id) in server_events
    assert pair.server.pending_bytes(stream_id) == 0


def test_server_never_opens_streams_and_a_pushed_stream_kills_the_connection() -> None:
    pair = Pair()
    assert not hasattr(pair.server, "open_tunnel")
    frame = bytes.fromhex("000005010400000002") + b"\x82\x84\x86\x41\x00"  # HEADERS on stream 2
    events = pair.client.receive_data(frame)
    assert len(events) == 1 and isinstance(events[0], ConnectionTerminated)
    assert pair.client.closed


def test_data_split_anywhere_arrives_intact_even_when_pieces_are_kept_across_calls() -> None:
    payload = bytes(range(256)) * 40
    for cut in (1, 5, 9, 10, 100, 5000, 20_000):
        client = HboneClientConnection()
        client_wire = client.data_to_send()
        server = HboneServerConnection()
        server.receive_data(client_wire)
        client.receive_data(server.data_to_send())
        sid = client.open_tunnel("198.18.200.7:8080")
        server.receive_data(client.data_to_send())
        server.respond(sid, 200)
        client.receive_data(server.data_to_send())
        client.send_data(sid, payload)
        client.send_data(sid, payload[::-1])
        data = client.data_to_send()
        kept: list[Event] = []
        for start in range(0, len(data), cut):
            kept += server.receive_data(data[start : start + cut])  # pieces are held while more input arrives
        assert _data(kept, sid) == payload + payload[::-1], cut


def test_rapid_reset_of_unanswered_streams_ends_the_connection_with_enhance_your_calm() -> None:
    pair = Pair()
    for _ in range(MAX_EARLY_RESETS):
        stream_id = pair.client.open_tunnel("198.18.200.7:8080")
        pair.client.reset_stream(stream_id)
        pair.pump()
    assert not pair.server.closed
    stream_id = pair.client.open_tunnel("198.18.200.7:8080")
    pair.client.reset_stream(stream_id)
    pair.pump()
    assert pair.server.closed
    terminated = [e for e in pair.client_events if isinstance(e, ConnectionTerminated)]
    assert terminated and terminated[0].error_code == 0xB  # ENHANCE_YOUR_CALM


def test_resets_after_answers_never_count_as_rapid_reset() -> None:
    pair = Pair()
    for _ in range(3 * MAX_EARLY_RESETS):
        stream_id = pair.client.open_tunnel("198.18.200.7:8080")
        pair.pump()
        if stream_id % 4 == 1:  # every other stream is given up before its answer, the others after it
            pair.client.reset_stream(stream_id)
            pair.pump()
            pair.server.respond(stream_id, 200)
        else:
            pair.server.respond(stream_id, 200)
            pair.pump()
            pair.client.reset_stream(stream_id)
        pair.pump()
    assert not pair.server.closed and not pair.client.closed
