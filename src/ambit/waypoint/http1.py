"""HTTP/1.1 for the waypoint, sans-IO: h11 on both sides, seen through the waypoint's own events.

Theory of operation: :class:`ServerSide` is the downstream end (a client's requests arrive in an HBONE tunnel) and
:class:`ClientSide` the upstream end (the waypoint's requests to an endpoint). Both wrap an ``h11.Connection``:
bytes go in with ``receive_data``, :meth:`next_event` turns h11's events into :data:`Event` values (a request head
becomes an :class:`~ambit.waypoint.decisions.RequestHead`), and every ``send_*`` returns the bytes to write. No
socket, task or clock is touched here; the shell (:mod:`ambit.waypoint.http1_proxy`) does the I/O.

Rules:

1. A request or response head larger than ``max_head_bytes`` (request line or status line plus headers) is a
   :class:`~ambit.waypoint.errors.HttpProtocolError` (431 for a request head, as Envoy answers); so is any other
   malformed message (400). h11 keeps at most ``max_head_bytes`` of an incomplete head buffered, and the shell
   only feeds more bytes when :meth:`next_event` answered :data:`Signal.NEED_DATA`, so a peer can make us hold at
   most one read beyond that bound.
2. Hop-by-hop headers (``connection``, ``keep-alive``, ``proxy-connection``, ``te``, ``trailer``, ``upgrade``
   and any header ``connection`` names) are never forwarded, except the ``connection: upgrade`` / ``upgrade``
   pair of an upgrade request and its 101 answer. ``expect: 100-continue`` is answered by the waypoint itself
   (:meth:`ServerSide.continue_if_waited`) and not forwarded. Framing headers (``content-length``,
   ``transfer-encoding``) are forwarded as received: h11 checks that the body agrees with them; a request with a
   body but neither (one that came in HTTP/2) goes upstream chunked.
3. ``CONNECT`` requests inside a tunnel are refused (400): a waypoint routes HTTP requests, it is no proxy for
   further tunnels. A request of another major version than 1 (a broken HTTP/2 preface, ``HTTP/2.0`` in a
   request line) is refused 505: h11 parses any ``digit.digit``, but only HTTP/1.x is spoken here.
4. After a message exchange, :meth:`ServerSide.next_cycle` / :meth:`ClientSide.next_cycle` say whether the
   connection may carry another one (keep-alive), and reset h11 for it.
5. An upgrade (``Upgrade`` request answered 101) ends HTTP on both connections: :meth:`ServerSide.switched` and
   :meth:`ClientSide.switched` return the bytes that arrived after the head, and the shell relays raw bytes.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

import h11

from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.errors import HttpProtocolError

MAX_HEAD_BYTES = 64 * 1024
_FRAMING = frozenset(("content-length", "transfer-encoding"))
"""Default bound on one request or response head (Envoy's default ``max_request_headers_kb`` is 60)."""

_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "expect"})

Headers = tuple[tuple[str, str], ...]


class Signal(enum.Enum):
    NEED_DATA = "need data"
    """Feed more bytes (``receive_data``; ``b""`` is EOF)."""
    PAUSED = "paused"
    """A message is complete and the other side must act first (answer it, or finish the upgrade)."""
    CLOSED = "closed"
    """The peer closed the connection cleanly between messages."""


@dataclass(frozen=True, slots=True)
class RequestStarted:
    head: RequestHead
    version: str
    """``"1.1"`` or ``"1.0"``; ``"2"`` for a request taken over HTTP/2."""
    upgrade: bool
    """The request asks to switch protocols (``Connection: upgrade`` and ``Upgrade``)."""
    has_body: bool


@dataclass(frozen=True, slots=True)
class ResponseStarted:
    status: int
    headers: Headers
    reason: str = ""


@dataclass(frozen=True, slots=True)
class InterimResponse:
    """A 1xx answer other than 100 (which the waypoint handles itself); 101 switches protocols."""

    status: int
    headers: Headers


@dataclass(frozen=True, slots=True)
class BodyData:
    data: bytes


@dataclass(frozen=True, slots=True)
class MessageEnded:
    trailers: Headers = ()


Event = RequestStarted | ResponseStarted | InterimResponse | BodyData | MessageEnded | Signal


def _text_headers(raw: Iterable[tuple[bytes, bytes]]) -> Headers:
    return tuple((name.decode("latin-1").lower(), value.decode("latin-1")) for name, value in raw)


def forwardable(headers: Headers, *, upgrade: bool = False) -> list[tuple[str, str]]:
    """``headers`` without the hop-by-hop ones (rule 2); with ``upgrade``, keep the upgrade pair."""
    named: set[str] = set()
    for name, value in headers:
        if name == "connection":
            named.update(part.strip().lower() for part in value.split(","))
    out = [(n, v) for n, v in headers if n not in _HOP_BY_HOP and n not in named]
    if upgrade:
        wanted = next((v for n, v in headers if n == "upgrade"), "")
        if wanted:
            out += [("connection", "upgrade"), ("upgrade", wanted)]
    return out


