"""Talking to a certificate authority: the errors every CA client raises.

Theory of operation: a CA client (the :class:`~ambit.identity.manager.CaClient` protocol) turns a SPIFFE id into
a :class:`~ambit.tls.workload.WorkloadCertificate`. Whatever goes wrong on the way (the CA refuses, is
unreachable, or answers with a chain that does not name the requested identity) surfaces as one
:class:`CaError` whose message says why, so the certificate manager can back off and retry without knowing the
transport.
"""

from __future__ import annotations

from ambit.errors import AmbitError


class CaError(AmbitError):
    """Fetching a workload certificate failed; the message says why."""
