"""Hand-overs in a row with real ``ambit nodeproxy`` processes (:mod:`tests.netns.nodeproxy_rig`): the rollout
soak's properties (tests/faults/test_rollout_soak.py) without a lab, so that they hold where no lab is up.

:data:`STREAMS` HBONE tunnels to the pod's echo server, each on an HBONE connection of its own, carry a byte
sequence of their own continuously (:class:`tests.faults.soak_streams.Sequence`: every echoed byte checked at its
offset) while a steady loop opens new HBONE connections and tunnels to the pod (one echo each) and the node proxy is
replaced :data:`HAND_OVERS` times in a row: a new process starts, gets the pod in its snapshot, reports ready (the
test, as the node agent, then tells the older ones a successor holds every pod), and the current one gets SIGTERM.
Every proxy runs with a 1 s no-successor bound (``--drain-deadline``) and a long ``--drain-max``, so an old proxy
that kept its tunnels past the short bound did so because of the hand-over. At the end every stream sends no more,
waits for the echo of all it sent and closes; each old proxy then exits on its own ("every connection ended").

Fails on: any stream whose bytes differ from its sequence or that broke, any new connection that failed, any old
proxy that did not exit on its own once its tunnels ended, a traceback in a proxy's log.
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.faults.soak_streams import Sequence
from tests.netns.nodeproxy_rig import (
    CLIENT_ID,
    ECHO_PORT,
    POD_ID,
    POD_IP,
    DrainRig,
    Proxy,
    add_pod,
    drain_rig,
    echo,
)

from ambit.proxy.hbone_client import HboneClient
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.pool import ConnectionPool, PoolKey

pytestmark = [pytest.mark.root, pytest.mark.timeout(300)]

STREAMS = 10
HAND_OVERS = 3
BETWEEN = 8.0
"""Seconds between hand-overs (and before the first, after the last)."""
CHUNK = 1024
PERIOD = 0.05
"""Seconds between a stream's chunks: 20 KiB/s each."""
WINDOW = 64 * 1024
NEW_EVERY = 0.25
"""Seconds between new connections."""
FLAGS = ("--drain-deadline", "1", "--drain-max", "300")
UNTIL = 30.0


@dataclass
class Verified:
    """One long-lived tunnel: what it sent, what came back and matched."""

    name: str
    client: HboneClient
    stream: HboneStream
    sent: int = 0
    verified: int = 0
    outcome: str = ""

    async def run(self, stop: asyncio.Event) -> None:
        seq = Sequence("AMBITHANDOVER", self.name)
        progress = asyncio.Event()

        async def receive() -> None:
            while True:
                data = await self.stream.read()
                if not data:
                    return
                seq.check(self.verified, data)
                self.verified += len(data)
                progress.set()

        reader = asyncio.create_task(receive())
        try:
            while not stop.is_set():
                if self.sent - self.verified + CHUNK > WINDOW:
                    progress.clear()
                    async with asyncio.timeout(UNTIL):
                        await progress.wait()
                    continue
                await self.stream.write(seq.bytes_at(self.sent, CHUNK))
                self.sent += CHUNK
                await asyncio.sleep(PERIOD)
            async with asyncio.timeout(UNTIL):
                while self.verified < self.sent and not reader.done():
                    progress.clear()
                    await progress.wait()
                self.stream.write_eof()
                await reader  # the echo server closes after our EOF: the tunnel's end
            self.outcome = "ended" if self.verified == self.sent else f"short by {self.sent - self.verified} bytes"
        except Exception as exc:  # what broke is the outcome; the test asserts on it
            self.outcome = f"{type(exc).__name__}: {exc}"
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            await self.stream.aclose()
            await self.client.aclose()


async def new_connections(rig: DrainRig, stop: asyncio.Event, outcomes: list[str], began: float) -> None:
    """A connection per tunnel, dialled the way a node proxy's pool dials (one stream per connection, closed when
    it ends): a connection the old proxy accepted just before it was told to drain gets its GOAWAY before the
    CONNECT is sent, and the pool opens the tunnel on a fresh connection, as ztunnel's does. Anything else that
    fails is counted."""
    pool = ConnectionPool(max_streams=1, idle_timeout=0)
    key = PoolKey(CLIENT_ID, frozenset({POD_ID}), "client", (POD_IP, 15008))
    n = 0
    try:
        while not stop.is_set():
            try:
                stream = await pool.open_tunnel(key, f"{POD_IP}:{ECHO_PORT}", [], rig.hbone_client)
                try:
                    await echo(stream, f"new connection {n}".encode())
                finally:
                    await stream.aclose()
                outcomes.append("ok")
            except Exception as exc:  # counted: the test asserts none
                outcomes.append(f"{type(exc).__name__}: {exc} (at {time.monotonic() - began:.2f} s)")
            n += 1
            await asyncio.sleep(NEW_EVERY)
    finally:
        await pool.aclose()


