"""ServiceEntry address auto-allocation (istiod's IP autoallocate controller): who gets addresses, stability across
restarts through ``status.addresses``, collisions, and the translation using them as VIPs."""

from __future__ import annotations

import ipaddress
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ambit.controlplane.translate import translate
from ambit.controlplane.translate.autoallocate import (
    AddressAllocator,
    auto_vips,
    plan_addresses,
    qualifies,
)


def entry(
    name: str,
    *hosts: str,
    resolution: str = "STATIC",
    created: str = "2026-01-01T00:00:00Z",
    status: list[dict[str, str]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": name, "namespace": "shop", "creationTimestamp": created},
        "spec": {"hosts": list(hosts), "resolution": resolution, "ports": [{"number": 80, "name": "http"}], **spec},
    }
    if status is not None:
        obj["status"] = {"addresses": status}
    return obj


def allocate(*entries: dict[str, Any]) -> tuple[AddressAllocator, list[list[dict[str, str]] | None]]:
    allocator = AddressAllocator()
    allocator.warm(entries)
    return allocator, [plan_addresses(e, allocator) for e in entries]


def test_an_entry_without_addresses_gets_one_v4_and_one_v6_per_host() -> None:
    _, [plan] = allocate(entry("api", "api.example.com", "www.example.com", "*.example.org"))
    assert plan == [
        {"value": "240.240.0.1", "host": "api.example.com"},
        {"value": "2001:2::1", "host": "api.example.com"},
        {"value": "240.240.0.2", "host": "www.example.com"},
        {"value": "2001:2::2", "host": "www.example.com"},
    ]


def test_who_qualifies() -> None:
    assert qualifies(entry("a", "a.example.com"))
    assert qualifies(entry("a", "a.example.com", resolution="DNS"))
    assert not qualifies(entry("a", "a.example.com", resolution="NONE"))
    assert not qualifies({"metadata": {"name": "a"}, "spec": {"hosts": ["a.example.com"]}})  # NONE by default
    assert not qualifies(entry("a", "a.example.com", addresses=["198.19.0.1"]))
    opted_out = entry("a", "a.example.com")
    opted_out["metadata"]["labels"] = {"networking.istio.io/enable-autoallocate-ip": "False"}
    assert not qualifies(opted_out)


def test_addresses_in_the_status_are_kept_across_a_restart() -> None:
    first = entry("api", "api.example.com")
    _, [plan] = allocate(first)
    assert plan is not None
    written = entry("api", "api.example.com", status=plan)
    newcomer = entry("new", "new.example.com", created="2026-02-01T00:00:00Z")
    _, plans = allocate(written, newcomer)  # a fresh allocator: a restarted control plane
    assert plans[0] is None
    assert plans[1] == [
        {"value": "240.240.0.2", "host": "new.example.com"},
        {"value": "2001:2::2", "host": "new.example.com"},
    ]


def test_an_address_two_entries_claim_stays_with_the_older_one() -> None:
    claimed = [{"value": "240.240.0.7", "host": "a.example.com"}, {"value": "2001:2::7", "host": "a.example.com"}]
    old = entry("old", "a.example.com", status=claimed)
    copy = entry("copy", "a.example.com", created="2026-03-01T00:00:00Z", status=claimed)
    _, plans = allocate(copy, old)
    assert plans[1] is None
    assert plans[0] == [
        {"value": "240.240.0.1", "host": "a.example.com"},
        {"value": "2001:2::1", "host": "a.example.com"},
    ]


def test_a_removed_host_loses_its_addresses_and_explicit_addresses_remove_them_all() -> None:
    status = [
        {"value": "240.240.0.1", "host": "a.example.com"},
        {"value": "2001:2::1", "host": "a.example.com"},
        {"value": "240.240.0.2", "host": "b.example.com"},
        {"value": "2001:2::2", "host": "b.example.com"},
    ]
    _, [plan] = allocate(entry("x", "a.example.com", status=status))
    assert plan == status[:2]
    _, [plan] = allocate(entry("x", "a.example.com", status=status, addresses=["198.19.0.1"]))
    assert plan == []


def test_an_address_is_not_handed_out_again_while_the_process_lives() -> None:
    allocator = AddressAllocator()
    gone = entry("gone", "gone.example.com")
    assert plan_addresses(gone, allocator) is not None
    allocator.warm([])
    plan = plan_addresses(entry("next", "next.example.com"), allocator)
    assert plan is not None and plan[0]["value"] == "240.240.0.2"


def test_the_translation_uses_the_allocated_addresses_as_vips() -> None:
    status = [{"value": "240.240.0.9", "host": "api.example.com"}, {"value": "2001:2::9", "host": "api.example.com"}]
    config = translate([], [], [], [], service_entries=[entry("api", "api.example.com", status=status)])
    [service] = config.services
    assert [str(v.ip) for v in service.vips] == ["240.240.0.9", "2001:2::9"]
    explicit = entry("api", "api.example.com", status=status, addresses=["198.19.0.1"])
    [service] = translate([], [], [], [], service_entries=[explicit]).services
    assert [str(v.ip) for v in service.vips] == ["198.19.0.1"]


address_values = st.one_of(
    st.text(max_size=20),
    st.integers(),
    st.none(),
    st.sampled_from(["240.240.0.1", "240.241.0.1", "2001:2::5", "::1", "240.240.255.255"]),
)


@given(
    st.lists(
        st.one_of(
            st.fixed_dictionaries({"value": address_values, "host": st.sampled_from(["a.example.com", "b", ""])}),
            st.text(max_size=5),
            st.integers(),
        ),
        max_size=6,
    )
)
def test_any_status_is_read_without_raising_and_planned_into_the_ranges(status: list[Any]) -> None:
    obj = entry("x", "a.example.com")
    obj["status"] = {"addresses": status}
    auto_vips(obj)
    _, [plan] = allocate(obj)
    for item in plan or ():
        ip = ipaddress.ip_address(item["value"])
        assert ip in ipaddress.ip_network("240.240.0.0/16") or ip in ipaddress.ip_network("2001:2::/48")


def test_a_wildcard_host_is_a_service_only_with_addresses_and_endpoints() -> None:
    wild = entry("wild", "*.wild.example", addresses=["198.19.12.1"], endpoints=[{"address": "198.18.204.3"}])
    [service] = translate([], [], [], [], service_entries=[wild]).services
    assert service.hostname == "*.wild.example"
    assert [str(v.ip) for v in service.vips] == ["198.19.12.1"]
    for spec in ({"addresses": ["198.19.12.1"]}, {"endpoints": [{"address": "198.18.204.3"}]}):
        assert translate([], [], [], [], service_entries=[entry("wild", "*.wild.example", **spec)]).services == ()
    _, [plan] = allocate(entry("wild", "*.wild.example", endpoints=[{"address": "198.18.204.3"}]))
    assert plan is None  # a wildcard host never gets an allocated address


def test_a_dynamic_dns_wildcard_host_gets_addresses_and_is_a_service_without_endpoints() -> None:
    """istiod's ``keepHost``: a wildcard host is allocated addresses only when the entry resolves by DYNAMIC_DNS;
    its Service has them as VIPs and no endpoint (an egress waypoint resolves each name)."""
    dynamic = entry("wild", "*.wild.example", "*.other.example", resolution="DYNAMIC_DNS")
    _, [plan] = allocate(dynamic)
    assert plan == [
        {"value": "240.240.0.1", "host": "*.wild.example"},
        {"value": "2001:2::1", "host": "*.wild.example"},
        {"value": "240.240.0.2", "host": "*.other.example"},
        {"value": "2001:2::2", "host": "*.other.example"},
    ]
    dynamic["status"] = {"addresses": plan}
    config = translate([], [], [], [], service_entries=[dynamic])
    assert {s.hostname: [str(v.ip) for v in s.vips] for s in config.services} == {
        "*.wild.example": ["240.240.0.1", "2001:2::1"],
        "*.other.example": ["240.240.0.2", "2001:2::2"],
    }
    assert config.workloads == ()
    for resolution in ("DNS", "STATIC", "NONE"):
        _, [other] = allocate(entry("wild", "*.wild.example", resolution=resolution))
        assert other is None
