"""The waypoint's HTTP/1.1 adapter as a pair: its client side talking to its server side in memory."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.errors import HttpProtocolError
from ambit.waypoint.http1 import (
    BodyData,
    ClientSide,
    Event,
    InterimResponse,
    MessageEnded,
    RequestStarted,
    ResponseStarted,
    ServerSide,
    Signal,
    forwardable,
    simple_response,
)


def drain(side: ServerSide | ClientSide) -> list[Event]:
    events: list[Event] = []
    while (event := side.next_event()) not in (Signal.NEED_DATA, Signal.PAUSED):
        events.append(event)
        if event is Signal.CLOSED:
            break
    return events


def test_a_chunked_request_and_its_response_cross_the_pair() -> None:
    client, server = ClientSide(), ServerSide()
    head = RequestHead("POST", "/upload?x=1", "svc:80", (("transfer-encoding", "chunked"), ("x-a", "1")))
    sent = client.send_request(head) + client.send_body(b"hello ") + client.send_body(b"world")
    server.receive_data(sent + client.end_request())
    events = drain(server)
    started = events[0]
    assert isinstance(started, RequestStarted)
    assert started.head.method == "POST"
    assert started.head.path == "/upload?x=1"
    assert started.head.authority == "svc:80"
    assert started.head.header("x-a") == "1"
    assert started.has_body
    assert b"".join(e.data for e in events if isinstance(e, BodyData)) == b"hello world"
    assert isinstance(events[-1], MessageEnded)
    answered = server.send_response(201, [("content-length", "2")]) + server.send_body(b"ok")
    client.receive_data(answered + server.end_response())  # (an empty receive_data would be EOF)
    answer = drain(client)
    assert isinstance(answer[0], ResponseStarted) and answer[0].status == 201
    assert answer[1] == BodyData(b"ok")
    assert server.next_cycle() and client.next_cycle()


def test_two_requests_share_one_keep_alive_connection() -> None:
    client, server = ClientSide(), ServerSide()
    for path in ("/one", "/two"):
        server.receive_data(client.send_request(RequestHead("GET", path, "svc")) + client.end_request())
        events = drain(server)
        assert isinstance(events[0], RequestStarted) and events[0].head.path == path
        assert not events[0].has_body
        client.receive_data(server.send_response(200, [("content-length", "0")]) + server.end_response())
        assert isinstance(drain(client)[0], ResponseStarted)
        assert server.next_cycle() and client.next_cycle()


@pytest.mark.parametrize(
    ("status", "given", "line"),
    [
        (200, "", b"HTTP/1.1 200 OK\r\n"),  # a local answer
        (404, "", b"HTTP/1.1 404 Not Found\r\n"),
        (503, "", b"HTTP/1.1 503 Service Unavailable\r\n"),
        (200, "Everything Fine", b"HTTP/1.1 200 OK\r\n"),  # an upstream's own phrase gives way, as in Envoy
        (299, "Custom", b"HTTP/1.1 299 Custom\r\n"),  # a code without a standard phrase keeps the one given
        (299, "", b"HTTP/1.1 299 \r\n"),
    ],
)
def test_the_status_line_carries_the_standard_reason_phrase(status: int, given: str, line: bytes) -> None:
    server = ServerSide()
    server.receive_data(b"GET / HTTP/1.1\r\nhost: svc\r\n\r\n")
    drain(server)
    assert server.send_response(status, [("content-length", "0")], given).startswith(line)


def test_connection_close_ends_keep_alive() -> None:
    server = ServerSide()
    head = RequestHead("GET", "/", "svc", (("connection", "close"),))
    server.receive_data(b"GET / HTTP/1.1\r\nhost: svc\r\nconnection: close\r\n\r\n")
    drain(server)
    server.send_response(200, [("content-length", "0")])
    server.end_response()
    assert not server.next_cycle()
    assert "connection" not in dict(forwardable(head.headers))


def test_hop_by_hop_headers_and_those_connection_names_are_not_forwarded() -> None:
    headers = (("connection", "keep-alive, x-secret"), ("x-secret", "1"), ("keep-alive", "5"), ("te", "x"), ("a", "b"))
    assert forwardable(headers) == [("a", "b")]
    upgrade = (("connection", "upgrade"), ("upgrade", "websocket"), ("a", "b"))
    assert forwardable(upgrade, upgrade=True) == [("a", "b"), ("connection", "upgrade"), ("upgrade", "websocket")]


def test_a_head_over_the_bound_is_431() -> None:
    server = ServerSide(max_head_bytes=1024)
    server.receive_data(b"GET / HTTP/1.1\r\nhost: a\r\nx-big: " + b"a" * 4096)
    with pytest.raises(HttpProtocolError) as caught:
        server.next_event()
    assert caught.value.status == 431


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",  # no Host
        b"GET / HTTP/1.1\r\nhost: a\r\ncontent-length: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: a\r\nbad header\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # a TLS ClientHello
    ],
)
def test_malformed_requests_are_400(raw: bytes) -> None:
    server = ServerSide()
    server.receive_data(raw)
    with pytest.raises(HttpProtocolError) as caught:
        drain(server)
    assert caught.value.status == 400


def test_connect_inside_a_tunnel_is_refused() -> None:
    server = ServerSide()
    server.receive_data(b"CONNECT 10.0.0.1:443 HTTP/1.1\r\nhost: 10.0.0.1:443\r\n\r\n")
    with pytest.raises(HttpProtocolError):
        drain(server)


@pytest.mark.parametrize(
    "raw", [b"PRI * HTTP/2.0\r\n\r\nXX", b"GET / HTTP/2.0\r\nhost: a\r\n\r\n", b"GET / HTTP/0.9\r\n\r\n"]
)
def test_a_request_of_another_major_version_is_505(raw: bytes) -> None:
    server = ServerSide()
    server.receive_data(raw)
    with pytest.raises(HttpProtocolError) as caught:
        drain(server)
    assert caught.value.status == 505


def test_a_head_begun_before_it_is_parsed_is_seen() -> None:
    server = ServerSide()
    assert not server.head_begun
    server.receive_data(b"GET / HT")
    assert server.head_begun


def test_a_request_body_without_framing_goes_upstream_chunked_and_framed_ones_as_they_are() -> None:
    head = RequestHead("POST", "/x", "a:80")
    unframed = ClientSide()
    data = unframed.send_request(head, body=True) + unframed.send_body(b"abc") + unframed.end_request()
    assert b"\r\ntransfer-encoding: chunked\r\n" in data and data.endswith(b"\r\n3\r\nabc\r\n0\r\n\r\n")
    framed = ClientSide()
    sized = RequestHead("POST", "/x", "a:80", (("content-length", "3"),))
    data = framed.send_request(sized, body=True) + framed.send_body(b"abc") + framed.end_request()
    assert b"transfer-encoding" not in data and data.endswith(b"\r\n\r\nabc")
    bodiless = ClientSide().send_request(RequestHead("GET", "/", "a:80"))
    assert b"transfer-encoding" not in bodiless and b"content-length" not in bodiless


def test_http10_without_host_has_no_authority() -> None:
    """Envoy's codec hands it on; its connection manager answers it 400 (istiod sets no default host)."""
    server = ServerSide(accept_http10=True)
    server.receive_data(b"GET / HTTP/1.0\r\n\r\n")
    started = drain(server)[0]
    assert isinstance(started, RequestStarted)
    assert started.head.authority == "" and started.version == "1.0"


