"""Certificate revocation lists of a plugged-in CA (Istio's ``ca-crl.pem``): the file's parser and the verdict.

Theory of operation: the control plane replicates the plug-in CA's ``ca-crl.pem`` into ConfigMap ``istio-ca-crl``
and the node proxy reads it from a file (``CRL_PATH``). :meth:`RevocationList.parse` turns the file's bytes into a
table of CRLs keyed by issuer name; :meth:`RevocationList.find_revoked` answers, for a peer chain OpenSSL has
already verified (leaf first, trust anchor last), whether any certificate in it is revoked. Nothing here reads a
file or the clock.

Rules:

1. The file is a bundle of PEM ``X509 CRL`` blocks, or one DER CRL. Empty (or blank) means no CRLs. Text between
   blocks is ignored (``openssl crl -text`` writes some); a block of another type, a block that does not parse,
   or bytes that are neither PEM nor DER refuse the *whole* file with a :class:`RevocationError` naming the
   block: the caller then keeps the list it had (an unreadable file never turns checks off).
2. A CRL speaks for the CA that signed it. It applies to a certificate of the chain only when the certificate's
   issuer name equals the CRL's issuer name *and* the CRL's signature verifies with the public key of the
   certificate's issuer in the verified chain (the next certificate), whose KeyUsage, when present, allows
   ``cRLSign``. A CRL signed by anyone else revokes nothing: whoever can write the file (or the ConfigMap) but
   holds no CA key cannot cut a workload off. Signatures are checked lazily, once per (CRL, issuer key).
3. A chain is revoked when a certificate in it other than the last (the trust anchor, which only leaves the trust
   store) has its serial number listed by a CRL that applies to it (rule 2).
4. An expired CRL (``nextUpdate`` in the past) still applies, as in ztunnel: a stale list of revoked certificates
   is better than none. Delta CRLs are refused (rule 1): they only make sense with their base.
5. At parse time each CRL is also checked against the anchors the caller knows (the mesh roots, the CA's own
   chain), for reporting only: a CRL naming a known CA that did not sign it is dropped with an error in
   :attr:`RevocationList.errors`; one naming a CA not known yet (an intermediate met only in peer chains) is kept
   and judged per chain by rule 2.

Invariants: parsing never raises anything but :class:`RevocationError`; :meth:`find_revoked` never raises
anything but :class:`RevocationError` (a chain it cannot read is an error, so callers can refuse it).
"""

from __future__ import annotations

import datetime
import enum
import functools
import itertools
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.utils import CryptographyDeprecationWarning

from ambit.errors import AmbitError

_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]{1,64})-----(.*?)-----END \1-----", re.DOTALL)
_CRL_LABEL = b"X509 CRL"
_PARSE_ERRORS = (
    ValueError,
    TypeError,
    UnsupportedAlgorithm,
    CryptographyDeprecationWarning,
    x509.DuplicateExtension,
    x509.InvalidVersion,
    x509.UnsupportedGeneralNameType,
)


class RevocationError(AmbitError):
    """A CRL file that cannot be read as CRLs, or a peer chain that cannot be checked against them."""


class CrlStatus(enum.Enum):
    VERIFIED = "verified"
    """Signed by one of the anchors known at parse time."""
    UNVERIFIED = "unverified"
    """Names a CA not known at parse time; applies only to chains whose issuer verifies it (rule 2)."""


@dataclass(frozen=True, slots=True)
class CrlInfo:
    """One CRL of the file, for ``/config_dump``."""

    issuer: str
    revoked: int
    this_update: datetime.datetime
    next_update: datetime.datetime | None
    status: CrlStatus

    def to_dump(self, now: datetime.datetime) -> dict[str, object]:
        return {
            "issuer": self.issuer,
            "revokedCertificates": self.revoked,
            "thisUpdate": self.this_update.isoformat(),
            "nextUpdate": self.next_update.isoformat() if self.next_update else "",
            "expired": self.next_update is not None and self.next_update < now,
            "status": self.status.value,
        }


@dataclass(frozen=True, slots=True)
class Revocation:
    """Why a chain is revoked: which certificate (0 is the leaf), its serial, and the CRL's issuer."""

    position: int
    serial: int
    subject: str
    issuer: str

    def __str__(self) -> str:
        what = "leaf" if self.position == 0 else f"chain certificate {self.position} ({self.subject or 'no subject'})"
        return f"{what} with serial {self.serial:x} is revoked by the CRL of {self.issuer}"


