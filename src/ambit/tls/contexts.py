"""TLS contexts for HBONE mutual TLS, built from one workload certificate (spec §5.4).

Theory of operation: both ends speak TLS 1.3 only, offer ALPN ``h2``, trust only the mesh roots and require the
peer's certificate. OpenSSL proves the chain; names are judged afterwards by
:func:`ambit.tls.spiffe.check_peer`, because a SPIFFE id is not a host name: the client turns hostname checking
off and connects without SNI (asyncio: ``server_hostname=""``), and the server picks its certificate by the
original destination address, not by SNI. Session resumption is off on both sides (no tickets are issued), so
every connection proves both identities afresh.

Invariants:

- Private keys never touch the disk: ``load_cert_chain`` only reads files, so the PEM goes through an anonymous
  memory file (``memfd_create``), or where that is missing through a 0600 temporary file unlinked at once.
- A context is built once per certificate and TLS transport (the certificate caches it) and never changed
  afterwards: the socket transport's have OpenSSL's read-ahead on from the start (:func:`read_ahead_context`).
- A node proxy presents its leaf and any intermediates, not the root (every peer has the mesh roots already),
  except in the fallback below.

The chain we present. Given a leaf without intermediates, OpenSSL by default rebuilds the chain to present on
*every* handshake: it verifies our own leaf against the trust store and then sends the root it found, which the
peer parses and ignores. The contexts turn that off (``SSL_MODE_NO_AUTO_CHAIN``, which Python's ``ssl`` does not
expose) through ctypes on the ``SSL_CTX`` the context wraps (:func:`_no_auto_chain`, checked before use:
CPython's object layout and the same libssl ``_ssl`` links). Where that is not possible and there is no
intermediate, the context names its chain explicitly, root included (``load_cert_chain`` then keeps it as the chain
to send), which skips the per-handshake building but still sends the root, as OpenSSL's default does.
Verification of the peer is the same either way.

Verification cache. With the native records (:mod:`ambit.native`), each context keeps the chains OpenSSL verified
and accepts the same chain again, presented for the same role, without verifying it anew while every certificate
of the chain it was verified into is within its validity period (``src/ambit/native/verify_cache.c``). That is
the same answer: for one context the verification depends only on the presented chain, the trust store and the
parameters (fixed here: a context is never changed, new roots make new contexts) and the time (checked on every
hit); the peer still proves on every handshake that it holds the leaf's key, and revocation is judged on every
connection after the handshake. ztunnel verifies every handshake in full; this saves about a sixth of a
handshake pair's CPU on OpenSSL 3.0 (issue 23). ``AMBIT_NATIVE_VERIFY_CACHE=0`` turns it off.

Known gap: Python's ``ssl`` cannot restrict the TLS 1.3 cipher suites, so ChaCha20-Poly1305 is offered alongside
the two AES-GCM suites ztunnel uses; every peer that speaks TLS 1.3 accepts one of the three.
"""

from __future__ import annotations

import _ssl
import contextlib
import ctypes
import functools
import os
import ssl
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ambit.tls.errors import CertificateError

if TYPE_CHECKING:
    from ambit.tls.workload import WorkloadCertificate

ALPN_H2 = "h2"


def client_context(cert: WorkloadCertificate, *, read_ahead: int = 0) -> ssl.SSLContext:
    """The context a node proxy dials HBONE with, presenting ``cert``; check the server with ``check_peer``.
    ``read_ahead``: OpenSSL's read buffer for every connection of the context (:func:`read_ahead_context`), 0: off."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # a SPIFFE id is checked after the handshake, not as a host name
    _configure(context, cert)
    if read_ahead:
        read_ahead_context(context, read_ahead)
    return context


def server_context(cert: WorkloadCertificate, *, read_ahead: int = 0) -> ssl.SSLContext:
    """The context an HBONE listener accepts with, presenting ``cert`` and requiring a client certificate.
    ``read_ahead`` as in :func:`client_context`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.num_tickets = 0  # TLS 1.3 resumption uses tickets only; issuing none disables it
    _configure(context, cert)
    if read_ahead:
        read_ahead_context(context, read_ahead)
    return context


