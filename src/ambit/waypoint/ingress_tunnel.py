"""The ingress gateway's end of a PROXY application tunnel (the waypoint inbound binding, spec §6.5 step 5).

Theory of operation: a Gateway annotated ``ambient.istio.io/waypoint-inbound-binding: PROXY[/<port>]`` gives its pods an
``application_tunnel`` (:mod:`ambit.controlplane.translate.waypoint_gateways` rule 12); the node proxy that captures
such a pod delivers each HBONE tunnel to loopback in the pod, on the binding's port, after a PROXY version 2 header
naming the client, the original target and (TLV ``0xD0``) the client's SPIFFE identity, which the node proxy verified
with mutual TLS (:mod:`ambit.proxy.plans` inbound rule 6). The gateway reads its own binding from its own workload
(found by its pod address, as :meth:`~ambit.waypoint.ingress.IngressGateway.captured` finds it), so no configuration
beyond the annotation is needed.

Rules:

1. Listeners (:func:`tunnel_ports`): a PROXY binding with a port listens on that port; one without (port 0) on
   each port the gateway config serves, since the node proxy then keeps the client's port. Always on loopback only
   (``127.0.0.1``, ``::1`` for an IPv6 pod): only a process inside the gateway pod's own network namespace, which
   is where the node proxy's in-pod sockets are, reaches them; a pod elsewhere that connects to the gateway's
   address on that port finds no listener. No binding, or NONE, listens nowhere extra.
2. Trust: a header is read only on those loopback listeners, and only from a loopback peer (checked again on each
   connection); on every other listener the bytes are the client's own and a header there means nothing (it is
   not parsed, so a forged identity is never believed).
3. Every connection on a tunnel listener must start with a valid header
   (:class:`~ambit.proxyprotocol.ProxyHeaderDecoder`, reading no more than the header, within ``within``
   seconds); command LOCAL, a malformed header, a timeout, or an identity TLV that is not a SPIFFE id closes the
   connection (counted by reason). No TLV is an anonymous client.
4. What the header says replaces what the socket says (:class:`Proxied`): the client's address (``peer``), the
   original target and its port (the gateway serves the connection as if it had arrived on that port: its
   listeners and routes), and the identity, which is the request's ``source.principal`` for the gateway's
   AuthorizationPolicies and its telemetry's ``source_principal``, as a verified mTLS peer's would be.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from ambit.hbone.headers import hostport
from ambit.model.errors import IdentityError
from ambit.model.identity import SpiffeId
from ambit.model.workload import ApplicationTunnel, AppTunnelProtocol
from ambit.proxyprotocol import TLV_PEER_IDENTITY, Command, ProxyHeaderDecoder, ProxyHeaderError

__all__ = ["Proxied", "TunnelRefused", "loopback_for", "read_proxied", "tunnel_ports"]


@dataclass(frozen=True, slots=True)
class Proxied:
    """One tunnelled connection as its PROXY header describes it (rule 4)."""

    peer: tuple[str, int]
    target: tuple[str, int]
    identity: SpiffeId | None


@dataclass(frozen=True, slots=True)
class TunnelRefused:
    """A tunnelled connection closed before it was served (rule 3): ``reason`` is a bounded word for counting."""

    reason: str
    detail: str


def tunnel_ports(binding: ApplicationTunnel | None, served: Iterable[int]) -> frozenset[int]:
    """Rule 1: the ports to listen on in loopback."""
    if binding is None or binding.protocol is not AppTunnelProtocol.PROXY:
        return frozenset()
    return frozenset({binding.port}) if binding.port else frozenset(served)


def loopback_for(pod_address: str) -> str:
    """The loopback address of the pod address's family (rule 1)."""
    return "::1" if ":" in pod_address else "127.0.0.1"


async def read_proxied(sock: socket.socket, within: float) -> Proxied | TunnelRefused:
    """Rules 2-4 for one accepted connection: its header, read without taking any payload byte."""
    try:
        peer = sock.getpeername()
        loopback = ipaddress.ip_address(peer[0]).is_loopback
    except (OSError, ValueError, TypeError, IndexError) as exc:
        return TunnelRefused("gone", str(exc))
    if not loopback:
        return TunnelRefused("not loopback", f"a tunnel connection from {peer[0]}")
    loop = asyncio.get_running_loop()
    decoder = ProxyHeaderDecoder()
    header = None
    try:
        async with asyncio.timeout(within):
            while header is None:
                data = await loop.sock_recv(sock, decoder.needed)
                if not data:
                    return TunnelRefused("closed", "the connection ended inside its PROXY header")
                header = decoder.receive_data(data)
    except TimeoutError:
        return TunnelRefused("timeout", f"no PROXY header within {within}s")
    except ProxyHeaderError as exc:
        return TunnelRefused("bad header", str(exc))
    except OSError as exc:
        return TunnelRefused("gone", str(exc))
    if header.command is Command.LOCAL or header.source is None or header.destination is None:
        return TunnelRefused("bad header", "a PROXY header without addresses (LOCAL)")
    identity = None
    raw = header.tlv(TLV_PEER_IDENTITY)
    if raw is not None:
        try:
            identity = SpiffeId.parse(raw.decode("utf-8"))
        except (UnicodeDecodeError, IdentityError) as exc:
            return TunnelRefused("bad identity", f"TLV 0xD0 is not a SPIFFE id: {exc}")
    (src, src_port), (dst, dst_port) = header.source, header.destination
    return Proxied((str(src), src_port), (str(dst), dst_port), identity)


def describe(proxied: Proxied) -> str:
    return f"{hostport(*proxied.peer)} ({proxied.identity or 'no identity'}) for {hostport(*proxied.target)}"
