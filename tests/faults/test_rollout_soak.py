"""The rollout soak (issue 21): long-lived streams carry data through the mesh while the node proxies are rolled
again and again, and none of them loses, reorders or corrupts a byte, none is reset, and no new connection fails.

On the shared 2-node mesh lab (the mesh installed from deploy/, as the fault suite's), in the fault suite's scene
(:mod:`tests.faults.scene`: ``srv-1``/``cli-1`` on node-1, ``srv-2``/``cli-2`` on node-2, each client with a
same-node and a cross-node server) the soak client (:mod:`tests.faults.soak_streams`) runs in both
client pods: :data:`STREAMS_PER_PAIR` long-lived streams per pair (:data:`STREAMS` in all), each sending its own
byte sequence continuously and checking every echoed byte, opened before the first rollout and kept until the end;
and new short connections at :data:`RATE` per second per pair. Meanwhile ``kubectl rollout restart
daemonset/ztunnel -n istio-system`` (the lab's real kubectl and DaemonSet controller: maxSurge 1, maxUnavailable 0)
runs :data:`ROLLOUTS` times in a row, each once the previous one's new pods are ready and its old pods terminating,
spread over the profile's seconds. Every old pod keeps relaying the streams it holds (a hand-over: its successor took
the pods, so it drains up to ``DRAIN_MAX``, deploy's hour); so at the end the first rollout's old pods still carry
every stream. Then the client stops: each stream waits for the echo of all it sent and closes cleanly; the old
proxies, their connections ended, exit on their own.

Profiles (environment): ``AMBIT_SOAK_SECONDS`` (default :data:`SHORT_SECONDS`: the short profile, in the machine
share; a comma-separated list runs each in turn on the same lab) and ``AMBIT_SOAK_ROLLOUTS`` (default 3); ``make
soak-rollout`` runs the short profile, ``make soak-rollout-long`` an hour with 6 rollouts, and both write
``bench/results/soak-rollout-<seconds>s.md`` (``AMBIT_SOAK_RESULTS``, where ``{seconds}`` is replaced).
``AMBIT_SOAK_UNTIL`` (a Unix time) skips a profile that would not end before it: for a soak squeezed into a window
of a shared machine, decided once the lab is up rather than when the run was queued.

Reported: bytes sent/received/verified per stream, new connections tried and failed by outcome, each rollout's
time to new ready pods, each old pod's drain (from deletion until gone from the API) and how its proxy ended.
Failed on: any stream not ``ended`` with sent = received = verified (lost, reordered or corrupted bytes, a reset,
an early EOF, a stall), any new connection that did not succeed, any old proxy that did not exit on its own once
its connections ended, any traceback in the components' logs.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.lab_driver import COMPONENT_APPS, TEST_TIMEOUT, Lab, module_on_shared_lab, wait_until
from tests.faults.rig import REPO
from tests.faults.scene import (
    EVERY_PAIR,
    ROLLOUT_TIMEOUT,
    SYSTEM,
    OldProxy,
    Rollout,
    Scene,
    roll_node_proxies,
    set_up,
)

SHORT_SECONDS = 48.0
PROFILES = [float(each) for each in os.environ.get("AMBIT_SOAK_SECONDS", f"{SHORT_SECONDS:g}").split(",")]
"""Seconds from the streams being up until the client is stopped, one test per value."""
UNTIL = float(os.environ.get("AMBIT_SOAK_UNTIL", "inf"))
OVERHEAD = 300.0
"""Seconds a profile takes beyond its load, at most as far as :data:`UNTIL` is concerned: the rollouts running late,
the streams' ends, the old pods' exits."""
ROLLOUTS = int(os.environ.get("AMBIT_SOAK_ROLLOUTS", "3"))
RESULTS = os.environ.get("AMBIT_SOAK_RESULTS", "")
"""Where to write the figures as markdown, ``{seconds}`` replaced by the profile's (empty: printed only)."""
STREAMS_PER_PAIR = 5
STREAMS = STREAMS_PER_PAIR * len(EVERY_PAIR)
STREAM_RATE = 16384
"""Bytes per second each stream sends (20 streams: 320 KiB/s each way through the mesh)."""
RATE = 5.0
"""New short connections per second per pair (20 per second in all)."""
SETTLE = 10.0
"""Seconds at least between a rollout's end (new pods ready, old ones terminating) and the next restart."""
STALL = 30.0
"""Seconds without echo progress after which the client calls a stream stalled: a bound on correctness, far above
anything a rollout costs (the streams' proxies keep running throughout)."""
GONE_BOUND = 90.0
"""Seconds within which every old pod must be gone once the streams ended: each proxy exits as soon as it holds no
connection (it counts them every 50 ms); the rest is the kubelet's reaping and the API on a loaded machine."""
NODE_PROXY = COMPONENT_APPS["nodeproxy"]
NAMESPACE = "soak"

