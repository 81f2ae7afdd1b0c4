"""The per-kind strategy table: each kind's hooks, called directly, with a store and no HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ambit.apiserver.errors import ApiError
from ambit.apiserver.registry import CRD_KEY, Registry, ResourceType
from ambit.apiserver.service_ips import ServiceIpAllocator
from ambit.apiserver.store import Store
from ambit.apiserver.strategies import (
    CrdStrategy,
    GracefulDelete,
    NamespaceStrategy,
    PodStrategy,
    ServiceStrategy,
    Strategy,
    StrategyContext,
    StrategyTable,
    TerminateNamespace,
)
from ambit.apiserver.watch import WatchHub

NOW = 1_700_000_000.0
Committed = list[tuple[str, str, str, str]]


@pytest.fixture
def committed() -> Committed:
    return []


@pytest.fixture
def table(tmp_path: Path, committed: Committed) -> Iterator[StrategyTable]:
    store = Store(tmp_path / "store.db")

    def commit(etype: str, rtype: ResourceType, namespace: str, name: str, obj: dict[str, Any]) -> None:
        committed.append((etype, rtype.kind, namespace, name))
        store.put(etype, rtype.key, namespace, name, obj)

    context = StrategyContext(store, Registry(), WatchHub(), lambda: NOW, commit, root_ca_pem="PEM")
    yield StrategyTable(context, service_cidr="198.19.0.0/30")
    store.close()


def rtype(table: StrategyTable, group: str, plural: str) -> ResourceType:
    found = table.common.context.registry.find(group, plural)
    assert found is not None
    return found


@pytest.mark.parametrize(
    ("group", "plural", "strategy"),
    [
        ("", "namespaces", NamespaceStrategy),
        ("", "pods", PodStrategy),
        ("", "services", ServiceStrategy),
        (*CRD_KEY, CrdStrategy),
        ("", "configmaps", Strategy),
        ("apps", "deployments", Strategy),
    ],
)
def test_the_table_gives_each_kind_its_strategy_and_the_rest_the_common_one(
    table: StrategyTable, group: str, plural: str, strategy: type[Strategy]
) -> None:
    assert type(table[rtype(table, group, plural)]) is strategy


def test_a_builtin_kind_with_status_starts_with_an_empty_status_but_pods_keep_theirs(table: StrategyTable) -> None:
    deployments, pods = rtype(table, "apps", "deployments"), rtype(table, "", "pods")
    deployment: dict[str, Any] = {"metadata": {"name": "d"}}
    table[deployments].prepare_for_create(deployments, deployment)
    assert deployment["status"] == {}
    pod: dict[str, Any] = {"metadata": {"name": "p"}, "status": {"phase": "Running"}}
    table[pods].prepare_for_create(pods, pod)
    assert pod["status"] == {"phase": "Running"}


def test_the_main_resource_does_not_change_status(table: StrategyTable) -> None:
    deployments = rtype(table, "apps", "deployments")
    new: dict[str, Any] = {"metadata": {"name": "d"}, "status": {"replicas": 9}}
    table[deployments].prepare_for_update(deployments, {"metadata": {}, "status": {"replicas": 1}}, new)
    assert new["status"] == {"replicas": 1}


def test_a_bound_pod_is_deleted_gracefully_and_stays_through_its_grace_period(table: StrategyTable) -> None:
    strategy = table[rtype(table, "", "pods")]
    bound = {"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}}
    assert strategy.deletion_plan(bound, None) == GracefulDelete(30)
    assert strategy.deletion_plan({**bound, "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 5}}, None) == (
        GracefulDelete(5)
    )
    assert strategy.deletion_plan(bound, 0) is None
    assert strategy.deletion_plan({"metadata": {"name": "p"}, "spec": {}}, None) is None
    assert not strategy.may_remove_now({"metadata": {"deletionGracePeriodSeconds": 30}})
    assert strategy.may_remove_now({"metadata": {"deletionGracePeriodSeconds": 0}})


def test_a_namespace_keeps_its_spec_and_name_label_and_is_deleted_by_termination(table: StrategyTable) -> None:
    namespaces = rtype(table, "", "namespaces")
    strategy = table[namespaces]
    old = {"metadata": {"name": "ns"}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}
    new: dict[str, Any] = {"metadata": {"name": "ns", "labels": {"team": "a"}}, "spec": {}}
    strategy.prepare_for_update(namespaces, old, new)
    assert new["spec"] == old["spec"] and new["status"] == old["status"]
    assert new["metadata"]["labels"] == {"team": "a", "kubernetes.io/metadata.name": "ns"}
    assert not strategy.defaults_on_update
    assert strategy.own_labels_select_namespace()
    assert strategy.deletion_plan(old, None) == TerminateNamespace()


def test_a_new_namespace_gets_its_default_service_account_and_root_ca(
    table: StrategyTable, committed: Committed
) -> None:
    namespaces = rtype(table, "", "namespaces")
    table[namespaces].after_commit("ADDED", namespaces, {"metadata": {"name": "ns"}})
    assert committed == [("ADDED", "ServiceAccount", "ns", "default"), ("ADDED", "ConfigMap", "ns", "kube-root-ca.crt")]
    table[namespaces].after_commit("MODIFIED", namespaces, {"metadata": {"name": "ns"}})
    assert len(committed) == 2


def test_a_service_gets_the_lowest_free_cluster_ip_which_then_cannot_change(table: StrategyTable) -> None:
    services = rtype(table, "", "services")
    strategy = table[services]
    svc: dict[str, Any] = {"metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}}
    strategy.prepare_for_create(services, svc)
    # The first address is default/kubernetes's, taken only on request.
    assert svc["spec"]["clusterIP"] == "198.19.0.2" and svc["spec"]["clusterIPs"] == ["198.19.0.2"]
    update: dict[str, Any] = {"metadata": {"name": "s"}, "spec": {"ports": [{"port": 81}]}}
    strategy.prepare_for_update(services, svc, update)
    assert update["spec"]["clusterIP"] == "198.19.0.2"
    with pytest.raises(ApiError, match="immutable"):
        strategy.prepare_for_update(services, svc, {"metadata": {"name": "s"}, "spec": {"clusterIP": "198.19.0.3"}})


def _crd(name: str = "widgets.example.com") -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": "example.com",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {}}}],
        },
    }


def test_a_crd_is_validated_before_its_names_are_accepted(table: StrategyTable) -> None:
    crds = rtype(table, *CRD_KEY)
    with pytest.raises(ApiError) as caught:
        table[crds].derive(crds, None, _crd("gadgets.example.com"))
    assert caught.value.code == 422
    assert "metadata.name" in caught.value.message
    crd = _crd()
    table[crds].derive(crds, None, crd)
    assert crd["status"]["acceptedNames"]["kind"] == "Widget"
    assert crd["status"]["storedVersions"] == ["v1"]
    assert [c["type"] for c in crd["status"]["conditions"]] == ["NamesAccepted", "Established"]


def test_an_updated_crd_keeps_its_status(table: StrategyTable) -> None:
    crds = rtype(table, *CRD_KEY)
    old = {**_crd(), "status": {"storedVersions": ["v0", "v1"]}}
    new = _crd()
    table[crds].derive(crds, old, new)
    assert new["status"] == {"storedVersions": ["v0", "v1"]}


def test_an_established_crd_is_served_once_committed_and_its_type_goes_when_it_is_removed(
    table: StrategyTable,
) -> None:
    crds = rtype(table, *CRD_KEY)
    registry = table.common.context.registry
    crd = _crd()
    table[crds].derive(crds, None, crd)
    table[crds].after_commit("ADDED", crds, crd)
    assert registry.find("example.com", "widgets") is not None
    table[crds].after_remove(crd)
    assert registry.find("example.com", "widgets") is None


def test_the_first_and_tenth_addresses_of_the_range_are_kept_for_the_api_server_and_cluster_dns(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "ips.db")
    try:
        allocator = ServiceIpAllocator(store, "198.19.0.0/16")
        handed: list[str] = []
        for i in range(12):
            svc: dict[str, Any] = {"metadata": {"name": f"s{i}"}, "spec": {"ports": [{"port": 80}]}}
            allocator.allocate(svc)
            handed.append(svc["spec"]["clusterIP"])
            store.put("ADDED", ("", "services"), "default", f"s{i}", svc)
        assert "198.19.0.1" not in handed and "198.19.0.10" not in handed and handed[-1] == "198.19.0.14"
        for name, address in (("kube-dns", "198.19.0.10"), ("kubernetes", "198.19.0.1")):
            asked: dict[str, Any] = {"metadata": {"name": name}, "spec": {"clusterIP": address}}
            allocator.allocate(asked)
            assert asked["spec"]["clusterIPs"] == [address]
    finally:
        store.close()
