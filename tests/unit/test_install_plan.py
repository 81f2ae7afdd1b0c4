"""ambit.k8s.manifests: reading the rendered manifests, ordering them, replacing, and telling when they are ready."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ambit.k8s import kinds
from ambit.k8s.manifests import (
    KINDS,
    ManifestError,
    apply_order,
    delete_order,
    parse_manifests,
    readiness,
    replacement,
    summary,
)

STREAM = """
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: hook}
webhooks: []
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: ztunnel, namespace: istio-system}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: ztunnel, namespace: istio-system}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: authorizationpolicies.security.istio.io}
---
apiVersion: v1
kind: Namespace
metadata: {name: istio-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: b}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: r}
"""


def test_apply_order_puts_dependencies_first_and_webhooks_last() -> None:
    order = [m.kind.kind for m in apply_order(parse_manifests(STREAM))]
    assert order == [
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "ValidatingWebhookConfiguration",
    ]
    removal = [m.ref for m in delete_order(parse_manifests(STREAM))]
    assert (removal[0], removal[-1]) == ("ValidatingWebhookConfiguration hook", "Namespace istio-system")


def test_summary_counts_kinds_in_apply_order() -> None:
    assert summary(parse_manifests(STREAM)).startswith("1 Namespace, 1 CustomResourceDefinition, 1 ServiceAccount")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: &x [1]\nb: *x\n", "aliases"),
        ("- 1\n", "expected a mapping"),
        ("apiVersion: v1\nkind: Secret\nmetadata: {name: s, namespace: n}\n", "not a kind ambit install applies"),
        ("apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: s}\n", "needs metadata.namespace"),
        ("apiVersion: v1\nkind: Namespace\nmetadata: {name: n, namespace: x}\n", "cluster-scoped"),
        ("apiVersion: v1\nkind: Namespace\nmetadata: {}\n", "metadata.name is missing"),
        ("apiVersion: v1\nkind: [Namespace]\n", "must be strings"),
        ("a: [1\n", "not valid YAML"),
    ],
)
def test_bad_manifests_get_one_clear_error(text: str, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        parse_manifests(text)


_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))
_docs = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
)
_known = st.sampled_from(sorted(KINDS))


@given(st.lists(st.one_of(_docs, _known.map(lambda k: {"apiVersion": k[0], "kind": k[1]})), max_size=4))
def test_any_yaml_stream_parses_or_fails_with_a_manifest_error(docs: list[Any]) -> None:
    try:
        plan = parse_manifests(yaml.safe_dump_all(docs))
    except ManifestError:
        return
    assert sorted(apply_order(plan), key=id) == sorted(plan, key=id)


@given(st.permutations(parse_manifests(STREAM)))
def test_apply_order_does_not_depend_on_the_stream_order_across_ranks(plan: list[Any]) -> None:
    assert [m.rank for m in apply_order(plan)] == sorted(m.rank for m in plan)


def test_replacement_keeps_resource_version_and_allocated_cluster_ips() -> None:
    desired = {"kind": "Service", "metadata": {"name": "istiod"}, "spec": {"ports": [{"port": 15012}]}}
    current = {
        "kind": "Service",
        "metadata": {"name": "istiod", "resourceVersion": "42"},
        "spec": {"clusterIP": "198.19.0.9", "clusterIPs": ["198.19.0.9"], "ports": []},
    }
    out = replacement(desired, current)
    assert out["metadata"]["resourceVersion"] == "42" and out["spec"]["clusterIP"] == "198.19.0.9"
    assert out["spec"]["ports"] == [{"port": 15012}] and "resourceVersion" not in desired["metadata"]


def test_replacement_keeps_the_ca_bundle_and_failure_policy_the_control_plane_wrote() -> None:
    desired = {
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "hook"},
        "webhooks": [{"name": "v", "clientConfig": {"service": {"name": "istiod"}}, "failurePolicy": "Ignore"}],
    }
    live = {"name": "v", "clientConfig": {"caBundle": "UEVN"}, "failurePolicy": "Fail"}
    out = replacement(desired, {"metadata": {"resourceVersion": "7"}, "webhooks": [live]})
    (webhook,) = out["webhooks"]
    assert webhook["clientConfig"] == {"service": {"name": "istiod"}, "caBundle": "UEVN"}
    assert webhook["failurePolicy"] == "Fail"
    # before the control plane has filled it in, the manifest's own values stand
    out = replacement(desired, {"metadata": {}, "webhooks": [{"name": "v", "clientConfig": {}}]})
    assert out["webhooks"][0]["failurePolicy"] == "Ignore"


def _status(**status: Any) -> dict[str, Any]:
    return {"metadata": {"generation": 2}, "spec": {"replicas": 1}, "status": {"observedGeneration": 2, **status}}


@pytest.mark.parametrize(
    ("kind", "obj", "ready"),
    [
        (kinds.DEPLOYMENTS, _status(updatedReplicas=1, availableReplicas=1), True),
        (kinds.DEPLOYMENTS, _status(updatedReplicas=1, availableReplicas=0), False),
        (kinds.DEPLOYMENTS, {**_status(updatedReplicas=1, availableReplicas=1), "metadata": {"generation": 3}}, False),
        (kinds.DAEMON_SETS, _status(desiredNumberScheduled=2, updatedNumberScheduled=2, numberAvailable=2), True),
        (kinds.DAEMON_SETS, _status(desiredNumberScheduled=2, updatedNumberScheduled=1, numberAvailable=2), False),
        (kinds.DAEMON_SETS, _status(desiredNumberScheduled=0), False),
        (kinds.CUSTOM_RESOURCE_DEFINITIONS, _status(conditions=[{"type": "Established", "status": "True"}]), True),
        (kinds.CUSTOM_RESOURCE_DEFINITIONS, _status(conditions=[{"type": "Established", "status": "False"}]), False),
        (kinds.SERVICES, {}, True),
    ],
)
def test_readiness(kind: Any, obj: dict[str, Any], ready: bool) -> None:
    assert readiness(kind, obj).ready is ready
