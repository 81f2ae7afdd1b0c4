"""The node authorization rule for impersonation (spec §5.3 step 4), with pods given in memory."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from json_strategies import json_objects

from ambit.controlplane.ca.authn import Caller
from ambit.controlplane.ca.errors import AuthorizationError
from ambit.controlplane.ca.nodeauth import (
    DEFAULT_TRUSTED_NODE_ACCOUNTS,
    NodeAuthorizer,
    NodeKey,
    PodFacts,
    check_impersonation,
    parse_trusted_accounts,
)
from ambit.controlplane.translate.discovery import DiscoveryFilter
from ambit.controlplane.translate.meshconfig import parse_mesh_config
from ambit.model.identity import SpiffeId

TD = "cluster.local"
ZTUNNEL = Caller("istio-system", "ztunnel", "ztunnel-a", "uid-zt-a")
ZTUNNEL_POD = PodFacts("istio-system", "ztunnel-a", "uid-zt-a", "ztunnel", "node-a", "Running")
WEB = "spiffe://cluster.local/ns/shop/sa/web"
WEB_ON_A = PodFacts("shop", "web-1", "uid-web-1", "web", "node-a", "Running")
DB_ON_B = PodFacts("shop", "db-1", "uid-db-1", "db", "node-b", "Running")


def index(*pods: PodFacts) -> dict[NodeKey, list[PodFacts]]:
    by_node: dict[NodeKey, list[PodFacts]] = {}
    for pod in pods:
        by_node.setdefault((pod.node_name, pod.namespace, pod.service_account), []).append(pod)
    return by_node


def check(
    requested: str = WEB,
    *,
    caller: Caller = ZTUNNEL,
    caller_pod: PodFacts | None = ZTUNNEL_POD,
    node_exists: bool = True,
    pods: Iterable[PodFacts] = (WEB_ON_A, DB_ON_B),
) -> SpiffeId:
    by_node = index(*pods)
    return check_impersonation(
        caller,
        requested,
        trust_domain=TD,
        trusted=DEFAULT_TRUSTED_NODE_ACCOUNTS,
        caller_pod=caller_pod,
        caller_node_exists=node_exists,
        pods_on_node=lambda key: by_node.get(key, []),
    )


def test_a_node_proxy_may_impersonate_a_workload_on_its_node() -> None:
    assert check() == SpiffeId(TD, "shop", "web")


def test_a_workload_only_on_another_node_is_refused() -> None:
    with pytest.raises(AuthorizationError, match="node-a"):
        check("spiffe://cluster.local/ns/shop/sa/db")


def test_an_untrusted_caller_may_not_impersonate() -> None:
    web = Caller("shop", "web", "web-1", "uid-web-1")
    with pytest.raises(AuthorizationError, match="not a trusted node account"):
        check(caller=web, caller_pod=WEB_ON_A)


@pytest.mark.parametrize(
    "requested",
    ["spiffe://cluster.local/ns/shop", "web", "spiffe://other.domain/ns/shop/sa/web", ""],
    ids=["no-sa", "not-a-uri", "foreign-trust-domain", "empty"],
)
def test_a_malformed_or_foreign_identity_is_refused(requested: str) -> None:
    with pytest.raises(AuthorizationError):
        check(requested)


def test_a_caller_token_not_bound_to_a_pod_is_refused() -> None:
    with pytest.raises(AuthorizationError, match="not bound"):
        check(caller=Caller("istio-system", "ztunnel"))


def test_a_caller_pod_that_no_longer_exists_is_refused() -> None:
    with pytest.raises(AuthorizationError, match="does not exist"):
        check(caller_pod=None)


def test_a_caller_pod_replaced_under_the_same_name_is_refused() -> None:
    replaced = PodFacts("istio-system", "ztunnel-a", "uid-new", "ztunnel", "node-a", "Running")
    with pytest.raises(AuthorizationError, match="uid"):
        check(caller_pod=replaced)


def test_a_caller_pod_running_as_another_service_account_is_refused() -> None:
    other = PodFacts("istio-system", "ztunnel-a", "uid-zt-a", "default", "node-a", "Running")
    with pytest.raises(AuthorizationError, match="runs as default"):
        check(caller_pod=other)


def test_an_unscheduled_caller_pod_is_refused() -> None:
    nowhere = PodFacts("istio-system", "ztunnel-a", "uid-zt-a", "ztunnel", "", "Pending")
    with pytest.raises(AuthorizationError, match="not on a node"):
        check(caller_pod=nowhere)


def test_a_caller_pod_on_a_node_that_does_not_exist_is_refused() -> None:
    with pytest.raises(AuthorizationError, match="does not exist"):
        check(node_exists=False)


def test_a_trusted_account_name_in_another_namespace_is_not_trusted() -> None:
    """A pod of ``apps/ztunnel`` (a workload's own namespace) is not the node proxy, whatever its pod says."""
    impostor = Caller("apps", "ztunnel", "zt", "uid-zt")
    on_a = PodFacts("apps", "zt", "uid-zt", "ztunnel", "node-a", "Running")
    with pytest.raises(AuthorizationError, match="not a trusted node account"):
        check(caller=impostor, caller_pod=on_a)


def test_failed_pods_do_not_count() -> None:
    failed = PodFacts("shop", "web-1", "uid-web-1", "web", "node-a", "Failed")
    with pytest.raises(AuthorizationError):
        check(pods=[failed])
    pending = PodFacts("shop", "web-2", "uid-web-2", "web", "node-a", "Pending")
    assert check(pods=[failed, pending]) == SpiffeId(TD, "shop", "web")


def test_pod_facts_default_the_service_account() -> None:
    pod = {"metadata": {"namespace": "shop", "name": "p", "uid": "u"}, "spec": {"nodeName": "n"}}
    assert PodFacts.of(pod) == PodFacts("shop", "p", "u", "default", "n", "")


@given(json_objects())
def test_pod_facts_read_any_object_without_failing(pod: dict[str, Any]) -> None:
    if all(isinstance(pod.get(k) or {}, dict) for k in ("metadata", "spec", "status")):
        PodFacts.of(pod)


def test_trusted_accounts_are_read_from_a_comma_separated_list() -> None:
    assert parse_trusted_accounts("istio-system/ztunnel, kube-system/node-proxy,") == frozenset(
        {("istio-system", "ztunnel"), ("kube-system", "node-proxy")}
    )
    with pytest.raises(ValueError, match="namespace"):
        parse_trusted_accounts("ztunnel")


@given(st.text())
def test_trusted_accounts_parse_or_raise_value_error(value: str) -> None:
    try:
        for namespace, account in parse_trusted_accounts(value):
            assert namespace and account and "/" not in account
    except ValueError:
        pass


class _Pods:
    def __init__(self, caller_pod: PodFacts | None, pods: Sequence[PodFacts]) -> None:
        self.caller_pod = caller_pod
        self.by_node = index(*pods)
        self.fetched: list[tuple[str, str]] = []

    def find_pods_on_node(self, key: NodeKey) -> Sequence[PodFacts]:
        return self.by_node.get(key, [])

    async def fetch_pod(self, namespace: str, name: str) -> PodFacts | None:
        self.fetched.append((namespace, name))
        return self.caller_pod

    async def fetch_node_exists(self, name: str) -> bool:
        self.fetched.append(("", name))
        return name == "node-a"


async def test_the_authorizer_reads_the_caller_pod_directly() -> None:
    pods = _Pods(ZTUNNEL_POD, [WEB_ON_A])
    assert await NodeAuthorizer(pods, trust_domain=TD).authorize(ZTUNNEL, WEB) == SpiffeId(TD, "shop", "web")
    assert pods.fetched == [("istio-system", "ztunnel-a"), ("", "node-a")]


async def test_the_authorizer_refuses_a_caller_pod_on_a_node_without_a_node_object() -> None:
    elsewhere = PodFacts("istio-system", "ztunnel-a", "uid-zt-a", "ztunnel", "node-x", "Running")
    pods = _Pods(elsewhere, [PodFacts("shop", "web-1", "uid-web-1", "web", "node-x", "Running")])
    with pytest.raises(AuthorizationError, match="node-x, which does not exist"):
        await NodeAuthorizer(pods, trust_domain=TD).authorize(ZTUNNEL, WEB)


async def test_the_authorizer_does_not_look_up_pods_for_untrusted_callers() -> None:
    pods = _Pods(WEB_ON_A, [WEB_ON_A])
    with pytest.raises(AuthorizationError):
        await NodeAuthorizer(pods, trust_domain=TD).authorize(Caller("shop", "web", "web-1", "uid-web-1"), WEB)
    assert pods.fetched == []


async def test_a_pod_of_a_namespace_the_discovery_selectors_exclude_gets_no_certificate_by_impersonation() -> None:
    """istiod's node authorizer reads pods through its discovery-filtered informer; so does ours (rule 5), live."""
    mesh = parse_mesh_config("discoverySelectors: [{matchExpressions: [{key: x/exclude, operator: DoesNotExist}]}]")
    excluded = [{"metadata": {"name": "shop", "labels": {"x/exclude": "true"}}}]
    current = DiscoveryFilter.build(excluded, mesh, root_namespace="istio-system")

    def discovered(namespace: str) -> bool:  # reads the filter in force at each request
        return current.admits_namespace(namespace)

    authorizer = NodeAuthorizer(_Pods(ZTUNNEL_POD, [WEB_ON_A]), trust_domain=TD, discovered=discovered)
    with pytest.raises(AuthorizationError, match=r"namespace shop of .* is not discovered"):
        await authorizer.authorize(ZTUNNEL, WEB)
    current = DiscoveryFilter.build([{"metadata": {"name": "shop"}}], mesh, root_namespace="istio-system")
    assert await authorizer.authorize(ZTUNNEL, WEB) == SpiffeId(TD, "shop", "web")
