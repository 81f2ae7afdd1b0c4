"""The DNS proxy's settings: what a node proxy configures before any pod's DNS server exists.

Apart from the proxy itself (:mod:`ambit.dns.server`), so that a node proxy imports the DNS proxy only when it
starts its first pod's DNS server, never with the DNS proxy off (and dnspython only with the first query the fast
path declines).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_DOMAIN", "DnsServerSettings", "Upstream"]

DEFAULT_DOMAIN = "cluster.local"


@dataclass(frozen=True, slots=True)
class Upstream:
    """The resolvers to ask and how patiently (from the pod's or the proxy's resolv.conf)."""

    nameservers: tuple[str, ...]
    timeout: float = 2.0
    """Seconds one try may take."""
    attempts: int = 2
    port: int = 53


@dataclass(frozen=True, slots=True)
class DnsServerSettings:
    domain: str = DEFAULT_DOMAIN
    """The cluster's DNS domain."""
    ipv6: bool = True
    """Answer AAAA queries (off: an empty answer, as ztunnel with IPv6 disabled)."""
    max_forwards: int = 64
    """Forwarded queries of one pod in flight at most (rule 1)."""
    max_tcp_connections: int = 32
    """TCP connections of one pod served at once at most (rule 4)."""
    tcp_idle: float = 5.0
    """Seconds a TCP connection may wait for its next full message."""
    max_send_buffer: int = 256 * 1024
    """Bytes of UDP replies queued at most before replies are dropped (rule 3)."""
