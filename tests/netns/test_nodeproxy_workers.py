"""A node proxy with worker processes (``--workers``, :mod:`ambit.inpod.workers`): every process serves the pod,
the kernel spreads new connections over them, the node proxy's metrics count them all, a worker that dies is
started again, and none outlives its node proxy (real processes in real namespaces, :mod:`tests.netns.
nodeproxy_rig`)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.netns.nodeproxy_rig import DrainRig, Proxy, add_pod, drain_rig, echo, sh

pytestmark = [pytest.mark.root, pytest.mark.timeout(240)]

UNTIL = 30.0
CONNECTIONS = 24


async def until(what: str, condition: Callable[[], bool], within: float = UNTIL) -> None:
    """Poll (other processes' state, no event to wait on) for up to ``within`` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"not within {within:g} s: {what}"
        await asyncio.sleep(0.05)


def children(pid: int) -> set[int]:
    try:
        return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def hbone_listeners(ns: str) -> set[int]:
    """The pids of the processes listening on the pod's 15008."""
    text = sh("ip", "netns", "exec", ns, "ss", "-Hltnp", "sport", "= :15008")
    return {int(pid) for pid in re.findall(r"pid=(\d+)", text)}


def established_owners(ns: str) -> dict[int, int]:
    """pid -> established connections it holds on the pod's 15008."""
    text = sh("ip", "netns", "exec", ns, "ss", "-Htnp", "state", "established", "sport", "= :15008")
    owners: dict[int, int] = {}
    for pid in re.findall(r"pid=(\d+)", text):
        owners[int(pid)] = owners.get(int(pid), 0) + 1
    return owners


def owner_by_port(ns: str) -> dict[int, int]:
    """Client port -> pid of the process holding that client's connection on the pod's 15008."""
    text = sh("ip", "netns", "exec", ns, "ss", "-Htnp", "state", "established", "sport", "= :15008")
    owners: dict[int, int] = {}
    for line in text.splitlines():
        peer, pid = re.search(r":15008\s+\S+:(\d+)\s", line), re.search(r"pid=(\d+)", line)
        if peer and pid:
            owners[int(peer[1])] = int(pid[1])
    return owners


def scrape(rig: DrainRig, name: str) -> float:
    text = sh("ip", "netns", "exec", rig.node, "curl", "-s", "--max-time", "5", "http://127.0.0.1:15020/metrics")
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{") or line == name
    )


async def serving_worker(rig: DrainRig, proxy: Proxy) -> int:
    """The pid of the node proxy's one worker, once it listens in the pod."""
    await until("the worker started", lambda: len(children(proxy.proc.pid)) == 1)
    (worker,) = children(proxy.proc.pid)
    await until("the worker listens", lambda: worker in hbone_listeners(rig.pod))
    return worker


async def test_every_worker_serves_the_pod_and_the_node_proxy_counts_all_their_connections(tmp_path: Path) -> None:
    async with drain_rig(tmp_path) as (rig, agent):
        proxy = rig.start_proxy("--drain-deadline", "20", "--workers", "3")
        await add_pod(agent, rig)
        await proxy.ready()
        await until("two workers started", lambda: len(children(proxy.proc.pid)) == 2)
        workers = children(proxy.proc.pid)
        await until("three processes listen in the pod", lambda: hbone_listeners(rig.pod) == {proxy.proc.pid, *workers})

        clients, streams = [], []
        for n in range(CONNECTIONS):  # each its own TCP connection: the kernel picks a listener by its 4-tuple
            client = await rig.hbone_client()
            stream = await rig.tunnel(client)
            await echo(stream, f"connection {n}".encode())
            clients.append(client)
            streams.append(stream)
        owners = established_owners(rig.pod)
        assert sum(owners.values()) == CONNECTIONS and set(owners) <= {proxy.proc.pid, *workers}
        assert len(owners) >= 2, f"every connection went to one process: {owners}"

        # The node proxy's /metrics counts its workers' connections too (their reports come every 0.5 s).
        opened = "istio_tcp_connections_opened_total"
        await until("every connection counted", lambda: scrape(rig, opened) >= CONNECTIONS, within=10)
        dump = sh("ip", "netns", "exec", rig.node, "curl", "-s", "http://127.0.0.1:15000/config_dump")
        assert all(f'"pid": {pid}' in dump or f'"pid":{pid}' in dump for pid in workers), dump[:2000]

        for stream in streams:
            stream.write_eof()
            await stream.aclose()
        for client in clients:
            await client.aclose()
        await until(
            "every connection closed and counted",
            lambda: scrape(rig, "istio_tcp_connections_closed_total") >= CONNECTIONS,
            within=10,
        )

        proxy.stop(signal.SIGTERM)  # the drain: the workers drain too, and everyone exits
        assert await proxy.exited(30) == 0
        await until("the workers exited", lambda: not any(alive(pid) for pid in workers), within=5)
        assert not hbone_listeners(rig.pod)
        log = proxy.log.read_text()
        assert "Traceback" not in log, log[-3000:]
        assert "node proxy worker for node-1 is running" in log


async def test_a_worker_that_dies_is_started_again_and_serves_the_pod(tmp_path: Path) -> None:
    async with drain_rig(tmp_path) as (rig, agent):
        proxy = rig.start_proxy("--drain-deadline", "20", "--workers", "2")
        await add_pod(agent, rig)
        await proxy.ready()
        first = await serving_worker(rig, proxy)
        os.kill(first, signal.SIGKILL)
        await until("a new worker started", lambda: bool(children(proxy.proc.pid) - {first}), within=15)
        (second,) = children(proxy.proc.pid) - {first}
        await until("the new worker listens", lambda: second in hbone_listeners(rig.pod))
        for n in range(8):
            client = await rig.hbone_client()
            await echo(await rig.tunnel(client), f"after the restart {n}".encode())
            await client.aclose()
        assert proxy.proc.poll() is None
        assert "node proxy worker 1 ended; starting it again" in proxy.log.read_text()
        proxy.stop(signal.SIGTERM)
        assert await proxy.exited(30) == 0


async def test_no_worker_outlives_a_killed_node_proxy(tmp_path: Path) -> None:
    async with drain_rig(tmp_path) as (rig, agent):
        proxy = rig.start_proxy("--drain-deadline", "5", "--workers", "2")
        await add_pod(agent, rig)
        await proxy.ready()
        worker = await serving_worker(rig, proxy)
        proxy.stop(signal.SIGKILL)
        await proxy.exited(10)
        # Orphaned, it sees its control socket end and drains (no connections: at once).
        await until("the orphaned worker exited", lambda: not alive(worker), within=15)
        assert not hbone_listeners(rig.pod)


async def test_a_hand_over_from_a_node_proxy_with_workers_keeps_every_tunnel_past_the_short_bound(
    tmp_path: Path,
) -> None:
    """The node agent's word that a successor holds every pod reaches the workers: they drain under drain-max as
    the node proxy does, so no tunnel they relay is cut at the short bound; new connections go to the successor."""
    async with drain_rig(tmp_path) as (rig, agent):
        old = rig.start_proxy("--drain-deadline", "1", "--drain-max", "60", "--workers", "2")
        await add_pod(agent, rig)
        await old.ready()
        worker = await serving_worker(rig, old)
        clients, streams = [], []
        for n in range(CONNECTIONS):
            client = await rig.hbone_client()
            stream = await rig.tunnel(client)
            await echo(stream, f"before the hand-over {n}".encode())
            clients.append(client)
            streams.append(stream)
        assert established_owners(rig.pod).keys() == {old.proc.pid, worker}, "the test needs both processes busy"

        new = rig.start_proxy("--drain-deadline", "5")
        await new.ready()
        old.stop(signal.SIGTERM)
        await until("the old processes stopped listening", lambda: hbone_listeners(rig.pod) == {new.proc.pid})
        await asyncio.sleep(3)  # past the 1 s bound without a successor
        for n, stream in enumerate(streams):
            await echo(stream, f"after the hand-over {n}".encode())
        client = await rig.hbone_client()
        await echo(await rig.tunnel(client), b"a new connection, to the successor")
        await client.aclose()
        assert old.proc.poll() is None and alive(worker)

        for stream in streams:
            stream.write_eof()
            await stream.aclose()
        for client in clients:
            await client.aclose()
        assert await old.exited(20) == 0
        await until("the old worker exited", lambda: not alive(worker), within=5)
        log = old.log.read_text()
        assert "Traceback" not in log, log[-3000:]


@pytest.mark.parametrize("first", ["signal", "word"])
async def test_a_worker_drains_on_after_its_node_proxys_own_connections_ended_though_sigterm_reached_both(
    tmp_path: Path, first: str
) -> None:
    """A runtime or init system may signal the whole process group: the worker gets the node proxy's SIGTERM and
    the node proxy's word to drain, in either order, and neither is a second ask (a second SIGTERM would cut the
    drain short). And the node proxy's own drain ending (its connections all closed) does not end its workers'
    drains: they keep their tunnels until these end, while the node proxy waits for them."""
    async with drain_rig(tmp_path) as (rig, agent):
        old = rig.start_proxy("--drain-deadline", "1", "--drain-max", "60", "--workers", "2")
        await add_pod(agent, rig)
        await old.ready()
        worker = await serving_worker(rig, old)
        pairs = []
        for n in range(CONNECTIONS):
            client = await rig.hbone_client()
            stream = await rig.tunnel(client)
            await echo(stream, f"before the hand-over {n}".encode())
            pairs.append((client, stream))
        owners = owner_by_port(rig.pod)
        held = {
            pid: [p for p in pairs if owners.get(rig.client_ports[id(p[0])]) == pid] for pid in (old.proc.pid, worker)
        }
        assert all(held.values()) and sum(map(len, held.values())) == CONNECTIONS, owners

        new = rig.start_proxy("--drain-deadline", "5")
        await new.ready()
        for client, stream in held[old.proc.pid]:  # the node proxy's own connections end
            stream.write_eof()
            await stream.aclose()
            await client.aclose()
        if first == "signal":  # as a signal to the process group reaches both
            os.kill(worker, signal.SIGTERM)
            old.stop(signal.SIGTERM)
        else:  # the same, with the node proxy's word read by the worker before its own signal
            old.stop(signal.SIGTERM)
            await until(
                "the worker heard the word", lambda: "stop requested (the node proxy drains)" in old.log.read_text()
            )
            os.kill(worker, signal.SIGTERM)
        await until(
            "the node proxy's own drain over", lambda: "drain over: every connection ended" in old.log.read_text()
        )
        await asyncio.sleep(3)  # past the 1 s bound without a successor, and past the node proxy's word to drain
        for n, (_, stream) in enumerate(held[worker]):
            await echo(stream, f"after the node proxy's drain {n}".encode())
        assert alive(worker) and old.proc.poll() is None, "the node proxy waits for its worker"

        for client, stream in held[worker]:
            stream.write_eof()
            await stream.aclose()
            await client.aclose()
        assert await old.exited(20) == 0
        await until("the old worker exited", lambda: not alive(worker), within=5)
        log = old.log.read_text()
        assert "Traceback" not in log and "connection(s) left" not in log, log[-3000:]
