"""The upstream end of a forwarded request over HTTP/2: one stream on a shared connection to the endpoint.

Theory of operation: :func:`http2_connector` gives the :data:`~ambit.waypoint.upstream.Connector` of HTTP/2
requests (what an HTTP/2 client, gRPC included, sent the waypoint goes to the endpoint as HTTP/2, h2c with prior
knowledge inside the HBONE tunnel to it). It takes a live session to the endpoint with room for another stream
from the context's :class:`~ambit.waypoint.http2.Http2Pool`, or opens one (a tunnel by
:meth:`~ambit.waypoint.upstream.Upstreams.open_stream`, then our HTTP/2 client engine on it), so the requests of
many clients share one upstream connection per endpoint; ``fresh`` always opens a new one.

:class:`Http2Upstream` is one try: the request head on a new stream (pseudo-headers from the
:class:`~ambit.waypoint.decisions.RequestHead`, hop-by-hop headers dropped, ``te: trailers`` kept), the body and
trailers with flow control, the response events from the stream's channel. A stream the endpoint refused
(REFUSED_STREAM, or above its GOAWAY's last stream) or any reset before the response head is an upstream failure
the retry policy may retry; ``abort`` resets the stream (CANCEL), never the shared connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from ambit.hbone.errors import HboneError
from ambit.hbone.messages import Http2ClientConnection
from ambit.hbone.settings import HboneSettings
from ambit.waypoint.context import Tunnel, WaypointContext
from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.destinations import Endpoint
from ambit.waypoint.errors import HttpProtocolError
from ambit.waypoint.http1 import Event, forwardable
from ambit.waypoint.http2 import Http2Session, StreamChannel, spent
from ambit.waypoint.upstream import Connector, EndpointKey, UpstreamExchange, endpoint_key

UPSTREAM_SETTINGS = HboneSettings(stream_window=1024 * 1024, connection_window=4 * 1024 * 1024)
"""What an endpoint may send us before we take it: 1 MiB per stream, 4 MiB per connection."""


def request_fields(head: RequestHead) -> list[tuple[str, str]]:
    """The regular fields of ``head`` as HTTP/2 carries them: hop-by-hop dropped (``te: trailers`` kept)."""
    fields = forwardable(head.headers)
    if any(n == "te" and v.strip().lower() == "trailers" for n, v in head.headers):
        fields.append(("te", "trailers"))
    return fields


class Http2Upstream:
    """One request and its response on a stream of an upstream HTTP/2 session."""

    __slots__ = ("_channel", "_limit", "_reused", "session")

    def __init__(self, session: Http2Session, limit: int = 0) -> None:
        self.session = session
        self._reused = session.served > 0
        self._channel: StreamChannel | None = None
        self._limit = limit
        """The endpoint's ``maxRequestsPerConnection`` (0: none)."""

    @property
    def duplex(self) -> bool:
        return True

    @property
    def reused(self) -> bool:
        return self._reused

    def _stream(self) -> StreamChannel:
        if self._channel is None:
            raise HttpProtocolError("no request was sent", 502, upstream=True)
        return self._channel

    async def send_request(self, head: RequestHead, *, upgrade: bool = False, body: bool = False) -> None:
        conn = self.session.conn
        assert isinstance(conn, Http2ClientConnection)
        if not self.session.alive or not conn.can_open_stream:
            raise HttpProtocolError("the upstream connection has no room for a stream", 503, upstream=True)
        try:
            stream_id = conn.send_request(head.method, head.scheme, head.authority, head.path, request_fields(head))
        except HboneError as exc:  # a (rewritten) request HTTP/2 cannot carry: the client's
            raise HttpProtocolError(f"request cannot be forwarded: {exc}") from None
        self._channel = self.session.open_channel(stream_id)
        await self.session.flush()

    async def send_body(self, data: bytes) -> None:
        if data:
            await self.session.send_data(self._stream().stream_id, data)

    async def end_request(self, trailers: Iterable[tuple[str, str]] = ()) -> None:
        channel = self._stream()
        try:
            self.session.conn.send_trailers(channel.stream_id, forwardable(tuple(trailers)))
        except HboneError as exc:
            raise HttpProtocolError(f"request trailers cannot be forwarded: {exc}") from None
        await self.session.flush()

    async def next_event(self) -> Event:
        return await self._stream().next_event()

    def next_event_nowait(self) -> Event | None:
        return self._stream().next_event_nowait()

    def abort(self) -> None:
        if self._channel is not None:
            self.session.reset(self._channel.stream_id)
            self._channel = None

    def finish(self, now: float) -> None:
        """The response is complete; a request body still being sent (a duplex call the endpoint ended first) is
        cut off with RST_STREAM(CANCEL), so the stream leaves the table and frees its slot. The last request of a
        session that served its ``maxRequestsPerConnection`` retires it."""
        if self._channel is not None:
            stream_id, self._channel = self._channel.stream_id, None
            if self.session.conn.is_open(stream_id):
                self.session.reset(stream_id)
            else:
                self.session.close_channel(stream_id)
        if spent(self.session, self._limit) and not self.session.channels:
            self.session.retire("max requests per connection")


def http2_connector(ctx: WaypointContext, tunnel: Tunnel) -> Connector:
    """The connector of HTTP/2 tries: a stream on a shared session to the endpoint (a new one when ``fresh``)."""

    async def connect(endpoint: Endpoint, fresh: bool) -> UpstreamExchange:
        key = endpoint_key(endpoint)
        pool = ctx.http2
        limit = endpoint.transport.max_requests_per_connection
        if not fresh:
            session = pool.find(key, limit)
            if session is None and (opening := pool.opening.get(key)) is not None:
                with contextlib.suppress(Exception):  # another request's dial: share it if it works out
                    await asyncio.shield(opening)
                session = pool.find(key, limit)
            if session is not None:
                return Http2Upstream(session, limit)
        return Http2Upstream(await _dial(ctx, tunnel, endpoint, key, register=not fresh), limit)

    return connect


async def _dial(
    ctx: WaypointContext, tunnel: Tunnel, endpoint: Endpoint, key: EndpointKey, *, register: bool
) -> Http2Session:
    """A new session to ``endpoint``, kept in the pool; while it is being opened, other requests to the endpoint
    wait for it instead of dialling their own (``register``)."""
    pool = ctx.http2
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    if register:
        pool.opening[key] = done
    try:
        stream = await ctx.upstreams.open_stream(endpoint, tunnel.peer_addr)
        name = f"waypoint h2 upstream {endpoint.ip}:{endpoint.port}"
        session = Http2Session(
            Http2ClientConnection(UPSTREAM_SETTINGS), stream, idle_timeout=ctx.limits.idle_timeout, name=name
        )
        pool.add(key, session)
        return session
    finally:
        done.set_result(None)
        if pool.opening.get(key) is done:
            del pool.opening[key]
