"""Inbound: HBONE on 15008 (spec §6.5), plaintext on 15006 (spec §6.6), and the same-node fast path.

Theory of operation. All three end in :func:`_dial_pod`: a TCP connection made inside the destination pod's netns
to ``<pod IP>:<port>``, bound to the *client's* IP (``IP_TRANSPARENT``; the pod's connmark rules route the replies
back to us), so the application sees its real peer. Before dialling:

- HBONE: the TLS server uses the local pod's own certificate (the listener tells us which pod: one 15008 listener
  per pod, so the certificate is chosen by the original destination, not by SNI); the client certificate must
  chain to our root and carry a SPIFFE identity of our trust domain. Each CONNECT's ``:authority`` must be this
  pod's IP (else 400, "ip mismatch") or a service hostname this pod is an endpoint of (the service port is mapped
  to the pod's target port). The authorization seam decides (401 when it refuses); a failed dial answers 503.
- Plaintext: the original destination (``SO_ORIGINAL_DST``) must not be one of the proxy's own ports; the
  authorization seam is asked with no peer identity.
- Same-node fast path (:func:`deliver_locally`): the outbound side already knows both pods and both identities,
  so it skips TLS and HTTP/2 but runs the same authorization.

Metrics are reported with ``reporter=destination``; principals only for mutual TLS.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
import sys
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from ambit.errors import AmbitError
from ambit.hbone.errors import AuthorityError
from ambit.hbone.headers import parse_authority
from ambit.identity.manager import WorkloadCertificate
from ambit.model.identity import SpiffeId
from ambit.model.workload import IPAddress, Workload
from ambit.proxy.accounting import Accounting
from ambit.proxy.authorization import ConnectionFacts
from ambit.proxy.context import ILLEGAL_PORTS, ConnectionEnd, LocalPod, ProxyContext
from ambit.proxy.errors import ProxyError
from ambit.proxy.hbone_server import HboneServer, InboundRequest, TunnelResponder
from ambit.proxy.relay import Splice, splice
from ambit.proxy.sockets import connect, hostport, original_dst, reset
from ambit.proxy.streams import SocketStream
from ambit.telemetry.accesslog import ConnectionRecord
from ambit.telemetry.metrics import Reporter

log = logging.getLogger("ambit.proxy.inbound")


class InboundRefusedError(ProxyError):
    """The inbound side refused the connection; ``status`` is the HBONE answer, ``flag`` the response flag."""

    def __init__(self, message: str, status: int, flag: str) -> None:
        super().__init__(message)
        self.status, self.flag = status, flag


@dataclass(slots=True)
class _Target:
    workload: Workload
    ip: str
    port: int


async def _dial_pod(ctx: ProxyContext, pod: LocalPod, target: _Target, facts: ConnectionFacts) -> socket.socket:
    if not ctx.authorize(facts):
        raise InboundRefusedError(f"connection to {target.workload.name} denied by policy", 401, "DENY")
    try:
        return await connect(pod.sockets, (target.ip, target.port), source_ip=facts.source_ip)
    except (AmbitError, OSError) as exc:
        raise InboundRefusedError(f"cannot reach {hostport(target.ip, target.port)}: {exc}", 503, "CONNECT") from exc


def _account(
    ctx: ProxyContext,
    *,
    target: _Target,
    source_ip: str | IPAddress,
    source_addr: str,
    source_identity: SpiffeId | None,
    hbone_addr: str,
    dst_addr: str,
) -> Accounting:
    source = ctx.find_workload_by_ip(source_ip)
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
        dst_addr=dst_addr,
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


async def _local_workload(ctx: ProxyContext, pod: LocalPod) -> Workload:
    workload = await ctx.wait_local_workload(pod)
    if workload is None:
        raise InboundRefusedError(f"pod {pod.info.namespace}/{pod.info.name} is not in the workload state", 503, "NR")
    return workload


# --- HBONE (15008) ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _HbonePeer:
    """What every tunnel of one HBONE connection shares: where it arrived, and who sent it (parsed once)."""

    local_ip: str
    peer_ip: str
    peer_address: IPAddress
    peer_addr: str  # "ip:port", interned: the access log's src.addr of each tunnel


async def serve_hbone(ctx: ProxyContext, pod: LocalPod, sock: socket.socket) -> None:
    """Serve one TCP connection accepted on the pod's 15008 listener; never raises for peer trouble."""
    local_ip = sock.getsockname()[0]
    peer = sock.getpeername()
    hbone_peer = _HbonePeer(local_ip, peer[0], ipaddress.ip_address(peer[0]), sys.intern(hostport(peer[0], peer[1])))

    async def certificate() -> WorkloadCertificate:
        return await ctx.certs.fetch(pod.identity)

    def handle(request: InboundRequest, responder: TunnelResponder) -> Coroutine[Any, Any, Splice | None]:
        return _serve_tunnel(ctx, pod, hbone_peer, request, responder)  # no wrapper frame per tunnel

    conn = ctx.register("inbound", hbone_peer.peer_addr, hostport(local_ip, 15008), pod)
    try:
        await HboneServer.serve(sock, certificate, trust_domain=ctx.settings.trust_domain, handler=handle)
    except (AmbitError, OSError, ssl.SSLError) as exc:
        log.info("pod %s: HBONE connection from %s failed: %s", pod.uid, hostport(*peer), exc)
    finally:
        ctx.unregister(conn)


