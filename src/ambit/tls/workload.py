"""A workload's certificate as the data path holds it: the leaf for one SPIFFE id, its chain, key and trust anchors.

Theory of operation: a CA's answer (leaf first, root last) becomes a :class:`WorkloadCertificate` through
:meth:`WorkloadCertificate.from_chain`, which checks that the leaf names the identity it was asked for. The
certificate builds its HBONE client and server contexts (:mod:`ambit.tls.contexts`; one pair per TLS transport, by
``read_ahead``) once, on first use, and never changes afterwards; :meth:`WorkloadCertificate.to_dump` is its
``/config_dump`` entry (spec §8.2).
"""

from __future__ import annotations

import datetime
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ambit.model.identity import SpiffeId
from ambit.tls import contexts, der
from ambit.tls.certinfo import CertificateFields, pem_blocks, read_certificate
from ambit.tls.der import DerError
from ambit.tls.errors import CertificateError, PeerIdentityError
from ambit.tls.spiffe import identity_of


@dataclass(frozen=True, slots=True)
class WorkloadCertificate:
    """A leaf for ``identity`` with its chain (leaf first, root last), private key and trust anchors."""

    identity: SpiffeId
    chain_pem: tuple[bytes, ...] = field(repr=False)
    key_pem: bytes = field(repr=False)
    roots_pem: bytes = field(repr=False)
    not_before: float
    not_after: float
    _contexts: dict[tuple[str, int], ssl.SSLContext] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def from_chain(cls, identity: SpiffeId, chain_pem: Sequence[bytes], key_pem: bytes) -> WorkloadCertificate:
        """Wrap a CA's answer, checking that its leaf names ``identity``; the last element is the root."""
        if not chain_pem:
            raise CertificateError(f"the CA returned an empty chain for {identity}")
        try:
            leaf_der = pem_blocks(chain_pem[0])[:1]
            if not leaf_der:
                raise DerError("no PEM certificate")
            leaf = read_certificate(leaf_der[0])
            issued = identity_of(leaf_der[0])
        except DerError as exc:
            raise CertificateError(f"the CA returned a malformed leaf for {identity}: {exc}") from None
        except PeerIdentityError as exc:
            raise CertificateError(f"the CA returned a leaf without a usable identity for {identity}: {exc}") from None
        if issued != identity:
            raise CertificateError(f"asked the CA for {identity} but got a certificate for {issued}")
        return cls(
            identity=identity,
            chain_pem=tuple(chain_pem),
            key_pem=key_pem,
            roots_pem=chain_pem[-1],
            not_before=leaf.not_before,
            not_after=leaf.not_after,
        )

    @property
    def refresh_at(self) -> float:
        """Half way through the validity period, when the manager fetches a successor."""
        return self.not_before + (self.not_after - self.not_before) / 2

    def client_context(self, *, read_ahead: int = 0) -> ssl.SSLContext:
        """The HBONE client context presenting this certificate (built once per ``read_ahead``: OpenSSL's read
        buffer for every connection, as :func:`ambit.tls.contexts.client_context` takes it; 0 for the event loop's
        TLS transport)."""
        if (context := self._contexts.get(("client", read_ahead))) is None:
            context = self._contexts["client", read_ahead] = contexts.client_context(self, read_ahead=read_ahead)
        return context

    def server_context(self, *, read_ahead: int = 0) -> ssl.SSLContext:
        """The HBONE server context presenting this certificate (built once per ``read_ahead``, as
        :meth:`client_context`)."""
        if (context := self._contexts.get(("server", read_ahead))) is None:
            context = self._contexts["server", read_ahead] = contexts.server_context(self, read_ahead=read_ahead)
        return context

    def to_dump(self, now: float) -> dict[str, Any]:
        """The ``/config_dump`` entry for this certificate (spec §8.2)."""
        presented = self.chain_pem[:-1] if len(self.chain_pem) > 1 else self.chain_pem
        return {
            "identity": str(self.identity),
            "state": "Available" if now < self.not_after else "Expired",
            "certChain": [entry for pem in presented for entry in _dump_certs(pem)],
            "rootCerts": _dump_certs(self.roots_pem),
        }


def _dump_certs(pem: bytes) -> list[dict[str, str]]:
    try:
        return [_dump_cert(block, read_certificate(block)) for block in pem_blocks(pem)]
    except DerError as exc:
        raise CertificateError(f"malformed certificate in a chain: {exc}") from None


def _dump_cert(cert_der: bytes, fields: CertificateFields) -> dict[str, str]:
    return {
        "pem": der.pem(b"CERTIFICATE", cert_der).decode("ascii"),
        "serialNumber": format(fields.serial, "x"),
        "validFrom": _rfc3339(fields.not_before),
        "expirationTime": _rfc3339(fields.not_after),
    }


def _rfc3339(moment: float) -> str:
    return datetime.datetime.fromtimestamp(moment, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
