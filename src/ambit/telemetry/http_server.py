"""A small HTTP/1.1 server for the proxies' telemetry ports, on h11 and asyncio (no aiohttp in the node proxy).

Theory of operation
-------------------
h11 is the protocol core (bytes in, events out, bytes to send); this module is the thin shell around it and a route
table of synchronous handlers. A handler takes a :class:`Request` (method, decoded path, first value of each query
parameter, lower-cased headers, peer address) and returns a :class:`Response`; it never reads a body and never
waits, so a request is answered in the callback that completed it. Each accepted connection is one
:class:`_HttpConnection`:

1. **Admission.** The connection is offered to the server's
   :class:`~ambit.telemetry.connection_limits.ConnectionGate`; over the total or the per-address limit it is aborted
   at once, before any state is made for it.
2. **Lifetime.** ``lifetime`` seconds after acceptance the connection is closed gracefully (what is queued is
   written, nothing more is read; an idle keep-alive or a half-sent head ends at once) and ``grace`` seconds later
   aborted with whatever it still had to write. This is what ends slow heads (slowloris) and never-reading clients.
3. **Bounded heads.** A request head (request line and headers) is at most :data:`MAX_HEAD` bytes: h11 refuses a
   longer incomplete event, and the client gets 431 or 400 and a close. Anything h11 refuses as malformed
   (smuggling attempts, bare LF, folded headers, a missing Host) is answered 400 and closed; the log gets one INFO
   line naming the peer and the kind of error, never the request's bytes (they may hold the admin token).
4. **Bounded bodies.** No route reads a body; a body of at most :data:`MAX_BODY` bytes is read and dropped, a
   larger declared or received one is answered 413 and the connection closed without reading it.
5. **Pipelining.** Requests are answered in order, one at a time; at most :data:`MAX_REQUESTS_PER_TURN` are
   answered per event-loop turn (the rest wait for the next turn, reading paused), and while the transport's write
   buffer is above its high-water mark nothing more is answered or read. What one connection can pin is thus one
   read chunk of requests plus the answers queued before the mark was crossed (the largest answer, at most), for at
   most ``lifetime + grace`` seconds.
6. **Routing.** An unknown path is 404 ``404: Not Found``, a known path with another method 405 ``405: Method Not
   Allowed`` with ``Allow`` (HEAD is only allowed where a route names it); a handler that raises is a 500 and a log
   record with the traceback, and the connection goes on.
7. **After the answer.** A :class:`Response` may carry ``then``, called once its bytes are handed to the transport
   (``POST /quitquitquit`` answers before the proxy starts to stop).

:meth:`HttpServer.aclose` stops listening, closes every connection gracefully and aborts those still open a second
later. Every answer carries ``Content-Length``, ``Content-Type``, ``Date`` and ``Server``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import cast
from urllib.parse import parse_qsl, unquote, urlsplit

import h11

from ambit.telemetry.connection_limits import ConnectionGate, ConnectionLimits

log = logging.getLogger("ambit.telemetry.http_server")

MAX_HEAD = 16 * 1024
"""Bytes of a request line and its headers."""
MAX_BODY = 16 * 1024
"""Bytes of a request body that are read (and dropped); a larger one is 413."""
MAX_REQUESTS_PER_TURN = 16
"""Pipelined requests answered in one event-loop turn."""
CLOSE_TIMEOUT = 1.0
"""Seconds :meth:`HttpServer.aclose` lets connections flush before it aborts them."""
SERVER = b"ambit"
TEXT = "text/plain; charset=utf-8"
JSON = "application/json; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    """Percent-decoded, without the query."""
    query: Mapping[str, str]
    """The first value of each query parameter."""
    headers: Mapping[str, str]
    """Lower-cased names, the first value of each."""
    peer: str


@dataclass(frozen=True, slots=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = TEXT
    headers: tuple[tuple[str, str], ...] = ()
    then: Callable[[], None] | None = field(default=None, compare=False)
    """Called once the answer's bytes are handed to the transport."""

    @classmethod
    def text(cls, text: str, status: int = 200, headers: tuple[tuple[str, str], ...] = ()) -> Response:
        return cls(status, text.encode(), TEXT, headers)


Handler = Callable[[Request], Response]
Routes = Mapping[str, Mapping[str, Handler]]
"""Path → method → handler."""