def edge_server_context(cert_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    """The context an ingress gateway's HTTPS listener terminates TLS with: ``cert_pem`` (the chain a
    ``kubernetes.io/tls`` Secret holds) and its key, TLS 1.2 or later, ALPN ``h2`` then ``http/1.1``, no client
    certificate.
    :class:`CertificateError` when they do not load or do not match."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols([ALPN_H2, "http/1.1"])
    with _memory_file(cert_pem) as chain_path, _memory_file(key_pem) as key_path:
        try:
            context.load_cert_chain(chain_path, key_path)
        except (ssl.SSLError, ValueError) as exc:
            raise CertificateError(f"cannot load a listener certificate: {exc}") from None
    return context


def edge_add_certificate(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """Load a second certificate into an edge server context, of another key type than the first (an RSA and an
    ECDSA certificate): OpenSSL keeps one per key type and serves the one the client's signature algorithms
    accept. :class:`CertificateError` when it does not load or does not match."""
    with _memory_file(cert_pem) as chain_path, _memory_file(key_pem) as key_path:
        try:
            context.load_cert_chain(chain_path, key_path)
        except (ssl.SSLError, ValueError) as exc:
            raise CertificateError(f"cannot load a listener certificate: {exc}") from None


def edge_client_ca(context: ssl.SSLContext, ca_pem: bytes, *, required: bool = True) -> None:
    """Make an edge server context verify client certificates against ``ca_pem`` (a mutual-TLS listener), and
    require one unless ``required`` is False (``OPTIONAL_MUTUAL``: a presented certificate must still chain to
    ``ca_pem``). :class:`CertificateError` when the bundle does not load."""
    try:
        context.load_verify_locations(cadata=ca_pem.decode("ascii"))
    except (ssl.SSLError, ValueError) as exc:
        raise CertificateError(f"cannot load a listener's client CA: {exc}") from None
    context.verify_mode = ssl.CERT_REQUIRED if required else ssl.CERT_OPTIONAL
    _no_resumption(context)


_TLS_VERSIONS = {0x0303: ssl.TLSVersion.TLSv1_2, 0x0304: ssl.TLSVersion.TLSv1_3}


def edge_protocol(
    context: ssl.SSLContext, *, min_version: int = 0, max_version: int = 0, cipher_suites: tuple[str, ...] = ()
) -> None:
    """Bound an edge server context's TLS versions (``0x0303``, ``0x0304``; 0 keeps TLS 1.2 and 1.3) and TLS 1.2
    cipher suites (OpenSSL names; empty keeps the defaults). :class:`CertificateError` when OpenSSL knows none of
    the suites."""
    context.minimum_version = _TLS_VERSIONS.get(min_version, ssl.TLSVersion.TLSv1_2)
    context.maximum_version = _TLS_VERSIONS.get(max_version, ssl.TLSVersion.TLSv1_3)
    if cipher_suites:
        try:
            context.set_ciphers(":".join(cipher_suites))
        except ssl.SSLError as exc:
            raise CertificateError(f"no usable cipher suite among {', '.join(cipher_suites)}: {exc}") from None


def edge_mesh_context(cert: WorkloadCertificate) -> ssl.SSLContext:
    """The context of an ingress listener terminating mutual TLS with the gateway's own mesh certificate
    (``ISTIO_MUTUAL``): as :func:`edge_server_context`, presenting ``cert``'s chain and requiring a client
    certificate from the mesh roots."""
    chain = b"".join(cert.chain_pem[:-1] if len(cert.chain_pem) > 1 else cert.chain_pem)
    context = edge_server_context(chain, cert.key_pem)
    edge_client_ca(context, cert.roots_pem)
    return context


def edge_dispatch_context(*, verify_clients: bool) -> ssl.SSLContext:
    """The context an ingress HTTPS port accepts with before the server name is known: no certificate of its own
    (its ``sni_callback`` switches to the picked listener's context). OpenSSL takes the verify mode and session
    settings of a handshake from this first context, not from the one switched to, so a port with any mutual-TLS
    listener asks every client for a certificate here (optionally: the listener's verdict comes after the
    handshake) and resumes no session (a session would carry a client certificate from one listener to
    another)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols([ALPN_H2, "http/1.1"])
    context.verify_mode = ssl.CERT_OPTIONAL if verify_clients else ssl.CERT_NONE
    if verify_clients:
        _no_resumption(context)
    return context


class DirectSSLObject(ssl.SSLObject):
    """An :class:`ssl.SSLObject` whose ``read``, ``write`` and ``pending`` are the C methods of the object it wraps.

    ``ssl.SSLObject``'s own are Python methods that only forward to those three (same arguments, same results), and
    the event loop's TLS layer calls them for every record read and written: as attributes of the instance the loop
    reaches the C methods directly, one Python frame fewer per call. Everything else is ``ssl.SSLObject``'s.
    """

    @classmethod
    def _create(cls, *args: Any, **kwargs: Any) -> DirectSSLObject:
        tls = super()._create(*args, **kwargs)  # type: ignore[misc]  # the private constructor wrap_bio calls
        inner = tls._sslobj
        tls.read = inner.read
        tls.write = inner.write
        tls.pending = inner.pending
        return cast(DirectSSLObject, tls)


def _configure(context: ssl.SSLContext, cert: WorkloadCertificate) -> None:
    context.sslobject_class = DirectSSLObject
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.maximum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_REQUIRED
    context.options |= ssl.OP_NO_TICKET
    context.set_alpn_protocols([ALPN_H2])
    try:
        context.load_verify_locations(cadata=cert.roots_pem.decode("ascii"))
    except (ssl.SSLError, ValueError) as exc:
        raise CertificateError(f"cannot load trust roots for {cert.identity}: {exc}") from None
    # The root is already known to every peer; send only the leaf and any intermediates.
    presented = cert.chain_pem[:-1] if len(cert.chain_pem) > 1 else cert.chain_pem
    if not _no_auto_chain(context) and len(presented) == 1:
        # A lone leaf would have OpenSSL build its chain on every handshake and send the root anyway; naming the
        # chain ourselves spares the building (see the module docstring).
        presented = cert.chain_pem
    with _memory_file(b"".join(presented)) as chain_path, _memory_file(cert.key_pem) as key_path:
        try:
            context.load_cert_chain(chain_path, key_path)
        except (ssl.SSLError, ValueError) as exc:
            raise CertificateError(f"cannot load the certificate of {cert.identity}: {exc}") from None
    _cache_verification(context)


def _cache_verification(context: ssl.SSLContext) -> bool:
    """Have the context verify each presented chain once per validity period (the native ``verify_cache.c``, when
    this process runs the native records; see the module docstring); False when it does not."""
    from ambit.native import selection

    module = selection().verification_cache
    mode = _VERIFY_MODES.get(context.verify_mode)
    if module is None or mode is None:
        return False
    try:
        module.cache_verification(context, int(context.options), mode)
    except (TypeError, ValueError, MemoryError):  # a layout this build does not know: verify every chain in full
        return False
    return True


def verification_counts(context: ssl.SSLContext) -> tuple[int, int] | None:
    """The (hits, misses) of the context's verification cache; None without one."""
    from ambit.native import load_tls_records

    module, _ = load_tls_records()
    mode = _VERIFY_MODES.get(context.verify_mode)
    if module is None or mode is None:
        return None
    found: tuple[int, int] | None = module.verification_counts(context, int(context.options), mode)
    return found


def verified_chain(tls: ssl.SSLObject | ssl.SSLSocket) -> list[bytes] | None:
    """The peer's chain as OpenSSL verified it (DER, leaf first, trust anchor last); None when this Python does not
    expose it (``SSLObject.get_verified_chain`` is public from 3.13, private ``_sslobj`` method since 3.10)."""
    getter = getattr(tls, "get_verified_chain", None)
    if getter is None:
        getter = getattr(getattr(tls, "_sslobj", None), "get_verified_chain", None)
    if getter is None:
        return None
    try:
        certs = getter()
    except (ssl.SSLError, ValueError):
        return None
    chain: list[bytes] = []
    for cert in certs or ():
        der = cert if isinstance(cert, bytes) else cert.public_bytes(_ssl.ENCODING_DER)
        chain.append(bytes(der))
    return chain or None


@contextlib.contextmanager
def _memory_file(data: bytes) -> Iterator[str]:
    """A path whose contents are ``data`` for the duration of the block, never persisted to disk."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None:
        fd: int = memfd_create("ambit-tls", os.MFD_CLOEXEC)
        try:
            os.write(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    import tempfile  # only here: it brings shutil, lzma and bz2, which a node proxy has no other use for

    fd, path = tempfile.mkstemp(prefix="ambit-tls-")  # created 0600
    try:
        os.write(fd, data)
        yield path
    finally:
        os.close(fd)
        os.unlink(path)


_SSL_CTRL_MODE = 33
_SSL_MODE_NO_AUTO_CHAIN = 0x8
_VERIFY_MODES = {ssl.CERT_NONE: 0x0, ssl.CERT_OPTIONAL: 0x1, ssl.CERT_REQUIRED: 0x3}
"""What libssl reports as the verify mode of a context of each ``ssl`` mode (``CERT_REQUIRED``:
``SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT``)."""
_SSL_CTRL_SET_SESS_CACHE_MODE = 44
_SSL_CTRL_GET_SESS_CACHE_MODE = 45
_SSL_SESS_CACHE_OFF = 0x0


@dataclass(frozen=True, slots=True)
class _LibSsl:
    """The ``SSL_CTX`` functions of the libssl that Python's ``_ssl`` module is linked with."""

    ctrl: Callable[[int, int, int, None], int]
    get_options: Callable[[int], int]
    get_verify_mode: Callable[[int], int]
    set_default_read_buffer_len: Callable[[int, int], None]


@functools.cache
def _libssl() -> _LibSsl | None:
    # Looking the symbols up through ``_ssl``'s own file finds the libssl it was linked with, not another one.
    path = getattr(_ssl, "__file__", None)
    if sys.implementation.name != "cpython" or path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
        ctrl, get_options, get_verify_mode = lib.SSL_CTX_ctrl, lib.SSL_CTX_get_options, lib.SSL_CTX_get_verify_mode
        set_len = lib.SSL_CTX_set_default_read_buffer_len
    except (OSError, AttributeError):  # a static OpenSSL that hides its symbols, or no such functions
        return None
    ctrl.argtypes, ctrl.restype = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p], ctypes.c_long
    get_options.argtypes, get_options.restype = [ctypes.c_void_p], ctypes.c_uint64
    get_verify_mode.argtypes, get_verify_mode.restype = [ctypes.c_void_p], ctypes.c_int
    set_len.argtypes, set_len.restype = [ctypes.c_void_p, ctypes.c_size_t], None
    return _LibSsl(ctrl, get_options, get_verify_mode, set_len)


def _ctx_handle(context: ssl.SSLContext) -> tuple[_LibSsl, int] | None:
    """The libssl functions and the ``SSL_CTX *`` of ``context``, or None when they cannot be trusted.

    CPython's ``_ssl`` context object holds its ``SSL_CTX *`` right after the object header. The pointer is used only
    once two reads through it agree with what ``ssl`` reports for this very context (options and verify mode).
    """
    lib = _libssl()
    if lib is None:
        return None
    handle = ctypes.c_void_p.from_address(id(context) + object.__basicsize__).value
    if not handle:
        return None
    if lib.get_options(handle) != int(context.options) or lib.get_verify_mode(handle) != _VERIFY_MODES.get(
        context.verify_mode
    ):
        return None
    return lib, handle


def _no_auto_chain(context: ssl.SSLContext) -> bool:
    """Stop OpenSSL building (and sending) our chain from the trust store per handshake; False if we cannot."""
    found = _ctx_handle(context) if context.verify_mode is ssl.CERT_REQUIRED else None
    if found is None:
        return False
    lib, handle = found
    mode = lib.ctrl(handle, _SSL_CTRL_MODE, _SSL_MODE_NO_AUTO_CHAIN, None)
    return bool(mode & _SSL_MODE_NO_AUTO_CHAIN)


def _no_resumption(context: ssl.SSLContext) -> bool:
    """Issue no session tickets and keep no server session cache (TLS 1.2 session ids); False if the cache could
    not be turned off (a resumed session then carries no verified chain, which mutual-TLS listeners refuse)."""
    context.num_tickets = 0
    context.options |= ssl.OP_NO_TICKET
    found = _ctx_handle(context)
    if found is None:
        return False
    lib, handle = found
    lib.ctrl(handle, _SSL_CTRL_SET_SESS_CACHE_MODE, _SSL_SESS_CACHE_OFF, None)
    return lib.ctrl(handle, _SSL_CTRL_GET_SESS_CACHE_MODE, 0, None) == _SSL_SESS_CACHE_OFF


_SSL_CTRL_SET_READ_AHEAD = 41


@dataclass(frozen=True, slots=True)
class _LibSslConnection:
    """The ``SSL`` (connection) functions of the same libssl, for :func:`read_ahead`."""

    ctrl: Callable[[int, int, int, None], int]
    set_default_read_buffer_len: Callable[[int, int], None]
    has_pending: Callable[[int], int]
    get_ssl_ctx: Callable[[int], int]


@functools.cache
def _libssl_connection() -> _LibSslConnection | None:
    path = getattr(_ssl, "__file__", None)
    if sys.implementation.name != "cpython" or path is None or _libssl() is None:
        return None
    try:
        lib = ctypes.CDLL(path)
        ctrl, set_len = lib.SSL_ctrl, lib.SSL_set_default_read_buffer_len
        has_pending, get_ssl_ctx = lib.SSL_has_pending, lib.SSL_get_SSL_CTX
    except (OSError, AttributeError):
        return None
    ctrl.argtypes, ctrl.restype = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p], ctypes.c_long
    set_len.argtypes, set_len.restype = [ctypes.c_void_p, ctypes.c_size_t], None
    has_pending.argtypes, has_pending.restype = [ctypes.c_void_p], ctypes.c_int
    get_ssl_ctx.argtypes, get_ssl_ctx.restype = [ctypes.c_void_p], ctypes.c_void_p
    return _LibSslConnection(ctrl, set_len, has_pending, get_ssl_ctx)


