"""CRL checks on real mutual TLS (ztunnel's crl_* tests): an HBONE server and client pool on loopback, each with its
own CRL file, certificates from a plug-in intermediate under a root. A revoked client is refused inbound, a revoked
server outbound, a revoked intermediate revokes both, a CRL update closes established connections, and a forged or
broken CRL file changes nothing."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests import crl_pki
from tests.integration.hbone_mesh import CLIENT, SERVER, Mesh, echo_once, until

from ambit.identity.localca import LocalCa
from ambit.proxy.errors import ProxyError
from ambit.proxy.hbone_client import HboneConnectError
from ambit.proxy.revocation import RevocationManager
from ambit.telemetry.metrics import ProxyMetrics
from ambit.tls.certs import KeyPair
from ambit.tls.socket_transport import TlsTransportKind


@dataclass
class Side:
    """One proxy's CRL: its file, its manager and its metrics."""

    path: Path
    metrics: ProxyMetrics
    manager: RevocationManager

    def write(self, data: bytes) -> bool:
        staged = self.path.with_suffix(".new")
        staged.write_bytes(data)
        staged.replace(self.path)  # a new inode, as a ConfigMap volume update swaps the file
        return self.manager.poll()

    def rejections(self, reporter: str) -> float:
        found = re.search(
            rf'^istio_crl_policy_rejections_total{{reporter="{reporter}"}} (\S+)$',
            self.metrics.render().decode(),
            re.MULTILINE,
        )
        return float(found.group(1)) if found else 0.0


@dataclass
class Pki:
    root: KeyPair
    inter: KeyPair

    def crl(self, issuer: KeyPair, serials: list[int], signer: KeyPair | None = None) -> bytes:
        return crl_pki.crl(issuer, serials, signer=signer, now=time.time())


@pytest.fixture
async def rig(tmp_path: Path, tls_transport: TlsTransportKind) -> AsyncIterator[tuple[Mesh, Side, Side, Pki]]:
    now = time.time()
    root = crl_pki.root("Mesh root", now=now)
    inter = crl_pki.intermediate(root, "Cluster intermediate", now=now)
    client_cert = crl_pki.workload(inter, CLIENT, now=now)
    server_cert = crl_pki.workload(inter, SERVER, now=now)
    sides = []
    for name in ("server", "client"):
        path = tmp_path / f"{name}-crl.pem"
        metrics = ProxyMetrics()
        manager = RevocationManager(path, metrics, anchors=lambda: [root.cert_pem], interval=3600)
        manager.poll()
        sides.append(Side(path, metrics, manager))
    server, client = sides
    mesh = Mesh(LocalCa(tmp_path / "unused-ca"), client_cert, server_cert)
    mesh.server_revocation, mesh.client_revocation = server.manager, client.manager
    mesh.tls_transport = tls_transport
    await mesh.start()
    try:
        yield mesh, server, client, Pki(root, inter)
    finally:
        await mesh.aclose()


def serial(cert_pem: bytes) -> int:
    return crl_pki.serial_of(cert_pem)


async def test_without_a_crl_file_connections_work_and_are_tracked(rig: tuple[Mesh, Side, Side, Pki]) -> None:
    mesh, server, client, _ = rig
    assert await echo_once(mesh, b"no CRL yet") == b"no CRL yet"
    assert server.manager.tracked == 1 and client.manager.tracked == 1
    assert server.manager.to_dump()["loaded"] is False


async def test_a_revoked_client_certificate_is_refused_inbound(rig: tuple[Mesh, Side, Side, Pki]) -> None:
    mesh, server, client, pki = rig
    assert server.write(pki.crl(pki.inter, [serial(mesh.client_cert.chain_pem[0])]))
    with pytest.raises(HboneConnectError) as caught:
        await mesh.dial()
    assert caught.value.flag == "TLS_FAILURE"
    await until(lambda: bool(mesh.failures))
    assert "revoked" in mesh.failures[0] and str(CLIENT) in mesh.failures[0]
    assert server.rejections("destination") == 1
    assert client.rejections("source") == 0


async def test_a_revoked_server_certificate_is_refused_outbound(rig: tuple[Mesh, Side, Side, Pki]) -> None:
    mesh, server, client, pki = rig
    assert client.write(pki.crl(pki.inter, [serial(mesh.server_cert.chain_pem[0])]))
    with pytest.raises(HboneConnectError, match="revoked") as caught:
        await mesh.dial()
    assert caught.value.flag == "TLS_FAILURE"
    assert client.rejections("source") == 1
    assert server.rejections("destination") == 0