class RevocationList:
    """The CRLs of one file; immutable once parsed except for the memo of signature checks (rule 2)."""

    __slots__ = ("_applies", "_by_issuer", "errors", "infos")

    def __init__(self, crls: Iterable[x509.CertificateRevocationList] = (), *, anchors: Sequence[bytes] = ()) -> None:
        """``crls`` already parsed; ``anchors`` are PEM certificates known now (rule 5)."""
        known = _certificates(anchors)
        by_issuer: dict[bytes, list[_Crl]] = {}
        infos: list[CrlInfo] = []
        errors: list[str] = []
        for crl in crls:
            issuer_der = crl.issuer.public_bytes()
            issuer = crl.issuer.rfc4514_string()
            namesakes = [cert for cert in known if cert.subject.public_bytes() == issuer_der]
            status = CrlStatus.UNVERIFIED
            if namesakes:
                if not any(_signed_by(crl, cert) for cert in namesakes):
                    errors.append(f"the CRL of {issuer or 'an empty name'} is not signed by that CA: ignored")
                    continue
                status = CrlStatus.VERIFIED
            by_issuer.setdefault(issuer_der, []).append(_Crl(crl, frozenset(entry.serial_number for entry in crl)))
            infos.append(CrlInfo(issuer, len(crl), crl.last_update_utc, crl.next_update_utc, status))
        self._by_issuer = {name: tuple(found) for name, found in by_issuer.items()}
        self._applies: dict[tuple[int, bytes], bool] = {}
        """(id of a CRL, DER of an issuer certificate) → whether the CRL applies under it (rule 2)."""
        self.infos: tuple[CrlInfo, ...] = tuple(infos)
        self.errors: tuple[str, ...] = tuple(errors)

    @classmethod
    def parse(cls, data: bytes, *, anchors: Sequence[bytes] = ()) -> RevocationList:
        """Rule 1; :class:`RevocationError` for a file that is not CRLs."""
        return cls(parse_crls(data), anchors=anchors)

    def __len__(self) -> int:
        return len(self.infos)

    def find_revoked(self, chain: Sequence[bytes]) -> Revocation | None:
        """Rules 2-3 for a verified DER chain (leaf first, anchor last); None when nothing in it is revoked."""
        if not self._by_issuer or len(chain) < 2:
            return None
        certs = [_certificate(der) for der in chain]
        for position, (cert, issuer) in enumerate(itertools.pairwise(certs)):
            for crl in self._by_issuer.get(cert.issuer_der, ()):
                if cert.serial in crl.serials and self._applies_under(crl, chain[position + 1], issuer.cert):
                    subject = cert.cert.subject.rfc4514_string()
                    return Revocation(position, cert.serial, subject, crl.crl.issuer.rfc4514_string())
        return None

    def _applies_under(self, crl: _Crl, issuer_der: bytes, issuer: x509.Certificate) -> bool:
        key = (id(crl), issuer_der)
        verdict = self._applies.get(key)
        if verdict is None:
            verdict = self._applies[key] = _may_sign_crls(issuer) and _signed_by(crl.crl, issuer)
        return verdict


@dataclass(frozen=True, slots=True)
class _Crl:
    crl: x509.CertificateRevocationList
    serials: frozenset[int]
    """The revoked serial numbers, for a lookup per chain certificate without scanning the list."""


@dataclass(frozen=True, slots=True)
class _Cert:
    cert: x509.Certificate
    issuer_der: bytes
    serial: int


def parse_crls(data: bytes) -> list[x509.CertificateRevocationList]:
    """Rule 1: the CRLs of a file's bytes, each fully read; :class:`RevocationError` names the bad block."""
    if not data.strip():
        return []
    blocks = list(_PEM_BLOCK.finditer(data))
    if not blocks:
        if data[:1] != b"\x30":
            raise RevocationError("neither PEM (no '-----BEGIN X509 CRL-----' block) nor a DER CRL")
        return [_load(data, "the DER CRL", der=True)]
    crls = []
    for number, block in enumerate(blocks, 1):
        label = block.group(1)
        if label != _CRL_LABEL:
            kind = label.decode("ascii", "replace")
            raise RevocationError(f"PEM block {number} is a {kind}, not an X509 CRL")
        crls.append(_load(block.group(0), f"PEM block {number}", der=False))
    return crls


def _load(data: bytes, what: str, *, der: bool) -> x509.CertificateRevocationList:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", CryptographyDeprecationWarning)
            crl = x509.load_der_x509_crl(data) if der else x509.load_pem_x509_crl(data)
            # Read everything now: the library parses lazily, and a bad entry must fail here, not mid-handshake.
            crl.issuer.rfc4514_string()
            _ = crl.last_update_utc, crl.next_update_utc
            extensions = list(crl.extensions)
            for entry in crl:
                _ = entry.serial_number, entry.revocation_date_utc
                list(entry.extensions)
    except _PARSE_ERRORS as exc:
        raise RevocationError(f"{what} is not a readable CRL: {exc}") from None
    if any(isinstance(ext.value, x509.DeltaCRLIndicator) for ext in extensions):
        raise RevocationError(f"{what} is a delta CRL; only complete CRLs are supported")
    return crl


def _signed_by(crl: x509.CertificateRevocationList, cert: x509.Certificate) -> bool:
    try:
        return bool(crl.is_signature_valid(cert.public_key()))  # type: ignore[arg-type]
    except (InvalidSignature, *_PARSE_ERRORS):
        return False  # a key we cannot read verifies nothing


def _may_sign_crls(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.KeyUsage).value.crl_sign)
    except x509.ExtensionNotFound:
        return True
    except _PARSE_ERRORS:
        return False


def _certificates(pems: Sequence[bytes]) -> list[x509.Certificate]:
    """The certificates of several PEM bundles; bundles that do not parse add nothing (they are reported by their
    owners, not here)."""
    certs: list[x509.Certificate] = []
    for pem in pems:
        try:
            certs.extend(x509.load_pem_x509_certificates(pem))
        except _PARSE_ERRORS:
            continue
    return certs


@functools.lru_cache(maxsize=1024)
def _parsed(der: bytes) -> _Cert | None:
    """A peer certificate, parsed once however many handshakes present it (a pure function of the bytes)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", CryptographyDeprecationWarning)
            cert = x509.load_der_x509_certificate(der)
            parsed = _Cert(cert, cert.issuer.public_bytes(), cert.serial_number)
            cert.subject.rfc4514_string()
    except _PARSE_ERRORS:
        return None
    return parsed


def _certificate(der: bytes) -> _Cert:
    cert = _parsed(der)
    if cert is None:
        raise RevocationError("a certificate of the peer chain cannot be read; revocation cannot be checked")
    return cert
