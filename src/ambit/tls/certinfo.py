"""What the node proxy reads from an X.509 certificate: serial, validity and URI names, straight from the DER.

Theory of operation: the data path needs four fields of a certificate (to judge a peer's SPIFFE id, to know when
its own leaf needs renewing, and for ``/config_dump``), while cryptography's X.509 stack costs a process about
10 MiB as soon as it is imported. :func:`read_certificate` walks the RFC 5280 structure with :mod:`ambit.tls.der`
and keeps those fields; :func:`pem_blocks` turns PEM text into the DER of each certificate in it. Signatures and
chains are not checked here: the peers' certificates were verified by OpenSSL during the handshake, and the
node proxy's own chain comes from its CA over an authenticated channel. For the same reason the contents of the
fields it does not use (a name's strings, the key's parameters, other extensions' values) are checked for their
structure only: OpenSSL parsed them, and the CA's signature covers them, before a peer's certificate gets here.

Invariants (each a :class:`~ambit.tls.der.DerError` when broken):

- The whole buffer is one certificate: ``SEQUENCE {tbsCertificate, signatureAlgorithm, signature}`` and no more;
  its two signature algorithms are the same (as OpenSSL requires), names and the key are well-formed.
- Version v1, v2 or v3; a positive serial; validity times in RFC 5280's forms (``UTCTime`` ``YYMMDDHHMMSSZ``, years
  from 1950; ``GeneralizedTime`` ``YYYYMMDDHHMMSSZ``).
- Extensions, when present, are well formed and no extension appears twice; the subject alternative names are
  general names of the kinds RFC 5280 defines other than ``x400Address`` and ``ediPartyName``, and URIs are ASCII.

Pure: no I/O.
"""

from __future__ import annotations

import binascii
import calendar
import itertools
import re
from dataclasses import dataclass

from ambit.tls import der
from ambit.tls.der import DerError

SUBJECT_ALT_NAME_OID = bytes((0x55, 0x1D, 0x11))
"""2.5.29.17, the content of the OBJECT IDENTIFIER naming the subjectAltName extension."""

_URI = 0x86
_GENERAL_NAME_TAGS = frozenset({0xA0, 0x81, 0x82, 0xA4, _URI, 0x87, 0x88})
"""otherName, rfc822Name, dNSName, directoryName, uniformResourceIdentifier, iPAddress, registeredID."""
_EXTENSIONS = 0xA3
_VERSION = 0xA0
_OPTIONAL_FIELDS = frozenset(
    fields for count in range(4) for fields in itertools.combinations((0x81, 0x82, _EXTENSIONS), count)
)
"""issuerUniqueID, subjectUniqueID and extensions: each at most once, in this order."""
_PEM_BLOCK = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n([A-Za-z0-9+/=\r\n]*?)-----END CERTIFICATE-----")
_EXTENSION_SHAPES = (
    [der.OBJECT_IDENTIFIER, der.OCTET_STRING],
    [der.OBJECT_IDENTIFIER, der.BOOLEAN, der.OCTET_STRING],
)
"""extnID, critical (DEFAULT FALSE) and extnValue."""
_PADDED_SUBIDENTIFIER = re.compile(rb"(?:^|[\x00-\x7f])\x80")
"""An object identifier component that starts with 0x80: not in its shortest form."""
_TIME_DIGITS = re.compile(rb"[0-9]{12}Z|[0-9]{14}Z")


@dataclass(frozen=True, slots=True)
class CertificateFields:
    """The fields the node proxy uses; ``uris`` is None when the certificate has no subjectAltName extension."""

    serial: int
    not_before: float
    not_after: float
    uris: tuple[str, ...] | None


