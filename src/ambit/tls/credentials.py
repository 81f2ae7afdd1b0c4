"""Server certificates from ``kubernetes.io/tls`` Secrets, as an ingress gateway's HTTPS listeners use them.

Theory of operation: :func:`read_tls_secret` judges one Secret (the API dict) and returns either a
:class:`TlsCredential` (the PEM chain and key, and the DNS names the leaf certificate covers, for choosing a
certificate by SNI) or a :class:`CredentialProblem` saying what is wrong, in words fit for a Gateway listener's
``InvalidCertificateRef`` condition. Pure: no I/O, no clock.

Rules:

1. The Secret's ``type`` is ``kubernetes.io/tls``; its ``data`` holds ``tls.crt`` and ``tls.key``, base64.
2. ``tls.crt`` is one or more PEM certificates, the leaf first; ``tls.key`` one PEM private key without a
   password, and it is the key of the leaf (the public keys are equal).
3. The DNS names are the leaf's subjectAltName DNS entries, lower-case (the common name only when there are none,
   as older clients did).
4. Any other input (a missing field, a value of the wrong type, bytes that are not PEM) is a problem; nothing
   raises. Expiry is not judged here: a listener serves what it was given, as Envoy does.
5. Istio's Gateway reads a ``credentialName`` Secret more loosely (:func:`read_istio_credential`, as istiod's
   ``ExtractCertInfo``): any type, the keys ``cert`` and ``key`` if both are non-empty, else ``tls.crt`` and
   ``tls.key``; then rules 2-4. Its CA bundle (:func:`read_ca_bundle`, istiod's ``ExtractRoot``) is the key
   ``cacert`` if non-empty, else ``ca.crt``: one or more PEM certificates.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

__all__ = [
    "TLS_SECRET_TYPE",
    "CredentialProblem",
    "TlsCredential",
    "read_ca_bundle",
    "read_ca_config_map",
    "read_istio_credential",
    "read_pem_pair",
    "read_tls_secret",
    "server_name_matches",
]

TLS_SECRET_TYPE = "kubernetes.io/tls"
_PUBLIC = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


@dataclass(frozen=True, slots=True)
class TlsCredential:
    cert_pem: bytes
    """The chain, leaf first."""
    key_pem: bytes
    names: tuple[str, ...] = ()
    """DNS names the leaf covers (``*.example.com`` wildcards as written), lower-case."""

    def covers(self, server_name: str) -> bool:
        return any(server_name_matches(name, server_name) for name in self.names)


@dataclass(frozen=True, slots=True)
class CredentialProblem:
    message: str


def server_name_matches(pattern: str, server_name: str) -> bool:
    """``pattern`` (a name or ``*.suffix``, one label for the star) covers ``server_name``; case-insensitive."""
    pattern, server_name = pattern.lower(), server_name.lower().rstrip(".")
    if pattern.startswith("*."):
        head, dot, tail = server_name.partition(".")
        return bool(head) and bool(dot) and tail == pattern[2:]
    return pattern == server_name


def _decoded(data: Mapping[str, Any], key: str) -> bytes | CredentialProblem:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        return CredentialProblem(f"it has no {key}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return CredentialProblem(f"its {key} is not base64")


def read_tls_secret(secret: Mapping[str, Any]) -> TlsCredential | CredentialProblem:
    """Rules 1-4."""
    if secret.get("type") != TLS_SECRET_TYPE:
        return CredentialProblem(f"it is not of type {TLS_SECRET_TYPE}")
    data = secret.get("data")
    if not isinstance(data, Mapping):
        return CredentialProblem("it has no data")
    cert_pem, key_pem = _decoded(data, "tls.crt"), _decoded(data, "tls.key")
    if isinstance(cert_pem, CredentialProblem):
        return cert_pem
    if isinstance(key_pem, CredentialProblem):
        return key_pem
    return read_pem_pair(cert_pem, key_pem)


def _first_present(data: Mapping[str, Any], *keys: str) -> str | None:
    return next((k for k in keys if isinstance(data.get(k), str) and data[k]), None)


def read_istio_credential(secret: Mapping[str, Any]) -> TlsCredential | CredentialProblem:
    """Rule 5's server certificate and key."""
    data = secret.get("data")
    if not isinstance(data, Mapping):
        return CredentialProblem("it has no data")
    for cert_key, key_key in (("cert", "key"), ("tls.crt", "tls.key")):
        if _first_present(data, cert_key) and _first_present(data, key_key):
            cert_pem, key_pem = _decoded(data, cert_key), _decoded(data, key_key)
            if isinstance(cert_pem, CredentialProblem):
                return cert_pem
            if isinstance(key_pem, CredentialProblem):
                return key_pem
            return read_pem_pair(cert_pem, key_pem)
    return CredentialProblem("it has neither cert and key nor tls.crt and tls.key")


def read_ca_bundle(secret: Mapping[str, Any]) -> bytes | CredentialProblem:
    """Rule 5's CA bundle: the PEM certificates, or what is wrong."""
    data = secret.get("data")
    key = _first_present(data, "cacert", "ca.crt") if isinstance(data, Mapping) else None
    if key is None or not isinstance(data, Mapping):
        return CredentialProblem("it has no cacert or ca.crt")
    pem = _decoded(data, key)
    if isinstance(pem, CredentialProblem):
        return pem
    try:
        x509.load_pem_x509_certificates(pem)
    except ValueError:
        return CredentialProblem(f"its {key} holds no PEM certificate")
    return pem


def read_ca_config_map(config_map: Mapping[str, Any]) -> bytes | CredentialProblem:
    """The PEM certificates of a ConfigMap's ``ca.crt`` (a Gateway's ``caCertificateRefs``), or what is wrong."""
    data = config_map.get("data")
    text = data.get("ca.crt") if isinstance(data, Mapping) else None
    if not isinstance(text, str) or not text:
        return CredentialProblem("it has no ca.crt")
    pem = text.encode("utf-8", "replace")
    try:
        x509.load_pem_x509_certificates(pem)
    except ValueError:
        return CredentialProblem("its ca.crt holds no PEM certificate")
    return pem


def read_pem_pair(cert_pem: bytes, key_pem: bytes) -> TlsCredential | CredentialProblem:
    """Rules 2-4 for a PEM chain and key (as a Secret's ``tls.crt`` and ``tls.key`` hold them)."""
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        return CredentialProblem("its tls.crt holds no PEM certificate")
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError, NotImplementedError):
        return CredentialProblem("its tls.key is not a PEM private key without a password")
    leaf = chain[0]
    try:
        if key.public_key().public_bytes(*_PUBLIC) != leaf.public_key().public_bytes(*_PUBLIC):
            return CredentialProblem("its tls.key is not the key of the certificate in tls.crt")
    except (ValueError, TypeError, NotImplementedError):
        return CredentialProblem("its certificate's key type is not supported")
    return TlsCredential(cert_pem, key_pem, _names(leaf))


def _names(leaf: x509.Certificate) -> tuple[str, ...]:
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [n.lower() for n in san.get_values_for_type(x509.DNSName)]
    except (x509.ExtensionNotFound, ValueError):
        names = []
    if not names:
        try:
            names = [
                str(a.value).lower()
                for a in leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
                if isinstance(a.value, str)
            ]
        except ValueError:
            names = []
    return tuple(dict.fromkeys(names))
