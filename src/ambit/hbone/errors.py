"""HBONE errors: the ``HboneError`` subtree of :class:`ambit.errors.AmbitError`::

    HboneError                  misuse of an HBONE connection by its caller (local blame)
    ├── HboneProtocolError      the peer broke an HTTP/2 or HBONE rule; ``error_code`` is the HTTP/2 code
    └── AuthorityError          a CONNECT ``:authority`` is not ``host:port``

``receive_data`` never raises for what a peer sends: a broken peer ends the connection with a GOAWAY and a
``ConnectionTerminated`` event. ``HboneProtocolError`` is the value carried in reasons and offered to shells that
want to raise one themselves.
"""

from __future__ import annotations

from ambit.errors import AmbitError


class HboneError(AmbitError):
    """Base class of HBONE errors; raised directly when the caller misuses a connection."""


class HboneProtocolError(HboneError):
    """The peer broke an HTTP/2 or HBONE rule."""

    #: HTTP/2 PROTOCOL_ERROR unless a more specific code is given.
    error_code: int = 0x1

    def __init__(self, reason: str, error_code: int | None = None) -> None:
        super().__init__(f"HBONE peer protocol error: {reason}")
        self.reason = reason
        if error_code is not None:
            self.error_code = error_code


class AuthorityError(HboneError):
    """A CONNECT authority is not ``IPv4:port``, ``[IPv6]:port`` or ``hostname:port``."""
