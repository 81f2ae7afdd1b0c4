"""Inbound: HBONE on 15008 (spec §6.5), plaintext on 15006 (spec §6.6), and the same-node fast path.

The three handlers carry out what :func:`ambit.proxy.plans.plan_inbound` decides (authority, workload, port mapping,
authorization; :func:`~ambit.proxy.plans.plan_plaintext` also refuses the proxy's own ports). A
:class:`~ambit.proxy.plans.Dial` ends in :func:`_dial_pod`: a TCP connection made inside the destination pod's
netns to ``<pod IP>:<port>``, bound to the *client's* IP (``IP_TRANSPARENT``; the pod's connmark rules route the
replies back to us), so the application sees its real peer; a failed dial answers 503 (``CONNECT``). A dial with
a PROXY application tunnel (plans inbound rule 6) goes to loopback from loopback instead and writes its header
before the relay starts (a failed write is a failed dial).

- HBONE: the TLS server uses the local pod's own certificate (the listener tells us which pod: one 15008 listener
  per pod, so the certificate is chosen by the original destination, not by SNI); the client certificate must
  chain to our root and carry a SPIFFE identity of our trust domain. Each CONNECT is planned with its
  ``:authority`` and the peer's identity; a refusal answers its status (400, 401, 503).
- Plaintext: planned with no peer identity; a refusal resets the connection.
- Same-node fast path (:func:`deliver_locally`): the outbound side already knows both pods and both identities,
  so it skips TLS and HTTP/2 but runs the same plan.

Metrics are reported with ``reporter=destination``; principals only for mutual TLS.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import sys
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ambit.errors import AmbitError
from ambit.hbone.headers import hostport
from ambit.model.identity import SpiffeId
from ambit.model.workload import IPAddress
from ambit.proxy.accounting import Accounting
from ambit.proxy.admission import DEFAULT_HANDSHAKE_TIMEOUT, Ticket
from ambit.proxy.context import ConnectionEnd, LocalPod, ProxyContext
from ambit.proxy.errors import ProxyError, ResponseFlag
from ambit.proxy.hbone_server import HboneServer, InboundRequest, TunnelResponder
from ambit.proxy.on_demand import address_alias
from ambit.proxy.plans import ILLEGAL_PORTS, Dial, InboundFacts, Refuse, parse_ip, plan_inbound, plan_plaintext
from ambit.proxy.relay import Splice, splice
from ambit.proxy.sockets import connect, original_dst, reset
from ambit.proxy.streams import SocketStream
from ambit.telemetry.accesslog import ConnectionRecord
from ambit.telemetry.metrics import Reporter

if TYPE_CHECKING:
    from ambit.tls.workload import WorkloadCertificate

log = logging.getLogger("ambit.proxy.inbound")
SOURCE_WAIT = 1.0
"""Seconds an inbound connection waits, on demand, for its source's workload (its metrics' labels only)."""


class InboundRefusedError(ProxyError):
    """The inbound side refused the connection; ``status`` is the HBONE answer, ``flag`` the response flag."""

    def __init__(self, message: str, status: int, flag: ResponseFlag) -> None:
        super().__init__(message)
        self.status, self.flag = status, flag


async def _dial_pod(pod: LocalPod, dial: Dial) -> socket.socket:
    # The node proxy's own pod is dialled from its own address: the client's is not on this netns (ztunnel turns
    # freebind off for its self-proxy for the same reason). A PROXY application tunnel goes to loopback from
    # loopback (the header carries the client's address).
    # A client of the other IP family (an IPv4 peer asking for the pod's IPv6 address, or the reverse) cannot be
    # the source of a socket of this family: the pod sees the connection from its own address then.
    source_ip = None if pod.itself or dial.header is not None else dial.source_ip
    if source_ip is not None and (":" in source_ip) != (":" in dial.ip):
        source_ip = None
    try:
        sock = await connect(pod.sockets, (dial.ip, dial.port), source_ip=source_ip, loopback=True)
    except (AmbitError, OSError) as exc:
        raise InboundRefusedError(
            f"cannot reach {hostport(dial.ip, dial.port)}: {exc}", 503, ResponseFlag.CONNECT
        ) from exc
    if dial.header is not None:
        try:
            await asyncio.get_running_loop().sock_sendall(sock, dial.header.encode())
        except (AmbitError, OSError) as exc:
            sock.close()
            raise InboundRefusedError(
                f"cannot write the PROXY header to {hostport(dial.ip, dial.port)}: {exc}", 503, ResponseFlag.CONNECT
            ) from exc
    return sock


def _account(
    ctx: ProxyContext,
    *,
    target: Dial,
    source_addr: str,
    source_identity: SpiffeId | None,
    hbone_addr: str,
    source_address: IPAddress | None = None,
) -> Accounting:
    """The destination side's accounting of a connection to ``target`` (``source_address``: the parsed source IP,
    when the caller has it)."""
    source = ctx.find_workload_by_ip(source_address or target.source_ip)
    mtls = source_identity is not None
    labels = ctx.labels.labels(
        Reporter.DESTINATION,
        source=source,
        source_identity=source_identity,
        destination=target.workload,
        service=None,
        mtls=mtls,
    )
    record = ConnectionRecord(
        direction="inbound",
        src_addr=source_addr,
        dst_addr=sys.intern(hostport(target.ip, target.port)),
        dst_hbone_addr=hbone_addr,
        src_workload=source.name if source else "",
        src_namespace=source.namespace if source else "",
        src_identity=labels.source_principal,  # principal(source_identity) with mutual TLS
        src_cluster=source.cluster_id if source else "",
        dst_workload=target.workload.name,
        dst_namespace=target.workload.namespace,
        dst_identity=labels.destination_principal,  # principal(target.workload.identity) with mutual TLS
        dst_cluster=target.workload.cluster_id,
    )
    return Accounting(ctx.metrics, ctx.access_log, labels, record, ctx.clock)


# --- HBONE (15008) ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _HbonePeer:
    """What every tunnel of one HBONE connection shares: where it arrived, and who sent it (parsed once)."""

    local_ip: str
    peer_ip: str
    peer_port: int
    peer_address: IPAddress
    peer_addr: str  # "ip:port", interned: the access log's src.addr of each tunnel


async def serve_hbone(ctx: ProxyContext, pod: LocalPod, sock: socket.socket, ticket: Ticket | None = None) -> None:
    """Serve one TCP connection accepted on the pod's 15008 listener; never raises for peer trouble.

    ``ticket`` is the connection's place at its listener (:mod:`ambit.proxy.admission`; the caller releases it):
    its handshake is bounded by the listener's timeout, and it is established once the client is judged."""
    local_name, peer_name = sock.getsockname(), sock.getpeername()  # asked once: the server and its TLS take them
    local_ip = local_name[0]
    peer = peer_name[:2]  # an IPv6 peer comes with its flow label and scope too
    hbone_peer = _HbonePeer(local_ip, peer[0], peer[1], parse_ip(peer[0]), sys.intern(hostport(peer[0], peer[1])))

    async def certificate() -> WorkloadCertificate:
        return await ctx.certs.fetch(pod.identity)

    def certificate_at_hand() -> WorkloadCertificate | None:
        return ctx.certs.find(pod.identity)

    def handle(request: InboundRequest, responder: TunnelResponder) -> Coroutine[Any, Any, Splice | None]:
        return _serve_tunnel(ctx, pod, hbone_peer, request, responder)  # no wrapper frame per tunnel

    with ctx.register("inbound", hbone_peer.peer_addr, hostport(local_ip, 15008), pod):
        try:
            await HboneServer.serve(
                sock,
                certificate,
                trust_domain=ctx.settings.trust_domain,
                handler=handle,
                revocation=ctx.revocation,
                drain=ctx.drain,
                ticket=ticket,
                handshake_timeout=DEFAULT_HANDSHAKE_TIMEOUT if ticket is None else ticket.handshake_timeout,
                tls_transport=ctx.settings.tls_transport,
                find_cert=certificate_at_hand,
                addresses=(peer_name, local_name),
            )
        except (AmbitError, OSError, ssl.SSLError) as exc:
            log.info("pod %s: HBONE connection from %s failed: %s", pod.uid, hostport(*peer), exc)