@pytest.mark.parametrize("accept", [False, True])
def test_an_http10_request_is_parsed_like_any_other_and_answered_in_http10_only_when_accepted(accept: bool) -> None:
    """The codec hands HTTP/1.0 on (refusing it is the connection manager's); its status line says HTTP/1.0 only
    with accept_http_10, as Envoy's codec writes it; without keep-alive the connection closes after it."""
    server = ServerSide(accept_http10=accept)
    server.receive_data(b"GET / HTTP/1.0\r\n\r\n")
    started = drain(server)[0]
    assert isinstance(started, RequestStarted) and started.version == "1.0"
    head = server.send_response(200, [("content-length", "2")])
    assert head.startswith(b"HTTP/1.0 200 OK\r\n" if accept else b"HTTP/1.1 200 OK\r\n")
    assert b"connection: close\r\n" in head
    server.send_body(b"ok")
    server.end_response()
    assert not server.next_cycle()


def test_an_http10_keep_alive_request_keeps_the_connection_when_its_answer_has_a_length() -> None:
    server = ServerSide(accept_http10=True)
    server.receive_data(b"GET /1 HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\nGET /2 HTTP/1.0\r\n\r\n")
    assert isinstance(drain(server)[0], RequestStarted)
    head = server.send_response(426, [("content-length", "0")])
    assert head.startswith(b"HTTP/1.0 426 Upgrade Required\r\n") and b"connection: keep-alive\r\n" in head
    server.end_response()
    assert server.next_cycle()
    second = drain(server)[0]
    assert isinstance(second, RequestStarted) and second.head.path == "/2"
    assert b"connection: close\r\n" in server.send_response(200, [("content-length", "0")])
    server.end_response()
    assert not server.next_cycle()


