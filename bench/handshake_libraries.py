"""The mutual-TLS handshake floor on two OpenSSL builds: the system's (Python's ``ssl``) and the one ``cryptography``
links statically (its cffi bindings), with the node proxies' own certificates and settings.

    .venv/bin/python bench/handshake_libraries.py [--pairs 300] [--rounds 3] [--groups X25519]

Issue 23 names "the TLS stack that cryptography bundles (a newer OpenSSL) against the system one for the handshake"
as a lever for cold handshakes. Each round runs ``--pairs`` full TLS 1.3 handshakes between a client and a server of
the mesh (SPIFFE certificates from a local CA, ECDSA P-256, ALPN h2, no session tickets, both sides verifying) over
memory BIOs in this process, first on the system library (``bench/proxy_connections.py --measure floor``'s own
loop), then on the bundled one, and prints the process CPU per handshake pair (both ends) and their ratio. No
sockets and no event loop: what the libraries cost, not what the proxies add. ``--groups`` sets the bundled
library's key-exchange groups (the system one keeps its defaults, X25519 first in 3.0; newer releases may offer a
hybrid post-quantum group first, which costs more).

The bundled library is reached through ``cryptography.hazmat.bindings.openssl.binding``, the bindings pyOpenSSL
uses; the node proxy cannot use it as is (Python's ``ssl`` and the native record path are built on the system
library, and a static library offers nothing to link against), so this is a measurement, not a path.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ambit.identity.localca import LocalCa
from ambit.model.identity import SpiffeId
from ambit.tls.workload import WorkloadCertificate
from bench.proxy_connections import _handshake_pair as system_pair

TD = "cluster.local"
_BUFFER = 65536
_MAX_STEPS = 20


class Bundled:
    """Client and server contexts on the OpenSSL ``cryptography`` links, configured as ``ambit.tls.contexts`` does:
    TLS 1.3 only, peer certificate required and verified against the mesh's root, no tickets, ALPN h2."""

    def __init__(self, client: WorkloadCertificate, server: WorkloadCertificate, groups: str = "") -> None:
        from cryptography.hazmat.bindings.openssl.binding import Binding

        binding = Binding()
        self.lib: Any = binding.lib
        self.ffi: Any = binding.ffi
        self.version: str = self.ffi.string(self.lib.OpenSSL_version(self.lib.OPENSSL_VERSION)).decode()
        self._buffer = self.ffi.new("char[]", _BUFFER)
        self.client_ctx = self._context(client, groups)
        self.server_ctx = self._context(server, groups)

    def _pem(self, reader: Callable[..., Any], pem: bytes) -> Any:
        bio = self.ffi.gc(self.lib.BIO_new_mem_buf(pem, len(pem)), self.lib.BIO_free)
        made = reader(bio, self.ffi.NULL, self.ffi.NULL, self.ffi.NULL)
        if made == self.ffi.NULL:
            raise RuntimeError("the bundled library could not read a PEM block")
        return made

    def _context(self, cert: WorkloadCertificate, groups: str) -> Any:
        lib, ffi = self.lib, self.ffi
        ctx = lib.SSL_CTX_new(lib.TLS_method())
        lib.SSL_CTX_set_min_proto_version(ctx, lib.TLS1_3_VERSION)
        lib.SSL_CTX_set_max_proto_version(ctx, lib.TLS1_3_VERSION)
        lib.SSL_CTX_set_options(ctx, lib.SSL_OP_NO_TICKET)
        lib.SSL_CTX_set_verify(ctx, lib.SSL_VERIFY_PEER | lib.SSL_VERIFY_FAIL_IF_NO_PEER_CERT, ffi.NULL)
        checks = [
            lib.X509_STORE_add_cert(lib.SSL_CTX_get_cert_store(ctx), self._pem(lib.PEM_read_bio_X509, cert.roots_pem)),
            lib.SSL_CTX_use_certificate(ctx, self._pem(lib.PEM_read_bio_X509, cert.chain_pem[0])),
            lib.SSL_CTX_use_PrivateKey(ctx, self._pem(lib.PEM_read_bio_PrivateKey, cert.key_pem)),
        ]
        for extra in cert.chain_pem[1:-1]:  # the root is known to every peer, as in ambit.tls.contexts
            checks.append(lib.SSL_CTX_add_extra_chain_cert(ctx, self._pem(lib.PEM_read_bio_X509, extra)))
        if groups:
            checks.append(lib.SSL_CTX_set1_curves_list(ctx, groups.encode()))
        if any(result != 1 for result in checks):
            raise RuntimeError("the bundled library refused the mesh's certificates or settings")
        protocols = b"\x02h2"
        lib.SSL_CTX_set_alpn_protos(ctx, protocols, len(protocols))
        return ctx

    def pair(self) -> None:
        """One handshake pair; both ends must have verified their peer."""
        lib, buffer = self.lib, self._buffer
        client, server = lib.SSL_new(self.client_ctx), lib.SSL_new(self.server_ctx)
        try:
            c_in, c_out, s_in, s_out = (lib.BIO_new(lib.BIO_s_mem()) for _ in range(4))
            lib.SSL_set_bio(client, c_in, c_out)  # each SSL owns its two BIOs from here
            lib.SSL_set_bio(server, s_in, s_out)
            lib.SSL_set_connect_state(client)
            lib.SSL_set_accept_state(server)
            client_done = server_done = False
            for _ in range(_MAX_STEPS):
                client_done = client_done or self._step(client)
                if (n := lib.BIO_read(c_out, buffer, _BUFFER)) > 0:
                    lib.BIO_write(s_in, buffer, n)
                server_done = server_done or self._step(server)
                if (n := lib.BIO_read(s_out, buffer, _BUFFER)) > 0:
                    lib.BIO_write(c_in, buffer, n)
                if client_done and server_done:
                    break
            else:
                raise RuntimeError("the bundled library's handshake did not finish")
            if lib.SSL_get_verify_result(client) != 0 or lib.SSL_get_verify_result(server) != 0:
                raise RuntimeError("a peer's certificate did not verify")
        finally:
            lib.SSL_free(client)
            lib.SSL_free(server)

    def _step(self, tls: Any) -> bool:
        result = self.lib.SSL_do_handshake(tls)
        if result == 1:
            return True
        if self.lib.SSL_get_error(tls, result) != self.lib.SSL_ERROR_WANT_READ:
            raise RuntimeError("the bundled library's handshake failed")
        return False


