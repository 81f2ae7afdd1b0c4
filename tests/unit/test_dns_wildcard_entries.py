"""What the DNS proxy answers for a wildcard ServiceEntry host with resolution DYNAMIC_DNS (spec §9; istiod's
``keepHost`` and ``constructServiceEntries``, ztunnel's wildcard lookup): every name under the wildcard, at any
depth and through the pod's search path, is the wildcard's allocated addresses (A and AAAA); the wildcard's own
parent and names elsewhere are not the mesh's. The path is the real one: the entry, its allocated status, the
translation, the workload state, then both ways of answering."""

from __future__ import annotations

from typing import Any

import dns.flags
import dns.message
import pytest

from ambit.controlplane.translate import translate
from ambit.controlplane.translate.autoallocate import AddressAllocator, plan_addresses
from ambit.dns.answer import Answered, DnsClient, Forward, decide
from ambit.dns.fastpath import AnswerCache
from ambit.model.state import WorkloadState

CLIENT = DnsClient("apps")


def dynamic_entry(*hosts: str, namespace: str = "apps", **spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {
            "name": "external-wildcard",
            "namespace": namespace,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"istio.io/use-waypoint": "egress"},
        },
        "spec": {
            "hosts": list(hosts),
            "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
            "location": "MESH_EXTERNAL",
            "resolution": "DYNAMIC_DNS",
            **spec,
        },
    }
    allocator = AddressAllocator()
    allocator.warm([obj])
    obj["status"] = {"addresses": plan_addresses(obj, allocator)}
    return obj


def mesh_of(*entries: dict[str, Any]) -> WorkloadState:
    config = translate([], [], [], [], service_entries=list(entries))
    state = WorkloadState()
    state.replace_all(config.workloads, config.services)
    return state


def answers(state: WorkloadState, host: str, rdtype: str = "A") -> list[str] | None:
    """The records the dnspython way gives and the fast path gives again (the same, checked), or ``None`` when the
    name is forwarded."""
    query = dns.message.make_query(host, rdtype)
    decision = decide(state, CLIENT, query)
    cache = AnswerCache(state, domain=("cluster", "local"), ipv6=True)
    if isinstance(decision, Forward):
        return None
    assert isinstance(decision, Answered) and decision.response.flags & dns.flags.AA
    slow = sorted(f"{r.name} {r.rdtype.name} {d}" for r in decision.response.answer for d in r)
    cache.remember(CLIENT, query.to_wire(), decision.response, decision.endpoints)
    query.id ^= 0x5A5A
    fast = cache.answer(CLIENT, query.to_wire(), udp=True)  # the same question again
    assert fast is not None
    fast_message = dns.message.from_wire(fast[0])
    assert sorted(f"{r.name} {r.rdtype.name} {d}" for r in fast_message.answer for d in r) == slow
    return slow


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("api.example.com.", ["api.example.com. A 240.240.0.1"]),
        ("a.b.c.example.com.", ["a.b.c.example.com. A 240.240.0.1"]),
        ("API.Example.COM.", ["API.Example.COM. A 240.240.0.1"]),
        # The resolver's first try with ndots:5: the wildcard matches the stripped name, no CNAME (ztunnel).
        ("api.example.com.apps.svc.cluster.local.", ["api.example.com.apps.svc.cluster.local. A 240.240.0.1"]),
    ],
)
def test_every_name_under_the_wildcard_is_its_allocated_address(host: str, expected: list[str]) -> None:
    assert answers(mesh_of(dynamic_entry("*.example.com")), host) == expected


def test_aaaa_is_the_allocated_ipv6_address() -> None:
    assert answers(mesh_of(dynamic_entry("*.example.com")), "api.example.com.", "AAAA") == [
        "api.example.com. AAAA 2001:2::1"
    ]


@pytest.mark.parametrize("host", ["example.com.", "api.example.org.", "example.com.evil.net.", "com."])
def test_the_wildcards_parent_and_other_names_are_forwarded(host: str) -> None:
    assert answers(mesh_of(dynamic_entry("*.example.com")), host) is None


def test_a_more_specific_host_wins_over_the_wildcard() -> None:
    exact = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": "api", "namespace": "apps"},
        "spec": {"hosts": ["api.example.com"], "addresses": ["198.19.40.1"], "resolution": "NONE"},
    }
    deeper = dynamic_entry("*.api.example.com", namespace="other")
    deeper["status"] = {"addresses": [{"value": "240.240.0.7", "host": "*.api.example.com"}]}
    state = mesh_of(dynamic_entry("*.example.com"), exact, deeper)
    assert answers(state, "api.example.com.") == ["api.example.com. A 198.19.40.1"]
    assert answers(state, "www.example.com.") == ["www.example.com. A 240.240.0.1"]
    assert answers(state, "v1.api.example.com.") == ["v1.api.example.com. A 240.240.0.7"]


def test_a_wildcard_entry_that_cannot_resolve_is_not_answered() -> None:
    """Without DYNAMIC_DNS (and without addresses and endpoints) a wildcard host is no Service: forwarded."""
    entry = dynamic_entry("*.example.com")
    entry["spec"]["resolution"] = "DNS"
    del entry["status"]
    assert answers(mesh_of(entry), "api.example.com.") is None


def test_a_wildcard_entry_exported_to_its_namespace_is_not_answered_elsewhere() -> None:
    state = mesh_of(dynamic_entry("*.example.com", namespace="egress", exportTo=["."]))
    assert answers(state, "api.example.com.") is None
    query = dns.message.make_query("api.example.com.", "A")
    decision = decide(state, DnsClient("egress"), query)
    assert isinstance(decision, Answered) and decision.response.answer