pytestmark = [pytest.mark.root, pytest.mark.kubectl]


SHARES_THE_MESH_LAB = True
"""The module runs on the shared mesh lab (:func:`tests.e2e.lab_driver.module_on_shared_lab`; the mesh installed
from deploy/, as the fault suite's): no lab of its own to bring up. It leaves the node proxies rolled (as
tests/e2e/test_lab_rollout.py does) and its namespace deleted."""


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    with module_on_shared_lab(tmp_path_factory) as lab:
        for node in (n.name for n in lab.topology.all_nodes()):
            wait_until(f"a ready node proxy on {node}", lambda node=node: lab.ready_component(NODE_PROXY, node), 60)
        lab.namespace(NAMESPACE)
        yield set_up(lab, NAMESPACE)
        assert lab.log_tracebacks() == []


class SoakClients:
    """The soak client in each client pod (:mod:`tests.faults.soak_streams`), records read back as they come."""

    def __init__(self, scene: Scene, directory: Path, marker: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.files: list[Path] = []
        for client in ("cli-1", "cli-2"):
            out = directory / f"soak-{client}.jsonl"
            argv = ["ip", "netns", "exec", scene.netns[client], sys.executable, "-m", "tests.faults.soak_streams"]
            argv += ["--marker", marker, "--streams", str(STREAMS_PER_PAIR), "--stream-rate", str(STREAM_RATE)]
            argv += ["--rate", f"{RATE:g}", "--stall", f"{STALL:g}", "--out", str(out)]
            for target in scene.targets(client):
                argv += ["--target", f"{client}>{target}"]
            with open(directory / f"soak-{client}.log", "ab") as log:
                self.procs.append(subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=log, stdin=subprocess.DEVNULL))
            self.files.append(out)

    def records(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for path in self.files:
            if path.is_file():
                for line in path.read_text().splitlines():
                    with contextlib.suppress(ValueError):
                        found.append(json.loads(line))
        return found

    def running(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self) -> list[dict[str, Any]]:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(20)
        assert [p.returncode for p in self.procs] == [0, 0], "a soak client failed (see soak-cli-*.log)"
        return self.records()


def note_gone(lab: Lab, old: list[OldProxy]) -> bool:
    """Note the time each old proxy pod is first seen gone from the API; whether all are."""
    present = {p["metadata"]["uid"] for p in lab.pods(SYSTEM, NODE_PROXY)}
    now = time.time()
    for proxy in old:
        if proxy.uid not in present and not proxy.gone:
            proxy.gone = now
    return all(o.gone for o in old)


def watch_gone(lab: Lab, rollouts: list[Rollout], until: float) -> None:
    """Sleep until ``until``, noting meanwhile when the old pods of the rollouts so far go: a rollout is over once
    its new pods are ready and its old ones terminating, and a kubelet may take a moment after that to reap one,
    so "gone" must be watched between the rollouts too, not only after the soak (it then read as hours late)."""
    old = [o for r in rollouts for o in r.old]
    while (left := until - time.time()) > 0:
        if old and not all(o.gone for o in old):
            note_gone(lab, old)
        time.sleep(min(0.5, max(left, 0.0)))


def wait_gone(lab: Lab, old: list[OldProxy], timeout: float) -> None:
    wait_until("every old node proxy pod gone", lambda: note_gone(lab, old), timeout, interval=0.2)


@pytest.mark.parametrize(
    "seconds",
    [
        pytest.param(
            s, id=f"{s:g}s", marks=pytest.mark.timeout(TEST_TIMEOUT + s + ROLLOUTS * ROLLOUT_TIMEOUT + GONE_BOUND)
        )
        for s in PROFILES
    ],
)
def test_long_streams_through_repeated_rollouts_lose_no_byte_and_no_new_connection_fails(
    scene: Scene, tmp_path: Path, seconds: float
) -> None:
    if time.time() + seconds + OVERHEAD > UNTIL:
        pytest.skip(f"a {seconds:g} s soak would not end before AMBIT_SOAK_UNTIL")
    lab = scene.lab
    marker = "AMBITSOAK" + secrets.token_hex(6)
    clients = SoakClients(scene, tmp_path / "soak", marker)
    rollouts: list[Rollout] = []
    try:

        def warm() -> bool:
            records = clients.records()
            assert clients.running(), "a soak client exited"
            up = [r for r in records if r["kind"] == "stream-up"]
            answered = {r["target"] for r in records if r["kind"] == "new" and r["outcome"] == "ok"}
            return len(up) == STREAMS and answered == set(EVERY_PAIR)

        wait_until("every stream up and every pair answered", warm, 60)
        began = time.time()
        for turn in range(ROLLOUTS):
            at = began + (turn + 1) * seconds / (ROLLOUTS + 1)
            if rollouts:
                at = max(at, rollouts[-1].completed + SETTLE)
            watch_gone(lab, rollouts, at)
            assert clients.running(), "a soak client exited"
            rollouts.append(roll_node_proxies(lab))
        watch_gone(lab, rollouts, time.time() + max(SETTLE, began + seconds - time.time()))
        stopped = time.time()
    finally:
        records = clients.stop()
    old = [o for r in rollouts for o in r.old]
    wait_gone(lab, old, GONE_BOUND)
    ended_at = max((r["end"] for r in records if r["kind"] == "stream"), default=stopped)

    streams = sorted((r for r in records if r["kind"] == "stream"), key=lambda r: r["stream"])
    new = [r for r in records if r["kind"] == "new"]
    new_outcomes = Counter(r["outcome"] for r in new)
    during = [r for r in new if rollouts and rollouts[0].began <= r["start"] <= stopped]
    table = figures(seconds, streams, new_outcomes, during, rollouts, began, stopped, ended_at)
    print("\n" + table)
    if RESULTS:
        out = Path(RESULTS.replace("{seconds}", f"{seconds:g}"))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table)

    # Every stream lasted the whole soak and ended cleanly, every byte echoed in order and intact.
    assert len(streams) == STREAMS, streams
    broken = [r for r in streams if r["outcome"] != "ended" or not r["sent"] == r["received"] == r["verified"]]
    assert broken == [], broken
    for r in streams:
        assert r["start"] < (rollouts[0].began if rollouts else began), r
        assert r["sent"] >= STREAM_RATE * (stopped - r["start"]) / 4, ("a stream that barely moved", r)
    # No new connection failed, before, during or after the rollouts.
    assert set(new_outcomes) == {"ok"}, [r for r in new if r["outcome"] != "ok"][:20]
    assert {r["target"] for r in during} == set(EVERY_PAIR), "each pair tried new connections meanwhile"
    # Each rollout replaced both nodes' proxies; each old proxy drained until its connections ended, then exited.
    assert len(rollouts) == ROLLOUTS and all(len(r.old) == 2 for r in rollouts), rollouts
    outcomes = {f"{o.node} {o.name}": o.outcome() for o in old}
    assert set(outcomes.values()) == {"every connection ended"}, outcomes
    for proxy in rollouts[0].old:  # the first rollout's old proxies carried the streams to their end
        assert proxy.gone >= min(r["end"] for r in streams) - 1.0, (vars(proxy), ended_at)