def read_ahead_context(context: ssl.SSLContext, buffer_len: int) -> bool:
    """Have OpenSSL read ahead (as :func:`read_ahead` says) on every connection made from ``context`` from now on,
    with a read buffer of ``buffer_len`` bytes: once per context instead of once per connection. False (and nothing
    changed) when the ``SSL_CTX *`` of ``context`` cannot be trusted (:func:`_ctx_handle`).

    Call it while the context is being built, before any connection: an ``SSL`` takes both settings from its
    ``SSL_CTX`` when it is made. :func:`reads_ahead` then knows the context, and :func:`pending_probe` finds the
    ``SSL_has_pending`` of its connections without checking the context again."""
    found = _ctx_handle(context)
    if found is None or _libssl_connection() is None:
        return False
    lib, handle = found
    lib.set_default_read_buffer_len(handle, buffer_len)
    lib.ctrl(handle, _SSL_CTRL_SET_READ_AHEAD, 1, None)
    _READS_AHEAD[context] = handle
    return True


_READS_AHEAD: weakref.WeakKeyDictionary[ssl.SSLContext, int] = weakref.WeakKeyDictionary()
"""The contexts :func:`read_ahead_context` turned read-ahead on for, with their ``SSL_CTX *`` (checked then); an
entry goes with its context."""


