"""The canary waypoint serves the Service it fronts (upstream TestWeightedWaypointPolicyPropagation, on loopback): the
waypoint process of :mod:`tests.integration.waypoint_rig` is ``app/waypoint``; here Service ``echo`` names another
waypoint (``app/primary``) as its own and this one as its canary, so tunnels to its VIP are accepted and its
Service-scoped AuthorizationPolicy is enforced, while a Service that names this waypoint in neither place is
refused."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.waypoint_rig import (
    ECHO_VIP,
    WAYPOINT_ADDR,
    HttpOverTunnel,
    Rig,
    mesh_config,
    started_rig,
)

from ambit.model.policy import Action, Clause, Match, Policy, Rule, Scope, StringMatch
from ambit.model.routes import WaypointConfig
from ambit.model.workload import GatewayAddress, NamespacedHostname, WeightedWaypoint
from ambit.proxy.hbone_client import TunnelRefusedError
from ambit.waypoint.settings import WaypointLimits

LIMITS = WaypointLimits(max_head_bytes=8 * 1024, head_timeout=0.5, sniff_timeout=0.5, startup_wait=5.0)
ECHO_KEY = "app/echo.app.svc.cluster.local"
PRIMARY = GatewayAddress(NamespacedHostname("app", "primary.app.svc.cluster.local"))


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path, LIMITS) as rig:
        yield rig


def echo_fronted_by(rig: Rig, weighted: tuple[WeightedWaypoint, ...]) -> None:
    """The rig's mesh with ``echo`` bound to ``app/primary`` and the weighted set ``weighted``."""
    config = mesh_config()
    services = tuple(
        dataclasses.replace(s, waypoint=PRIMARY, weighted_waypoints=weighted) if s.name == "echo" else s
        for s in config.services
    )
    rig.waypoint.state.replace_all(config.workloads, services)


async def get_echo(rig: Rig) -> int:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    try:
        status, _, _ = await HttpOverTunnel(stream).request("GET", "/echo")
        return status
    finally:
        await client.aclose()


async def test_the_canary_waypoint_serves_and_enforces_the_service_policy_of_the_service_it_fronts(rig: Rig) -> None:
    echo_fronted_by(rig, (WeightedWaypoint(PRIMARY, 0), WeightedWaypoint(WAYPOINT_ADDR, 100)))
    assert await get_echo(rig) == 200
    deny = Policy(
        "deny-echo",
        "app",
        Scope.SERVICE,
        Action.DENY,
        (Rule((Clause((Match(paths=(StringMatch.presence(),)),)),)),),
        services=(ECHO_KEY,),
    )
    rig.waypoint.context.routes.replace(WaypointConfig("app/waypoint", policies=(deny,)))
    assert await get_echo(rig) == 403


async def test_a_waypoint_that_is_neither_the_services_waypoint_nor_its_canary_refuses_it(rig: Rig) -> None:
    other = GatewayAddress(NamespacedHostname("app", "other.app.svc.cluster.local"))
    echo_fronted_by(rig, (WeightedWaypoint(PRIMARY, 50), WeightedWaypoint(other, 50)))
    with pytest.raises(TunnelRefusedError):
        await get_echo(rig)