def proxy_drain(proxy: OldProxy) -> str:
    """How long the old proxy itself drained, from its log: its "draining:" line to its "drain over:" line (the pod
    is gone from the API some time after, once the kubelet reaped it)."""
    text = proxy.log.read_text(errors="replace") if proxy.log.is_file() else ""
    start = end = None
    for line in text.splitlines():
        stamp = line[:23]
        if "draining: closing every listener" in line and start is None:
            start = stamp
        elif "drain over:" in line:
            end = stamp
    if start is None or end is None:
        return "no drain logged"
    fmt = "%Y-%m-%d %H:%M:%S,%f"
    took = (datetime.strptime(end, fmt) - datetime.strptime(start, fmt)).total_seconds()
    return f"{took:.1f} s"


def figures(
    seconds: float,
    streams: list[dict[str, Any]],
    new_outcomes: Counter[str],
    during: list[dict[str, Any]],
    rollouts: list[Rollout],
    began: float,
    stopped: float,
    ended_at: float,
) -> str:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# Rollout soak ({seconds:g} s, {ROLLOUTS} rollouts; tests/faults/test_rollout_soak.py)",
        "",
        f"Measured {stamp}; load average at the end {os.getloadavg()[0]:.1f}. {STREAMS} long-lived streams"
        f" ({STREAMS_PER_PAIR} per pair, same-node and cross-node, {STREAM_RATE} B/s each way each) and"
        f" {4 * RATE:g} new connections/s, {stopped - began:.0f} s; `kubectl rollout restart daemonset/ztunnel`"
        f" {len(rollouts)} times.",
        "",
        "| rollout | restart at | new proxies ready after | old pods deleted after | old proxies' own drain"
        " | old pods gone after restart |",
        "|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rollouts, 1):
        deleted = ", ".join(f"{o.node} {o.terminating - r.began:.1f} s" for o in r.old)
        gone = ", ".join(
            f"{o.node} {o.gone - r.began:.1f} s ({o.gone - o.terminating:.1f} s after deletion)" for o in r.old
        )
        drained = ", ".join(f"{o.node} {proxy_drain(o)}" for o in r.old)
        lines.append(f"| {i} | +{r.began - began:.1f} s | {r.seconds:.1f} s | {deleted} | {drained} | {gone} |")
    lines += [
        "",
        f"Old proxies' ends (their logs): {dict(Counter(o.outcome() for r in rollouts for o in r.old))}; the streams"
        f" ended {ended_at - stopped:.1f} s after the stop, the last old pod gone"
        f" {max((o.gone for r in rollouts for o in r.old), default=ended_at) - ended_at:.1f} s after that.",
        "",
        f"New connections: {sum(new_outcomes.values())} tried, by outcome {dict(new_outcomes)};"
        f" {len(during)} from the first restart to the stop, {sum(r['outcome'] != 'ok' for r in during)} failed.",
        "",
        "| stream | outcome | sent (B) | received (B) | verified (B) | lasted |",
        "|---|---|---|---|---|---|",
    ]
    for s in streams:
        lines.append(
            f"| {s['stream']} | {s['outcome']} | {s['sent']} | {s['received']} | {s['verified']} |"
            f" {s['end'] - s['start']:.0f} s |"
        )
    total = sum(int(r["verified"]) for r in streams)
    lines += [
        "",
        f"Bytes verified in all: {total} ({total / 2**20:.1f} MiB) of {sum(int(r['sent']) for r in streams)} sent.",
    ]
    return "\n".join(lines) + "\n"
