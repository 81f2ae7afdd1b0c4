"""Object lifecycle over HTTP, as kube-apiserver keeps it: names, versions, generation, status, deletion, GC, CRDs.

Each test drives a real server through its REST API only (no reach into the manager), and checks what a client
sees afterwards: the stored object, a 404, a list.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from apiserver_client import (
    CRDS,
    WIDGETS,
    ApiClient,
    JsonObject,
    assert_status,
    configmap,
    pod,
    widget,
    widget_crd,
)

from ambit.apiserver.server import ApiServer

CMS = "/api/v1/namespaces/default/configmaps"
PODS = "/api/v1/namespaces/default/pods"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"


@pytest.fixture
async def api(apiserver: ApiServer) -> AsyncIterator[ApiClient]:
    async with ApiClient.for_server(apiserver) as client:
        yield client


def deployment(name: str, image: str = "example.com/app:1", **meta: Any) -> JsonObject:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default", **meta},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "app", "image": image}]}},
        },
    }


def owner_ref(owner: JsonObject) -> JsonObject:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
    }


# -- names and versions -----------------------------------------------------------------------------------------


async def test_generate_name_gives_distinct_names_with_the_prefix(api: ApiClient) -> None:
    names = set()
    for _ in range(5):
        created = await api.create(CMS, {"metadata": {"generateName": "web-"}, "data": {}})
        name = created["metadata"]["name"]
        assert name.startswith("web-") and len(name) == len("web-") + 5
        assert created["metadata"]["generateName"] == "web-"
        assert await api.exists(f"{CMS}/{name}")
        names.add(name)
    assert len(names) == 5


async def test_create_sets_uid_creation_timestamp_and_resource_version(api: ApiClient) -> None:
    created = await api.create(CMS, configmap("a", uid="mine", creationTimestamp="2000-01-01T00:00:00Z"))
    meta = created["metadata"]
    assert meta["uid"] != "mine" and len(meta["uid"]) == 36
    assert meta["creationTimestamp"] != "2000-01-01T00:00:00Z" and meta["creationTimestamp"].endswith("Z")
    assert int(meta["resourceVersion"]) > 0
    assert meta["generation"] == 1
    assert await api.must_get(f"{CMS}/a") == created


async def test_resource_version_strictly_increases_across_writes_and_kinds(api: ApiClient) -> None:
    seen = [(await api.create(CMS, configmap("a")))["metadata"]["resourceVersion"]]
    seen.append((await api.create(PODS, pod("p")))["metadata"]["resourceVersion"])
    current = await api.must_get(f"{CMS}/a")
    seen.append((await api.put(f"{CMS}/a", current | {"data": {"k": "2"}})).body["metadata"]["resourceVersion"])
    seen.append((await api.patch(f"{CMS}/a", {"data": {"k": "3"}})).body["metadata"]["resourceVersion"])
    await api.delete(f"{PODS}/p")
    listed = await api.get(CMS)
    seen.append(listed.body["metadata"]["resourceVersion"])
    versions = [int(v) for v in seen]
    assert versions[:4] == sorted(set(versions[:4])), versions
    assert versions[4] > versions[3], "the delete did not advance the list's resourceVersion"


async def test_update_without_resource_version_is_unconditional(api: ApiClient) -> None:
    await api.create(CMS, configmap("a"))
    await api.patch(f"{CMS}/a", {"data": {"key": "changed"}})
    body = configmap("a") | {"data": {"key": "forced"}}
    assert "resourceVersion" not in body["metadata"]
    reply = await api.put(f"{CMS}/a", body)
    assert reply.status == 200, reply.body
    assert (await api.must_get(f"{CMS}/a"))["data"] == {"key": "forced"}


async def test_no_op_update_keeps_the_resource_version(apiserver: ApiServer, api: ApiClient) -> None:
    assert apiserver.manager is not None
    created = await api.create(CMS, configmap("a", labels={"x": "1"}))
    before = apiserver.manager.store.resource_version
    same = await api.put(f"{CMS}/a", created)
    assert same.status == 200 and same.body["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    patched = await api.patch(f"{CMS}/a", {"metadata": {"labels": {"x": "1"}}})
    assert patched.body["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert apiserver.manager.store.resource_version == before


async def test_generation_counts_spec_changes_only(api: ApiClient) -> None:
    created = await api.create(DEPLOYMENTS, deployment("web"))
    assert created["metadata"]["generation"] == 1
    labelled = await api.patch(f"{DEPLOYMENTS}/web", {"metadata": {"labels": {"team": "a"}, "annotations": {"n": "1"}}})
    assert labelled.body["metadata"]["generation"] == 1
    status = await api.patch(f"{DEPLOYMENTS}/web/status", {"status": {"observedGeneration": 1, "replicas": 1}})
    assert status.status == 200 and status.body["metadata"]["generation"] == 1
    scaled = await api.patch(f"{DEPLOYMENTS}/web", {"spec": {"replicas": 3}})
    assert scaled.body["metadata"]["generation"] == 2
    current = scaled.body
    current["spec"]["template"]["spec"]["containers"][0]["image"] = "example.com/app:2"
    replaced = await api.put(f"{DEPLOYMENTS}/web", current)
    assert replaced.body["metadata"]["generation"] == 3
    sent_generation = replaced.body | {"metadata": replaced.body["metadata"] | {"generation": 99}}
    ignored = await api.put(f"{DEPLOYMENTS}/web", sent_generation)
    assert ignored.body["metadata"]["generation"] == 3


async def test_generation_of_a_custom_resource(api: ApiClient) -> None:
    await api.create(CRDS, widget_crd())
    await api.create(WIDGETS, widget("w"))
    assert (await api.patch(f"{WIDGETS}/w", {"metadata": {"labels": {"a": "b"}}})).body["metadata"]["generation"] == 1
    assert (await api.patch(f"{WIDGETS}/w", {"spec": {"size": 2}})).body["metadata"]["generation"] == 2


# -- status subresource -----------------------------------------------------------------------------------------


async def test_status_subresource_changes_only_status_labels_and_annotations(api: ApiClient) -> None:
    created = await api.create(PODS, pod("p"))
    body = created | {
        "metadata": created["metadata"] | {"labels": {"istio.io/dataplane-mode": "ambient"}, "annotations": {"a": "1"}},
        "spec": created["spec"] | {"nodeName": "sneaky"},
        "status": {"phase": "Running", "podIP": "10.0.0.5"},
    }
    reply = await api.put(f"{PODS}/p/status", body)
    assert reply.status == 200, reply.body
    stored = await api.must_get(f"{PODS}/p")
    assert stored["status"] == {"phase": "Running", "podIP": "10.0.0.5"}
    assert stored["metadata"]["labels"] == {"istio.io/dataplane-mode": "ambient"}
    assert stored["metadata"]["annotations"] == {"a": "1"}
    assert "nodeName" not in stored["spec"]
    patched = await api.patch(f"{PODS}/p/status", {"status": {"phase": "Succeeded"}, "spec": {"nodeName": "n"}})
    assert patched.status == 200
    stored = await api.must_get(f"{PODS}/p")
    assert stored["status"]["phase"] == "Succeeded" and "nodeName" not in stored["spec"]


async def test_main_resource_ignores_status_changes(api: ApiClient) -> None:
    created = await api.create(PODS, pod("p") | {"status": {"phase": "Running"}})
    assert created.get("status", {}).get("phase") != "Running"
    await api.patch(f"{PODS}/p/status", {"status": {"phase": "Pending"}})
    current = await api.must_get(f"{PODS}/p")
    replaced = await api.put(f"{PODS}/p", current | {"status": {"phase": "Failed"}})
    assert replaced.status == 200
    assert (await api.must_get(f"{PODS}/p"))["status"]["phase"] == "Pending"
    patched = await api.patch(f"{PODS}/p", {"status": {"phase": "Failed"}, "metadata": {"labels": {"x": "y"}}})
    assert patched.body["status"]["phase"] == "Pending" and patched.body["metadata"]["labels"] == {"x": "y"}


async def test_custom_resource_status_subresource(api: ApiClient) -> None:
    await api.create(CRDS, widget_crd())
    created = await api.create(WIDGETS, widget("w") | {"status": {"ready": True}})
    assert "status" not in created
    reply = await api.patch(f"{WIDGETS}/w/status", {"status": {"ready": True}, "spec": {"size": 9}})
    assert reply.status == 200, reply.body
    stored = await api.must_get(f"{WIDGETS}/w")
    assert stored["status"] == {"ready": True} and stored["spec"] == {"size": 1}


# -- deletion ---------------------------------------------------------------------------------------------------


async def test_finalizers_hold_an_object_until_the_last_one_is_removed(api: ApiClient) -> None:
    await api.create(CMS, configmap("held", finalizers=["example.com/a", "example.com/b"]))
    deleted = await api.delete(f"{CMS}/held")
    assert deleted.status == 200
    held = await api.must_get(f"{CMS}/held")
    assert held["metadata"]["deletionTimestamp"]
    assert held["metadata"]["deletionGracePeriodSeconds"] == 0
    again = await api.delete(f"{CMS}/held")
    assert again.status == 200 and again.body["metadata"]["deletionTimestamp"] == held["metadata"]["deletionTimestamp"]
    added = await api.patch(f"{CMS}/held", {"metadata": {"finalizers": ["example.com/a", "example.com/b", "new/c"]}})
    assert_status(added, 403, "Forbidden", "no new finalizers")
    data = await api.patch(f"{CMS}/held", {"data": {"still": "writable"}})
    assert data.status == 200
    one_left = await api.patch(f"{CMS}/held", {"metadata": {"finalizers": ["example.com/b"]}})
    assert one_left.status == 200 and await api.exists(f"{CMS}/held")
    last = await api.request(
        "PATCH",
        f"{CMS}/held",
        [{"op": "remove", "path": "/metadata/finalizers"}],
        content_type="application/json-patch+json",
    )
    assert last.status == 200, last.body
    assert not await api.exists(f"{CMS}/held")


async def test_pod_bound_to_a_node_is_deleted_gracefully(api: ApiClient) -> None:
    await api.create(PODS, pod("bound", node="node-1"))
    first = await api.delete(f"{PODS}/bound")
    assert first.status == 200
    held = await api.must_get(f"{PODS}/bound")
    assert held["metadata"]["deletionTimestamp"]
    assert held["metadata"]["deletionGracePeriodSeconds"] == 30
    shorter = await api.delete(f"{PODS}/bound", {"gracePeriodSeconds": 5})
    assert shorter.body["metadata"]["deletionGracePeriodSeconds"] == 5
    assert await api.exists(f"{PODS}/bound")
    # What the kubelet does once the containers stopped.
    final = await api.delete(f"{PODS}/bound", gracePeriodSeconds="0")
    assert final.status == 200
    assert not await api.exists(f"{PODS}/bound")


async def test_pod_without_a_node_is_deleted_at_once(api: ApiClient) -> None:
    await api.create(PODS, pod("pending"))
    reply = await api.delete(f"{PODS}/pending")
    assert reply.status == 200 and reply.body["metadata"]["name"] == "pending"
    assert not await api.exists(f"{PODS}/pending")
    assert_status(await api.delete(f"{PODS}/pending"), 404, "NotFound", 'pods "pending" not found')


async def test_namespace_deletion_deletes_its_contents_then_itself(api: ApiClient) -> None:
    await api.create("/api/v1/namespaces", {"metadata": {"name": "team"}})
    cms, pods = "/api/v1/namespaces/team/configmaps", "/api/v1/namespaces/team/pods"
    await api.create(cms, configmap("c", namespace="team"))
    await api.create(pods, pod("loose", namespace="team"))
    await api.create(pods, pod("bound", namespace="team", node="node-1"))
    await api.create(CMS, configmap("elsewhere"))
    reply = await api.delete("/api/v1/namespaces/team")
    assert reply.status == 200
    ns = await api.must_get("/api/v1/namespaces/team")
    assert ns["status"]["phase"] == "Terminating" and ns["metadata"]["deletionTimestamp"]
    assert (await api.get(cms)).body["items"] == []
    assert [p["metadata"]["name"] for p in (await api.get(pods)).body["items"]] == ["bound"]
    refused = await api.post(cms, configmap("late", namespace="team"))
    assert_status(refused, 403, "Forbidden", "being terminated")
    await api.delete(f"{pods}/bound", gracePeriodSeconds="0")
    assert not await api.exists("/api/v1/namespaces/team")
    assert await api.exists(f"{CMS}/elsewhere")
    # The name is free again, and a new namespace starts empty but for what the controllers add.
    await api.create("/api/v1/namespaces", {"metadata": {"name": "team"}})
    assert (await api.get(cms)).names() == ["kube-root-ca.crt"]


async def test_terminating_namespace_waits_for_finalizers_of_its_contents(api: ApiClient) -> None:
    await api.create("/api/v1/namespaces", {"metadata": {"name": "team"}})
    cms = "/api/v1/namespaces/team/configmaps"
    await api.create(cms, configmap("held", namespace="team", finalizers=["example.com/hold"]))
    await api.delete("/api/v1/namespaces/team")
    held = await api.must_get(f"{cms}/held")
    assert held["metadata"]["deletionTimestamp"]
    assert (await api.must_get("/api/v1/namespaces/team"))["status"]["phase"] == "Terminating"
    await api.patch(f"{cms}/held", {"metadata": {"finalizers": None}})
    assert not await api.exists(f"{cms}/held")
    assert not await api.exists("/api/v1/namespaces/team")


async def test_dependents_of_a_pod_in_its_grace_period_wait_for_the_pod(api: ApiClient) -> None:
    owner = await api.create(PODS, pod("owner", node="node-1"))
    await api.create(CMS, configmap("child", ownerReferences=[owner_ref(owner)]))
    await api.delete(f"{PODS}/owner")
    assert await api.exists(f"{CMS}/child")
    await api.delete(f"{PODS}/owner", gracePeriodSeconds="0")
    assert not await api.exists(f"{CMS}/child")


async def test_deleting_an_owner_deletes_its_dependents(api: ApiClient) -> None:
    owner = await api.create(CMS, configmap("owner"))
    other = await api.create(CMS, configmap("other-owner"))
    await api.create(CMS, configmap("child", ownerReferences=[owner_ref(owner)]))
    await api.create(PODS, pod("child-pod", ownerReferences=[owner_ref(owner)]))
    await api.create(CMS, configmap("shared", ownerReferences=[owner_ref(owner), owner_ref(other)]))
    await api.create(CMS, configmap("grandchild", ownerReferences=[owner_ref(await api.must_get(f"{CMS}/child"))]))
    assert (await api.delete(f"{CMS}/owner")).status == 200
    assert not await api.exists(f"{CMS}/child")
    assert not await api.exists(f"{PODS}/child-pod")
    assert not await api.exists(f"{CMS}/grandchild")
    shared = await api.must_get(f"{CMS}/shared")
    assert shared["metadata"]["ownerReferences"] == [owner_ref(other)]


async def test_an_object_created_for_an_owner_already_gone_is_collected(api: ApiClient) -> None:
    """The garbage collector's rule for dangling owners: a controller writing from a stale cache (istiod re-creating
    a waypoint's Deployment as its Gateway is deleted) must not leave an object no one owns any more."""
    owner = await api.create(CMS, configmap("owner"))
    gone = owner_ref(owner)
    assert (await api.delete(f"{CMS}/owner")).status == 200
    created = await api.create(CMS, configmap("late-child", ownerReferences=[gone]))
    assert created["metadata"]["name"] == "late-child"  # the create itself succeeds, as in Kubernetes
    assert not await api.exists(f"{CMS}/late-child")
    await api.create(CMS, configmap("owner"))  # the same name again: another object (another uid)
    await api.create(CMS, configmap("stale-uid", ownerReferences=[gone]))
    assert not await api.exists(f"{CMS}/stale-uid")
    alive = owner_ref(await api.must_get(f"{CMS}/owner"))
    await api.create(CMS, configmap("half", ownerReferences=[gone, alive]))  # one owner left: kept
    unknown = {"apiVersion": "example.com/v1", "kind": "Nothing", "name": "n", "uid": "u-1"}
    await api.create(CMS, configmap("unjudged", ownerReferences=[unknown]))  # a kind not served: kept
    assert await api.exists(f"{CMS}/half") and await api.exists(f"{CMS}/unjudged")


