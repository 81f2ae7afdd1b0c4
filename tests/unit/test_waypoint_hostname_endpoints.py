"""A waypoint's choice of hostname endpoints (a ``resolution: DNS`` ServiceEntry's) and its judgement of the address
a DNS answer gives for one (pure, on a state)."""

from __future__ import annotations

import dataclasses
import ipaddress

from hypothesis import given
from hypothesis import strategies as st

from ambit.controlplane.translate import translate_all
from ambit.model.state import WorkloadState
from ambit.model.workload import (
    AppProtocol,
    GatewayAddress,
    HealthStatus,
    IPAddress,
    NamespacedHostname,
    NetworkAddress,
    PortMapping,
    Service,
    TunnelProtocol,
    Workload,
)
from ambit.waypoint.destinations import (
    OWN_PORTS,
    UNRESOLVED,
    UNRESOLVED_V6,
    Endpoint,
    Refusal,
    ServiceTarget,
    WaypointSelf,
    in_dialled_family,
    judge_resolved,
    pick_endpoint,
    pick_ingress_endpoint,
    plan_tunnel,
)

WAYPOINT_IP = ipaddress.ip_address("198.18.0.10")
ME = WaypointSelf("egress", "egress-gateway", frozenset({WAYPOINT_IP}))
EGRESS = GatewayAddress(NamespacedHostname("egress", "egress-gateway.egress.svc.cluster.local"))
HOST = "fake-egress.example.com"
KEY = f"app/{HOST}"
VIPS = ("240.240.0.1", "2001:2::1")


def dns_endpoint(name: str, hostname: str, **extra: object) -> Workload:
    fields: dict[str, object] = {
        "addresses": (),
        "tunnel_protocol": TunnelProtocol.NONE,
        "services": {KEY: (PortMapping(80, 80), PortMapping(8080, 443))},
        **extra,
    }
    return Workload(
        uid=f"Kubernetes/networking.istio.io/ServiceEntry/app/external/{name}",
        name=name,
        namespace="app",
        hostname=hostname,
        **fields,  # type: ignore[arg-type]
    )


def external_state(*endpoints: Workload) -> WorkloadState:
    state = WorkloadState()
    for endpoint in endpoints:
        state.upsert_workload(endpoint)
    state.upsert_service(
        Service(
            name=HOST,
            namespace="app",
            hostname=HOST,
            vips=tuple(NetworkAddress("", ipaddress.ip_address(vip)) for vip in VIPS),
            ports=(PortMapping(80, 80, AppProtocol.HTTP11), PortMapping(8080, 443, AppProtocol.HTTP11)),
            waypoint=EGRESS,
        )
    )
    return state


def service_of(state: WorkloadState) -> Service:
    service = state.find_service_by_hostname(HOST)
    assert service is not None
    return service


def test_a_dns_service_entry_bound_to_the_waypoint_is_served_by_vip_and_by_name() -> None:
    state = external_state(dns_endpoint("ep-0", "external.example.net"))
    for authority in ("240.240.0.1:80", f"{HOST}:80"):
        plan = plan_tunnel(authority, state, ME)
        assert isinstance(plan, ServiceTarget) and plan.service.hostname == HOST


def test_a_hostname_endpoint_is_chosen_unresolved_with_its_target_port() -> None:
    state = external_state(dns_endpoint("ep-0", "external.example.net"))
    endpoint = pick_endpoint(state, service_of(state), 8080, lambda c: c[0])
    assert endpoint is not None
    assert endpoint.ip == UNRESOLVED and endpoint.port == 443
    assert endpoint.resolve_hostname == "external.example.net"


def test_a_hostname_endpoint_is_resolved_in_the_family_of_the_vip_the_client_dialled() -> None:
    state = external_state(dns_endpoint("ep-0", "external.example.net"))
    service = service_of(state)
    endpoint = pick_endpoint(state, service, 80, lambda c: c[0])
    assert endpoint is not None
    called = {vip: ServiceTarget(service, 80, AppProtocol.HTTP11, ipaddress.ip_address(vip)) for vip in VIPS}
    assert in_dialled_family(endpoint, called["2001:2::1"]) == dataclasses.replace(endpoint, ip=UNRESOLVED_V6)
    assert in_dialled_family(endpoint, called["240.240.0.1"]) == endpoint  # IPv4 first, as before
    by_name = ServiceTarget(service, 80, AppProtocol.HTTP11)  # the CONNECT named the host: no family asked for
    assert in_dialled_family(endpoint, by_name) == endpoint
    assert in_dialled_family(None, called["2001:2::1"]) is None
    addressed = dataclasses.replace(endpoint, ip=ipaddress.ip_address("10.0.0.1"), resolve_hostname="")
    assert in_dialled_family(addressed, called["2001:2::1"]) == addressed  # an address is dialled as it is
    assert judge_resolved(dataclasses.replace(endpoint, ip=UNRESOLVED_V6), UNRESOLVED_V6, ME) == Refusal(
        503, "external.example.net resolved to ::, which cannot be dialled"
    )


