"""Which CONNECT authorities a waypoint accepts, and which endpoint serves a request (pure, on a state)."""

from __future__ import annotations

import dataclasses
import ipaddress

import pytest

from ambit.model.routes import BackendService, WeightedBackend
from ambit.model.state import WorkloadState
from ambit.model.workload import (
    AppProtocol,
    GatewayAddress,
    HealthStatus,
    NamespacedHostname,
    NetworkAddress,
    PortMapping,
    Service,
    TunnelProtocol,
    Workload,
)
from ambit.waypoint.destinations import (
    Refusal,
    ServiceTarget,
    WaypointSelf,
    WorkloadTarget,
    choose_weighted,
    pick_endpoint,
    pick_ingress_endpoint,
    plan_tunnel,
)
from ambit.waypoint.telemetry import RequestRecord, WaypointMetrics, format_request_log

ME = WaypointSelf("app", "waypoint", frozenset({ipaddress.ip_address("198.18.0.10")}))
BY_NAME = GatewayAddress(NamespacedHostname("app", "waypoint.app.svc.cluster.local"))
OTHER = GatewayAddress(NamespacedHostname("app", "other.app.svc.cluster.local"))


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def workload(name: str, address: str, *, waypoint: GatewayAddress | None = None, **extra: object) -> Workload:
    return Workload(
        uid=f"Kubernetes//Pod/app/{name}",
        name=name,
        namespace="app",
        addresses=(ip(address),),
        tunnel_protocol=TunnelProtocol.HBONE,
        service_account=name,
        waypoint=waypoint,
        **extra,  # type: ignore[arg-type]
    )


@pytest.fixture
def state() -> WorkloadState:
    state = WorkloadState()
    ports = {"app/echo.app.svc.cluster.local": (PortMapping(80, 8080),)}
    state.upsert_workload(workload("echo-1", "198.18.0.21", services=ports))
    state.upsert_workload(workload("echo-2", "198.18.0.22", services=ports, status=HealthStatus.UNHEALTHY))
    state.upsert_workload(workload("echo-3", "198.18.0.23", services=ports))
    state.upsert_workload(workload("pinned", "198.18.0.30", waypoint=BY_NAME))
    state.upsert_workload(workload("elsewhere", "198.18.0.31", waypoint=OTHER))
    state.upsert_service(
        Service(
            name="echo",
            namespace="app",
            hostname="echo.app.svc.cluster.local",
            vips=(NetworkAddress("", ip("198.18.1.1")),),
            ports=(PortMapping(80, 8080, AppProtocol.HTTP11),),
            waypoint=BY_NAME,
        )
    )
    state.upsert_service(
        Service(
            name="plain",
            namespace="app",
            hostname="plain.app.svc.cluster.local",
            vips=(NetworkAddress("", ip("198.18.1.2")),),
            ports=(PortMapping(80, 8080),),
        )
    )
    state.upsert_service(
        Service(
            name="waypoint",
            namespace="app",
            hostname="waypoint.app.svc.cluster.local",
            vips=(NetworkAddress("", ip("198.18.1.9")),),
            ports=(PortMapping(15008, 15008),),
        )
    )
    return state


def test_a_vip_of_a_service_using_this_waypoint_is_served(state: WorkloadState) -> None:
    plan = plan_tunnel("198.18.1.1:80", state, ME)
    assert isinstance(plan, ServiceTarget)
    assert plan.service.name == "echo" and plan.port == 80 and plan.protocol is AppProtocol.HTTP11
    assert plan.backend.service_key == "app/echo.app.svc.cluster.local"


def test_a_service_hostname_authority_is_served_too(state: WorkloadState) -> None:
    assert isinstance(plan_tunnel("echo.app.svc.cluster.local:80", state, ME), ServiceTarget)


@pytest.mark.parametrize(
    ("authority", "reason"),
    [
        ("198.18.1.1:81", "has no port 81"),  # undeclared port
        ("198.18.1.2:80", "does not use this waypoint"),  # a service without a waypoint
        ("198.18.0.21:8080", "does not use this waypoint"),  # an endpoint of a waypoint-using service, by pod IP
        ("198.18.0.31:80", "does not use this waypoint"),  # a workload using another waypoint
        ("198.18.9.9:80", "unknown destination"),
        ("198.18.0.10:15000", "own ports"),  # admin
        ("198.18.0.10:15020", "own ports"),  # metrics
        ("127.0.0.1:15021", "own ports"),  # readiness
        ("198.18.0.10:15008", "own ports"),
        ("not an authority", "bad authority"),
        ("[::1", "bad authority"),
    ],
)
def test_everything_else_is_refused_with_400(state: WorkloadState, authority: str, reason: str) -> None:
    plan = plan_tunnel(authority, state, ME)
    assert isinstance(plan, Refusal)
    assert plan.status == 400 and reason in plan.reason
    # Only what a state update could bind here may wait for one (rule 5); a bad port or authority never does.
    assert plan.unbound == (reason in ("does not use this waypoint", "unknown destination"))


