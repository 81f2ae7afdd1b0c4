"""WorkloadState and waypoints (spec §1.4, §4.1 ``GatewayAddress``; the rules 5-8 of :mod:`ambit.model.state`):
what a waypoint's address names, which instance a connection goes to, and what identity it must present."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence

import pytest
from workload_builders import (
    WAYPOINT_BY_HOST,
    WAYPOINT_KEY,
    WAYPOINT_VIP,
    WAYPOINT_VIP6,
    by_address,
    first,
    ip,
    pod,
    state_with,
    waypoint_pod,
    waypoint_service,
    web_service,
)

from ambit.model.identity import SpiffeId
from ambit.model.state import Transport, UnknownWaypointError, WorkloadState
from ambit.model.workload import (
    GatewayAddress,
    HealthPolicy,
    HealthStatus,
    NamespacedHostname,
    PortMapping,
    Service,
    Workload,
)

WAYPOINT = waypoint_pod()
WAYPOINT_ID = SpiffeId("cluster.local", "apps", "waypoint")
ORIGINAL = ip("198.19.0.10")  # the web service's VIP, the connection's original destination
ORIGINAL6 = ip("fd00:19::10")


def state(*workloads: Workload, services: Sequence[Service] | None = None) -> WorkloadState:
    return state_with(*workloads, services=[web_service(), waypoint_service()] if services is None else services)


# What a GatewayAddress names (rule 5).


def test_a_hostname_names_the_service_of_exactly_that_namespace_and_hostname() -> None:
    st = state(WAYPOINT)
    assert st.find_gateway(WAYPOINT_BY_HOST) == waypoint_service()
    elsewhere = GatewayAddress(NamespacedHostname("other", "waypoint.apps.svc.cluster.local"))
    assert st.find_gateway(elsewhere) is None


def test_an_address_names_the_workload_there_before_a_service_with_that_vip() -> None:
    st = state(WAYPOINT)
    assert st.find_gateway(by_address("198.18.18.7")) == WAYPOINT
    assert st.find_gateway(by_address(str(WAYPOINT_VIP))) == waypoint_service()
    assert st.find_gateway(by_address("198.18.99.99")) is None


def test_the_instances_of_a_waypoint_are_its_services_endpoints_whatever_their_health() -> None:
    sick = waypoint_pod("waypoint-1", "198.18.18.8", status=HealthStatus.UNHEALTHY)
    st = state(WAYPOINT, sick)
    assert st.find_waypoint_instances(WAYPOINT_BY_HOST) == [WAYPOINT, sick]
    assert st.find_waypoint_instances(by_address("198.18.18.8")) == [sick]
    assert st.find_waypoint_instances(GatewayAddress(NamespacedHostname("apps", "nope"))) == []


# Resolving a waypoint named by hostname (rule 6).


def test_a_hostname_resolves_to_an_instances_pod_ip_on_the_services_hbone_target_port() -> None:
    target = state(WAYPOINT).resolve_waypoint(WAYPOINT_BY_HOST, "", ORIGINAL, first)
    assert (target.ip, target.port, target.transport) == (ip("198.18.18.7"), 15008, Transport.HBONE)
    assert target.workload == WAYPOINT and target.service == waypoint_service()
    assert target.expected_identities == frozenset({WAYPOINT_ID})


def test_the_instances_own_port_mapping_wins_over_the_services_target_port() -> None:
    mapped = waypoint_pod(services={WAYPOINT_KEY: (PortMapping(15008, 15555),)})
    target = state(mapped).resolve_waypoint(WAYPOINT_BY_HOST, "", ORIGINAL, first)
    assert target.port == 15555


def test_a_waypoint_service_that_does_not_declare_the_hbone_port_does_not_resolve() -> None:
    st = state(WAYPOINT, services=[web_service(), waypoint_service(ports=(PortMapping(80, 8080),))])
    with pytest.raises(UnknownWaypointError, match="no healthy instance with port 15008"):
        st.resolve_waypoint(WAYPOINT_BY_HOST, "", ORIGINAL, first)


def test_a_named_hbone_port_that_no_instance_maps_does_not_resolve() -> None:
    st = state(WAYPOINT, services=[web_service(), waypoint_service(ports=(PortMapping(15008, 0),))])
    with pytest.raises(UnknownWaypointError):
        st.resolve_waypoint(WAYPOINT_BY_HOST, "", ORIGINAL, first)


def test_unhealthy_instances_and_instances_of_other_networks_are_not_picked() -> None:
    sick = waypoint_pod("waypoint-0", status=HealthStatus.UNHEALTHY)
    remote = waypoint_pod("waypoint-1", "198.18.18.8", network="net-b")
    well = waypoint_pod("waypoint-2", "198.18.18.9")
    seen: list[Sequence[Workload]] = []

    def choose(candidates: Sequence[Workload]) -> Workload:
        seen.append(candidates)
        return candidates[-1]

    target = state(sick, remote, well).resolve_waypoint(WAYPOINT_BY_HOST, "", ORIGINAL, choose)
    assert seen == [[well]] and target.workload == well and target.ip == ip("198.18.18.9")


def test_a_waypoint_service_that_allows_all_may_pick_an_unhealthy_instance() -> None:
    sick = waypoint_pod(status=HealthStatus.UNHEALTHY)
    services = [web_service(), waypoint_service(health_policy=HealthPolicy.ALLOW_ALL)]
    assert state(sick, services=services).resolve_waypoint(WAYPOINT_BY_HOST, "", ORIGINAL, first).workload == sick


def test_a_waypoint_whose_instances_are_all_down_does_not_resolve() -> None:
    with pytest.raises(UnknownWaypointError):
        state(waypoint_pod(status=HealthStatus.UNHEALTHY)).resolve_waypoint(WAYPOINT_BY_HOST, "", ORIGINAL, first)
    with pytest.raises(UnknownWaypointError):
        state().resolve_waypoint(WAYPOINT_BY_HOST, "", ORIGINAL, first)


def test_an_unknown_waypoint_hostname_does_not_resolve_and_the_error_names_it() -> None:
    missing = GatewayAddress(NamespacedHostname("apps", "gone.apps.svc.cluster.local"))
    with pytest.raises(UnknownWaypointError, match=re.escape("apps/gone.apps.svc.cluster.local:15008 not found")):
        state(WAYPOINT).resolve_waypoint(missing, "", ORIGINAL, first)


def test_the_instance_address_follows_the_original_destinations_family() -> None:
    dual = waypoint_pod("waypoint-0", "198.18.18.7", "fd00:18::7")
    target = state(dual).resolve_waypoint(WAYPOINT_BY_HOST, "", ORIGINAL6, first)
    assert target.ip == ip("fd00:18::7")


def test_the_waypoint_services_subject_alt_names_are_expected_too() -> None:
    extra = "spiffe://cluster.local/ns/apps/sa/waypoint-canary"
    services = [web_service(), waypoint_service(subject_alt_names=(extra,))]
    target = state(WAYPOINT, services=services).resolve_waypoint(WAYPOINT_BY_HOST, "", ORIGINAL, first)
    assert target.expected_identities == frozenset({WAYPOINT_ID, SpiffeId.parse(extra)})


def test_the_target_services_subject_alt_names_are_not_the_waypoints() -> None:
    services = [web_service(subject_alt_names=("spiffe://cluster.local/ns/apps/sa/web",)), waypoint_service()]
    target = state(WAYPOINT, services=services).resolve_waypoint(WAYPOINT_BY_HOST, "", ORIGINAL, first)
    assert target.expected_identities == frozenset({WAYPOINT_ID})


# Resolving a waypoint named by address.


def test_a_pod_address_resolves_to_that_address_on_the_gateways_hbone_port() -> None:
    target = state(WAYPOINT).resolve_waypoint(by_address("198.18.18.7", 15099), "", ORIGINAL6, first)
    assert (target.ip, target.port) == (ip("198.18.18.7"), 15099)
    assert target.workload == WAYPOINT and target.service is None
    assert target.expected_identities == frozenset({WAYPOINT_ID})


def test_a_vip_address_resolves_to_an_instance_of_the_vips_family() -> None:
    dual = waypoint_pod("waypoint-0", "198.18.18.7", "fd00:18::7")
    target = state(dual).resolve_waypoint(by_address(str(WAYPOINT_VIP6)), "", ORIGINAL, first)
    assert target.ip == ip("fd00:18::7") and target.service == waypoint_service()


def test_an_address_nothing_has_does_not_resolve() -> None:
    with pytest.raises(UnknownWaypointError, match="not found"):
        state(WAYPOINT).resolve_waypoint(by_address("198.18.99.99"), "", ORIGINAL, first)


def test_a_waypoint_workload_on_another_network_does_not_resolve() -> None:
    remote = waypoint_pod(network="net-b")
    gateway = GatewayAddress(dataclasses.replace(by_address("198.18.18.7").destination, network="net-b"))
    with pytest.raises(UnknownWaypointError, match="network"):
        state(remote).resolve_waypoint(gateway, "", ORIGINAL, first)


def test_a_waypoint_is_never_the_plain_resolve_of_its_service() -> None:
    # resolve() of the target VIP is unchanged by a waypoint: steering is the plans' decision, not the index's.
    web = pod("web-0", "198.18.17.5")
    st = state(web, WAYPOINT, services=[web_service(waypoint=WAYPOINT_BY_HOST), waypoint_service()])
    assert st.resolve("", ORIGINAL, 80, first).workload == web


# The config dump shows the waypoint fields.


def test_the_config_dump_shows_the_waypoint_of_services_and_workloads() -> None:
    web = pod("web-0", "198.18.17.5", waypoint=by_address("198.18.18.7"))
    st = state(web, WAYPOINT, services=[web_service(waypoint=WAYPOINT_BY_HOST), waypoint_service()])
    dump = json.loads(json.dumps(st.to_dump()))
    services = {service["name"]: service for service in dump["services"]}
    workloads = {workload["name"]: workload for workload in dump["workloads"]}
    assert services["web"]["waypoint"] == {
        "hostname": "waypoint.apps.svc.cluster.local",
        "namespace": "apps",
        "hboneMtlsPort": 15008,
    }
    assert workloads["web-0"]["waypoint"] == {"address": "/198.18.18.7", "hboneMtlsPort": 15008}
    assert "waypoint" not in services["waypoint"] and "waypoint" not in workloads["waypoint-0"]