def test_an_endpoint_with_an_address_needs_no_resolution() -> None:
    state = external_state(dns_endpoint("ep-0", "external.example.net", addresses=(ipaddress.ip_address("10.0.0.1"),)))
    endpoint = pick_endpoint(state, service_of(state), 80, lambda c: c[0])
    assert endpoint is not None and endpoint.resolve_hostname == "" and str(endpoint.ip) == "10.0.0.1"


def test_an_endpoint_with_neither_address_nor_hostname_is_never_chosen() -> None:
    state = external_state(dns_endpoint("ep-0", ""))
    assert pick_endpoint(state, service_of(state), 80, lambda c: c[0]) is None


def test_an_unhealthy_hostname_endpoint_is_skipped_and_retries_exclude_the_tried_one() -> None:
    state = external_state(
        dns_endpoint("ep-0", "a.example.net"),
        dns_endpoint("ep-1", "b.example.net", status=HealthStatus.UNHEALTHY),
        dns_endpoint("ep-2", "c.example.net"),
    )
    seen: list[str] = []

    def choose(candidates: list[Workload]) -> Workload:
        seen.extend(w.hostname for w in candidates)
        return candidates[0]

    first = pick_endpoint(state, service_of(state), 80, choose)  # type: ignore[arg-type]
    assert first is not None and seen == ["a.example.net", "c.example.net"]
    again = pick_endpoint(state, service_of(state), 80, lambda c: c[0], exclude=frozenset({first.workload.uid}))
    assert again is not None and again.resolve_hostname == "c.example.net"


def _picked(port: int = 80) -> Endpoint:
    state = external_state(dns_endpoint("ep-0", "external.example.net"))
    endpoint = pick_endpoint(state, service_of(state), port, lambda c: c[0])
    assert endpoint is not None
    return endpoint


def test_a_public_answer_is_dialled_at_the_target_port() -> None:
    judged = judge_resolved(_picked(8080), ipaddress.ip_address("203.0.113.7"), ME)
    assert isinstance(judged, Endpoint)
    assert str(judged.ip) == "203.0.113.7" and judged.port == 443 and judged.resolve_hostname == ""


def test_a_loopback_answer_on_an_ordinary_port_is_dialled() -> None:
    judged = judge_resolved(_picked(), ipaddress.ip_address("127.0.0.1"), ME)
    assert isinstance(judged, Endpoint) and str(judged.ip) == "127.0.0.1"


def test_hostile_answers_are_refused_with_503() -> None:
    for answer in ("0.0.0.0", "::", "224.0.0.1", "ff02::1", "255.255.255.255"):
        judged = judge_resolved(_picked(), ipaddress.ip_address(answer), ME)
        assert isinstance(judged, Refusal) and judged.status == 503, answer
        assert "external.example.net" in judged.reason


