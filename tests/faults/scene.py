"""The traffic scene the fault suite and the e2e rollout test share: four pods, a steady load, what it must keep.

In an ambient namespace: ``srv-1`` and ``cli-1`` on node-1, ``srv-2`` and ``cli-2`` on node-2 (:func:`set_up`), so
each client has a same-node and a cross-node server. :func:`steady_load` runs :mod:`tests.faults.load` from both
clients (new connections at a rate per pair, and one long-lived stream per pair carrying data both ways, each echo
compared with what was sent) and ``tcpdump`` on every link of both nodes (:mod:`tests.faults.rig`), from warm (every
stream up, every pair answered) until the block ends. :func:`roll_node_proxies` is the node proxies' upgrade on an
installed mesh: ``kubectl rollout restart daemonset/ztunnel``, node by node (maxSurge 1, maxUnavailable 0), the old
pods draining beside the new ones.

Shared by ``tests/faults/test_faults.py`` and ``tests/e2e/test_lab_rollout.py``, which import it; nothing here
asserts a bound of its own except the capture's positive control and the checks every fault row must pass.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.lab_driver import COMPONENT_APPS, Lab, is_ready, pod_manifest, sleeper, wait_until
from tests.faults.report import ROWS, FaultRow, recovery_time
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
ROLLOUT_TIMEOUT = 240.0
"""Seconds for ``kubectl rollout status`` of the node proxies (both nodes, each new pod's start and readiness)."""
OLD_PROXY_EXIT_TIMEOUT = 60.0
"""Seconds for an old node proxy pod to exit once its connections ended (its grace period is 30 s)."""


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

    return wait_until(f"{namespace}/{name} Ready and enrolled", enrolled, timeout)


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
    records: list[dict[str, Any]] = field(default_factory=list)
    plaintext: int = -1
    control_seen: int = -1
    stopped_at: float = 0.0
    """When the load was told to stop (its streams were closed by the clients from then on)."""

    def now_records(self) -> list[dict[str, Any]]:
        return self.load.records()


@contextlib.contextmanager
def steady_load(scene: Scene, directory: Path) -> Iterator[Trial]:
    """The load from both clients and the capture on both nodes, from warm (every stream up, every pair answered)
    until the block ends; then the positive control, and the counts."""
    marker = "AMBITFAULT" + secrets.token_hex(6)
    control = "AMBITCONTROL" + secrets.token_hex(6)
    capture = PlaintextCapture(directory / "capture", [scene.netns["node-1"], scene.netns["node-2"]])
    load = None
    try:
        clients = {c: (scene.netns[c], scene.targets(c)) for c in ("cli-1", "cli-2")}
        load = LoadRun(directory, marker, clients, RATE)
        trial = Trial(marker, load)

        def warm() -> bool:
            records = load.records()
            up = {r["target"] for r in records if r["kind"] == "stream-up"}
            answered = {r["target"] for r in records if r["kind"] == "new" and r["outcome"] == "ok"}
            assert load.running(), "a load process exited"
            return len(up) == 4 and len(answered) == 4

        wait_until("the load warm on all four pairs", warm, 30)
        yield trial
        trial.stopped_at = time.time()
        trial.records = load.stop()
        trial.control_seen = capture.control(control, [(scene.ips["srv-1"], PORT), (scene.ips["srv-2"], PORT)])
    finally:
        if load is not None:
            load.stop()
        capture.stop()
    trial.plaintext = capture.count(marker.encode())


def check_row(trial: Trial, row: FaultRow) -> None:
    """What every fault must keep: the capture works and saw no payload in clear; no data lost."""
    ROWS.append(row)
    assert trial.control_seen == 2, "a capture missed the positive control: it cannot vouch for anything"
    assert row.plaintext == 0, f"the load's payload crossed a node link in clear {row.plaintext} times"
    assert row.lost == 0, [r for r in trial.records if r["outcome"] == "mismatch"]


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
    """Streams of ``targets`` that broke: none expected."""
    return [
        f"{r['target']} {r['outcome']} {r['detail']}"
        for r in records
        if r["kind"] == "stream" and r["target"] in targets and r["outcome"] != "ok"
    ]


def stream_bytes(records: list[dict[str, Any]]) -> dict[str, int]:
    """Bytes each pair's long-lived streams carried and got back intact, by pair (end to end, from the records)."""
    carried: dict[str, int] = {}
    for r in records:
        if r["kind"] == "stream":
            carried[r["target"]] = carried.get(r["target"], 0) + int(r["echoed"])
    return carried


@dataclass(frozen=True)
class OldProxy:
    """A node proxy pod replaced by a rollout: its pod, and the log file of its container."""

    node: str
    name: str
    uid: str
    log: Path


@dataclass
class Rollout:
    """A ``kubectl rollout restart`` of the node proxies: the pods it replaced, and when it began and completed."""

    old: list[OldProxy]
    began: float
    completed: float
    new: dict[str, str] = field(default_factory=dict)
    """Node → the name of its new node proxy pod."""

    @property
    def seconds(self) -> float:
        return self.completed - self.began


def roll_node_proxies(lab: Lab) -> Rollout:
    """``kubectl rollout restart daemonset/ztunnel`` and ``rollout status`` until every node runs a new, ready node
    proxy; the old pods may still be draining when this returns (see :func:`wait_old_proxies_gone`)."""
    app = COMPONENT_APPS["nodeproxy"]
    old = []
    for node in (n.name for n in lab.topology.all_nodes()):
        pod = wait_until(f"a ready node proxy on {node}", lambda node=node: lab.ready_component(app, node), 60)
        uid = str(pod["metadata"]["uid"])
        old.append(OldProxy(node, str(pod["metadata"]["name"]), uid, lab.directory / "pods" / uid / "istio-proxy.log"))
    began = time.time()
    lab.kubectl("rollout", "restart", "daemonset/ztunnel", "-n", SYSTEM)
    lab.kubectl(
        "rollout",
        "status",
        "daemonset/ztunnel",
        "-n",
        SYSTEM,
        f"--timeout={ROLLOUT_TIMEOUT:g}s",
        timeout=ROLLOUT_TIMEOUT + 20,
    )
    completed = time.time()
    uids = {o.uid for o in old}
    new = {}
    for proxy in old:
        pod = wait_until(f"a ready node proxy on {proxy.node}", lambda n=proxy.node: lab.ready_component(app, n), 60)
        assert pod["metadata"]["uid"] not in uids, f"{proxy.node}'s node proxy was not replaced"
        new[proxy.node] = str(pod["metadata"]["name"])
    return Rollout(old, began, completed, new)


def wait_old_proxies_gone(lab: Lab, rollout: Rollout) -> dict[str, str]:
    """Wait until every replaced node proxy pod is gone from the API; each one's drain outcome, by node (the
    ``drain over:`` line of its log, or what its log says about connections it had to close)."""
    names = {o.name for o in rollout.old}

    def gone() -> bool:
        return not names & {p["metadata"]["name"] for p in lab.pods(SYSTEM, COMPONENT_APPS["nodeproxy"])}

    wait_until(f"the old node proxy pods {sorted(names)} gone", gone, OLD_PROXY_EXIT_TIMEOUT, interval=0.5)
    outcomes = {}
    for proxy in rollout.old:
        text = proxy.log.read_text(errors="replace") if proxy.log.is_file() else ""
        closed = [line for line in text.splitlines() if "drain: " in line and "closing" in line]
        over = [line.split("drain over: ", 1)[1] for line in text.splitlines() if "drain over: " in line]
        outcomes[proxy.node] = "; ".join(closed[:3]) if closed else (over[-1] if over else "no drain logged")
    return outcomes
