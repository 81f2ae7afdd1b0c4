"""A running ``ambit controlplane`` follows its plug-in CA's files (Istio's TestIntermediateCertificateRefresh, on
one machine): the ``cacerts`` directory is replaced the way a kubelet updates a Secret volume, and certificates
asked for afterwards chain to the new intermediate, while a bad set is refused (Warning Event) and the CA in use
keeps signing; a root rotation goes through its three steps (both roots published and sent, the new root's
intermediate signing, the old root dropped) and the control plane's own serving certificates (xDS and CA, the
validating webhook with its caBundle) follow.

The control plane is a subprocess (``python -m ambit.cli controlplane --cacerts-dir ...``) against the module's
embedded API server; certificates are asked for with the node proxy's own CA client, without impersonation."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from tests import crl_pki
from tests.cacerts import cacerts_files, first_cert, write_volume
from tests.harness import ServerProcess, free_port
from tests.integration.controlplane_rig import account_token, control_plane_process

from ambit.controlplane.ca.root import ROOT_CERT_KEY, ROOT_CONFIG_MAP
from ambit.controlplane.webhook import CONFIGURATION_NAME
from ambit.identity.istiod import IstiodCaClient
from ambit.k8s import KubeAlreadyExistsError, KubeClient, KubeNotFoundError, kinds
from ambit.model.identity import SpiffeId
from ambit.tls.certs import KeyPair
from ambit.tls.workload import WorkloadCertificate

NAMESPACE = "shop"
WEB = SpiffeId("cluster.local", NAMESPACE, "web")
RELOAD_WITHIN = 30.0
"""Two looks at the files (2 s each) and a CA call, with room for a loaded machine."""


async def eventually(predicate: Callable[[], Awaitable[Any]], what: str, within: float = RELOAD_WITHIN) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {within:.0f} s waiting for {what}"
        await asyncio.sleep(0.2)


class Plane:
    """The control plane subprocess, its CA directory and a CA client as ``shop/web``."""

    def __init__(
        self,
        directory: Path,
        process: asyncio.subprocess.Process,
        port: int,
        client: IstiodCaClient,
        webhook: int,
        scratch: Path,
    ) -> None:
        self.directory = directory
        self.process = process
        self.port = port
        self.client = client
        self.webhook_port = webhook
        self.scratch = scratch
        self.generation = 1

    async def webhook_issuer(self) -> str:
        """The issuer of the certificate the validating webhook presents now."""
        return await asyncio.to_thread(_presented_issuer, self.webhook_port)

    def replace(self, files: dict[str, bytes]) -> None:
        self.generation += 1
        write_volume(self.directory, files, self.generation)

    async def issuer(self) -> str:
        """The subject of the intermediate of a certificate asked for now."""
        cert = await self.client.fetch_certificate(WEB)
        return _subject(cert.chain_pem[1])

    async def certificate(self) -> WorkloadCertificate:
        return await self.client.fetch_certificate(WEB)


def _presented_issuer(port: int) -> str:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # only looking at what is presented
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).issuer.rfc4514_string()


async def _webhook_bundle(kube: KubeClient) -> list[str]:
    found = await kube.get(kinds.VALIDATING_WEBHOOK_CONFIGURATIONS, CONFIGURATION_NAME)
    pem = base64.b64decode(found["webhooks"][0]["clientConfig"]["caBundle"])
    return [c.subject.rfc4514_string() for c in x509.load_pem_x509_certificates(pem)]


def _subject(pem: bytes) -> str:
    return x509.load_pem_x509_certificate(pem).subject.rfc4514_string()


@pytest.fixture
async def plane(server_process: ServerProcess, kube: KubeClient, tmp_path: Path) -> AsyncIterator[Plane]:
    for namespace in ("istio-system", NAMESPACE):
        with contextlib.suppress(KubeAlreadyExistsError):
            await kube.create(kinds.NAMESPACES, {"metadata": {"name": namespace}})
    token_file = tmp_path / "token"
    token_file.write_text(await account_token(kube, NAMESPACE, "web"))
    directory = tmp_path / "cacerts"
    webhook_port = free_port()
    write_volume(directory, cacerts_files(FIRST, ROOT.cert_pem), 1)
    scratch = tmp_path / "scratch"  # the process's TMPDIR: it must hold no key file while the process runs
    scratch.mkdir()
    args = ("--webhook-port", str(webhook_port), "--cacerts-dir", str(directory))
    env = {"TMPDIR": str(scratch)}
    async with control_plane_process(server_process.kubeconfig, tmp_path, *args, env=env) as (process, port):
        client = IstiodCaClient(
            f"127.0.0.1:{port}",
            directory / "root-cert.pem",
            token_file,
            ttl_seconds=300,
            impersonate=False,
            server_name="istiod.istio-system.svc",
        )
        async with client:
            yield Plane(directory, process, port, client, webhook_port, scratch)


NOW = time.time()
ROOT = crl_pki.root("Mesh root", now=NOW)
NEW_ROOT = crl_pki.root("New mesh root", now=NOW)
FIRST = crl_pki.intermediate(ROOT, "Intermediate 1", now=NOW)
SECOND = crl_pki.intermediate(ROOT, "Intermediate 2", now=NOW)
UNDER_NEW_ROOT = crl_pki.intermediate(NEW_ROOT, "Intermediate under the new root", now=NOW)
EVIL = crl_pki.intermediate(crl_pki.root("Mesh root", now=NOW), "Intermediate 3", now=NOW)


async def _events(kube: KubeClient, reason: str) -> list[dict[str, Any]]:
    try:
        events = (await kube.list(kinds.EVENTS, "istio-system"))[0]
    except KubeNotFoundError:
        return []
    return [e for e in events if e.get("reason") == reason]


async def _published_roots(kube: KubeClient) -> list[str]:
    try:
        found = await kube.get(kinds.CONFIG_MAPS, ROOT_CONFIG_MAP, NAMESPACE)
    except KubeNotFoundError:
        return []
    pem = (found.get("data") or {}).get(ROOT_CERT_KEY, "")
    return [c.subject.rfc4514_string() for c in x509.load_pem_x509_certificates(pem.encode())] if pem else []


def _leaf_signed_by(cert: WorkloadCertificate, signer: KeyPair) -> bool:
    leaf = x509.load_pem_x509_certificate(cert.chain_pem[0])
    intermediate = x509.load_pem_x509_certificate(first_cert(signer.cert_pem))
    aki = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
    ski = intermediate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
    leaf.verify_directly_issued_by(intermediate)
    return aki == ski and cert.chain_pem[1] == intermediate.public_bytes(serialization.Encoding.PEM)


async def test_a_replaced_intermediate_signs_the_certificates_asked_for_after_it(
    plane: Plane, kube: KubeClient
) -> None:
    before = await plane.certificate()
    assert _leaf_signed_by(before, FIRST)
    assert await plane.webhook_issuer() == "CN=Intermediate 1"
    assert list(plane.scratch.iterdir()) == [], "the webhook's key was left on disk"
    started = time.monotonic()
    plane.replace(cacerts_files(SECOND, ROOT.cert_pem))
    await eventually(lambda: _is(plane.issuer(), "CN=Intermediate 2"), "certificates from the new intermediate")
    took = time.monotonic() - started
    after = await plane.certificate()
    assert _leaf_signed_by(after, SECOND) and after.roots_pem == first_cert(ROOT.cert_pem)
    assert await _events(kube, "CaReloaded"), "no CaReloaded Event"
    print(f"the new intermediate signed {took:.1f} s after the files were swapped")

    # A set from a foreign root (its root carrying the real root's name) is refused; the new CA keeps signing.
    refusals_before = len(await _events(kube, "CaReloadRefused"))
    plane.replace(cacerts_files(EVIL, ROOT.cert_pem))
    refused = await eventually(
        lambda: _more(_events(kube, "CaReloadRefused"), refusals_before), "a CaReloadRefused Event"
    )
    assert "foreign_root" in refused[-1]["note"]
    assert _leaf_signed_by(await plane.certificate(), SECOND)

    # A root rotation's first step: the new root joins the bundle, published next to the old one and sent last in
    # every answer, while the intermediate under the old root keeps signing.
    plane.replace(cacerts_files(SECOND, ROOT.cert_pem + NEW_ROOT.cert_pem))
    both = ["CN=Mesh root,O=cluster.local", "CN=New mesh root,O=cluster.local"]
    await eventually(lambda: _is(_published_roots(kube), both), "both roots in istio-ca-root-cert")
    await eventually(lambda: _is(_webhook_bundle(kube), both), "both roots in the webhook's caBundle")
    rotated = await plane.certificate()
    assert [c.subject.rfc4514_string() for c in x509.load_pem_x509_certificates(rotated.roots_pem)] == both
    assert _leaf_signed_by(rotated, SECOND)

    # Step 2: an intermediate under the new root signs (and the control plane's own serving certificate moves to
    # it); step 3: the old root leaves the bundle, and a client trusting only the new root still reaches the CA.
    plane.replace(cacerts_files(UNDER_NEW_ROOT, ROOT.cert_pem + NEW_ROOT.cert_pem))
    await eventually(lambda: _is(plane.issuer(), "CN=Intermediate under the new root"), "the new root's intermediate")
    assert await plane.webhook_issuer() == "CN=Intermediate under the new root"
    assert list(plane.scratch.iterdir()) == [], "the reloaded webhook key was left on disk"
    plane.replace(cacerts_files(UNDER_NEW_ROOT, NEW_ROOT.cert_pem))
    await eventually(lambda: _is(_published_roots(kube), both[1:]), "only the new root in istio-ca-root-cert")
    await eventually(lambda: _is(_webhook_bundle(kube), both[1:]), "only the new root in the webhook's caBundle")
    final = await plane.certificate()  # over a channel that trusts only the new root
    assert _leaf_signed_by(final, UNDER_NEW_ROOT) and final.roots_pem == first_cert(NEW_ROOT.cert_pem)


async def _is(value: Awaitable[Any], expected: Any) -> bool:
    return bool(await value == expected)


async def _more(value: Awaitable[list[dict[str, Any]]], than: int) -> list[dict[str, Any]] | None:
    found = await value
    return found if len(found) > than else None
