"""Translation by changes (issue 22, :mod:`ambit.controlplane.translate.pod_workloads`): told which objects changed,
:func:`translate_all` looks at the changed pods only while their context holds, and its output is always exactly
what a translation from scratch gives; a changed context (a Service, a policy, a namespace's labels, the discovery
filter) falls back to translating every pod.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.addresses import AddressCache, address_changes, addresses
from ambit.controlplane.translate import Changes, Translation, TranslationMemo, translate_all
from ambit.controlplane.translate.index import SERVICE_NAME_LABEL
from ambit.model.localconfig import LocalConfig
from ambit.xds.table import AddressTable

NAMESPACES = ("ns-a", "ns-b")
APPS = ("a", "b", "c")
MESH_SELECTING = "discoverySelectors:\n- matchLabels: {seen: 'yes'}\n"


class Cluster:
    """Objects by kind and key, as informer caches hold them, with the changes since the last translation."""

    def __init__(self) -> None:
        self.version = 1
        self.objects: dict[str, dict[str, dict[str, Any]]] = {
            kind: {}
            for kind in ("pods", "services", "endpointslices", "namespaces", "authorizationpolicies", "configmaps")
        }
        self.changed: dict[tuple[str, str], dict[str, Any] | None] = {}

    def put(self, kind: str, obj: dict[str, Any]) -> None:
        self.version += 1
        meta = obj["metadata"]
        meta.setdefault("uid", f"{kind}-{meta.get('namespace', '')}-{meta['name']}")
        meta["resourceVersion"] = str(self.version)
        key = f"{meta.get('namespace', '')}/{meta['name']}"
        self.objects[kind][key] = obj
        self.changed[(kind, key)] = obj

    def delete(self, kind: str, key: str) -> None:
        if self.objects[kind].pop(key, None) is not None:
            self.changed[(kind, key)] = None

    def take(self) -> Changes:
        taken, self.changed = self.changed, {}
        return taken

    def inputs(self) -> dict[str, Any]:
        o = self.objects
        return {
            "pods": list(o["pods"].values()),
            "services": list(o["services"].values()),
            "endpoint_slices": list(o["endpointslices"].values()),
            "namespaces": list(o["namespaces"].values()),
            "authorization_policies": list(o["authorizationpolicies"].values()),
            "config_maps": list(o["configmaps"].values()),
        }


def _pod(ns: str, i: int, *, app: str, version: str = "v1", ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": f"pod-{i}", "namespace": ns, "labels": {"app": app, "version": version}},
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}],
        },
        "status": {
            "phase": "Running",
            "podIP": f"198.18.{NAMESPACES.index(ns)}.{i + 1}",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def _service(ns: str, name: str, app: str | None, target: int | str = 8080) -> dict[str, Any]:
    spec: dict[str, Any] = {"clusterIP": f"198.19.{NAMESPACES.index(ns)}.{ord(name[-1])}"}
    spec["ports"] = [{"name": "http", "port": 80, "targetPort": target}]
    if app is not None:
        spec["selector"] = {"app": app}
    return {"metadata": {"name": name, "namespace": ns}, "spec": spec}


def _slice(ns: str, service: str, pods: list[int], extra_ip: str | None = None) -> dict[str, Any]:
    endpoints: list[dict[str, Any]] = [
        {
            "addresses": [f"198.18.{NAMESPACES.index(ns)}.{i + 1}"],
            "targetRef": {"kind": "Pod", "name": f"pod-{i}", "namespace": ns},
        }
        for i in pods
    ]
    if extra_ip is not None:
        endpoints.append({"addresses": [extra_ip], "conditions": {"ready": True}})
    return {
        "metadata": {"name": f"{service}-x", "namespace": ns, "labels": {SERVICE_NAME_LABEL: service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints,
    }


def _policy(ns: str, app: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"allow-{app}", "namespace": ns},
        "spec": {"selector": {"matchLabels": {"app": app}}, "rules": [{"from": [{"source": {"principals": ["p"]}}]}]},
    }


def _namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, **labels}}}


def _start() -> Cluster:
    cluster = Cluster()
    for ns in NAMESPACES:
        cluster.put("namespaces", _namespace(ns, seen="yes"))
        cluster.put("services", _service(ns, "svc-a", "a"))
        cluster.put("services", _service(ns, "svc-b", "b", target="http"))
        cluster.put("services", _service(ns, "manual", None))
        cluster.put("endpointslices", _slice(ns, "manual", [0], extra_ip="10.9.9.9"))
        cluster.put("authorizationpolicies", _policy(ns, "a"))
        for i in range(4):
            cluster.put("pods", _pod(ns, i, app=APPS[i % len(APPS)]))
    return cluster


STEP = st.tuples(
    st.sampled_from(
        [
            "add",
            "delete",
            "relabel",
            "version",
            "ready",
            "unready",
            "service",
            "slice",
            "policy",
            "namespace",
            "discovery",
            "several",
        ]
    ),
    st.sampled_from(NAMESPACES),
    st.integers(min_value=0, max_value=6),
)


def _apply(cluster: Cluster, step: tuple[str, str, int]) -> None:
    change, ns, i = step
    pods = cluster.objects["pods"]
    old = pods.get(f"{ns}/pod-{i}")
    app = old["metadata"]["labels"]["app"] if old else APPS[i % len(APPS)]
    if change in ("add", "ready"):
        cluster.put("pods", _pod(ns, i, app=app))
    elif change == "delete":
        cluster.delete("pods", f"{ns}/pod-{i}")
    elif change == "relabel":
        cluster.put("pods", _pod(ns, i, app=APPS[(APPS.index(app) + 1) % len(APPS)]))
    elif change == "version":
        cluster.put("pods", _pod(ns, i, app=app, version=f"v{i}"))
    elif change == "unready":
        cluster.put("pods", _pod(ns, i, app=app, ready=False))
    elif change == "service":
        cluster.put("services", _service(ns, "svc-a", APPS[i % len(APPS)]))
    elif change == "slice":
        cluster.put("endpointslices", _slice(ns, "manual", list(range(i % 4)), extra_ip=f"10.9.9.{i}"))
    elif change == "policy":
        if i % 2:
            cluster.put("authorizationpolicies", _policy(ns, APPS[i % len(APPS)]))
        else:
            cluster.delete("authorizationpolicies", f"{ns}/allow-a")
    elif change == "namespace":
        labels = {"seen": "yes"} if i % 2 else {"seen": "yes", "istio.io/use-waypoint": "none"}
        cluster.put("namespaces", _namespace(ns, **labels))
    elif change == "discovery":
        if i % 2:
            cluster.put("namespaces", _namespace(ns, seen="no" if i % 3 else "yes"))
        else:
            meta = {"name": "istio", "namespace": "istio-system"}
            cluster.put("configmaps", {"metadata": meta, "data": {"mesh": MESH_SELECTING if i % 4 else ""}})
    else:
        for j in range(i + 1):
            cluster.put("pods", _pod(ns, j, app=APPS[(i + j) % len(APPS)], ready=bool(j % 2)))


class Encoder:
    """The control plane's hand-over: the address table patched by the translation's workload changes when they
    are relative to the config it holds, else replaced whole."""

    def __init__(self) -> None:
        self.table, self.cache = AddressTable(), AddressCache()
        self.applied: LocalConfig | None = None
        self.patched = 0

    def hand_over(self, translation: Translation) -> frozenset[str]:
        changes, previous, config = translation.workload_changes, self.applied, translation.config
        self.applied = config
        if changes is not None and previous is not None and changes.since is previous.workloads:
            self.patched += 1
            return self.table.patch(*address_changes(previous, config, self.cache, changes.uids))
        return self.table.replace(addresses(config, self.cache))


@settings(max_examples=150, deadline=None)
@given(st.lists(STEP, max_size=15))
def test_translation_by_changes_always_equals_a_translation_from_scratch(steps: list[tuple[str, str, int]]) -> None:
    cluster = _start()
    memo = TranslationMemo()
    patched, replaced = Encoder(), AddressTable()
    first = translate_all(**cluster.inputs(), translation_memo=memo, changed=cluster.take())
    assert first == translate_all(**cluster.inputs())
    assert patched.hand_over(first) == replaced.replace(addresses(first.config))
    for step in steps:
        _apply(cluster, step)
        by_changes = translate_all(**cluster.inputs(), translation_memo=memo, changed=cluster.take())
        fresh = translate_all(**copy.deepcopy(cluster.inputs()))
        assert by_changes == fresh, step
        assert patched.hand_over(by_changes) == replaced.replace(addresses(fresh.config)), step
        assert patched.table.current == replaced.current
        assert set(patched.cache) == set(replaced.current.by_name)


def _translated(cluster: Cluster, memo: TranslationMemo) -> None:
    assert translate_all(**cluster.inputs(), translation_memo=memo, changed=cluster.take()) == translate_all(
        **cluster.inputs()
    )


def test_a_pod_change_looks_at_that_pod_only_and_names_its_workload() -> None:
    cluster = _start()
    memo = TranslationMemo()
    _translated(cluster, memo)
    cluster.put("pods", _pod("ns-a", 1, app="b", ready=False))
    cluster.delete("pods", "ns-b/pod-2")
    _translated(cluster, memo)
    assert memo.hits == len(cluster.objects["pods"]) - 1
    assert memo.pods.changed_uids == {"Kubernetes//Pod/ns-a/pod-1", "Kubernetes//Pod/ns-b/pod-2"}


def test_the_hand_over_patches_the_address_table_with_the_changed_workloads_only() -> None:
    cluster = _start()
    memo, encoder = TranslationMemo(), Encoder()
    encoder.hand_over(translate_all(**cluster.inputs(), translation_memo=memo, changed=cluster.take()))
    cluster.put("pods", _pod("ns-a", 1, app="b", ready=False))
    cluster.put("pods", _pod("ns-b", 9, app="a"))
    cluster.put("pods", _pod("ns-b", 3, app="a"))  # a new resourceVersion, the same workload
    cluster.delete("pods", "ns-b/pod-2")
    translation = translate_all(**cluster.inputs(), translation_memo=memo, changed=cluster.take())
    assert translation.workload_changes is not None
    assert translation.workload_changes.uids == {
        "Kubernetes//Pod/ns-a/pod-1",
        "Kubernetes//Pod/ns-b/pod-9",
        "Kubernetes//Pod/ns-b/pod-2",
    }
    changed = encoder.hand_over(translation)
    assert encoder.patched == 1
    assert changed == {"Kubernetes//Pod/ns-a/pod-1", "Kubernetes//Pod/ns-b/pod-9", "Kubernetes//Pod/ns-b/pod-2"}


def test_a_changed_context_falls_back_to_translating_every_pod() -> None:
    for change in (("service", "ns-a", 1), ("policy", "ns-a", 1), ("namespace", "ns-b", 0), ("discovery", "ns-a", 2)):
        cluster = _start()
        memo = TranslationMemo()
        _translated(cluster, memo)
        _apply(cluster, change)
        _translated(cluster, memo)
        assert memo.pods.changed_uids is None, change
        assert memo.hits == 0 or change[0] == "discovery", change


def test_unknown_changes_translate_every_pod_and_reuse_the_unchanged() -> None:
    cluster = _start()
    memo = TranslationMemo()
    _translated(cluster, memo)
    cluster.put("pods", _pod("ns-a", 1, app="b"))
    cluster.take()
    assert translate_all(**cluster.inputs(), translation_memo=memo) == translate_all(**cluster.inputs())
    assert memo.pods.changed_uids is None
    assert memo.hits == len(cluster.objects["pods"]) - 1
