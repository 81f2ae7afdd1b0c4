"""A WorkloadEntry's ``address`` and ``weight`` as users write them (istiod's workloads.go): an IP is an address, a
DNS name a hostname, anything else is left out with a reason; a weight above 0 is the capacity."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.translate.index import ServiceIndex
from ambit.controlplane.translate.skips import Skipped
from ambit.controlplane.translate.workloadentries import translate_workload_entry
from ambit.model.workload import Workload


def entry(**spec: Any) -> dict[str, Any]:
    return {"kind": "WorkloadEntry", "metadata": {"name": "vm", "namespace": "shop"}, "spec": spec}


def translate(obj: dict[str, Any]) -> tuple[Workload | None, list[Skipped]]:
    skips: list[Skipped] = []
    index = ServiceIndex.build([], [], domain="cluster.local")
    workload = translate_workload_entry(
        obj, index, cluster_id="Kubernetes", trust_domain="cluster.local", network="", skips=skips
    )
    return workload, skips


@pytest.mark.parametrize(
    ("address", "addresses", "hostname"),
    [
        ("198.18.20.7", ("198.18.20.7",), ""),
        ("fd00::7", ("fd00::7",), ""),
        (
            "istio-ingressgateway.istio-system.svc.cluster.local",
            (),
            "istio-ingressgateway.istio-system.svc.cluster.local",
        ),
        ("vm-1", (), "vm-1"),
    ],
)
def test_an_ip_is_an_address_and_a_dns_name_a_hostname(address: str, addresses: tuple[str, ...], hostname: str) -> None:
    workload, skips = translate(entry(address=address))
    assert workload is not None and not skips
    assert workload.addresses == tuple(ipaddress.ip_address(a) for a in addresses)
    assert workload.hostname == hostname


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("unix:///var/run/vm.sock", "Unix domain socket endpoints are not supported"),
        ("vm_1!.example.com", "is neither an IP address nor a DNS name"),
        ("", "required"),
        ("a" * 300, "is neither an IP address nor a DNS name"),
    ],
)
def test_anything_else_is_left_out_with_a_reason(address: str, reason: str) -> None:
    workload, skips = translate(entry(address=address))
    assert workload is None
    (skip,) = skips
    assert skip.field == "spec.address" and reason in skip.reason


@pytest.mark.parametrize(
    ("weight", "capacity", "reported"),
    [
        (None, 1, False),
        (0, 1, False),
        (7, 7, False),
        (-1, 1, True),
        ("3", 1, True),
        (True, 1, True),
        (2**32, 1, True),
        (2**32 - 1, 2**32 - 1, False),
    ],
)
def test_a_weight_above_zero_is_the_capacity(weight: Any, capacity: int, reported: bool) -> None:
    spec: dict[str, Any] = {"address": "198.18.20.7"}
    if weight is not None:
        spec["weight"] = weight
    workload, skips = translate(entry(**spec))
    assert workload is not None and workload.capacity == capacity
    assert [s.field for s in skips] == (["spec.weight"] if reported else [])


_values = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=80) | st.lists(st.integers(), max_size=2)
)


@settings(max_examples=300, deadline=None)
@given(address=_values, weight=_values)
def test_any_address_and_weight_give_a_workload_or_a_reason_never_an_error(address: object, weight: object) -> None:
    workload, skips = translate(entry(address=address, weight=weight))
    if workload is None:
        assert [s.field for s in skips][:1] == ["spec.address"]
    else:
        assert bool(workload.addresses) != bool(workload.hostname)
        assert 0 <= workload.capacity <= 0xFFFFFFFF
