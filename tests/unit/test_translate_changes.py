"""Translation by changes (issue 22, :mod:`ambit.controlplane.translate.pod_workloads` and
:mod:`ambit.controlplane.translate.stage_memo`): told which objects changed, :func:`translate_all` looks at the
changed pods only while their context holds and takes every stage whose kinds did not change from the previous
call, and its output is always exactly what a translation from scratch gives; a changed context (a Service, a
policy, a namespace's labels, the discovery filter) falls back to translating every pod, and a changed Service,
route, waypoint, policy or namespace makes its stages again.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.addresses import (
    AddressCache,
    AuthorizationCache,
    address_changes,
    addresses,
    authorization_changes,
    authorizations,
)
from ambit.controlplane.translate import Changes, Translation, TranslationMemo, translate_all
from ambit.controlplane.translate.index import SERVICE_NAME_LABEL
from ambit.model.localconfig import LocalConfig
from ambit.xds.table import AddressTable, AuthorizationTable

NAMESPACES = ("ns-a", "ns-b")
APPS = ("a", "b", "c")
ROOT_CERT = "istio-ca-root-cert"
MESH_SELECTING = "discoverySelectors:\n- matchLabels: {seen: 'yes'}\n"
ISTIO_GATEWAYS = "gateways.networking.istio.io"
WAYPOINT_LABEL = "istio.io/use-waypoint"
CONTROLLER = "istio.io/mesh-controller"
INPUTS = {
    "authorization_policies": "authorizationpolicies",
    "peer_authentications": "peerauthentications",
    "config_maps": "configmaps",
    "gateways": "gateways",
    "gateway_classes": "gatewayclasses",
    "http_routes": "httproutes",
    "service_entries": "serviceentries",
    "destination_rules": "destinationrules",
    "istio_gateways": ISTIO_GATEWAYS,
    "backend_tls_policies": "backendtlspolicies",
}
"""translate_all's keyword arguments beyond the four first, and the kinds (informer plurals) they hold."""


class Cluster:
    """Objects by kind and key, as informer caches hold them, with the changes since the last translation."""

    def __init__(self) -> None:
        self.version = 1
        self.objects: dict[str, dict[str, dict[str, Any]]] = {
            kind: {} for kind in (*INPUTS.values(), "pods", "services", "endpointslices", "namespaces")
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
            **{argument: list(o[kind].values()) for argument, kind in INPUTS.items()},
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


def _policy(ns: str, app: str, principal: str = "p") -> dict[str, Any]:
    return {
        "metadata": {"name": f"allow-{app}", "namespace": ns},
        "spec": {
            "selector": {"matchLabels": {"app": app}},
            "rules": [{"from": [{"source": {"principals": [principal]}}]}],
        },
    }


def _waypoint_policy(ns: str, i: int) -> dict[str, Any]:
    ref = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "waypoint"}
    rules = [{"to": [{"operation": {"methods": ["GET"] if i % 2 else ["POST"]}}]}]
    return {"metadata": {"name": "at-waypoint", "namespace": ns}, "spec": {"targetRefs": [ref], "rules": rules}}


def _waypoint(ns: str, *, ready: bool = True) -> dict[str, Any]:
    gateway: dict[str, Any] = {
        "metadata": {"name": "waypoint", "namespace": ns},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
    }
    if ready:
        gateway["status"] = {"addresses": [{"type": "Hostname", "value": f"waypoint.{ns}.svc.cluster.local"}]}
    return gateway


def _route(ns: str, i: int) -> dict[str, Any]:
    parent = {"group": "", "kind": "Service", "name": "svc-a", "port": 80}
    backends = [{"name": "svc-b", "port": 80, "weight": 1 + i}, {"name": "svc-a", "port": 80, "weight": 1}]
    return {
        "metadata": {"name": "split", "namespace": ns},
        "spec": {"parentRefs": [parent], "rules": [{"backendRefs": backends[: 1 + i % 2]}]},
    }


def _peer_authentication(ns: str, mode: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"mtls": {"mode": mode}}
    if mode == "PERMISSIVE":
        spec = {
            "selector": {"matchLabels": {"app": "b"}},
            "mtls": {"mode": "UNSET"},
            "portLevelMtls": {"8080": {"mode": "STRICT"}},
        }
    return {"metadata": {"name": "mtls", "namespace": ns}, "spec": spec}


def _service_entry(ns: str, i: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "hosts": [f"external-{i % 3}.example.com"],
        "addresses": [f"240.240.{NAMESPACES.index(ns)}.{i + 1}"],
        "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
        "resolution": "STATIC",
        "endpoints": [{"address": f"10.8.{NAMESPACES.index(ns)}.{i + 1}", "labels": {"app": "outside"}}],
    }
    if i % 2:
        spec["workloadSelector"] = {"labels": {"app": APPS[i % len(APPS)]}}
        del spec["endpoints"]
    return {"metadata": {"name": "external", "namespace": ns}, "spec": spec}


