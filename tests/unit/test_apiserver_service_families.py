"""A Service's IP families and cluster IPs as kube-apiserver decides them (ambit.apiserver.service_families), and
their allocation from one or two Service ranges (ambit.apiserver.service_ips)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.apiserver.errors import ApiError
from ambit.apiserver.service_families import ServiceFamilyError, plan_families
from ambit.apiserver.service_ips import ServiceIpAllocator
from ambit.apiserver.store import Store

DUAL = ("IPv4", "IPv6")
V4 = ("IPv4",)
V6_FIRST = ("IPv6", "IPv4")
RANGES = "198.19.0.0/16,fd00:ab:ffff::/108"


def spec(**fields: Any) -> dict[str, Any]:
    return {"ports": [{"port": 80}], "selector": {"app": "a"}, **fields}


@pytest.mark.parametrize(
    ("fields", "cluster", "policy", "families", "ips"),
    [
        ({}, V4, "SingleStack", ("IPv4",), (None,)),
        ({}, DUAL, "SingleStack", ("IPv4",), (None,)),
        ({}, V6_FIRST, "SingleStack", ("IPv6",), (None,)),
        ({"ipFamilyPolicy": "PreferDualStack"}, V4, "PreferDualStack", ("IPv4",), (None,)),
        ({"ipFamilyPolicy": "PreferDualStack"}, DUAL, "PreferDualStack", DUAL, (None, None)),
        ({"ipFamilyPolicy": "RequireDualStack"}, DUAL, "RequireDualStack", DUAL, (None, None)),
        ({"ipFamilies": ["IPv6"]}, DUAL, "SingleStack", ("IPv6",), (None,)),
        ({"ipFamilies": ["IPv6", "IPv4"]}, DUAL, "RequireDualStack", V6_FIRST, (None, None)),
        ({"ipFamilyPolicy": "PreferDualStack", "ipFamilies": ["IPv6"]}, DUAL, "PreferDualStack", V6_FIRST,
         (None, None)),
        ({"clusterIP": "fd00:ab:ffff::9"}, DUAL, "SingleStack", ("IPv6",), ("fd00:ab:ffff::9",)),
        ({"clusterIPs": ["198.19.0.9", "fd00:ab:ffff::9"]}, DUAL, "RequireDualStack", DUAL,
         ("198.19.0.9", "fd00:ab:ffff::9")),
        ({"clusterIP": "None", "ipFamilyPolicy": "PreferDualStack"}, DUAL, "PreferDualStack", DUAL, ("None",)),
        ({"clusterIP": "None", "selector": None}, V4, "RequireDualStack", ("IPv4",), ("None",)),
        ({"clusterIP": "None", "selector": None}, DUAL, "RequireDualStack", DUAL, ("None",)),
    ],
)  # fmt: skip
def test_families_and_policy_default_as_kube_apiserver_does(
    fields: dict[str, Any], cluster: tuple[str, ...], policy: str, families: tuple[str, ...], ips: tuple[Any, ...]
) -> None:
    plan = plan_families(spec(**fields), cluster)
    assert (plan.policy, plan.families, plan.cluster_ips) == (policy, families, ips)


@pytest.mark.parametrize(
    ("fields", "cluster", "field", "message"),
    [
        ({"ipFamilyPolicy": "RequireDualStack"}, V4, "spec.ipFamilyPolicy", "not configured for dual-stack"),
        ({"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv4", "IPv6"]}, DUAL, "spec.ipFamilyPolicy",
         "must be RequireDualStack or PreferDualStack"),
        ({"ipFamilies": ["IPv6"]}, V4, "spec.ipFamilies[0]", "IPv6 is not configured on this cluster"),
        ({"ipFamilies": ["IPv4", "IPv4"]}, DUAL, "spec.ipFamilies[1]", "Duplicate value"),
        ({"ipFamilies": ["IPv5"]}, DUAL, "spec.ipFamilies[0]", "Unsupported value"),
        ({"ipFamilies": "IPv4"}, DUAL, "spec.ipFamilies", "is not a list"),
        ({"ipFamilyPolicy": "DualStack"}, DUAL, "spec.ipFamilyPolicy", "Unsupported value"),
        ({"clusterIPs": ["198.19.0.9", "198.19.0.8"]}, DUAL, "spec.clusterIPs[1]", "one IP for each IP family"),
        ({"clusterIP": "198.19.0.9", "clusterIPs": ["198.19.0.8"]}, DUAL, "spec.clusterIPs[0]", "same as"),
        ({"clusterIPs": ["None", "fd00:ab:ffff::1"]}, DUAL, "spec.clusterIPs", "'None' is specified"),
        ({"clusterIPs": ["a", "b", "c"]}, DUAL, "spec.clusterIPs", "up to 2"),
        ({"clusterIPs": ["198.19.0.x"]}, DUAL, "spec.clusterIPs[0]", "must be a valid IP address"),
        ({"clusterIP": "fd00:ab:ffff::9", "ipFamilies": ["IPv4"]}, DUAL, "spec.clusterIPs[0]",
         "expected an IPv4 value"),
    ],
)  # fmt: skip
def test_invalid_family_fields_are_refused_with_the_field_and_kubes_reason(
    fields: dict[str, Any], cluster: tuple[str, ...], field: str, message: str
) -> None:
    with pytest.raises(ServiceFamilyError) as caught:
        plan_families(spec(**fields), cluster)
    assert caught.value.causes[0][0] == field and message in caught.value.causes[0][1]


def test_an_external_name_service_has_no_families() -> None:
    plan = plan_families({"type": "ExternalName", "ipFamilies": ["IPv4"]}, DUAL)
    assert (plan.policy, plan.families, plan.cluster_ips) == (None, (), ())


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
FIELD_VALUES = {
    "ipFamilyPolicy": st.sampled_from(["SingleStack", "PreferDualStack", "RequireDualStack", "x"]) | JSONISH,
    "ipFamilies": st.lists(st.sampled_from(["IPv4", "IPv6", "ipv4"]), max_size=3) | JSONISH,
    "clusterIP": st.sampled_from(["", "None", "198.19.0.9", "fd00:ab:ffff::9", "nope"]) | JSONISH,
    "clusterIPs": st.lists(st.sampled_from(["None", "198.19.0.9", "fd00:ab:ffff::9", "1.2.3"]), max_size=3) | JSONISH,
    "selector": st.none() | st.just({"app": "a"}),
}
SPECS = st.fixed_dictionaries({}, optional=FIELD_VALUES)


@settings(max_examples=400, deadline=None)
@given(SPECS, st.sampled_from([V4, DUAL, V6_FIRST]))
def test_any_spec_gives_a_consistent_plan_or_a_clear_family_error(fields: dict[str, Any], cluster: Any) -> None:
    try:
        plan = plan_families(fields, cluster)
    except ServiceFamilyError as exc:
        assert exc.causes and all(field.startswith("spec.") and message for field, message in exc.causes)
        return
    assert plan.policy in ("SingleStack", "PreferDualStack", "RequireDualStack")
    assert 1 <= len(plan.families) <= 2 and len(set(plan.families)) == len(plan.families)
    assert plan.policy != "SingleStack" or len(plan.families) == 1
    if plan.headless:
        return
    assert len(plan.cluster_ips) == len(plan.families)
    assert set(plan.families) <= set(cluster)
    for family, ip in zip(plan.families, plan.cluster_ips, strict=True):
        assert ip is None or ipaddress.ip_address(ip).version == (4 if family == "IPv4" else 6)


# -- allocation ---------------------------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "ips.db")
    yield s
    s.close()


def create(allocator: ServiceIpAllocator, store: Store, name: str, **fields: Any) -> dict[str, Any]:
    svc: dict[str, Any] = {"metadata": {"name": name, "namespace": "default"}, "spec": spec(**fields)}
    allocator.allocate(svc)
    store.put("ADDED", ("", "services"), "default", name, svc)
    return svc


def test_a_dual_stack_service_gets_the_lowest_free_address_of_each_range_primary_first(store: Store) -> None:
    allocator = ServiceIpAllocator(store, RANGES)
    single = create(allocator, store, "single")
    dual = create(allocator, store, "dual", ipFamilyPolicy="PreferDualStack")
    six = create(allocator, store, "six", ipFamilies=["IPv6"])
    assert single["spec"]["clusterIPs"] == ["198.19.0.2"]
    assert dual["spec"]["clusterIPs"] == ["198.19.0.3", "fd00:ab:ffff::2"]  # ::1 is kept as in IPv4
    assert dual["spec"]["clusterIP"] == "198.19.0.3" and dual["spec"]["ipFamilies"] == ["IPv4", "IPv6"]
    assert six["spec"]["clusterIPs"] == ["fd00:ab:ffff::3"] and six["spec"]["ipFamilyPolicy"] == "SingleStack"
    with pytest.raises(ApiError, match="already allocated"):
        create(allocator, store, "thief", clusterIPs=["198.19.0.9", "fd00:ab:ffff::2"])
    with pytest.raises(ApiError, match="not in the service range fd00:ab:ffff::/108"):
        create(allocator, store, "outside", clusterIP="fd00:ab::1")


def test_prefer_dual_stack_on_a_single_stack_cluster_gets_one_family_and_require_is_refused(store: Store) -> None:
    allocator = ServiceIpAllocator(store, "198.19.0.0/16")
    prefer = create(allocator, store, "prefer", ipFamilyPolicy="PreferDualStack")
    assert prefer["spec"]["ipFamilies"] == ["IPv4"] and len(prefer["spec"]["clusterIPs"]) == 1
    with pytest.raises(ApiError) as caught:
        create(allocator, store, "require", ipFamilyPolicy="RequireDualStack")
    assert caught.value.code == 422 and "not configured for dual-stack" in caught.value.message


def test_an_update_upgrades_and_downgrades_but_never_changes_the_primary_address_or_family(store: Store) -> None:
    allocator = ServiceIpAllocator(store, RANGES)
    old = create(allocator, store, "s")
    up: dict[str, Any] = {
        "metadata": {"name": "s", "namespace": "default"},
        "spec": spec(ipFamilyPolicy="PreferDualStack"),
    }
    allocator.reallocate(old, up)
    assert up["spec"]["clusterIPs"] == ["198.19.0.2", "fd00:ab:ffff::2"]
    assert up["spec"]["ipFamilies"] == ["IPv4", "IPv6"]
    down: dict[str, Any] = {
        "metadata": {"name": "s", "namespace": "default"},
        "spec": spec(ipFamilyPolicy="SingleStack"),
    }
    allocator.reallocate(up, down)
    assert down["spec"]["clusterIPs"] == ["198.19.0.2"] and down["spec"]["ipFamilies"] == ["IPv4"]
    kept: dict[str, Any] = {"metadata": {"name": "s", "namespace": "default"}, "spec": spec()}
    allocator.reallocate(up, kept)
    assert kept["spec"]["clusterIPs"] == up["spec"]["clusterIPs"]  # absent fields keep the stored ones
    for fields in ({"clusterIP": "198.19.0.7"}, {"ipFamilies": ["IPv6", "IPv4"]},
                   {"clusterIPs": ["198.19.0.2", "fd00:ab:ffff::7"]}):  # fmt: skip
        changed: dict[str, Any] = {"metadata": {"name": "s", "namespace": "default"}, "spec": spec(**fields)}
        with pytest.raises(ApiError) as caught:
            allocator.reallocate(up, changed)
        assert caught.value.code == 422 and (
            "immutable" in caught.value.message or "may not change" in caught.value.message
        )


def test_two_ranges_of_one_family_are_a_bad_setting(store: Store) -> None:
    with pytest.raises(ValueError, match="different families"):
        ServiceIpAllocator(store, "198.19.0.0/16,10.96.0.0/12")


OLD_SPECS = st.sampled_from(
    [
        {"clusterIP": "198.19.0.9", "clusterIPs": ["198.19.0.9"], "ipFamilies": ["IPv4"],
         "ipFamilyPolicy": "SingleStack"},
        {"clusterIP": "198.19.0.9", "clusterIPs": ["198.19.0.9", "fd00:ab:ffff::9"], "ipFamilies": ["IPv4", "IPv6"],
         "ipFamilyPolicy": "PreferDualStack"},
        {"clusterIP": "None", "clusterIPs": ["None"], "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack"},
    ]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(SPECS, OLD_SPECS)
def test_any_update_keeps_the_primary_address_and_family_or_is_refused_clearly(
    fields: dict[str, Any], old: dict[str, Any]
) -> None:
    try:
        plan = plan_families({"selector": {"app": "a"}, **fields}, DUAL, old)
    except ServiceFamilyError as exc:
        assert exc.causes and all(field.startswith("spec.") and message for field, message in exc.causes)
        return
    assert plan.families[0] == old["ipFamilies"][0]
    assert plan.cluster_ips[0] == old["clusterIPs"][0]
    assert plan.policy != "SingleStack" or len(plan.families) == 1
    assert plan.headless or len(plan.cluster_ips) == len(plan.families)
