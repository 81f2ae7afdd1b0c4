"""The traffic scene the fault suite and the e2e rollout test share: four pods, a steady load, what it must keep.

In an ambient namespace: ``srv-1`` and ``cli-1`` on node-1, ``srv-2`` and ``cli-2`` on node-2 (:func:`set_up`), so
each client has a same-node and a cross-node server. :func:`steady_load` runs :mod:`tests.faults.load` from both
clients (new connections at a rate per pair, and one long-lived stream per pair carrying data both ways, each echo
compared with what was sent) and ``tcpdump`` on every link of both nodes (:mod:`tests.faults.rig`), from warm (every
stream up, every pair answered) until the block ends; its streams may have a lifetime of their own, and extra
streams that live until the load stops may run beside them (``outliving``). :func:`roll_node_proxies` is the node
proxies' upgrade on an installed mesh: ``kubectl rollout restart daemonset/ztunnel``, node by node (maxSurge 1,
maxUnavailable 0), the old pods draining beside the new ones (a hand-over: each old proxy keeps its connections until
they end, up to its ``DRAIN_MAX``), while ``kubectl rollout status`` runs from the restart on.
:func:`rollout_under_load` is that upgrade with the load running from before the restart until the old pods are
gone: the loads' streams end on their own soon after the restart, the ``outliving`` ones when the test says.
:func:`roll_env` changes the node proxies' environment (another rollout).

Shared by ``tests/faults/test_faults.py`` and ``tests/e2e/test_lab_rollout.py``, which import it; nothing here
asserts a bound of its own except the capture's positive control and the checks every fault row must pass.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.lab_driver import COMPONENT_APPS, Lab, ambit, is_ready, pod_manifest, sleeper, wait_until
from tests.faults.load import KEPT
from tests.faults.report import ROWS, FaultRow, lost, recovery_time
from tests.faults.rig import LoadRun, PlaintextCapture

PORT = 9000
RATE = 5.0
"""New connections per second per client-server pair (four pairs: 20 per second in all)."""
REDIRECTION = "ambient.istio.io/redirection"
SAME_NODE = ("cli-1>srv-1", "cli-2>srv-2")
CROSS_NODE = ("cli-1>srv-2", "cli-2>srv-1")
EVERY_PAIR = SAME_NODE + CROSS_NODE
RECOVERY_BOUND = 60.0
"""Seconds within which new connections must succeed again after a part is back: a bound on correctness."""
SYSTEM = "istio-system"
NO_SUCCESSOR_DEADLINE = 25.0
"""How long a node proxy stopped with no successor lets its connections run before it closes them
(``CONNECTION_TERMINATION_DEADLINE`` in deploy/base/ztunnel, as ztunnel chart's 30 s grace period less 5 s); a node
proxy stopped after a hand-over keeps them until they end, up to ``DRAIN_MAX`` (:mod:`ambit.inpod.drain`)."""
ROLLOUT_STATUS_BOUND = 60.0
"""Seconds within which ``kubectl rollout status daemonset/ztunnel`` must report the rollout complete after the
restart (upstream's TestZtunnelRestart waits that long): both nodes' new pods and the old pods' drain (as kube's,
the DaemonSet status judges a node by its oldest pod, so the old pods must be gone)."""
OLD_PODS_GONE_BOUND = 90.0
"""Seconds :func:`wait_old_proxies_gone` waits for the old pods to go once they are terminating: their connections'
ends (the loads' own) and the kubelet's reaping; a test bound, not a measurement."""
ROLLOUT_TIMEOUT = 240.0
"""Seconds to wait for the node proxies' new pods (both nodes, each new pod's start and readiness): a test bound."""
STREAM_LIFETIME = 20.0
"""Seconds each stream of :func:`rollout_under_load`'s load lives before it closes on its own."""
ENDS_AFTER = 12.0
"""Seconds after the restart at which the streams up before it end on their own: inside every old proxy's drain
window (its pod is deleted after the restart and drains for :data:`NO_SUCCESSOR_DEADLINE` even without a hand-over),
so the fault suite's row holds for either bound."""


@dataclass
class Scene:
    lab: Lab
    namespace: str
    ips: dict[str, str]
    netns: dict[str, str]
    """Pod name or node name → its network namespace."""

    def targets(self, client: str) -> list[str]:
        return [f"{srv}={self.ips[srv]}:{PORT}" for srv in ("srv-1", "srv-2")]


def tcp_echo(port: int) -> dict[str, Any]:
    return {
        "name": "echo",
        "image": "none",
        "command": ["python3", "-m", "ambit.lab.apps", "tcp-echo", "--port", str(port)],
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 1},
    }