def route(routes: Routes, request: Request) -> Response:
    """The answer of ``routes`` to ``request`` (rule 6)."""
    methods = routes.get(request.path)
    if methods is None:
        return Response.text("404: Not Found", 404)
    handler = methods.get(request.method)
    if handler is None:
        return Response.text("405: Method Not Allowed", 405, (("Allow", ",".join(sorted(methods))),))
    try:
        return handler(request)
    except Exception:  # one broken handler must not take the connection down
        log.exception("%s %r failed", request.method, request.path)  # %r: a path may hold a newline
        return Response.text("500 Internal Server Error\n\nServer got itself in trouble", 500)


def parse_target(target: bytes) -> tuple[str, dict[str, str]]:
    """A request target (origin or absolute form) → (decoded path, first value of each query parameter)."""
    text = target.decode("ascii", "replace")
    parts = urlsplit(text)
    query: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):  # bounded by MAX_HEAD
        query.setdefault(name, value)
    return unquote(parts.path), query


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(now: float) -> str:
    """RFC 9110's IMF-fixdate of ``now`` (seconds since the epoch), whatever the locale."""
    t = time.gmtime(now)
    day, month = _DAYS[t.tm_wday], _MONTHS[t.tm_mon - 1]
    return f"{day}, {t.tm_mday:02d} {month} {t.tm_year} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT"


def _fixed_answer(status: bytes, body: bytes) -> bytes:
    """The whole answer to a request h11 refused (h11 sends nothing more once it has refused its peer)."""
    head = f"HTTP/1.1 {status.decode()}\r\nContent-Type: {TEXT}\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"Server: " + SERVER + b"\r\nConnection: close\r\n\r\n" + body


_BAD_REQUEST = _fixed_answer(b"400 Bad Request", b"bad request\n")
_TOO_LARGE = _fixed_answer(b"431 Request Header Fields Too Large", b"request header fields too large\n")


def _head(response: Response, close: bool) -> h11.Response:
    headers = [
        ("Content-Type", response.content_type),
        ("Content-Length", str(len(response.body))),
        ("Date", http_date(time.time())),
        ("Server", SERVER.decode()),
        *response.headers,
    ]
    if close:
        headers.append(("Connection", "close"))
    return h11.Response(status_code=response.status, headers=headers, reason=_reason(response.status))


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


class _HttpConnection(asyncio.Protocol):
    """One accepted connection (module docstring, rules 1 to 5 and 7)."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._gate = server.gate
        self._conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self._transport: asyncio.Transport | None = None
        self._peer = ""
        self._timer: asyncio.TimerHandle | None = None
        self._request: h11.Request | None = None
        self._body = 0
        self._write_paused = False
        self._reading_paused = False
        self._scheduled = False
        self._closing = False

    # --- asyncio callbacks ---------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio.Transport subclasses
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not self._gate.admit(self._peer):
            transport.abort()
            return
        self._transport = transport
        self._server.connections.add(self)
        self._timer = asyncio.get_running_loop().call_later(self._gate.limits.lifetime, self.close)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._transport is not None:
            self._transport = None
            self._server.connections.discard(self)
            self._gate.release(self._peer)

    def data_received(self, data: bytes) -> None:
        self._feed(data)

    def eof_received(self) -> bool:
        self._feed(b"")  # h11's end of input
        return True  # keep the transport to finish writing; _answer or close() ends it

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._answer()

    # --- the shell -----------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Rule 2: write what is queued, read nothing more, abort after the grace period."""
        if self._transport is None or self._closing:
            return
        self._closing = True
        self._transport.close()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(self._gate.limits.grace, self.abort)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _feed(self, data: bytes) -> None:
        if self._closing:
            return
        try:
            self._conn.receive_data(data)
        except RuntimeError:  # h11 refuses data after the end of input: nothing more to answer
            self.close()
            return
        self._answer()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and self._transport is not None and not self._closing:
            self._reading_paused = False
            self._transport.resume_reading()

    def _next_turn(self) -> None:
        self._scheduled = False
        self._answer()

    def _answer(self) -> None:
        """Act on h11's events until it needs data, the write buffer is full or the turn's budget is spent."""
        answered = 0
        while self._transport is not None and not self._closing:
            if self._write_paused:
                self._pause_reading()
                return
            if answered >= MAX_REQUESTS_PER_TURN:
                self._pause_reading()
                if not self._scheduled:
                    self._scheduled = True
                    asyncio.get_running_loop().call_soon(self._next_turn)
                return
            try:
                event = self._conn.next_event()
            except h11.RemoteProtocolError as exc:
                self._refuse(exc)
                return
            if event is h11.NEED_DATA:
                if self._conn.their_state is h11.CLOSED:
                    self.close()
                    return
                self._resume_reading()
                return
            if event is h11.PAUSED:
                if self._conn.our_state is h11.MUST_CLOSE or self._conn.their_state is not h11.DONE:
                    self.close()
                    return
                self._conn.start_next_cycle()
                continue
            if isinstance(event, h11.Request):
                self._request, self._body = event, 0
                declared = self._declared_length(event)
                if declared is not None and declared > MAX_BODY:
                    self._send(Response.text("request body too large\n", 413), close=True)
                    return
            elif isinstance(event, h11.Data):
                self._body += len(event.data)
                if self._body > MAX_BODY:
                    self._send(Response.text("request body too large\n", 413), close=True)
                    return
            elif isinstance(event, h11.EndOfMessage):
                request, self._request = self._request, None
                assert request is not None
                answered += 1
                answer = route(self._server.routes, self._request_of(request))
                self._send(answer, close=False, head_only=request.method == b"HEAD")
            elif isinstance(event, h11.ConnectionClosed):
                self.close()
                return

    @staticmethod
    def _declared_length(event: h11.Request) -> int | None:
        for name, value in event.headers:
            if name == b"content-length":
                return int(value)  # h11 has checked it is one non-negative integer
        return None

    def _request_of(self, event: h11.Request) -> Request:
        path, query = parse_target(event.target)
        headers: dict[str, str] = {}
        for name, value in event.headers:
            headers.setdefault(name.decode("ascii"), value.decode("latin-1"))
        return Request(event.method.decode("ascii", "replace"), path, query, headers, self._peer)

    def _send(self, response: Response, *, close: bool, head_only: bool = False) -> None:
        transport = self._transport
        assert transport is not None
        try:
            parts = [self._conn.send(_head(response, close))]
            if response.body and not head_only:
                parts.append(self._conn.send(h11.Data(data=response.body)))
            parts.append(self._conn.send(h11.EndOfMessage()))
        except h11.LocalProtocolError:  # h11 refuses to answer in this state: give the peer up
            log.debug("cannot answer %s in state %s", self._peer, self._conn.states)
            self.abort()
            return
        transport.write(b"".join(part for part in parts if part))
        if response.then is not None:
            response.then()
        if close or self._conn.our_state is h11.MUST_CLOSE:  # ours to close, or the client's "Connection: close"
            self.close()

    def _refuse(self, exc: h11.RemoteProtocolError) -> None:
        """Rule 3: 400 or 431 and a close; one log line without the request's bytes."""
        log.info("refused a malformed request from %s (%s, %s)", self._peer, type(exc).__name__, exc.error_status_hint)
        if self._conn.our_state in (h11.IDLE, h11.SEND_RESPONSE) and self._transport is not None:
            self._transport.write(_TOO_LARGE if exc.error_status_hint == 431 else _BAD_REQUEST)
        self.close()


