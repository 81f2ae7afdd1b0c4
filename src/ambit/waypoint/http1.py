"""HTTP/1.1 for the waypoint, sans-IO: llhttp reads, a small serializer writes, the waypoint's own events between.

Theory of operation: :class:`ServerSide` is the downstream end (a client's requests arrive in an HBONE tunnel) and
:class:`ClientSide` the upstream end (the waypoint's requests to an endpoint). Bytes go in with ``receive_data``
and are parsed at once by a :class:`~ambit.waypoint.http1_reader.MessageReader` (httptools, i.e. llhttp);
:meth:`next_event` hands out :data:`Event` values one message at a time (a request head becomes an
:class:`~ambit.waypoint.decisions.RequestHead`), and every ``send_*`` returns the bytes to write, serialized and
framed by :mod:`ambit.waypoint.http1_writer`. Each side keeps the little connection state HTTP/1.1 needs: whose
turn it is, keep-alive, a pending ``100 Continue``, an upgrade. No socket, task or clock is touched here; the
shell (:mod:`ambit.waypoint.http1_proxy`) does the I/O.

Rules:

1. A request or response head larger than ``max_head_bytes`` (request line or status line plus headers) is a
   :class:`~ambit.waypoint.errors.HttpProtocolError` (431 for a request head, as Envoy answers); so is any other
   malformed message (400: a bad token or value, obsolete line folding, a bare LF, a missing ``Host`` in
   HTTP/1.1, a ``Content-Length`` with a ``Transfer-Encoding``, a body shorter than its framing at EOF). The reader
   counts an incomplete head's bytes, and the shell only feeds more bytes when :meth:`next_event` answered
   :data:`Signal.NEED_DATA`, so a peer can make us hold at most one read beyond that bound; pipelined requests
   wait, parsed, until :meth:`ServerSide.next_cycle`.
2. Hop-by-hop headers (``connection``, ``keep-alive``, ``proxy-connection``, ``te``, ``trailer``, ``upgrade``
   and any header ``connection`` names) are never forwarded, except the ``connection: upgrade`` / ``upgrade``
   pair of an upgrade request and its 101 answer. ``expect: 100-continue`` is answered by the waypoint itself
   (:meth:`ServerSide.continue_if_waited`) and not forwarded. Framing headers (``content-length``,
   ``transfer-encoding``) are forwarded as received: the reader checks that the body agrees with them and the
   writer that what we send does; a request with a body but neither (one that came in HTTP/2) goes upstream
   chunked, and a response without either goes downstream chunked (close-delimited to an HTTP/1.0 client).
   Trailers travel only in chunked messages.
3. ``CONNECT`` requests inside a tunnel are refused (400): a waypoint routes HTTP requests, it is no proxy for
   further tunnels. A request of another major version than 1 (a broken HTTP/2 preface, ``HTTP/2.0`` or
   ``HTTP/0.9`` in a request line, a version llhttp does not know) is refused 505: only HTTP/1.x is spoken here.
   A request in any HTTP/1.x but 1.1 (HTTP/1.0, as Envoy's codec calls it) is handed out like any other: refusing
   it is the connection manager's (:mod:`ambit.waypoint.exchange` rule 0). Its answer has an ``HTTP/1.0`` status
   line when the side was made with ``accept_http10`` (Envoy's codec writes one only with ``accept_http_10``), an
   ``HTTP/1.1`` one otherwise (Envoy's 426 to it).
4. After a message exchange, :meth:`ServerSide.next_cycle` / :meth:`ClientSide.next_cycle` say whether the
   connection may carry another one (keep-alive: HTTP/1.1 on both messages, no ``connection: close``, no body
   ended by the close), and reset the side for it. An HTTP/1.0 request keeps the connection only when its
   ``Connection`` names ``keep-alive`` and its answer has a length; that answer then says ``connection:
   keep-alive`` (Envoy's ``HeaderUtility::shouldCloseConnection`` and its connection manager's HTTP/1.0 rule).
5. An upgrade (``Upgrade`` request answered 101) ends HTTP on both connections: :meth:`ServerSide.switched` and
   :meth:`ClientSide.switched` return the bytes that arrived after the head, and the shell relays raw bytes. An
   upgrade request answered otherwise leaves the connection in HTTP/1.1.
6. A response's status line carries the standard reason phrase of its code (``200 OK``, ``404 Not Found``), as
   Envoy's HTTP/1 codec writes it whatever the upstream said; only a code without one keeps the phrase given
   (an upstream's own, or none).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from http import HTTPStatus

from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.errors import HttpProtocolError
from ambit.waypoint.http1_events import (
    BodyData,
    Event,
    Headers,
    InterimResponse,
    MessageEnded,
    RequestStarted,
    ResponseStarted,
    Signal,
)
from ambit.waypoint.http1_reader import MessageReader, ParsedHead
from ambit.waypoint.http1_writer import (
    BodyWriter,
    Framing,
    FramingError,
    body_framing,
    connection_tokens,
    request_head,
    response_head,
)
from ambit.waypoint.response_base import finalized

__all__ = [
    "MAX_HEAD_BYTES",
    "BodyData",
    "ClientSide",
    "Event",
    "Headers",
    "InterimResponse",
    "MessageEnded",
    "RequestStarted",
    "ResponseStarted",
    "ServerSide",
    "Signal",
    "forwardable",
    "simple_response",
]

MAX_HEAD_BYTES = 64 * 1024
"""Default bound on one request or response head (Envoy's default ``max_request_headers_kb`` is 60)."""
_FRAMING = frozenset(("content-length", "transfer-encoding"))
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "expect"})
_NO_BODY_STATUSES = frozenset((204, 304))
_PHRASES = {status.value: status.phrase for status in HTTPStatus}


