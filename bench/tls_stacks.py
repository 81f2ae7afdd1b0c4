"""Handshake cost of two TLS stacks: Python's ``ssl`` (the system libssl) against the OpenSSL ``cryptography`` bundles.

``python -m bench.tls_stacks [--pairs N] [--groups X25519]`` runs mutual-TLS 1.3 handshakes between a client and a
server in this process over memory (no sockets, no event loop), both ends each time, alternating the two stacks
for five rounds, and prints the CPU time (``process_time``) per handshake pair, with what each negotiated:

- ``ssl``: the node proxy's own HBONE contexts (:mod:`ambit.tls.contexts`) on the libssl ``_ssl`` links with;
- ``bundled``: the same certificates through pyOpenSSL, whose calls go to the OpenSSL that ``cryptography`` ships
  inside its extension. pyOpenSSL is not an Ambit dependency: install it (and the venv's ``cryptography``
  version) into a scratch venv to run this; without it the script says so and exits 2.

Both sides present an ECDSA P-256 leaf naming a SPIFFE id, signed by one throw-away CA, and verify the peer's chain;
no tickets. A newer OpenSSL offers a hybrid post-quantum group first (X25519MLKEM768); ``--groups X25519`` makes
the bundled side use the group the system side negotiates, so both do the same work.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ambit.model.identity import SpiffeId
from ambit.tls.certs import new_ca
from ambit.tls.issuance import sign_csr
from ambit.tls.spiffe import make_csr
from ambit.tls.workload import WorkloadCertificate

TD = "cluster.local"


def _certificate(root: Any, identity: SpiffeId) -> WorkloadCertificate:
    csr, key = make_csr(identity)
    return WorkloadCertificate.from_chain(identity, sign_csr(root, csr, now=time.time(), ttl_seconds=3600), key)


def _ssl_pair(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> str:
    bios = [ssl.MemoryBIO() for _ in range(4)]
    server = server_ctx.wrap_bio(bios[0], bios[1], server_side=True)
    client = client_ctx.wrap_bio(bios[2], bios[3], server_side=False)
    for _ in range(4):
        for tls, out, peer_in in ((client, bios[3], bios[0]), (server, bios[1], bios[2])):
            with contextlib.suppress(ssl.SSLWantReadError):
                tls.do_handshake()
            peer_in.write(out.read())
    if client.getpeercert(True) is None or server.getpeercert(True) is None:
        raise RuntimeError("the system stack's handshake did not finish")
    return f"{client.cipher()}"


def _bundled(directory: Path, server: WorkloadCertificate, client: WorkloadCertificate, groups: str) -> Any:
    try:
        from OpenSSL import SSL  # type: ignore[import-not-found, unused-ignore]
        from OpenSSL._util import lib  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        print("pyOpenSSL is not installed (see the module docstring)", file=sys.stderr)
        raise SystemExit(2) from None

    def context(cert: WorkloadCertificate, name: str) -> Any:
        (directory / f"{name}.crt").write_bytes(b"".join(cert.chain_pem[:-1]))
        (directory / f"{name}.key").write_bytes(cert.key_pem)
        (directory / "roots.pem").write_bytes(cert.roots_pem)
        ctx = SSL.Context(SSL.TLS_METHOD)
        ctx.set_min_proto_version(SSL.TLS1_3_VERSION)
        ctx.set_max_proto_version(SSL.TLS1_3_VERSION)
        ctx.set_options(SSL.OP_NO_TICKET)
        ctx.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT)
        ctx.load_verify_locations(str(directory / "roots.pem"))
        ctx.use_certificate_file(str(directory / f"{name}.crt"))
        ctx.use_privatekey_file(str(directory / f"{name}.key"))
        ctx.set_alpn_protos([b"h2"])
        if groups and lib.SSL_CTX_set1_curves_list(ctx._context, groups.encode()) != 1:
            raise SystemExit(f"the bundled OpenSSL refused the groups {groups!r}")
        return ctx

    server_ctx, client_ctx = context(server, "server"), context(client, "client")
    server_ctx.set_alpn_select_callback(lambda _conn, _protos: b"h2")

    def pair() -> str:
        srv, cli = SSL.Connection(server_ctx, None), SSL.Connection(client_ctx, None)
        srv.set_accept_state()
        cli.set_connect_state()
        for _ in range(4):
            for tls, peer in ((cli, srv), (srv, cli)):
                with contextlib.suppress(SSL.WantReadError):
                    tls.do_handshake()
                with contextlib.suppress(SSL.WantReadError):
                    peer.bio_write(tls.bio_read(65536))
        if cli.get_peer_certificate() is None or srv.get_peer_certificate() is None:
            raise RuntimeError("the bundled stack's handshake did not finish")
        return f"{cli.get_cipher_name()} {cli.get_group_name()}"

    version = SSL.OpenSSL_version(SSL.OPENSSL_VERSION).decode()
    return version, pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pairs", type=int, default=200, help="handshake pairs per round")
    parser.add_argument("--groups", default="", help="key-exchange groups of the bundled stack (OpenSSL list)")
    args = parser.parse_args()
    root = new_ca("tls stacks bench root", now=time.time() - 60)
    server = _certificate(root, SpiffeId(TD, "bench", "server"))
    client = _certificate(root, SpiffeId(TD, "bench", "client"))
    with tempfile.TemporaryDirectory(prefix="ambit-bench-tls-") as tmp:
        version, bundled_pair = _bundled(Path(tmp), server, client, args.groups)
        server_ctx, client_ctx = server.server_context(), client.client_context()
        stacks: dict[str, Callable[[], str]] = {
            f"ssl ({ssl.OPENSSL_VERSION})": lambda: _ssl_pair(server_ctx, client_ctx),
            f"bundled ({version})": bundled_pair,
        }
        rounds: dict[str, list[float]] = {name: [] for name in stacks}
        negotiated = {name: run() for name, run in stacks.items()}
        for round_number in range(5):
            order = list(stacks) if round_number % 2 == 0 else list(stacks)[::-1]
            for name in order:
                began = time.process_time()
                for _ in range(args.pairs):
                    stacks[name]()
                rounds[name].append((time.process_time() - began) / args.pairs * 1e6)
    print(f"load average {os.getloadavg()[0]:.1f}; CPU µs per mutual-TLS 1.3 handshake pair (both ends), 5 rounds:")
    for name, values in rounds.items():
        shown = ", ".join(f"{v:.0f}" for v in values)
        print(f"  {name:40} median {statistics.median(values):6.0f}  ({shown})  {negotiated[name]}")


if __name__ == "__main__":
    main()