def read_certificate(data: bytes) -> CertificateFields:
    """The fields of the DER certificate ``data``; :class:`~ambit.tls.der.DerError` if it is not one."""
    start, end = der.read_all(data, der.SEQUENCE)
    parts = der.children(data, start, end)
    if len(parts) != 3 or [tag for tag, _, _ in parts] != [der.SEQUENCE, der.SEQUENCE, der.BIT_STRING]:
        raise DerError("a certificate is tbsCertificate, signatureAlgorithm and signature")
    _, tbs_start, tbs_end = parts[0]
    fields = der.children(data, tbs_start, tbs_end)
    version = _version(data, fields.pop(0)) if fields and fields[0][0] == _VERSION else 0
    if len(fields) < 6:
        raise DerError("tbsCertificate is missing fields")
    serial_field, algorithm, issuer, validity, subject, key = fields[:6]
    if serial_field[0] != der.INTEGER or any(
        tag != der.SEQUENCE for tag, _, _ in (algorithm, issuer, validity, subject, key)
    ):
        raise DerError("tbsCertificate fields are of the wrong types")
    _check_algorithm(data, algorithm)
    _check_algorithm(data, parts[1])
    if data[algorithm[1] : algorithm[2]] != data[parts[1][1] : parts[1][2]]:
        raise DerError("the two signature algorithms differ")
    _check_bit_string(data, parts[2])
    _check_name(data, issuer)
    _check_name(data, subject)
    key_parts = der.children(data, key[1], key[2])
    if [tag for tag, _, _ in key_parts] != [der.SEQUENCE, der.BIT_STRING]:
        raise DerError("malformed subjectPublicKeyInfo")
    _check_algorithm(data, key_parts[0])
    _check_bit_string(data, key_parts[1])
    serial = _integer(data, serial_field)
    if serial <= 0:
        raise DerError("the serial number is not positive")
    times = der.children(data, validity[1], validity[2])
    if len(times) != 2:
        raise DerError("validity is notBefore and notAfter")
    optional = fields[6:]
    optional_tags = tuple(tag for tag, _, _ in optional)
    if optional_tags not in _OPTIONAL_FIELDS:
        raise DerError("unexpected fields after subjectPublicKeyInfo")
    uris = None
    if optional_tags and optional_tags[-1] == _EXTENSIONS:
        if version != 2:
            raise DerError("only a v3 certificate has extensions")
        uris = _uris(data, optional[-1])
    return CertificateFields(serial, _time(data, times[0]), _time(data, times[1]), uris)


def pem_blocks(pem: bytes) -> list[bytes]:
    """The DER of each ``CERTIFICATE`` block in ``pem``, in order (text between blocks is ignored)."""
    try:
        return [binascii.a2b_base64(match.group(1), strict_mode=False) for match in _PEM_BLOCK.finditer(pem)]
    except binascii.Error as exc:
        raise DerError(f"bad base64 in a PEM block: {exc}") from None


def _check_algorithm(data: bytes, element: tuple[int, int, int]) -> None:
    """AlgorithmIdentifier: an OBJECT IDENTIFIER and at most one parameters element."""
    items = der.children(data, element[1], element[2])
    if not 1 <= len(items) <= 2 or items[0][0] != der.OBJECT_IDENTIFIER:
        raise DerError("malformed algorithm identifier")
    _check_oid(data, items[0])


def _check_oid(data: bytes, element: tuple[int, int, int]) -> None:
    value = data[element[1] : element[2]]
    if not value or value[-1] & 0x80 or _PADDED_SUBIDENTIFIER.search(value) is not None:
        raise DerError("malformed object identifier")


def _check_bit_string(data: bytes, element: tuple[int, int, int]) -> None:
    value = data[element[1] : element[2]]
    if not value or value[0] > 7 or (len(value) == 1 and value[0] != 0):
        raise DerError("malformed BIT STRING")
    if value[0] and value[-1] & ((1 << value[0]) - 1):
        raise DerError("BIT STRING padding bits are not zero")