async def _serve_tunnel(
    ctx: ProxyContext, pod: LocalPod, peer: _HbonePeer, request: InboundRequest, responder: TunnelResponder
) -> Splice | None:
    local_ip = peer.local_ip
    try:
        host, port = _split_authority(request.authority, local_ip)
    except AuthorityError as exc:
        responder.reject(400)
        log.info("pod %s: bad CONNECT authority %r: %s", pod.uid, request.authority, exc)
        return None
    try:
        workload = await _local_workload(ctx, pod)
        target_port = _inbound_port(ctx, workload, local_ip, host, port)
        target = _Target(workload, local_ip, target_port)
    except InboundRefusedError as exc:
        responder.reject(exc.status)
        log.info("pod %s: CONNECT %s refused: %s", pod.uid, request.authority, exc)
        return None
    source_identity = request.peer_identity
    accounting = _account(
        ctx,
        target=target,
        source_ip=peer.peer_address,
        source_addr=peer.peer_addr,  # the HBONE connection's peer: shared by its tunnels
        source_identity=source_identity,
        hbone_addr=request.authority,
        dst_addr=sys.intern(hostport(local_ip, target_port)),
    )
    facts = ConnectionFacts(peer.peer_ip, source_identity, workload, local_ip, target_port)
    try:
        upstream = await _dial_pod(ctx, pod, target, facts)
    except InboundRefusedError as exc:
        responder.reject(exc.status)
        accounting.failed(str(exc), exc.flag)
        return None
    stream = responder.accept()
    accounting.opened()
    # Spliced and left running: an idle tunnel holds no task or coroutine frame (the HBONE server then leaves the
    # stream to the splice, whose ConnectionEnd closes it; the HBONE connection's registration covers the tunnel).
    return splice(
        stream,
        SocketStream(upstream),
        ConnectionEnd(ctx, None, accounting),
        counter=accounting,
    )


def _split_authority(authority: str, local_ip: str) -> tuple[str, int]:
    """:func:`parse_authority`, with a shortcut for the usual CONNECT: to this pod's IP and a valid port.

    ``local_ip`` is the IPv4 address as the listener reported it, so already in the form ``parse_authority`` gives.
    """
    host, _, port_text = authority.rpartition(":")
    if (
        host == local_ip
        and ":" not in host
        and 0 < len(port_text) <= 5
        and port_text.isascii()
        and port_text.isdigit()
        and port_text[0] != "0"
        and int(port_text) <= 65535
    ):
        return host, int(port_text)
    return parse_authority(authority)


