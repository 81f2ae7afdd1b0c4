"""Outbound (15001): a connection a pod opened, captured by its redirection rules (spec §6.3).

:func:`serve_outbound` carries out what :func:`ambit.proxy.plans.plan_outbound` decides, for one accepted socket
of local pod P:

1. The original destination comes from ``SO_ORIGINAL_DST``; P's workload from the state (waiting briefly for it to
   learn P). The plan says where the connection goes; among a Service's endpoints it picks in proportion to their
   capacity (:func:`~ambit.model.state.choose_by_capacity`, ztunnel's weighted choice).
2. :class:`~ambit.proxy.plans.Refuse`: reset, counted if the plan says so.
3. :class:`~ambit.proxy.plans.Local`: the destination pod is served by this proxy; the inbound side takes the
   connection as it would after a CONNECT to the chosen address (same checks, no TLS: both identities are ours),
   from P's address of that address's family, and both sides count it.
4. :class:`~ambit.proxy.plans.Tunnel`: a CONNECT stream on a pooled mutual-TLS connection to ``<pod IP>:15008``
   (or to a waypoint instance's HBONE listener, the CONNECT naming the original destination), made from P's netns
   with P's certificate, the server verified against the identities the plan expects (the destination's, or the
   waypoint's).
5. :class:`~ambit.proxy.plans.Plain`: a TCP connection from P's netns (the source stays P's IP). A plan naming a
   hostname endpoint first fetches an address for it (:class:`~ambit.proxy.hostnames.HostnameResolver`, an address
   of the original destination's family); a failed lookup fails the connection (reset, counted).
6. Bytes are relayed with half-close both ways; metrics (reporter=source) and one access-log line per connection.
7. A tunnel through a waypoint that fails before anything the pod sent has left (bytes flow only after a 200, so
   a second try cannot duplicate data) is planned again while the binding may be moving, for at most
   :data:`REPLAN_WAIT` seconds from the first failure and :data:`REPLAN_TRIES` tries in all:

   a. refused with 400 (the waypoint does not serve that destination: the binding moved, and one of the two ends
      heard of it first): the proxy waits for its state to change, at most a step (:data:`REPLAN_STEP` seconds,
      doubling), and plans again. A plan elsewhere (the new waypoint, another instance, straight to the
      destination) is tried; the same waypoint instance is tried again too, since it may be the end that had not
      heard yet.
   b. the waypoint could not be reached (refused, reset or timed out: it is going away, its Gateway deleted or
      its pod terminating): the proxy waits for a plan that goes elsewhere; the same instance is not dialled
      again.
   c. Anything else is final: other refusals (401 denied by policy, 503), a failure of a plan that is not through
      a waypoint, a new plan that refuses, the budget spent. The connection is counted once, where it last went.
8. On demand (``--xds-on-demand``), before planning, the proxy asks the control plane for what the state lacks:
   the destination's address, then the waypoints it names (:mod:`ambit.proxy.on_demand`). A lookup not answered
   within :data:`~ambit.proxy.context.DEMAND_WAIT` seconds fails the connection closed (reset, counted, ``NR``):
   planning a destination the proxy cannot see as unknown could send a meshed one plaintext. An answer of
   "nothing there" is an answer: the destination is outside the mesh and goes as it would in wildcard mode.
"""

from __future__ import annotations

import logging
import random
import socket
import sys
from collections.abc import Sequence

from ambit.errors import AmbitError
from ambit.hbone.headers import connect_headers, hostport
from ambit.model.state import Transport, choose_by_capacity
from ambit.model.workload import IPAddress, Workload
from ambit.proxy.accounting import Accounting, BothSides
from ambit.proxy.context import LocalPod, ProxyContext
from ambit.proxy.errors import ProxyConnectError, ProxyError, ResponseFlag
from ambit.proxy.hbone_client import HboneClient, TunnelRefusedError
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.hostnames import HostnameLookupError
from ambit.proxy.inbound import LocalDelivery, deliver_locally, guard
from ambit.proxy.on_demand import outbound_needs
from ambit.proxy.plans import HBONE_PORT, Local, OutboundFacts, Plain, Refuse, Tunnel, parse_ip, plan_outbound
from ambit.proxy.pool import PoolKey
from ambit.proxy.relay import Splice
from ambit.proxy.sockets import connect, original_dst, reset
from ambit.proxy.streams import SocketStream
from ambit.telemetry.accesslog import ConnectionRecord
from ambit.telemetry.metrics import Reporter