async def _serve_tunnel(
    ctx: ProxyContext, pod: LocalPod, peer: _HbonePeer, request: InboundRequest, responder: TunnelResponder
) -> Splice | None:
    workload = await ctx.wait_local_workload(pod)
    if ctx.demand is not None and ctx.find_workload_by_ip(peer.peer_address) is None:
        # On demand: the source, for the metrics' labels only; nothing is decided on it (its identity is its
        # certificate's), so a slow answer costs the labels, never the connection.
        await ctx.fetch((address_alias(ctx.settings.network, peer.peer_address),), SOURCE_WAIT)
    facts = InboundFacts(
        workload,
        peer.local_ip,
        0,
        peer.peer_ip,
        request.peer_identity,
        authority=request.authority,
        itself=pod.itself,
        source_port=peer.peer_port,
    )
    plan = plan_inbound(facts, ctx.state, ctx.authorize)
    target = plan.stopped if isinstance(plan, Refuse) else plan
    accounting = None
    if target is not None:
        accounting = _account(
            ctx,
            target=target,
            source_addr=peer.peer_addr,  # the HBONE connection's peer: shared by its tunnels
            source_identity=request.peer_identity,
            hbone_addr=request.authority,
            source_address=peer.peer_address,
        )
    if isinstance(plan, Refuse):
        responder.reject(plan.status)
        if plan.counted and accounting is not None:
            accounting.failed(plan.reason, plan.flag)
        else:
            log.info("pod %s: CONNECT %r refused: %s", pod.uid, request.authority, plan.reason)
        return None
    assert accounting is not None
    try:
        upstream = await _dial_pod(pod, plan)
    except InboundRefusedError as exc:
        responder.reject(exc.status)
        accounting.failed(str(exc), exc.flag)
        return None
    stream = responder.accept()
    accounting.opened()
    # Spliced and left running: the HBONE server leaves the stream to the splice, whose ConnectionEnd closes it;
    # the HBONE connection's registration covers the tunnel.
    running = splice(stream, SocketStream(upstream), ConnectionEnd(ctx, None, accounting), counter=accounting)
    guard(ctx, running, plan)
    return running