def test_an_http10_keep_alive_answer_without_a_length_closes_the_connection() -> None:
    server = ServerSide(accept_http10=True)
    server.receive_data(b"GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n")
    drain(server)
    head = server.send_response(200, [("x-a", "1")])  # framed by the close: HTTP/1.0 has no chunks
    assert b"connection: close\r\n" in head and b"keep-alive" not in head and b"transfer-encoding" not in head
    assert server.send_body(b"abc") == b"abc"
    server.end_response()
    assert not server.next_cycle()


def test_a_malformed_http10_head_is_the_codec_s_400() -> None:
    server = ServerSide()
    server.receive_data(b"GET / HTTP/1.0\r\nbad header line\r\n\r\n")
    with pytest.raises(HttpProtocolError) as caught:
        drain(server)
    assert caught.value.status == 400


def test_http11_is_answered_in_http11_either_way() -> None:
    for accept in (False, True):
        server = ServerSide(accept_http10=accept)
        server.receive_data(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        assert isinstance(drain(server)[0], RequestStarted)
        assert server.send_response(204, []).startswith(b"HTTP/1.1 204 No Content\r\n")


def test_a_local_answer_without_a_body_has_no_content_type() -> None:
    raw = simple_response(426, "Upgrade Required", "")
    assert raw.startswith(b"HTTP/1.1 426 Upgrade Required\r\n") and raw.endswith(b"\r\n\r\n")
    assert b"content-type" not in raw and b"content-length: 0\r\n" in raw and b"connection: close" in raw


def test_expect_100_continue_is_answered_by_the_waypoint() -> None:
    server = ServerSide()
    server.receive_data(b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\nexpect: 100-continue\r\n\r\n")
    started = drain(server)[0]
    assert isinstance(started, RequestStarted)
    assert server.continue_if_waited().startswith(b"HTTP/1.1 100 ")
    assert "expect" not in dict(forwardable(started.head.headers))


def test_an_upgrade_switches_both_sides_and_hands_over_the_bytes_behind_the_heads() -> None:
    client, server = ClientSide(), ServerSide()
    head = RequestHead("GET", "/ws", "svc", (("connection", "Upgrade"), ("upgrade", "websocket")))
    server.receive_data(client.send_request(head, upgrade=True) + client.end_request() + b"\x81\x01a")
    started = drain(server)[0]
    assert isinstance(started, RequestStarted) and started.upgrade
    answer = server.send_interim(101, [("connection", "upgrade"), ("upgrade", "websocket")])
    assert server.switched() == b"\x81\x01a"
    client.receive_data(answer + b"\x81\x01b")
    event = client.next_event()
    assert isinstance(event, InterimResponse) and event.status == 101
    assert client.switched() == b"\x81\x01b"


def test_a_broken_upstream_response_is_an_upstream_error() -> None:
    client = ClientSide()
    client.send_request(RequestHead("GET", "/", "svc"))
    client.end_request()
    client.receive_data(b"NOT HTTP\r\n\r\n")
    with pytest.raises(HttpProtocolError) as caught:
        drain(client)
    assert caught.value.upstream


def test_the_local_error_answer_is_complete_and_closes() -> None:
    raw = simple_response(400, "Bad Request", "bad\n")
    client = ClientSide()
    client.send_request(RequestHead("GET", "/", "svc"))
    client.end_request()
    client.receive_data(raw)
    events = drain(client)
    assert isinstance(events[0], ResponseStarted) and events[0].status == 400
    assert ("connection", "close") in events[0].headers
    assert ("server", "istio-envoy") in events[0].headers  # Envoy's connection manager writes its base headers
    assert any(name == "date" for name, _ in events[0].headers)
    assert BodyData(b"bad\n") in events


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048), st.integers(min_value=1, max_value=64))
def test_any_bytes_give_events_or_a_clean_protocol_error(data: bytes, cut: int) -> None:
    server = ServerSide(max_head_bytes=1024)
    try:
        for start in range(0, len(data), cut):
            server.receive_data(data[start : start + cut])
            drain(server)
        server.receive_data(b"")
        drain(server)
    except HttpProtocolError as exc:
        assert exc.status in (400, 431, 505)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
    st.text(alphabet="abcdefghij/-_.~", min_size=1, max_size=40).map(lambda p: "/" + p),
    st.lists(
        st.tuples(
            st.from_regex(r"x-[a-z]{1,8}", fullmatch=True),
            st.from_regex(r"[a-zA-Z0-9]([a-zA-Z0-9 ]{0,18}[a-zA-Z0-9])?", fullmatch=True),
        ),
        max_size=5,
    ),
    st.binary(max_size=300),
)
def test_requests_survive_the_pair_unchanged(
    method: str, path: str, headers: list[tuple[str, str]], body: bytes
) -> None:
    client, server = ClientSide(), ServerSide()
    framing = (("content-length", str(len(body))),)
    head = RequestHead(method, path, "svc", (*framing, *headers))
    server.receive_data(client.send_request(head) + client.send_body(body) + client.end_request())
    events = drain(server)
    started = events[0]
    assert isinstance(started, RequestStarted)
    assert (started.head.method, started.head.path) == (method, path)
    assert list(started.head.headers[1:]) == headers
    assert b"".join(e.data for e in events if isinstance(e, BodyData)) == body