async def test_an_intermediate_revoked_by_the_roots_crl_is_refused_both_ways(
    rig: tuple[Mesh, Side, Side, Pki],
) -> None:
    mesh, server, client, pki = rig
    revoked = pki.crl(pki.root, [serial(pki.inter.cert_pem)])
    assert server.write(revoked) and client.write(revoked)
    with pytest.raises(HboneConnectError, match="chain certificate 1"):
        await mesh.dial()
    assert client.rejections("source") == 1
    # Under TLS 1.3 the client's handshake completes first: the server judged (and refused) this client too.
    await until(lambda: server.rejections("destination") == 1)
    client.write(b"")  # the client no longer minds; the server still refuses the client's chain
    with pytest.raises(HboneConnectError):
        await mesh.dial()
    await until(lambda: server.rejections("destination") == 2)
    assert client.rejections("source") == 1


async def test_a_forged_crl_in_the_intermediates_name_revokes_nothing(rig: tuple[Mesh, Side, Side, Pki]) -> None:
    mesh, server, _client, pki = rig
    forger = crl_pki.root("Forger", now=time.time())
    victim = serial(mesh.client_cert.chain_pem[0])
    assert server.write(pki.crl(pki.inter, [victim], signer=forger))
    assert await echo_once(mesh, b"still welcome") == b"still welcome"
    forged_root_crl = pki.crl(pki.root, [serial(pki.inter.cert_pem)], signer=forger)
    assert server.write(forged_root_crl)
    assert "not signed by that CA" in server.manager.to_dump()["ignored"][0]
    assert await echo_once(mesh, b"still welcome") == b"still welcome"
    assert server.rejections("destination") == 0


async def test_a_crl_update_closes_an_established_inbound_connection(rig: tuple[Mesh, Side, Side, Pki]) -> None:
    mesh, server, _client, pki = rig
    stream = await mesh.open()
    try:
        await stream.write(b"ping")
        assert await stream.read() == b"ping"
        assert server.write(pki.crl(pki.inter, [serial(mesh.client_cert.chain_pem[0])]))
        with pytest.raises(ProxyError):  # an abrupt end: a clean one would not raise
            async with asyncio.timeout(10):
                while await stream.read():
                    pass
    finally:
        await stream.aclose()
    assert server.rejections("destination") == 1
    assert server.manager.tracked == 0
    await until(lambda: mesh.pool.stats()["connections"] == 0)
    with pytest.raises(HboneConnectError):
        await mesh.dial()


async def test_a_crl_update_closes_an_established_outbound_connection(rig: tuple[Mesh, Side, Side, Pki]) -> None:
    mesh, _server, client, pki = rig
    stream = await mesh.open()
    try:
        await stream.write(b"ping")
        assert await stream.read() == b"ping"
        unrelated = pki.crl(pki.inter, [12345])
        assert client.write(unrelated)
        await stream.write(b"still")
        assert await stream.read() == b"still"  # a CRL that does not revoke the peer leaves it alone
        assert client.write(unrelated + pki.crl(pki.root, [serial(pki.inter.cert_pem)]))
        with pytest.raises(ProxyError, match="peer certificate revoked"):
            async with asyncio.timeout(10):
                await stream.write(b"more")
                while await stream.read():
                    pass
    finally:
        await stream.aclose()
    assert client.rejections("source") == 1
    assert client.manager.tracked == 0


async def test_a_broken_or_missing_crl_file_keeps_the_last_good_crl(rig: tuple[Mesh, Side, Side, Pki]) -> None:
    mesh, server, _client, pki = rig
    assert server.write(pki.crl(pki.inter, [serial(mesh.client_cert.chain_pem[0])]))
    assert not server.write(b"-----BEGIN X509 CRL-----\ngarbage\n-----END X509 CRL-----\n")
    assert "last CRL stays in force" in server.manager.error
    with pytest.raises(HboneConnectError):
        await mesh.dial()
    server.path.unlink()
    assert not server.manager.poll()
    assert "gone" in server.manager.error
    with pytest.raises(HboneConnectError):
        await mesh.dial()
    assert server.write(b"")  # an empty file withdraws the revocations
    assert server.manager.error == ""
    assert await echo_once(mesh, b"welcome back") == b"welcome back"
