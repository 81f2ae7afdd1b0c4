"""What the control plane's caches keep (ambit.controlplane.cached_fields): translating the kept fields of every
object gives exactly what translating the whole objects gives, over the golden inputs and random additions to them
in the fields dropped; repeated strings are shared; malformed objects pass through."""

from __future__ import annotations

import copy
import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.cached_fields import (
    LAST_APPLIED,
    POD_SPEC_DROPPED,
    SharedValues,
    common,
    node,
    pod,
    transform_for,
)
from ambit.controlplane.translate import Translation, translate_all
from ambit.k8s import kinds

GOLDEN = Path(__file__).parent / "golden"
KINDS = {
    "Pod": "pods",
    "Service": "services",
    "EndpointSlice": "endpoint_slices",
    "Namespace": "namespaces",
    "ServiceEntry": "service_entries",
    "WorkloadEntry": "workload_entries",
    "AuthorizationPolicy": "authorization_policies",
    "PeerAuthentication": "peer_authentications",
    "Node": "nodes",
    "Gateway": "gateways",
    "GatewayClass": "gateway_classes",
    "HTTPRoute": "http_routes",
    "GRPCRoute": "grpc_routes",
    "TCPRoute": "tcp_routes",
    "TLSRoute": "tls_routes",
    "ReferenceGrant": "reference_grants",
    "VirtualService": "virtual_services",
    "DestinationRule": "destination_rules",
}
CASES = sorted(
    f"{folder}/{p.name.removesuffix('-in.yaml')}"
    for folder in ("translate", "routes")
    for p in (GOLDEN / folder).glob("*-in.yaml")
)
Obj = dict[str, Any]


def load(case: str) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all((GOLDEN / f"{case}-in.yaml").read_text()) if doc]


def kept(obj: Obj) -> Obj:
    return {"Pod": pod, "Node": node}.get(obj.get("kind", ""), common)(obj)


def translated(objects: list[Obj]) -> Translation:
    out: dict[str, list[Obj]] = {name: [] for name in KINDS.values()}
    for obj in objects:
        out[KINDS[obj["kind"]]].append(obj)
    return translate_all(**out)  # type: ignore[arg-type]


def same(a: Translation, b: Translation) -> None:
    assert a.config == b.config
    assert a.skipped == b.skipped
    assert a.policy_status == b.policy_status
    assert a.service_status == b.service_status
    assert a.service_entry_status == b.service_entry_status
    assert a.waypoint_configs == b.waypoint_configs
    assert a.route_status == b.route_status


@pytest.mark.parametrize("case", CASES)
def test_translating_what_the_caches_keep_gives_the_golden_translation(case: str) -> None:
    objects = load(case)
    same(translated([kept(copy.deepcopy(obj)) for obj in objects]), translated(objects))


_junk = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6,
)


@st.composite
def cluttered(draw: st.DrawFn, obj: Obj) -> Obj:
    """``obj`` with random values in the fields the caches drop (as a real cluster's objects carry them)."""
    obj = copy.deepcopy(obj)
    meta = obj.setdefault("metadata", {})
    if draw(st.booleans()):
        meta["managedFields"] = draw(st.lists(_junk, max_size=2))
    if draw(st.booleans()):
        meta.setdefault("annotations", {})[LAST_APPLIED] = draw(st.text(max_size=40))
    if obj.get("kind") == "Pod":
        spec = obj.setdefault("spec", {})
        for field in draw(st.lists(st.sampled_from(sorted(POD_SPEC_DROPPED)), max_size=4)):
            spec[field] = draw(_junk)
        for container in spec.get("containers") or ():
            for field in draw(st.lists(st.sampled_from(["image", "env", "resources", "livenessProbe"]), max_size=3)):
                container[field] = draw(_junk)
            for port in container.get("ports") or ():
                port["hostPort"] = draw(st.integers(0, 65535))
        status = obj.setdefault("status", {})
        for field in draw(st.lists(st.sampled_from(["containerStatuses", "qosClass", "startTime"]), max_size=3)):
            status[field] = draw(_junk)
        for condition in status.get("conditions") or ():
            condition["lastTransitionTime"] = draw(st.text(max_size=20))
    if obj.get("kind") == "Node":
        obj["status"] = draw(_junk)
        obj["spec"] = draw(_junk)
    return obj


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_clutter_in_the_dropped_fields_changes_no_translation(data: st.DataObject) -> None:
    case = data.draw(st.sampled_from(CASES))
    objects = load(case)
    whole = [data.draw(cluttered(obj)) for obj in objects]
    same(translated([kept(copy.deepcopy(obj)) for obj in whole]), translated(objects))


