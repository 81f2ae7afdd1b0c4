"""``discoverySelectors`` (:mod:`ambit.controlplane.translate.meshconfig` rule 7 and
:mod:`ambit.controlplane.translate.discovery`): the selectors as a mesh administrator writes them into the ``istio``
ConfigMap, their semantics checked against the API server's own selector validation, and the filter in the
translation with objects as users write them: a namespace labelled out disappears from the workload API and comes
back when relabelled, through the same memo the control plane keeps.

The attacks: objects of an excluded namespace (a ServiceEntry claiming an included Service's host, a waypoint, a
PeerAuthentication) reach nothing; selectors that miss the root namespace do not switch off mesh-wide policy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.apiserver.errors import ApiError
from ambit.apiserver.selectors import label_selector_from_spec
from ambit.controlplane.translate import Translation, TranslationMemo, translate_all
from ambit.controlplane.translate.discovery import DiscoveryFilter
from ambit.controlplane.translate.meshconfig import (
    MAX_DISCOVERY_SELECTORS,
    MAX_REQUIREMENTS,
    MeshConfigError,
    parse_mesh_config,
)
from ambit.model.policy import Scope

EXCLUDE = "istio.io/test-exclude-namespace"
UPSTREAM = f"""
accessLogFile: /dev/stdout
discoverySelectors:
- matchExpressions:
  - key: {EXCLUDE}
    operator: DoesNotExist
"""
"""The meshConfig of Istio's ambient integration tests (tests/integration/iop-ambient-test-defaults.yaml)."""


# Parsing and semantics


def test_the_upstream_selector_discovers_every_namespace_but_the_labelled_ones() -> None:
    mesh = parse_mesh_config(UPSTREAM)
    assert len(mesh.discovery_selectors) == 1
    assert mesh.discovers({"kubernetes.io/metadata.name": "apps", "istio.io/dataplane-mode": "ambient"})
    assert not mesh.discovers({"kubernetes.io/metadata.name": "external", EXCLUDE: "true"})
    assert not mesh.discovers({EXCLUDE: ""}), "DoesNotExist: an empty value is still a label"


@pytest.mark.parametrize(
    "text", ["", "trustDomain: cluster.local", "discoverySelectors: null", "discoverySelectors: []"]
)
def test_no_selectors_discover_every_namespace(text: str) -> None:
    mesh = parse_mesh_config(text)
    assert mesh.discovery_selectors == ()
    assert mesh.discovers({}) and mesh.discovers({EXCLUDE: "true"})


def test_an_empty_selector_selects_every_namespace() -> None:
    mesh = parse_mesh_config("discoverySelectors:\n- {}\n- matchLabels: {team: a}")
    assert mesh.discovers({}) and mesh.discovers({"team": "b"})


def test_selectors_are_ored_and_the_requirements_of_one_are_anded() -> None:
    mesh = parse_mesh_config(
        """
discoverySelectors:
- matchLabels: {env: prod, region: us-east1}
- matchExpressions:
  - {key: app, operator: In, values: [cassandra, spark]}
  - {key: tier, operator: NotIn, values: [batch]}
  - {key: owner, operator: Exists}
"""
    )
    assert mesh.discovers({"env": "prod", "region": "us-east1"})
    assert not mesh.discovers({"env": "prod"}), "both labels of the first selector"
    assert mesh.discovers({"app": "spark", "owner": "x"}), "NotIn holds when the label is absent"
    assert not mesh.discovers({"app": "spark", "owner": "x", "tier": "batch"})
    assert mesh.discovers({"app": "spark", "owner": "x", "tier": "web"})
    assert not mesh.discovers({"app": "spark"}), "Exists"
    assert not mesh.discovers({"app": "kafka", "owner": "x"}), "In"


def test_protobuf_snake_case_names_are_read_too() -> None:
    mesh = parse_mesh_config(
        "discovery_selectors:\n- match_labels: {a: b}\n  match_expressions: [{key: c, operator: DoesNotExist}]"
    )
    assert mesh.discovers({"a": "b"}) and not mesh.discovers({"a": "b", "c": "d"})


