"""Request mirroring (Gateway API ``RequestMirror``, VirtualService ``mirror``): a copy of a request to another
backend, its answer dropped.

Theory of operation: for each ``(backend, request)`` of :attr:`~ambit.waypoint.decisions.Forward.mirrors`,
:func:`start_mirrors` starts a task that sends the copy to one endpoint of the mirror backend over the same kind
of kept HTTP/1.1 connection as the real request, reads the whole answer and drops it. The copy is sent as the
router made it (with Envoy's ``-shadow`` suffix on its authority: :mod:`ambit.waypoint.routing` rule 8; not added a
second time here), and nothing about the mirror (not even its failure) reaches the client: it is logged at debug
level only. A hostname endpoint (a DNS ServiceEntry's) is resolved in the IP version
of the address the client called, as the request's own endpoint is.

Rules:

1. A request with a body is read through a :class:`BodyTee` (what :func:`start_mirrors` returns in place of the
   client's side): the real request's forwarding reads the body as always, and the tee keeps a copy of what passed,
   at most :data:`MAX_MIRROR_BODY` bytes (and :data:`MAX_MIRROR_BODIES` for all requests at once). Once the body
   has ended the copies go out, the whole body in one piece with its trailers; a larger body (or one over the
   process's bound), or one that broke off, is not mirrored (counted nowhere but the debug log), and neither is a
   body the real request never read within the waypoint's ``idle_timeout``.
2. A gRPC call is not mirrored: the copies go over HTTP/1.1, which a gRPC server does not take.
3. At most :data:`MAX_MIRRORS_IN_FLIGHT` copies run at once per waypoint, more are skipped; each copy is bounded by
   the waypoint's ``connect_timeout`` plus ``idle_timeout`` per read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from ambit.errors import AmbitError
from ambit.model.routes import BackendService
from ambit.waypoint.context import Tunnel, WaypointContext
from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.destinations import (
    PLAIN,
    Refusal,
    ServiceTarget,
    find_backend_service,
    in_dialled_family,
    pick_endpoint,
)
from ambit.waypoint.downstream import RequestSide, SideWrapper
from ambit.waypoint.http1 import BodyData, Event, MessageEnded, Signal

log = logging.getLogger("ambit.waypoint.mirror")

MAX_MIRRORS_IN_FLIGHT = 256
MAX_MIRROR_BODY = 1024 * 1024
"""Bytes of a request body kept for its copies (rule 1)."""
MAX_MIRROR_BODIES = 16 * 1024 * 1024
"""Bytes of bodies kept for copies at once in the process (rule 1): many large mirrored requests at once cost the
waypoint at most this much, more are forwarded unmirrored."""

Body = tuple[bytes, tuple[tuple[str, str], ...]]
"""A whole request body and its trailers."""


class BodyTee(SideWrapper):
    """The client's side of one request, keeping a copy of the body its forwarding reads (rule 1)."""

    __slots__ = ("_chunks", "_size", "body")

    held = 0
    """Bytes kept by every tee of the process (bounded by :data:`MAX_MIRROR_BODIES`)."""

    def __init__(self, down: RequestSide) -> None:
        super().__init__(down)
        self._chunks: list[bytes] = []
        self._size = 0
        self.body: asyncio.Future[Body | None] = asyncio.get_running_loop().create_future()
        """The whole body once it has ended; None when it will not be mirrored."""

    async def next_event(self, *, head: bool = False) -> Event:
        try:
            event = await self._down.next_event(head=head)
        except BaseException:
            self.give_up()
            raise
        if self.body.done():
            return event
        if isinstance(event, BodyData):
            size = len(event.data)
            if self._size + size > MAX_MIRROR_BODY or BodyTee.held + size > MAX_MIRROR_BODIES:
                self.give_up()
            else:
                self._size += size
                BodyTee.held += size
                self._chunks.append(event.data)
        elif isinstance(event, MessageEnded):
            self.body.set_result((b"".join(self._chunks), tuple(event.trailers)))
            self._release()
        else:
            self.give_up()
        return event

    def _release(self) -> None:
        BodyTee.held -= self._size
        self._size = 0
        self._chunks = []

    def give_up(self) -> None:
        """Keep nothing more: the body will not be mirrored."""
        self._release()
        if not self.body.done():
            self.body.set_result(None)


