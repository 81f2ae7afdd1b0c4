"""Claims and volumes under attack: a node's credential reads the claims of its own pods and the volumes bound to
them, and nothing else (kube's Node authorizer graph pod -> claim -> volume); a user's flood of claims is held to
the API server's per-user limits like any other writes; hostile claim and volume bodies get a 422, never a
traceback."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.integration.apiserver_client import ApiClient, JsonObject, assert_status

from ambit.apiserver.limits import LimitSettings
from ambit.apiserver.server import ApiServer, ApiServerSettings

NS = "/api/v1/namespaces/apps"
PVS = "/api/v1/persistentvolumes"


@dataclass
class Cluster:
    admin: ApiClient
    node1: ApiClient
    user: ApiClient


def _claim(name: str, volume: str = "") -> JsonObject:
    spec: JsonObject = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
        "storageClassName": "",
    }
    if volume:
        spec["volumeName"] = volume
    return {"metadata": {"name": name}, "spec": spec}


def _volume(name: str, claim: str) -> JsonObject:
    return {
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": f"/srv/{name}"},
            "storageClassName": "",
            "claimRef": {"namespace": "apps", "name": claim},
        },
    }


def _pod(name: str, node: str, claim: str) -> JsonObject:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "example.com/app:1"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    node_token, user_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    token_file = tmp_path / "tokens.csv"
    token_file.write_text(f'{node_token},system:node:node-1,,"system:nodes"\n{user_token},mallory,,"devs"\n')
    token_file.chmod(0o600)
    settings = ApiServerSettings(
        data_dir=tmp_path / "apiserver",
        port=0,
        token_auth_file=token_file,
        limits=LimitSettings(requests_per_second=5.0, burst=20),
    )
    server = ApiServer(settings)
    await server.start()
    try:
        async with (
            ApiClient.for_server(server) as admin,
            ApiClient.for_server(server, node_token) as node1,
            ApiClient.for_server(server, user_token) as user,
        ):
            assert (await admin.post("/api/v1/namespaces", {"metadata": {"name": "apps"}})).status == 201
            for claim, volume, pod, node in (
                ("mine", "pv-mine", "on-1", "node-1"),
                ("theirs", "pv-theirs", "on-2", "node-2"),
            ):
                assert (await admin.post(f"{NS}/persistentvolumeclaims", _claim(claim, volume))).status == 201
                assert (await admin.post(PVS, _volume(volume, claim))).status == 201
                reply = await admin.post(f"{NS}/pods", _pod(pod, node, claim))
                assert reply.status == 201, reply.body
            assert (await admin.post(f"{NS}/persistentvolumeclaims", _claim("loose"))).status == 201
            binding = {
                "metadata": {"name": "devs-edit", "namespace": "apps"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "devs"}],
            }
            reply = await admin.post("/apis/rbac.authorization.k8s.io/v1/namespaces/apps/rolebindings", binding)
            assert reply.status == 201, reply.body
            yield Cluster(admin, node1, user)
    finally:
        await server.aclose()


async def test_a_node_reads_only_its_own_pods_claims_and_their_volumes(cluster: Cluster) -> None:
    node = cluster.node1
    assert (await node.get(f"{NS}/persistentvolumeclaims/mine")).status == 200
    assert (await node.get(f"{PVS}/pv-mine")).status == 200
    for path in (
        f"{NS}/persistentvolumeclaims/theirs",
        f"{NS}/persistentvolumeclaims/loose",
        f"{NS}/persistentvolumeclaims",
        "/api/v1/persistentvolumeclaims",
        f"{PVS}/pv-theirs",
        PVS,
        "/apis/storage.k8s.io/v1/storageclasses",
    ):
        assert_status(await node.get(path), 403, "Forbidden")
    assert_status(await node.delete(f"{PVS}/pv-mine"), 403, "Forbidden")
    assert_status(
        await node.patch(f"{NS}/persistentvolumeclaims/mine", {"metadata": {"labels": {"x": "y"}}}), 403, "Forbidden"
    )
    assert_status(await node.post(PVS, _volume("pv-new", "mine")), 403, "Forbidden")


async def test_a_users_claim_flood_is_held_to_its_request_budget(cluster: Cluster) -> None:
    assert_status(
        await cluster.user.post(PVS, _volume("pv-user", "flood-0")), 403, "Forbidden"
    )  # volumes are cluster-scoped: not edit's
    replies = await asyncio.gather(
        *(cluster.user.post(f"{NS}/persistentvolumeclaims", _claim(f"flood-{i}")) for i in range(60))
    )
    codes = [r.status for r in replies]
    assert set(codes) <= {201, 429}
    assert 0 < codes.count(201) <= 30 and codes.count(429) >= 30


@pytest.mark.parametrize(
    "body",
    [
        {"metadata": {"name": "x"}, "spec": "a string"},
        {"metadata": {"name": "x"}, "spec": {"accessModes": 5, "resources": {"requests": {"storage": ["1Gi"]}}}},
        {
            "metadata": {"name": "x"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "9" * 70}}},
        },
        {
            "metadata": {"name": "x"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1e999999999"}}},
        },
    ],
)
async def test_hostile_claim_bodies_get_a_422(cluster: Cluster, body: JsonObject) -> None:
    reply = await cluster.admin.post(f"{NS}/persistentvolumeclaims", body)
    assert_status(reply, 422, "Invalid")


async def test_a_volume_whose_host_path_climbs_out_is_refused(cluster: Cluster) -> None:
    body = _volume("pv-climb", "mine")
    body["spec"]["hostPath"]["path"] = "/srv/../../etc"
    status = assert_status(await cluster.admin.post(PVS, body), 422, "Invalid")
    assert "must not contain '..'" in status["message"]