log = logging.getLogger("ambit.proxy.outbound")

REPLAN_WAIT = 2.0
"""Seconds from a connection's first failed try through a waypoint during which it may be planned again (rule 7)."""
REPLAN_STEP = 0.05
"""Seconds a connection refused as not served first waits for a state change before it is tried again (doubling)."""
REPLAN_TRIES = 6
"""Tries at most of one connection, the first included (rule 7)."""
_NOT_SERVED = 400
"""A waypoint's answer to a CONNECT for a destination it does not serve (:mod:`ambit.waypoint.destinations`)."""


def _choose(candidates: Sequence[Workload]) -> Workload:
    """An endpoint (or waypoint instance) in proportion to its capacity (a WorkloadEntry's ``weight``)."""
    return choose_by_capacity(candidates, random.random())


async def serve_outbound(ctx: ProxyContext, pod: LocalPod, sock: socket.socket) -> Splice | None:
    """Proxy one connection that pod ``pod`` opened; never raises for network or peer trouble.

    Returns once the relay runs on its own (a :class:`~ambit.proxy.relay.Splice`, which from then on owns ``sock``
    and does the closing bookkeeping when it ends), or None when the connection was refused or is over.
    """
    peer = sock.getpeername()[:2]  # an IPv6 peer comes with its flow label and scope too
    dst = original_dst(sock)
    if dst is None:
        log.warning("pod %s: outbound connection from %s without an original destination", pod.uid, peer)
        reset(sock)
        return None
    source = await ctx.wait_local_workload(pod)
    facts = OutboundFacts(parse_ip(dst[0]), dst[0], dst[1], source)
    if ctx.demand is not None and source is not None and not await _fetch_destination(ctx, facts):
        _account(ctx, pod, source, hostport(*peer[:2]), None, hostport(*dst)).failed(
            "the control plane did not answer the on-demand lookup in time", ResponseFlag.NO_ROUTE
        )  # rule 8: fail closed
        reset(sock)
        return None
    generation = ctx.state_generation
    plan = plan_outbound(facts, ctx.state, ctx.node, _choose, random.random)
    peer_addr, dst_addr = hostport(peer[0], peer[1]), hostport(dst[0], dst[1])
    if isinstance(plan, Refuse):
        if plan.counted and source is not None:  # counted refusals have their access-log line
            _account(ctx, pod, source, peer_addr, None, dst_addr).failed(plan.reason, plan.flag)
        else:
            log.warning("pod %s: refused %s -> %s: %s", pod.uid, peer_addr, dst_addr, plan.reason)
        reset(sock)
        return None
    assert source is not None  # only a refusal comes without a source
    accounting = _account(ctx, pod, source, peer_addr, plan, dst_addr)
    replans = _Replans(ctx, facts, plan, generation)
    with ctx.register("outbound", peer_addr, dst_addr, pod) as registration:
        try:
            upstream, delivery = None, None
            while upstream is None:
                try:
                    upstream, delivery = await _dial(ctx, pod, peer, peer_addr, plan, facts)
                except (TunnelRefusedError, ProxyConnectError) as exc:
                    moved = await replans.after(exc)  # rule 7
                    if moved is None:
                        raise
                    log.info(
                        "pod %s: %s -> %s: %s; planned again: to %s",
                        pod.uid,
                        peer_addr,
                        dst_addr,
                        exc,
                        hostport(*moved.address),
                    )
                    plan, accounting = moved, _account(ctx, pod, source, peer_addr, moved, dst_addr)
        except (AmbitError, OSError) as exc:
            accounting.failed(str(exc), exc.flag if isinstance(exc, ProxyError) else ResponseFlag.CONNECT)
            reset(sock)
            return None
        sides: Accounting | BothSides = accounting
        if delivery is not None:
            sides = BothSides((accounting, delivery.accounting))  # both sides count, and finish, this one
        accounting.opened()
        running = registration.splice(SocketStream(sock), upstream, sides)
        if delivery is not None:
            guard(ctx, running, delivery.dial)
        return running