def start_mirrors(
    ctx: WaypointContext,
    tunnel: Tunnel,
    mirrors: tuple[tuple[BackendService, RequestHead], ...],
    down: RequestSide,
    has_body: bool,
) -> RequestSide:
    """Start the copies; the client's side to read the request through (a :class:`BodyTee` when the copies wait
    for its body, rule 1)."""
    if not mirrors:
        return down
    if (mirrors[0][1].header("content-type") or "").startswith("application/grpc"):
        log.debug("mirror skipped: a gRPC call (copies go over HTTP/1.1)")
        return down
    running = ctx.background
    if len(running) >= MAX_MIRRORS_IN_FLIGHT:
        log.debug("mirror skipped: %d copies in flight", len(running))
        return down
    tee = BodyTee(down) if has_body else None
    for backend, request in mirrors:
        if len(running) >= MAX_MIRRORS_IN_FLIGHT:
            log.debug("mirror skipped: %d copies in flight", len(running))
            break
        task = asyncio.get_running_loop().create_task(_mirror(ctx, tunnel, backend, request, tee))
        running.add(task)
        task.add_done_callback(running.discard)
    return tee if tee is not None else down


async def _mirror(
    ctx: WaypointContext,
    tunnel: Tunnel,
    backend: BackendService,
    request: RequestHead,
    tee: BodyTee | None,
) -> None:
    body: Body | None = None
    if tee is not None:
        try:
            body = await asyncio.wait_for(asyncio.shield(tee.body), ctx.limits.idle_timeout)
        except TimeoutError:  # the real request stopped reading its body: what was kept is given back
            tee.give_up()
        if body is None:
            log.debug("mirror to %s skipped: the body was not kept", backend.service_key)
            return
    service = find_backend_service(ctx.state, backend)
    planned = ctx.routes.plan_backend(backend)
    if isinstance(planned, Refusal):
        log.debug("mirror to %s: %s", backend.service_key, planned.reason)
        return
    endpoint = (
        pick_endpoint(
            ctx.state,
            service,
            backend.port,
            ctx.choose,
            only=planned.members,
            near=ctx.near(),
            locality=planned.locality(ctx.random, ctx.routes.current.mesh_locality),
        )
        if service
        else None
    )
    if endpoint is not None and planned.transport != PLAIN:  # a DestinationRule's TLS or PROXY header (HTTP/1.1)
        endpoint = dataclasses.replace(endpoint, transport=dataclasses.replace(planned.transport, h2=False))
    if isinstance(tunnel.target, ServiceTarget):  # a hostname endpoint: in the family the client dialled
        endpoint = in_dialled_family(endpoint, tunnel.target)
    if endpoint is None:
        log.debug("mirror to %s: no endpoint", backend.service_key)
        return
    up = None
    try:
        up = ctx.upstreams.take_idle(endpoint) or await ctx.upstreams.open_http(endpoint, tunnel.peer_addr)
        async with asyncio.timeout(ctx.limits.idle_timeout):
            if body is None:
                await up.stream.write(up.http.send_request(request) + up.http.end_request())
            else:
                data, trailers = body
                head = up.http.send_request(request, body=True)
                await up.stream.write(head + up.http.send_body(data) + up.http.end_request(trailers))
            while True:
                event = up.http.next_event()
                if event is Signal.NEED_DATA:
                    up.http.receive_data(await up.stream.read())
                elif isinstance(event, MessageEnded):
                    break
                elif event in (Signal.CLOSED, Signal.PAUSED):
                    raise AmbitError("mirror: the endpoint closed before answering")
    except (AmbitError, OSError) as exc:
        log.debug("mirror to %s failed: %s", backend.service_key, exc)
        if up is not None:
            up.stream.abort()
        return
    if up.http.next_cycle():
        ctx.upstreams.put_idle(up, ctx.clock())
    else:
        up.stream.abort()
