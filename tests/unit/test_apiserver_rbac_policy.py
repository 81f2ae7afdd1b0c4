"""The pure RBAC evaluator: rule matching, subjects, coverage (escalation), request attributes and kube's messages."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.apiserver.rbac_policy import (
    Attributes,
    Rule,
    forbidden_status_fields,
    reason,
    request_attributes,
    rule_allows,
    rules_allow,
    subject_applies,
    uncovered,
)

SA = "system:serviceaccount:apps:default"
SA_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:apps", "system:authenticated")


def res(verb: str, resource: str, *, group: str = "", sub: str = "", ns: str = "apps", name: str = "") -> Attributes:
    return Attributes(SA, SA_GROUPS, verb, True, group, resource, sub, ns, name)


def url(verb: str, path: str) -> Attributes:
    return Attributes(SA, SA_GROUPS, verb, False, path=path)


READ_PODS = Rule(("get", "list", "watch"), ("",), ("pods",))
ALLOW_CASES = [
    (READ_PODS, res("get", "pods", name="a"), True),
    (READ_PODS, res("list", "pods"), True),
    (READ_PODS, res("create", "pods"), False),
    (READ_PODS, res("get", "pods", group="apps"), False),
    (READ_PODS, res("get", "pods", sub="status", name="a"), False),  # a subresource is its own resource
    (Rule(("get",), ("",), ("pods/status",)), res("get", "pods", sub="status", name="a"), True),
    (Rule(("get",), ("",), ("pods/status",)), res("get", "pods", name="a"), False),
    (Rule(("get",), ("",), ("*/status",)), res("get", "pods", sub="status", name="a"), True),
    (Rule(("get",), ("",), ("*/status",)), res("get", "pods", name="a"), False),
    (Rule(("create",), ("",), ("serviceaccounts/token",)), res("create", "serviceaccounts", sub="token"), True),
    (Rule(("*",), ("*",), ("*",)), res("deletecollection", "widgets", group="example.com"), True),
    (Rule(("get",), ("",), ("secrets",), ("mine",)), res("get", "secrets", name="mine"), True),
    (Rule(("get",), ("",), ("secrets",), ("mine",)), res("get", "secrets", name="other"), False),
    (Rule(("list",), ("",), ("secrets",), ("mine",)), res("list", "secrets"), False),  # names never match a list
    (Rule(("get",), non_resource_urls=("/healthz",)), url("get", "/healthz"), True),
    (Rule(("get",), non_resource_urls=("/healthz",)), url("post", "/healthz"), False),
    (Rule(("get",), non_resource_urls=("/apis/*",)), url("get", "/apis/apps/v1"), True),
    (Rule(("get",), non_resource_urls=("/apis/*",)), url("get", "/apis"), False),
    (Rule(("get",), non_resource_urls=("*",)), url("get", "/anything"), True),
    (Rule(("get",), non_resource_urls=("/healthz",)), res("get", "pods"), False),  # URL rules never grant resources
    (READ_PODS, url("get", "/api/v1/pods"), False),
]


@pytest.mark.parametrize(("rule", "attrs", "allowed"), ALLOW_CASES)
def test_rule_allows_as_kube_does(rule: Rule, attrs: Attributes, allowed: bool) -> None:
    assert rule_allows(rule, attrs) is allowed


def test_system_masters_is_always_allowed_and_no_rules_allow_nothing() -> None:
    admin = Attributes("kubernetes-admin", ("system:masters",), "delete", True, "", "namespaces", "", "", "x")
    assert rules_allow([], admin)
    assert not rules_allow([], res("get", "pods"))


SUBJECT_CASES = [
    ({"kind": "User", "name": SA}, "", True),
    ({"kind": "User", "name": "ada"}, "", False),
    ({"kind": "Group", "name": "system:serviceaccounts:apps"}, "", True),
    ({"kind": "Group", "name": "system:masters"}, "", False),
    ({"kind": "ServiceAccount", "name": "default", "namespace": "apps"}, "", True),
    ({"kind": "ServiceAccount", "name": "default"}, "apps", True),  # defaults to the binding's namespace
    ({"kind": "ServiceAccount", "name": "default"}, "", False),
    ({"kind": "ServiceAccount", "name": "default", "namespace": "other"}, "apps", False),
    ({"kind": "Robot", "name": SA}, "", False),
]


@pytest.mark.parametrize(("subject", "namespace", "applies"), SUBJECT_CASES)
def test_subjects_apply_as_kube_matches_them(subject: dict[str, str], namespace: str, applies: bool) -> None:
    assert subject_applies(subject, SA, SA_GROUPS, namespace) is applies


COVER_CASES = [
    ([READ_PODS], [Rule(("get",), ("",), ("pods",))], []),
    ([READ_PODS], [Rule(("get", "delete"), ("",), ("pods",))], [Rule(("delete",), ("",), ("pods",))]),
    ([Rule(("*",), ("*",), ("*",))], [Rule(("escalate",), ("rbac.authorization.k8s.io",), ("roles",))], []),
    ([Rule(("get",), ("",), ("*/status",))], [Rule(("get",), ("",), ("pods/status",))], []),
    (
        [Rule(("get",), ("",), ("secrets",), ("a",))],
        [Rule(("get",), ("",), ("secrets",))],
        [Rule(("get",), ("",), ("secrets",))],
    ),
    ([Rule(("get",), ("",), ("secrets",), ("a", "b"))], [Rule(("get",), ("",), ("secrets",), ("a",))], []),
    ([Rule(("get",), non_resource_urls=("/apis/*",))], [Rule(("get",), non_resource_urls=("/apis/apps",))], []),
    (
        [Rule(("get",), non_resource_urls=("/apis",))],
        [Rule(("get",), non_resource_urls=("/apis/*",))],
        [Rule(("get",), non_resource_urls=("/apis/*",))],
    ),
]


@pytest.mark.parametrize(("owner", "wanted", "missing"), COVER_CASES)
def test_uncovered_names_the_atomic_rules_not_held(owner: list[Rule], wanted: list[Rule], missing: list[Rule]) -> None:
    assert uncovered(owner, wanted) == missing


ATTRIBUTE_CASES = [
    ("GET", "/api/v1/namespaces/apps/pods", False, ("list", "", "pods", "", "apps", "")),
    ("GET", "/api/v1/namespaces/apps/pods", True, ("watch", "", "pods", "", "apps", "")),
    ("GET", "/api/v1/watch/namespaces/apps/pods", False, ("watch", "", "pods", "", "apps", "")),
    ("GET", "/api/v1/namespaces/apps/pods/a/log", False, ("get", "", "pods", "log", "apps", "a")),
    (
        "POST",
        "/api/v1/namespaces/istio-system/serviceaccounts/ztunnel/token",
        False,
        ("create", "", "serviceaccounts", "token", "istio-system", "ztunnel"),
    ),
    ("PUT", "/api/v1/namespaces/apps/pods/a/status", False, ("update", "", "pods", "status", "apps", "a")),
    (
        "PATCH",
        "/apis/apps/v1/namespaces/apps/deployments/d/scale",
        False,
        ("patch", "apps", "deployments", "scale", "apps", "d"),
    ),
    ("DELETE", "/api/v1/namespaces/apps/pods", False, ("deletecollection", "", "pods", "", "apps", "")),
    ("DELETE", "/api/v1/namespaces/apps", False, ("delete", "", "namespaces", "", "apps", "apps")),
    ("PUT", "/api/v1/namespaces/apps/finalize", False, ("update", "", "namespaces", "finalize", "apps", "apps")),
    ("GET", "/api/v1/pods", False, ("list", "", "pods", "", "", "")),
    (
        "GET",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/view",
        False,
        ("get", "rbac.authorization.k8s.io", "clusterroles", "", "", "view"),
    ),
]


@pytest.mark.parametrize(("method", "path", "watch", "expected"), ATTRIBUTE_CASES)
def test_request_attributes_as_kube_request_info(
    method: str, path: str, watch: bool, expected: tuple[str, ...]
) -> None:
    a = request_attributes(SA, SA_GROUPS, method, path, watch)
    assert a.resource_request
    assert (a.verb, a.api_group, a.resource, a.subresource, a.namespace, a.name) == expected


def test_a_list_or_watch_of_one_name_is_authorized_for_that_name() -> None:
    a = request_attributes(SA, SA_GROUPS, "GET", "/api/v1/namespaces/apps/pods", True, "metadata.name=a")
    assert (a.verb, a.name) == ("watch", "a")
    assert request_attributes(SA, SA_GROUPS, "GET", "/api/v1/pods", False, "metadata.name!=a").name == ""
    assert request_attributes(SA, SA_GROUPS, "GET", "/api/v1/pods", False, "spec.nodeName=n").name == ""


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api"),
        ("GET", "/apis"),
        ("GET", "/api/v1"),
        ("GET", "/apis/apps"),
        ("GET", "/apis/apps/v1"),
        ("GET", "/healthz"),
        ("POST", "/version"),
    ],
)
def test_discovery_and_other_paths_are_non_resource_requests(method: str, path: str) -> None:
    a = request_attributes(SA, SA_GROUPS, method, path, False)
    assert not a.resource_request and a.path == path and a.verb == method.lower()


MESSAGE_CASES = [
    (
        res("list", "pods"),
        'pods is forbidden: User "system:serviceaccount:apps:default" cannot list resource "pods" '
        'in API group "" in the namespace "apps"',
        {"kind": "pods"},
    ),
    (
        res("get", "secrets", ns="istio-system", name="istio-ca-secret"),
        'secrets "istio-ca-secret" is forbidden: User "system:serviceaccount:apps:default" cannot get resource '
        '"secrets" in API group "" in the namespace "istio-system"',
        {"name": "istio-ca-secret", "kind": "secrets"},
    ),
    (
        res("delete", "validatingwebhookconfigurations", group="admissionregistration.k8s.io", ns="", name="v"),
        'validatingwebhookconfigurations.admissionregistration.k8s.io "v" is forbidden: User '
        '"system:serviceaccount:apps:default" cannot delete resource "validatingwebhookconfigurations" in API group '
        '"admissionregistration.k8s.io" at the cluster scope',
        {"name": "v", "group": "admissionregistration.k8s.io", "kind": "validatingwebhookconfigurations"},
    ),
    (
        res("create", "serviceaccounts", sub="token", name="ztunnel"),
        'serviceaccounts "ztunnel" is forbidden: User "system:serviceaccount:apps:default" cannot create resource '
        '"serviceaccounts/token" in API group "" in the namespace "apps"',
        {"name": "ztunnel", "kind": "serviceaccounts"},
    ),
    (url("get", "/foo"), 'forbidden: User "system:serviceaccount:apps:default" cannot get path "/foo"', {}),
]


@pytest.mark.parametrize(("attrs", "message", "details"), MESSAGE_CASES)
def test_forbidden_messages_are_kubes(attrs: Attributes, message: str, details: dict[str, str]) -> None:
    assert forbidden_status_fields(attrs, reason(attrs)) == (message, details)


# -- properties -----------------------------------------------------------------------------------------------
_words = st.sampled_from(["", "apps", "pods", "secrets", "status", "token", "a", "b", "get", "list", "create"])
_verbs = st.lists(st.sampled_from(["get", "list", "watch", "create", "update", "patch", "delete", "*"]), min_size=1)
_groups = st.lists(st.sampled_from(["", "apps", "*"]), min_size=1)
_resources = st.lists(
    st.sampled_from(["pods", "pods/status", "*/status", "secrets", "serviceaccounts/token", "*"]), min_size=1
)
_names = st.lists(st.sampled_from(["a", "b"]), max_size=2)
rules = st.builds(lambda v, g, r, n: Rule(tuple(v), tuple(g), tuple(r), tuple(n)), _verbs, _groups, _resources, _names)
attributes = st.builds(
    lambda verb, group, resource, sub, name: res(verb, resource, group=group, sub=sub, name=name),
    st.sampled_from(["get", "list", "watch", "create", "update", "patch", "delete"]),
    st.sampled_from(["", "apps"]),
    st.sampled_from(["pods", "secrets", "serviceaccounts"]),
    st.sampled_from(["", "status", "token"]),
    st.sampled_from(["", "a", "b"]),
)


@given(st.lists(rules, max_size=4))
def test_a_rule_set_covers_itself(owner: list[Rule]) -> None:
    assert uncovered(owner, owner) == []


@given(st.lists(rules, max_size=4), attributes)
def test_what_a_rule_set_allows_is_what_it_covers(owner: list[Rule], a: Attributes) -> None:
    """Authorization and escalation agree: a request is allowed exactly when its atomic rule is covered."""
    resource = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
    atom = Rule((a.verb,), (a.api_group,), (resource,), (a.name,) if a.name else ())
    assert rules_allow(owner, a) == (uncovered(owner, [atom]) == [])


_segments = st.sampled_from(["api", "apis", "v1", "apps", "namespaces", "ns", "pods", "watch", "status", "x", ""])


@given(st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"]), st.lists(_segments, max_size=8), st.text())
def test_request_attributes_reads_any_path(method: str, segments: list[str], fields: str) -> None:
    """Any path gives attributes (the router refuses what is not served, after authorization), never an error."""
    path = "/" + "/".join(segments)
    a = request_attributes(SA, SA_GROUPS, method, path, False, fields)
    if a.resource_request:
        # kube trims every leading slash before it reads the prefix, so "//api/v1/pods" is a resource request too
        assert a.resource and path.lstrip("/").startswith(("api/", "apis/"))
    else:
        assert a.path == path and a.verb == method.lower()