def _check_name(data: bytes, element: tuple[int, int, int]) -> None:
    """Name: SEQUENCE OF non-empty SET OF SEQUENCE {type OBJECT IDENTIFIER, value}."""
    for tag, start, end in der.children(data, element[1], element[2]):
        attributes = der.children(data, start, end) if tag == der.SET else []
        if not attributes:
            raise DerError("malformed name")
        for attribute_tag, attribute_start, attribute_end in attributes:
            items = der.children(data, attribute_start, attribute_end) if attribute_tag == der.SEQUENCE else []
            if len(items) != 2 or items[0][0] != der.OBJECT_IDENTIFIER:
                raise DerError("malformed name attribute")
            _check_oid(data, items[0])


def _version(data: bytes, field: tuple[int, int, int]) -> int:
    _, start, end = field
    tag, content_start, content_end = der.read(data, start, end)
    if tag != der.INTEGER or content_end != end:
        raise DerError("malformed version")
    version = _integer(data, (tag, content_start, content_end))
    if version not in (0, 1, 2):
        raise DerError(f"unknown certificate version {version}")
    return version


def _integer(data: bytes, element: tuple[int, int, int]) -> int:
    _, start, end = element
    value = data[start:end]
    if not value or (len(value) > 1 and (value[0], value[1] & 0x80) in ((0x00, 0), (0xFF, 0x80))):
        raise DerError("INTEGER not in its shortest form")
    return int.from_bytes(value, "big", signed=True)


def _time(data: bytes, element: tuple[int, int, int]) -> float:
    tag, start, end = element
    text = data[start:end]
    if _TIME_DIGITS.fullmatch(text) is None or (tag, len(text)) not in ((der.UTC_TIME, 13), (der.GENERALIZED_TIME, 15)):
        raise DerError("validity time not in RFC 5280's form")
    if tag == der.UTC_TIME:
        short = int(text[:2])
        year, rest = (1900 + short if short >= 50 else 2000 + short), text[2:]
    else:
        year, rest = int(text[:4]), text[4:]
    month, day, hour, minute, second = (int(rest[i : i + 2]) for i in range(0, 10, 2))
    if not (1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]):
        raise DerError("validity date does not exist")
    if hour > 23 or minute > 59 or second > 59:
        raise DerError("validity time does not exist")
    return float(calendar.timegm((year, month, day, hour, minute, second)))


def _uris(data: bytes, field: tuple[int, int, int]) -> tuple[str, ...] | None:
    _, start, end = field
    tag, list_start, list_end = der.read(data, start, end)
    if tag != der.SEQUENCE or list_end != end:
        raise DerError("malformed extensions")
    seen: set[bytes] = set()
    san: tuple[int, int] | None = None
    for tag, ext_start, ext_end in der.children(data, list_start, list_end):
        parts = der.children(data, ext_start, ext_end) if tag == der.SEQUENCE else []
        tags = [part[0] for part in parts]
        if tags not in _EXTENSION_SHAPES:
            raise DerError("malformed extension")
        if tags[1] == der.BOOLEAN and data[parts[1][1] : parts[1][2]] not in (b"\x00", b"\xff"):
            raise DerError("malformed extension criticality")
        _check_oid(data, parts[0])
        oid = data[parts[0][1] : parts[0][2]]
        if oid in seen:
            raise DerError("an extension appears twice")
        seen.add(oid)
        if oid == SUBJECT_ALT_NAME_OID:
            san = parts[-1][1], parts[-1][2]
    if san is None:
        return None
    names_start, names_end = der.read_all(data[san[0] : san[1]], der.SEQUENCE)
    value = data[san[0] : san[1]]
    uris = []
    for tag, name_start, name_end in der.children(value, names_start, names_end):
        if tag not in _GENERAL_NAME_TAGS:
            raise DerError(f"unsupported general name type {tag:#04x}")
        if tag == _URI:
            try:
                uris.append(value[name_start:name_end].decode("ascii"))
            except UnicodeDecodeError:
                raise DerError("a URI name is not ASCII") from None
    return tuple(uris)
