"""WorkloadState: indexes, updates, the outbound decision (spec §6.3 minus waypoints) and inbound port mapping."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st
from workload_builders import VIP, VIP6, WEB_KEY, first, ip, pod, state_with, web_service

from ambit.errors import AmbitError
from ambit.model.identity import SpiffeId
from ambit.model.state import Destination, NoHealthyUpstreamError, Transport, WorkloadState
from ambit.model.workload import (
    HealthPolicy,
    HealthStatus,
    NetworkAddress,
    NetworkMode,
    PortMapping,
    Service,
    TunnelProtocol,
    Workload,
)

# Lookups.


def test_a_workload_is_found_by_uid_and_by_each_of_its_addresses() -> None:
    web = pod("web-0", "198.18.16.5", "fd00:18::5")
    state = state_with(web)
    assert state.find_workload(web.uid) is web
    assert state.find_workload_by_address("", ip("198.18.16.5")) is web
    assert state.find_workload_by_address("", ip("fd00:18::5")) is web
    assert state.find_workload("Kubernetes//Pod/apps/other") is None
    assert state.find_workload_by_address("", ip("198.18.16.6")) is None


def test_address_lookups_are_scoped_to_the_network() -> None:
    web = pod("web-0", "198.18.16.5", network="net-a")
    state = state_with(web)
    assert state.find_workload_by_address("net-a", ip("198.18.16.5")) is web
    assert state.find_workload_by_address("", ip("198.18.16.5")) is None
    assert state.find_workload_by_address("net-b", ip("198.18.16.5")) is None


def test_a_service_is_found_by_each_vip_in_its_network_and_by_hostname() -> None:
    service = web_service(vips=(NetworkAddress("", VIP), NetworkAddress("net-b", ip("198.19.0.11"))))
    state = state_with(services=[service])
    assert state.find_service_by_vip("", VIP) is service
    assert state.find_service_by_vip("net-b", ip("198.19.0.11")) is service
    assert state.find_service_by_vip("net-b", VIP) is None
    assert state.find_service_by_hostname("web.apps.svc.cluster.local") is service
    assert state.find_service_by_hostname("web.other.svc.cluster.local") is None


def test_endpoints_are_the_workloads_that_list_the_service_sorted_by_uid() -> None:
    b, a = pod("web-b", "198.18.16.6"), pod("web-a", "198.18.16.5")
    other = pod("db-0", "198.18.16.7", services={"apps/db.apps.svc.cluster.local": ()})
    state = state_with(b, other, a)
    assert state.find_endpoints(web_service()) == [a, b]
    assert state.find_endpoints(web_service(hostname="nothing.here")) == []


def test_workloads_and_identities_are_found_by_node() -> None:
    a = pod("web-a", "198.18.16.5")
    b = pod("web-b", "198.18.16.6", service_account="api")
    elsewhere = pod("web-c", "198.18.17.5", node="node2")
    state = state_with(b, a, elsewhere)
    assert state.find_workloads_on_node("node1") == [a, b]
    assert state.find_workloads_on_node("node3") == []
    assert state.find_identities_on_node("node1") == {
        SpiffeId("cluster.local", "apps", "web"),
        SpiffeId("cluster.local", "apps", "api"),
    }
    assert state.find_identities_on_node("node3") == frozenset()


def test_workloads_without_a_node_are_not_indexed_under_the_empty_node() -> None:
    state = state_with(pod("web-a", "198.18.16.5", node=""))
    assert state.find_workloads_on_node("") == []


def test_listings_are_sorted_for_config_dumps() -> None:
    b, a = pod("web-b", "198.18.16.6"), pod("web-a", "198.18.16.5")
    db = web_service(name="db", hostname="db.apps.svc.cluster.local", vips=())
    state = state_with(b, a, services=[web_service(), db])
    assert state.workloads() == [a, b]
    assert [s.key for s in state.services()] == ["apps/db.apps.svc.cluster.local", WEB_KEY]


# Updates.


def test_upserting_a_workload_with_new_addresses_drops_the_old_index_entries() -> None:
    state = state_with(pod("web-0", "198.18.16.5"))
    moved = pod("web-0", "198.18.16.9", node="node2", services={"apps/other.apps.svc.cluster.local": ()})
    state.upsert_workload(moved)
    assert state.find_workload(moved.uid) is moved
    assert state.find_workload_by_address("", ip("198.18.16.5")) is None
    assert state.find_workload_by_address("", ip("198.18.16.9")) is moved
    assert state.find_workloads_on_node("node1") == []
    assert state.find_workloads_on_node("node2") == [moved]
    assert state.find_endpoints(web_service()) == []
    assert state.workloads() == [moved]


def test_removing_a_workload_forgets_it_everywhere() -> None:
    web = pod("web-0", "198.18.16.5")
    state = state_with(web)
    assert state.remove_workload(web.uid) is True
    assert state.find_workload(web.uid) is None
    assert state.find_workload_by_address("", ip("198.18.16.5")) is None
    assert state.find_endpoints(web_service()) == []
    assert state.find_workloads_on_node("node1") == []
    assert state.remove_workload(web.uid) is False


def test_a_shared_address_answers_with_the_newest_workload_until_it_is_removed() -> None:
    old, new = pod("old", "198.18.16.5"), pod("new", "198.18.16.5")
    state = state_with(old, new)
    assert state.find_workload_by_address("", ip("198.18.16.5")) is new
    state.remove_workload(new.uid)
    assert state.find_workload_by_address("", ip("198.18.16.5")) is old


def test_host_network_workloads_are_not_indexed_by_address_but_found_otherwise() -> None:
    node_ip = "198.18.0.11"
    exporter = pod("exporter", node_ip, network_mode=NetworkMode.HOST_NETWORK)
    agent = pod("agent", node_ip, network_mode=NetworkMode.HOST_NETWORK)
    web = pod("web-0", "198.18.16.5")
    state = state_with(exporter, agent, web)
    assert state.find_workload_by_address("", ip(node_ip)) is None, "the node's IP must not map to any one of them"
    assert state.find_workload(exporter.uid) is exporter
    assert state.find_workloads_on_node("node1") == [agent, exporter, web]
    assert state.find_endpoints(web_service()) == [agent, exporter, web]
    # A workload that moves from its own namespace to the host network leaves the address index, and back.
    state.upsert_workload(dataclasses.replace(web, network_mode=NetworkMode.HOST_NETWORK))
    assert state.find_workload_by_address("", ip("198.18.16.5")) is None
    state.upsert_workload(web)
    assert state.find_workload_by_address("", ip("198.18.16.5")) is web
    # An outbound connection to the node's IP is not mistaken for one of them: it passes through.
    assert state.resolve("", ip(node_ip), 9100, first).transport is Transport.PASSTHROUGH


def test_upserting_a_service_with_new_vips_drops_the_old_ones() -> None:
    state = state_with()
    moved = web_service(vips=(NetworkAddress("", ip("198.19.0.20")),))
    state.upsert_service(moved)
    assert state.find_service_by_vip("", VIP) is None
    assert state.find_service_by_vip("", VIP6) is None
    assert state.find_service_by_vip("", ip("198.19.0.20")) is moved
    assert state.find_service_by_hostname("web.apps.svc.cluster.local") is moved
    assert state.services() == [moved]


def test_removing_a_service_forgets_its_vips_and_hostname() -> None:
    state = state_with()
    assert state.remove_service(WEB_KEY) is True
    assert state.find_service_by_vip("", VIP) is None
    assert state.find_service_by_hostname("web.apps.svc.cluster.local") is None
    assert state.services() == []
    assert state.remove_service(WEB_KEY) is False


def test_a_shared_hostname_answers_with_the_oldest_service_even_after_it_is_updated() -> None:
    first_service = web_service()
    second = web_service(namespace="other", vips=())
    state = state_with(services=[first_service, second])
    updated = web_service(ports=())
    state.upsert_service(updated)
    assert state.find_service_by_hostname("web.apps.svc.cluster.local") is updated
    assert state.find_services_by_hostname("web.apps.svc.cluster.local") == [updated, second]
    state.remove_service(WEB_KEY)
    assert state.find_service_by_hostname("web.apps.svc.cluster.local") is second
    assert state.find_services_by_hostname("web.apps.svc.cluster.local") == [second]
    assert state.find_services_by_hostname("nothing.example") == []


def test_replace_all_forgets_what_was_there_before() -> None:
    state = state_with(pod("web-0", "198.18.16.5"))
    state.replace_all([pod("web-1", "198.18.16.6")], [])
    assert state.find_workload_by_address("", ip("198.18.16.5")) is None
    assert state.find_service_by_vip("", VIP) is None
    assert [w.name for w in state.workloads()] == ["web-1"]


# resolve(): service VIPs.


def test_a_vip_goes_to_an_endpoint_on_the_service_target_port_over_hbone() -> None:
    web = pod("web-0", "198.18.16.5")
    state = state_with(web)
    destination = state.resolve("", VIP, 80, first)
    assert destination == Destination(ip("198.18.16.5"), 8080, Transport.HBONE, web, web_service())
    assert destination.expected_identities == {SpiffeId("cluster.local", "apps", "web")}


def test_a_vip_endpoint_without_hbone_is_dialled_in_plaintext() -> None:
    state = state_with(pod("web-0", "198.18.16.5", tunnel_protocol=TunnelProtocol.NONE))
    assert state.resolve("", VIP, 80, first).transport is Transport.PLAINTEXT


def test_a_named_target_port_is_resolved_from_the_endpoint_mapping() -> None:
    a = pod("web-a", "198.18.16.5", services={WEB_KEY: (PortMapping(9090, 7001),)})
    b = pod("web-b", "198.18.16.6", services={WEB_KEY: (PortMapping(9090, 7002),)})
    state = state_with(a, b)
    assert state.resolve("", VIP, 9090, first).port == 7001
    assert state.resolve("", VIP, 9090, lambda c: c[1]).port == 7002


def test_the_endpoint_mapping_wins_over_the_service_target_port() -> None:
    state = state_with(pod("web-0", "198.18.16.5", services={WEB_KEY: (PortMapping(80, 8888),)}))
    assert state.resolve("", VIP, 80, first).port == 8888


def test_a_zero_endpoint_mapping_falls_back_to_the_service_target_port() -> None:
    state = state_with(pod("web-0", "198.18.16.5", services={WEB_KEY: (PortMapping(80, 0),)}))
    assert state.resolve("", VIP, 80, first).port == 8080


def test_a_named_port_the_endpoint_does_not_map_goes_to_the_service_port_itself() -> None:
    state = state_with(pod("web-0", "198.18.16.5"))
    assert state.resolve("", VIP, 9090, first).port == 9090


def test_a_port_the_service_does_not_declare_goes_to_the_same_port_on_the_endpoint() -> None:
    state = state_with(pod("web-0", "198.18.16.5"))
    assert state.resolve("", VIP, 5000, first).port == 5000


def test_unhealthy_endpoints_are_not_candidates() -> None:
    sick = pod("web-a", "198.18.16.5", status=HealthStatus.UNHEALTHY)
    well = pod("web-b", "198.18.16.6")
    seen: list[Sequence[Workload]] = []

    def choose(candidates: Sequence[Workload]) -> Workload:
        seen.append(candidates)
        return candidates[0]

    state = state_with(sick, well)
    assert state.resolve("", VIP, 80, choose).workload is well
    assert seen == [[well]]


def test_allow_all_keeps_unhealthy_endpoints_as_candidates() -> None:
    sick = pod("web-a", "198.18.16.5", status=HealthStatus.UNHEALTHY)
    state = state_with(sick, services=[web_service(health_policy=HealthPolicy.ALLOW_ALL)])
    assert state.resolve("", VIP, 80, first).workload is sick


def test_endpoints_without_an_address_are_not_candidates() -> None:
    state = state_with(pod("web-a"), pod("web-b", "198.18.16.6"))
    assert state.resolve("", VIP, 80, first).ip == ip("198.18.16.6")


def test_candidates_are_offered_to_choose_sorted_by_uid() -> None:
    c, a, b = pod("web-c", "198.18.16.7"), pod("web-a", "198.18.16.5"), pod("web-b", "198.18.16.6")
    state = state_with(c, a, b)
    assert state.resolve("", VIP, 80, lambda candidates: candidates[-1]).workload is c


def test_a_service_without_endpoints_has_no_healthy_upstream_and_the_error_names_it() -> None:
    state = state_with(pod("db-0", "198.18.16.7", services={}))
    with pytest.raises(NoHealthyUpstreamError, match=WEB_KEY):
        state.resolve("", VIP, 80, first)
    assert issubclass(NoHealthyUpstreamError, AmbitError)


def test_a_service_whose_endpoints_are_all_unhealthy_has_no_healthy_upstream() -> None:
    state = state_with(pod("web-0", "198.18.16.5", status=HealthStatus.UNHEALTHY))
    with pytest.raises(NoHealthyUpstreamError):
        state.resolve("", VIP, 80, first)


def test_the_endpoint_address_matches_the_family_of_the_vip() -> None:
    state = state_with(pod("web-0", "198.18.16.5", "fd00:18::5"))
    assert state.resolve("", VIP, 80, first).ip == ip("198.18.16.5")
    assert state.resolve("", VIP6, 80, first).ip == ip("fd00:18::5")


def test_a_single_stack_endpoint_is_dialled_on_its_own_family() -> None:
    state = state_with(pod("web-0", "198.18.16.5"))
    assert state.resolve("", VIP6, 80, first).ip == ip("198.18.16.5")


def test_a_vip_that_is_also_a_workload_address_resolves_as_the_service() -> None:
    state = state_with(pod("web-0", "198.18.16.5"), pod("squatter", str(VIP), services={}))
    assert state.resolve("", VIP, 80, first).service == web_service()


# resolve(): workload addresses and unknown addresses.


def test_a_workload_address_goes_to_that_workload_on_the_same_port() -> None:
    web = pod("web-0", "198.18.16.5")
    state = state_with(web)
    destination = state.resolve("", ip("198.18.16.5"), 8080, first)
    assert destination == Destination(ip("198.18.16.5"), 8080, Transport.HBONE, web, None)


def test_a_workload_address_without_hbone_is_plaintext() -> None:
    state = state_with(pod("web-0", "198.18.16.5", tunnel_protocol=TunnelProtocol.NONE))
    assert state.resolve("", ip("198.18.16.5"), 80, first).transport is Transport.PLAINTEXT


def test_an_unhealthy_workload_addressed_directly_is_still_dialled() -> None:
    sick = pod("web-0", "198.18.16.5", status=HealthStatus.UNHEALTHY)
    state = state_with(sick)
    assert state.resolve("", ip("198.18.16.5"), 80, first).workload is sick


def test_an_unknown_address_is_passthrough_with_no_expected_identity() -> None:
    state = state_with(pod("web-0", "198.18.16.5"))
    destination = state.resolve("", ip("203.0.113.7"), 443, first)
    assert destination == Destination(ip("203.0.113.7"), 443, Transport.PASSTHROUGH, None, None)
    assert destination.expected_identities == frozenset()


def test_a_vip_in_another_network_is_passthrough() -> None:
    state = state_with(pod("web-0", "198.18.16.5"))
    assert state.resolve("net-b", VIP, 80, first).transport is Transport.PASSTHROUGH


def test_choose_is_not_called_when_the_destination_is_not_a_service() -> None:
    def refuse(candidates: Sequence[Workload]) -> Workload:
        raise AssertionError("choose called")

    state = state_with(pod("web-0", "198.18.16.5"))
    state.resolve("", ip("198.18.16.5"), 80, refuse)
    state.resolve("", ip("203.0.113.7"), 80, refuse)


# Expected identities.


def test_service_sans_are_accepted_besides_the_workload_identity_and_bad_ones_ignored() -> None:
    sans = ("spiffe://cluster.local/ns/apps/sa/override", "not a spiffe id")
    state = state_with(pod("web-0", "198.18.16.5"), services=[web_service(subject_alt_names=sans)])
    assert state.resolve("", VIP, 80, first).expected_identities == {
        SpiffeId("cluster.local", "apps", "web"),
        SpiffeId("cluster.local", "apps", "override"),
    }


def test_a_workload_in_another_trust_domain_is_expected_with_that_trust_domain() -> None:
    state = state_with(pod("web-0", "198.18.16.5", trust_domain="other.td"))
    assert state.resolve("", VIP, 80, first).expected_identities == {SpiffeId("other.td", "apps", "web")}


# resolve_inbound_target().


def test_an_inbound_service_hostname_maps_the_service_port_to_the_local_target_port() -> None:
    local = pod("web-0", "198.18.16.5", services={WEB_KEY: (PortMapping(9090, 7001),)})
    state = state_with(local)
    assert state.resolve_inbound_target(local, "web.apps.svc.cluster.local", 80) == 8080
    assert state.resolve_inbound_target(local, "web.apps.svc.cluster.local", 9090) == 7001
    assert state.resolve_inbound_target(local, "web.apps.svc.cluster.local", 5000) == 5000


def test_an_inbound_unknown_hostname_maps_to_nothing() -> None:
    local = pod("web-0", "198.18.16.5")
    assert state_with(local).resolve_inbound_target(local, "nope.apps.svc.cluster.local", 80) is None


def test_an_inbound_hostname_of_a_service_the_local_workload_is_not_in_maps_to_nothing() -> None:
    local = pod("db-0", "198.18.16.7", services={})
    assert state_with(local).resolve_inbound_target(local, "web.apps.svc.cluster.local", 80) is None


def test_an_inbound_hostname_shared_by_two_services_uses_the_one_the_workload_is_in() -> None:
    other = web_service(namespace="other", vips=(), ports=(PortMapping(80, 6000),))
    local = pod("web-0", "198.18.16.5", services={other.key: ()})
    state = state_with(local, services=[web_service(), other])
    assert state.resolve_inbound_target(local, "web.apps.svc.cluster.local", 80) == 6000


# Dumps.


def test_the_dump_is_json_and_lists_everything_in_the_local_config_shape() -> None:
    web = pod("web-0", "198.18.16.5", services={WEB_KEY: (PortMapping(9090, 7001),)})
    dump = state_with(web).to_dump()
    assert json.loads(json.dumps(dump)) == dump
    assert dump["workloads"][0]["uid"] == web.uid
    assert dump["workloads"][0]["workloadIps"] == ["198.18.16.5"]
    assert dump["workloads"][0]["protocol"] == "HBONE"
    assert dump["workloads"][0]["services"] == {WEB_KEY: {"9090": 7001}}
    assert dump["services"][0]["vips"] == ["/198.19.0.10", "/fd00:19::10"]
    assert dump["services"][0]["ports"] == {"80": 8080, "9090": 0}


def test_an_empty_state_dumps_empty_lists() -> None:
    assert WorkloadState().to_dump() == {"workloads": [], "services": []}


# Index consistency under random updates.

_ADDRESSES = [ip(f"198.18.16.{n}") for n in range(1, 5)] + [ip("fd00:18::1")]
_KEYS = [WEB_KEY, "apps/db.apps.svc.cluster.local"]
_workloads = st.builds(
    lambda n, addresses, node, keys: pod(f"w{n}", *map(str, addresses), node=node, services={key: () for key in keys}),
    st.integers(0, 3),
    st.lists(st.sampled_from(_ADDRESSES), max_size=3, unique=True),
    st.sampled_from(["", "node1", "node2"]),
    st.lists(st.sampled_from(_KEYS), max_size=2, unique=True),
)
_operations = st.lists(st.one_of(_workloads, st.integers(0, 3).map(lambda n: f"Kubernetes//Pod/apps/w{n}")))


@given(_operations)
def test_indexes_agree_with_a_scan_after_any_sequence_of_upserts_and_removals(operations: list[object]) -> None:
    state = WorkloadState()
    for operation in operations:
        if isinstance(operation, Workload):
            state.upsert_workload(operation)
        else:
            assert isinstance(operation, str)
            state.remove_workload(operation)
    live = state.workloads()
    for address in _ADDRESSES:
        holders = [w for w in live if address in w.addresses]
        found = state.find_workload_by_address("", address)
        assert (found is None) == (not holders)
        assert found is None or found in holders
    for key in _KEYS:
        namespace, _, hostname = key.partition("/")
        service = Service("svc", namespace, hostname)
        assert state.find_endpoints(service) == [w for w in live if key in w.services]
    for node in ["node1", "node2"]:
        assert state.find_workloads_on_node(node) == [w for w in live if w.node == node]
    for workload in live:
        assert state.find_workload(workload.uid) is workload