BAD = [
    ("discoverySelectors: {matchLabels: {a: b}}", "discoverySelectors: expected a list of label selectors"),
    ("discoverySelectors: [null]", r"discoverySelectors\[0\]: expected a label selector"),
    ("discoverySelectors: [[a]]", r"discoverySelectors\[0\]: expected a label selector"),
    ("discoverySelectors: [{matchLabels: [a]}]", r"discoverySelectors\[0\].matchLabels: expected a map"),
    ("discoverySelectors: [{matchLabels: {a: 1}}]", r"matchLabels\['a'\]: expected a string value"),
    ("discoverySelectors: [{matchLabels: {a: b}}, {matchExpressions: {}}]", r"\[1\].matchExpressions: expected a list"),
    ("discoverySelectors: [{matchExpressions: [x]}]", r"matchExpressions\[0\]: expected an object"),
    ("discoverySelectors: [{matchExpressions: [{key: a, operator: DoesntExist}]}]", "'DoesntExist' is not one of"),
    ("discoverySelectors: [{matchExpressions: [{key: a, operator: in, values: [b]}]}]", "'in' is not one of"),
    ("discoverySelectors: [{matchExpressions: [{key: a}]}]", "'' is not one of In"),
    ("discoverySelectors: [{matchExpressions: [{key: a, operator: In}]}]", "In needs at least one value"),
    ("discoverySelectors: [{matchExpressions: [{key: a, operator: NotIn, values: []}]}]", "NotIn needs at least"),
    ("discoverySelectors: [{matchExpressions: [{key: a, operator: Exists, values: [b]}]}]", "Exists takes no values"),
    ("discoverySelectors: [{matchExpressions: [{key: a, operator: In, values: b}]}]", "values: expected a list of"),
    ("discoverySelectors: [{matchExpressions: [{key: a, operator: In, values: [1]}]}]", "values: expected a list of"),
    ("discoverySelectors: [{matchExpressions: [{operator: Exists}]}]", "invalid label key ''"),
    ("discoverySelectors: [{matchExpressions: [{key: 'a b', operator: Exists}]}]", "invalid label key 'a b'"),
    ("discoverySelectors: [{matchExpressions: [{key: 'Istio.IO/x', operator: Exists}]}]", "lowercase DNS subdomain"),
    ("discoverySelectors: [{matchLabels: {'': b}}]", "invalid label key ''"),
    ("discoverySelectors: [{matchLabels: {a: 'b c'}}]", "invalid label value 'b c' for key 'a'"),
    ("discoverySelectors: [{matchLabels: {a: " + "x" * 64 + "}}]", "63 characters or less"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_a_bad_selector_is_one_clear_error_naming_its_place(text: str, message: str) -> None:
    with pytest.raises(MeshConfigError, match=message) as caught:
        parse_mesh_config(text)
    assert "\n" not in str(caught.value)


def test_selector_and_requirement_counts_are_bounded() -> None:
    many = yaml.safe_dump({"discoverySelectors": [{} for _ in range(MAX_DISCOVERY_SELECTORS + 1)]})
    with pytest.raises(MeshConfigError, match=f"at most {MAX_DISCOVERY_SELECTORS}"):
        parse_mesh_config(many)
    labels = {f"k{i}": "v" for i in range(MAX_REQUIREMENTS // 10 + 1)}
    heavy = yaml.safe_dump({"discoverySelectors": [{"matchLabels": dict(labels)} for _ in range(10)]})
    with pytest.raises(MeshConfigError, match=f"more than {MAX_REQUIREMENTS} label requirements"):
        parse_mesh_config(heavy)


_text = st.sampled_from(["a", "b", "team", "example.com/env", "Bad Key", "", "-x", "x" * 64, "istio.io/x"])
_operator = st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "in", "Equals", ""])
_expression = st.fixed_dictionaries(
    {"key": _text, "operator": _operator}, optional={"values": st.lists(_text, max_size=3)}
)
_selector = st.fixed_dictionaries(
    {},
    optional={
        "matchLabels": st.dictionaries(_text, _text, max_size=3),
        "matchExpressions": st.lists(_expression, max_size=3),
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_selector, min_size=1, max_size=3), st.dictionaries(_text, _text, max_size=4))
def test_selectors_agree_with_the_api_servers_validation_and_matching(
    selectors: list[dict[str, Any]], labels: dict[str, str]
) -> None:
    """The API server's ``metav1.LabelSelector`` reader is an independent implementation of the same grammar."""
    try:
        reference = [label_selector_from_spec(s) for s in selectors]
    except ApiError:
        reference = None
    try:
        mesh = parse_mesh_config(yaml.safe_dump({"discoverySelectors": selectors}))
    except MeshConfigError:
        assert reference is None, selectors
        return
    assert reference is not None, selectors
    assert mesh.discovers(labels) == any(r.matches(labels) for r in reference)


_yaml_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_yaml_value)
def test_any_discovery_selectors_value_parses_or_is_one_mesh_config_error(value: Any) -> None:
    try:
        mesh = parse_mesh_config(yaml.safe_dump({"discoverySelectors": value}))
    except MeshConfigError as exc:
        assert "\n" not in str(exc)
    else:
        mesh.discovers({"a": "b"})


def test_the_deployed_mesh_config_has_no_selectors_so_every_namespace_is_discovered() -> None:
    deployed = Path(__file__).parents[2] / "deploy" / "base" / "istiod" / "configmap.yaml"
    mesh = parse_mesh_config(yaml.safe_load(deployed.read_text(encoding="utf-8"))["data"]["mesh"])
    assert mesh.discovery_selectors == () and mesh.discovers({EXCLUDE: "true"})


# The filter in the translation, with objects as users write them


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "uid": f"ns-{name}",
            "resourceVersion": str(len(labels) + 1),
            "labels": {"kubernetes.io/metadata.name": name, **labels},
        },
    }