class HttpServer:
    """One listening address served from a route table, behind a :class:`ConnectionGate`."""

    def __init__(self, routes: Routes, limits: ConnectionLimits) -> None:
        self.routes = routes
        self.gate = ConnectionGate(limits)
        self.connections: set[_HttpConnection] = set()
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int, *, reuse_port: bool = False, ipv6: bool = False) -> None:
        """Listen on ``host:port`` (OSError if it cannot). With ``ipv6``, a wildcard IPv4 ``host`` on a fixed port
        is also served on ``[::]:port`` (a separate IPv6-only socket, as ztunnel binds its stats and readiness
        ports when IPv6 is on); a namespace without IPv6 gets the IPv4 socket only."""
        loop = asyncio.get_running_loop()
        if ipv6 and host == "0.0.0.0" and port:
            try:
                self._server = await loop.create_server(
                    lambda: _HttpConnection(self), ["0.0.0.0", "::"], port, reuse_address=True,
                    reuse_port=reuse_port or None,
                )  # fmt: skip
                return
            except OSError as exc:
                log.debug("no IPv6 listener on [::]:%d (%s): IPv4 only", port, exc.strerror or exc)
        self._server = await loop.create_server(
            lambda: _HttpConnection(self), host, port, reuse_address=True, reuse_port=reuse_port or None
        )

    @property
    def families(self) -> list[int]:
        """The address families it listens in (AF_INET, and AF_INET6 with an IPv6 socket), sorted."""
        return sorted(int(sock.family) for sock in (self._server.sockets if self._server is not None else ()))

    @property
    def port(self) -> int | None:
        if self._server is None or not self._server.sockets:
            return None
        return int(self._server.sockets[0].getsockname()[1])

    async def aclose(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for connection in list(self.connections):
            connection.close()
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                while self.connections:  # noqa: ASYNC110 - connection_lost empties the set
                    await asyncio.sleep(0.01)
        except TimeoutError:
            for connection in list(self.connections):
                connection.abort()
        await server.wait_closed()