def guard(ctx: ProxyContext, running: Splice, dial: Dial) -> None:
    """Remember a relayed connection for re-checks on policy changes (unless it is already over)."""
    if dial.dry_run:
        destination = hostport(dial.ip, dial.port)
        log.info("dry-run policy: %s -> %s would be denied: %s", dial.source_ip, destination, dial.dry_run)
    if dial.connection is not None and not running.over:
        ctx.guards.add(running, dial.workload.uid, dial.connection)


# --- plaintext (15006) -----------------------------------------------------------------------------------------


async def serve_plaintext(ctx: ProxyContext, pod: LocalPod, sock: socket.socket) -> Splice | None:
    """Serve one connection redirected to the pod's 15006 listener (no mutual TLS: a plaintext client).

    Returns the running :class:`~ambit.proxy.relay.Splice` (which owns ``sock`` from then on), or None.
    """
    peer = sock.getpeername()[:2]
    dst = original_dst(sock) or sock.getsockname()[:2]
    peer_addr, dst_addr = hostport(*peer), hostport(*dst)
    with ctx.register("inbound", peer_addr, dst_addr, pod) as registration:
        workload = ctx.find_local_workload(pod)
        if workload is None and dst[1] not in ILLEGAL_PORTS:  # no need to wait for a call that is refused anyway
            workload = await ctx.wait_local_workload(pod)
        plan = plan_plaintext(InboundFacts(workload, dst[0], dst[1], peer[0], None), ctx.state, ctx.authorize)
        target = plan.stopped if isinstance(plan, Refuse) else plan
        if isinstance(plan, Refuse):
            if plan.counted and target is not None:
                _account(ctx, target=target, source_addr=peer_addr, source_identity=None, hbone_addr="").failed(
                    plan.reason, plan.flag
                )
            else:
                log.warning(
                    "pod %s: plaintext connection %s -> %s refused: %s", pod.uid, peer_addr, dst_addr, plan.reason
                )
            reset(sock)
            return None
        accounting = _account(ctx, target=plan, source_addr=peer_addr, source_identity=None, hbone_addr="")
        try:
            upstream = await _dial_pod(pod, plan)
        except InboundRefusedError as exc:
            accounting.failed(str(exc), exc.flag)
            reset(sock)
            return None
        accounting.opened()
        running = registration.splice(SocketStream(sock), SocketStream(upstream), accounting)
        guard(ctx, running, plan)
        return running


# --- same-node fast path ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class LocalDelivery:
    """The upstream of a same-node connection, and the destination side's accounting (the caller relays)."""

    stream: SocketStream
    accounting: Accounting
    dial: Dial
    """The plan that let it in (the caller guards the relay with it)."""


async def deliver_locally(
    ctx: ProxyContext,
    pod: LocalPod,
    source_ip: str,
    source_identity: SpiffeId,
    port: int,
    source_addr: str,
    target_ip: str | None = None,
) -> LocalDelivery:
    """Dial local pod ``pod`` for a client of this node, as the inbound side would after a CONNECT to its IP
    ``target_ip`` (None: the pod's first address).

    Raises :class:`InboundRefusedError` when the plan refuses or the dial fails (a denial is counted here too).
    """
    workload = await ctx.wait_local_workload(pod)
    _host, _, source_port = source_addr.rpartition(":")
    facts = InboundFacts(
        workload,
        target_ip,
        port,
        source_ip,
        source_identity,
        source_port=int(source_port) if source_port.isascii() and source_port.isdigit() else 0,
    )
    plan = plan_inbound(facts, ctx.state, ctx.authorize)
    target = plan.stopped if isinstance(plan, Refuse) else plan
    accounting = None
    if target is not None:
        hbone_addr = hostport(target.ip, target.port)
        accounting = _account(
            ctx, target=target, source_addr=source_addr, source_identity=source_identity, hbone_addr=hbone_addr
        )
    if isinstance(plan, Refuse):
        if plan.counted and accounting is not None:
            accounting.failed(plan.reason, plan.flag)
        raise InboundRefusedError(plan.reason, plan.status, plan.flag)
    assert accounting is not None
    try:
        upstream = await _dial_pod(pod, plan)
    except InboundRefusedError as exc:
        accounting.failed(str(exc), exc.flag)
        raise
    accounting.opened()
    return LocalDelivery(SocketStream(upstream), accounting, plan)