# --- the llhttp reader: rules of http1_reader, and the writer's framing --------------------------------------------


def _events_of(side: ServerSide | ClientSide, pieces: list[bytes], *, eof: bool = False) -> list[object]:
    """Every event (and the error, if any) ``side`` gives for ``pieces`` fed one by one, cycling between messages."""
    out: list[object] = []
    try:
        for piece in [*pieces, *([b""] if eof else [])]:
            side.receive_data(piece)
            while True:
                event = side.next_event()
                if event is Signal.NEED_DATA or event is Signal.CLOSED:
                    break
                if event is Signal.PAUSED:  # a server answers and goes on; a client's caller sends the next request
                    if isinstance(side, ClientSide):
                        break
                    side.send_response(200, [("content-length", "0")])
                    side.end_response()
                    if not side.next_cycle():
                        break
                    continue
                out.append(event)
    except HttpProtocolError as exc:
        out.append(("error", exc.status))
    return _merged(out)


def _merged(events: list[object]) -> list[object]:
    """Adjacent body pieces joined: how a body is cut depends on how its bytes arrived."""
    out: list[object] = []
    for event in events:
        if isinstance(event, BodyData) and out and isinstance(out[-1], BodyData):
            out[-1] = BodyData(out[-1].data + event.data)
        else:
            out.append(event)
    return out


def _cuts(data: bytes, points: list[int]) -> list[bytes]:
    marks = sorted({p % (len(data) + 1) for p in points} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(marks) if b > a]


