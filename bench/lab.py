"""Benchmark of the lab: ``ambit lab up`` and ``down``, and N pods from ``kubectl apply`` to Ready and back.

``python -m bench.lab [--pods 50] [--out bench/results]`` (as root) measures, on a 2-node lab:

1. ``ambit lab up --nodes 2`` (until every Node is Ready and the mesh installed from deploy/ has rolled out), as a
   subprocess;
2. a Deployment of N ``ambit.lab.apps http-echo`` pods with a tcpSocket readinessProbe (``periodSeconds: 1``):
   ``kubectl apply`` until every pod is Ready; then ``kubectl delete deployment`` until every pod is gone from the
   API and every pod network namespace is gone from the machine;
3. the same with N standalone Pods applied in one ``kubectl apply`` and removed by ``kubectl delete pods --all``;
4. ``ambit lab down``.

Times are wall-clock seconds from just before the kubectl command starts. Pods are watched by listing them every
``POLL`` seconds (one list of N pods costs the API server a few ms), so a per-pod time is late by up to ``POLL``.
CPU seconds are read from ``/proc`` for the lab's daemons (API server, controllers, node runtimes); the node
runtimes' reaped children (CNI plugins, ``ip``, exited containers) are shown separately. Every pod is a Python
process started from this machine's interpreter, which is most of the CPU a burst of pods costs.

Only one lab can be up on a machine: the benchmark takes the same lock as the tests
(``/run/lock/ambit-lab-root.lock``), and ``ambit lab down`` runs in ``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ambit.k8s import KubeClient, kinds
from ambit.lab.cluster.orphans import sweep_orphaned_labs
from ambit.lab.network.topology import Topology
from bench.report import Measurement, Report, median, percentile

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
LOCK = Path("/run/lock/ambit-lab-root.lock")
LOCK_WAIT = 600.0
POLL = 0.1
TIMEOUT = 180.0
"""Seconds any one phase (all Ready, all gone) may take before the benchmark gives up."""
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
NOTES = [
    f"Pods are seen by listing them every {POLL:g} s: per-pod times are late by up to that much.",
    "Each pod runs `python3 -m ambit.lab.apps http-echo` (a fresh interpreter); readinessProbe tcpSocket, "
    "periodSeconds 1. Benchmark client, kubectl, the lab's daemons and the pods share the machine's CPUs.",
    "`kubectl delete pods --all` waits for each pod with its own GET (and a watch while the pod exists), "
    "throttled by kubectl's client-side rate limiter (5 requests/s after a burst of 10): its time for N pods is "
    "mostly kubectl's; the lab's is 'all pods gone from the API' and 'all pod namespaces removed'.",
    "'node runtimes, children' is CPU of processes the runtimes started and reaped: CNI plugins, `ip`, and "
    "containers that exited (so it grows in the delete phases).",
]


class BenchError(RuntimeError):
    """A phase did not finish, or a command failed."""


@contextlib.contextmanager
def lab_lock() -> Iterator[None]:
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + LOCK_WAIT
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BenchError(f"another lab held {LOCK} for {LOCK_WAIT:.0f} s") from None
                if not told:
                    print(f"waiting for another lab to go ({LOCK})", file=sys.stderr)
                    told = True
                time.sleep(0.2)
        for removed in sweep_orphaned_labs():  # a killed benchmark's or test's lab, still running
            print(f"removed: {removed}", file=sys.stderr)
        yield
    finally:
        os.close(fd)


def _ambit(*args: str, timeout: float = TIMEOUT) -> float:
    """Run ``ambit ARGS``; its wall time in seconds."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "ambit.cli", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise BenchError(f"ambit {' '.join(args)} failed ({done.returncode}): {done.stderr}{done.stdout}")
    return elapsed


@dataclass(frozen=True, slots=True)
class Kubectl:
    kubeconfig: Path
    cache: Path

    async def __call__(self, *args: str, input: str | None = None) -> str:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), KUBECACHEDIR=str(self.cache))
        done = await asyncio.to_thread(
            subprocess.run,
            ["kubectl", *args],
            input=input,
            capture_output=True,
            text=True,
            env=env,
            timeout=TIMEOUT,
            check=False,
        )
        if done.returncode != 0:
            raise BenchError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr}")
        return done.stdout