def test_an_answer_pointing_at_the_waypoints_own_ports_is_refused() -> None:
    state = external_state(dns_endpoint("ep-0", "external.example.net"))
    for port in sorted(OWN_PORTS):
        state.upsert_workload(dns_endpoint("ep-0", "external.example.net", services={KEY: (PortMapping(80, port),)}))
        endpoint = pick_endpoint(state, service_of(state), 80, lambda c: c[0])
        assert endpoint is not None and endpoint.port == port
        for answer in (WAYPOINT_IP, ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")):
            judged = judge_resolved(endpoint, answer, ME)
            assert isinstance(judged, Refusal) and "own" in judged.reason


addresses = st.one_of(
    st.builds(ipaddress.IPv4Address, st.integers(0, 2**32 - 1)),
    st.builds(ipaddress.IPv6Address, st.integers(0, 2**128 - 1)),
)


@given(answer=addresses, port=st.sampled_from([80, 443, *sorted(OWN_PORTS)]))
def test_no_answer_makes_the_waypoint_dial_nothing_or_itself(answer: IPAddress, port: int) -> None:
    state = external_state(dns_endpoint("ep-0", "h.example.net", services={KEY: (PortMapping(80, port),)}))
    endpoint = pick_endpoint(state, service_of(state), 80, lambda c: c[0])
    assert endpoint is not None
    judged = judge_resolved(endpoint, answer, ME)
    if isinstance(judged, Endpoint):
        assert not judged.ip.is_unspecified and not judged.ip.is_multicast
        assert not (port in OWN_PORTS and (judged.ip.is_loopback or judged.ip == WAYPOINT_IP))
        assert judged.port == port and judged.ip == answer
    else:
        assert judged.status == 503


def _egress_translation() -> WorkloadState:
    """TestWaypointAsEgressGateway's objects, translated: a waypoint ``egress-gateway`` in namespace ``egress``, a
    DNS ServiceEntry in ``app`` bound to it across namespaces, its one endpoint a name."""
    gateway = {
        "kind": "Gateway",
        "metadata": {"name": "egress-gateway", "namespace": "egress"},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [
                {
                    "name": "mesh",
                    "port": 15008,
                    "protocol": "HBONE",
                    "allowedRoutes": {
                        "namespaces": {
                            "from": "Selector",
                            "selector": {"matchLabels": {"kubernetes.io/metadata.name": "app"}},
                        }
                    },
                }
            ],
        },
        "status": {"addresses": [{"type": "Hostname", "value": "egress-gateway.egress.svc.cluster.local"}]},
    }
    entry = {
        "kind": "ServiceEntry",
        "metadata": {
            "name": "external",
            "namespace": "app",
            "labels": {"istio.io/use-waypoint": "egress-gateway", "istio.io/use-waypoint-namespace": "egress"},
        },
        "spec": {
            "hosts": [HOST],
            "addresses": ["240.240.0.1"],
            "ports": [
                {"name": "http", "number": 80, "protocol": "HTTP"},
                {"name": "https", "number": 443, "protocol": "HTTPS"},
                {"name": "http-for-tls", "number": 8080, "protocol": "HTTP", "targetPort": 443},
            ],
            "location": "MESH_EXTERNAL",
            "resolution": "DNS",
            "endpoints": [{"address": "external.ext.svc.cluster.local"}],
        },
    }
    namespaces = [
        {"kind": "Namespace", "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}}
        for ns in ("app", "egress", "ext")
    ]
    translation = translate_all([], [], [], namespaces, service_entries=[entry], gateways=[gateway])
    state = WorkloadState()
    for workload in translation.config.workloads:
        state.upsert_workload(workload)
    for service in translation.config.services:
        state.upsert_service(service)
    return state


def test_the_egress_service_entry_translates_to_what_the_egress_waypoint_serves_by_name() -> None:
    state = _egress_translation()
    for authority, port, target_port in ((f"{HOST}:80", 80, 80), ("240.240.0.1:8080", 8080, 443)):
        plan = plan_tunnel(authority, state, ME)
        assert isinstance(plan, ServiceTarget), plan
        endpoint = pick_endpoint(state, plan.service, plan.port, lambda c: c[0])
        assert endpoint is not None and endpoint.port == target_port, port
        assert endpoint.resolve_hostname == "external.ext.svc.cluster.local" and endpoint.ip == UNRESOLVED
        assert endpoint.workload.tunnel_protocol is TunnelProtocol.NONE  # plain TCP to the external host


def test_another_waypoint_refuses_the_egress_service_entry() -> None:
    other = WaypointSelf("app", "waypoint")
    plan = plan_tunnel(f"{HOST}:80", _egress_translation(), other)
    assert isinstance(plan, Refusal) and plan.status == 400


def test_an_ingress_gateway_never_tunnels_to_a_waypoint_instance_known_only_by_name() -> None:
    waypoint_key = "egress/egress-gateway.egress.svc.cluster.local"
    state = WorkloadState()
    state.upsert_workload(
        Workload(
            uid="Kubernetes//Pod/egress/egress-gateway-0",
            name="egress-gateway-0",
            namespace="egress",
            addresses=(),
            hostname="egress-gateway-0.example.net",
            tunnel_protocol=TunnelProtocol.HBONE,
            services={waypoint_key: (PortMapping(15008, 15008),)},
        )
    )
    state.upsert_service(
        Service(
            name="egress-gateway",
            namespace="egress",
            hostname="egress-gateway.egress.svc.cluster.local",
            vips=(NetworkAddress("", ipaddress.ip_address("240.240.9.9")),),
            ports=(PortMapping(15008, 15008),),
        )
    )
    state.upsert_service(
        Service(
            name="web",
            namespace="app",
            hostname="web.app.svc.cluster.local",
            vips=(NetworkAddress("", ipaddress.ip_address("240.240.9.1")),),
            ports=(PortMapping(80, 8080, AppProtocol.HTTP11),),
            waypoint=EGRESS,
            ingress_use_waypoint=True,
        )
    )
    web = state.find_service_by_hostname("web.app.svc.cluster.local")
    assert web is not None
    assert pick_ingress_endpoint(state, web, 80, lambda c: c[0]) is None  # 503, never a tunnel via 0.0.0.0
