"""Errors of the proxy's data path, all under :class:`ProxyError`::

    AmbitError
    └── ProxyError                   (ambit.proxy.errors) root of the data path's errors
        ├── SocketFactoryError       a pod's socket factory cannot make sockets (setns, SO_MARK, closed)
        ├── ProxyConnectError        an upstream connection failed: ``address`` and ``reason``
        └── StreamClosedError        a read or write on a stream reset by the peer or aborted locally

Blame: :class:`ProxyConnectError` and :class:`StreamClosedError` describe what the network or a peer did (refused,
reset); :class:`SocketFactoryError` is local (our namespace handle or privileges).
"""

from __future__ import annotations

from ambit.errors import AmbitError


class ProxyError(AmbitError):
    """Root of the errors raised by :mod:`ambit.proxy`."""


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
