"""The lab load balancer's plan: which LoadBalancer Service holds which address of the lab range."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.lab.controllers.loadbalancer import plan_addresses

CIDR = "198.18.0.224/29"  # hosts .225-.230


def svc(
    name: str, kind: str = "LoadBalancer", *, created: str = "2026-01-01T00:00:00Z", ip: str | None = None, **spec: Any
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"namespace": "app", "name": name, "creationTimestamp": created},
        "spec": {"type": kind, **spec},
    }
    if ip is not None:
        obj["status"] = {"loadBalancer": {"ingress": [{"ip": ip}]}}
    return obj


def test_load_balancer_services_get_the_lowest_free_addresses_and_others_none() -> None:
    plan = plan_addresses([svc("a"), svc("b"), svc("c", "ClusterIP")], CIDR)
    assert plan == {("app", "a"): "198.18.0.225", ("app", "b"): "198.18.0.226", ("app", "c"): None}


def test_an_address_already_held_is_kept_and_the_older_service_wins_a_clash() -> None:
    old = svc("old", created="2026-01-01T00:00:00Z", ip="198.18.0.228")
    new = svc("new", created="2026-02-01T00:00:00Z", ip="198.18.0.228")
    plan = plan_addresses([new, old], CIDR)
    assert plan[("app", "old")] == "198.18.0.228"
    assert plan[("app", "new")] == "198.18.0.225"


def test_an_address_outside_the_range_or_the_broadcast_is_not_kept() -> None:
    plan = plan_addresses([svc("x", ip="198.18.0.1"), svc("y", ip="198.18.0.231")], CIDR)
    assert plan == {("app", "x"): "198.18.0.225", ("app", "y"): "198.18.0.226"}


def test_a_requested_free_address_is_honoured() -> None:
    assert plan_addresses([svc("a", loadBalancerIP="198.18.0.229")], CIDR) == {("app", "a"): "198.18.0.229"}


def test_a_full_range_leaves_the_rest_pending_and_a_deleting_service_frees_its_address() -> None:
    services = [svc(f"s{i}", created=f"2026-01-0{i + 1}T00:00:00Z") for i in range(8)]
    plan = plan_addresses(services, CIDR)
    assert [plan[("app", f"s{i}")] for i in range(8)][-2:] == [None, None]
    gone = svc("gone", ip="198.18.0.225")
    gone["metadata"]["deletionTimestamp"] = "2026-03-01T00:00:00Z"
    assert plan_addresses([gone, svc("next")], CIDR)[("app", "next")] == "198.18.0.225"


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["LoadBalancer", "ClusterIP", None]),
            st.one_of(st.none(), st.sampled_from(["198.18.0.225", "198.18.0.226", "x", "198.18.0.1"])),
        ),
        max_size=10,
    )
)
def test_no_two_services_ever_hold_one_address(items: list[tuple[Any, Any]]) -> None:
    services = [svc(f"s{i}", kind or "", ip=ip) for i, (kind, ip) in enumerate(items)]
    held = [ip for ip in plan_addresses(services, CIDR).values() if ip is not None]
    assert len(held) == len(set(held))