# -- the lab's processes --------------------------------------------------------------------------------------------
def daemon_cpu(directory: Path) -> dict[str, float]:
    """CPU seconds of the lab's daemons by role (self), and of the node runtimes' reaped children."""
    wanted = str(directory).encode()
    cpu: dict[str, float] = {"API server": 0.0, "controllers": 0.0, "node runtimes": 0.0, "node runtimes, children": 0}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if b"ambit.cli" not in args or not any(wanted in a for a in args):
            continue
        own = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
        if b"apiserver" in args:
            cpu["API server"] += own
        elif b"controllers" in args:
            cpu["controllers"] += own
        elif b"node" in args:
            cpu["node runtimes"] += own
            cpu["node runtimes, children"] += (int(fields[13]) + int(fields[14])) / _CLOCK_TICKS
    return cpu


def pod_namespaces(topology: Topology) -> int:
    """Pod network namespaces on the machine: the benchmark's pods' and the installed mesh's (its node proxies)."""
    try:
        return sum(1 for name in os.listdir("/run/netns") if name.startswith(f"{topology.prefix}-p-"))
    except FileNotFoundError:
        return 0


# -- manifests ------------------------------------------------------------------------------------------------------
def echo_pod_spec() -> dict[str, Any]:
    return {
        "terminationGracePeriodSeconds": 5,
        "containers": [
            {
                "name": "echo",
                "image": "none",
                "command": ["python3", "-m", "ambit.lab.apps", "http-echo", "--port", "8080"],
                "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
            }
        ],
    }


def deployment(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": echo_pod_spec()},
        },
    }


def standalone_pods(name: str, count: int) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{name}-{i:03d}", "labels": {"app": name}},
            "spec": echo_pod_spec(),
        }
        for i in range(count)
    ]


# -- phases ---------------------------------------------------------------------------------------------------------
def _ready(pod: Mapping[str, Any]) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@dataclass(frozen=True, slots=True)
class Timeline:
    command: float
    """Seconds until the kubectl command returned."""
    times: list[float]
    """Seconds until each pod was seen (Ready; or gone)."""
    done: float
    """Seconds until the last pod, and anything else the phase waits for."""
    nodes: dict[str, int]


async def timed(
    command: Awaitable[str],
    poll: Callable[[], Awaitable[tuple[dict[str, Any], bool]]],
    expected: int,
) -> Timeline:
    """Start ``command`` and poll: ``poll`` gives the pods that count (by uid) and whether the phase is over.

    The phase is done when ``expected`` pods counted and ``poll`` says it is over; the command's own time is
    measured apart (kubectl may return before the phase is done, or after).
    """
    started = time.perf_counter()
    task = asyncio.ensure_future(command)
    returned: list[float] = []
    task.add_done_callback(lambda _: returned.append(time.perf_counter() - started))
    seen: dict[str, float] = {}
    nodes: dict[str, int] = {}
    try:
        while True:
            now = time.perf_counter() - started
            pods, over = await poll()
            for uid, pod in pods.items():
                if uid not in seen:
                    seen[uid] = now
                    node = str((pod.get("spec") or {}).get("nodeName") or "")
                    nodes[node] = nodes.get(node, 0) + 1
            if over and len(seen) >= expected:
                break
            if task.done():
                task.result()  # a failed command ends the phase
            if now > TIMEOUT:
                raise BenchError(f"not done after {TIMEOUT:.0f} s: {len(seen)} of {expected} pods")
            await asyncio.sleep(POLL)
        await asyncio.wait_for(task, TIMEOUT)
    finally:
        if not task.done():
            task.cancel()
    return Timeline(returned[0], sorted(seen.values()), now, nodes)


def report_phase(report: Report, scenario: str, what: str, timeline: Timeline, cpu: Mapping[str, float]) -> None:
    times = timeline.times
    count = len(times)
    report.add(Measurement(scenario, f"kubectl {what} returned", timeline.command, "s"))
    if what == "apply":
        report.add(Measurement(scenario, "first pod Ready", times[0], "s"))
        report.add(Measurement(scenario, "median pod Ready", median(times), "s"))
        report.add(Measurement(scenario, "p90 pod Ready", percentile(times, 90), "s"))
        spread = ", ".join(f"{n}: {c}" for n, c in sorted(timeline.nodes.items()))
        report.add(Measurement(scenario, "all pods Ready", timeline.done, "s", note=spread))
        report.add(Measurement(scenario, "pods Ready per second", count / timeline.done, "/s"))
    else:
        report.add(Measurement(scenario, "median pod gone from the API", median(times), "s"))
        report.add(Measurement(scenario, "all pods gone from the API", times[-1], "s"))
        report.add(Measurement(scenario, "all pod namespaces removed", timeline.done, "s"))
    for role, seconds in cpu.items():
        report.add(Measurement(scenario, f"CPU: {role}", seconds, "s"))


