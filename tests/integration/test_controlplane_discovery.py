"""``discoverySelectors`` through the real control plane and API server: the upstream ambient tests' selector written
into the ``istio`` ConfigMap, then a namespace labelled ``istio.io/test-exclude-namespace`` leaves the workload API
(its Service and its pod's workload removed over xDS) and comes back when the label is removed, live, with no
restart; a namespace that stays included is never touched. The control plane's CA follows the same filter, as
istiod's node authorizer does: the node proxy gets no certificate for a pod of the excluded namespace.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import grpc  # type: ignore[import-untyped]
import grpc.aio  # type: ignore[import-untyped]
import pytest
from google.protobuf import struct_pb2
from tests.integration.controlplane_rig import SERVER_NAME, eventually, make_pod

from ambit.api import ca_pb2
from ambit.controlplane.ca.server import METHOD_PATH
from ambit.controlplane.process import ControlPlane
from ambit.controlplane.translate.policies import ZTUNNEL_ACCEPTED
from ambit.k8s import KubeAlreadyExistsError, KubeClient, KubeNotFoundError, kinds
from ambit.model.identity import SpiffeId
from ambit.tls.spiffe import make_csr

EXCLUDE = "istio.io/test-exclude-namespace"
UPSTREAM = f"""discoverySelectors:
- matchExpressions:
  - key: {EXCLUDE}
    operator: DoesNotExist
"""


@pytest.fixture
async def two_namespaces(kube: KubeClient) -> AsyncIterator[tuple[str, str]]:
    """``apps`` and ``external`` (upstream's names, made unique), both ambient, deleted after the test."""
    suffix = secrets.token_hex(3)
    names = (f"apps-{suffix}", f"external-{suffix}")
    for name in names:
        await kube.create(
            kinds.NAMESPACES, {"metadata": {"name": name, "labels": {"istio.io/dataplane-mode": "ambient"}}}
        )
    try:
        yield names
    finally:
        for name in names:
            with contextlib.suppress(KubeNotFoundError):
                await kube.delete(kinds.NAMESPACES, name)


@pytest.fixture
async def mesh(kube: KubeClient) -> AsyncIterator[Any]:
    """Writes the ``istio`` ConfigMap's ``mesh`` (creating it); deleted after the test."""

    async def write(text: str) -> None:
        body = {"metadata": {"name": "istio", "namespace": "istio-system"}, "data": {"mesh": text}}
        try:
            await kube.create(kinds.CONFIG_MAPS, body, "istio-system")
        except KubeAlreadyExistsError:
            await kube.patch(kinds.CONFIG_MAPS, "istio", {"data": {"mesh": text}}, "istio-system")

    try:
        yield write
    finally:
        with contextlib.suppress(KubeNotFoundError):
            await kube.delete(kinds.CONFIG_MAPS, "istio", "istio-system")


def service(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }


def served(plane: ControlPlane, *names: str) -> bool:
    """Whether every one of ``names`` is a resource the control plane serves over xDS now."""
    held = plane.table.current.by_name
    return all(name in held for name in names)


def gone(plane: ControlPlane, *names: str) -> bool:
    held = plane.table.current.by_name
    return not any(name in held for name in names)


async def test_a_namespace_labelled_out_leaves_the_workload_api_and_comes_back_live(
    kube: KubeClient, plane: ControlPlane, two_namespaces: tuple[str, str], mesh: Any
) -> None:
    apps, external = two_namespaces
    await mesh(UPSTREAM)
    await kube.create(kinds.SERVICES, service("server"), apps)
    await kube.create(kinds.SERVICES, service("external"), external)
    await make_pod(kube, apps, "server-0", "198.18.91.10", {"app": "server"})
    await make_pod(kube, external, "external-0", "198.18.91.20", {"app": "external"})
    included = (f"{apps}/server.{apps}.svc.cluster.local", f"Kubernetes//Pod/{apps}/server-0")
    excluded = (f"{external}/external.{external}.svc.cluster.local", f"Kubernetes//Pod/{external}/external-0")
    await eventually(lambda: served(plane, *included, *excluded))

    await kube.patch(kinds.NAMESPACES, external, {"metadata": {"labels": {EXCLUDE: "true"}}})
    await eventually(lambda: gone(plane, *excluded))
    assert served(plane, *included)

    await kube.patch(kinds.NAMESPACES, external, {"metadata": {"labels": {EXCLUDE: None}}})
    await eventually(lambda: served(plane, *excluded))
    assert served(plane, *included)

    # Clearing the selectors in the ConfigMap (live too): a labelled namespace is discovered again.
    await kube.patch(kinds.NAMESPACES, external, {"metadata": {"labels": {EXCLUDE: "true"}}})
    await eventually(lambda: gone(plane, *excluded))
    await mesh("discoverySelectors: []\n")
    await eventually(lambda: served(plane, *included, *excluded))


async def impersonate(plane: ControlPlane, token: str, identity: SpiffeId) -> grpc.StatusCode:
    """The status of a CreateCertificate call to the control plane's CA asking for ``identity`` by impersonation."""
    assert plane.root is not None and plane.server is not None
    csr, _key = make_csr(identity)
    request = ca_pb2.IstioCertificateRequest(csr=csr.decode())
    request.metadata.CopyFrom(
        struct_pb2.Struct(fields={"ImpersonatedIdentity": struct_pb2.Value(string_value=str(identity))})
    )
    credentials = grpc.ssl_channel_credentials(plane.root.root_pem)
    options = [("grpc.ssl_target_name_override", SERVER_NAME)]
    async with grpc.aio.secure_channel(f"127.0.0.1:{plane.server.port}", credentials, options) as channel:
        call = channel.unary_unary(
            METHOD_PATH,
            request_serializer=ca_pb2.IstioCertificateRequest.SerializeToString,
            response_deserializer=ca_pb2.IstioCertificateResponse.FromString,
        )
        metadata = (("authorization", f"Bearer {token}"), ("clusterid", "Kubernetes"))
        try:
            await call(request, metadata=metadata, timeout=10)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def test_the_node_proxy_gets_no_certificate_for_a_pod_of_an_excluded_namespace(
    kube: KubeClient, plane: ControlPlane, two_namespaces: tuple[str, str], mesh: Any
) -> None:
    _apps, external = two_namespaces
    with contextlib.suppress(KubeAlreadyExistsError):
        await kube.create(kinds.NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}})
    ztunnel_pod = {
        "metadata": {"name": f"ztunnel-{external}", "namespace": "istio-system"},
        "spec": {"nodeName": "node-1", "serviceAccountName": "ztunnel", "containers": [{"name": "z", "image": "z"}]},
    }
    created = await kube.create(kinds.PODS, ztunnel_pod)
    try:
        token = (await kube.create_token("istio-system", "ztunnel", ["istio-ca"], bound_pod=created))["status"]["token"]
        await make_pod(kube, external, "external-0", "198.18.91.21", {"app": "external"})
        workload = SpiffeId("cluster.local", external, "default")
        await mesh(UPSTREAM)
        uid = f"Kubernetes//Pod/{external}/external-0"
        await eventually(lambda: served(plane, uid))  # translated with the selectors in force
        assert await eventually(lambda: impersonate_ok(plane, token, workload))  # once the CA's pod index has it

        await kube.patch(kinds.NAMESPACES, external, {"metadata": {"labels": {EXCLUDE: "true"}}})
        await eventually(lambda: gone(plane, uid))
        assert await impersonate(plane, token, workload) is grpc.StatusCode.UNAUTHENTICATED  # as every refusal

        await kube.patch(kinds.NAMESPACES, external, {"metadata": {"labels": {EXCLUDE: None}}})
        assert await eventually(lambda: impersonate_ok(plane, token, workload))
    finally:
        with contextlib.suppress(KubeNotFoundError):
            await kube.delete(kinds.PODS, f"ztunnel-{external}", "istio-system")


