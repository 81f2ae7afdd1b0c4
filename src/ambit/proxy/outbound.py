"""Outbound (15001): a connection a pod opened, captured by its redirection rules (spec §6.3).

Theory of operation, for one accepted socket of local pod P:

1. The original destination comes from ``SO_ORIGINAL_DST``. A destination on one of the proxy's own ports at
   loopback or at P's own address is a self-call (spec §2.4, ``malicious_calls_inpod``): reset.
2. P's workload must be known (waiting briefly for the state to learn it); unknown → reset.
3. :meth:`WorkloadState.resolve` picks the upstream: a Service VIP chooses an endpoint per connection, a pod IP is
   itself, anything else is passthrough. A service without a healthy endpoint → reset.
4. HBONE destinations: when the destination pod is served by this very proxy, the *same-node fast path* hands the
   connection straight to the inbound side (same checks, no TLS: both identities are ours); otherwise a CONNECT
   stream on a pooled mutual-TLS connection to ``<pod IP>:15008`` made from P's netns with P's certificate, the
   server verified against the destination's SPIFFE identity.
5. Plaintext and passthrough destinations: a TCP connection from P's netns (source stays P's IP).
6. Bytes are relayed with half-close both ways; metrics (reporter=source) and one access-log line per connection.
"""

from __future__ import annotations

import ipaddress
import logging
import random
import socket
import sys

from ambit.errors import AmbitError
from ambit.hbone.headers import connect_headers
from ambit.model.state import Destination, NoHealthyUpstreamError, Tunnel
from ambit.model.workload import IPAddress, Workload
from ambit.proxy.accounting import Accounting, BothSides
from ambit.proxy.context import ILLEGAL_PORTS, ConnectionEnd, LocalPod, ProxyContext
from ambit.proxy.hbone_client import HboneClient
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.inbound import deliver_locally
from ambit.proxy.pool import PoolKey
from ambit.proxy.relay import Splice, splice
from ambit.proxy.sockets import connect, hostport, original_dst, reset
from ambit.proxy.streams import SocketStream
from ambit.telemetry.accesslog import ConnectionRecord
from ambit.telemetry.metrics import Reporter

log = logging.getLogger("ambit.proxy.outbound")

HBONE_PORT = 15008


def is_self_call(dst_ip: IPAddress, dst_port: int, own: tuple[IPAddress, ...]) -> bool:
    return dst_port in ILLEGAL_PORTS and (dst_ip.is_loopback or dst_ip in own)


async def serve_outbound(ctx: ProxyContext, pod: LocalPod, sock: socket.socket) -> Splice | None:
    """Proxy one connection that pod ``pod`` opened; never raises for network or peer trouble.

    Returns once the relay runs on its own (a :class:`~ambit.proxy.relay.Splice`, which from then on owns ``sock``
    and does the closing bookkeeping when it ends), or None when the connection was refused or is over.
    """
    peer = sock.getpeername()
    dst = original_dst(sock)
    if dst is None:
        log.warning("pod %s: outbound connection from %s without an original destination", pod.uid, peer)
        reset(sock)
        return None
    dst_ip, dst_port = ipaddress.ip_address(dst[0]), dst[1]
    source = await ctx.wait_local_workload(pod)
    own = source.addresses if source else ()
    if is_self_call(dst_ip, dst_port, own):
        log.warning("pod %s: refused a call to the proxy's own port %s", pod.uid, hostport(dst_ip, dst_port))
        reset(sock)
        return None
    if source is None:
        log.warning("pod %s: unknown source workload, refusing %s", pod.uid, hostport(dst_ip, dst_port))
        reset(sock)
        return None
    peer_addr, dst_addr = hostport(peer[0], peer[1]), hostport(dst[0], dst_port)
    try:
        destination = ctx.state.resolve(ctx.settings.network, dst_ip, dst_port, random.choice)
    except NoHealthyUpstreamError as exc:
        _account(ctx, pod, source, peer_addr, None, dst_addr).failed(str(exc), "NR")
        reset(sock)
        return None
    # The destination's address as text, made once: formatting an ip_address object is not cached by it.
    ip_text = dst[0] if destination.ip == dst_ip else str(destination.ip)
    accounting = _account(ctx, pod, source, peer_addr, destination, dst_addr, ip_text)
    conn = ctx.register("outbound", peer_addr, dst_addr, pod)
    spliced = False
    try:
        accountings = [accounting]
        try:
            upstream = await _open_upstream(ctx, pod, peer, peer_addr, destination, ip_text, accountings)
        except (AmbitError, OSError) as exc:
            flag = getattr(exc, "flag", "CONNECT")
            accounting.failed(str(exc), str(flag))
            reset(sock)
            return None
        accounting.opened()
        # The same-node fast path counts to (and finishes) the destination side's accounting too.
        sides = accounting if len(accountings) == 1 else BothSides(tuple(accountings))
        downstream = SocketStream(sock)
        spliced = True
        return splice(downstream, upstream, ConnectionEnd(ctx, conn, sides), counter=sides)
    finally:
        if not spliced:
            ctx.unregister(conn)