def wait_enrolled(lab: Lab, namespace: str, name: str, timeout: float = 30.0) -> dict[str, Any]:
    def enrolled() -> dict[str, Any] | None:
        pod = lab.pod(name, namespace)
        annotations = pod["metadata"].get("annotations") or {}
        return pod if is_ready(pod) and annotations.get(REDIRECTION) == "enabled" else None

    try:
        return wait_until(f"{namespace}/{name} Ready and enrolled", enrolled, timeout)
    except pytest.fail.Exception as exc:
        raise pytest.fail.Exception(f"{exc.msg}\n{pod_story(lab, namespace, name)}", pytrace=False) from None


def pod_story(lab: Lab, namespace: str, name: str) -> str:
    """What a pod that never became Ready and enrolled shows: its phase, conditions, annotation and events."""
    done = lab.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
    if done.returncode != 0:
        return f"pod: {done.stderr.strip()}"
    pod = json.loads(done.stdout)
    status = pod.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or ()}
    annotation = (pod["metadata"].get("annotations") or {}).get(REDIRECTION)
    events = [f"{e.get('reason')}: {e.get('message') or e.get('note')}" for e in lab.events(namespace, name)]
    return (
        f"pod: phase {status.get('phase')}, conditions {conditions}, {REDIRECTION}={annotation}, "
        f"podIP {status.get('podIP')}; events: {events}\n"
        f"the lab's log lines that name it (the last {STORY_LINES}):\n" + "\n".join(log_lines(lab, name))
    )


STORY_LINES = 60


def log_lines(lab: Lab, word: str) -> list[str]:
    """The last :data:`STORY_LINES` lines naming ``word`` in the lab's logs (its processes', nodes' and pods'),
    each after its file's name, in the order of their timestamps."""
    found = []
    d = lab.directory
    for log in [*(d / "logs").glob("*.log"), *(d / "nodes").glob("*/*.log"), *(d / "pods").glob("*/*.log")]:
        try:
            text = log.read_text(errors="replace")
        except OSError:
            continue
        found += [
            f"{line[:23]} {log.parent.name}/{log.name}: {line[24:400]}" for line in text.splitlines() if word in line
        ]
    return sorted(found)[-STORY_LINES:]


def set_up(lab: Lab, namespace: str) -> Scene:
    """The four pods in ``namespace`` (made ambient here; it must exist), once Ready and enrolled."""
    lab.kubectl("label", "namespace", namespace, "istio.io/dataplane-mode=ambient")
    lab.apply(
        pod_manifest("srv-1", [tcp_echo(PORT)], node="node-1"),
        pod_manifest("srv-2", [tcp_echo(PORT)], node="node-2"),
        pod_manifest("cli-1", [sleeper()], node="node-1"),
        pod_manifest("cli-2", [sleeper()], node="node-2"),
        namespace=namespace,
    )
    pods = {name: wait_enrolled(lab, namespace, name, 60) for name in ("srv-1", "srv-2", "cli-1", "cli-2")}
    nodes = {n.name: n.netns for n in lab.topology.all_nodes()}
    return Scene(
        lab=lab,
        namespace=namespace,
        ips={name: str(pod["status"]["podIP"]) for name, pod in pods.items()},
        netns={name: lab.pod_netns(pod) for name, pod in pods.items()} | nodes,
    )


@dataclass
class Trial:
    """One fault's run of the load and the capture, and what they saw once stopped."""

    marker: str
    load: LoadRun
    outliving: LoadRun | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    outliving_records: list[dict[str, Any]] = field(default_factory=list)
    """The records of the ``outliving`` streams (streams only, no lifetime), apart from the main load's."""
    plaintext: int = -1
    control_seen: int = -1
    stopped_at: float = 0.0
    """When the load was told to stop (its streams were closed by the clients from then on)."""

    def now_records(self) -> list[dict[str, Any]]:
        return self.load.records()


