"""The mesh CA end to end: a real API server (subprocess), real TokenRequest tokens, gRPC over loopback TLS.

Each test gets its own workload namespace and node names, so tests sharing the module's API server do not see
each other's pods. The node proxy is pod ``ztunnel-<run>`` of ``istio-system/ztunnel`` on node A; ``web`` runs on
node A and ``db`` only on node B.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import grpc.aio  # type: ignore[import-untyped]
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from google.protobuf import struct_pb2
from tests.harness import ServerProcess
from tests.integration.tcp_relay import Relay

from ambit.api import ca_pb2
from ambit.apiserver.tokens import TokenIssuer
from ambit.controlplane.ca.authn import KubeAuthenticator
from ambit.controlplane.ca.errors import RootCaError
from ambit.controlplane.ca.nodeauth import InformerPodIndex, NodeAuthorizer
from ambit.controlplane.ca.root import (
    ROOT_CERT_KEY,
    ROOT_CONFIG_MAP,
    SYSTEM_NAMESPACE,
    RootCa,
    RootCertPublisher,
    load_or_create_root_secret,
    load_plugin_ca,
)
from ambit.controlplane.ca.server import GRPC_SERVER_OPTIONS, METHOD_PATH, CaService, RootSigner, flatten_chain
from ambit.identity.caclient import CaError
from ambit.identity.istiod import IstiodCaClient
from ambit.k8s import KubeAlreadyExistsError, KubeClient, kinds
from ambit.model.identity import SpiffeId
from ambit.tls.certs import KeyPair, issue_server_cert, new_ca
from ambit.tls.spiffe import identity_of, make_csr
from ambit.xds.keepalive import KeepaliveSettings

TD = "cluster.local"
DAY = 86400


@dataclass
class Mesh:
    kube: KubeClient
    run: str
    namespace: str
    node_a: str
    node_b: str
    pods: dict[str, dict[str, Any]]

    def identity(self, sa: str, namespace: str | None = None) -> SpiffeId:
        return SpiffeId(TD, namespace or self.namespace, sa)

    async def token(self, pod: str | None, *, sa: str | None = None, audiences: tuple[str, ...] = ("istio-ca",)) -> str:
        """A TokenRequest token for ``pod``'s service account, bound to the pod (or for ``sa``, unbound)."""
        if pod is not None:
            obj = self.pods[pod]
            meta = obj["metadata"]
            namespace, account = meta["namespace"], obj["spec"]["serviceAccountName"]
        else:
            assert sa is not None
            obj, namespace, account = None, self.namespace, sa
        answer = await self.kube.create_token(namespace, account, list(audiences), bound_pod=obj)
        token: str = answer["status"]["token"]
        return token


@dataclass
class Ca:
    port: int
    root: RootCa
    index: InformerPodIndex
    root_file: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


async def create_ignoring_conflict(kube: KubeClient, kind: kinds.ResourceKind, obj: dict[str, Any]) -> None:
    with contextlib.suppress(KubeAlreadyExistsError):
        await kube.create(kind, obj)


def pod(name: str, namespace: str, sa: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "serviceAccountName": sa,
            "nodeName": node,
            "containers": [{"name": "app", "image": "example.com/app:1"}],
        },
    }


async def eventually(predicate: Callable[[], Awaitable[bool] | bool]) -> None:
    async with asyncio.timeout(10):
        while True:
            result = predicate()
            if isinstance(result, Awaitable):
                result = await result
            if result:
                return
            await asyncio.sleep(0.05)


@pytest.fixture
async def kube(server_process: ServerProcess) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(server_process.kubeconfig) as client:
        yield client