async def impersonate_ok(plane: ControlPlane, token: str, identity: SpiffeId) -> bool:
    return await impersonate(plane, token, identity) is grpc.StatusCode.OK


async def conditions(kube: KubeClient, namespace: str, name: str) -> list[dict[str, Any]]:
    policy = await kube.get(kinds.AUTHORIZATION_POLICIES, name, namespace)
    return list((policy.get("status") or {}).get("conditions") or ())


async def test_the_status_of_an_excluded_namespaces_objects_is_left_alone(
    kube: KubeClient, plane: ControlPlane, two_namespaces: tuple[str, str], mesh: Any
) -> None:
    """istiod does not see them, so it neither writes nor removes their conditions; neither do we."""
    _apps, external = two_namespaces
    await mesh(UPSTREAM)
    policy = {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "allow-nothing"},
        "spec": {"selector": {"matchLabels": {"app": "external"}}},
    }
    await kube.create(kinds.AUTHORIZATION_POLICIES, policy, external)
    key = f"{external}/allow-nothing"
    await eventually(lambda: key in plane.authorizations.current.by_name)
    accepted = await eventually(lambda: conditions(kube, external, "allow-nothing"))
    assert [c["type"] for c in accepted] == [ZTUNNEL_ACCEPTED]

    await kube.patch(kinds.NAMESPACES, external, {"metadata": {"labels": {EXCLUDE: "true"}}})
    await eventually(lambda: key not in plane.authorizations.current.by_name)
    await plane.status.write_once()
    assert await conditions(kube, external, "allow-nothing") == accepted
