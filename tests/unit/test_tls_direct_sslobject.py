"""The HBONE contexts' TLS objects: ``read``, ``write`` and ``pending`` are the C methods, and behave as ssl's own.

A mutual-TLS handshake over memory BIOs between a client and a server context of two workload certificates, then
application data both ways through each of the three, as the event loop's TLS layer calls them (a read of a size,
a read into a buffer, ``pending`` after a partial read, a read with nothing there).
"""

from __future__ import annotations

import contextlib
import ssl
import time

import pytest

from ambit.model.identity import SpiffeId
from ambit.tls.certs import new_ca
from ambit.tls.contexts import DirectSSLObject
from ambit.tls.issuance import sign_csr
from ambit.tls.spiffe import check_peer, make_csr
from ambit.tls.workload import WorkloadCertificate

TD = "cluster.local"
CLIENT = SpiffeId(TD, "shop", "frontend")
SERVER = SpiffeId(TD, "shop", "backend")
_ROOT = new_ca("direct sslobject test root", now=time.time() - 60)


def _certificate(identity: SpiffeId) -> WorkloadCertificate:
    csr, key = make_csr(identity)
    return WorkloadCertificate.from_chain(identity, sign_csr(_ROOT, csr, now=time.time(), ttl_seconds=3600), key)


class _End:
    def __init__(self, context: ssl.SSLContext, *, server: bool) -> None:
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_side=server)


def _pump(a: _End, b: _End) -> None:
    """Run both handshakes to the end (TLS 1.3 with a client certificate: three flights)."""
    for _ in range(4):
        for end in (a, b):
            with contextlib.suppress(ssl.SSLWantReadError):
                end.tls.do_handshake()
        for src, dst in ((a, b), (b, a)):
            dst.incoming.write(src.outgoing.read())


@pytest.fixture(scope="module")
def pair() -> tuple[_End, _End]:
    client = _End(_certificate(CLIENT).client_context(), server=False)
    server = _End(_certificate(SERVER).server_context(), server=True)
    _pump(client, server)
    return client, server


def test_the_hbone_contexts_make_tls_objects_whose_read_write_and_pending_are_c_methods(
    pair: tuple[_End, _End],
) -> None:
    client, server = pair
    for end in (client, server):
        assert isinstance(end.tls, DirectSSLObject) and isinstance(end.tls, ssl.SSLObject)
        for name in ("read", "write", "pending"):
            method = getattr(end.tls, name)
            assert type(method).__name__ == "builtin_function_or_method", name
            assert method.__self__ is end.tls._sslobj  # type: ignore[attr-defined]


def test_the_handshake_through_them_proves_both_identities(pair: tuple[_End, _End]) -> None:
    client, server = pair
    assert check_peer(client.tls.getpeercert(binary_form=True), trust_domain=TD, expected=frozenset({SERVER})) == SERVER
    assert check_peer(server.tls.getpeercert(binary_form=True), trust_domain=TD, expected=None) == CLIENT
    assert client.tls.selected_alpn_protocol() == server.tls.selected_alpn_protocol() == "h2"


def test_application_data_goes_both_ways_by_size_by_buffer_and_with_pending(pair: tuple[_End, _End]) -> None:
    client, server = pair
    assert client.tls.write(b"hello server") == len(b"hello server")
    server.incoming.write(client.outgoing.read())
    assert server.tls.read(5) == b"hello"
    assert server.tls.pending() == len(b" server")
    buffer = bytearray(64)
    assert server.tls.read(64, buffer) == len(b" server")
    assert bytes(buffer[:7]) == b" server"
    assert server.tls.pending() == 0
    with pytest.raises(ssl.SSLWantReadError):
        server.tls.read(64)

    server.tls.write(memoryview(b"and back"))
    client.incoming.write(server.outgoing.read())
    assert client.tls.read(1024) == b"and back"
