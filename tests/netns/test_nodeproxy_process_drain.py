"""A node proxy process stops gracefully and hands over to a successor (ztunnel's ``test_shutdown_drain`` and
``test_shutdown_forced_drain``, and the hand-over its SO_REUSEPORT listeners allow), with real processes in real
namespaces (:mod:`tests.netns.nodeproxy_rig`)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.netns.nodeproxy_rig import CLIENT_IP, ECHO_PORT, POD_IP, add_pod, drain_rig, echo, listening

from ambit.proxy.hbone_stream import StreamClosedError

pytestmark = [pytest.mark.root, pytest.mark.timeout(180)]

POD_LISTENERS = {"tcp 0.0.0.0:15001", "tcp 0.0.0.0:15006", "tcp 0.0.0.0:15008", "tcp 127.0.0.1:15053"}
UNTIL = 15.0
ENDPOINTS = {"tcp 127.0.0.1:15000", "tcp 0.0.0.0:15020", "tcp 0.0.0.0:15021"}


def pod_listeners(ns: str) -> set[str]:
    return {entry for entry in listening(ns) if f":{ECHO_PORT}" not in entry}


async def until(what: str, condition: Callable[[], bool]) -> None:
    """Poll (other processes' state, no event to wait on) for up to ``UNTIL`` seconds."""
    deadline = time.monotonic() + UNTIL
    while not condition():
        assert time.monotonic() < deadline, f"not within {UNTIL:g} s: {what}"
        await asyncio.sleep(0.05)


async def test_a_draining_proxy_stops_accepting_keeps_its_tunnel_and_exits_when_it_ends(tmp_path: Path) -> None:
    async with drain_rig(tmp_path) as (rig, agent):
        proxy = rig.start_proxy("--drain-deadline", "60")
        await add_pod(agent, rig)
        await proxy.ready()
        assert pod_listeners(rig.pod) >= POD_LISTENERS and listening(rig.node) >= ENDPOINTS
        client = await rig.hbone_client()
        stream = await rig.tunnel(client)
        await echo(stream, b"before the drain")

        proxy.stop(signal.SIGTERM)
        # Every listener closes at once: the pod's and the proxy's own (readiness fails).
        await until("the listeners closed", lambda: not pod_listeners(rig.pod) and not listening(rig.node))
        # The HBONE connection heard GOAWAY: no new tunnel on it, the one in flight goes on.
        await until("the client told to go away", lambda: not client.available)
        await echo(stream, b"during the drain")
        assert proxy.proc.poll() is None, "the proxy exited with a tunnel still open"

        began = time.monotonic()
        stream.write_eof()
        await stream.aclose()
        assert await proxy.exited(20) == 0
        assert time.monotonic() - began < 20  # on its own, long before the 60 s deadline
        assert not pod_listeners(rig.pod) and not listening(rig.node)
        log = proxy.log.read_text()
        assert "drain over: every connection ended" in log and "Traceback" not in log
        await client.aclose()


async def test_a_tunnel_that_never_ends_is_closed_at_the_deadline_and_the_proxy_exits(tmp_path: Path) -> None:
    async with drain_rig(tmp_path) as (rig, agent):
        proxy = rig.start_proxy(env={"TERMINATION_GRACE_PERIOD_SECONDS": "3"})  # deadline 2 s (ztunnel's rule)
        await add_pod(agent, rig)
        await proxy.ready()
        client = await rig.hbone_client()
        stream = await rig.tunnel(client)
        await echo(stream, b"held open")

        stopped = time.monotonic()
        proxy.stop(signal.SIGTERM)
        assert await proxy.exited(30) == 0
        took = time.monotonic() - stopped
        assert 1.5 <= took < 20, took
        with pytest.raises(StreamClosedError):
            await echo(stream, b"after the deadline")
        log = proxy.log.read_text()
        assert "drain deadline (no successor) of 2 s reached" in log and "Traceback" not in log
        assert f"drain: closing inbound {CLIENT_IP}:" in log  # a line per connection cut
        assert not pod_listeners(rig.pod) and not listening(rig.node)
        await client.aclose()


async def test_a_second_signal_cuts_the_drain_short(tmp_path: Path) -> None:
    async with drain_rig(tmp_path) as (rig, agent):
        proxy = rig.start_proxy("--drain-deadline", "3600")
        await add_pod(agent, rig)
        await proxy.ready()
        client = await rig.hbone_client()
        stream = await rig.tunnel(client)
        await echo(stream, b"held open")
        proxy.stop(signal.SIGTERM)
        await until("the listeners closed", lambda: not pod_listeners(rig.pod))
        proxy.stop(signal.SIGINT)
        assert await proxy.exited(20) == 0
        await client.aclose()


async def test_a_successor_takes_new_connections_while_the_old_proxy_drains_its_own(tmp_path: Path) -> None:
    """The hand-over: the new proxy binds beside the old one (SO_REUSEPORT), gets the pod from the node agent's
    snapshot and says it is ready; then the old one is told to stop. New connections are never refused; the old
    tunnel keeps working until it ends; the old proxy exits then, and the new one keeps the listeners."""
    async with drain_rig(tmp_path) as (rig, agent):
        old = rig.start_proxy("--drain-deadline", "60")
        await add_pod(agent, rig)
        await old.ready()
        old_client = await rig.hbone_client()
        old_stream = await rig.tunnel(old_client)
        await echo(old_stream, b"through the old proxy")

        new = rig.start_proxy("--drain-deadline", "60")
        await new.ready()  # its snapshot had the pod: the listeners are open beside the old ones
        assert agent.connections == 2
        old.stop(signal.SIGTERM)
        await until("the old proxy's endpoints closed", lambda: "drain" in old.log.read_text())

        # New connections (each its own HBONE connection) all land on the new proxy and work.
        for n in range(5):
            client = await rig.hbone_client()
            stream = await rig.tunnel(client)
            await echo(stream, f"new connection {n}".encode())
            await stream.aclose()
            await client.aclose()
        await echo(old_stream, b"the old tunnel still works")
        assert old.proc.poll() is None

        old_stream.write_eof()
        await old_stream.aclose()
        assert await old.exited(20) == 0
        await old_client.aclose()
        assert pod_listeners(rig.pod) >= POD_LISTENERS, "the new proxy's listeners went with the old proxy"
        client = await rig.hbone_client()
        await echo(await rig.tunnel(client), b"after the old proxy left")
        await client.aclose()
        assert new.proc.poll() is None
        assert f"{POD_IP}" in new.log.read_text() or "listeners open" in new.log.read_text()


async def test_a_peer_holding_an_idle_hbone_connection_cannot_keep_the_proxy_alive(tmp_path: Path) -> None:
    """An attack on the drain: a client connects, opens nothing and never closes. GOAWAY with no stream in flight
    means the proxy closes that connection itself, and exits at once, not at the deadline."""
    async with drain_rig(tmp_path) as (rig, agent):
        proxy = rig.start_proxy("--drain-deadline", "3600")
        await add_pod(agent, rig)
        await proxy.ready()
        idle = await rig.hbone_client()
        stopped = time.monotonic()
        proxy.stop(signal.SIGTERM)
        assert await proxy.exited(20) == 0
        assert time.monotonic() - stopped < 20
        await until("the idle connection closed by the proxy", lambda: idle.closed)
        await idle.aclose()


async def test_after_a_hand_over_the_old_proxy_keeps_its_tunnel_past_the_short_bound_until_it_ends(
    tmp_path: Path,
) -> None:
    """Issue 21: the node agent tells the old proxy (ZDS SuccessorReady) once the new one holds the snapshot; then
    SIGTERM drains up to --drain-max, not the short --drain-deadline: the tunnel outlives the short bound and the old
    proxy exits as soon as it ends."""
    async with drain_rig(tmp_path) as (rig, agent):
        old = rig.start_proxy("--drain-deadline", "1", "--drain-max", "120")
        await add_pod(agent, rig)
        await old.ready()
        client = await rig.hbone_client()
        stream = await rig.tunnel(client)
        await echo(stream, b"through the old proxy")
        new = rig.start_proxy("--drain-deadline", "1", "--drain-max", "120")
        await new.ready()
        await until("the old proxy told of its successor", lambda: "successor holds every pod" in old.log.read_text())

        old.stop(signal.SIGTERM)
        await until("the old proxy draining", lambda: "drain-max" in old.log.read_text())
        await asyncio.sleep(3)  # three times the no-successor bound
        await echo(stream, b"still relayed after the short bound")
        assert old.proc.poll() is None
        stream.write_eof()
        await stream.aclose()
        assert await old.exited(20) == 0
        log = old.log.read_text()
        assert "drain over: every connection ended" in log and "Traceback" not in log
        assert new.proc.poll() is None and "successor" not in new.log.read_text().split("running", 1)[1]
        await client.aclose()


async def test_a_tunnel_outliving_drain_max_after_a_hand_over_is_closed_with_a_line_for_it(tmp_path: Path) -> None:
    async with drain_rig(tmp_path) as (rig, agent):
        old = rig.start_proxy("--drain-deadline", "1", "--drain-max", "3")
        await add_pod(agent, rig)
        await old.ready()
        client = await rig.hbone_client()
        stream = await rig.tunnel(client)
        await echo(stream, b"held open")
        new = rig.start_proxy()
        await new.ready()
        await until("the old proxy told of its successor", lambda: "successor holds every pod" in old.log.read_text())

        stopped = time.monotonic()
        old.stop(signal.SIGTERM)
        assert await old.exited(30) == 0
        took = time.monotonic() - stopped
        assert 2.5 <= took < 20, took  # the 3 s drain-max, not the 1 s deadline; the upper bound is generous
        with pytest.raises(StreamClosedError):
            await echo(stream, b"after drain-max")
        log = old.log.read_text()
        assert "drain-max (hand-over) of 3 s reached" in log and "Traceback" not in log
        assert len([line for line in log.splitlines() if f"drain: closing inbound {CLIENT_IP}:" in line]) == 1
        await client.aclose()
