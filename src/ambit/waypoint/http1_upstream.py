"""The upstream end of a forwarded request over HTTP/1.1: one exchange on a kept (or new) connection.

Theory of operation: :func:`http1_connector` gives the :data:`~ambit.waypoint.upstream.Connector` of HTTP/1.1
requests: it takes a kept connection to the endpoint (or opens one, or always opens one when asked for a fresh
one) and wraps it in an :class:`Http1Upstream`, which frames the request with the h11 client side, writes it
(a write the endpoint does not take within ``idle_timeout`` fails), reads the response events (each read bounded
by ``idle_timeout``; reads and writes through the connection's :class:`~ambit.waypoint.idle.OperationBound`) and,
after a clean exchange, puts the connection back for reuse when h11 says it can carry another request.
"""

from __future__ import annotations

from collections.abc import Iterable

from ambit.waypoint.context import Tunnel, WaypointContext
from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.destinations import Endpoint
from ambit.waypoint.http1 import Event, Signal
from ambit.waypoint.upstream import Connector, UpstreamExchange, UpstreamHttp


class Http1Upstream:
    """One request and its response on an upstream HTTP/1.1 connection."""

    __slots__ = ("conn", "ctx")

    def __init__(self, ctx: WaypointContext, conn: UpstreamHttp) -> None:
        self.ctx, self.conn = ctx, conn

    @property
    def duplex(self) -> bool:
        return False

    @property
    def reused(self) -> bool:
        return self.conn.reused

    async def _write(self, data: bytes) -> None:
        if data:
            conn = self.conn
            await conn.writes.run(conn.stream.write(data), self.ctx.limits.idle_timeout)

    async def send_request(self, head: RequestHead, *, upgrade: bool = False, body: bool = False) -> None:
        await self._write(self.conn.http.send_request(head, upgrade=upgrade, body=body))

    async def send_body(self, data: bytes) -> None:
        await self._write(self.conn.http.send_body(data))

    async def end_request(self, trailers: Iterable[tuple[str, str]] = ()) -> None:
        await self._write(self.conn.http.end_request(trailers))

    async def next_event(self) -> Event:
        conn = self.conn
        while (event := conn.http.next_event()) is Signal.NEED_DATA:
            data = await conn.reads.run(conn.stream.read(), self.ctx.limits.idle_timeout)
            conn.http.receive_data(data)
        return event

    def next_event_nowait(self) -> Event | None:
        event = self.conn.http.next_event()
        return None if event is Signal.NEED_DATA else event

    def abort(self) -> None:
        self.conn.discard()

    def finish(self, now: float) -> None:
        conn = self.conn
        conn.requests += 1
        limit = conn.key[3].max_requests_per_connection  # a DestinationRule's maxRequestsPerConnection
        if conn.http.next_cycle() and not (limit and conn.requests >= limit):
            self.ctx.upstreams.put_idle(conn, now)
        else:
            conn.discard()


def http1_connector(ctx: WaypointContext, tunnel: Tunnel) -> Connector:
    """The connector of HTTP/1.1 tries: a kept connection to the endpoint, unless ``fresh``, else a new one."""

    async def connect(endpoint: Endpoint, fresh: bool) -> UpstreamExchange:
        upstreams = ctx.upstreams
        conn = (None if fresh else upstreams.take_idle(endpoint)) or await upstreams.open_http(
            endpoint, tunnel.peer_addr
        )
        return Http1Upstream(ctx, conn)

    return connect
