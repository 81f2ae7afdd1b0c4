"""KubeClient against the real embedded API server: verbs, pagination, watch, errors, tokens, configuration."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import yaml

from ambit.apiserver.server import ApiServer, ApiServerSettings
from ambit.k8s import (
    KubeAlreadyExistsError,
    KubeApiStatusError,
    KubeClient,
    KubeClientError,
    KubeConfigError,
    KubeConflictError,
    KubeForbiddenError,
    KubeGoneError,
    KubeInvalidError,
    KubeNotFoundError,
    KubeUnauthorizedError,
    WatchEvent,
    WatchEventType,
    kinds,
)
from ambit.k8s.connection import TokenFileAuth, load_from_env, load_in_cluster
from ambit.k8s.kinds import ResourceKind

NS = "default"


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ApiServer]:
    """The embedded server without the mesh CRDs, which start three times faster; CRD tests use ``apiserver``."""
    async with ApiServer(ApiServerSettings(data_dir=tmp_path / "api", port=0, crd_dir=None)) as started:
        yield started


@pytest.fixture
async def kube(server: ApiServer) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(server.kubeconfig) as client:
        yield client


@pytest.fixture
async def kube_crd(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as client:
        yield client


def configmap(name: str, namespace: str = NS, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels}, "data": {"k": "v"}}


def authorization_policy(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"action": "DENY", "rules": [{"from": [{"source": {"namespaces": ["evil"]}}]}]},
    }


async def next_events(watch: Any, count: int) -> list[WatchEvent]:
    out: list[WatchEvent] = []
    async with asyncio.timeout(5):
        async for event in watch:
            if event.type is not WatchEventType.BOOKMARK:
                out.append(event)
            if len(out) == count:
                break
    return out


# -- verbs ----------------------------------------------------------------------------------------------------
async def test_configmap_crud_round_trips_plain_dicts(kube: KubeClient) -> None:
    created = await kube.create(kinds.CONFIG_MAPS, configmap("one", app="web"))
    assert type(created) is dict
    assert created["kind"] == "ConfigMap" and created["apiVersion"] == "v1"
    assert created["metadata"]["uid"]

    got = await kube.get(kinds.CONFIG_MAPS, "one", NS)
    assert got["data"] == {"k": "v"}

    got["data"]["k"] = "replaced"
    replaced = await kube.replace(kinds.CONFIG_MAPS, got)
    assert replaced["data"]["k"] == "replaced"
    assert int(replaced["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])

    merged = await kube.patch(kinds.CONFIG_MAPS, "one", {"data": {"extra": "1"}}, NS)
    assert merged["data"] == {"k": "replaced", "extra": "1"}
    json_patched = await kube.patch(
        kinds.CONFIG_MAPS, "one", [{"op": "remove", "path": "/data/extra"}], NS, patch_type="json"
    )
    assert json_patched["data"] == {"k": "replaced"}
    strategic = await kube.patch(
        kinds.CONFIG_MAPS, "one", {"metadata": {"labels": {"tier": "front"}}}, NS, patch_type="strategic"
    )
    assert strategic["metadata"]["labels"] == {"app": "web", "tier": "front"}

    await kube.delete(kinds.CONFIG_MAPS, "one", NS)
    with pytest.raises(KubeNotFoundError) as caught:
        await kube.get(kinds.CONFIG_MAPS, "one", NS)
    assert caught.value.is_not_found and caught.value.reason == "NotFound"


async def test_namespace_defaults_to_the_kubeconfig_context(kube: KubeClient) -> None:
    assert kube.namespace == "default"
    await kube.create(kinds.CONFIG_MAPS, {"metadata": {"name": "implicit"}, "data": {}})
    assert (await kube.get(kinds.CONFIG_MAPS, "implicit"))["metadata"]["namespace"] == "default"
    with pytest.raises(ValueError, match="cluster-scoped"):
        await kube.get(kinds.NAMESPACES, "default", namespace="default")


async def test_custom_resource_crud_on_an_istio_crd(kube_crd: KubeClient) -> None:
    created = await kube_crd.create(kinds.AUTHORIZATION_POLICIES, authorization_policy("deny-evil"))
    assert created["spec"]["action"] == "DENY"

    patched = await kube_crd.patch(kinds.AUTHORIZATION_POLICIES, "deny-evil", {"spec": {"action": "ALLOW"}}, NS)
    assert patched["spec"]["action"] == "ALLOW"
    assert patched["metadata"]["generation"] == 2

    items, version = await kube_crd.list(kinds.AUTHORIZATION_POLICIES, NS)
    assert [i["metadata"]["name"] for i in items] == ["deny-evil"]
    assert items[0]["kind"] == "AuthorizationPolicy" and items[0]["apiVersion"] == "security.istio.io/v1"
    assert int(version) >= int(patched["metadata"]["resourceVersion"])

    await kube_crd.delete(kinds.AUTHORIZATION_POLICIES, "deny-evil", NS)
    assert (await kube_crd.list(kinds.AUTHORIZATION_POLICIES, NS))[0] == []


async def test_status_patch_changes_status_but_not_spec(kube_crd: KubeClient) -> None:
    await kube_crd.create(kinds.AUTHORIZATION_POLICIES, authorization_policy("with-status"))
    status = {"status": {"conditions": [{"type": "Accepted", "status": "True"}]}, "spec": {"action": "AUDIT"}}
    patched = await kube_crd.patch_status(kinds.AUTHORIZATION_POLICIES, "with-status", status, NS)
    assert patched["status"]["conditions"][0]["type"] == "Accepted"
    assert patched["spec"]["action"] == "DENY"  # the status subresource ignores spec
    plain = await kube_crd.patch(kinds.AUTHORIZATION_POLICIES, "with-status", {"status": {"x": 1}}, NS)
    assert "x" not in plain["status"]  # and the main resource ignores status


async def test_list_follows_continue_tokens_and_filters_by_label(kube: KubeClient) -> None:
    await kube.create(kinds.NAMESPACES, {"metadata": {"name": "paged"}})
    for i in range(23):
        await kube.create(kinds.CONFIG_MAPS, configmap(f"cm-{i:02}", "paged", parity=str(i % 2)))
    items, version = await kube.list(kinds.CONFIG_MAPS, "paged", label_selector="parity", limit=5)
    assert [i["metadata"]["name"] for i in items] == [f"cm-{i:02}" for i in range(23)]
    assert version
    odd, _ = await kube.list(kinds.CONFIG_MAPS, "paged", label_selector={"parity": "1"}, limit=4)
    assert len(odd) == 11
    by_name, _ = await kube.list(kinds.CONFIG_MAPS, "paged", field_selector="metadata.name=cm-07")
    assert [i["metadata"]["name"] for i in by_name] == ["cm-07"]
    everywhere, _ = await kube.list(kinds.CONFIG_MAPS)  # all namespaces
    assert {i["metadata"]["namespace"] for i in everywhere} >= {"paged", "default", "kube-system"}


async def test_a_probe_is_one_request_however_many_objects_the_kind_has(
    kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await kube.create(kinds.NAMESPACES, {"metadata": {"name": "probed"}})
    for i in range(12):
        await kube.create(kinds.CONFIG_MAPS, configmap(f"cm-{i:02}", "probed"))
    requests: list[dict[str, str]] = []
    send = kube._request

    async def counted(method: str, path: str, **kwargs: Any) -> Any:
        requests.append(dict(kwargs.get("params") or {}))
        return await send(method, path, **kwargs)

    monkeypatch.setattr(kube, "_request", counted)
    await kube.probe(kinds.CONFIG_MAPS)
    assert requests == [{"limit": "1"}]  # a list with limit=1 would have followed 12+ continue tokens
    with pytest.raises(KubeNotFoundError):
        await kube.probe(kinds.ResourceKind("example.com", "v1", "widgets", "Widget"))


# -- watch ----------------------------------------------------------------------------------------------------
async def test_watch_from_a_version_sees_each_change_once(kube: KubeClient) -> None:
    _, version = await kube.list(kinds.CONFIG_MAPS, NS)
    async with kube.watch(kinds.CONFIG_MAPS, NS, resource_version=version, timeout_seconds=10) as watch:
        await kube.create(kinds.CONFIG_MAPS, configmap("watched"))
        await kube.patch(kinds.CONFIG_MAPS, "watched", {"data": {"k": "2"}}, NS)
        await kube.delete(kinds.CONFIG_MAPS, "watched", NS)
        events = await next_events(watch, 3)
    assert [e.type for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert events[1].object["data"] == {"k": "2"}
    assert all(e.object["kind"] == "ConfigMap" for e in events)
    assert watch.resource_version == events[-1].resource_version


async def test_watch_with_a_label_selector_sees_objects_enter_and_leave(kube: KubeClient) -> None:
    await kube.create(kinds.CONFIG_MAPS, configmap("mover", role="other"))
    _, version = await kube.list(kinds.CONFIG_MAPS, NS)
    async with kube.watch(
        kinds.CONFIG_MAPS, NS, resource_version=version, label_selector={"role": "mesh"}, timeout_seconds=10
    ) as watch:
        await kube.create(kinds.CONFIG_MAPS, configmap("ignored", role="other"))
        await kube.patch(kinds.CONFIG_MAPS, "mover", {"metadata": {"labels": {"role": "mesh"}}}, NS)
        await kube.patch(kinds.CONFIG_MAPS, "mover", {"metadata": {"labels": {"role": "gone"}}}, NS)
        events = await next_events(watch, 2)
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [("ADDED", "mover"), ("DELETED", "mover")]


async def test_watch_without_a_version_starts_with_the_current_objects(kube: KubeClient) -> None:
    await kube.create(kinds.CONFIG_MAPS, configmap("present"))
    async with kube.watch(kinds.CONFIG_MAPS, NS, field_selector="metadata.name=present", timeout_seconds=10) as w:
        events = await next_events(w, 1)
    assert events[0].type == "ADDED" and events[0].object["metadata"]["name"] == "present"


async def test_watch_ends_when_the_server_times_it_out(kube: KubeClient) -> None:
    _, version = await kube.list(kinds.CONFIG_MAPS, NS)
    seen = []
    async with asyncio.timeout(5):
        async for event in kube.watch(kinds.CONFIG_MAPS, NS, resource_version=version, timeout_seconds=1):
            seen.append(event)
    assert [e for e in seen if e.type is not WatchEventType.BOOKMARK] == []


async def test_watch_delivers_bookmarks_that_advance_its_version(tmp_path: Path) -> None:
    settings = ApiServerSettings(data_dir=tmp_path / "api", port=0, crd_dir=None, bookmark_interval=0.1)
    async with ApiServer(settings) as server, KubeClient.from_kubeconfig(server.kubeconfig) as kube:
        _, version = await kube.list(kinds.CONFIG_MAPS, NS)
        await kube.create(kinds.NAMESPACES, {"metadata": {"name": "elsewhere"}})  # moves the global version
        async with kube.watch(kinds.CONFIG_MAPS, NS, resource_version=version, timeout_seconds=5) as watch:
            async with asyncio.timeout(5):
                async for event in watch:
                    if event.type is WatchEventType.BOOKMARK:
                        break
        assert int(event.resource_version) > int(version)
        assert watch.resource_version == event.resource_version


async def test_watch_from_a_compacted_version_raises_gone(server: ApiServer, kube: KubeClient) -> None:
    created = await kube.create(kinds.CONFIG_MAPS, configmap("old"))
    await kube.patch(kinds.CONFIG_MAPS, "old", {"data": {"k": "new"}}, NS)
    assert server.manager is not None
    server.manager.store.compact(0)
    with pytest.raises(KubeGoneError) as caught:
        async with asyncio.timeout(5):
            async for _ in kube.watch(
                kinds.CONFIG_MAPS, NS, resource_version=created["metadata"]["resourceVersion"], timeout_seconds=5
            ):
                pass
    assert caught.value.status_code == 410 and caught.value.is_gone


# -- errors ---------------------------------------------------------------------------------------------------
async def test_api_errors_map_to_their_classes(kube: KubeClient) -> None:
    first = await kube.create(kinds.CONFIG_MAPS, configmap("dup"))
    with pytest.raises(KubeAlreadyExistsError) as exists:
        await kube.create(kinds.CONFIG_MAPS, configmap("dup"))
    assert exists.value.is_already_exists and not exists.value.is_conflict

    await kube.patch(kinds.CONFIG_MAPS, "dup", {"data": {"k": "newer"}}, NS)
    with pytest.raises(KubeConflictError) as conflict:
        await kube.replace(kinds.CONFIG_MAPS, first)  # carries the stale resourceVersion
    assert conflict.value.is_conflict and conflict.value.status_code == 409

    with pytest.raises(KubeInvalidError) as invalid:
        await kube.create(kinds.CONFIG_MAPS, configmap("Not_A_Name"))
    assert invalid.value.is_invalid and invalid.value.causes

    with pytest.raises(KubeNotFoundError):
        await kube.create(kinds.CONFIG_MAPS, configmap("x", namespace="no-such-namespace"))
    with pytest.raises(KubeNotFoundError):
        await kube.list(kinds.ResourceKind("example.com", "v1", "widgets", "Widget"))


async def test_creating_in_a_terminating_namespace_is_forbidden(kube: KubeClient) -> None:
    await kube.create(kinds.NAMESPACES, {"metadata": {"name": "closing"}})
    held = configmap("held", "closing")
    held["metadata"]["finalizers"] = ["example.com/hold"]
    await kube.create(kinds.CONFIG_MAPS, held)
    await kube.delete(kinds.NAMESPACES, "closing")
    with pytest.raises(KubeForbiddenError) as caught:
        await kube.create(kinds.CONFIG_MAPS, configmap("late", "closing"))
    assert caught.value.is_forbidden and isinstance(caught.value, KubeApiStatusError)


async def test_a_wrong_token_is_unauthorized(server: ApiServer, tmp_path: Path) -> None:
    config = yaml.safe_load(server.kubeconfig.read_text())
    config["users"][0]["user"]["token"] = "wrong"
    path = tmp_path / "bad-kubeconfig"
    path.write_text(yaml.safe_dump(config))
    async with KubeClient.from_kubeconfig(path) as client:
        with pytest.raises(KubeUnauthorizedError) as caught:
            await client.get(kinds.NAMESPACES, "default")
    assert caught.value.is_unauthorized


async def test_an_unreachable_server_is_a_transport_error(server: ApiServer) -> None:
    url = server.url
    await server.aclose()
    async with KubeClient.from_kubeconfig(server.kubeconfig) as client:
        with pytest.raises(KubeClientError) as caught:
            await client.get(kinds.NAMESPACES, "default")
        assert not isinstance(caught.value, KubeApiStatusError)
        with pytest.raises(KubeClientError):
            async for _ in client.watch(kinds.PODS):
                pass
    assert url in str(caught.value) or "GET" in str(caught.value)


async def test_http_410_and_statusless_error_bodies_are_mapped() -> None:
    """Responses the embedded server never sends: a watch refused with HTTP 410, a proxy's HTML 502."""

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("watch") == "true":
            status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}
            return httpx.Response(410, json=status)
        return httpx.Response(502, text="<html>bad gateway</html>")

    from ambit.k8s.connection import Connection

    conn = Connection("https://kube.invalid", verify=__import__("ssl").create_default_context(), auth=None)
    async with KubeClient(conn, transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(KubeGoneError):
            async for _ in client.watch(kinds.PODS, resource_version="5"):
                pass
        with pytest.raises(KubeApiStatusError) as caught:
            await client.get(kinds.PODS, "p", "default")
    assert caught.value.status_code == 502 and "bad gateway" in caught.value.message


# -- tokens ---------------------------------------------------------------------------------------------------
async def test_token_request_and_review_round_trip(kube: KubeClient) -> None:
    issued = await kube.create_token(NS, "default", ["ambit-ca"], expiration_seconds=600)
    token = issued["status"]["token"]
    assert issued["status"]["expirationTimestamp"]

    review = await kube.token_review(token, ["ambit-ca"])
    assert review["status"]["authenticated"] is True
    assert review["status"]["user"]["username"] == "system:serviceaccount:default:default"

    wrong = await kube.token_review(token, ["someone-else"])
    assert wrong["status"].get("authenticated") is not True


async def test_a_pod_bound_token_stops_validating_when_the_pod_goes(kube: KubeClient) -> None:
    pod = await kube.create(
        kinds.PODS,
        {"metadata": {"name": "bound", "namespace": NS}, "spec": {"containers": [{"name": "c", "image": "app"}]}},
    )
    issued = await kube.create_token(NS, "default", ["ambit-ca"], 600, bound_pod=pod)
    token = issued["status"]["token"]
    assert (await kube.token_review(token, ["ambit-ca"]))["status"]["authenticated"] is True
    await kube.delete(kinds.PODS, "bound", NS, grace_period_seconds=0)
    assert (await kube.token_review(token, ["ambit-ca"]))["status"].get("authenticated") is not True


# -- configuration --------------------------------------------------------------------------------------------
def write_service_account(directory: Path, server: ApiServer, token: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(token)
    (directory / "ca.crt").write_bytes((server.settings.data_dir / "pki" / "ca.crt").read_bytes())
    (directory / "namespace").write_text("kube-system")


CLUSTER_ROLE_BINDINGS = ResourceKind(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
)


def environ_for(server: ApiServer) -> dict[str, str]:
    host, port = server.url.removeprefix("https://").rsplit(":", 1)
    return {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}


async def test_in_cluster_client_re_reads_a_rotated_token(server: ApiServer, kube: KubeClient, tmp_path: Path) -> None:
    """The pod's token dies with its pod and the file gets a new one: the 401 makes the client re-read it."""
    spec = {"containers": [{"name": "c", "image": "app"}]}
    pod = await kube.create(kinds.PODS, {"metadata": {"name": "agent", "namespace": "kube-system"}, "spec": spec})
    audience = ["https://kubernetes.default.svc.cluster.local"]
    first = (await kube.create_token("kube-system", "default", audience, 600, bound_pod=pod))["status"]["token"]
    binding = {  # a cluster admin lets the account read, as RBAC requires
        "metadata": {"name": "kube-system-default-view"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "kube-system"}],
    }
    await kube.create(CLUSTER_ROLE_BINDINGS, binding)
    sa_dir = tmp_path / "sa"
    write_service_account(sa_dir, server, first)
    async with KubeClient.in_cluster(sa_dir, environ=environ_for(server)) as client:
        assert client.namespace == "kube-system"
        assert (await client.get(kinds.PODS, "agent"))["metadata"]["uid"] == pod["metadata"]["uid"]

        await kube.delete(kinds.PODS, "agent", "kube-system", grace_period_seconds=0)
        fresh = (await kube.create_token("kube-system", "default", audience, 600))["status"]["token"]
        (sa_dir / "token").write_text(fresh + "\n")
        assert (await client.get(kinds.NAMESPACES, "default"))["metadata"]["name"] == "default"
        auth = client.connection.auth
        assert isinstance(auth, TokenFileAuth) and auth.token() == fresh


def test_token_file_is_re_read_once_a_minute(tmp_path: Path) -> None:
    now = [0.0]
    path = tmp_path / "token"
    path.write_text("first")
    auth = TokenFileAuth(path, clock=lambda: now[0])
    assert auth.token() == "first"
    path.write_text("second")
    now[0] = 59.0
    assert auth.token() == "first"
    now[0] = 60.0
    assert auth.token() == "second"
    path.unlink()
    now[0] = 200.0
    assert auth.token() == "second"  # a vanished file keeps the last good token


def test_configuration_comes_from_kubeconfig_then_home_then_in_cluster(server: ApiServer, tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    conn = load_from_env(
        environ={"KUBECONFIG": f"{missing}:{server.kubeconfig}"},
        default_kubeconfig=missing,
        service_account_dir=missing,
    )
    assert conn.server == server.url and "kubeconfig" in conn.source

    sa_dir = tmp_path / "sa"
    write_service_account(sa_dir, server, "t")
    conn = load_from_env(environ=environ_for(server), default_kubeconfig=missing, service_account_dir=sa_dir)
    assert conn.source == "in-cluster" and conn.namespace == "kube-system"

    with pytest.raises(KubeConfigError, match="no Kubernetes configuration"):
        load_from_env(environ={}, default_kubeconfig=missing, service_account_dir=missing)
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST"):
        load_in_cluster(sa_dir, environ={})


async def test_kubeconfig_token_file_and_context_selection(server: ApiServer, tmp_path: Path) -> None:
    config = yaml.safe_load(server.kubeconfig.read_text())
    (tmp_path / "admin.token").write_text(server.admin_token)
    config["users"].append({"name": "file-user", "user": {"tokenFile": "admin.token"}})
    config["contexts"].append({"name": "other", "context": {"cluster": "ambit", "user": "file-user", "namespace": "x"}})
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    async with KubeClient.from_kubeconfig(path, context="other") as client:
        assert client.namespace == "x"
        assert (await client.get(kinds.NAMESPACES, "kube-system"))["metadata"]["name"] == "kube-system"
    with pytest.raises(KubeConfigError, match="nope"):
        KubeClient.from_kubeconfig(path, context="nope")
    (tmp_path / "garbage").write_text("clusters: [")
    with pytest.raises(KubeConfigError):
        KubeClient.from_kubeconfig(tmp_path / "garbage")