def mesh_config_map(text: str, version: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "istio", "namespace": "istio-system", "uid": "cm-1", "resourceVersion": version},
        "data": {"mesh": text},
    }


def pod(ns: str, name: str, ip: str, app: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{ns}-{name}",
            "resourceVersion": "1",
            "labels": {"app": app},
        },
        "spec": {"nodeName": "node-1", "serviceAccountName": app},
        "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def service(ns: str, name: str, vip: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "uid": f"svc-{ns}-{name}", "resourceVersion": "1"},
        "spec": {
            "clusterIP": vip,
            "selector": {"app": name},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
        },
    }


ROOT_DENY = {
    "apiVersion": "security.istio.io/v1",
    "kind": "AuthorizationPolicy",
    "metadata": {"name": "deny-evil", "namespace": "istio-system", "uid": "ap-root", "resourceVersion": "1"},
    "spec": {"action": "DENY", "rules": [{"from": [{"source": {"namespaces": ["evil"]}}]}]},
}
APPS_ALLOW = {
    "apiVersion": "security.istio.io/v1",
    "kind": "AuthorizationPolicy",
    "metadata": {"name": "allow-client", "namespace": "apps", "uid": "ap-apps", "resourceVersion": "1"},
    "spec": {"selector": {"matchLabels": {"app": "server"}}, "rules": [{"from": [{"source": {"principals": ["x"]}}]}]},
}


def world(*, excluded: bool, mesh: str = UPSTREAM) -> dict[str, Any]:
    """Namespace ``apps`` (client and server) and namespace ``external`` (upstream's external Service), the latter
    labelled out when ``excluded``."""
    external_labels = {EXCLUDE: "true"} if excluded else {}
    return {
        "pods": [
            pod("apps", "client-0", "198.18.0.10", "client"),
            pod("apps", "server-0", "198.18.0.11", "server"),
            pod("external", "external-0", "198.18.0.20", "external"),
        ],
        "services": [service("apps", "server", "198.19.0.11"), service("external", "external", "198.19.0.20")],
        "endpoint_slices": [],
        "namespaces": [
            namespace("istio-system"),
            namespace("apps", **{"istio.io/dataplane-mode": "ambient"}),
            namespace("external", **external_labels),
        ],
        "authorization_policies": [ROOT_DENY, APPS_ALLOW],
        "config_maps": [mesh_config_map(mesh)],
    }


def hosts(t: Translation) -> set[str]:
    return {s.hostname for s in t.config.services}


def workload_namespaces(t: Translation) -> set[str]:
    return {w.namespace for w in t.config.workloads}


def test_a_namespace_labelled_out_is_not_in_the_workload_api_and_comes_back_when_relabelled() -> None:
    memo = TranslationMemo()
    before = translate_all(**world(excluded=False), translation_memo=memo)
    assert "external.external.svc.cluster.local" in hosts(before) and "external" in workload_namespaces(before)
    out = translate_all(**world(excluded=True), translation_memo=memo)
    assert hosts(out) == {"server.apps.svc.cluster.local"}
    assert workload_namespaces(out) == {"apps"}
    back = translate_all(**world(excluded=False), translation_memo=memo)
    assert back == before == translate_all(**world(excluded=False))


def test_selectors_set_and_cleared_in_the_config_map_apply_at_the_next_translation() -> None:
    memo = TranslationMemo()
    labelled = world(excluded=True, mesh="")
    assert "external" in workload_namespaces(translate_all(**labelled, translation_memo=memo))
    labelled["config_maps"] = [mesh_config_map(UPSTREAM, version="2")]
    assert "external" not in workload_namespaces(translate_all(**labelled, translation_memo=memo))
    labelled["config_maps"] = [mesh_config_map("discoverySelectors: [{matchExpressions: [{key: a}]}]", "3")]
    broken = translate_all(**labelled, translation_memo=memo)
    assert "external" not in workload_namespaces(broken), "a bad text keeps the previous selectors"
    assert any(s.field == "data.mesh" for s in broken.skipped)
    labelled["config_maps"] = [mesh_config_map("discoverySelectors: []", version="4")]
    assert "external" in workload_namespaces(translate_all(**labelled, translation_memo=memo))


