"""Which webhooks a request goes to: rules, scope, namespaceSelector and objectSelector, as kube-apiserver."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ambit.apiserver.admission import AdmissionAttributes, webhook_matches
from ambit.apiserver.errors import ApiError

POD = AdmissionAttributes(
    operation="CREATE",
    group="",
    version="v1",
    resource="pods",
    kind_group="",
    kind_version="v1",
    kind="Pod",
    namespace="default",
    name="web-1",
    object={"metadata": {"name": "web-1", "labels": {"app": "web"}}},
    namespace_labels={"env": "prod"},
)
POD_STATUS = replace(POD, operation="UPDATE", subresource="status", old_object=POD.object)
NODE = AdmissionAttributes(
    operation="CREATE",
    group="",
    version="v1",
    resource="nodes",
    kind_group="",
    kind_version="v1",
    kind="Node",
    name="node-1",
    object={"metadata": {"name": "node-1", "labels": {"role": "worker"}}},
)
NAMESPACE = AdmissionAttributes(
    operation="CREATE",
    group="",
    version="v1",
    resource="namespaces",
    kind_group="",
    kind_version="v1",
    kind="Namespace",
    namespace="team-a",  # kube-apiserver gives a Namespace's own requests its name as namespace
    name="team-a",
    object={"metadata": {"name": "team-a", "labels": {"env": "dev"}}},
)
DEPLOYMENT = AdmissionAttributes(
    operation="UPDATE",
    group="apps",
    version="v1",
    resource="deployments",
    kind_group="apps",
    kind_version="v1",
    kind="Deployment",
    namespace="default",
    name="api",
    object={"metadata": {"name": "api", "labels": {"tier": "backend"}}},
    old_object={"metadata": {"name": "api", "labels": {"tier": "frontend"}}},
    namespace_labels={},
)
WEBHOOK_CONFIG = AdmissionAttributes(
    operation="CREATE",
    group="admissionregistration.k8s.io",
    version="v1",
    resource="mutatingwebhookconfigurations",
    kind_group="admissionregistration.k8s.io",
    kind_version="v1",
    kind="MutatingWebhookConfiguration",
    name="injector",
    object={"metadata": {"name": "injector"}},
)


def rule(
    operations: list[str] | None = None,
    groups: list[str] | None = None,
    versions: list[str] | None = None,
    resources: list[str] | None = None,
    scope: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "operations": operations if operations is not None else ["CREATE", "UPDATE"],
        "apiGroups": groups if groups is not None else [""],
        "apiVersions": versions if versions is not None else ["v1"],
        "resources": resources if resources is not None else ["pods"],
    }
    if scope is not None:
        spec["scope"] = scope
    return spec


def hook(*rules: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"name": "check.example.com", "rules": list(rules), **fields}


EVERYTHING = rule(["*"], ["*"], ["*"], ["*/*"])

MATCH_TABLE = [
    # rules: operations, groups, versions
    ("exact rule", hook(rule()), POD, True),
    ("operation not listed", hook(rule(operations=["DELETE"])), POD, False),
    ("operation wildcard", hook(rule(operations=["*"])), POD, True),
    ("group not listed", hook(rule(groups=["apps"])), POD, False),
    ("group wildcard", hook(rule(groups=["*"], resources=["deployments"])), DEPLOYMENT, True),
    ("version not listed", hook(rule(versions=["v2"])), POD, False),
    ("no rules", hook(), POD, False),
    ("empty resources", hook(rule(resources=[])), POD, False),
    ("any rule of several", hook(rule(resources=["services"]), rule(resources=["pods"])), POD, True),
    # resources and subresources
    ("bare * is every main resource", hook(rule(resources=["*"])), POD, True),
    ("bare * is no subresource", hook(rule(resources=["*"])), POD_STATUS, False),
    ("*/* is everything", hook(rule(resources=["*/*"])), POD_STATUS, True),
    ("main resource only", hook(rule(resources=["pods"])), POD_STATUS, False),
    ("one subresource", hook(rule(resources=["pods/status"])), POD_STATUS, True),
    ("one subresource, not the main", hook(rule(resources=["pods/status"])), POD, False),
    ("pods/* covers the main resource", hook(rule(resources=["pods/*"])), POD, True),
    ("pods/* covers subresources", hook(rule(resources=["pods/*"])), POD_STATUS, True),
    ("*/status", hook(rule(resources=["*/status"])), POD_STATUS, True),
    ("*/status is not the main resource", hook(rule(resources=["*/status"])), POD, False),
    ("other subresource", hook(rule(resources=["pods/exec"])), POD_STATUS, False),
    # scope
    ("Namespaced scope, namespaced object", hook(rule(scope="Namespaced")), POD, True),
    ("Namespaced scope, cluster object", hook(rule(resources=["nodes"], scope="Namespaced")), NODE, False),
    (
        "Namespaced scope never covers a Namespace",
        hook(rule(resources=["namespaces"], scope="Namespaced")),
        NAMESPACE,
        False,
    ),
    ("Cluster scope, cluster object", hook(rule(resources=["nodes"], scope="Cluster")), NODE, True),
    ("Cluster scope covers a Namespace", hook(rule(resources=["namespaces"], scope="Cluster")), NAMESPACE, True),
    ("Cluster scope, namespaced object", hook(rule(scope="Cluster")), POD, False),
    ("* scope", hook(rule(resources=["nodes"], scope="*")), NODE, True),
    # namespaceSelector
    ("namespace labels match", hook(rule(), namespaceSelector={"matchLabels": {"env": "prod"}}), POD, True),
    ("namespace labels differ", hook(rule(), namespaceSelector={"matchLabels": {"env": "dev"}}), POD, False),
    (
        "namespace expression NotIn",
        hook(rule(), namespaceSelector={"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["dev"]}]}),
        POD,
        True,
    ),
    (
        "namespace label DoesNotExist",
        hook(rule(), namespaceSelector={"matchExpressions": [{"key": "env", "operator": "DoesNotExist"}]}),
        POD,
        False,
    ),
    ("empty namespaceSelector", hook(rule(), namespaceSelector={}), POD, True),
    (
        "namespaceSelector never exempts cluster-scoped objects",
        hook(rule(resources=["nodes"]), namespaceSelector={"matchLabels": {"env": "prod"}}),
        NODE,
        True,
    ),
    (
        "a Namespace is matched on its own labels",
        hook(rule(resources=["namespaces"]), namespaceSelector={"matchLabels": {"env": "dev"}}),
        NAMESPACE,
        True,
    ),
    (
        "a Namespace whose own labels differ",
        hook(rule(resources=["namespaces"]), namespaceSelector={"matchLabels": {"env": "prod"}}),
        NAMESPACE,
        False,
    ),
    # objectSelector
    ("object labels match", hook(rule(), objectSelector={"matchLabels": {"app": "web"}}), POD, True),
    ("object labels differ", hook(rule(), objectSelector={"matchLabels": {"app": "db"}}), POD, False),
    (
        "new object labels match",
        hook(rule(groups=["apps"], resources=["deployments"]), objectSelector={"matchLabels": {"tier": "backend"}}),
        DEPLOYMENT,
        True,
    ),
    (
        "old object labels match",
        hook(rule(groups=["apps"], resources=["deployments"]), objectSelector={"matchLabels": {"tier": "frontend"}}),
        DEPLOYMENT,
        True,
    ),
    (
        "neither object's labels match",
        hook(rule(groups=["apps"], resources=["deployments"]), objectSelector={"matchLabels": {"tier": "cache"}}),
        DEPLOYMENT,
        False,
    ),
    (
        "DELETE is matched on the old object",
        hook(rule(operations=["DELETE"]), objectSelector={"matchLabels": {"app": "web"}}),
        replace(POD, operation="DELETE", object=None, old_object=POD.object),
        True,
    ),
    (
        "objectSelector on an object without labels",
        hook(rule(resources=["nodes"]), objectSelector={"matchExpressions": [{"key": "x", "operator": "Exists"}]}),
        replace(NODE, object={"metadata": {"name": "node-1"}}),
        False,
    ),
    ("empty objectSelector", hook(rule(), objectSelector={"matchLabels": {}, "matchExpressions": []}), POD, True),
    # admission configuration objects never go to webhooks
    ("webhook configurations are exempt", hook(EVERYTHING), WEBHOOK_CONFIG, False),
    ("everything covers any group", hook(EVERYTHING), replace(POD, group="example.com"), True),
]


@pytest.mark.parametrize(
    ("webhook", "attrs", "expected"),
    [case[1:] for case in MATCH_TABLE],
    ids=[case[0] for case in MATCH_TABLE],
)
def test_webhook_matches_table(webhook: dict[str, Any], attrs: AdmissionAttributes, expected: bool) -> None:
    assert webhook_matches(webhook, attrs) is expected


def test_rules_are_read_from_plain_json_with_fields_missing() -> None:
    assert not webhook_matches({"name": "x", "rules": [{"resources": ["pods"]}]}, POD)
    assert not webhook_matches({"name": "x", "rules": None}, POD)


def test_missing_namespace_with_a_namespace_selector_is_not_found() -> None:
    webhook = hook(rule(), namespaceSelector={"matchLabels": {"env": "prod"}})
    with pytest.raises(ApiError) as caught:
        webhook_matches(webhook, replace(POD, namespace_labels=None))
    assert caught.value.code == 404
    assert caught.value.message == 'namespaces "default" not found'


def test_missing_namespace_does_not_matter_without_a_namespace_selector() -> None:
    assert webhook_matches(hook(rule()), replace(POD, namespace_labels=None))


def test_malformed_selector_is_an_internal_error_only_when_the_rules_match() -> None:
    broken = {"matchExpressions": [{"key": "env", "operator": "Near", "values": ["x"]}]}
    assert not webhook_matches(hook(rule(resources=["services"]), objectSelector=broken), POD)
    with pytest.raises(ApiError) as caught:
        webhook_matches(hook(rule(), objectSelector=broken), POD)
    assert caught.value.code == 500
    assert caught.value.reason == "InternalError"
    assert caught.value.message.startswith("Internal error occurred: objectSelector: ")
