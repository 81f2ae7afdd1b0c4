"""Fresh ECDSA P-256 keys for workload certificates, made by the libcrypto that Python's ``ssl`` already loaded.

Theory of operation: a node proxy needs, per certificate, one new P-256 key, its public half as a
SubjectPublicKeyInfo, one ECDSA-SHA256 signature (over its CSR) and the private key as PKCS#8 PEM for
``load_cert_chain``. cryptography can do all of it, but importing it maps its own copy of OpenSSL (about 10 MiB of
resident memory per process). The libcrypto that ``_ssl`` is linked with is already in the process, so
:func:`new_key` calls it through ctypes, looking the functions up through ``_ssl``'s own file so that no other
library is picked. Where that is impossible (no OpenSSL 3 functions, a static build that hides its symbols) the
same operations come from cryptography (:class:`_CryptographyKey`); both give the same encodings and both are
tested.

Invariants:

- Every OpenSSL object made here is freed, on errors too; a failed OpenSSL call raises
  :class:`~ambit.tls.errors.CertificateError` and clears OpenSSL's error queue, which ``ssl`` shares.
- Keys come only from OpenSSL's own generator (``EVP_PKEY_generate``); nothing here chooses random numbers.
"""

from __future__ import annotations

import _ssl
import ctypes
import functools
import sys
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from ambit.tls import der as der_codec
from ambit.tls.errors import CertificateError

_CURVE = b"P-256"


class EcKey(Protocol):
    """A P-256 private key: its public half (DER SubjectPublicKeyInfo), ECDSA-SHA256 signing, its PKCS#8 PEM."""

    def public_key_der(self) -> bytes: ...

    def sign_sha256(self, data: bytes) -> bytes:
        """The DER ``ECDSA-Sig-Value`` over SHA-256 of ``data``."""
        ...

    def private_key_pem(self) -> bytes: ...


def new_key() -> EcKey:
    """A fresh P-256 key from the process's libcrypto, or from cryptography where that cannot be used."""
    lib = _libcrypto()
    return _OpenSslKey(lib) if lib is not None else _CryptographyKey()


@dataclass(frozen=True, slots=True)
class _LibCrypto:
    functions: Any
    """The ``ctypes.CDLL`` with the argument and result types of the functions below set."""


_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "EVP_PKEY_CTX_new_from_name": ([ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p], ctypes.c_void_p),
    "EVP_PKEY_keygen_init": ([ctypes.c_void_p], ctypes.c_int),
    "EVP_PKEY_CTX_set_group_name": ([ctypes.c_void_p, ctypes.c_char_p], ctypes.c_int),
    "EVP_PKEY_generate": ([ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)], ctypes.c_int),
    "EVP_PKEY_CTX_free": ([ctypes.c_void_p], None),
    "EVP_PKEY_free": ([ctypes.c_void_p], None),
    "i2d_PUBKEY": ([ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int),
    "EVP_PKEY2PKCS8": ([ctypes.c_void_p], ctypes.c_void_p),
    "i2d_PKCS8_PRIV_KEY_INFO": ([ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int),
    "PKCS8_PRIV_KEY_INFO_free": ([ctypes.c_void_p], None),
    "EVP_MD_CTX_new": ([], ctypes.c_void_p),
    "EVP_MD_CTX_free": ([ctypes.c_void_p], None),
    "EVP_sha256": ([], ctypes.c_void_p),
    "EVP_DigestSignInit": (
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p],
        ctypes.c_int,
    ),
    "EVP_DigestSign": (
        [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p, ctypes.c_size_t],
        ctypes.c_int,
    ),
    "ERR_clear_error": ([], None),
}


@functools.cache
def _libcrypto() -> _LibCrypto | None:
    path = getattr(_ssl, "__file__", None)
    if sys.implementation.name != "cpython" or path is None:
        return None
    try:
        lib = ctypes.CDLL(path)  # dlsym through this handle searches _ssl's own dependencies: its libcrypto
        for name, (argtypes, restype) in _SIGNATURES.items():
            function = getattr(lib, name)
            function.argtypes, function.restype = argtypes, restype
    except (OSError, AttributeError):  # not OpenSSL 3, or a static OpenSSL that hides its symbols
        return None
    return _LibCrypto(lib)


