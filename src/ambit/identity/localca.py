"""A certificate authority on local disk, for labs and tests (``ambit nodeproxy --local-ca DIR``).

Theory of operation: the root lives in ``DIR/root.crt`` (PEM certificate, mode 0644) and ``DIR/root.key`` (PEM
PKCS#8 key, mode 0600), created on first use by :func:`ambit.tls.certs.load_or_create_ca`; node proxies that
share the directory share the root and so trust each other. Each request plays both sides of spec §5.2-§5.3 in
process: a fresh key and CSR (:func:`~ambit.tls.spiffe.make_csr`), signed for ``ttl_seconds``
(:func:`~ambit.tls.spiffe.sign_csr`), and the answer checked like istiod's would be (the leaf must name the
requested identity). Key generation and signing run in a worker thread so the event loop never stalls.

Unlike istiod there is no caller authentication: whoever can read ``DIR/root.key`` can mint any identity, which is
exactly what a lab needs and why the key is private to its owner. The CA signs only its own trust domain.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from ambit.identity.caclient import CaError
from ambit.model.identity import DEFAULT_TRUST_DOMAIN, SpiffeId
from ambit.tls.certs import CertificateError, load_or_create_ca
from ambit.tls.spiffe import make_csr, sign_csr
from ambit.tls.workload import WorkloadCertificate

ROOT_NAME = "root"
"""Base name of the root's files in the CA directory: ``root.crt`` and ``root.key``."""

ROOT_COMMON_NAME = "Ambit mesh root"


class LocalCa:
    """A :class:`~ambit.identity.manager.CaClient` that signs with a root kept in ``directory``."""

    def __init__(
        self,
        directory: Path,
        *,
        ttl_seconds: int = 86400,
        trust_domain: str = DEFAULT_TRUST_DOMAIN,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if ttl_seconds <= 0:
            raise CaError(f"certificate TTL must be positive, not {ttl_seconds}")
        self._root = load_or_create_ca(directory, ROOT_NAME, ROOT_COMMON_NAME, clock())
        self._ttl_seconds = ttl_seconds
        self._trust_domain = trust_domain
        self._clock = clock

    @property
    def roots_pem(self) -> bytes:
        """The root certificate every workload certificate from this CA chains to."""
        return self._root.cert_pem

    @property
    def trust_domain(self) -> str:
        return self._trust_domain

    async def fetch_certificate(self, identity: SpiffeId) -> WorkloadCertificate:
        """A fresh certificate for ``identity``; :class:`CaError` if it is outside this CA's trust domain."""
        if identity.trust_domain != self._trust_domain:
            raise CaError(f"{identity} is outside this CA's trust domain {self._trust_domain!r}")
        return await asyncio.to_thread(self._issue, identity)

    def _issue(self, identity: SpiffeId) -> WorkloadCertificate:
        csr_pem, key_pem = make_csr(identity)
        try:
            chain = sign_csr(self._root, csr_pem, now=self._clock(), ttl_seconds=self._ttl_seconds, identity=identity)
            return WorkloadCertificate.from_chain(identity, chain, key_pem)
        except CertificateError as exc:
            raise CaError(f"the local CA refused to sign for {identity}: {exc}") from None
