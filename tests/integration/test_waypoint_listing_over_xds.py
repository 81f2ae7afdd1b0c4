"""A waypoint fed by the control plane serves a Service only once its WaypointConfig lists it (rule 6 of
:func:`ambit.waypoint.destinations.plan_tunnel`): the binding reaches it in the workload state, the Service's
policies in the WaypointConfig, on separate resources. Until the listing comes, a CONNECT for the Service waits
(``binding_wait``) and is refused at the end, never served without its policies.

A real waypoint on loopback (:mod:`tests.integration.waypoint_rig`) switched to the control-plane behaviour (as
``--xds-address`` switches it); its WaypointConfig arrives through the waypoint's own xDS hook
(:meth:`~ambit.waypoint.process.Waypoint.routes_changed`) as the xDS client delivers a decoded resource."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.controlplane_rig import eventually
from tests.integration.waypoint_rig import ECHO_VIP, HttpOverTunnel, Rig, free_port, http_get, started_rig

from ambit.api import discovery_pb2 as dpb
from ambit.model.policy import Action, Clause, Match, Policy, Rule, Scope, StringMatch
from ambit.model.routes import WaypointConfig
from ambit.proxy.hbone_client import TunnelRefusedError
from ambit.waypoint.process import Waypoint
from ambit.waypoint.settings import WaypointLimits
from ambit.xds.client_session import ClientUpdate
from ambit.xds.routes import WAYPOINT_CONFIG_TYPE_URL, decode_waypoint_config, pack_waypoint_config
from ambit.xds.routes import waypoint_config_to_proto as to_proto

LIMITS = WaypointLimits(
    max_head_bytes=8 * 1024,
    head_timeout=0.5,
    sniff_timeout=0.5,
    startup_wait=5.0,
    binding_wait=1.5,
    max_binding_waits=4,
)
NAME = "app/waypoint"
ECHO = "app/echo.app.svc.cluster.local"
TCP = "app/tcp.app.svc.cluster.local"
DENY_ALL_TO_ECHO = Policy(
    "deny-echo",
    "app",
    Scope.SERVICE,
    Action.DENY,
    (Rule((Clause((Match(paths=(StringMatch.prefix("/"),)),)),)),),
    services=(ECHO,),
)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path, LIMITS) as rig:
        rig.waypoint.context.serve_listed_only = True  # what --xds-address sets
        yield rig


def deliver(rig: Rig, config: WaypointConfig) -> None:
    """``config`` over the wire and into the waypoint, as its xDS client hands over an accepted resource."""
    decoded = decode_waypoint_config(NAME, pack_waypoint_config(to_proto(config)))
    update = ClientUpdate(WAYPOINT_CONFIG_TYPE_URL, ((NAME, decoded),), (), dpb.DeltaDiscoveryRequest())
    rig.waypoint.routes_changed(update)


async def test_a_service_bound_in_the_state_but_not_listed_is_refused_not_served(rig: Rig) -> None:
    """Attack: echo's binding is in the workload state, but the config carrying echo's policies (here a DENY of
    everything) has not come; a client that CONNECTs in that gap must not reach echo without them."""
    deliver(rig, WaypointConfig(NAME, services=(TCP,)))  # an older config: echo not yet listed, its DENY not in
    client = await rig.client()
    started = time.monotonic()
    with pytest.raises(TunnelRefusedError) as refused:
        await client.open_tunnel(f"{ECHO_VIP}:80", [])
    assert refused.value.status == 400
    assert time.monotonic() - started >= LIMITS.binding_wait - 0.1  # it waited for the listing, then refused
    await client.aclose()
    assert sum(e.tunnels for e in rig.endpoints) == 0  # nothing reached an endpoint
    assert rig.waypoint.refusals.by_status[400] == 1 and rig.waypoint.startup.binding_waits == 0
    _, text = await http_get(f"http://127.0.0.1:{rig.settings.stats_port}/metrics")
    failed = [line for line in text.splitlines() if line.startswith("istio_tcp_connections_failed_total{")]
    assert any('reporter="waypoint"' in line and 'response_flags="NR"' in line for line in failed), failed


async def test_a_waiting_connect_is_judged_with_the_policies_that_come_with_the_listing(rig: Rig) -> None:
    """The listing arrives within ``binding_wait`` (a WaypointConfig update alone, no state update): the tunnel is
    served from then on, under the DENY that came in the same config."""
    deliver(rig, WaypointConfig(NAME))
    client = await rig.client()
    opened = asyncio.create_task(client.open_tunnel(f"{ECHO_VIP}:80", []))
    await eventually(lambda: rig.waypoint.startup.binding_waits == 1, within=5)
    assert not opened.done()
    deliver(rig, WaypointConfig(NAME, policies=(DENY_ALL_TO_ECHO,), services=(ECHO, TCP)))
    stream = await asyncio.wait_for(opened, 5)
    status, _, body = await HttpOverTunnel(stream).request("GET", "/echo")
    assert (status, body) == (403, b"RBAC: access denied")
    assert rig.waypoint.startup.binding_waits == 0
    await client.aclose()
    assert not any(e.seen for e in rig.endpoints)


async def test_a_listed_service_is_served_at_once_and_a_removed_config_keeps_its_listing(rig: Rig) -> None:
    """Listed: no wait. The control plane stops serving the resource: default routes, but the last policies and the
    Services they were chosen for stay (fail closed, as the policies do)."""
    deliver(rig, WaypointConfig(NAME, services=(ECHO,)))
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    status, _, _ = await HttpOverTunnel(stream).request("GET", "/echo")
    assert status == 200
    await client.aclose()
    rig.waypoint.routes_changed(ClientUpdate(WAYPOINT_CONFIG_TYPE_URL, (), (NAME,), dpb.DeltaDiscoveryRequest()))
    assert rig.waypoint.context.routes.listed == frozenset({ECHO})
    assert rig.waypoint.config_dump()["routes"]["services"] == [ECHO]


def test_only_a_waypoint_fed_by_the_control_plane_requires_the_listing(tmp_path: Path) -> None:
    """``--xds-address`` turns the rule on; a waypoint run from a local file has no WaypointConfig and keeps
    serving what its state binds."""
    local = Rig(tmp_path, LIMITS)
    assert local.waypoint.context.serve_listed_only is False
    fed = Waypoint(
        dataclasses.replace(
            local.settings, config_file=None, xds_address=f"127.0.0.1:{free_port()}", root_cert_file=tmp_path / "root"
        )
    )
    assert fed.context.serve_listed_only is True
