"""A waypoint on loopback sends a PreferClose Service's requests to the endpoint in its own zone, and spills over
to the other zone when that endpoint is unhealthy; a DestinationRule's ``localityLbSetting`` replaces that
preference (real sockets; the rig of ``waypoint_rig``)."""

from __future__ import annotations

import dataclasses
import ipaddress
import itertools
from collections.abc import Sequence
from pathlib import Path

from tests.integration.waypoint_rig import ECHO_VIP, HttpOverTunnel, Rig, echo_of, mesh_config

from ambit.model.destination_policy import (
    DestinationPolicy,
    LoadBalancer,
    LoadBalancerType,
    OutlierDetection,
    TrafficPolicy,
)
from ambit.model.localconfig import render_local_config
from ambit.model.locality_lb import LocalityLbSetting
from ambit.model.routes import WaypointConfig
from ambit.model.workload import HealthStatus, LoadBalancingMode, Locality, RoutingScope, Workload
from ambit.waypoint.settings import WaypointLimits

LIMITS = WaypointLimits(max_head_bytes=8 * 1024, head_timeout=0.5, sniff_timeout=0.5, startup_wait=5.0)
CLOSE = (RoutingScope.NETWORK, RoutingScope.REGION, RoutingScope.ZONE)


def _zoned_config() -> str:
    """The rig's mesh with zones: the waypoint's pod (127.0.0.1) and echo-2 in zone-a, echo-1 in zone-b, and the
    echo Service PreferClose (FAILOVER over network, region, zone)."""
    config = mesh_config()
    zones = {"echo-1": "zone-b", "echo-2": "zone-a"}
    nodes = {"echo-1": "node-w", "echo-2": "node-x"}  # echo-1 shares the waypoint's node, not its zone
    workloads = [
        dataclasses.replace(w, locality=Locality("reg", zones[w.name]), node=nodes[w.name]) if w.name in zones else w
        for w in config.workloads
    ]
    waypoint_pod = Workload(
        uid="Kubernetes//Pod/app/waypoint-0",
        name="waypoint-0",
        namespace="app",
        addresses=(ipaddress.ip_address("127.0.0.1"),),
        service_account="waypoint",
        locality=Locality("reg", "zone-a"),
        node="node-w",
    )
    services = [
        dataclasses.replace(s, load_balancing_mode=LoadBalancingMode.FAILOVER, routing_preference=CLOSE)
        if s.name == "echo"
        else s
        for s in config.services
    ]
    return render_local_config(
        dataclasses.replace(config, workloads=(*workloads, waypoint_pod), services=tuple(services))
    )


async def _endpoints_of(rig: Rig, requests: int) -> list[str]:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    seen = []
    for _ in range(requests):
        status, _, body = await http.request("GET", "/echo")
        assert status == 200
        seen.append(str(echo_of(body)["endpoint"]))
    await stream.aclose()
    await client.aclose()
    return seen


async def test_requests_go_to_the_endpoint_in_the_waypoints_zone_and_spill_over_when_it_is_unhealthy(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, LIMITS)
    (tmp_path / "mesh.yaml").write_text(_zoned_config(), encoding="utf-8")
    try:
        await rig.start()
        counter = itertools.count()

        def round_robin(candidates: Sequence[Workload]) -> Workload:
            return candidates[next(counter) % len(candidates)]

        rig.waypoint.context.choose = round_robin  # without locality: echo-1, echo-2, echo-1, ...
        assert await _endpoints_of(rig, 4) == ["echo-2"] * 4
        state = rig.waypoint.state
        near = next(w for w in state.workloads() if w.name == "echo-2")
        state.upsert_workload(dataclasses.replace(near, status=HealthStatus.UNHEALTHY))
        assert await _endpoints_of(rig, 2) == ["echo-1"] * 2
        state.upsert_workload(near)
        assert await _endpoints_of(rig, 2) == ["echo-2"] * 2
    finally:
        await rig.aclose()


def _locality_rule(setting: LocalityLbSetting) -> WaypointConfig:
    """A DestinationRule for echo with ``setting`` and outlier detection (failover needs it); PASSTHROUGH keeps the
    context's choice, the test's round robin."""
    balancer = LoadBalancer(LoadBalancerType.PASSTHROUGH, locality=setting)
    policy = TrafficPolicy(load_balancer=balancer, outlier_detection=OutlierDetection())
    rule = DestinationPolicy("app/echo.app.svc.cluster.local", "app/echo", policy)
    return WaypointConfig("app/waypoint", destination_rules=(rule,))


async def test_a_destination_rules_locality_setting_replaces_the_services_preference(tmp_path: Path) -> None:
    rig = Rig(tmp_path, LIMITS)
    (tmp_path / "mesh.yaml").write_text(_zoned_config(), encoding="utf-8")
    try:
        await rig.start()
        counter = itertools.count()

        def round_robin(candidates: Sequence[Workload]) -> Workload:
            return candidates[next(counter) % len(candidates)]

        rig.waypoint.context.choose = round_robin
        assert await _endpoints_of(rig, 2) == ["echo-2"] * 2  # PreferClose: the waypoint's zone
        routes = rig.waypoint.context.routes
        routes.replace(_locality_rule(LocalityLbSetting(failover_priority=("kubernetes.io/hostname",))))
        assert await _endpoints_of(rig, 3) == ["echo-1"] * 3  # the rule: the waypoint's node
        routes.replace(_locality_rule(LocalityLbSetting(enabled=False)))
        assert sorted(await _endpoints_of(rig, 4)) == ["echo-1", "echo-1", "echo-2", "echo-2"]  # neither
    finally:
        await rig.aclose()