@pytest.mark.parametrize("where", ["query", "body", "orphanDependents"])
async def test_orphan_propagation_keeps_dependents_and_drops_their_owner_references(api: ApiClient, where: str) -> None:
    owner = await api.create(CMS, configmap("owner"))
    await api.create(CMS, configmap("child", ownerReferences=[owner_ref(owner)], labels={"k": "v"}))
    if where == "query":
        reply = await api.delete(f"{CMS}/owner", propagationPolicy="Orphan")
    elif where == "orphanDependents":  # the deprecated spelling kubectl < 1.20 used
        reply = await api.delete(f"{CMS}/owner", orphanDependents="true")
    else:
        reply = await api.delete(
            f"{CMS}/owner", {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Orphan"}
        )
    assert reply.status == 200
    assert not await api.exists(f"{CMS}/owner")
    child = await api.must_get(f"{CMS}/child")
    assert "ownerReferences" not in child["metadata"]
    assert child["metadata"]["labels"] == {"k": "v"}


# -- custom resource definitions --------------------------------------------------------------------------------


async def test_crd_create_serves_its_kind_and_delete_removes_kind_and_objects(api: ApiClient) -> None:
    assert_status(await api.get(WIDGETS), 404, "NotFound")
    crd = await api.create(CRDS, widget_crd())
    assert any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"])
    groups = await api.must_get("/apis")
    assert "example.com" in [g["name"] for g in groups["groups"]]
    resources = await api.must_get("/apis/example.com/v1")
    widgets = next(r for r in resources["resources"] if r["name"] == "widgets")
    assert widgets["kind"] == "Widget" and widgets["namespaced"] is True
    assert "widgets/status" in [r["name"] for r in resources["resources"]]
    await api.create(WIDGETS, widget("a"))
    await api.create(WIDGETS, widget("b"))
    listed = await api.get(WIDGETS)
    assert listed.body["kind"] == "WidgetList" and listed.names() == ["a", "b"]
    assert (await api.get("/apis/example.com/v1/widgets")).names() == ["a", "b"]

    assert (await api.delete(f"{CRDS}/widgets.example.com")).status == 200
    assert not await api.exists(f"{CRDS}/widgets.example.com")
    assert_status(await api.get(WIDGETS), 404, "NotFound")
    assert_status(await api.get("/apis/example.com/v1"), 404, "NotFound")
    assert "example.com" not in [g["name"] for g in (await api.must_get("/apis"))["groups"]]
    # Recreated, the kind starts empty: the old objects went with their definition.
    await api.create(CRDS, widget_crd())
    assert (await api.get(WIDGETS)).names() == []


async def test_cluster_scoped_crd(api: ApiClient) -> None:
    await api.create(CRDS, widget_crd("Cluster"))
    body = widget("global")
    del body["metadata"]["namespace"]
    created = await api.create("/apis/example.com/v1/widgets", body)
    assert "namespace" not in created["metadata"]
    assert_status(await api.get(f"{WIDGETS}/global"), 404)


async def test_invalid_crd_is_422_and_serves_nothing(api: ApiClient) -> None:
    bad = widget_crd()
    bad["metadata"]["name"] = "wrong.example.com"
    status = assert_status(await api.post(CRDS, bad), 422, "Invalid")
    assert "metadata.name" in [c["field"] for c in status["details"]["causes"]]
    assert_status(await api.get(WIDGETS), 404)


# -- lists and collections --------------------------------------------------------------------------------------


async def test_deletecollection_with_a_label_selector(api: ApiClient) -> None:
    for name, app in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        await api.create(CMS, configmap(name, labels={"app": app}))
    reply = await api.delete(CMS, labelSelector="app=a")
    assert reply.status == 200
    assert reply.body["kind"] == "ConfigMapList"
    assert sorted(reply.names()) == ["a1", "a2"]
    assert (await api.get(CMS, labelSelector="app")).names() == ["b1"]
    assert await api.exists(f"{CMS}/kube-root-ca.crt")


async def test_list_pages_with_limit_and_continue(api: ApiClient) -> None:
    names = [f"cm-{i:02d}" for i in range(7)]
    for name in reversed(names):
        await api.create(CMS, configmap(name, labels={"page": "yes"}))
    seen: list[str] = []
    token = ""
    pages = 0
    first_rv = None
    while True:
        params = {"limit": "3", "labelSelector": "page=yes"}
        if token:
            params["continue"] = token
        reply = await api.get(CMS, **params)
        assert reply.status == 200
        first_rv = first_rv or reply.body["metadata"]["resourceVersion"]
        assert reply.body["metadata"]["resourceVersion"] == first_rv
        pages += 1
        seen.extend(reply.names())
        token = reply.body["metadata"].get("continue", "")
        if not token:
            assert "remainingItemCount" not in reply.body["metadata"]
            break
        assert reply.body["metadata"]["remainingItemCount"] == len(names) - len(seen)
    assert seen == names
    assert pages == 3
    everything = await api.get(CMS, limit="0")
    assert "continue" not in everything.body["metadata"]


async def test_list_across_namespaces(api: ApiClient) -> None:
    await api.create("/api/v1/namespaces", {"metadata": {"name": "other"}})
    await api.create(CMS, configmap("here", labels={"t": "1"}))
    await api.create("/api/v1/namespaces/other/configmaps", configmap("there", namespace="other", labels={"t": "1"}))
    listed = await api.get("/api/v1/configmaps", labelSelector="t")
    assert [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in listed.body["items"]] == [
        ("default", "here"),
        ("other", "there"),
    ]
    first = await api.get("/api/v1/configmaps", labelSelector="t", limit="1")
    assert first.names() == ["here"] and first.body["metadata"]["remainingItemCount"] == 1
    second = await api.get(
        "/api/v1/configmaps", labelSelector="t", limit="1", **{"continue": first.body["metadata"]["continue"]}
    )
    assert second.names() == ["there"] and "continue" not in second.body["metadata"]


async def test_field_selectors(api: ApiClient) -> None:
    await api.create(PODS, pod("on-1", node="node-1"))
    await api.create(PODS, pod("on-2", node="node-2"))
    await api.create(PODS, pod("nowhere"))
    await api.patch(f"{PODS}/on-1/status", {"status": {"phase": "Running"}})
    await api.patch(f"{PODS}/on-2/status", {"status": {"phase": "Pending"}})

    async def names(selector: str) -> list[str]:
        reply = await api.get(PODS, fieldSelector=selector)
        assert reply.status == 200, reply.body
        return reply.names()

    assert await names("spec.nodeName=node-1") == ["on-1"]
    assert await names("spec.nodeName==node-2") == ["on-2"]
    assert await names("spec.nodeName=") == ["nowhere"]
    assert await names("spec.nodeName!=node-1") == ["nowhere", "on-2"]
    assert await names("metadata.name=on-2") == ["on-2"]
    assert await names("metadata.namespace=default,metadata.name!=on-2") == ["nowhere", "on-1"]
    assert await names("status.phase=Running") == ["on-1"]
    assert await names("status.phase!=Running,spec.nodeName!=") == ["on-2"]
    assert (await api.get("/api/v1/pods", fieldSelector="spec.nodeName=node-2")).names() == ["on-2"]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", ["web-prod", "web-test"]),
        ("app==web", ["web-prod", "web-test"]),
        ("app!=web", ["db", "plain"]),
        ("env in (prod,staging)", ["db", "web-prod"]),
        ("env notin (prod)", ["db", "plain", "web-test"]),
        ("tier", ["db"]),
        ("!tier", ["plain", "web-prod", "web-test"]),
        ("app=web,env=prod", ["web-prod"]),
        ("app in (web),env!=prod", ["web-test"]),
        ("app,!env", []),
        ("", ["db", "plain", "web-prod", "web-test"]),
    ],
)
async def test_label_selector_operators(api: ApiClient, selector: str, expected: list[str]) -> None:
    objects = {
        "web-prod": {"app": "web", "env": "prod"},
        "web-test": {"app": "web", "env": "test"},
        "db": {"app": "db", "env": "staging", "tier": "data"},
        "plain": {},
    }
    for name, labels in objects.items():
        await api.create(CMS, configmap(name, labels=labels))
    reply = await api.get(CMS, labelSelector=selector)
    assert reply.status == 200, reply.body
    assert [n for n in reply.names() if n != "kube-root-ca.crt"] == expected