class _OpenSslKey:
    """A key held as an ``EVP_PKEY *`` of the process's libcrypto; freed when the object is collected."""

    __slots__ = ("_lib", "_pkey")

    def __init__(self, lib: _LibCrypto) -> None:
        self._lib = functions = lib.functions
        self._pkey: int | None = None  # set last: __del__ runs for a half-made object too
        context = functions.EVP_PKEY_CTX_new_from_name(None, b"EC", None)
        if not context:
            self._fail("EVP_PKEY_CTX_new_from_name")
        try:
            pkey = ctypes.c_void_p()
            if (
                functions.EVP_PKEY_keygen_init(context) != 1
                or functions.EVP_PKEY_CTX_set_group_name(context, _CURVE) != 1
                or functions.EVP_PKEY_generate(context, ctypes.byref(pkey)) != 1
                or not pkey.value
            ):
                self._fail("P-256 key generation")
            self._pkey = pkey.value
        finally:
            functions.EVP_PKEY_CTX_free(context)

    def __del__(self) -> None:
        if self._pkey is not None:
            self._lib.EVP_PKEY_free(self._pkey)
            self._pkey = None

    def public_key_der(self) -> bytes:
        return self._i2d(self._lib.i2d_PUBKEY, self._pkey, "i2d_PUBKEY")

    def private_key_pem(self) -> bytes:
        info = self._lib.EVP_PKEY2PKCS8(self._pkey)
        if not info:
            self._fail("EVP_PKEY2PKCS8")
        try:
            der = self._i2d(self._lib.i2d_PKCS8_PRIV_KEY_INFO, info, "i2d_PKCS8_PRIV_KEY_INFO")
        finally:
            self._lib.PKCS8_PRIV_KEY_INFO_free(info)
        return der_codec.pem(b"PRIVATE KEY", der)

    def sign_sha256(self, data: bytes) -> bytes:
        functions = self._lib
        context = functions.EVP_MD_CTX_new()
        if not context:
            self._fail("EVP_MD_CTX_new")
        try:
            if functions.EVP_DigestSignInit(context, None, functions.EVP_sha256(), None, self._pkey) != 1:
                self._fail("EVP_DigestSignInit")
            size = ctypes.c_size_t(0)
            if functions.EVP_DigestSign(context, None, ctypes.byref(size), data, len(data)) != 1:
                self._fail("EVP_DigestSign")
            signature = ctypes.create_string_buffer(size.value)
            if functions.EVP_DigestSign(context, signature, ctypes.byref(size), data, len(data)) != 1:
                self._fail("EVP_DigestSign")
            return signature.raw[: size.value]
        finally:
            functions.EVP_MD_CTX_free(context)

    def _i2d(self, function: Any, handle: int | None, name: str) -> bytes:
        """The DER an OpenSSL ``i2d_*`` function writes: asked for its size first, then into a buffer of ours."""
        size = function(handle, None)
        if size <= 0:
            self._fail(name)
        buffer = ctypes.create_string_buffer(size)
        cursor = ctypes.c_void_p(ctypes.addressof(buffer))  # i2d advances the pointer it is given
        if function(handle, ctypes.byref(cursor)) != size:
            self._fail(name)
        return buffer.raw

    def _fail(self, what: str) -> NoReturn:
        self._lib.ERR_clear_error()
        raise CertificateError(f"libcrypto: {what} failed")


class _CryptographyKey:
    """The same operations through cryptography, for a process whose libcrypto cannot be reached."""

    __slots__ = ("_key",)

    def __init__(self) -> None:
        from cryptography.hazmat.primitives.asymmetric import ec

        self._key = ec.generate_private_key(ec.SECP256R1())

    def public_key_der(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self._key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def sign_sha256(self, data: bytes) -> bytes:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        return self._key.sign(data, ec.ECDSA(hashes.SHA256()))

    def private_key_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