def reason_phrase(status: int, default: str = "") -> str:
    """The standard reason phrase of ``status`` (``Not Found``), else ``default``."""
    return _PHRASES.get(status, default)


"""Rule 6: the reason phrase of each standard code."""
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


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


def _downstream_error(reason: str, status: int) -> HttpProtocolError:
    return HttpProtocolError(reason, status)


def _upstream_error(reason: str, status: int) -> HttpProtocolError:
    return HttpProtocolError(f"upstream broke HTTP/1.1: {reason}", 503, upstream=True)


def _cannot_send(exc: FramingError | str) -> HttpProtocolError:
    return HttpProtocolError(f"cannot send this response: {exc}", 502, upstream=True)


class ServerSide:
    """The downstream end: parses a client's requests, frames the waypoint's responses."""

    __slots__ = (
        "_accept_http10",
        "_body",
        "_failed",
        "_keep",
        "_method",
        "_our_done",
        "_reader",
        "_request_keep",
        "_scheme",
        "_switched",
        "_their_done",
        "_upgrade_proposed",
        "_version",
        "_waiting_100",
    )

    def __init__(
        self,
        max_head_bytes: int = MAX_HEAD_BYTES,
        *,
        scheme: str = "http",
        accept_http10: bool = False,
    ) -> None:
        self._reader = MessageReader(response=False, max_head_bytes=max_head_bytes, error=_downstream_error)
        self._accept_http10 = accept_http10
        """Rule 3: HTTP/1.0 is served here (Envoy's ``accept_http_10``): its answers say ``HTTP/1.0``."""
        self._scheme = scheme
        """Every request's scheme: HTTP/1.1 has none on the wire, so it is the connection's (``https`` over TLS)."""
        self._failed: HttpProtocolError | None = None
        self._reset()

    def _reset(self) -> None:
        self._their_done = self._our_done = self._keep = self._request_keep = False
        self._body: BodyWriter | None = None
        self._method = ""
        self._version = "1.1"
        self._upgrade_proposed = self._switched = self._waiting_100 = False

    @property
    def head_begun(self) -> bool:
        """Bytes of a request head wait unparsed (a sniffed prefix, a pipelined request)."""
        return self._reader.begun

    def receive_data(self, data: bytes) -> None:
        if data and self._reader.eof:
            raise HttpProtocolError("data after the connection ended")
        self._reader.receive(data)

    def next_event(self) -> Event:
        if self._failed is not None:
            raise self._failed
        if self._their_done:
            return Signal.PAUSED
        item = self._reader.pop()
        if item is None:
            return Signal.NEED_DATA
        if isinstance(item, BodyData):
            self._waiting_100 = False
            return item
        if isinstance(item, ParsedHead):
            try:
                return self._request(item)
            except HttpProtocolError as exc:
                self._failed = exc
                raise
        if isinstance(item, MessageEnded):
            self._their_done = True
            self._waiting_100 = False
            return item
        if isinstance(item, HttpProtocolError):
            self._failed = item
            raise item
        return item  # Signal.CLOSED

    def _request(self, parsed: ParsedHead) -> RequestStarted:
        method, version = parsed.method, parsed.version
        if method == "CONNECT":  # rule 3
            raise HttpProtocolError("CONNECT is not supported inside a tunnel")
        if not version.startswith("1."):
            raise HttpProtocolError(f"HTTP/{version} is not HTTP/1.x", 505)
        host: str | None = None
        connection: list[str] = []
        fields: list[tuple[str, str]] = []
        upgrade_named = has_body = empty_length = expect_continue = False
        for field in parsed.headers:
            name, value = field
            if name == "host":
                if host is None:
                    host = value
                continue
            fields.append(field)
            if name == "connection":
                connection.append(value.lower())
            elif name == "upgrade":
                upgrade_named = True
            elif name == "content-length":
                has_body = True
                empty_length = empty_length or value == "0"
            elif name == "transfer-encoding":
                has_body = True
            elif name == "expect":
                expect_continue = value.lower() == "100-continue"
        if host is None and version == "1.1":
            raise HttpProtocolError("missing mandatory Host header")
        tokens = ",".join(connection)
        upgrade = upgrade_named and "upgrade" in tokens
        self._method, self._version = method, version
        options = connection_tokens((("connection", tokens),))
        # Rule 4: HTTP/1.1 keeps the connection unless told to close, anything older only when asked to keep it.
        self._request_keep = "close" not in options if version == "1.1" else "keep-alive" in options
        self._upgrade_proposed = upgrade
        self._waiting_100 = expect_continue and version == "1.1"
        head = RequestHead(
            method=method,
            path=parsed.target,
            authority=host or "",  # none: HTTP/1.0 without Host, which the connection manager refuses 400
            headers=tuple(fields),
            scheme=self._scheme,
        )
        return RequestStarted(head, version, upgrade, has_body and not empty_length)

    def continue_if_waited(self) -> bytes:
        """``100 Continue`` when the client waits for it before sending its body (rule 2), else nothing."""
        if self._waiting_100:
            self._waiting_100 = False
            return _CONTINUE
        return b""

    def send_response(self, status: int, headers: Iterable[tuple[str, str]], reason: str = "") -> bytes:
        if not 200 <= status <= 999:
            raise _cannot_send(f"status {status} is not a final answer")
        need_close = False
        try:
            fields = list(headers)
            if status in _NO_BODY_STATUSES or self._method == "HEAD":
                body_framing(fields)  # only checked: nothing follows this head
                writer = BodyWriter(Framing.NONE)
            else:
                framing, length, fields = body_framing(fields)
                if framing is Framing.CHUNKED and self._version != "1.1":  # rule 2: HTTP/1.0 has no chunks
                    fields = [(n, v) for n, v in fields if n != "transfer-encoding"]
                    framing = None
                if framing is None:
                    if self._version == "1.1":
                        framing = Framing.CHUNKED
                        fields.append(("transfer-encoding", "chunked"))
                    else:
                        framing, need_close = Framing.CLOSE, True
                writer = BodyWriter(framing, length)
            tokens = connection_tokens(fields)
            keep = self._request_keep and not need_close and "close" not in tokens
            if not keep and "close" not in tokens:
                fields = [(n, v) for n, v in fields if n != "connection"]
                fields.append(("connection", ", ".join(sorted((tokens - {"keep-alive"}) | {"close"}))))
            elif keep and self._version != "1.1":  # rule 4: an HTTP/1.0 client is told its connection stays
                fields = [*((n, v) for n, v in fields if n != "connection"), ("connection", "keep-alive")]
            version = "1.0" if self._version != "1.1" and self._accept_http10 else "1.1"  # rule 3
            data = response_head(status, _PHRASES.get(status, reason), fields, version)
        except FramingError as exc:
            raise _cannot_send(exc) from None
        self._body, self._keep, self._waiting_100 = writer, keep, False
        return data

    def send_interim(self, status: int, headers: Sequence[tuple[str, str]]) -> bytes:
        if not 100 <= status < 200:
            raise _cannot_send(f"status {status} is not an interim answer")
        if status == 101 and not self._upgrade_proposed:
            raise _cannot_send("101 to a request that asked for no upgrade")
        try:
            data = response_head(status, _PHRASES.get(status, ""), headers)
        except FramingError as exc:
            raise _cannot_send(exc) from None
        self._waiting_100 = False
        self._switched = status == 101
        return data

    def send_body(self, data: bytes) -> bytes:
        if not data:
            return b""
        if self._body is None:
            raise _cannot_send("body before the response head")
        try:
            return self._body.data(data)
        except FramingError as exc:
            raise _cannot_send(exc) from None

    def end_response(self, trailers: Iterable[tuple[str, str]] = ()) -> bytes:
        if self._body is None:
            raise _cannot_send("end before the response head")
        try:
            data = self._body.end(list(trailers))
        except FramingError as exc:
            raise _cannot_send(exc) from None
        self._our_done = True
        return data

    @property
    def response_started(self) -> bool:
        return self._body is not None or self._switched

    def next_cycle(self) -> bool:
        """Rule 4: True (and reset for the next request) when the connection stays open."""
        if self._our_done and self._their_done and self._keep and self._failed is None:
            self._reset()
            self._reader.restart()
            return True
        return False

    def switched(self) -> bytes:
        """Rule 5: after a 101 was sent, the client's bytes that followed its request head."""
        if not self._switched:
            raise HttpProtocolError("the connection did not switch protocols")
        return self._reader.held