async def _certificates(directory: Path) -> tuple[WorkloadCertificate, WorkloadCertificate]:
    ca = LocalCa(directory / "ca", trust_domain=TD)
    client, server = await asyncio.gather(
        ca.fetch_certificate(SpiffeId(TD, "default", "client")), ca.fetch_certificate(SpiffeId(TD, "default", "server"))
    )
    return client, server


def _cpu_per_pair(run: Callable[[], None], pairs: int) -> float:
    started = time.process_time()
    for _ in range(pairs):
        run()
    return (time.process_time() - started) / pairs * 1e6


def measure(pairs: int, rounds: int, groups: str = "") -> list[str]:
    """The report's lines: the two libraries, then per round the CPU per pair on each and their ratio."""
    with tempfile.TemporaryDirectory() as tmp:
        client, server = asyncio.run(_certificates(Path(tmp)))
    client_ctx, server_ctx = client.client_context(), server.server_context()
    bundled = Bundled(client, server, groups)
    lines = [f"system: {ssl.OPENSSL_VERSION}; bundled: {bundled.version}; groups: {groups or 'each one default'}"]
    for _ in range(min(20, pairs)):  # first-use costs (provider look-ups, lazily built stores)
        system_pair(client_ctx, server_ctx)
        bundled.pair()
    for number in range(1, rounds + 1):
        system = _cpu_per_pair(lambda: system_pair(client_ctx, server_ctx), pairs)
        other = _cpu_per_pair(bundled.pair, pairs)
        figures = f"system {system:.0f} µs per pair, bundled {other:.0f} µs per pair, ratio {other / system:.2f}"
        lines.append(f"round {number}: {figures}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0] if __doc__ else None)
    parser.add_argument("--pairs", type=int, default=300, help="handshake pairs per library per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--groups", default="", help="key-exchange groups for the bundled library (e.g. X25519)")
    args = parser.parse_args(argv)
    for line in measure(args.pairs, args.rounds, args.groups):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