@contextlib.contextmanager
def steady_load(
    scene: Scene,
    directory: Path,
    stream_lifetime: float = 0.0,
    outliving: tuple[str, ...] = (),
    outliving_lifetime: float = 0.0,
) -> Iterator[Trial]:
    """The load from both clients and the capture on both nodes, from warm (every stream up, every pair answered)
    until the block ends; then the positive control, and the counts. ``stream_lifetime``: each stream's own length
    (0: until the load stops); ``outliving``: pairs (``cli-1>srv-2``) that get one more stream, from a load of its
    own (streams only), each living ``outliving_lifetime`` seconds (0: until the load stops)."""
    marker = "AMBITFAULT" + secrets.token_hex(6)
    control = "AMBITCONTROL" + secrets.token_hex(6)
    capture = PlaintextCapture(directory / "capture", [scene.netns["node-1"], scene.netns["node-2"]])
    load = long = None
    try:
        clients = {c: (scene.netns[c], scene.targets(c)) for c in ("cli-1", "cli-2")}
        load = LoadRun(directory, marker, clients, RATE, stream_lifetime)
        if outliving:
            extra: dict[str, tuple[str, list[str]]] = {}
            for pair in outliving:
                client, _, server = pair.partition(">")
                extra.setdefault(client, (scene.netns[client], []))[1].append(f"{server}={scene.ips[server]}:{PORT}")
            long = LoadRun(directory / "outliving", marker, extra, 0.0, outliving_lifetime)
        trial = Trial(marker, load, long)

        def warm() -> bool:
            records = load.records()
            up = {r["target"] for r in records if r["kind"] == "stream-up"}
            answered = {r["target"] for r in records if r["kind"] == "new" and r["outcome"] == "ok"}
            assert load.running() and (long is None or long.running()), "a load process exited"
            long_up = {r["target"] for r in long.records() if r["kind"] == "stream-up"} if long else set()
            return len(up) == 4 and len(answered) == 4 and long_up == set(outliving)

        wait_until("the load warm on all four pairs", warm, 30)
        yield trial
        trial.stopped_at = time.time()
        trial.records = load.stop()
        if long is not None:
            trial.outliving_records = long.stop()
        trial.control_seen = capture.control(control, [(scene.ips["srv-1"], PORT), (scene.ips["srv-2"], PORT)])
    finally:
        for each in (load, long):
            if each is not None:
                each.stop()
        capture.stop()
    trial.plaintext = capture.count(marker.encode())


def check_row(trial: Trial, row: FaultRow) -> None:
    """What every fault must keep: the capture works and saw no payload in clear; no data lost."""
    ROWS.append(row)
    assert trial.control_seen == 2, "a capture missed the positive control: it cannot vouch for anything"
    assert row.plaintext == 0, f"the load's payload crossed a node link in clear {row.plaintext} times"
    assert row.lost == 0, [r for r in trial.records if r["outcome"] == "mismatch"]
    assert lost(trial.outliving_records) == 0, [r for r in trial.outliving_records if r["outcome"] == "mismatch"]


def wait_recovered(trial: Trial, since: float) -> float:
    """Until every pair answered again after its last failure since ``since``; the seconds that took."""

    def recovered() -> tuple[float] | None:
        # A 1-tuple, because a recovery of 0.0 s (no pair failed at all) is falsy and wait_until would wait on.
        took = recovery_time(trial.now_records(), since)
        return (took,) if took != float("inf") and time.time() > since + 1 else None

    (took,) = wait_until("new connections succeeding on every pair again", recovered, RECOVERY_BOUND)
    return took


def failures(records: list[dict[str, Any]], begin: float, end: float, targets: tuple[str, ...]) -> list[str]:
    return [
        f"{r['target']} {r['outcome']} {r['detail']}"
        for r in records
        if r["kind"] == "new" and begin <= r["start"] <= end and r["target"] in targets and r["outcome"] != "ok"
    ]


def kept_streams(records: list[dict[str, Any]], targets: tuple[str, ...]) -> list[str]:
    """Streams of ``targets`` that broke (neither intact when the load stopped nor closed on their own): none
    expected."""
    return [
        f"{r['target']} {r['outcome']} {r['detail']}"
        for r in records
        if r["kind"] == "stream" and r["target"] in targets and r["outcome"] not in KEPT
    ]