async def _fetch_destination(ctx: ProxyContext, facts: OutboundFacts) -> bool:
    """Rule 8: ask for the destination, then for the waypoints it names, until the state has what the plan reads;
    False when an answer did not come in time."""
    asked: set[str] = set()
    for _ in range(3):  # the destination, its waypoints, (a waypoint named by address: its Service)
        needs = [
            n for n in outbound_needs(ctx.state, ctx.settings.network, facts.dst_ip, facts.source) if n not in asked
        ]
        if not needs:
            return True
        asked.update(needs)
        if not await ctx.fetch(needs):
            return False
    return True


async def _dial(
    ctx: ProxyContext,
    pod: LocalPod,
    peer: tuple[str, int],
    peer_addr: str,
    plan: Tunnel | Plain | Local,
    facts: OutboundFacts,
) -> tuple[SocketStream | HboneStream, LocalDelivery | None]:
    """The upstream side of ``plan`` (rules 3 to 5), and the local delivery when the destination is ours."""
    if isinstance(plan, Local):
        local_pod = ctx.find_local_pod(plan.workload.uid)
        if local_pod is None:
            raise ProxyConnectError(plan.address, "its pod is no longer served here")
        target_ip, port = plan.address
        source_ip = _source_like(facts.source, peer[0], target_ip)
        delivery = await deliver_locally(ctx, local_pod, source_ip, pod.identity, port, peer_addr, target_ip)
        return delivery.stream, delivery
    if isinstance(plan, Tunnel):
        return await _open_tunnel(ctx, pod, peer, peer_addr, plan), None
    if plan.hostname:
        address = await _resolve_endpoint(ctx, plan, facts.dst_ip)
        return SocketStream(await connect(pod.sockets, address)), None
    return SocketStream(await connect(pod.sockets, plan.address)), None


def _source_like(source: Workload | None, peer_ip: str, target_ip: str) -> str:
    """The client address a same-node delivery to ``target_ip`` comes from: the one the pod used, unless the target
    is of the other family (a Service VIP of one family whose chosen endpoint has only the other); then the pod's
    own address of the target's family, which a tunnel to that endpoint would have come from (else the peer's,
    and the inbound side delivers from the pod itself)."""
    if (":" in peer_ip) == (":" in target_ip) or source is None:
        return peer_ip
    version = 6 if ":" in target_ip else 4
    return next((str(ip) for ip in source.addresses if ip.version == version), peer_ip)


class _Replans:
    """Rule 7 for one connection: after a failed try through a waypoint, the plan to try next, or None."""

    def __init__(self, ctx: ProxyContext, facts: OutboundFacts, plan: Tunnel | Plain | Local, generation: int) -> None:
        self._ctx, self._facts, self._plan, self._generation = ctx, facts, plan, generation
        self._tries = 1
        self._step = REPLAN_STEP
        self._deadline: float | None = None

    async def after(self, failure: TunnelRefusedError | ProxyConnectError) -> Tunnel | Plain | Local | None:
        plan, ctx = self._plan, self._ctx
        if not isinstance(plan, Tunnel) or plan.waypoint is None or self._tries >= REPLAN_TRIES:
            return None
        not_served = isinstance(failure, TunnelRefusedError) and failure.status == _NOT_SERVED
        if isinstance(failure, TunnelRefusedError) and not not_served:
            return None  # rule 7c: denied by policy, or the waypoint cannot reach the destination
        now = ctx.clock()
        if self._deadline is None:
            self._deadline = now + REPLAN_WAIT
        while (left := self._deadline - ctx.clock()) > 0:
            await ctx.wait_state_change(self._generation, min(self._step, left) if not_served else left)
            self._generation = ctx.state_generation
            again = plan_outbound(self._facts, ctx.state, ctx.node, _choose, random.random)
            if isinstance(again, Refuse):
                return None
            same = isinstance(again, Tunnel) and (again.address, again.authority) == (plan.address, plan.authority)
            if same and not not_served:
                continue  # rule 7b: not that instance again; wait for the state to send us elsewhere
            self._step *= 2
            self._tries += 1
            self._plan = again
            return again
        return None