def _noteworthy(rig: DrainRig) -> dict[int, list[str]]:
    """Each proxy's log lines above INFO, and its drain's, for a failure's message."""
    keep = ("WARNING", "ERROR", "drain", "successor")
    lines = {proxy.proc.pid: proxy.log.read_text(errors="replace").splitlines() for proxy in rig.proxies}
    return {pid: [line for line in text if any(k in line for k in keep)] for pid, text in lines.items()}


async def test_tunnels_outlive_three_hand_overs_in_a_row_byte_for_byte_and_no_new_connection_fails(
    tmp_path: Path,
) -> None:
    async with drain_rig(tmp_path) as (rig, agent):
        current = rig.start_proxy(*FLAGS)
        await add_pod(agent, rig)
        await current.ready()
        streams = []
        for n in range(STREAMS):
            client = await rig.hbone_client()
            streams.append(Verified(f"s{n}", client, await client.open_tunnel(f"{POD_IP}:{ECHO_PORT}", [])))
        stop = asyncio.Event()
        outcomes: list[str] = []
        began = time.monotonic()
        timeline: list[str] = []  # what happened when, for a failure's message

        def happened(what: str) -> None:
            timeline.append(f"{time.monotonic() - began:.2f} s {what}")

        tasks = [asyncio.create_task(s.run(stop)) for s in streams]
        tasks.append(asyncio.create_task(new_connections(rig, stop, outcomes, began)))
        old: list[tuple[Proxy, float]] = []
        exited: dict[int, float] = {}

        async def watch(proxy: Proxy) -> None:
            await asyncio.get_running_loop().run_in_executor(None, proxy.proc.wait)
            exited[proxy.proc.pid] = time.monotonic()
            happened(f"proxy {proxy.proc.pid} exited")

        watchers = []
        try:
            for turn in range(HAND_OVERS):
                await asyncio.sleep(BETWEEN)
                successor = rig.start_proxy(*FLAGS)
                happened(f"proxy {successor.proc.pid} started")
                await successor.ready()
                happened(f"proxy {successor.proc.pid} ready")
                deadline = time.monotonic() + UNTIL
                while "successor holds every pod" not in current.log.read_text():
                    assert time.monotonic() < deadline, f"hand-over {turn + 1}: the old proxy was never told"
                    await asyncio.sleep(0.05)
                current.stop(signal.SIGTERM)
                happened(f"proxy {current.proc.pid} told to stop (SIGTERM)")
                old.append((current, time.monotonic()))
                watchers.append(asyncio.create_task(watch(current)))
                current = successor
            await asyncio.sleep(BETWEEN)
        finally:
            stopping = time.monotonic()
            stop.set()
            await asyncio.gather(*tasks)
        ended = time.monotonic()
        async with asyncio.timeout(UNTIL):
            await asyncio.gather(*watchers)
        exits = [exited[proxy.proc.pid] - stopped for proxy, stopped in old]
        assert [proxy.proc.returncode for proxy, _ in old] == [0] * HAND_OVERS
        failed = [o for o in outcomes if o != "ok"]
        print(
            f"\n{STREAMS} tunnels through {HAND_OVERS} hand-overs in {ended - began:.0f} s: outcomes"
            f" {sorted({s.outcome for s in streams})}, bytes verified {[s.verified for s in streams]};"
            f" new connections {len(outcomes)}, failed {len(failed)}; old proxies exited"
            f" {', '.join(f'{e:.1f}' for e in exits)} s after their SIGTERM; the tunnels were told to end"
            f" {stopping - old[0][1]:.1f} s after the first SIGTERM and ended {ended - stopping:.1f} s later"
        )
        assert [s.outcome for s in streams] == ["ended"] * STREAMS, [(s.name, s.outcome) for s in streams]
        assert all(s.verified == s.sent >= CHUNK * 10 for s in streams), [(s.sent, s.verified) for s in streams]
        assert failed == [] and len(outcomes) >= 10, (failed[:10], timeline, _noteworthy(rig))
        # The first old proxy held every tunnel from the first hand-over to their end, far past its 1 s bound, and
        # exited once they ended; the later ones, holding no tunnel, exited before the tunnels were told to end.
        assert stopping <= exited[old[0][0].proc.pid] and exits[0] > HAND_OVERS * BETWEEN, exits
        assert all(exited[proxy.proc.pid] < stopping for proxy, _ in old[1:]), (exits, stopping - began)
        for proxy, _ in old:
            log = proxy.log.read_text()
            assert "drain over: every connection ended" in log and "Traceback" not in log, proxy.tail()
        assert current.proc.poll() is None and "Traceback" not in current.log.read_text()