def stream_bytes(records: list[dict[str, Any]]) -> dict[str, int]:
    """Bytes each pair's long-lived streams carried and got back intact, by pair (end to end, from the records)."""
    carried: dict[str, int] = {}
    for r in records:
        if r["kind"] == "stream":
            carried[r["target"]] = carried.get(r["target"], 0) + int(r["echoed"])
    return carried


@dataclass
class OldProxy:
    """A node proxy pod replaced by a rollout: its pod, the log file of its container, and when it was seen
    terminating (deleted: its proxy drains from then on) and gone from the API (wall-clock seconds, 0 until then)."""

    node: str
    name: str
    uid: str
    log: Path
    terminating: float = 0.0
    gone: float = 0.0

    def outcome(self) -> str:
        """How its drain ended, from its log: the connections it had to close at the deadline, or ``drain over:``."""
        text = self.log.read_text(errors="replace") if self.log.is_file() else ""
        lines = text.splitlines()
        closed = [line.split("drain: ", 1)[1] for line in lines if "drain: " in line and "reached" in line]
        over = [line.split("drain over: ", 1)[1] for line in lines if "drain over: " in line]
        return closed[-1] if closed else (over[-1] if over else "no drain logged")


@dataclass
class RolloutStatus:
    """``kubectl rollout status daemonset/ztunnel`` run in a thread from the restart on: its result and when it
    returned."""

    returncode: int = -1
    output: str = ""
    returned: float = 0.0


@dataclass
class Rollout:
    """A ``kubectl rollout restart`` of the node proxies: the pods it replaced, when it began, when every node had
    a new ready proxy (``completed``), and ``kubectl rollout status``."""

    old: list[OldProxy]
    began: float
    completed: float
    status: RolloutStatus
    watcher: threading.Thread
    new: dict[str, str] = field(default_factory=dict)
    """Node → the name of its new node proxy pod."""

    @property
    def seconds(self) -> float:
        return self.completed - self.began

    def status_seconds(self) -> float:
        """Seconds from the restart until ``rollout status`` returned."""
        return self.status.returned - self.began


def roll_node_proxies(lab: Lab, via: str = "kubectl") -> Rollout:
    """``kubectl rollout restart daemonset/ztunnel``, with ``kubectl rollout status`` started beside it; returns
    once every node runs a new, ready node proxy and every old pod is terminating (draining). Like kube's, the
    lab's DaemonSet status judges a node by its oldest pod, so ``rollout status`` returns only once the old pods
    are gone (:func:`wait_old_proxies_gone`). ``via="ambit"``: ``ambit lab restart nodeproxy`` instead, which does
    both (its result is the ``status``)."""
    app = COMPONENT_APPS["nodeproxy"]
    old = []
    for node in (n.name for n in lab.topology.all_nodes()):
        pod = wait_until(f"a ready node proxy on {node}", lambda node=node: lab.ready_component(app, node), 60)
        uid = str(pod["metadata"]["uid"])
        old.append(OldProxy(node, str(pod["metadata"]["name"]), uid, lab.directory / "pods" / uid / "istio-proxy.log"))
    uids = {o.uid for o in old}
    began = time.time()
    if via == "kubectl":
        lab.kubectl("rollout", "restart", "daemonset/ztunnel", "-n", SYSTEM)
    status = RolloutStatus()

    def watch() -> None:
        bound = f"--timeout={ROLLOUT_STATUS_BOUND + 30:g}s"
        if via == "ambit":
            seconds = f"--timeout={ROLLOUT_STATUS_BOUND + 30:g}"
            done = ambit("lab", "restart", "nodeproxy", "--dir", str(lab.directory), seconds, check=False, timeout=120)
        else:
            done = lab.kubectl("rollout", "status", "daemonset/ztunnel", "-n", SYSTEM, bound, check=False, timeout=120)
        status.returned = time.time()
        status.output = (done.stdout + done.stderr)[-2000:]
        status.returncode = done.returncode

    watcher = threading.Thread(target=watch, name="rollout status", daemon=True)
    watcher.start()

    def rolled() -> dict[str, str] | None:
        pods = lab.pods(SYSTEM, app)
        now = time.time()
        for proxy in old:
            mine = [p for p in pods if p["metadata"]["uid"] == proxy.uid]
            if mine and mine[0]["metadata"].get("deletionTimestamp") and not proxy.terminating:
                proxy.terminating = now
            if not mine and not proxy.gone:
                proxy.terminating = proxy.terminating or now
                proxy.gone = now
        if not all(o.terminating for o in old):
            return None
        new = {o.node: lab.ready_component(app, o.node) for o in old}
        if any(p is None or p["metadata"]["uid"] in uids for p in new.values()):
            return None
        return {node: str(p["metadata"]["name"]) for node, p in new.items() if p is not None}

    new = wait_until("a new ready node proxy on every node, the old ones terminating", rolled, ROLLOUT_TIMEOUT, 0.2)
    return Rollout(old, began, time.time(), status, watcher, new)


