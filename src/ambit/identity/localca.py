"""A certificate authority on local disk, for labs and tests (``ambit nodeproxy --local-ca DIR``).

Theory of operation: the root lives in ``DIR/root.crt`` (PEM certificate, mode 0644) and ``DIR/root.key`` (PEM
PKCS#8 key, mode 0600), created on first use by :func:`ambit.tls.certs.load_or_create_ca`; node proxies that
share the directory share the root and so trust each other. Each request plays both sides of spec §5.2-§5.3 in
process: a fresh key and CSR (:func:`~ambit.tls.spiffe.make_csr`), signed for ``ttl_seconds``
(:func:`~ambit.tls.issuance.sign_csr`), and the answer checked like istiod's would be (the leaf must name the
requested identity). Key generation and signing run in a worker thread so the event loop never stalls.

A root already on disk is read with the first certificate, in that thread, not when the client is made: that is
when a node proxy first needs cryptography's x509 stack (its first pod), so a proxy without pods never loads it.
A root on disk that does not load therefore shows as a :class:`~ambit.identity.caclient.CaError` of each request
(which the certificate manager retries), not when the proxy starts. A root still to be created is created at once
(with cryptography), as before: processes sharing the directory find it there instead of racing to create it.

Unlike istiod there is no caller authentication: whoever can read ``DIR/root.key`` can mint any identity, which is
exactly what a lab needs and why the key is private to its owner. The CA signs only its own trust domain.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ambit.identity.caclient import CaError
from ambit.model.identity import DEFAULT_TRUST_DOMAIN, SpiffeId
from ambit.tls.errors import CertificateError

if TYPE_CHECKING:
    from ambit.tls.certs import KeyPair
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
        self._directory = directory
        self._root: KeyPair | None = None
        self._root_lock = threading.Lock()
        self._ttl_seconds = ttl_seconds
        self._trust_domain = trust_domain
        self._clock = clock
        if not all((directory / f"{ROOT_NAME}{suffix}").exists() for suffix in (".crt", ".key")):
            self._load_root()  # created now (or the lone file reported), as every process expects it on disk

    @property
    def roots_pem(self) -> bytes:
        """The root certificate every workload certificate from this CA chains to."""
        return self._load_root().cert_pem

    @property
    def trust_domain(self) -> str:
        return self._trust_domain

    async def fetch_certificate(self, identity: SpiffeId) -> WorkloadCertificate:
        """A fresh certificate for ``identity``; :class:`CaError` if it is outside this CA's trust domain."""
        if identity.trust_domain != self._trust_domain:
            raise CaError(f"{identity} is outside this CA's trust domain {self._trust_domain!r}")
        return await asyncio.to_thread(self._issue, identity)

    def _load_root(self) -> KeyPair:
        """The root, loaded or created once (two threads asking at once must not create two);
        :class:`CertificateError` if the directory holds an unusable one."""
        with self._root_lock:
            if self._root is None:
                from ambit.tls.certs import load_or_create_ca

                self._root = load_or_create_ca(self._directory, ROOT_NAME, ROOT_COMMON_NAME, self._clock())
            return self._root

    def _issue(self, identity: SpiffeId) -> WorkloadCertificate:
        from ambit.tls.issuance import sign_csr
        from ambit.tls.spiffe import make_csr
        from ambit.tls.workload import WorkloadCertificate

        try:
            root = self._load_root()
        except CertificateError as exc:
            raise CaError(f"the local CA in {self._directory} is unusable: {exc}") from None
        csr_pem, key_pem = make_csr(identity)
        try:
            chain = sign_csr(root, csr_pem, now=self._clock(), ttl_seconds=self._ttl_seconds, identity=identity)
            return WorkloadCertificate.from_chain(identity, chain, key_pem)
        except CertificateError as exc:
            raise CaError(f"the local CA refused to sign for {identity}: {exc}") from None
