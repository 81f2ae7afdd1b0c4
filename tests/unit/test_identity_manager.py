from __future__ import annotations

import asyncio
import stat
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from cryptography import x509

from ambit.identity import manager as manager_module
from ambit.identity.caclient import Backoff, CaError
from ambit.identity.localca import LocalCa
from ambit.identity.manager import CertificateManager
from ambit.model.identity import SpiffeId
from ambit.tls.certs import CertificateError, new_ca
from ambit.tls.issuance import sign_csr
from ambit.tls.spiffe import make_csr
from ambit.tls.workload import WorkloadCertificate

A = SpiffeId("cluster.local", "shop", "a")
B = SpiffeId("cluster.local", "shop", "b")
C = SpiffeId("cluster.local", "shop", "c")
D = SpiffeId("cluster.local", "shop", "d")

_ROOT = new_ca("manager test root", now=time.time() - 60)
_SIGNED: dict[SpiffeId, tuple[list[bytes], bytes]] = {}


def _material(identity: SpiffeId) -> tuple[list[bytes], bytes]:
    if identity not in _SIGNED:
        csr, key = make_csr(identity)
        _SIGNED[identity] = (sign_csr(_ROOT, csr, now=time.time(), ttl_seconds=3600), key)
    return _SIGNED[identity]


class FakeCa:
    """Issues certificates valid for ``ttl`` seconds from now; counts calls, can block and fail on demand."""

    def __init__(self, ttl: float = 60.0) -> None:
        self.ttl = ttl
        self.calls: Counter[SpiffeId] = Counter()
        self.order: list[SpiffeId] = []
        self.times: list[float] = []
        self.failure: Exception | None = None
        self.open = asyncio.Event()
        self.open.set()
        self.wrong_identity = False

    async def fetch_certificate(self, identity: SpiffeId) -> WorkloadCertificate:
        self.calls[identity] += 1
        self.order.append(identity)
        self.times.append(time.monotonic())
        await self.open.wait()
        await asyncio.sleep(0.001)
        if self.failure is not None:
            raise self.failure
        issued = D if self.wrong_identity else identity
        chain, key = _material(issued)
        now = time.time()
        return WorkloadCertificate(issued, tuple(chain), key, chain[-1], now, now + self.ttl)


@pytest.fixture
async def ca() -> FakeCa:
    return FakeCa()


@pytest.fixture
async def manager(ca: FakeCa) -> AsyncIterator[CertificateManager]:
    owned = CertificateManager(ca, backoff=Backoff(initial=0.1, cap=0.4), draw=lambda: 0.0)
    yield owned
    await owned.aclose()