@pytest.fixture
async def mesh(kube: KubeClient) -> Mesh:
    run = secrets.token_hex(3)
    mesh = Mesh(kube, run, f"shop-{run}", f"node-a-{run}", f"node-b-{run}", {})
    await create_ignoring_conflict(kube, kinds.NAMESPACES, {"metadata": {"name": SYSTEM_NAMESPACE}})
    await create_ignoring_conflict(
        kube, kinds.SERVICE_ACCOUNTS, {"metadata": {"name": "ztunnel", "namespace": SYSTEM_NAMESPACE}}
    )
    await kube.create(kinds.NAMESPACES, {"metadata": {"name": mesh.namespace}})
    for sa in ("web", "db"):
        await kube.create(kinds.SERVICE_ACCOUNTS, {"metadata": {"name": sa, "namespace": mesh.namespace}})
    for node in (mesh.node_a, mesh.node_b):
        await kube.create(kinds.NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    for key, obj in {
        "ztunnel": pod(f"ztunnel-{run}", SYSTEM_NAMESPACE, "ztunnel", mesh.node_a),
        "ztunnel-b": pod(f"ztunnel-b-{run}", SYSTEM_NAMESPACE, "ztunnel", mesh.node_b),
        "web": pod("web-1", mesh.namespace, "web", mesh.node_a),
        "db": pod("db-1", mesh.namespace, "db", mesh.node_b),
    }.items():
        mesh.pods[key] = await kube.create(kinds.PODS, obj)
    return mesh


@pytest.fixture
async def ca(kube: KubeClient, mesh: Mesh, tmp_path: Path) -> AsyncIterator[Ca]:
    root = await load_or_create_root_secret(kube)
    server_cert = issue_server_cert(
        root.signer,
        common_name="istiod",
        dns_names=["istiod.istio-system.svc"],
        ip_addresses=["127.0.0.1"],
        now=time.time(),
    )
    root_file = tmp_path / "root-cert.pem"
    root_file.write_bytes(root.root_pem)
    async with InformerPodIndex(kube) as index:
        service = CaService(KubeAuthenticator(kube), NodeAuthorizer(index, trust_domain=TD), RootSigner(root))
        server = grpc.aio.server(options=GRPC_SERVER_OPTIONS)
        service.add_to_server(server)
        credentials = grpc.ssl_server_credentials([(server_cert.key_pem, server_cert.cert_pem)])
        port = server.add_secure_port("127.0.0.1:0", credentials)
        await server.start()
        # The node index is eventually consistent; wait for this test's pods before asking anything of it.
        await eventually(lambda: bool(index.find_pods_on_node((mesh.node_b, mesh.namespace, "db"))))
        try:
            yield Ca(port, root, index, root_file)
        finally:
            await server.stop(None)


async def create_certificate(
    ca: Ca,
    token: str | None,
    csr_for: SpiffeId,
    *,
    impersonate: SpiffeId | None = None,
    ttl: int = 0,
    metadata: tuple[tuple[str, str], ...] | None = None,
) -> list[str]:
    """The cert chain from a raw CreateCertificate call; raises grpc.aio.AioRpcError when refused."""
    csr, _key = make_csr(csr_for)
    request = ca_pb2.IstioCertificateRequest(csr=csr.decode(), validity_duration=ttl)
    if impersonate is not None:
        request.metadata.CopyFrom(
            struct_pb2.Struct(fields={"ImpersonatedIdentity": struct_pb2.Value(string_value=str(impersonate))})
        )
    if metadata is None:
        metadata = (("clusterid", "Kubernetes"),) + ((("authorization", f"Bearer {token}"),) if token else ())
    async with grpc.aio.secure_channel(ca.address, grpc.ssl_channel_credentials(ca.root.root_pem)) as channel:
        call = channel.unary_unary(
            METHOD_PATH,
            request_serializer=ca_pb2.IstioCertificateRequest.SerializeToString,
            response_deserializer=ca_pb2.IstioCertificateResponse.FromString,
        )
        response = await call(request, metadata=metadata, timeout=10)
    return list(response.cert_chain)


async def refused(ca: Ca, token: str | None, csr_for: SpiffeId, **kwargs: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await create_certificate(ca, token, csr_for, **kwargs)
    return info.value


def leaf_of(chain: list[str]) -> x509.Certificate:
    return x509.load_pem_x509_certificate(chain[0].encode())


def leaf_identity(chain: list[str]) -> SpiffeId:
    return identity_of(leaf_of(chain).public_bytes(serialization.Encoding.DER))


def lifetime(chain: list[str]) -> datetime.timedelta:
    leaf = leaf_of(chain)
    return leaf.not_valid_after_utc - leaf.not_valid_before_utc


# -- issuing ----------------------------------------------------------------------------------------------------


async def test_a_pods_own_token_gets_its_own_identity_with_the_root_last(mesh: Mesh, ca: Ca) -> None:
    web = mesh.identity("web")
    chain = await create_certificate(ca, await mesh.token("web"), web)
    assert leaf_identity(chain) == web
    assert len(chain) == 2
    assert all(pem.endswith("-----END CERTIFICATE-----\n") and pem.count("BEGIN") == 1 for pem in chain)
    assert x509.load_pem_x509_certificate(chain[-1].encode()) == x509.load_pem_x509_certificate(ca.root.root_pem)


async def test_the_node_proxy_may_impersonate_a_pod_on_its_node(mesh: Mesh, ca: Ca) -> None:
    web = mesh.identity("web")
    chain = await create_certificate(ca, await mesh.token("ztunnel"), web, impersonate=web)
    assert leaf_identity(chain) == web


async def test_the_node_proxy_may_not_impersonate_a_pod_only_on_another_node(mesh: Mesh, ca: Ca) -> None:
    db = mesh.identity("db")
    error = await refused(ca, await mesh.token("ztunnel"), db, impersonate=db)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert mesh.node_a not in (error.details() or "") and "db" not in (error.details() or "")
    # ...while the node proxy of node B may.
    assert leaf_identity(await create_certificate(ca, await mesh.token("ztunnel-b"), db, impersonate=db)) == db


async def test_a_workload_may_not_impersonate_another(mesh: Mesh, ca: Ca) -> None:
    db = mesh.identity("db")
    error = await refused(ca, await mesh.token("web"), db, impersonate=db)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_node_proxy_pod_on_a_node_without_a_node_object_may_not_impersonate(mesh: Mesh, ca: Ca) -> None:
    ghost = f"node-ghost-{mesh.run}"
    await mesh.kube.create(kinds.PODS, pod(f"ztunnel-g-{mesh.run}", SYSTEM_NAMESPACE, "ztunnel", ghost))
    mesh.pods["ztunnel-g"] = await mesh.kube.get(kinds.PODS, f"ztunnel-g-{mesh.run}", SYSTEM_NAMESPACE)
    await mesh.kube.create(kinds.PODS, pod("web-g", mesh.namespace, "web", ghost))
    await eventually(lambda: bool(ca.index.find_pods_on_node((ghost, mesh.namespace, "web"))))
    web = mesh.identity("web")
    error = await refused(ca, await mesh.token("ztunnel-g"), web, impersonate=web)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_pod_appearing_on_the_node_is_authorized_once_indexed(mesh: Mesh, ca: Ca) -> None:
    db = mesh.identity("db")
    await mesh.kube.create(kinds.PODS, pod("db-2", mesh.namespace, "db", mesh.node_a))
    await eventually(lambda: bool(ca.index.find_pods_on_node((mesh.node_a, mesh.namespace, "db"))))
    assert leaf_identity(await create_certificate(ca, await mesh.token("ztunnel"), db, impersonate=db)) == db
    await mesh.kube.delete(kinds.PODS, "db-2", mesh.namespace, grace_period_seconds=0)
    await eventually(lambda: not ca.index.find_pods_on_node((mesh.node_a, mesh.namespace, "db")))
    assert (
        await refused(ca, await mesh.token("ztunnel"), db, impersonate=db)
    ).code() == grpc.StatusCode.UNAUTHENTICATED


# -- refusing tokens --------------------------------------------------------------------------------------------


async def test_no_token_is_refused(mesh: Mesh, ca: Ca) -> None:
    error = await refused(ca, None, mesh.identity("web"))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_forged_token_is_refused(mesh: Mesh, ca: Ca) -> None:
    sa = await mesh.kube.get(kinds.SERVICE_ACCOUNTS, "web", mesh.namespace)
    forger = TokenIssuer(new_ca("forger", now=time.time()).key_pem)
    forged = forger.issue(
        namespace=mesh.namespace,
        service_account="web",
        service_account_uid=sa["metadata"]["uid"],
        audiences=["istio-ca"],
        now=time.time(),
        expiration_seconds=3600,
    ).token
    assert (await refused(ca, forged, mesh.identity("web"))).code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_real_token_with_a_tampered_payload_is_refused(mesh: Mesh, ca: Ca) -> None:
    header, payload, signature = (await mesh.token("web")).split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["sub"] = f"system:serviceaccount:{mesh.namespace}:db"
    claims["kubernetes.io"]["serviceaccount"]["name"] = "db"
    tampered_payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    tampered = f"{header}.{tampered_payload}.{signature}"
    review = await mesh.kube.token_review(tampered, ["istio-ca"])
    assert review["status"]["error"] == "invalid signature"
    assert (await refused(ca, tampered, mesh.identity("db"))).code() == grpc.StatusCode.UNAUTHENTICATED


async def test_an_expired_token_is_refused(server_process: ServerProcess, mesh: Mesh, ca: Ca) -> None:
    sa = await mesh.kube.get(kinds.SERVICE_ACCOUNTS, "web", mesh.namespace)
    # Signed with the API server's own key, so only the expiry is wrong.
    issuer = TokenIssuer((server_process.data_dir / "pki" / "sa.key").read_bytes())
    expired = issuer.issue(
        namespace=mesh.namespace,
        service_account="web",
        service_account_uid=sa["metadata"]["uid"],
        audiences=["istio-ca"],
        now=time.time() - 7200,
        expiration_seconds=600,
    ).token
    review = await mesh.kube.token_review(expired, ["istio-ca"])
    assert "expired" in review["status"]["error"]
    assert (await refused(ca, expired, mesh.identity("web"))).code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_token_for_another_audience_is_refused(mesh: Mesh, ca: Ca) -> None:
    token = await mesh.token("web", audiences=("vault",))
    assert (await refused(ca, token, mesh.identity("web"))).code() == grpc.StatusCode.UNAUTHENTICATED


async def test_the_token_of_a_deleted_pod_is_refused(mesh: Mesh, ca: Ca) -> None:
    token = await mesh.token("web")
    await create_certificate(ca, token, mesh.identity("web"))
    await mesh.kube.delete(kinds.PODS, "web-1", mesh.namespace, grace_period_seconds=0)
    assert (await refused(ca, token, mesh.identity("web"))).code() == grpc.StatusCode.UNAUTHENTICATED


async def test_the_node_proxy_token_of_a_replaced_pod_may_not_impersonate(mesh: Mesh, ca: Ca) -> None:
    web = mesh.identity("web")
    token = await mesh.token("ztunnel")
    name = mesh.pods["ztunnel"]["metadata"]["name"]
    await mesh.kube.delete(kinds.PODS, name, SYSTEM_NAMESPACE, grace_period_seconds=0)
    await mesh.kube.create(kinds.PODS, pod(name, SYSTEM_NAMESPACE, "ztunnel", mesh.node_a))
    assert (await refused(ca, token, web, impersonate=web)).code() == grpc.StatusCode.UNAUTHENTICATED


async def test_the_token_of_a_deleted_then_recreated_service_account_is_refused(mesh: Mesh, ca: Ca) -> None:
    token = await mesh.token(None, sa="web")
    await create_certificate(ca, token, mesh.identity("web"))
    await mesh.kube.delete(kinds.SERVICE_ACCOUNTS, "web", mesh.namespace)
    await mesh.kube.create(kinds.SERVICE_ACCOUNTS, {"metadata": {"name": "web", "namespace": mesh.namespace}})
    assert (await refused(ca, token, mesh.identity("web"))).code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_token_claiming_another_cluster_is_refused(mesh: Mesh, ca: Ca) -> None:
    token = await mesh.token("web")
    metadata = (("authorization", f"Bearer {token}"), ("clusterid", "remote"))
    error = await refused(ca, token, mesh.identity("web"), metadata=metadata)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED


# -- the CSR and the TTL ----------------------------------------------------------------------------------------


async def test_a_csr_naming_another_identity_than_the_callers_is_refused(mesh: Mesh, ca: Ca) -> None:
    error = await refused(ca, await mesh.token("web"), mesh.identity("db"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_csr_naming_another_identity_than_the_impersonated_one_is_refused(mesh: Mesh, ca: Ca) -> None:
    ztunnel = mesh.identity("ztunnel", SYSTEM_NAMESPACE)
    error = await refused(ca, await mesh.token("ztunnel"), ztunnel, impersonate=mesh.identity("web"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_malformed_csr_is_an_invalid_argument(mesh: Mesh, ca: Ca) -> None:
    token = await mesh.token("web")
    request = ca_pb2.IstioCertificateRequest(csr="-----BEGIN CERTIFICATE REQUEST-----\nnope\n")
    async with grpc.aio.secure_channel(ca.address, grpc.ssl_channel_credentials(ca.root.root_pem)) as channel:
        call = channel.unary_unary(
            METHOD_PATH,
            request_serializer=ca_pb2.IstioCertificateRequest.SerializeToString,
            response_deserializer=ca_pb2.IstioCertificateResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(request, metadata=(("authorization", f"Bearer {token}"),), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def raw_call(ca: Ca, token: str, csr: str) -> grpc.aio.AioRpcError:
    request = ca_pb2.IstioCertificateRequest(csr=csr)
    async with grpc.aio.secure_channel(ca.address, grpc.ssl_channel_credentials(ca.root.root_pem)) as channel:
        call = channel.unary_unary(
            METHOD_PATH,
            request_serializer=ca_pb2.IstioCertificateRequest.SerializeToString,
            response_deserializer=ca_pb2.IstioCertificateResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(request, metadata=(("authorization", f"Bearer {token}"),), timeout=10)
    return info.value


async def test_a_csr_above_64_kib_is_an_invalid_argument_and_a_huge_message_is_not_read(mesh: Mesh, ca: Ca) -> None:
    token = await mesh.token("web")
    csr, _key = make_csr(mesh.identity("web"))
    padded = csr.decode() + " " * (64 * 1024)
    error = await raw_call(ca, token, padded)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "the limit is 65536" in (error.details() or "")
    huge = await raw_call(ca, token, "A" * 3_900_000)
    assert huge.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # gRPC's receive limit: never handed to us
    assert leaf_identity(await create_certificate(ca, token, mesh.identity("web"))) == mesh.identity("web")


@pytest.mark.parametrize(
    ("requested", "granted"),
    [(0, DAY), (-5, DAY), (3600, 3600), (365 * DAY, 90 * DAY)],
    ids=["default", "negative", "asked", "capped"],
)
async def test_the_ttl_is_the_requested_one_defaulting_to_a_day_and_capped_at_90_days(
    mesh: Mesh, ca: Ca, requested: int, granted: int
) -> None:
    chain = await create_certificate(ca, await mesh.token("web"), mesh.identity("web"), ttl=requested)
    skew = datetime.timedelta(minutes=5)  # notBefore is back-dated for clock skew
    assert abs(lifetime(chain) - skew - datetime.timedelta(seconds=granted)) <= datetime.timedelta(seconds=2)


# -- the node proxy's client ------------------------------------------------------------------------------------


async def test_the_istiod_client_fetches_impersonated_and_own_certificates(mesh: Mesh, ca: Ca, tmp_path: Path) -> None:
    token_file = tmp_path / "istio-token"
    token_file.write_text(await mesh.token("ztunnel"))
    web = mesh.identity("web")
    async with IstiodCaClient(ca.address, ca.root_file, token_file, ttl_seconds=7200) as client:
        cert = await client.fetch_certificate(web)
        assert cert.identity == web
        assert x509.load_pem_x509_certificate(cert.roots_pem) == x509.load_pem_x509_certificate(ca.root.root_pem)
        assert cert.not_after - cert.not_before == pytest.approx(7200 + 300, abs=2)
        with pytest.raises(CaError, match="UNAUTHENTICATED"):
            await client.fetch_certificate(mesh.identity("db"))
        token_file.write_text(await mesh.token("web"))  # read again on each call
    async with IstiodCaClient(ca.address, ca.root_file, token_file, impersonate=False) as client:
        assert (await client.fetch_certificate(web)).identity == web
        with pytest.raises(CaError, match="INVALID_ARGUMENT"):
            await client.fetch_certificate(mesh.identity("db"))


async def test_the_istiod_client_refuses_a_server_outside_its_root(mesh: Mesh, ca: Ca, tmp_path: Path) -> None:
    other_root = tmp_path / "other-root.pem"
    other_root.write_bytes(new_ca("another mesh", now=time.time()).cert_pem)
    token_file = tmp_path / "istio-token"
    token_file.write_text(await mesh.token("ztunnel"))
    async with IstiodCaClient(ca.address, other_root, token_file, timeout=3) as client:
        with pytest.raises(CaError, match="UNAVAILABLE"):
            await client.fetch_certificate(mesh.identity("web"))


async def test_the_istiod_client_drops_a_silent_ca_connection_within_its_keepalive_bound_and_reconnects(
    mesh: Mesh, ca: Ca, tmp_path: Path
) -> None:
    """Keepalive scaled down (ping after 2 s idle, 1 s for the ACK): a CA connection that went silent between two
    certificate requests is dropped within 3 s, so the next request dials afresh instead of waiting on it."""
    settings = KeepaliveSettings(time=2.0, timeout=1.0)
    token_file = tmp_path / "istio-token"
    token_file.write_text(await mesh.token("ztunnel"))
    relay = Relay(ca.port)
    await relay.start()
    try:
        async with IstiodCaClient(f"127.0.0.1:{relay.port}", ca.root_file, token_file, keepalive=settings) as client:
            assert (await client.fetch_certificate(mesh.identity("web"))).identity == mesh.identity("web")
            assert relay.connections == 1
            relay.freeze()
            frozen_at = time.monotonic()
            await eventually(lambda: 1 in relay.closed_by_client)
            assert time.monotonic() - frozen_at <= settings.detection_bound + 1.0
            assert (await client.fetch_certificate(mesh.identity("web"))).identity == mesh.identity("web")
            assert relay.connections == 2
    finally:
        await relay.aclose()


async def test_the_istiod_client_reports_a_missing_token_file(ca: Ca, mesh: Mesh, tmp_path: Path) -> None:
    async with IstiodCaClient(ca.address, ca.root_file, tmp_path / "absent") as client:
        with pytest.raises(CaError, match="token file"):
            await client.fetch_certificate(mesh.identity("web"))


# -- the root ---------------------------------------------------------------------------------------------------


async def test_the_root_configmap_appears_in_new_namespaces_and_is_restored(kube: KubeClient, mesh: Mesh) -> None:
    root = await load_or_create_root_secret(kube)
    pem = root.root_pem.decode()

    async def published(namespace: str) -> bool:
        maps, _ = await kube.list(kinds.CONFIG_MAPS, namespace, field_selector={"metadata.name": ROOT_CONFIG_MAP})
        return bool(maps) and maps[0]["data"].get(ROOT_CERT_KEY) == pem

    async with RootCertPublisher(kube, root.root_pem, retry_delay=0.1):
        await eventually(lambda: published(mesh.namespace))
        await eventually(lambda: published(SYSTEM_NAMESPACE))
        fresh = f"fresh-{mesh.run}"
        await kube.create(kinds.NAMESPACES, {"metadata": {"name": fresh}})
        await eventually(lambda: published(fresh))
        await kube.delete(kinds.CONFIG_MAPS, ROOT_CONFIG_MAP, fresh)
        await eventually(lambda: published(fresh))
        await kube.patch(kinds.CONFIG_MAPS, ROOT_CONFIG_MAP, {"data": {ROOT_CERT_KEY: "tampered"}}, fresh)
        await eventually(lambda: published(fresh))


def intermediate_of(root: KeyPair) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "plug-in intermediate")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(root.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(root.private_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), key_pem)


@pytest.mark.parametrize("root_in_chain_file", [True, False], ids=["chain-file", "separate-root-file"])
def test_a_plugged_in_intermediate_signs_with_the_root_last(tmp_path: Path, root_in_chain_file: bool) -> None:
    root = new_ca("plug-in root", now=time.time())
    intermediate = intermediate_of(root)
    (tmp_path / "ca-cert.pem").write_bytes(intermediate.cert_pem + (root.cert_pem if root_in_chain_file else b""))
    (tmp_path / "ca-key.pem").write_bytes(intermediate.key_pem)
    (tmp_path / "root-cert.pem").write_bytes(root.cert_pem)
    plugged = load_plugin_ca(
        tmp_path / "ca-cert.pem",
        tmp_path / "ca-key.pem",
        None if root_in_chain_file else tmp_path / "root-cert.pem",
    )
    assert x509.load_pem_x509_certificate(plugged.root_pem) == root.certificate
    web = SpiffeId(TD, "shop", "web")
    csr, _ = make_csr(web)
    chain = flatten_chain(RootSigner(plugged).sign(csr, web, 3600))
    assert [x509.load_pem_x509_certificate(pem.encode()) for pem in chain[1:]] == [
        intermediate.certificate,
        root.certificate,
    ]
    assert leaf_identity(chain) == web


def test_a_plugged_in_certificate_that_is_not_a_ca_is_refused(tmp_path: Path) -> None:
    root = new_ca("plug-in root", now=time.time())
    server = issue_server_cert(root, common_name="x", dns_names=["x"], ip_addresses=[], now=time.time())
    (tmp_path / "ca-cert.pem").write_bytes(server.cert_pem)
    (tmp_path / "ca-key.pem").write_bytes(server.key_pem)
    with pytest.raises(RootCaError, match="not a CA"):
        load_plugin_ca(tmp_path / "ca-cert.pem", tmp_path / "ca-key.pem")
    with pytest.raises(RootCaError, match="cannot read"):
        load_plugin_ca(tmp_path / "absent.pem", tmp_path / "ca-key.pem")


async def test_the_root_secret_is_reused_after_a_restart(server_process: ServerProcess, kube: KubeClient) -> None:
    first = await load_or_create_root_secret(kube)
    assert (await load_or_create_root_secret(kube)) == first
    server_process.stop()
    server_process.start()
    async with KubeClient.from_kubeconfig(server_process.kubeconfig) as again:
        assert (await load_or_create_root_secret(again)) == first
