"""HBONE errors: the ``HboneError`` subtree of :class:`ambit.errors.AmbitError`::

    HboneError                  misuse of an HBONE connection by its caller (local blame)
    ├── HboneProtocolError      the peer broke an HTTP/2 or HBONE rule; ``error_code`` is the HTTP/2 code
    ├── AuthorityError          a CONNECT ``:authority`` is not ``host:port``
    └── GrpcMessageError        the peer sent a gRPC message we refuse (compressed, too large): the call fails
        └── GrpcMessageTooLarge  ... larger than the call's bound

``receive_data`` never raises for what a peer sends: deep inside frame handling the engine raises
:class:`HboneProtocolError` to unwind, catches it at the top, and ends the connection with a GOAWAY carrying its
``error_code`` and a ``ConnectionTerminated`` event.
"""

from __future__ import annotations

from ambit.errors import AmbitError


class HboneError(AmbitError):
    """Base class of HBONE errors; raised directly when the caller misuses a connection."""


class HboneProtocolError(HboneError):
    """The peer broke an HTTP/2 or HBONE rule that ends the connection: GOAWAY with ``error_code``."""

    def __init__(self, error_code: int, reason: str) -> None:
        super().__init__(f"HBONE peer protocol error: {reason}")
        self.error_code = error_code
        self.reason = reason


class AuthorityError(HboneError):
    """A CONNECT authority is not ``IPv4:port``, ``[IPv6]:port`` or ``hostname:port``."""


class GrpcMessageError(HboneError):
    """A gRPC message from the peer breaks :mod:`ambit.hbone.grpc_calls` rule 2: its call fails, the connection
    stays (the caller resets the stream)."""


class GrpcMessageTooLarge(GrpcMessageError):
    """A gRPC message from the peer is larger than the call accepts (refused from its length prefix)."""