def _destination_rule(ns: str, i: int) -> dict[str, Any]:
    subsets = [{"name": "v1", "labels": {"version": "v1"}}, {"name": f"v{i}", "labels": {"version": f"v{i}"}}]
    return {"metadata": {"name": "subsets", "namespace": ns}, "spec": {"host": "svc-a", "subsets": subsets}}


def _backend_tls(ns: str) -> dict[str, Any]:
    validation = {"caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "ca-bundle"}], "hostname": "a.test"}
    spec = {"targetRefs": [{"group": "", "kind": "Service", "name": "svc-a"}], "validation": validation}
    return {"metadata": {"name": "tls", "namespace": ns}, "spec": spec}


def _istio_gateway(ns: str, i: int) -> dict[str, Any]:
    servers = [{"port": {"number": 80 + i, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]
    return {
        "metadata": {"name": "ingress", "namespace": ns},
        "spec": {"selector": {"istio": "ingress"}, "servers": servers},
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
        cluster.put("peerauthentications", _peer_authentication(ns, "STRICT"))
        cluster.put("serviceentries", _service_entry(ns, 0))
        for i in range(4):
            cluster.put("pods", _pod(ns, i, app=APPS[i % len(APPS)]))
    cluster.put("gatewayclasses", {"metadata": {"name": "istio-waypoint"}, "spec": {"controllerName": CONTROLLER}})
    cluster.put("gateways", _waypoint("ns-a"))
    cluster.put("namespaces", _namespace("ns-a", seen="yes", **{WAYPOINT_LABEL: "waypoint"}))
    cluster.put("httproutes", _route("ns-a", 0))
    cluster.put("authorizationpolicies", _waypoint_policy("ns-a", 0))
    cluster.put("destinationrules", _destination_rule("ns-a", 2))
    cluster.put(ISTIO_GATEWAYS, _istio_gateway("ns-b", 0))
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
            "route",
            "waypoint",
            "waypoint-policy",
            "peer",
            "entry",
            "rule",
            "istio-gateway",
            "gateway-pod",
            "configmap",
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
            cluster.put("authorizationpolicies", _policy(ns, APPS[i % len(APPS)], principal=f"p{i}"))
        else:
            cluster.delete("authorizationpolicies", f"{ns}/allow-a")
    elif change == "namespace":
        labels = {"seen": "yes"} if i % 2 else {"seen": "yes", WAYPOINT_LABEL: "none" if i % 4 else "waypoint"}
        cluster.put("namespaces", _namespace(ns, **labels))
    elif change == "route":
        if i == 6:
            cluster.delete("httproutes", f"{ns}/split")
        else:
            cluster.put("httproutes", _route(ns, i))
    elif change == "waypoint":
        if i == 6:
            cluster.delete("gateways", f"{ns}/waypoint")
        else:
            cluster.put("gateways", _waypoint(ns, ready=bool(i % 3)))
    elif change == "waypoint-policy":
        cluster.put("authorizationpolicies", _waypoint_policy(ns, i))
    elif change == "peer":
        if i == 6:
            cluster.delete("peerauthentications", f"{ns}/mtls")
        else:
            cluster.put("peerauthentications", _peer_authentication(ns, ("STRICT", "PERMISSIVE", "DISABLE")[i % 3]))
    elif change == "entry":
        if i == 6:
            cluster.delete("serviceentries", f"{ns}/external")
        else:
            cluster.put("serviceentries", _service_entry(ns, i))
    elif change == "rule":
        if i == 6:
            cluster.delete("destinationrules", f"{ns}/subsets")
        else:
            cluster.put("destinationrules", _destination_rule(ns, i))
    elif change == "istio-gateway":
        if i == 6:
            cluster.delete(ISTIO_GATEWAYS, f"{ns}/ingress")
        else:
            cluster.put(ISTIO_GATEWAYS, _istio_gateway(ns, i))
    elif change == "gateway-pod":
        gateway_pod = _pod(ns, i, app=app)
        if i % 2:
            gateway_pod["metadata"]["labels"]["istio"] = "ingress"
            gateway_pod["spec"]["serviceAccountName"] = f"ingress-{i}"
        cluster.put("pods", gateway_pod)
    elif change == "configmap":  # stage memo rule 9: the CA's own root ConfigMap, or one a BackendTLSPolicy reads
        if i % 3 == 0:
            root = {"metadata": {"name": ROOT_CERT, "namespace": ns}, "data": {"root-cert.pem": "x"}}
            cluster.put("configmaps", root)
        elif i % 3 == 1:
            bundle = {"metadata": {"name": "ca-bundle", "namespace": ns}, "data": {"ca.crt": f"not a pem {i}"}}
            cluster.put("configmaps", bundle)
        else:
            cluster.put("backendtlspolicies", _backend_tls(ns))
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
        self.policies, self.policy_cache = AuthorizationTable(), AuthorizationCache()
        self.applied: LocalConfig | None = None
        self.patched = 0

    def hand_over(self, translation: Translation) -> frozenset[str]:
        changes, previous, config = translation.workload_changes, self.applied, translation.config
        self.applied = config
        encoded_policies = authorization_changes(previous, config, self.policy_cache)
        if encoded_policies is not None:
            self.policies.replace(encoded_policies)
        if changes is not None and previous is not None and changes.since is previous.workloads:
            self.patched += 1
            return self.table.patch(*address_changes(previous, config, self.cache, changes.uids))
        return self.table.replace(addresses(config, self.cache))


@settings(max_examples=300, deadline=None)
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
        fresh_policies = AuthorizationTable()
        fresh_policies.replace(authorizations(fresh.config))
        assert patched.policies.current == fresh_policies.current, step


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


def test_a_pod_change_takes_every_stage_but_the_pods_from_the_previous_translation() -> None:
    cluster = _start()
    cluster.delete(ISTIO_GATEWAYS, "ns-b/ingress")
    memo = TranslationMemo()
    _translated(cluster, memo)
    before = memo.stages.policies.value, memo.stages.services.value, memo.stages.gateways.value
    cluster.put("pods", _pod("ns-a", 1, app="b", ready=False))
    cluster.put("endpointslices", _slice("ns-b", "svc-a", [0, 3]))
    _translated(cluster, memo)
    stages = memo.stages
    assert (stages.policies.value, stages.services.value, stages.gateways.value) == before
    assert stages.policies.reused and stages.services.reused and stages.gateways.reused
    assert stages.index.reused and stages.slices.reused and stages.entry_workloads.reused


def test_each_changed_kind_makes_its_stages_again_and_keeps_the_others() -> None:
    for step, remade in (
        (("peer", "ns-a", 1), {"policies", "services", "gateways", "entry_workloads", "index", "slices"}),
        (("route", "ns-a", 1), {"services", "gateways", "entry_workloads", "index", "slices"}),
        (("gateway-pod", "ns-b", 1), {"gateways"}),
        (("slice", "ns-a", 1), {"index", "slices"}),
    ):
        cluster = _start()
        memo = TranslationMemo()
        _translated(cluster, memo)
        _apply(cluster, step)
        _translated(cluster, memo)
        stages = memo.stages
        reused = {
            name
            for name in ("policies", "services", "gateways", "index", "slices", "entry_workloads")
            if getattr(stages, name).reused
        }
        assert reused == {"policies", "services", "gateways", "index", "slices", "entry_workloads"} - remade, step


def test_a_call_after_one_that_raised_reuses_nothing() -> None:
    cluster = _start()
    memo = TranslationMemo()
    _translated(cluster, memo)
    memo.complete = False  # as a call that raised half-way leaves it
    cluster.put("pods", _pod("ns-a", 1, app="b", ready=False))
    _translated(cluster, memo)
    assert not memo.stages.services.reused and not memo.stages.policies.reused
    assert memo.pods.changed_uids is None


def test_a_pod_change_hands_over_that_pod_only_and_no_service_or_policy() -> None:
    cluster = _start()
    memo, encoder = TranslationMemo(), Encoder()
    encoder.hand_over(translate_all(**cluster.inputs(), translation_memo=memo, changed=cluster.take()))
    previous = encoder.applied
    assert previous is not None
    cluster.put("pods", _pod("ns-a", 1, app="a", ready=False))
    translation = translate_all(**cluster.inputs(), translation_memo=memo, changed=cluster.take())
    assert translation.workload_changes is not None
    config = translation.config
    assert config.services is previous.services and config.policies is previous.policies
    upserts, removed = address_changes(previous, config, AddressCache(encoder.cache), translation.workload_changes.uids)
    assert set(upserts) == {"Kubernetes//Pod/ns-a/pod-1"} and not removed
    assert authorization_changes(previous, config, AuthorizationCache()) is None
    assert encoder.hand_over(translation) == {"Kubernetes//Pod/ns-a/pod-1"}


def test_a_configmap_no_stage_read_is_no_change_and_the_mesh_config_is() -> None:
    cluster = _start()
    memo = TranslationMemo()
    _translated(cluster, memo)
    for ns in NAMESPACES:  # the control plane's own publication in every namespace (stage memo rule 9)
        cluster.put("configmaps", {"metadata": {"name": ROOT_CERT, "namespace": ns}, "data": {"root-cert.pem": "x"}})
    _translated(cluster, memo)
    stages = memo.stages
    assert stages.policies.reused and stages.services.reused and stages.gateways.reused and stages.index.reused
    cluster.put("configmaps", {"metadata": {"name": "istio", "namespace": "istio-system"}, "data": {"mesh": ""}})
    _translated(cluster, memo)
    assert not memo.stages.services.reused and not memo.stages.policies.reused


def test_a_configmap_a_stage_looked_up_is_a_change_found_or_not() -> None:
    cluster = _start()
    cluster.put("backendtlspolicies", _backend_tls("ns-a"))
    memo = TranslationMemo()
    _translated(cluster, memo)
    assert memo.stages.services.value is not None and memo.stages.services.value.config_maps is not None
    assert memo.stages.services.value.config_maps.was_read("ns-a/ca-bundle")  # looked up while absent
    cluster.put("configmaps", {"metadata": {"name": "ca-bundle", "namespace": "ns-a"}, "data": {"ca.crt": "x"}})
    _translated(cluster, memo)
    assert not memo.stages.services.reused
