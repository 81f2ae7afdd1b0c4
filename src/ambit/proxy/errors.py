"""Errors of the proxy's data path, all under :class:`ProxyError`, and the response flags they carry::

    AmbitError
    └── ProxyError                   (ambit.proxy.errors) root of the data path's errors
        ├── SocketFactoryError       a pod's socket factory cannot make sockets (setns, SO_MARK, closed)
        ├── ProxyConnectError        an upstream connection failed: ``address`` and ``reason``
        ├── StreamClosedError        a read or write on a stream reset by the peer or aborted locally
        ├── HboneConnectError        (proxy.hbone_client) an HBONE connection could not be set up
        ├── TunnelRefusedError       (proxy.hbone_client) the server answered a CONNECT with an error status
        ├── ConnectionLostError      (proxy.hbone_session) the HBONE connection died under a tunnel
        └── InboundRefusedError      (proxy.inbound) the inbound side refused a connection: status and flag

Blame: :class:`ProxyConnectError` and :class:`StreamClosedError` describe what the network or a peer did (refused,
reset); :class:`SocketFactoryError` is local (our namespace handle or privileges).

Every :class:`ProxyError` carries the :class:`ResponseFlag` its connection is counted with (``flag``, a class
attribute that instances may override): the ``response_flags`` label of ``istio_tcp_connections_failed_total``
and the access log's ``response_flags``.
"""

from __future__ import annotations

import enum

from ambit.errors import AmbitError


class ResponseFlag(enum.StrEnum):
    """Why a connection failed, as its metrics and access-log line say (Envoy's and ztunnel's short codes)."""

    NONE = "-"
    """Nothing went wrong, or the refusal has no flag of its own (a malformed request)."""
    NO_ROUTE = "NR"
    """No upstream: the local workload is unknown, or a service has no healthy endpoint."""
    DENY = "DENY"
    """Denied by authorization policy."""
    CONNECT = "CONNECT"
    """The upstream could not be reached (refused, unreachable, timed out)."""
    CONNECT_FAILURE = "CONNECT_FAILURE"
    """The TCP connection to a peer's HBONE port failed."""
    TLS_FAILURE = "TLS_FAILURE"
    """The mutual-TLS handshake with a peer failed."""
    IDENTITY_ERROR = "IDENTITY_ERROR"
    """The peer's certificate does not name an identity we expect."""
    OVERFLOW = "UO"
    """Over a connection limit (a waypoint's DestinationRule ``maxConnections``; Envoy's upstream overflow)."""
    DNS_FAILED = "DF"
    """A hostname endpoint's name did not resolve (a waypoint's dynamic DNS host; Envoy's DNS resolution failure)."""
    UNAUTHORIZED_EXTERNAL = "UAEX"
    """Denied by an external authorizer (a waypoint's AuthorizationPolicy CUSTOM; Envoy's ext_authz)."""


class ProxyError(AmbitError):
    """Root of the errors raised by :mod:`ambit.proxy`."""

    flag: ResponseFlag = ResponseFlag.CONNECT
    """What the connection that failed with this error is counted with."""


class SocketFactoryError(ProxyError):
    """A socket factory could not create a socket (namespace, privileges, or the factory is closed)."""


class ProxyConnectError(ProxyError):
    """Connecting to ``address`` failed; ``reason`` is one short word or phrase (``refused``, ``timeout``, ...)."""

    def __init__(self, address: tuple[str, int], reason: str) -> None:
        super().__init__(f"cannot connect to {address[0]}:{address[1]}: {reason}")
        self.address = address
        self.reason = reason


class StreamClosedError(ProxyError):
    """The stream was reset by its peer or aborted locally; no more bytes can be read or written."""
