"""The certificate signing request a node proxy sends for one SPIFFE identity, encoded by hand (RFC 2986).

Theory of operation: the request has one fixed shape, so it is assembled from :func:`ambit.tls.der.encode` rather
than by an X.509 library::

    CertificationRequest ::= SEQUENCE {
        certificationRequestInfo SEQUENCE {
            version       INTEGER 0,
            subject       Name (the empty SEQUENCE),
            subjectPKInfo (the key's SubjectPublicKeyInfo, as given),
            attributes    [0] { SEQUENCE { extensionRequest, SET { Extensions { SEQUENCE {
                subjectAltName, critical TRUE, OCTET STRING { SEQUENCE { [6] uri } } } } } } } },
        signatureAlgorithm SEQUENCE { ecdsa-with-SHA256 },
        signature          BIT STRING (the DER ECDSA signature over certificationRequestInfo) }

This is byte for byte what cryptography's ``CertificateSigningRequestBuilder`` writes for an empty subject and one
critical URI SAN (the tests compare the two). The signature comes from ``sign`` (:mod:`ambit.tls.eckey`).

Invariant: the URI is ASCII (an IA5String); anything else is refused before any bytes are built. Pure.
"""

from __future__ import annotations

from collections.abc import Callable

from ambit.tls import der

_EXTENSION_REQUEST = der.encode(der.OBJECT_IDENTIFIER, bytes.fromhex("2a864886f70d01090e"))  # 1.2.840.113549.1.9.14
_SUBJECT_ALT_NAME = der.encode(der.OBJECT_IDENTIFIER, bytes.fromhex("551d11"))  # 2.5.29.17
_ECDSA_WITH_SHA256 = der.encode(der.SEQUENCE, der.encode(der.OBJECT_IDENTIFIER, bytes.fromhex("2a8648ce3d040302")))
_CRITICAL = der.encode(der.BOOLEAN, b"\xff")
_VERSION_1 = der.encode(der.INTEGER, b"\x00")
_EMPTY_NAME = der.encode(der.SEQUENCE)
_ATTRIBUTES = 0xA0
_URI = 0x86


def request_info(uri: str, public_key_der: bytes) -> bytes:
    """The DER ``certificationRequestInfo`` naming ``uri`` as the one, critical, subject alternative name."""
    if not uri.isascii():
        raise ValueError(f"a URI in a certificate is ASCII, not {uri!r}")
    names = der.encode(der.SEQUENCE, der.encode(_URI, uri.encode("ascii")))
    extension = der.encode(der.SEQUENCE, _SUBJECT_ALT_NAME, _CRITICAL, der.encode(der.OCTET_STRING, names))
    attribute = der.encode(der.SEQUENCE, _EXTENSION_REQUEST, der.encode(der.SET, der.encode(der.SEQUENCE, extension)))
    return der.encode(der.SEQUENCE, _VERSION_1, _EMPTY_NAME, public_key_der, der.encode(_ATTRIBUTES, attribute))


def signing_request(uri: str, public_key_der: bytes, sign: Callable[[bytes], bytes]) -> bytes:
    """The DER CSR for ``uri`` and the key whose SubjectPublicKeyInfo is ``public_key_der``, signed by ``sign``
    (ECDSA with SHA-256 over the request info, DER signature)."""
    info = request_info(uri, public_key_der)
    return der.encode(der.SEQUENCE, info, _ECDSA_WITH_SHA256, der.encode(der.BIT_STRING, b"\x00", sign(info)))
