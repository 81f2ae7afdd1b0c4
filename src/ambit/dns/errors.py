"""The DNS proxy's errors (see :mod:`ambit.dns` for the tree)."""

from __future__ import annotations

from ambit.errors import AmbitError


class DnsError(AmbitError):
    """Root of the DNS proxy's errors."""


class ResolvConfError(DnsError):
    """A resolv.conf that names no usable nameserver (local: the pod's or the proxy's configuration)."""


class UpstreamError(DnsError):
    """Forwarding a query failed: the upstream resolvers timed out, refused the connection or answered nonsense
    (the network's or a peer's fault); ``reason`` is the short word counted and logged."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