def wait_old_proxies_gone(lab: Lab, rollout: Rollout) -> dict[str, str]:
    """Wait until every replaced node proxy pod is gone from the API (each one's time of going is noted) and
    ``kubectl rollout status`` returned; each old proxy's drain outcome, by node (:meth:`OldProxy.outcome`)."""

    def gone() -> bool:
        present = {p["metadata"]["uid"] for p in lab.pods(SYSTEM, COMPONENT_APPS["nodeproxy"])}
        now = time.time()
        for proxy in rollout.old:
            if proxy.uid not in present and not proxy.gone:
                proxy.gone = now
        return all(o.gone for o in rollout.old)

    wait_until("the old node proxy pods gone", gone, OLD_PODS_GONE_BOUND, interval=0.2)
    rollout.watcher.join(ROLLOUT_STATUS_BOUND + 60)
    return {proxy.node: proxy.outcome() for proxy in rollout.old}


@dataclass
class RolloutRun:
    """:func:`rollout_under_load`'s results: the load's trial, the rollout, and the window new connections are
    counted in (from the restart until the old pods were gone and a little more)."""

    trial: Trial
    rollout: Rollout
    drained: dict[str, str]
    window_end: float
    first_ups: dict[str, dict[str, Any]]
    """Pair → the ``stream-up`` record of its stream that was up when the rollout began."""


def rollout_under_load(
    scene: Scene,
    directory: Path,
    outliving: tuple[str, ...] = (),
    outliving_lifetime: float = 0.0,
    via: str = "kubectl",
) -> RolloutRun:
    """The node proxies' upgrade under :func:`steady_load`: every pair's stream, up before the restart, carries data
    both ways through it and ends on its own about :data:`ENDS_AFTER` seconds after it (its lifetime is
    :data:`STREAM_LIFETIME`, and the restart is timed from when the streams came up); the ``outliving`` streams
    live ``outliving_lifetime`` seconds each (0: until the load stops). The load stops once the old pods are gone
    and new connections ran a while more. ``via``: :func:`roll_node_proxies`'s."""
    with steady_load(scene, directory, STREAM_LIFETIME, outliving, outliving_lifetime) as trial:
        ups = [r for r in trial.now_records() if r["kind"] == "stream-up"]
        first_ups: dict[str, dict[str, Any]] = {}
        for r in sorted(ups, key=lambda r: r["start"]):
            first_ups.setdefault(r["target"], r)
        restart_at = max(r["start"] for r in first_ups.values()) + STREAM_LIFETIME - ENDS_AFTER
        assert time.time() < restart_at, "the load took too long to warm: the streams would end too early"
        time.sleep(max(0.0, restart_at - time.time()))
        rollout = roll_node_proxies(scene.lab, via)
        drained = wait_old_proxies_gone(scene.lab, rollout)
        time.sleep(2)  # new connections through the new proxies alone
        window_end = time.time()
    return RolloutRun(trial, rollout, drained, window_end, first_ups)


def roll_env(lab: Lab, *changes: str, after: int = 0) -> int:
    """``kubectl set env`` on the ztunnel DaemonSet (``NAME=value``, or ``NAME-`` to unset), then wait until every
    node runs a ready pod of the new template and no old pod is left; the template's generation."""
    lab.kubectl("set", "env", "daemonset/ztunnel", "-n", SYSTEM, *changes)
    generation = int(lab.get("daemonset", "ztunnel", "-n", SYSTEM)["metadata"]["generation"])
    assert generation > after, generation
    lab.kubectl("rollout", "status", "daemonset/ztunnel", "-n", SYSTEM, "--timeout=120s", timeout=150)
    for node in (n.name for n in lab.topology.all_nodes()):
        wait_until(f"a ready node proxy on {node}", lambda node=node: lab.ready_component("app=ztunnel", node), 60)
    return generation
