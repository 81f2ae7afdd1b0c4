"""Whether a look at the plug-in CA's files gives a CA to sign with: the reload decision, pure (spec §5.3).

Theory of operation: Istio's plug-in CA is four files (the ``cacerts`` Secret): ``ca-cert.pem`` (the signing
certificate, optionally followed by its chain), ``ca-key.pem`` (its key), ``cert-chain.pem`` (the chain from the
signing certificate up to the root; optional) and ``root-cert.pem`` (the trust bundle: one root, or the old and
the new root during a root rotation; optional, default the last certificate of the chain). :class:`CaFiles` is one
look at them; :func:`plugin_ca_from_files` turns a set into a :class:`~ambit.controlplane.ca.root.RootCa` or says
in one line why it cannot, and :func:`judge_ca_files` decides what a look means for the CA signing now (istiod's
``handleEvent`` and ``KeyCertBundle.VerifyAndSetAll``). Nothing here reads files or the clock.

Rules, in the order they are checked (the first broken one is the reason given):

1. ``ca-cert.pem`` and ``ca-key.pem`` exist (:attr:`Refusal.INCOMPLETE`); a set with neither changed is not looked
   at again (:attr:`CaEvent.UNCHANGED`).
2. Every file present parses: certificates as PEM X.509, the key as a PEM ECDSA P-256 key
   (:attr:`Refusal.MALFORMED`); a file cut short mid-write fails here.
3. The key belongs to the signing certificate (:attr:`Refusal.KEY_MISMATCH`).
4. The signing certificate is a CA (BasicConstraints ``ca=True``; :attr:`Refusal.NOT_A_CA`).
5. The signing certificate leads, through the certificates of ``ca-cert.pem`` and ``cert-chain.pem``, each one
   signed by the next, to a root of the trust bundle (:attr:`Refusal.FOREIGN_ROOT`): a CA we would sign with but
   that workloads would not trust is never used.
6. No certificate on that path has expired (:attr:`Refusal.EXPIRED`). A ``notBefore`` in the future is accepted
   (the CA's maker may have a clock ahead of ours); issued certificates start no earlier than it.
7. On a reload only: the new trust bundle and the one in use are equal, or one holds every root of the other
   (:attr:`Refusal.ROOT_REPLACED`, istiod's multi-root rule). A root rotation therefore goes in three steps, each
   waiting until every workload holds a certificate issued after the previous one (one certificate lifetime):
   add the new root to ``root-cert.pem``; switch ``ca-cert.pem``/``ca-key.pem``/``cert-chain.pem`` to the new
   intermediate; remove the old root.
8. A set equal to the one in use (same signer, key, chain and bundle) is :attr:`CaEvent.UNCHANGED`.

A refused set leaves the CA in use as it was: the old CA keeps signing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from ambit.controlplane.ca.errors import RootCaError
from ambit.controlplane.ca.rootca import RootCa
from ambit.tls.certs import CertificateError, KeyPair

CA_CERT_FILE = "ca-cert.pem"
CA_KEY_FILE = "ca-key.pem"
CERT_CHAIN_FILE = "cert-chain.pem"
ROOT_CERT_FILE = "root-cert.pem"
MAX_PATH_LENGTH = 8
"""Certificates between the signer and its root that rule 5 follows at most."""


class CaEvent(enum.Enum):
    UNCHANGED = "unchanged"
    RELOAD = "reload"
    REFUSED = "refused"


class Refusal(enum.Enum):
    """Why a set of files was not taken (the rule it broke); the value is the label logs and Events use."""

    INCOMPLETE = "incomplete"
    MALFORMED = "malformed"
    KEY_MISMATCH = "key_mismatch"
    NOT_A_CA = "not_a_ca"
    FOREIGN_ROOT = "foreign_root"
    EXPIRED = "expired"
    ROOT_REPLACED = "root_replaced"


class PluginCaError(RootCaError):
    """A set of plug-in CA files that cannot sign: ``refusal`` names the rule it broke."""

    def __init__(self, refusal: Refusal, message: str) -> None:
        super().__init__(message)
        self.refusal = refusal


@dataclass(frozen=True, slots=True)
class CaFiles:
    """One look at the plug-in CA's files: each file's bytes, None when it is absent."""

    cert: bytes | None
    key: bytes | None
    chain: bytes | None = None
    root: bytes | None = None


@dataclass(frozen=True, slots=True)
class CaVerdict:
    event: CaEvent
    ca: RootCa | None = None
    """The CA to sign with from now on (``RELOAD``)."""
    refusal: Refusal | None = None
    message: str = ""
    """Why the set was refused (``REFUSED``), or what changed (``RELOAD``)."""


def plugin_ca_from_files(files: CaFiles, now: float, *, where: str = "the plug-in CA") -> RootCa:
    """Rules 1-6: the CA the files describe, else :class:`PluginCaError` naming the broken rule."""
    if files.cert is None or files.key is None:
        missing = " and ".join(n for n, v in ((CA_CERT_FILE, files.cert), (CA_KEY_FILE, files.key)) if v is None)
        raise PluginCaError(Refusal.INCOMPLETE, f"{where}: {missing} missing")
    given = _certificates(files.cert, CA_CERT_FILE, where)
    extra = _certificates(files.chain, CERT_CHAIN_FILE, where) if files.chain else []
    signer = given[0]
    pair = KeyPair(cert_pem=_pem(signer), key_pem=files.key)
    try:
        key = pair.private_key
    except CertificateError as exc:
        raise PluginCaError(Refusal.MALFORMED, f"{where}: {CA_KEY_FILE}: {exc}") from None
    if signer.public_key() != key.public_key():
        raise PluginCaError(Refusal.KEY_MISMATCH, f"{where}: {CA_KEY_FILE} is not the key of {CA_CERT_FILE}")
    if not _is_ca(signer):
        raise PluginCaError(
            Refusal.NOT_A_CA, f"{where}: the certificate is not a CA (BasicConstraints ca=True is missing)"
        )
    if files.root is not None:
        roots = _certificates(files.root, ROOT_CERT_FILE, where)
        bundle = files.root
    else:
        roots = [(given + extra)[-1]]
        bundle = _pem(roots[0])
    path = _path_to_root(signer, [*given[1:], *extra], roots)
    if path is None:
        raise PluginCaError(
            Refusal.FOREIGN_ROOT, f"{where}: {CA_CERT_FILE} does not lead to a root of {ROOT_CERT_FILE}"
        )
    for cert in path:
        if cert.not_valid_after_utc.timestamp() <= now:
            subject = cert.subject.rfc4514_string() or "(no subject)"
            raise PluginCaError(
                Refusal.EXPIRED, f"{where}: {subject} expired at {cert.not_valid_after_utc.isoformat()}"
            )
    root_ders = {_der(r) for r in roots}
    presented = b"".join(_pem(c) for c in path if _der(c) not in root_ders) or _pem(signer)
    return RootCa(signer=KeyPair(cert_pem=presented, key_pem=files.key), root_pem=bundle)


def judge_ca_files(current: RootCa, files: CaFiles, now: float, *, where: str = "the plug-in CA") -> CaVerdict:
    """Rules 1-8 for one look at the files, against the CA signing now."""
    try:
        candidate = plugin_ca_from_files(files, now, where=where)
    except PluginCaError as exc:
        return CaVerdict(CaEvent.REFUSED, refusal=exc.refusal, message=str(exc))
    old_roots, new_roots = _der_set(current.root_pem), _der_set(candidate.root_pem)
    if not (old_roots <= new_roots or new_roots <= old_roots):
        return CaVerdict(
            CaEvent.REFUSED,
            refusal=Refusal.ROOT_REPLACED,
            message=f"{where}: {ROOT_CERT_FILE} replaces the roots in use; add the new root next to the old one "
            "first, and remove the old one only once nothing uses it",
        )
    if candidate.signer == current.signer and old_roots == new_roots:
        return CaVerdict(CaEvent.UNCHANGED)
    changes = []
    if _der_set(candidate.signer.cert_pem) != _der_set(current.signer.cert_pem):
        changes.append(f"signing certificate {_describe(candidate.signer.cert_pem)}")
    if new_roots != old_roots:
        changes.append(f"trust bundle of {len(new_roots)} root(s) (was {len(old_roots)})")
    return CaVerdict(CaEvent.RELOAD, ca=candidate, message=", ".join(changes) or "key")


def _certificates(data: bytes, name: str, where: str) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise PluginCaError(Refusal.MALFORMED, f"{where}: {name} is not PEM certificates: {exc}") from None
    return certs


def _path_to_root(
    signer: x509.Certificate, pool: list[x509.Certificate], roots: list[x509.Certificate]
) -> list[x509.Certificate] | None:
    """The certificates from ``signer`` to a root of ``roots`` (root included), each signed by the next."""
    path = [signer]
    root_ders = {_der(r) for r in roots}
    for _ in range(MAX_PATH_LENGTH + 1):
        cert = path[-1]
        if _der(cert) in root_ders:
            return path
        issuer = next((r for r in roots if _issued_by(cert, r)), None)
        if issuer is not None:
            return [*path, issuer]
        issuer = next((c for c in pool if c not in path and _issued_by(cert, c)), None)
        if issuer is None:
            return None
        path.append(issuer)
    return None


def _issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    if not _is_ca(issuer):
        return False
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def _der_set(pem: bytes) -> frozenset[bytes]:
    try:
        return frozenset(_der(c) for c in x509.load_pem_x509_certificates(pem))
    except ValueError:
        return frozenset()


def _describe(pem: bytes) -> str:
    cert = x509.load_pem_x509_certificate(pem)
    return f"{cert.subject.rfc4514_string() or '(no subject)'} serial {format(cert.serial_number, 'x')}"