def simple_response(status: int, reason: str, body: str, *, close: bool = True) -> bytes:
    """A complete local answer written without h11: used when h11 refuses to frame anything more (after a
    protocol error), so a malformed request still gets its clean 400 and close."""
    payload = body.encode()
    # As Envoy's local replies: a content-type only for a body (its 426 to HTTP/1.0 has none).
    fields = finalized([*([("content-type", "text/plain")] if payload else []), ("content-length", str(len(payload)))])
    lines = [f"HTTP/1.1 {status} {reason}", *(f"{name}: {value}" for name, value in fields)]
    if close:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload


class ClientSide:
    """The upstream end: frames the waypoint's requests, parses an endpoint's responses."""

    __slots__ = ("_body", "_failed", "_keep", "_method", "_our_done", "_reader", "_switched", "_their_done")

    def __init__(self, max_head_bytes: int = MAX_HEAD_BYTES) -> None:
        self._reader = MessageReader(response=True, max_head_bytes=max_head_bytes, error=_upstream_error)
        self._failed: HttpProtocolError | None = None
        self._reset()

    def _reset(self) -> None:
        self._their_done = self._our_done = self._keep = self._switched = False
        self._body = BodyWriter(Framing.NONE)
        self._method = ""

    def send_request(self, head: RequestHead, *, upgrade: bool = False, body: bool = False) -> bytes:
        """The request line and headers for ``head`` (its ``authority`` becomes ``Host``), hop-by-hop removed.
        ``body``: a body follows; when ``head`` frames none (an HTTP/2 request without ``content-length``) it is
        sent chunked (rule 2)."""
        headers = [("host", head.authority), *forwardable(head.headers, upgrade=upgrade)]
        if body and not any(n in _FRAMING for n, _ in headers):
            headers.append(("transfer-encoding", "chunked"))
        try:
            framing, length, headers = body_framing(headers)
            data = request_head(head.method, head.path, headers)
        except FramingError as exc:  # a rewritten request with a value HTTP/1.1 cannot carry
            raise HttpProtocolError(f"request cannot be forwarded: {exc}") from None
        self._body = BodyWriter(framing or Framing.LENGTH, length)
        self._method = head.method
        if head.method == "HEAD":
            self._reader.head_only()
        return data

    def send_body(self, data: bytes) -> bytes:
        if not data:
            return b""
        try:
            return self._body.data(data)
        except FramingError as exc:  # what we forward came from the downstream request
            raise HttpProtocolError(f"request cannot be forwarded: {exc}") from None

    def end_request(self, trailers: Iterable[tuple[str, str]] = ()) -> bytes:
        try:
            data = self._body.end(list(trailers))
        except FramingError as exc:
            raise HttpProtocolError(f"request cannot be forwarded: {exc}") from None
        self._our_done = True
        return data

    def receive_data(self, data: bytes) -> None:
        if data and self._reader.eof:
            raise HttpProtocolError("upstream sent data after the end", 503, upstream=True)
        self._reader.receive(data)

    def next_event(self) -> Event:
        if self._failed is not None:
            raise self._failed
        if self._their_done:
            return Signal.PAUSED
        while True:
            item = self._reader.pop()
            if item is None:
                return Signal.NEED_DATA
            if isinstance(item, BodyData):
                return item
            if isinstance(item, ParsedHead):
                if item.status == 100:
                    continue
                return self._response(item)
            if isinstance(item, MessageEnded):
                self._their_done = True
                return item
            if isinstance(item, HttpProtocolError):
                self._failed = item
                raise item
            return item  # Signal.CLOSED

    def _response(self, parsed: ParsedHead) -> ResponseStarted | InterimResponse:
        headers = tuple(parsed.headers)
        if parsed.status < 200:
            self._switched = parsed.status == 101
            return InterimResponse(parsed.status, headers)
        framed = parsed.framed or parsed.status in _NO_BODY_STATUSES or self._method == "HEAD"
        self._keep = framed and parsed.version == "1.1" and "close" not in connection_tokens(parsed.headers)
        return ResponseStarted(parsed.status, headers, parsed.reason)

    def next_cycle(self) -> bool:
        """Rule 4: True (and reset) when the upstream connection can carry another request."""
        if self._our_done and self._their_done and self._keep and self._failed is None:
            self._reset()
            self._reader.restart()
            return True
        return False

    def switched(self) -> bytes:
        """Rule 5: after the endpoint answered 101, the bytes it sent after its response head."""
        if not self._switched:
            raise HttpProtocolError("the upstream did not switch protocols", 503, upstream=True)
        return self._reader.held