def reads_ahead(context: ssl.SSLContext) -> bool:
    """Whether every connection of ``context`` reads ahead (:func:`read_ahead_context` did it)."""
    return context in _READS_AHEAD


def read_ahead(tls: ssl.SSLSocket, buffer_len: int) -> Callable[[], int] | None:
    """Have OpenSSL read as much as the socket holds, up to ``buffer_len`` bytes, in one ``read`` (its read-ahead,
    which Python's ``ssl`` does not expose) on ``tls``, before its handshake; the ``SSL_has_pending`` of ``tls``
    (non-zero while OpenSSL holds bytes not yet returned, decrypted or not), or None when this cannot be done.
    For a context whose every connection should read ahead, :func:`read_ahead_context` does this once.

    CPython's ``_ssl`` socket object holds, after the object header, the Python socket's weak reference, the ``SSL
    *`` and its context object. The pointer is used only once the context slot is the very context of ``tls`` and
    libssl names, for that ``SSL *``, the ``SSL_CTX *`` :func:`_ctx_handle` checked for that context. The function
    returned must not be called once ``tls`` is closed."""
    found = _ctx_handle(tls.context)
    handle = _ssl_handle(tls, found[1]) if found is not None else None
    lib = _libssl_connection()
    if lib is None or handle is None:
        return None
    lib.set_default_read_buffer_len(handle, buffer_len)
    lib.ctrl(handle, _SSL_CTRL_SET_READ_AHEAD, 1, None)
    return functools.partial(lib.has_pending, handle)