async def _resolve_endpoint(ctx: ProxyContext, plan: Plain, like: IPAddress) -> tuple[str, int]:
    """The address to dial for a hostname endpoint (rule 5); raises :class:`ProxyConnectError` when none."""
    if ctx.hostnames is None:
        raise ProxyConnectError(plan.address, "hostname endpoints are not resolved by this proxy")
    try:
        ip = await ctx.hostnames.fetch_address(plan.hostname, like)
    except HostnameLookupError as exc:
        raise ProxyConnectError(plan.address, str(exc)) from None
    return str(ip), plan.address[1]


async def _open_tunnel(
    ctx: ProxyContext, pod: LocalPod, peer: tuple[str, int], peer_addr: str, plan: Tunnel
) -> HboneStream:
    cert = ctx.certs.find(pod.identity)  # at hand (the common case): no coroutine to make and run
    if cert is None:
        cert = await ctx.certs.fetch(pod.identity)
    service = plan.destination.service
    headers = connect_headers(forwarded_for=peer_addr, host=service.hostname if service else None)

    async def dial() -> HboneClient:
        tcp = await connect(pod.sockets, plan.address)
        return await HboneClient.connect(
            tcp,
            cert,
            plan.expected,
            trust_domain=ctx.settings.trust_domain,
            revocation=ctx.revocation,
            tls_transport=ctx.settings.tls_transport,
        )

    key = PoolKey(pod.identity, plan.expected, peer[0], plan.address)
    return await ctx.pool.open_tunnel(key, plan.authority, headers, dial)


def _account(
    ctx: ProxyContext,
    pod: LocalPod,
    source: Workload,
    peer_addr: str,
    plan: Tunnel | Plain | Local | None,
    original_addr: str,
) -> Accounting:
    """The source side's accounting: the destination as the plan reports it (through a waypoint: the waypoint
    instance, for the original service), ``dst.addr`` the address dialled, ``dst.hbone_addr`` the CONNECT target."""
    destination = plan.destination if plan else None
    target = destination.workload if destination else None
    mtls = destination is not None and destination.transport is Transport.HBONE
    service = destination.service if destination else None
    labels = ctx.labels.labels(
        Reporter.SOURCE,
        source=source,
        source_identity=pod.identity,
        destination=target,
        service=service,
        mtls=mtls,
    )
    # Per destination, not per connection: interned, so connections to one destination share them.
    if isinstance(plan, Tunnel):
        dst_addr, hbone_addr = sys.intern(hostport(*plan.address)), sys.intern(plan.authority)
    elif isinstance(plan, Local):
        dst_addr = sys.intern(hostport(plan.address[0], HBONE_PORT))
        hbone_addr = sys.intern(hostport(*plan.address))
    elif plan is not None:
        dst_addr, hbone_addr = hostport(*plan.address), ""
    else:
        dst_addr, hbone_addr = original_addr, ""
    record = ConnectionRecord(
        direction="outbound",
        src_addr=peer_addr,
        dst_addr=dst_addr,
        dst_hbone_addr=hbone_addr,
        src_workload=source.name,
        src_namespace=source.namespace,
        src_identity=labels.source_principal,  # principal(pod.identity) with mutual TLS
        src_cluster=source.cluster_id,
        dst_service=service.hostname if service else "",
        dst_workload=target.name if target else "",
        dst_namespace=target.namespace if target else "",
        dst_identity=labels.destination_principal,  # principal(target.identity) with mutual TLS
        dst_cluster=target.cluster_id if target else "",
    )
    return Accounting(ctx.metrics, ctx.access_log, labels, record, ctx.clock)