def test_a_workload_using_this_waypoint_is_served_by_pod_ip(state: WorkloadState) -> None:
    plan = plan_tunnel("198.18.0.30:9090", state, ME)
    assert isinstance(plan, WorkloadTarget)
    assert plan.workload.name == "pinned" and plan.port == 9090


def test_the_waypoint_is_recognised_by_its_address_and_by_its_service_vip(state: WorkloadState) -> None:
    assert ME.is_me(GatewayAddress(NetworkAddress("", ip("198.18.0.10"))), state)
    assert ME.is_me(GatewayAddress(NetworkAddress("", ip("198.18.1.9"))), state)
    assert not ME.is_me(GatewayAddress(NetworkAddress("", ip("198.18.1.2"))), state)
    assert not ME.is_me(None, state)


def test_endpoints_are_healthy_ones_with_their_target_port(state: WorkloadState) -> None:
    service = state.find_service_by_hostname("echo.app.svc.cluster.local")
    assert service is not None
    seen = []
    endpoint = pick_endpoint(state, service, 80, lambda candidates: seen.extend(candidates) or candidates[-1])
    assert [w.name for w in seen] == ["echo-1", "echo-3"]
    assert endpoint is not None and endpoint.port == 8080 and str(endpoint.ip) == "198.18.0.23"
    assert endpoint.expected_identities == {endpoint.workload.identity}
    none_left = pick_endpoint(state, service, 80, lambda c: c[0], exclude=frozenset(w.uid for w in seen))
    assert none_left is None


def test_an_ingress_gateway_reaches_an_ingress_use_waypoint_service_through_its_waypoint(state: WorkloadState) -> None:
    state.upsert_workload(
        workload(
            "waypoint-1", "198.18.0.40", services={"app/waypoint.app.svc.cluster.local": (PortMapping(15008, 15008),)}
        )
    )
    echo = state.find_service_by_hostname("echo.app.svc.cluster.local")
    assert echo is not None
    direct = pick_ingress_endpoint(state, echo, 80, lambda c: c[0])  # bound to a waypoint, but not for ingress
    assert direct is not None and direct.via is None and direct.workload.name == "echo-1"
    marked = dataclasses.replace(echo, ingress_use_waypoint=True)
    hop = pick_ingress_endpoint(state, marked, 80, lambda c: c[0])
    assert hop is not None and hop.workload.name == "waypoint-1"
    assert (str(hop.ip), hop.port, str(hop.via)) == ("198.18.1.1", 80, "198.18.0.40")  # VIP:port via the waypoint
    gone = dataclasses.replace(marked, waypoint=OTHER)  # a waypoint that does not exist: never bypassed
    assert pick_ingress_endpoint(state, gone, 80, lambda c: c[0]) is None


def test_weighted_choice_follows_the_weights_and_never_picks_weight_zero() -> None:
    a, b, z = (
        WeightedBackend(BackendService("app", f"{n}.app.svc.cluster.local", 80), w)
        for n, w in (("a", 9), ("b", 1), ("z", 0))
    )
    picks = [choose_weighted((a, z, b), i / 100) for i in range(100)]
    assert picks.count(a) == 90 and picks.count(b) == 10 and z not in picks
    assert choose_weighted((z,), 0.5) is None
    assert choose_weighted((), 0.5) is None


def test_request_metrics_are_reported_by_the_waypoint(state: WorkloadState) -> None:
    from ambit.proxy.accounting import traffic_labels
    from ambit.telemetry.metrics import Reporter

    metrics = WaypointMetrics(build_version="test")
    labels = traffic_labels(
        Reporter.WAYPOINT,
        source=None,
        source_identity=None,
        destination=None,
        destination_identity=None,
        service=None,
        mtls=True,
    )
    metrics.request(labels, response_code=200, duration_ms=3.0, request_bytes=10, response_bytes=2000)
    text = metrics.render().decode()
    [line] = [line for line in text.splitlines() if line.startswith("istio_requests_total{")]
    assert 'reporter="waypoint"' in line and 'response_code="200"' in line and line.endswith(" 1.0")
    assert "istio_request_duration_milliseconds_bucket" in text
    assert "istio_response_bytes_bucket{" in text
    assert 'component="ambit-waypoint"' in text


def test_a_request_log_line_stays_one_line_whatever_the_path() -> None:
    line = format_request_log(
        RequestRecord(src_addr="1.2.3.4:5", method="GET", path="/a b\n\u2028x", response_code=200)
    )
    assert "\n" not in line and "\u2028" not in line
    assert line.startswith("request complete ")
    failed = format_request_log(RequestRecord(src_addr="1.2.3.4:5", response_code=503, response_flags="UH"))
    assert failed.startswith("request failed ")
