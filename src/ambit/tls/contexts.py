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
- A context is built once per certificate (the certificate caches it) and never changed afterwards.

Known gap: Python's ``ssl`` cannot restrict the TLS 1.3 cipher suites, so ChaCha20-Poly1305 is offered alongside
the two AES-GCM suites ztunnel uses; every peer that speaks TLS 1.3 accepts one of the three.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ambit.tls.certs import CertificateError

if TYPE_CHECKING:
    from ambit.identity.manager import WorkloadCertificate

ALPN_H2 = "h2"


def client_context(cert: WorkloadCertificate) -> ssl.SSLContext:
    """The context a node proxy dials HBONE with, presenting ``cert``; check the server with ``check_peer``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # a SPIFFE id is checked after the handshake, not as a host name
    _configure(context, cert)
    return context


def server_context(cert: WorkloadCertificate) -> ssl.SSLContext:
    """The context an HBONE listener accepts with, presenting ``cert`` and requiring a client certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.num_tickets = 0  # TLS 1.3 resumption uses tickets only; issuing none disables it
    _configure(context, cert)
    return context


def _configure(context: ssl.SSLContext, cert: WorkloadCertificate) -> None:
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
    with _memory_file(b"".join(presented)) as chain_path, _memory_file(cert.key_pem) as key_path:
        try:
            context.load_cert_chain(chain_path, key_path)
        except (ssl.SSLError, ValueError) as exc:
            raise CertificateError(f"cannot load the certificate of {cert.identity}: {exc}") from None


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
    fd, path = tempfile.mkstemp(prefix="ambit-tls-")  # created 0600
    try:
        os.write(fd, data)
        yield path
    finally:
        os.close(fd)
        os.unlink(path)
