"""TCP through the waypoint: one endpoint per connection, bytes relayed both ways (and after an HTTP upgrade).

Theory of operation: :func:`relay` copies two pull-mode byte streams into each other, one task per direction:
EOF is passed on as a half-close, a failure on either side aborts both, and the relay ends when both directions
are done. A direction waiting longer than ``idle_timeout`` for bytes gives up only if the other direction was
quiet that long too (a connection is idle when nothing moves either way). The tunnels here were read in pull mode
(sniffing, HTTP), so the node proxy's callback splice (which needs push mode from the start) does not apply.

:func:`serve_tcp` is a TCP tunnel: pick one endpoint of the addressed Service (or the addressed workload), open a
stream to it, relay, and account for it as the node proxy does (``istio_tcp_*`` with reporter="waypoint", one
access-log line). The policies bound to the waypoint are checked once, before an endpoint is reached
(:func:`ambit.waypoint.authorization.check_connection`): a denied tunnel is refused 401 (or closed) with flag
``DENY``; before them, a CUSTOM policy's gRPC authorizer (:mod:`ambit.waypoint.ext_authz` rule 10), whose denial
refuses it with flag ``UAEX``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging

from ambit.model.extauthz import ProviderKind
from ambit.model.routes import BackendService
from ambit.model.workload import Service
from ambit.proxy.accounting import Accounting
from ambit.proxy.errors import ResponseFlag
from ambit.proxy.hbone_server import TunnelResponder
from ambit.proxy.streams import ByteStream
from ambit.telemetry.accesslog import ConnectionRecord
from ambit.waypoint.authorization import check_connection, connection_of, denial_detail
from ambit.waypoint.context import Tunnel, WaypointContext
from ambit.waypoint.destinations import (
    PLAIN,
    Endpoint,
    Refusal,
    ServiceTarget,
    choose_weighted,
    find_backend_service,
    in_dialled_family,
    original_destination,
)
from ambit.waypoint.ext_authz import CheckDenied, DeniedOutright
from ambit.waypoint.ext_authz_client import fetch_connection_verdict
from ambit.waypoint.traffic_policy import DEFAULT as DEFAULT_BACKEND
from ambit.waypoint.traffic_policy import Admission, BackendPolicy
from ambit.waypoint.upstream import UpstreamConnectError, UpstreamDnsError

log = logging.getLogger("ambit.waypoint.tcp")


class _Activity:
    __slots__ = ("last",)

    def __init__(self, now: float) -> None:
        self.last = now


async def _pump(
    src: ByteStream, dst: ByteStream, activity: _Activity, idle_timeout: float, counter: list[int], index: int
) -> None:
    loop = asyncio.get_running_loop()
    while True:
        try:
            async with asyncio.timeout(idle_timeout):
                data = await src.read()
        except TimeoutError:
            if loop.time() - activity.last >= idle_timeout:
                raise
            continue
        if not data:
            dst.write_eof()
            return
        activity.last = loop.time()
        counter[index] += len(data)
        await dst.write(data)


async def relay(downstream: ByteStream, upstream: ByteStream, idle_timeout: float) -> tuple[int, int, str]:
    """Copy both ways until both are done; returns (bytes up, bytes down, error or "")."""
    counter = [0, 0]
    activity = _Activity(asyncio.get_running_loop().time())
    up = asyncio.ensure_future(_pump(downstream, upstream, activity, idle_timeout, counter, 0))
    down = asyncio.ensure_future(_pump(upstream, downstream, activity, idle_timeout, counter, 1))
    error = ""
    try:
        for task in asyncio.as_completed((up, down)):
            try:
                await task
            except TimeoutError:
                error = "idle timeout"
                break
            except Exception as exc:
                error = str(exc) or type(exc).__name__
                break
    finally:
        if error or not (up.done() and down.done()):
            downstream.abort()
            upstream.abort()
        for task in (up, down):
            task.cancel()
        for task in (up, down):
            with contextlib.suppress(BaseException):
                await task
    return counter[0], counter[1], error


def _fail(downstream: ByteStream | TunnelResponder) -> None:
    if isinstance(downstream, TunnelResponder):
        downstream.reject(503)
    else:
        downstream.abort()


async def _external_authorization(ctx: WaypointContext, tunnel: Tunnel) -> tuple[str, ResponseFlag] | None:
    """The CUSTOM step for a TCP connection (:mod:`ambit.waypoint.ext_authz` rule 10): why it is refused, or None."""
    custom = ctx.authorizer.custom(ctx.routes.current, tunnel.service_key)
    if custom is None:
        return None
    step = custom.step(connection_of(tunnel), None)
    if isinstance(step, DeniedOutright):
        return f"rbac_access_denied_matched_policy[{step.policy}]: several CUSTOM providers", ResponseFlag.DENY
    if step is None or step.kind is not ProviderKind.GRPC:
        return None
    verdict = await fetch_connection_verdict(ctx, tunnel, step)
    if isinstance(verdict, CheckDenied):
        return verdict.reason, ResponseFlag.UNAUTHORIZED_EXTERNAL
    return None


def _deny(downstream: ByteStream | TunnelResponder) -> None:
    """A denied TCP tunnel: 401 to a CONNECT not yet answered (as ztunnel answers), else closed."""
    if isinstance(downstream, TunnelResponder):
        downstream.reject(401)
    else:
        downstream.abort()


def endpoint_for(ctx: WaypointContext, tunnel: Tunnel) -> tuple[Endpoint | None, BackendPolicy | None]:
    """The endpoint of one TCP connection: for a Service, by its attached TLSRoute's or TCPRoute's weighted backends
    when it has one (a backend that did not resolve, or all weights 0, is no endpoint), else an endpoint of the Service
    itself, each as the Service's DestinationRule says (returned too, for its connection limits); for a workload,
    that workload."""
    target = tunnel.target
    if not isinstance(target, ServiceTarget):
        return Endpoint(target.workload, target.ip, target.port, None), None
    table = ctx.routes.find_table(target.service.key, target.port)
    if table is None or not table.tcp_backends:
        endpoint, planned = _pick(ctx, tunnel, target.backend, target.service)
        if endpoint is None:
            endpoint = original_destination(target)  # a PASSTHROUGH Service: where the client sent it
        return in_dialled_family(endpoint, target), planned
    chosen = choose_weighted(table.tcp_backends, ctx.random())
    if chosen is None or chosen.backend is None:
        return None, None
    service = find_backend_service(ctx.state, chosen.backend)
    if service is None:
        return None, None
    endpoint, planned = _pick(ctx, tunnel, chosen.backend, service)
    return in_dialled_family(endpoint, target), planned


def _pick(
    ctx: WaypointContext, tunnel: Tunnel, backend: BackendService, service: Service
) -> tuple[Endpoint | None, BackendPolicy | None]:
    picked = pick_connection_endpoint(ctx, backend, service, tunnel.peer_addr)
    if isinstance(picked, Refusal):
        log.info("tcp %s: %s", tunnel.authority, picked.reason)
        return None, None
    return picked


def pick_connection_endpoint(
    ctx: WaypointContext, backend: BackendService, service: Service, peer_addr: str
) -> tuple[Endpoint | None, BackendPolicy | None] | Refusal:
    """An endpoint for one connection to ``backend``, by ``ctx.pick``, as its DestinationRule says
    (:func:`~ambit.waypoint.traffic_policy.plan_backend`: the subset, the load balancer with the client's address
    ``peer_addr`` as the source IP, TLS origination and the PROXY header), with the plan when a rule applies (its
    connection limits); a subset no rule defines is a :class:`Refusal`."""
    planned = ctx.routes.plan_backend(backend)
    if isinstance(planned, Refusal):
        return planned
    mesh = ctx.routes.current.mesh_locality
    if planned is DEFAULT_BACKEND:
        locality = planned.locality(ctx.random, mesh)
        return ctx.pick(ctx.state, service, backend.port, ctx.choose, near=ctx.near(), locality=locality), None
    source_ip = peer_addr.rpartition(":")[0].strip("[]")
    choose = ctx.balancer.chooser(
        planned.policy.load_balancer, planned.balance_key, ctx.choose, ctx.random, source_ip=source_ip
    )
    endpoint = ctx.pick(
        ctx.state,
        service,
        backend.port,
        choose,
        only=planned.members,
        near=ctx.near(),
        locality=planned.locality(ctx.random, mesh),
    )
    if endpoint is None or planned.transport == PLAIN:
        return endpoint, planned
    return dataclasses.replace(endpoint, transport=dataclasses.replace(planned.transport, h2=False)), planned


async def serve_tcp(
    ctx: WaypointContext, tunnel: Tunnel, downstream: ByteStream | TunnelResponder, prefix: bytes = b""
) -> None:
    """Relay one TCP tunnel to one endpoint. ``downstream`` is the accepted tunnel (after sniffing; ``prefix``
    holds the bytes read meanwhile), or the CONNECT's responder for a port declared TCP: the endpoint is then
    reached first and the CONNECT answered 200 only once it is, 503 if it cannot be (as ztunnel answers)."""
    endpoint, planned = endpoint_for(ctx, tunnel)
    await relay_to(ctx, tunnel, endpoint, downstream, prefix, planned)


async def relay_to(
    ctx: WaypointContext,
    tunnel: Tunnel,
    endpoint: Endpoint | None,
    downstream: ByteStream | TunnelResponder,
    prefix: bytes = b"",
    planned: BackendPolicy | None = None,
) -> None:
    """:func:`serve_tcp` with the endpoint already chosen (None: there is none, the connection is refused) and the
    DestinationRule plan it was chosen by (its connection limits apply), if any."""
    service = endpoint.service if endpoint is not None else None
    if service is None and isinstance(tunnel.target, ServiceTarget):
        service = tunnel.target.service
    labels = tunnel.labels(endpoint.workload if endpoint else None, service, protocol="tcp")
    record = ConnectionRecord(
        direction="inbound",
        src_addr=tunnel.peer_addr,
        dst_addr=endpoint.address if endpoint else "",
        dst_hbone_addr=tunnel.authority,
        src_workload=tunnel.source.name if tunnel.source else "",
        src_namespace=tunnel.source.namespace if tunnel.source else "",
        src_identity=str(tunnel.peer_identity),
        dst_service=service.hostname if service else "",
        dst_workload=endpoint.workload.name if endpoint else "",
        dst_namespace=endpoint.workload.namespace if endpoint else "",
        dst_identity=str(endpoint.workload.identity) if endpoint else "",
    )
    accounting = Accounting(ctx.metrics, ctx.access_log, labels, record, ctx.clock)
    refused = await _external_authorization(ctx, tunnel)
    if refused is not None:
        accounting.failed(*refused)
        _deny(downstream)
        return
    decision = check_connection(ctx, tunnel)
    if not decision.allowed:
        accounting.failed(denial_detail(decision), ResponseFlag.DENY)
        _deny(downstream)
        return
    if endpoint is None:
        accounting.failed("no healthy upstream", ResponseFlag.NO_ROUTE)
        _fail(downstream)
        return
    pool = planned.policy.connection_pool if planned is not None else None
    if planned is None or pool is None:
        await _connect_and_relay(ctx, tunnel, downstream, prefix, endpoint, accounting)
        return
    key = planned.balance_key
    if ctx.balancer.admit(key, pool, http1=True, can_wait=False) is not Admission.GO:
        accounting.failed("upstream overflow (DestinationRule connection pool)", ResponseFlag.OVERFLOW)
        _fail(downstream)
        return
    ctx.balancer.enter(key)
    try:
        await _connect_and_relay(ctx, tunnel, downstream, prefix, endpoint, accounting)
    finally:
        ctx.balancer.leave(key)


async def _connect_and_relay(
    ctx: WaypointContext,
    tunnel: Tunnel,
    downstream: ByteStream | TunnelResponder,
    prefix: bytes,
    endpoint: Endpoint,
    accounting: Accounting,
) -> None:
    try:
        upstream = await ctx.upstreams.open_stream(endpoint, tunnel.peer_addr)
    except UpstreamConnectError as exc:
        flag = ResponseFlag.DNS_FAILED if isinstance(exc, UpstreamDnsError) else ResponseFlag.CONNECT
        accounting.failed(str(exc), flag)
        _fail(downstream)
        return
    if isinstance(downstream, TunnelResponder):
        downstream = downstream.accept()
    accounting.opened()
    try:
        if prefix:
            await upstream.write(prefix)
            accounting.up(len(prefix))
        up, down, error = await relay(downstream, upstream, ctx.limits.idle_timeout)
        accounting.up(up)
        accounting.down(down)
    except Exception as exc:
        error = str(exc) or type(exc).__name__
        downstream.abort()
        upstream.abort()
    accounting.finish(error)
    with contextlib.suppress(Exception):
        await upstream.aclose()