def test_a_pod_keeps_what_is_read_and_shares_repeated_strings() -> None:
    def raw(name: str) -> Obj:  # as parsed: equal strings, distinct objects
        return yaml.safe_load(
            f"""
            metadata: {{name: {name}, namespace: "{"ns" * 3}", labels: {{app: "{"web" * 2}"}}, managedFields: [{{}}]}}
            spec:
              nodeName: "{"node-" * 2}"
              volumes: [{{name: v}}]
              containers: [{{name: app, image: i, ports: [{{name: http, containerPort: 80, hostPort: 1}}]}}]
            status:
              phase: Running
              podIP: 10.0.0.1
              qosClass: BestEffort
              conditions: [{{type: Ready, status: "True", lastTransitionTime: "2026-01-01T00:00:00Z"}}]
            """
        )

    a, b = pod(raw("a")), pod(raw("b"))
    assert a == {
        "metadata": {"name": "a", "namespace": "nsnsns", "labels": {"app": "webweb"}},
        "spec": {
            "nodeName": "node-node-",
            "containers": [{"name": "app", "ports": [{"name": "http", "containerPort": 80}]}],
        },
        "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert a["metadata"]["namespace"] is b["metadata"]["namespace"]
    assert a["metadata"]["labels"]["app"] is b["metadata"]["labels"]["app"]
    assert a["spec"]["nodeName"] is b["spec"]["nodeName"]


@settings(max_examples=200, deadline=None)
@given(_junk)
def test_any_shape_passes_through_every_transform_without_raising(value: Any) -> None:
    for transform in (pod, node, common):
        transform({"metadata": value, "spec": value, "status": value})
        transform(value)


def test_each_kind_gets_its_transform() -> None:
    assert transform_for(kinds.PODS) is pod and transform_for(kinds.NODES) is node
    assert transform_for(kinds.SERVICES) is common


def test_values_repeated_whole_across_pods_are_one_copy() -> None:
    def raw(name: str, version: str) -> Obj:  # as parsed: equal values, distinct objects
        return yaml.safe_load(
            f"""
            metadata:
              name: {name}
              namespace: ns
              labels: {{app: web, version: "{version}"}}
              ownerReferences: [{{kind: ReplicaSet, name: web-1, uid: u1, controller: true}}]
            spec:
              containers: [{{name: app, image: i, ports: [{{name: http, containerPort: 80}}]}}]
            status:
              podIP: 10.0.0.1
              hostIPs: [{{ip: 10.1.0.1}}]
              conditions: [{{type: Ready, status: "True", lastTransitionTime: "2026-01-01T00:00:00Z"}}]
            """
        )

    a, b, c = pod(raw("a", "v1")), pod(raw("b", "v1")), pod(raw("c", "v2"))
    for path in (
        ("metadata", "labels"),
        ("metadata", "ownerReferences"),
        ("spec", "containers"),
        ("status", "hostIPs"),
        ("status", "conditions"),
    ):
        assert a[path[0]][path[1]] is b[path[0]][path[1]], path
    assert a["metadata"]["labels"] is not c["metadata"]["labels"]
    assert c["metadata"]["labels"] == {"app": "web", "version": "v2"}
    assert a["spec"]["containers"] is c["spec"]["containers"]
    assert a == {**b, "metadata": {**b["metadata"], "name": "a"}}


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"a": 1}, {"a": 1.0}),
        ({"a": 1}, {"a": True}),
        ({"1": "x"}, {1: "x"}),
        ({"a": "2026-01-01"}, {"a": datetime.date(2026, 1, 1)}),
        ([["x"]], [("x",)]),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        ({"a": None}, {"a": float("nan")}),
    ],
)
def test_values_that_differ_in_type_or_order_are_not_shared(first: Any, second: Any) -> None:
    shared = SharedValues()
    kept_first = shared.share(first)
    kept_second = shared.share(copy.deepcopy(second))
    assert kept_first is first
    assert kept_second is not first
    assert repr(kept_second) == repr(second)


