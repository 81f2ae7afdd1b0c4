"""A ``use-waypoint`` label moving to this waypoint while traffic runs (TestRemoveAddWaypoint with traffic): the
client's node proxy may hear of the new binding before the waypoint does, so a CONNECT for a Service the waypoint
does not serve yet waits, bounded, for the state update that binds it (make-before-break) instead of failing; one
that never gets bound is refused once the wait is over; and a flood of such CONNECTs cannot hold more than
``max_binding_waits`` of them (the rest are refused at once).

A real waypoint on loopback (:mod:`tests.integration.waypoint_rig`); the state update is what the xDS client would
apply, and the waypoint's state-change hook is called as the xDS client calls it."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.waypoint_rig import (
    ECHO_VIP,
    PLAIN_VIP,
    WAYPOINT_ADDR,
    HttpOverTunnel,
    Rig,
    mesh_config,
    started_rig,
)

from ambit.model.workload import GatewayAddress
from ambit.proxy.hbone_client import TunnelRefusedError
from ambit.waypoint.settings import WaypointLimits

LIMITS = WaypointLimits(
    max_head_bytes=8 * 1024,
    head_timeout=0.5,
    sniff_timeout=0.5,
    startup_wait=5.0,
    binding_wait=1.5,
    max_binding_waits=4,
)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path, LIMITS) as rig:
        yield rig


def echo_bound_to(rig: Rig, waypoint: GatewayAddress | None) -> None:
    """Service ``echo`` bound to ``waypoint``, applied as the xDS client applies an update."""
    config = mesh_config()
    services = tuple(dataclasses.replace(s, waypoint=waypoint) if s.name == "echo" else s for s in config.services)
    rig.waypoint.state.replace_all(config.workloads, services)
    rig.waypoint.startup.state_changed()


async def test_a_connect_that_arrives_before_the_binding_is_served_once_it_comes(rig: Rig) -> None:
    echo_bound_to(rig, None)  # the label is elsewhere; it is being moved here
    client = await rig.client()
    opened = asyncio.create_task(client.open_tunnel(f"{ECHO_VIP}:80", [("forwarded", 'for="198.18.0.9:1"')]))
    await asyncio.sleep(0.3)
    assert not opened.done()  # waiting, not refused
    rig.waypoint.startup.state_changed()  # an unrelated update: judged again, still not bound, still waiting
    await asyncio.sleep(0.1)
    assert not opened.done()
    echo_bound_to(rig, WAYPOINT_ADDR)
    stream = await asyncio.wait_for(opened, 5)
    status, _, body = await HttpOverTunnel(stream).request("GET", "/echo")
    assert status == 200 and body, body
    assert rig.waypoint.startup.binding_waits == 0
    await client.aclose()


async def test_a_connect_never_bound_is_refused_after_the_wait(rig: Rig) -> None:
    client = await rig.client()
    started = time.monotonic()
    with pytest.raises(TunnelRefusedError) as refused:
        await client.open_tunnel(f"{PLAIN_VIP}:80", [])
    assert refused.value.status == 400
    assert LIMITS.binding_wait - 0.1 <= time.monotonic() - started < LIMITS.binding_wait + 5
    assert rig.waypoint.startup.binding_waits == 0
    await client.aclose()


async def test_a_flood_of_unbound_connects_holds_at_most_max_binding_waits(rig: Rig) -> None:
    """Attack: 20 CONNECTs for a destination that is not ours. Four wait (the bound), sixteen are refused at once;
    all are refused in the end, and the waiting count goes back to zero."""
    client = await rig.client()
    started = time.monotonic()
    tunnels = [asyncio.create_task(client.open_tunnel(f"198.18.9.{i}:80", [])) for i in range(20)]
    await asyncio.sleep(0.5)
    early = [t for t in tunnels if t.done()]
    assert len(early) == 16 and rig.waypoint.startup.binding_waits == 4
    results = await asyncio.gather(*tunnels, return_exceptions=True)
    assert all(isinstance(r, TunnelRefusedError) and r.status == 400 for r in results), results
    assert time.monotonic() - started < LIMITS.binding_wait + 5
    assert rig.waypoint.startup.binding_waits == 0
    await client.aclose()


async def test_a_stopping_waypoint_reports_not_ready_and_serves_until_its_drain_ends(rig: Rig) -> None:
    """A deleted waypoint's pod gets SIGTERM while node proxies may still send to it: it drains, as Envoy does."""
    drained = asyncio.create_task(rig.waypoint.drain(30))
    await asyncio.sleep(0.1)
    assert not rig.waypoint.readiness.ready and "draining" in rig.waypoint.readiness.pending()
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    status, _, _ = await HttpOverTunnel(stream).request("GET", "/echo")
    assert status == 200 and not drained.done()
    await client.aclose()
    rig.waypoint.stopped.set()  # a second signal ends the drain at once
    await asyncio.wait_for(drained, 5)