def pending_probe(tls: ssl.SSLSocket) -> Callable[[], int] | None:
    """The ``SSL_has_pending`` of ``tls``, made from a context :func:`read_ahead_context` turned read-ahead on for
    (its ``SSL *`` checked as :func:`read_ahead` checks it, against the ``SSL_CTX *`` checked then), or None when
    the context is not one of those or the ``SSL *`` cannot be trusted. Not to be called once ``tls`` is closed."""
    ctx_handle = _READS_AHEAD.get(tls.context)
    lib = _libssl_connection()
    handle = _ssl_handle(tls, ctx_handle) if ctx_handle is not None else None
    if lib is None or handle is None:
        return None
    return functools.partial(lib.has_pending, handle)


def _ssl_handle(tls: ssl.SSLSocket, ctx_handle: int) -> int | None:
    """The ``SSL *`` of ``tls`` when the layout checks of :func:`read_ahead` pass for it and ``ctx_handle``."""
    lib = _libssl_connection()
    inner = getattr(tls, "_sslobj", None)
    if lib is None or inner is None:
        return None
    base = id(inner) + object.__basicsize__
    pointer = ctypes.sizeof(ctypes.c_void_p)
    if ctypes.c_void_p.from_address(base + 2 * pointer).value != id(tls.context):
        return None
    handle = ctypes.c_void_p.from_address(base + pointer).value
    if not handle or lib.get_ssl_ctx(handle) != ctx_handle:
        return None
    return handle


def libssl_verify_mode(context: ssl.SSLContext) -> int:
    """What libssl reports as the verify mode of ``context`` (for checks of the ``SSL_CTX *`` it wraps)."""
    return _VERIFY_MODES.get(_RAW_VERIFY_MODE.__get__(context), -1)


def context_options(context: ssl.SSLContext) -> int:
    """``int(context.options)``, read without ``ssl``'s enum on the way (per connection, for the same checks)."""
    return int(_RAW_OPTIONS.__get__(context))


# The ``_ssl`` getters themselves: ``ssl.SSLContext``'s properties wrap their integers in enums (about 0.4 us each).
_RAW_OPTIONS: Any = _ssl._SSLContext.options
_RAW_VERIFY_MODE: Any = _ssl._SSLContext.verify_mode
