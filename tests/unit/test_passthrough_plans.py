"""``resolution: NONE`` ServiceEntries: Services whose load balancing mode is PASSTHROUGH (spec §6.3 step 4). The
node proxy sends a connection to such a VIP with no endpoint to its original destination (ztunnel's rule); the
waypoint dials the VIP and port the CONNECT authority named (Envoy's ORIGINAL_DST), and never anything a client
could choose: an address that is not the Service's, a hostname, a header."""

from __future__ import annotations

import ipaddress

import pytest
from workload_builders import VIP, first, pod, state_with, web_service

from ambit.model.state import Transport, WorkloadState
from ambit.model.workload import (
    AppProtocol,
    GatewayAddress,
    HealthPolicy,
    LoadBalancingMode,
    NamespacedHostname,
    NetworkAddress,
    PortMapping,
    Service,
)
from ambit.proxy.errors import ResponseFlag
from ambit.proxy.plans import NodeView, OutboundFacts, Plain, Refuse, plan_outbound
from ambit.waypoint.destinations import (
    Refusal,
    ServiceTarget,
    WaypointSelf,
    original_destination,
    pick_endpoint,
    plan_tunnel,
)

CLIENT = pod("client-0", "198.18.16.2", services={}, service_account="client")
PASSTHROUGH = web_service(load_balancing_mode=LoadBalancingMode.PASSTHROUGH, health_policy=HealthPolicy.ALLOW_ALL)


def outbound(state: WorkloadState, dst: str = str(VIP), port: int = 80) -> object:
    facts = OutboundFacts(ipaddress.ip_address(dst), dst, port, CLIENT)
    return plan_outbound(facts, state, NodeView("", "node1", {CLIENT.uid}), first)


def test_a_passthrough_vip_without_endpoints_goes_to_the_original_destination() -> None:
    plan = outbound(state_with(CLIENT, services=[PASSTHROUGH]))
    assert isinstance(plan, Plain)
    assert plan.address == (str(VIP), 80) and not plan.hostname
    assert plan.destination.transport is Transport.PASSTHROUGH
    assert plan.destination.service == PASSTHROUGH and plan.destination.workload is None


def test_a_passthrough_vip_with_an_endpoint_uses_the_endpoint() -> None:
    web = pod("web-0", "198.18.17.5")
    plan = outbound(state_with(CLIENT, web, services=[PASSTHROUGH]))
    assert not isinstance(plan, Refuse)
    assert plan.destination.workload == web  # type: ignore[attr-defined]


def test_any_other_vip_without_endpoints_is_still_no_healthy_upstream() -> None:
    plan = outbound(state_with(CLIENT, services=[web_service()]))
    assert isinstance(plan, Refuse) and plan.flag is ResponseFlag.NO_ROUTE


# --- the waypoint ----------------------------------------------------------------------------------------------

ME = WaypointSelf("egress", "waypoint", frozenset({ipaddress.ip_address("198.18.0.10")}))
BY_NAME = GatewayAddress(NamespacedHostname("egress", "waypoint.egress.svc.cluster.local"))
ENTRY_VIP = ipaddress.ip_address("198.19.0.77")
ENTRY = Service(
    name="external-resolution-none",
    namespace="echo",
    hostname="fake-passthrough.example.com",
    vips=(NetworkAddress("", ENTRY_VIP),),
    ports=(PortMapping(8080, 8080, AppProtocol.HTTP11),),
    waypoint=BY_NAME,
    load_balancing_mode=LoadBalancingMode.PASSTHROUGH,
    health_policy=HealthPolicy.ALLOW_ALL,
)


@pytest.fixture
def state() -> WorkloadState:
    state = WorkloadState()
    state.upsert_service(ENTRY)
    return state


def test_the_waypoint_dials_the_vip_and_port_the_connect_named(state: WorkloadState) -> None:
    target = plan_tunnel("198.19.0.77:8080", state, ME)
    assert isinstance(target, ServiceTarget) and target.ip == ENTRY_VIP
    assert pick_endpoint(state, ENTRY, 8080, first) is None
    endpoint = original_destination(target)
    assert endpoint is not None
    assert (endpoint.ip, endpoint.port, endpoint.service, endpoint.resolve_hostname) == (ENTRY_VIP, 8080, ENTRY, "")
    assert endpoint.via is None and endpoint.workload.hostname == ""


@pytest.mark.parametrize(
    "authority",
    ["198.19.0.99:8080", "10.0.0.1:22", "127.0.0.1:8080", "169.254.169.254:80", "198.18.0.10:15000"],
)
def test_a_connect_naming_an_address_that_is_not_the_services_is_refused(state: WorkloadState, authority: str) -> None:
    """The attack: a client asks the waypoint for an arbitrary IP (the metadata server, its own admin port, a
    host on the node's network). It is not a VIP of a Service bound here, so the waypoint refuses it."""
    refused = plan_tunnel(authority, state, ME)
    assert isinstance(refused, Refusal) and refused.status == 400


def test_an_undeclared_port_of_the_passthrough_vip_is_refused(state: WorkloadState) -> None:
    refused = plan_tunnel("198.19.0.77:22", state, ME)
    assert isinstance(refused, Refusal) and refused.status == 400 and "no port 22" in refused.reason


def test_a_connect_naming_the_hostname_has_no_original_destination(state: WorkloadState) -> None:
    target = plan_tunnel("fake-passthrough.example.com:8080", state, ME)
    assert isinstance(target, ServiceTarget) and target.ip is None
    assert original_destination(target) is None  # 503, never a lookup of a client-chosen name


def test_only_a_passthrough_service_and_only_its_own_vip_have_an_original_destination(state: WorkloadState) -> None:
    plain = Service(name="x", namespace="echo", hostname="x.example.com", vips=ENTRY.vips, ports=ENTRY.ports)
    assert original_destination(ServiceTarget(plain, 8080, AppProtocol.HTTP11, ENTRY_VIP)) is None
    stranger = ipaddress.ip_address("10.1.2.3")
    assert original_destination(ServiceTarget(ENTRY, 8080, AppProtocol.HTTP11, stranger)) is None


def test_of_two_services_on_one_address_the_waypoint_takes_the_one_bound_to_it(state: WorkloadState) -> None:
    """A ServiceEntry on a Kubernetes Service's ClusterIP (upstream's egress tests): the Service, added later and
    not bound here, must not hide the entry from its waypoint."""
    state.upsert_service(
        Service(
            name="mock-external",
            namespace="outside",
            hostname="mock-external.outside.svc.cluster.local",
            vips=ENTRY.vips,
            ports=ENTRY.ports,
        )
    )
    target = plan_tunnel("198.19.0.77:8080", state, ME)
    assert isinstance(target, ServiceTarget) and target.service == ENTRY