async def _eventually(predicate: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_concurrent_fetches_share_one_ca_call_and_then_hit_the_cache(
    ca: FakeCa, manager: CertificateManager
) -> None:
    ca.open.clear()
    waiters = [asyncio.create_task(manager.fetch(A)) for _ in range(5)]
    await asyncio.sleep(0.05)
    assert ca.calls[A] == 1 and manager.find(A) is None
    ca.open.set()
    certs = await asyncio.gather(*waiters)
    assert all(cert is certs[0] for cert in certs)
    assert await manager.fetch(A) is certs[0] and manager.find(A) is certs[0]
    assert ca.calls[A] == 1


async def test_a_cancelled_caller_does_not_cancel_the_shared_fetch(ca: FakeCa, manager: CertificateManager) -> None:
    ca.open.clear()
    first = asyncio.create_task(manager.fetch(A))
    second = asyncio.create_task(manager.fetch(A))
    await asyncio.sleep(0.02)
    first.cancel()
    ca.open.set()
    assert (await second).identity == A
    assert ca.calls[A] == 1


async def test_ca_failures_reach_the_caller_as_ca_errors(ca: FakeCa, manager: CertificateManager) -> None:
    ca.failure = CaError("CA is down")
    with pytest.raises(CaError, match="CA is down"):
        await manager.fetch(A)
    ca.failure = RuntimeError("boom")
    with pytest.raises(CaError, match="boom"):
        await manager.fetch(A)
    ca.failure = None
    ca.wrong_identity = True
    with pytest.raises(CaError, match="but got a certificate for"):
        await manager.fetch(A)
    assert manager.find(A) is None


async def test_tracked_certificate_is_refreshed_at_half_life(ca: FakeCa, manager: CertificateManager) -> None:
    ca.ttl = 1.0
    manager.track([A])
    await _eventually(lambda: manager.find(A) is not None)
    first = manager.find(A)
    assert first is not None
    await asyncio.sleep(0.3)
    assert ca.calls[A] == 1
    await _eventually(lambda: ca.calls[A] == 2, within=1.0)
    await _eventually(lambda: manager.find(A) is not first)
    second = manager.find(A)
    assert second is not None and second.not_after > first.not_after
    assert ca.times[1] - ca.times[0] == pytest.approx(first.refresh_at - first.not_before, abs=0.15)


async def test_failed_refresh_backs_off_exponentially_and_keeps_the_old_certificate(
    ca: FakeCa, manager: CertificateManager
) -> None:
    ca.ttl = 2.0
    manager.track([A])
    await _eventually(lambda: manager.find(A) is not None)
    old = manager.find(A)
    ca.failure = CaError("CA is down")
    await _eventually(lambda: ca.calls[A] >= 3, within=2.0)  # the refresh at 1.0 s and the first retry
    assert manager.find(A) is old
    await _eventually(lambda: ca.calls[A] >= 5, within=2.0)
    gaps = [later - earlier for earlier, later in zip(ca.times[1:], ca.times[2:], strict=False)]
    for gap, expected in zip(gaps, [0.1, 0.2, 0.4], strict=False):
        assert expected - 0.02 <= gap <= expected + 0.15
    await _eventually(lambda: manager.find(A) is None, within=1.0)  # old certificate expired at 2.0 s
    [entry] = manager.snapshot()
    assert entry["state"] == "Unavailable: CA is down"
    ca.failure = None
    await _eventually(lambda: manager.find(A) is not None, within=1.0)  # a retry at most the back-off's cap later
    assert manager.snapshot()[0]["state"] == "Available"


async def test_track_prefetches_new_identities_and_forgets_departed_ones(
    ca: FakeCa, manager: CertificateManager
) -> None:
    manager.track([A, B])
    await _eventually(lambda: manager.find(A) is not None and manager.find(B) is not None)
    on_demand = await manager.fetch(C)
    assert manager.find(C) is on_demand
    manager.track([B])
    assert manager.find(A) is None and manager.find(C) is None
    assert manager.find(B) is not None
    assert [entry["identity"] for entry in manager.snapshot()] == [str(B)]
    await asyncio.sleep(0.05)
    assert ca.calls == Counter({A: 1, B: 1, C: 1})


async def test_an_on_demand_certificate_is_not_refreshed(ca: FakeCa, manager: CertificateManager) -> None:
    ca.ttl = 0.4
    await manager.fetch(C)
    await asyncio.sleep(0.6)
    assert ca.calls[C] == 1 and manager.find(C) is None
    await manager.fetch(C)
    assert ca.calls[C] == 2


async def test_connections_overtake_prefetches_in_the_ca_queue(ca: FakeCa, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manager_module, "MAX_CONCURRENT_CA_REQUESTS", 1)
    owned = CertificateManager(ca)
    try:
        ca.open.clear()
        owned.track([A, B, C])
        await asyncio.sleep(0.02)
        assert ca.order == [A]  # one slot: B and C queue at low priority
        promoted = asyncio.create_task(owned.fetch(C))  # joins C's queued prefetch and promotes it
        urgent = asyncio.create_task(owned.fetch(D))
        await asyncio.sleep(0.02)
        ca.open.set()
        await asyncio.gather(promoted, urgent)
        await _eventually(lambda: owned.find(B) is not None)
        assert ca.order == [A, C, D, B]
    finally:
        await owned.aclose()


async def test_snapshot_has_the_config_dump_shape(ca: FakeCa, manager: CertificateManager) -> None:
    ca.open.clear()
    manager.track([B])
    await asyncio.sleep(0.02)
    assert manager.snapshot() == [{"identity": str(B), "state": "Initializing", "certChain": [], "rootCerts": []}]
    ca.open.set()
    cert = await manager.fetch(A)
    entries = manager.snapshot()
    assert [entry["identity"] for entry in entries] == [str(A), str(B)]
    entry = entries[0]
    assert set(entry) == {"identity", "state", "certChain", "rootCerts"}
    assert entry["state"] == "Available"
    [leaf] = entry["certChain"]
    assert set(leaf) == {"pem", "serialNumber", "validFrom", "expirationTime"}
    parsed = x509.load_pem_x509_certificate(leaf["pem"].encode())
    assert leaf["serialNumber"] == format(parsed.serial_number, "x")
    assert leaf["validFrom"].endswith("Z") and "T" in leaf["expirationTime"]
    [root] = entry["rootCerts"]
    assert root["pem"].encode() == cert.roots_pem


async def test_closed_manager_refuses_work(ca: FakeCa) -> None:
    owned = CertificateManager(ca)
    owned.track([A])
    await owned.aclose()
    with pytest.raises(CaError, match="closed"):
        await owned.fetch(B)
    with pytest.raises(CaError, match="closed"):
        owned.track([B])


async def test_workload_certificate_builds_its_contexts_once() -> None:
    chain, key = _material(A)
    cert = WorkloadCertificate.from_chain(A, chain, key)
    assert cert.client_context() is cert.client_context()
    assert cert.server_context() is cert.server_context()
    assert cert.client_context() is not cert.server_context()
    assert cert.refresh_at == pytest.approx((cert.not_before + cert.not_after) / 2)
    assert cert == WorkloadCertificate.from_chain(A, chain, key)
    with pytest.raises(CertificateError, match="but got a certificate for"):
        WorkloadCertificate.from_chain(B, chain, key)
    with pytest.raises(CertificateError, match="empty chain"):
        WorkloadCertificate.from_chain(A, [], key)


async def test_local_ca_keeps_its_root_on_disk_and_signs_its_trust_domain_only(tmp_path: Path) -> None:
    directory = tmp_path / "ca"
    local = LocalCa(directory, ttl_seconds=600)
    assert (directory / "root.crt").read_bytes() == local.roots_pem
    assert stat.S_IMODE((directory / "root.key").stat().st_mode) == 0o600
    cert = await local.fetch_certificate(A)
    assert cert.identity == A and cert.roots_pem == local.roots_pem and cert.chain_pem[-1] == local.roots_pem
    x509.load_pem_x509_certificate(cert.chain_pem[0]).verify_directly_issued_by(
        x509.load_pem_x509_certificate(local.roots_pem)
    )
    assert cert.not_after - time.time() == pytest.approx(600, abs=5)
    assert LocalCa(directory).roots_pem == local.roots_pem  # reloaded, not recreated
    with pytest.raises(CaError, match="outside this CA's trust domain"):
        await local.fetch_certificate(SpiffeId("other.local", "shop", "a"))


async def test_a_local_ca_reads_a_root_on_disk_with_its_first_certificate_and_reports_a_broken_one_then(
    tmp_path: Path,
) -> None:
    """A node proxy without pods never loads cryptography's x509 stack: the root is read by the first request."""
    directory = tmp_path / "ca"
    LocalCa(directory)  # creates the root
    (directory / "root.crt").write_bytes(b"not a certificate")
    broken = LocalCa(directory)  # the root is on disk: not read yet
    with pytest.raises(CaError, match=r"the local CA in .* is unusable"):
        await broken.fetch_certificate(A)
    (directory / "root.key").unlink()
    with pytest.raises(CertificateError, match="exists but"):
        LocalCa(directory)  # a lone file is reported at once, as before