def test_without_selectors_nothing_is_filtered_even_a_namespace_without_its_namespace_object() -> None:
    inputs = world(excluded=True, mesh="")
    inputs["namespaces"] = [n for n in inputs["namespaces"] if n["metadata"]["name"] != "external"]
    assert "external" in workload_namespaces(translate_all(**inputs))
    with_selectors = world(excluded=False)
    with_selectors["namespaces"] = inputs["namespaces"]
    assert "external" not in workload_namespaces(translate_all(**with_selectors)), "istiod knows no such namespace"


def test_policies_of_included_namespaces_and_mesh_wide_ones_keep_applying() -> None:
    for excluded in (False, True):
        t = translate_all(**world(excluded=excluded))
        scopes = {p.key: p.scope for p in t.config.policies}
        assert scopes["istio-system/deny-evil"] is Scope.GLOBAL, "a root policy without selector: every workload"
        (server,) = [w for w in t.config.workloads if w.name == "server-0"]
        assert "apps/allow-client" in server.authorization_policies


def test_selectors_that_miss_the_root_namespace_do_not_switch_off_mesh_wide_policy() -> None:
    """istiod would drop istio-system's objects here; Ambit keeps its root namespace (discovery rule 5)."""
    strict_root = {
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": {"name": "default", "namespace": "istio-system", "uid": "pa-root", "resourceVersion": "1"},
        "spec": {"mtls": {"mode": "STRICT"}},
    }
    inputs = world(excluded=False, mesh="discoverySelectors: [{matchLabels: {istio.io/dataplane-mode: ambient}}]")
    t = translate_all(**inputs, peer_authentications=[strict_root])
    assert workload_namespaces(t) == {"apps"}, "external carries no ambient label"
    assert {p.key: p.scope for p in t.config.policies}["istio-system/deny-evil"] is Scope.GLOBAL
    (server,) = [w for w in t.config.workloads if w.name == "server-0"]
    assert "istio-system/istio_converted_static_strict" in server.authorization_policies, "root STRICT mTLS"


def test_objects_of_an_excluded_namespace_reach_nothing_in_the_included_ones() -> None:
    """A user of the excluded namespace claims the included Service's host, offers a waypoint to everyone and
    turns mTLS off for the mesh from there: none of it is seen."""
    hijack = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": "hijack", "namespace": "external", "uid": "se-x", "resourceVersion": "1"},
        "spec": {
            "hosts": ["server.apps.svc.cluster.local", "*.apps.svc.cluster.local"],
            "addresses": ["198.19.0.99"],
            "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
            "endpoints": [{"address": "198.18.0.66"}],
            "resolution": "STATIC",
        },
    }
    waypoint = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "waypoint", "namespace": "external", "uid": "gw-x", "resourceVersion": "1"},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [
                {"name": "mesh", "port": 15008, "protocol": "HBONE", "allowedRoutes": {"namespaces": {"from": "All"}}}
            ],
        },
        "status": {"addresses": [{"type": "Hostname", "value": "waypoint.external.svc.cluster.local"}]},
    }
    permissive = {
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": {"name": "default", "namespace": "external", "uid": "pa-x", "resourceVersion": "1"},
        "spec": {"mtls": {"mode": "DISABLE"}},
    }
    inputs = world(excluded=True)
    inputs["namespaces"][1]["metadata"]["labels"].update(
        {"istio.io/use-waypoint": "waypoint", "istio.io/use-waypoint-namespace": "external"}
    )
    t = translate_all(**inputs, service_entries=[hijack], gateways=[waypoint], peer_authentications=[permissive])
    assert hosts(t) == {"server.apps.svc.cluster.local"}
    assert all(s.waypoint is None for s in t.config.services)
    assert all(w.waypoint is None for w in t.config.workloads)
    assert not any(p.namespace == "external" for p in t.config.policies)
    assert t.waypoint_configs == ()


def test_the_filter_admits_cluster_scoped_objects_and_the_root_namespace() -> None:
    mesh = parse_mesh_config("discoverySelectors: [{matchLabels: {team: a}}]")
    seen = DiscoveryFilter.build([namespace("a", team="a"), namespace("b")], mesh, root_namespace="istio-system")
    assert seen.admits({"metadata": {"name": "node-1"}})
    assert seen.admits({"metadata": {"name": "x", "namespace": "istio-system"}})
    assert seen.admits({"metadata": {"name": "x", "namespace": "a"}})
    assert not seen.admits({"metadata": {"name": "x", "namespace": "b"}})
    assert not seen.admits({"metadata": {"name": "x", "namespace": "c"}})
    everything = DiscoveryFilter.build([], parse_mesh_config(""), root_namespace="istio-system")
    assert everything.admits({"metadata": {"name": "x", "namespace": "c"}})
