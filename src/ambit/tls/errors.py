"""The errors of Ambit's certificate handling, in a module of their own so that catching them does not load
cryptography's x509 stack: the node proxy imports that only with its first certificate (the first pod's), while
its data path names these errors from the start."""

from __future__ import annotations

from ambit.errors import AmbitError


class CertificateError(AmbitError):
    """A certificate or key is malformed, of the wrong kind, or does not match its partner."""


class PeerIdentityError(AmbitError):
    """A peer's certificate has no, several or a malformed SPIFFE id, or one this side does not accept."""
