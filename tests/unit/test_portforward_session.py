"""The kubelet's port-forward session (:mod:`ambit.k8s.portforward`): a client made of the SPDY codec, in memory."""

from __future__ import annotations

import contextlib

from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.k8s import portforward as pf
from ambit.k8s import spdy


class Client:
    """kubectl's half: opens stream pairs, reads what the session sends back."""

    def __init__(self, session: pf.PortForwardSession) -> None:
        self.session = session
        self.out = spdy.SpdySerializer()
        self.parser = spdy.SpdyParser()
        self.next_id = 1

    def send(self, raw: bytes) -> tuple[list[pf.Command], list[spdy.Event]]:
        commands = self.session.receive(raw)
        return commands, self.parser.feed(self.session.data_to_send())

    def stream(self, kind: str, port: str = "80", request_id: str | None = "0") -> bytes:
        headers = [("streamtype", kind), ("port", port)] + ([("requestid", request_id)] if request_id else [])
        raw = self.out.syn_stream(self.next_id, tuple(headers))
        self.next_id += 2
        return raw

    def pair(self, request_id: str = "0", port: str = "80") -> tuple[list[pf.Command], list[spdy.Event]]:
        return self.send(self.stream("error", port, request_id) + self.stream("data", port, request_id))


def test_a_pair_of_streams_is_replied_to_and_opens_one_connection() -> None:
    client = Client(pf.PortForwardSession())
    commands, events = client.pair()
    assert commands == [pf.OpenConnection("0", 80)]
    assert events == [spdy.ReplyReceived(1, (), False), spdy.ReplyReceived(3, (), False)]


def test_bytes_flow_both_ways_and_the_pods_end_of_output_ends_the_forward() -> None:
    session = pf.PortForwardSession()
    client = Client(session)
    client.pair()
    commands, _ = client.send(client.out.data(3, b"GET / HTTP/1.0\r\n\r\n"))
    assert commands == [pf.SendToPod("0", b"GET / HTTP/1.0\r\n\r\n")]
    session.pod_data("0", b"HTTP/1.0 200 OK\r\n")
    assert client.parser.feed(session.data_to_send()) == [spdy.DataReceived(3, b"HTTP/1.0 200 OK\r\n", False)]
    assert session.pod_closed("0") == [pf.CloseConnection("0")]
    assert client.parser.feed(session.data_to_send()) == [
        spdy.DataReceived(3, b"", True),
        spdy.DataReceived(1, b"", True),  # the error stream ends empty: no error
    ]
    assert session.open_forwards() == 0


def test_the_clients_fin_half_closes_the_pods_connection_only() -> None:
    session = pf.PortForwardSession()
    client = Client(session)
    client.pair()
    commands, events = client.send(client.out.data(3, b"last words", fin=True))
    assert (commands, events) == ([pf.SendToPod("0", b"last words"), pf.ShutdownPodWrite("0")], [])
    session.pod_data("0", b"reply")
    assert session.pod_closed("0") == [pf.CloseConnection("0")]
    assert client.parser.feed(session.data_to_send()) == [
        spdy.DataReceived(3, b"reply", False),
        spdy.DataReceived(3, b"", True),
        spdy.DataReceived(1, b"", True),
    ]


def test_a_refused_connect_is_reported_on_the_error_stream_in_kubes_words() -> None:
    session = pf.PortForwardSession()
    client = Client(session)
    client.pair(port="81")
    message = pf.forward_error(81, "web-1", "/run/netns/p", "connection refused", "connection refused")
    assert message.startswith("error forwarding port 81 to pod web-1, uid : failed to connect to localhost:81")
    assert session.connect_failed("0", message) == [pf.CloseConnection("0")]
    assert client.parser.feed(session.data_to_send()) == [
        spdy.DataReceived(1, message.encode(), True),
        spdy.DataReceived(3, b"", True),
    ]


def test_a_reset_from_the_client_closes_the_connection_and_sends_nothing() -> None:
    client = Client(pf.PortForwardSession())
    client.pair()
    commands, events = client.send(client.out.rst_stream(3, spdy.RstStatus.CANCEL))
    assert (commands, events) == ([pf.CloseConnection("0")], [])
    assert client.send(client.out.data(3, b"late"))[0] == []


def test_streams_with_bad_headers_are_refused() -> None:
    client = Client(pf.PortForwardSession())
    for kind, port in (("bogus", "80"), ("data", "0"), ("data", "65536"), ("data", "eighty"), ("data", "")):
        _, events = client.send(client.stream(kind, port))
        assert events == [spdy.StreamReset(client.next_id - 2, spdy.RstStatus.PROTOCOL_ERROR)]
    _, events = client.send(client.out.syn_stream(1, (("streamtype", "data"), ("port", "80"))))  # id reused
    assert events == [spdy.StreamReset(1, spdy.RstStatus.PROTOCOL_ERROR)]


def test_old_clients_without_request_ids_are_paired_by_stream_id() -> None:
    client = Client(pf.PortForwardSession())
    commands, _ = client.send(client.stream("error", request_id=None) + client.stream("data", request_id=None))
    assert commands == [pf.OpenConnection("1", 80)]


def test_streams_beyond_the_bound_are_refused() -> None:
    client = Client(pf.PortForwardSession(max_streams=4))
    for i in range(2):
        client.pair(str(i))
    _, events = client.send(client.stream("error", request_id="9"))
    assert events == [spdy.StreamReset(9, spdy.RstStatus.REFUSED_STREAM)]


def test_client_pings_are_echoed_and_window_updates_ignored() -> None:
    client = Client(pf.PortForwardSession())
    assert client.send(client.out.ping(1) + client.out.window_update(0, 1000))[1] == [spdy.PingReceived(1)]


def test_a_protocol_error_ends_the_session_with_goaway_and_closes_every_connection() -> None:
    session = pf.PortForwardSession()
    client = Client(session)
    client.pair("a")
    commands, events = client.send(b"\x80\x02\x00\x06\x00\x00\x00\x04\x00\x00\x00\x01")  # a SPDY/2 PING
    assert commands[0] == pf.CloseConnection("a")
    assert isinstance(commands[1], pf.SessionEnded)
    assert events == [spdy.GoAwayReceived(3, spdy.GoAwayStatus.PROTOCOL_ERROR)]
    assert session.receive(client.out.ping(3)) == []


@settings(max_examples=200)
@given(st.lists(st.binary(max_size=120), max_size=6))
def test_arbitrary_input_yields_commands_or_an_ended_session_never_an_exception(chunks: list[bytes]) -> None:
    session = pf.PortForwardSession(max_streams=8)
    client = Client(session)
    prefix = client.stream("error") + client.stream("data")
    for chunk in [prefix, *chunks]:
        session.receive(chunk)
        with contextlib.suppress(spdy.SpdyProtocolError):
            client.parser.feed(session.data_to_send())
    assert session.open_forwards() <= 4