def _remote(exc: h11.RemoteProtocolError, *, upstream: bool) -> HttpProtocolError:
    return HttpProtocolError(str(exc) or "malformed HTTP/1.1", exc.error_status_hint or 400, upstream=upstream)


class ServerSide:
    """The downstream end: parses a client's requests, frames the waypoint's responses."""

    def __init__(self, max_head_bytes: int = MAX_HEAD_BYTES, *, authority: str = "", scheme: str = "http") -> None:
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=max_head_bytes)
        self._max_head = max_head_bytes
        self._authority = authority
        """Used as the request's authority when it has no Host (HTTP/1.0): the tunnel's CONNECT authority."""
        self._scheme = scheme
        """Every request's scheme: HTTP/1.1 has none on the wire, so it is the connection's (``https`` over TLS)."""

    @property
    def head_begun(self) -> bool:
        """Bytes of a request head wait unparsed (a sniffed prefix, a pipelined request)."""
        return bool(self._h11.trailing_data[0])

    def receive_data(self, data: bytes) -> None:
        try:
            self._h11.receive_data(data)
        except RuntimeError as exc:  # data after EOF, or after a protocol error
            raise HttpProtocolError(f"data after the connection ended: {exc}") from None

    def next_event(self) -> Event:
        try:
            event = self._h11.next_event()
        except h11.RemoteProtocolError as exc:
            if "buffer" in str(exc).lower() or "too long" in str(exc).lower():
                raise HttpProtocolError(f"request head larger than {self._max_head} bytes", 431) from None
            raise _remote(exc, upstream=False) from None
        if event is h11.NEED_DATA:
            return Signal.NEED_DATA
        if event is h11.PAUSED:
            return Signal.PAUSED
        if isinstance(event, h11.Request):
            return self._request(event)
        if isinstance(event, h11.Data):
            return BodyData(bytes(event.data))
        if isinstance(event, h11.EndOfMessage):
            return MessageEnded(_text_headers(event.headers))
        if isinstance(event, h11.ConnectionClosed):
            return Signal.CLOSED
        raise HttpProtocolError(f"unexpected HTTP/1.1 event {type(event).__name__}")

    def _request(self, event: h11.Request) -> RequestStarted:
        method = event.method.decode("ascii", "replace")
        if method == "CONNECT":  # rule 3
            raise HttpProtocolError("CONNECT is not supported inside a tunnel")
        if not event.http_version.startswith(b"1."):
            version = event.http_version.decode("ascii", "replace")
            raise HttpProtocolError(f"HTTP/{version} is not HTTP/1.x", 505)
        headers = _text_headers(event.headers)
        host = next((v for n, v in headers if n == "host"), "") or self._authority
        connection = ",".join(v for n, v in headers if n == "connection").lower()
        upgrade = any(n == "upgrade" for n, _ in headers) and "upgrade" in connection
        has_body = any(n in ("content-length", "transfer-encoding") for n, _ in headers) and not any(
            n == "content-length" and v.strip() == "0" for n, v in headers
        )
        head = RequestHead(
            method=method,
            path=event.target.decode("latin-1"),
            authority=host,
            headers=tuple((n, v) for n, v in headers if n != "host"),
            scheme=self._scheme,
        )
        return RequestStarted(head, event.http_version.decode("ascii"), upgrade, has_body)

    def continue_if_waited(self) -> bytes:
        """``100 Continue`` when the client waits for it before sending its body (rule 2), else nothing."""
        if self._h11.they_are_waiting_for_100_continue:
            return self._send(h11.InformationalResponse(status_code=100, headers=[]))
        return b""

    def send_response(self, status: int, headers: Iterable[tuple[str, str]], reason: str = "") -> bytes:
        try:
            event = h11.Response(status_code=status, headers=list(headers), reason=reason.encode("latin-1", "replace"))
        except h11.LocalProtocolError as exc:
            raise HttpProtocolError(f"cannot send this response: {exc}", 502, upstream=True) from None
        return self._send(event)

    def send_interim(self, status: int, headers: Iterable[tuple[str, str]]) -> bytes:
        try:
            event = h11.InformationalResponse(status_code=status, headers=list(headers))
        except h11.LocalProtocolError as exc:
            raise HttpProtocolError(f"cannot send this response: {exc}", 502, upstream=True) from None
        return self._send(event)

    def send_body(self, data: bytes) -> bytes:
        return self._send(h11.Data(data=data)) if data else b""

    def end_response(self, trailers: Iterable[tuple[str, str]] = ()) -> bytes:
        return self._send(h11.EndOfMessage(headers=list(trailers)))

    @property
    def response_started(self) -> bool:
        return self._h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE)

    def next_cycle(self) -> bool:
        """Rule 4: True (and reset for the next request) when the connection stays open."""
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()
            return True
        return False

    def switched(self) -> bytes:
        """Rule 5: after a 101 was sent, the client's bytes that followed its request head."""
        if self._h11.our_state is not h11.SWITCHED_PROTOCOL:
            raise HttpProtocolError("the connection did not switch protocols")
        return bytes(self._h11.trailing_data[0])

    def _send(self, event: h11.Event) -> bytes:
        try:
            return self._h11.send(event) or b""
        except h11.LocalProtocolError as exc:
            raise HttpProtocolError(f"cannot send this response: {exc}", 502, upstream=True) from None


