"""Request mirroring (Gateway API ``RequestMirror``): a copy of a request to another backend, its answer dropped.

Theory of operation: for each ``(backend, request)`` of :attr:`~ambit.waypoint.decisions.Forward.mirrors`,
:func:`start_mirrors` starts a task that sends the copy to one endpoint of the mirror backend over the same kind
of kept HTTP/1.1 connection as the real request, reads the whole answer and drops it. As Envoy's shadowing does,
the copy's authority gets a ``-shadow`` suffix, and nothing about the mirror (not even its failure) reaches the
client: it is logged at debug level only. A hostname endpoint (a DNS ServiceEntry's) is resolved in the IP version
of the address the client called, as the request's own endpoint is.

Rules: only requests without a body are mirrored (a body would have to be held for the copy: TODO); at most
:data:`MAX_MIRRORS_IN_FLIGHT` copies run at once per waypoint, more are skipped; each copy is bounded by the
waypoint's ``connect_timeout`` plus ``idle_timeout`` per read.
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
from ambit.waypoint.http1 import MessageEnded, Signal

log = logging.getLogger("ambit.waypoint.mirror")

MAX_MIRRORS_IN_FLIGHT = 256


def start_mirrors(
    ctx: WaypointContext, tunnel: Tunnel, mirrors: tuple[tuple[BackendService, RequestHead], ...], has_body: bool
) -> int:
    """Start the copies; returns how many were started."""
    if not mirrors:
        return 0
    if has_body:
        log.debug("mirror skipped: the request has a body")
        return 0
    started = 0
    for backend, request in mirrors:
        running = ctx.background
        if len(running) >= MAX_MIRRORS_IN_FLIGHT:
            log.debug("mirror skipped: %d copies in flight", len(running))
            break
        shadow = dataclasses.replace(request, authority=_shadow(request.authority))
        task = asyncio.get_running_loop().create_task(_mirror(ctx, tunnel, backend, shadow))
        running.add(task)
        task.add_done_callback(running.discard)
        started += 1
    return started


def _shadow(authority: str) -> str:
    host, sep, port = authority.rpartition(":")
    if (sep and port.isdigit() and not host.endswith("]")) or (sep and host.endswith("]")):
        return f"{host}-shadow:{port}"
    return f"{authority}-shadow"


async def _mirror(ctx: WaypointContext, tunnel: Tunnel, backend: BackendService, request: RequestHead) -> None:
    service = find_backend_service(ctx.state, backend)
    planned = ctx.routes.plan_backend(backend)
    if isinstance(planned, Refusal):
        log.debug("mirror to %s: %s", backend.service_key, planned.reason)
        return
    endpoint = pick_endpoint(ctx.state, service, backend.port, ctx.choose, only=planned.members) if service else None
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
            await up.stream.write(up.http.send_request(request) + up.http.end_request())
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