def _inbound_port(ctx: ProxyContext, workload: Workload, local_ip: str, host: str, port: int) -> int:
    if host == local_ip:  # the usual CONNECT, to this pod's IP as the listener saw it: nothing to parse
        return port
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        mapped = ctx.state.resolve_inbound_target(workload, host, port)
        if mapped is None:
            raise InboundRefusedError(f"unknown service {host!r} for this pod", 400, "-") from None
        return mapped
    if ip != ipaddress.ip_address(local_ip):
        raise InboundRefusedError(f"ip mismatch: CONNECT to {host} arrived at {local_ip}", 400, "-")
    return port


# --- plaintext (15006) -----------------------------------------------------------------------------------------


async def serve_plaintext(ctx: ProxyContext, pod: LocalPod, sock: socket.socket) -> Splice | None:
    """Serve one connection redirected to the pod's 15006 listener (no mutual TLS: a plaintext client).

    Returns the running :class:`~ambit.proxy.relay.Splice` (which owns ``sock`` from then on), or None.
    """
    peer = sock.getpeername()
    dst = original_dst(sock) or sock.getsockname()[:2]
    if dst[1] in ILLEGAL_PORTS:
        log.warning("pod %s: refused a plaintext call to the proxy's own port %s", pod.uid, hostport(*dst))
        reset(sock)
        return None
    conn = ctx.register("inbound", hostport(*peer), hostport(*dst), pod)
    spliced = False
    try:
        try:
            workload = await _local_workload(ctx, pod)
        except InboundRefusedError as exc:
            log.info("pod %s: plaintext connection from %s refused: %s", pod.uid, hostport(*peer), exc)
            reset(sock)
            return None
        target = _Target(workload, dst[0], dst[1])
        accounting = _account(
            ctx,
            target=target,
            source_ip=peer[0],
            source_addr=hostport(*peer),
            source_identity=None,
            hbone_addr="",
            dst_addr=hostport(*dst),
        )
        facts = ConnectionFacts(peer[0], None, workload, dst[0], dst[1])
        try:
            upstream = await _dial_pod(ctx, pod, target, facts)
        except InboundRefusedError as exc:
            accounting.failed(str(exc), exc.flag)
            reset(sock)
            return None
        accounting.opened()
        downstream, upstream_stream = SocketStream(sock), SocketStream(upstream)
        spliced = True
        return splice(
            downstream,
            upstream_stream,
            ConnectionEnd(ctx, conn, accounting),
            counter=accounting,
        )
    finally:
        if not spliced:
            ctx.unregister(conn)


# --- same-node fast path ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class LocalDelivery:
    """The upstream of a same-node connection, and the destination side's accounting (the caller relays)."""

    stream: SocketStream
    accounting: Accounting


async def deliver_locally(
    ctx: ProxyContext,
    pod: LocalPod,
    source_ip: str,
    source_identity: SpiffeId,
    port: int,
    source_addr: str,
) -> LocalDelivery:
    """Dial local pod ``pod`` for a client of this node, as the inbound side would after a CONNECT to its IP."""
    workload = await _local_workload(ctx, pod)
    if not workload.addresses:
        raise InboundRefusedError(f"pod {workload.name} has no address", 503, "NR")
    ip = str(workload.addresses[0])
    target = _Target(workload, ip, port)
    accounting = _account(
        ctx,
        target=target,
        source_ip=source_ip,
        source_addr=source_addr,
        source_identity=source_identity,
        hbone_addr=hostport(ip, port),
        dst_addr=hostport(ip, port),
    )
    facts = ConnectionFacts(source_ip, source_identity, workload, ip, port)
    try:
        upstream = await _dial_pod(ctx, pod, target, facts)
    except InboundRefusedError as exc:
        accounting.failed(str(exc), exc.flag)
        raise
    accounting.opened()
    return LocalDelivery(SocketStream(upstream), accounting)