def simple_response(status: int, reason: str, body: str, *, close: bool = True) -> bytes:
    """A complete local answer written without h11: used when h11 refuses to frame anything more (after a
    protocol error), so a malformed request still gets its clean 400 and close."""
    payload = body.encode()
    lines = [
        f"HTTP/1.1 {status} {reason}",
        "content-type: text/plain",
        f"content-length: {len(payload)}",
    ]
    if close:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload


class ClientSide:
    """The upstream end: frames the waypoint's requests, parses an endpoint's responses."""

    def __init__(self, max_head_bytes: int = MAX_HEAD_BYTES) -> None:
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=max_head_bytes)

    def send_request(self, head: RequestHead, *, upgrade: bool = False, body: bool = False) -> bytes:
        """The request line and headers for ``head`` (its ``authority`` becomes ``Host``), hop-by-hop removed.
        ``body``: a body follows; when ``head`` frames none (an HTTP/2 request without ``content-length``) it is
        sent chunked (rule 2)."""
        headers = [("host", head.authority), *forwardable(head.headers, upgrade=upgrade)]
        if body and not any(n in _FRAMING for n, _ in headers):
            headers.append(("transfer-encoding", "chunked"))
        try:
            request = h11.Request(method=head.method, target=head.path, headers=headers)
        except h11.LocalProtocolError as exc:  # a rewritten request with a value HTTP/1.1 cannot carry
            raise HttpProtocolError(f"request cannot be forwarded: {exc}") from None
        return self._send(request)

    def send_body(self, data: bytes) -> bytes:
        return self._send(h11.Data(data=data)) if data else b""

    def end_request(self, trailers: Iterable[tuple[str, str]] = ()) -> bytes:
        return self._send(h11.EndOfMessage(headers=list(trailers)))

    def receive_data(self, data: bytes) -> None:
        try:
            self._h11.receive_data(data)
        except RuntimeError as exc:
            raise HttpProtocolError(f"upstream sent data after the end: {exc}", 503, upstream=True) from None

    def next_event(self) -> Event:
        try:
            event = self._h11.next_event()
        except h11.RemoteProtocolError as exc:
            raise HttpProtocolError(f"upstream broke HTTP/1.1: {exc}", 503, upstream=True) from None
        if event is h11.NEED_DATA:
            return Signal.NEED_DATA
        if event is h11.PAUSED:
            return Signal.PAUSED
        if isinstance(event, h11.InformationalResponse):
            if event.status_code == 100:
                return self.next_event()
            return InterimResponse(event.status_code, _text_headers(event.headers))
        if isinstance(event, h11.Response):
            return ResponseStarted(
                event.status_code, _text_headers(event.headers), event.reason.decode("latin-1", "replace")
            )
        if isinstance(event, h11.Data):
            return BodyData(bytes(event.data))
        if isinstance(event, h11.EndOfMessage):
            return MessageEnded(_text_headers(event.headers))
        if isinstance(event, h11.ConnectionClosed):
            return Signal.CLOSED
        raise HttpProtocolError(f"unexpected upstream event {type(event).__name__}", 503, upstream=True)

    def next_cycle(self) -> bool:
        """Rule 4: True (and reset) when the upstream connection can carry another request."""
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()
            return True
        return False

    def switched(self) -> bytes:
        """Rule 5: after the endpoint answered 101, the bytes it sent after its response head."""
        if self._h11.their_state is not h11.SWITCHED_PROTOCOL:
            raise HttpProtocolError("the upstream did not switch protocols", 503, upstream=True)
        return bytes(self._h11.trailing_data[0])

    def _send(self, event: h11.Event) -> bytes:
        try:
            return self._h11.send(event) or b""
        except h11.LocalProtocolError as exc:
            # What we forward came from the downstream request (e.g. a body longer than its Content-Length).
            raise HttpProtocolError(f"request cannot be forwarded: {exc}") from None