def test_pruning_forgets_the_values_no_object_holds_and_keeps_the_others() -> None:
    shared = SharedValues()
    held = [shared.share({"app": f"held-{i}"}) for i in range(10)]
    for i in range(SharedValues.MIN_PRUNE):
        shared.share({"app": f"gone-{i}"})  # nothing keeps these
    assert len(shared) <= 10 + SharedValues.MIN_PRUNE
    shared.prune()
    assert len(shared) == 10
    assert all(shared.share({"app": f"held-{i}"}) is held[i] for i in range(10))


_label_values = st.sampled_from(["a", "b", "web"])


@st.composite
def replicas(draw: st.DrawFn) -> list[Obj]:
    """Pods of a few Deployments (labels, containers and conditions repeating across them), their Services, and a
    policy selecting some of them; each pod's fields drawn independently, so values repeat by chance too."""
    objects: list[Obj] = [
        {"kind": "Namespace", "metadata": {"name": "ns", "labels": {"istio.io/dataplane-mode": "ambient"}}}
    ]
    for n in range(draw(st.integers(1, 8))):
        app = draw(_label_values)
        ready = draw(st.booleans())
        port = draw(st.sampled_from([80, 8080]))
        objects.append(
            {
                "kind": "Pod",
                "metadata": {
                    "name": f"p{n}",
                    "namespace": "ns",
                    "uid": f"uid-{n}",
                    "resourceVersion": "1",
                    "labels": {"app": app, "version": draw(_label_values)},
                },
                "spec": {
                    "nodeName": draw(st.sampled_from(["n1", "n2"])),
                    "serviceAccountName": draw(st.sampled_from(["default", "web"])),
                    "containers": [{"name": "c", "image": "i", "ports": [{"name": "http", "containerPort": port}]}],
                },
                "status": {
                    "phase": "Running",
                    "podIP": f"10.0.0.{n + 1}",
                    "podIPs": [{"ip": f"10.0.0.{n + 1}"}],
                    "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                },
            }
        )
    for app in draw(st.lists(_label_values, max_size=3, unique=True)):
        objects.append(
            {
                "kind": "Service",
                "metadata": {"name": f"svc-{app}", "namespace": "ns", "uid": f"svc-{app}", "resourceVersion": "1"},
                "spec": {
                    "clusterIP": f"10.96.0.{len(objects)}",
                    "selector": {"app": app},
                    "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
                },
            }
        )
    objects.append(
        {
            "kind": "AuthorizationPolicy",
            "metadata": {"name": "allow", "namespace": "ns", "uid": "ap", "resourceVersion": "1"},
            "spec": {"selector": {"matchLabels": {"app": draw(_label_values)}}, "action": "ALLOW", "rules": [{}]},
        }
    )
    return objects


@settings(max_examples=60, deadline=None)
@given(replicas())
def test_translating_objects_whose_repeated_values_are_shared_gives_what_the_whole_objects_give(
    objects: list[Obj],
) -> None:
    same(translated([kept(copy.deepcopy(obj)) for obj in objects]), translated(objects))
