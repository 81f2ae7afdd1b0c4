"""The HBONE contexts' chain verification cache (``src/ambit/native/verify_cache.c``, :mod:`ambit.tls.contexts`):
a chain that verified is accepted again on the same context without a new verification, with the verified chain
it was verified into; nothing else is, attacked as a peer would: an expired certificate that was cached, a chain
of another CA, a context asked to match a host name after it cached a chain, more chains than the cache holds.
Handshakes run over memory BIOs with the node proxy's own contexts."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from tests.conftest import use_records_path

from ambit import native
from ambit.identity.localca import LocalCa
from ambit.model.identity import SpiffeId
from ambit.tls import contexts
from ambit.tls.workload import WorkloadCertificate

TD = "cluster.local"


@pytest.fixture
def native_records() -> Iterator[None]:
    use_records_path("native")
    yield
    native.use(None)


Chains = tuple[list[bytes], list[bytes]]


def handshake(client_ctx: ssl.SSLContext, server_ctx: ssl.SSLContext, *, server_hostname: str | None = None) -> Chains:
    """One mutual-TLS handshake over memory BIOs, then a message each way; the chains each end verified (the
    server's, as the client verified it, and the client's); ``ssl.SSLError`` when either side refuses."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_side=False, server_hostname=server_hostname)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    client_done = server_done = False
    for _ in range(10):
        if not client_done:
            try:
                client.do_handshake()
                client_done = True
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        if not server_done:
            try:
                server.do_handshake()
                server_done = True
            except ssl.SSLWantReadError:
                pass
        c_in.write(s_out.read())
        if client_done and server_done:
            # the connection still carries data both ways (nothing the verification left behind fails it)
            client.write(b"ping")
            s_in.write(c_out.read())
            assert server.read(4) == b"ping"
            server.write(b"pong")
            c_in.write(s_out.read())
            assert client.read(4) == b"pong"
            for end in (client, server):  # nothing more: "want read", not an error a verification left queued
                with pytest.raises(ssl.SSLWantReadError):
                    end.read(4)
            client_chain, server_chain = contexts.verified_chain(client), contexts.verified_chain(server)
            assert client_chain and server_chain
            return client_chain, server_chain
    raise AssertionError("the handshake did not finish")


def issue(ca: LocalCa, account: str) -> WorkloadCertificate:
    return asyncio.run(ca.fetch_certificate(SpiffeId(TD, "ns", account)))


def counts(context: ssl.SSLContext) -> tuple[int, int]:
    found = contexts.verification_counts(context)
    assert found is not None
    return found


def test_a_chain_that_verified_is_accepted_again_with_the_same_verified_chain(
    native_records: None, tmp_path: Path
) -> None:
    ca = LocalCa(tmp_path / "ca", trust_domain=TD)
    client_cert, server_cert = issue(ca, "client"), issue(ca, "server")
    client_ctx, server_ctx = contexts.client_context(client_cert), contexts.server_context(server_cert)
    first = handshake(client_ctx, server_ctx)
    assert counts(client_ctx) == (0, 1) and counts(server_ctx) == (0, 1)
    for _ in range(3):
        assert handshake(client_ctx, server_ctx) == first  # leaf first, root last, as verified
    assert counts(client_ctx) == (3, 1) and counts(server_ctx) == (3, 1)
    assert first[0][-1] == first[1][-1]  # both end at the mesh root


def test_a_cached_chain_is_refused_once_its_leaf_expired(native_records: None, tmp_path: Path) -> None:
    ca = LocalCa(tmp_path / "ca", trust_domain=TD, ttl_seconds=2)
    client_cert = issue(ca, "client")
    server_cert = issue(LocalCa(tmp_path / "ca", trust_domain=TD), "server")
    client_ctx, server_ctx = contexts.client_context(client_cert), contexts.server_context(server_cert)
    handshake(client_ctx, server_ctx)
    handshake(client_ctx, server_ctx)
    assert counts(server_ctx) == (1, 1)
    expires = x509.load_pem_x509_certificate(client_cert.chain_pem[0]).not_valid_after_utc.timestamp()
    time.sleep(max(0.0, expires - time.time()) + 1.2)
    with pytest.raises(ssl.SSLError, match="certificate"):
        handshake(client_ctx, server_ctx)
    assert counts(server_ctx)[0] == 1, "the expired chain was answered from the cache"


def test_a_chain_of_another_ca_is_refused_every_time_and_never_kept(native_records: None, tmp_path: Path) -> None:
    ca = LocalCa(tmp_path / "ca", trust_domain=TD)
    stranger = LocalCa(tmp_path / "other", trust_domain=TD)
    server_ctx = contexts.server_context(issue(ca, "server"))
    forged = issue(stranger, "client")  # the same identity's shape, signed by a root the server does not trust
    forged_ctx = contexts.client_context(
        WorkloadCertificate.from_chain(forged.identity, (*forged.chain_pem[:-1], ca.roots_pem), forged.key_pem)
    )
    for _ in range(3):
        with pytest.raises(ssl.SSLError):
            handshake(forged_ctx, server_ctx)
    assert counts(server_ctx) == (0, 3)


