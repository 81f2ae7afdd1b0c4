"""Errors of the mesh CA server, each carrying the gRPC status it is answered with.

Tree::

    AmbitError
    └── CaServerError          a certificate request was refused (``status``: the gRPC code's name)
        ├── AuthenticationError  the bearer token does not authenticate a service account (UNAUTHENTICATED)
        ├── AuthorizationError   the caller may not have the identity it asked for (UNAUTHENTICATED, spec §5.3)
        ├── CsrError             the CSR is malformed, too large or names another identity (INVALID_ARGUMENT)
        ├── RateLimitedError     the caller asked for more certificates than its rate allows (RESOURCE_EXHAUSTED)
        └── RootCaError          the root CA cannot be loaded, created or stored (INTERNAL)

Blame: the first four are the caller's doing; :class:`RootCaError` is ours. Messages of the first two are
detailed for our logs only; the wire gets :attr:`CaServerError.public_message`, which reveals nothing about
which check failed (spec §5.3 step 4: an opaque message).
"""

from __future__ import annotations

from ambit.errors import AmbitError


class CaServerError(AmbitError):
    """A certificate request was refused; ``status`` names the gRPC status code it is answered with."""

    status = "INTERNAL"
    public_message = "internal error"

    def wire_message(self) -> str:
        """What the caller is told: the detail unless this kind of error must stay opaque."""
        return self.public_message or str(self)


class AuthenticationError(CaServerError):
    """The caller's token is missing, invalid, expired, for another audience, or not a service account's."""

    status = "UNAUTHENTICATED"
    public_message = "authenticate failed"


class AuthorizationError(CaServerError):
    """The authenticated caller may not receive the identity it asked to impersonate."""

    status = "UNAUTHENTICATED"
    public_message = "request impersonation authentication failure"


class CsrError(CaServerError):
    """The CSR cannot be signed: malformed, wrong key type, or naming an identity other than the authorized one."""

    status = "INVALID_ARGUMENT"
    public_message = ""  # the caller's own CSR: telling it what is wrong leaks nothing


class RateLimitedError(CaServerError):
    """The authenticated caller has used up its request budget for now; it may retry later."""

    status = "RESOURCE_EXHAUSTED"
    public_message = "too many certificate requests from this caller; retry later"


class RootCaError(CaServerError):
    """The root CA (Secret, plug-in files) is missing, malformed or cannot be written."""

    status = "INTERNAL"
    public_message = "internal error"