def cpu_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {role: after[role] - before.get(role, 0.0) for role in after}


async def scenario(
    report: Report,
    topology: Topology,
    kubectl: Kubectl,
    name: str,
    pods: int,
    objects: list[dict[str, Any]],
    delete: list[str],
) -> None:
    namespace = f"bench-{name}"
    others = pod_namespaces(topology)  # the mesh's own pods (istio-system) keep theirs
    await kubectl("create", "namespace", namespace)
    stream = "\n".join(json.dumps(o) for o in objects)
    async with KubeClient.from_kubeconfig(topology.kubeconfig) as client:

        async def ready() -> tuple[dict[str, Any], bool]:
            items, _ = await client.list(kinds.PODS, namespace)
            return {p["metadata"]["uid"]: p for p in items if _ready(p)}, True

        title = f"{pods} pods, {name}"
        cpu = daemon_cpu(topology.path)
        up = await timed(kubectl("apply", "-n", namespace, "-f", "-", input=stream), ready, pods)
        report_phase(report, f"{title}: apply to Ready", "apply", up, cpu_delta(cpu, daemon_cpu(topology.path)))
        await asyncio.sleep(2)  # let probes and status writes settle before the next phase's CPU reading

        uids = {p["metadata"]["uid"] for p in (await client.list(kinds.PODS, namespace))[0]}

        async def gone() -> tuple[dict[str, Any], bool]:
            items, _ = await client.list(kinds.PODS, namespace)
            present = {p["metadata"]["uid"] for p in items}
            left: dict[str, Any] = {uid: {} for uid in uids - present}
            return left, not present and pod_namespaces(topology) <= others

        cpu = daemon_cpu(topology.path)
        down = await timed(kubectl(*delete, "-n", namespace), gone, pods)
        report_phase(report, f"{title}: delete to gone", "delete", down, cpu_delta(cpu, daemon_cpu(topology.path)))


async def measure_pods(report: Report, topology: Topology, kubectl: Kubectl, pods: int) -> None:
    await scenario(
        report, topology, kubectl, "deployment", pods, [deployment("echo", pods)], ["delete", "deploy", "echo"]
    )
    await scenario(
        report, topology, kubectl, "standalone", pods, standalone_pods("echo", pods), ["delete", "pods", "--all"]
    )


def run(pods: int, out: Path | None, *, echo: bool = True) -> Report:
    if os.geteuid() != 0:
        raise BenchError("the lab needs root")
    report = Report("ambit lab", f"{pods} pods, 2 nodes", notes=list(NOTES))
    version = subprocess.run(["kubectl", "version", "--client"], capture_output=True, text=True, check=False)
    report.env["kubectl"] = (version.stdout.splitlines() or ["?"])[0].removeprefix("Client Version: ")
    with tempfile.TemporaryDirectory(prefix="ambit-bench-lab-") as tmp_name, lab_lock():
        directory = Path(tmp_name) / "lab"
        try:
            report.add(
                Measurement(
                    "lab",
                    "ambit lab up --nodes 2 (until Nodes Ready and the mesh rolled out)",
                    _ambit("lab", "up", "--dir", str(directory), "--nodes", "2"),
                    "s",
                )
            )
            topology = Topology.load(directory)
            if topology is None:
                raise BenchError("ambit lab up wrote no lab.json")
            kubectl = Kubectl(topology.kubeconfig, Path(tmp_name) / "kubecache")
            asyncio.run(measure_pods(report, topology, kubectl, pods))
        finally:
            took = _ambit("lab", "down", "--dir", str(directory))
        report.add(Measurement("lab", "ambit lab down (after the pods were deleted)", took, "s"))
    report.env["loadavg_end"] = os.getloadavg()[0]
    if echo:
        print(report.markdown())
    if out is not None:
        md, js = report.write(out, "lab")
        if echo:
            print(f"written: {md} and {js}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lab", description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=50, help="pods per scenario (the lab has 2 nodes)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where lab.md and lab.json go")
    args = parser.parse_args(argv)
    if not 1 <= args.pods <= 250:
        parser.error("--pods is 1 to 250 (a node's pod range is a /24)")
    try:
        run(args.pods, args.out)
    except BenchError as exc:
        print(f"bench.lab: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
