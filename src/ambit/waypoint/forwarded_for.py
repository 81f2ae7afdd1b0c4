"""The client address of a request at the edge of the mesh, as Envoy's HTTP connection manager decides it with
``use_remote_address: true`` (Istio's gateways) and ``xff_num_trusted_hops`` N (ProxyConfig
``gatewayTopology.numTrustedProxies``, or an EnvoyFilter merge). Pure.

Rules:

1. N = 0 (Istio's default): the client is the connection's peer. Whatever ``X-Forwarded-For`` says is not
   believed, so a client cannot choose the address ``remoteIpBlocks`` sees.
2. N > 0: the proxies in front of the gateway each appended the address they saw, so the N-th address from the
   right of the ``X-Forwarded-For`` that arrived (all its values, comma-separated, in order) is the one the
   outermost trusted proxy saw: the client. With fewer than N addresses, or one that is not an IP address, the
   peer is the client (Envoy falls back to the downstream address). Addresses in front of that one are the
   client's own claims and never used.
3. The request forwarded by the gateway carries ``X-Forwarded-For`` with the peer's address appended (Envoy
   appends the remote address when it uses it), and ``X-Envoy-External-Address`` set to the client address
   (any value the client sent is replaced: the ``x-envoy-*`` headers of an external request are not trusted).
"""

from __future__ import annotations

import ipaddress

__all__ = ["EXTERNAL_ADDRESS", "FORWARDED_FOR", "edge_headers", "trusted_client"]

FORWARDED_FOR = "x-forwarded-for"
EXTERNAL_ADDRESS = "x-envoy-external-address"
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _addresses(headers: tuple[tuple[str, str], ...]) -> list[str]:
    return [item.strip() for name, value in headers if name == FORWARDED_FOR for item in value.split(",")]


def trusted_client(headers: tuple[tuple[str, str], ...], peer: IPAddress, hops: int) -> IPAddress:
    """Rules 1 and 2: the client address of a request with ``headers`` (names lower-case) from ``peer``."""
    if hops <= 0:
        return peer
    addresses = _addresses(headers)
    if len(addresses) < hops:
        return peer
    try:
        return ipaddress.ip_address(addresses[-hops])
    except ValueError:
        return peer


def edge_headers(
    headers: tuple[tuple[str, str], ...], peer: IPAddress, client: IPAddress
) -> tuple[tuple[str, str], ...]:
    """Rule 3: the headers the gateway forwards."""
    forwarded = ", ".join([*(a for a in _addresses(headers) if a), str(peer)])
    kept = tuple((n, v) for n, v in headers if n not in (FORWARDED_FOR, EXTERNAL_ADDRESS))
    return (*kept, (FORWARDED_FOR, forwarded), (EXTERNAL_ADDRESS, str(client)))