def test_a_chain_kept_for_one_context_is_not_taken_by_a_context_of_other_roots(
    native_records: None, tmp_path: Path
) -> None:
    """The cache is shared by the process's contexts, but a chain verified against one context's roots says nothing
    to a context trusting others: each context's entries are its own."""
    ours, theirs = LocalCa(tmp_path / "ours", trust_domain=TD), LocalCa(tmp_path / "theirs", trust_domain=TD)
    client_ctx = contexts.client_context(issue(ours, "client"))
    handshake(client_ctx, contexts.server_context(issue(ours, "server")))  # the client's chain kept for `ours`
    # a server presenting a leaf the client trusts, but trusting only the other root for its clients
    server = issue(ours, "server")
    stranger_ctx = contexts.server_context(
        WorkloadCertificate.from_chain(server.identity, (*server.chain_pem[:-1], theirs.roots_pem), server.key_pem)
    )
    with pytest.raises(ssl.SSLError):
        handshake(client_ctx, stranger_ctx)
    assert counts(stranger_ctx) == (0, 1)


def test_a_host_name_to_match_is_never_answered_from_the_cache(native_records: None, tmp_path: Path) -> None:
    ca = LocalCa(tmp_path / "ca", trust_domain=TD)
    client_ctx = contexts.client_context(issue(ca, "client"))
    server_ctx = contexts.server_context(issue(ca, "server"))
    handshake(client_ctx, server_ctx)  # the server's chain is cached on the client's context
    client_ctx.check_hostname = True
    with pytest.raises(ssl.SSLError, match="certificate verify failed"):
        handshake(client_ctx, server_ctx, server_hostname="server.example")  # no such name in a SPIFFE leaf
    assert counts(client_ctx) == (0, 1)


def test_the_process_holds_a_bounded_number_of_chains_and_replaces_the_oldest(
    native_records: None, tmp_path: Path
) -> None:
    """The cache is the process's, shared by every context (its memory bounded whatever the number of contexts),
    each context keyed apart. Each handshake below between a fresh client context and the server keeps two chains
    (the client's on the server's context, the server's on the client's), so half the size in clients fills it."""
    module = native.selection().tls_records
    assert module is not None
    n = module.VERIFICATION_CACHE_ENTRIES // 2
    ca = LocalCa(tmp_path / "ca", trust_domain=TD)
    server_cert = issue(ca, "server")
    server_ctx = contexts.server_context(server_cert)
    clients = [contexts.client_context(issue(ca, f"client-{i}")) for i in range(n + 1)]
    for client_ctx in clients[:n]:
        handshake(client_ctx, server_ctx)
    assert counts(server_ctx) == (0, n)
    handshake(clients[n - 1], server_ctx)
    assert counts(server_ctx) == (1, n) and counts(clients[n - 1]) == (1, 1)
    handshake(clients[n], server_ctx)  # full: the oldest two (the first client's) make room
    assert counts(server_ctx) == (1, n + 1)
    handshake(clients[0], server_ctx)
    assert counts(server_ctx) == (1, n + 2) and counts(clients[0]) == (0, 2)  # both sides verified again
    handshake(clients[n - 1], server_ctx)
    assert counts(server_ctx) == (2, n + 2)
    other_ctx = contexts.server_context(server_cert)  # the same certificate, another context: its own keys
    handshake(clients[n - 1], other_ctx)
    assert counts(other_ctx) == (0, 1)
    assert counts(clients[n - 1]) == (3, 1)  # while the client's context knew the server's chain all along


@pytest.mark.parametrize("path", ["python", "no-cache"])
def test_without_the_native_records_or_with_the_cache_off_every_chain_is_verified(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if path == "python":
        use_records_path("python")
    else:
        monkeypatch.setenv(native.VERIFY_CACHE_ENVIRONMENT, "0")
        native.use(native.select({native.VERIFY_CACHE_ENVIRONMENT: "0"}))
        if native.selection().tls_records is None:
            pytest.skip("the native records are not built")
    try:
        ca = LocalCa(tmp_path / "ca", trust_domain=TD)
        client_ctx = contexts.client_context(issue(ca, "client"))
        server_ctx = contexts.server_context(issue(ca, "server"))
        for _ in range(2):
            handshake(client_ctx, server_ctx)
        assert contexts.verification_counts(client_ctx) is None
        assert contexts.verification_counts(server_ctx) is None
    finally:
        native.use(None)


def test_the_setting_is_read_and_checked() -> None:
    assert native.select({native.VERIFY_CACHE_ENVIRONMENT: "0", native.ENVIRONMENT: "0"}).verification_cache is None
    with pytest.raises(native.NativeError, match="AMBIT_NATIVE_VERIFY_CACHE"):
        native.select({native.VERIFY_CACHE_ENVIRONMENT: "yes"})