async def _open_upstream(
    ctx: ProxyContext,
    pod: LocalPod,
    peer: tuple[str, int],
    peer_addr: str,
    destination: Destination,
    ip_text: str,
    accountings: list[Accounting],
) -> SocketStream | HboneStream:
    """The upstream of ``destination``: same-node delivery (adding its accounting), an HBONE tunnel, or TCP."""
    if destination.tunnel is Tunnel.HBONE:
        local_pod = ctx.find_local_pod_by_ip(destination.ip)
        if local_pod is None:
            return await _open_tunnel(ctx, pod, peer, peer_addr, destination, ip_text)
        delivery = await deliver_locally(ctx, local_pod, peer[0], pod.identity, destination.port, peer_addr)
        accountings.append(delivery.accounting)
        return delivery.stream
    return SocketStream(await connect(pod.sockets, (ip_text, destination.port)))


async def _open_tunnel(
    ctx: ProxyContext, pod: LocalPod, peer: tuple[str, int], peer_addr: str, destination: Destination, ip_text: str
) -> HboneStream:
    cert = await ctx.certs.fetch(pod.identity)
    expected = destination.expected_identities
    hbone_addr = (ip_text, HBONE_PORT)
    service = destination.service
    headers = connect_headers(forwarded_for=peer_addr, host=service.hostname if service else None)

    async def dial() -> HboneClient:
        tcp = await connect(pod.sockets, hbone_addr)
        return await HboneClient.connect(tcp, cert, expected, trust_domain=ctx.settings.trust_domain)

    key = PoolKey(pod.identity, expected, peer[0], hbone_addr)
    return await ctx.pool.open_tunnel(key, hostport(ip_text, destination.port), headers, dial)


def _account(
    ctx: ProxyContext,
    pod: LocalPod,
    source: Workload,
    peer_addr: str,
    destination: Destination | None,
    original_addr: str,
    ip_text: str = "",
) -> Accounting:
    target = destination.workload if destination else None
    mtls = destination is not None and destination.tunnel is Tunnel.HBONE
    service = destination.service if destination else None
    labels = ctx.labels.labels(
        Reporter.SOURCE,
        source=source,
        source_identity=pod.identity,
        destination=target,
        service=service,
        mtls=mtls,
    )
    if destination is not None and destination.tunnel is Tunnel.HBONE:
        # Per destination, not per connection: interned, so connections to one destination share them.
        dst_addr = sys.intern(hostport(ip_text, HBONE_PORT))
        hbone_addr = sys.intern(hostport(ip_text, destination.port))
    elif destination is not None:
        dst_addr, hbone_addr = hostport(ip_text, destination.port), ""
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