_REQUESTS = st.lists(
    st.one_of(
        st.builds(
            lambda path, body: (
                b"POST /%s HTTP/1.1\r\nhost: svc\r\ncontent-length: %d\r\nx-a: 1\r\n\r\n%s"
                % (path.encode(), len(body), body)
            ),
            st.text(alphabet="abcxyz/", max_size=12),
            st.binary(max_size=64),
        ),
        st.builds(
            lambda chunks: (
                b"PUT /c HTTP/1.1\r\nhost: svc\r\ntransfer-encoding: chunked\r\n\r\n"
                + b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks if c)
                + b"0\r\nx-trailer: t\r\n\r\n"
            ),
            st.lists(st.binary(min_size=1, max_size=20), max_size=4),
        ),
        st.just(b"GET /plain HTTP/1.1\r\nHost: svc\r\nAccept:  */*  \r\n\r\n"),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(_REQUESTS, st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_any_split_of_pipelined_requests_gives_the_events_of_one_chunk(
    requests: list[bytes], points: list[int]
) -> None:
    data = b"".join(requests)
    whole = _events_of(ServerSide(), [data])
    assert _events_of(ServerSide(), _cuts(data, points)) == whole
    assert sum(isinstance(e, RequestStarted) for e in whole) == len(requests)
    assert sum(isinstance(e, MessageEnded) for e in whole) == len(requests)


_RESPONSES = st.lists(
    st.one_of(
        st.builds(
            lambda body: b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body),
            st.binary(max_size=64),
        ),
        st.builds(
            lambda chunks: (
                b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n"
                + b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks if c)
                + b"0\r\n\r\n"
            ),
            st.lists(st.binary(min_size=1, max_size=20), max_size=4),
        ),
        st.just(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nx-b: 2\r\n\r\n"),
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(_RESPONSES, st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_any_split_of_responses_gives_the_events_of_one_chunk(responses: list[bytes], points: list[int]) -> None:
    def client() -> ClientSide:
        side = ClientSide()
        side.send_request(RequestHead("GET", "/", "svc"))
        side.end_request()
        return side

    def run(responses: list[list[bytes]]) -> list[object]:
        side, out = client(), []
        for pieces in responses:  # one request per response, as the waypoint sends them
            out += _events_of(side, pieces)
            if side.next_cycle():
                side.send_request(RequestHead("GET", "/", "svc"))
                side.end_request()
        return _merged(out)

    whole = run([[response] for response in responses])
    assert run([_cuts(response, points) for response in responses]) == whole
    assert sum(isinstance(e, ResponseStarted) for e in whole) == len(responses)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048), st.integers(min_value=1, max_value=64))
def test_any_bytes_from_upstream_give_events_or_a_clean_upstream_error(data: bytes, cut: int) -> None:
    client = ClientSide(max_head_bytes=1024)
    client.send_request(RequestHead("GET", "/", "svc"))
    client.end_request()
    try:
        for start in range(0, len(data), cut):
            client.receive_data(data[start : start + cut])
            drain(client)
        client.receive_data(b"")
        drain(client)
    except HttpProtocolError as exc:
        assert exc.upstream and exc.status == 503


@pytest.mark.parametrize(
    "raw",
    [
        b"GET / HTTP/1.1\r\nhost: a\r\nx-a: b\r\n folded\r\n\r\n",  # obsolete line folding
        b"GET / HTTP/1.1\nhost: a\n\n",  # bare LF
        b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabcd",
        b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: gzip\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: a\r\nx: \x01\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    ],
)
def test_smuggling_shapes_are_400(raw: bytes) -> None:
    server = ServerSide()
    server.receive_data(raw)
    with pytest.raises(HttpProtocolError) as caught:
        drain(server)
    assert caught.value.status == 400


def test_a_body_cut_short_by_eof_is_400() -> None:
    server = ServerSide()
    server.receive_data(b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 10\r\n\r\nabc")
    server.receive_data(b"")
    with pytest.raises(HttpProtocolError) as caught:
        drain(server)
    assert caught.value.status == 400
    with pytest.raises(HttpProtocolError):
        server.receive_data(b"more")


def test_a_pipelined_request_waits_until_the_next_cycle() -> None:
    server = ServerSide()
    server.receive_data(b"GET /1 HTTP/1.1\r\nhost: a\r\n\r\nGET /2 HTTP/1.1\r\nhost: a\r\n\r\n")
    first = drain(server)
    assert [type(e) for e in first] == [RequestStarted, MessageEnded]
    assert server.next_event() is Signal.PAUSED and server.head_begun
    server.send_response(200, [("content-length", "0")])
    server.end_response()
    assert server.next_cycle()
    second = drain(server)
    assert isinstance(second[0], RequestStarted) and second[0].head.path == "/2"


def test_an_upgrade_answered_without_101_goes_on_as_http() -> None:
    server = ServerSide()
    upgrade = b"GET /ws HTTP/1.1\r\nhost: a\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n"
    server.receive_data(upgrade + b"GET /next HTTP/1.1\r\nhost: a\r\n\r\n")
    started = drain(server)[0]
    assert isinstance(started, RequestStarted) and started.upgrade
    server.send_response(404, [("content-length", "0")])
    server.end_response()
    assert server.next_cycle()
    following = drain(server)[0]
    assert isinstance(following, RequestStarted) and following.head.path == "/next"
    with pytest.raises(HttpProtocolError):
        server.switched()


def test_a_101_needs_an_upgrade_request() -> None:
    server = ServerSide()
    server.receive_data(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
    drain(server)
    with pytest.raises(HttpProtocolError) as caught:
        server.send_interim(101, [("upgrade", "websocket")])
    assert caught.value.status == 502


def test_the_answer_to_head_ends_with_its_head_and_the_connection_is_kept() -> None:
    client = ClientSide()
    client.send_request(RequestHead("HEAD", "/", "svc"))
    client.end_request()
    client.receive_data(
        b"HTTP/1.1 200 OK\r\ncontent-length: 1024\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    )
    events = drain(client)
    assert [type(e) for e in events] == [ResponseStarted, MessageEnded]
    assert client.next_cycle()
    client.send_request(RequestHead("GET", "/", "svc"))
    client.end_request()
    assert drain(client)[1] == BodyData(b"ok")


def test_a_response_without_framing_ends_at_eof_and_is_not_kept() -> None:
    client = ClientSide()
    client.send_request(RequestHead("GET", "/", "svc"))
    client.end_request()
    client.receive_data(b"HTTP/1.1 200 OK\r\n\r\nsome")
    assert [type(e) for e in drain(client)] == [ResponseStarted, BodyData]
    client.receive_data(b"")
    assert isinstance(client.next_event(), MessageEnded)
    assert not client.next_cycle()


def test_responses_are_framed_for_the_client() -> None:
    old = ServerSide(accept_http10=True)
    old.receive_data(b"GET / HTTP/1.0\r\n\r\n")
    drain(old)
    head = old.send_response(200, [("x-a", "1")])
    assert b"connection: close" in head and b"transfer-encoding" not in head
    assert old.send_body(b"abc") == b"abc" and old.end_response() == b""
    assert not old.next_cycle()
    new = ServerSide()
    new.receive_data(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
    drain(new)
    assert b"transfer-encoding: chunked" in new.send_response(200, [])
    assert new.send_body(b"abc") == b"3\r\nabc\r\n"
    assert new.end_response([("x-t", "1")]) == b"0\r\nx-t: 1\r\n\r\n"
    assert new.next_cycle()


def test_a_response_body_that_disagrees_with_its_length_is_502() -> None:
    server = ServerSide()
    server.receive_data(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
    drain(server)
    server.send_response(200, [("content-length", "2")])
    with pytest.raises(HttpProtocolError) as caught:
        server.send_body(b"abc")
    assert caught.value.status == 502
    with pytest.raises(HttpProtocolError):
        ServerSide().send_response(200, [("x-bad", "a\r\nb")])


def test_a_request_value_http1_cannot_carry_is_refused() -> None:
    with pytest.raises(HttpProtocolError) as caught:
        ClientSide().send_request(RequestHead("GET", "/", "svc", (("x-bad", "line\nbreak"),)))
    assert caught.value.status == 400
