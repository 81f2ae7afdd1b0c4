"""The errors of Ambit's certificate handling, in a module of their own so that catching them loads no certificate
code: the node proxy's data path names these errors from the start, and never loads cryptography's X.509 stack
(only CAs and optional features such as revocation lists do)."""

from __future__ import annotations

from ambit.errors import AmbitError


class CertificateError(AmbitError):
    """A certificate or key is malformed, of the wrong kind, or does not match its partner."""


class PeerIdentityError(AmbitError):
    """A peer's certificate has no, several or a malformed SPIFFE id, or one this side does not accept."""
