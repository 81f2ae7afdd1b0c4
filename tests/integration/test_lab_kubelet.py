"""The node runtime against the real embedded API server, with real processes and a fake sandbox.

The fake sandbox returns no namespace (containers run in the test's own namespace) and 127.0.0.1 as the pod's
address, so that probes from "the node" reach the container's listener on loopback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import stat
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from tests.harness import free_port

import ambit
from ambit.apiserver.server import ApiServer
from ambit.cni.errors import TryAgainLaterError
from ambit.k8s import InformerSettings, KubeClient, KubeNotFoundError, kinds
from ambit.k8s.errors import KubeClientError
from ambit.lab.network.plugins import CniInvocationError
from ambit.lab.runtime.containers_apply import ProcessRuntime
from ambit.lab.runtime.kubelet import NodeRuntime, NodeRuntimeSettings
from ambit.lab.runtime.node_taints import parse_taint
from ambit.lab.runtime.probes import ProbeResult, ProbeSpec, ProbeTarget, probe_once
from ambit.lab.runtime.processes import process_start_ticks

NS = "default"
PRIVILEGED = "pod-security.kubernetes.io/enforce"
PY = sys.executable


@dataclasses.dataclass(frozen=True)
class FakeSandbox:
    netns: str
    netns_path: str
    ips: tuple[str, ...]


class FakeSandboxes:
    """Sandboxes in the test's own namespace; ``failure`` makes ``create`` raise it until cleared."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self.destroyed: list[str] = []
        self.failure: Exception | None = None
        self.attempts = 0

    async def create(self, pod: dict[str, Any], user_ids: object = None) -> FakeSandbox:
        self.attempts += 1
        if self.failure is not None:
            raise self.failure
        self.created.append(pod["metadata"]["uid"])
        return FakeSandbox("", "", ("127.0.0.1",))

    async def destroy(self, pod_uid: str) -> None:
        self.destroyed.append(pod_uid)


class FakeRecord:
    def __init__(self) -> None:
        self.notes: list[tuple[str, dict[str, Any]]] = []

    def note(self, kind: str, **fields: Any) -> None:
        self.notes.append((kind, fields))

    @property
    def pids(self) -> list[int]:
        return [int(f["pid"]) for kind, f in self.notes if kind == "process"]


def alive(pid: int) -> bool:
    ticks = process_start_ticks(pid)
    if ticks is None:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as client:
        yield client


@pytest.fixture
def settings(tmp_path: Path, apiserver: ApiServer) -> NodeRuntimeSettings:
    return NodeRuntimeSettings(
        node_name="node-1",
        node_ip="127.0.0.1",
        pod_cidr="198.18.1.0/24",
        pods_dir=tmp_path / "pods",
        api_host="127.0.0.1",
        api_port=int(apiserver.url.rsplit(":", 1)[1]),
        container_path=os.environ.get("PATH", ""),
        container_pythonpath=str(Path(ambit.__file__).resolve().parent.parent),
        heartbeat_interval=0.3,
        sandbox_backoff_initial=0.05,
        sandbox_backoff_max=0.2,
        restart_backoff_initial=0.2,
        restart_backoff_max=0.4,
        config_retry=0.2,
        minimum_grace_seconds=0.5,
        volume_resync_seconds=0.2,
        informer=InformerSettings(backoff_initial=0.05, backoff_max=0.2, watch_timeout=30),
    )


@pytest.fixture
def sandboxes() -> FakeSandboxes:
    return FakeSandboxes()


@pytest.fixture
def record() -> FakeRecord:
    return FakeRecord()


Start = Callable[[], Awaitable[NodeRuntime]]


@pytest.fixture
async def start_runtime(
    kube: KubeClient, settings: NodeRuntimeSettings, sandboxes: FakeSandboxes, record: FakeRecord
) -> AsyncIterator[Start]:
    """Start runtimes; at the end every one is closed with its pods stopped, and no recorded process survives."""
    started: list[NodeRuntime] = []

    async def start() -> NodeRuntime:
        runtime = NodeRuntime(kube, settings, sandboxes, record, containers=ProcessRuntime())
        await runtime.start()
        started.append(runtime)
        return runtime

    yield start
    for runtime in reversed(started):
        await runtime.aclose(stop_pods=True)
    survivors = [pid for pid in record.pids if alive(pid)]
    for pid in survivors:
        os.killpg(pid, signal.SIGKILL)
    assert not survivors, f"processes left running: {survivors}"


async def eventually(check: Callable[[], Awaitable[Any]], within: float = 8.0) -> Any:
    """Poll ``check`` until it returns something truthy."""
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s; last value {value!r}")
        await asyncio.sleep(0.05)


async def until(predicate: Callable[[], bool], within: float = 8.0) -> None:
    """Poll a synchronous ``predicate`` until it holds."""

    async def check() -> bool:
        return predicate()

    await eventually(check, within)


def pod_manifest(name: str, *containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {"nodeName": "node-1", "containers": list(containers), **spec},
    }


def container(name: str, script: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": "python", "command": [PY, "-c", script], **fields}


async def get_pod(kube: KubeClient, name: str) -> dict[str, Any] | None:
    try:
        return await kube.get(kinds.PODS, name, NS)
    except KubeNotFoundError:
        return None


def condition(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond["type"] == kind:
            return dict(cond)
    return {}


def container_state(pod: dict[str, Any], index: int = 0) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return dict(statuses[index]) if len(statuses) > index else {}


async def events(kube: KubeClient, reason: str) -> list[dict[str, Any]]:
    items, _ = await kube.list(kinds.EVENTS, NS)
    return [e for e in items if e.get("reason") == reason]


LISTENER = """
import os, socket, sys, time
print("env", os.environ["POD_NAME"], os.environ["MY_NS"], os.environ["POD_IP"], os.environ["AMBIT_TOKEN_FILE"],
      os.environ["KUBERNETES_SERVICE_HOST"], os.environ["NODE_NAME"], os.environ["SERVICE_ACCOUNT"],
      os.environ["COLOR"], flush=True)
import ambit
print("ambit from", ambit.__file__, flush=True)
time.sleep(0.5)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
while True:
    s.accept()[0].close()
"""

CRASH = "import sys; print('crashing', flush=True); sys.exit(3)"

POLITE = """
import signal, sys, time
def bye(*_):
    print("got SIGTERM", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
print("up", flush=True)
while True:
    time.sleep(1)
"""

STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
print("up", flush=True)
while True:
    time.sleep(1)
"""


# -- the node ---------------------------------------------------------------------------------------------------
async def test_the_node_registers_and_keeps_its_heartbeat_and_lease(kube: KubeClient, start_runtime: Start) -> None:
    await start_runtime()
    node = await kube.get(kinds.NODES, "node-1")
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "node-1"
    assert node["metadata"]["labels"]["kubernetes.io/os"] == "linux"
    assert node["spec"]["podCIDR"] == "198.18.1.0/24"
    assert {"type": "InternalIP", "address": "127.0.0.1"} in node["status"]["addresses"]
    ready = condition(node, "Ready")
    assert ready["status"] == "True"
    lease = await kube.get(kinds.LEASES, "node-1", "kube-node-lease")
    assert lease["spec"]["holderIdentity"] == "node-1"
    assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]

    async def renewed() -> bool:
        again = await kube.get(kinds.LEASES, "node-1", "kube-node-lease")
        return bool(again["spec"]["renewTime"] != lease["spec"]["renewTime"])

    await eventually(renewed, within=3)


async def test_the_node_registers_with_its_taints_once_and_never_adds_them_back(
    kube: KubeClient, settings: NodeRuntimeSettings, sandboxes: FakeSandboxes, record: FakeRecord
) -> None:
    tainted = dataclasses.replace(
        settings, register_with_taints=(parse_taint("cni.istio.io/not-ready=true:NoSchedule"),)
    )
    runtime = NodeRuntime(kube, tainted, sandboxes, record, containers=ProcessRuntime())
    await runtime.start()
    await runtime.aclose()
    node = await kube.get(kinds.NODES, "node-1")
    assert node["spec"]["taints"] == [{"key": "cni.istio.io/not-ready", "value": "true", "effect": "NoSchedule"}]
    # The taint is removed (the control plane's untaint controller); a restarted runtime leaves it removed.
    await kube.patch(kinds.NODES, "node-1", [{"op": "remove", "path": "/spec/taints"}], patch_type="json")
    runtime = NodeRuntime(kube, tainted, sandboxes, record, containers=ProcessRuntime())
    await runtime.start()
    await runtime.aclose()
    node = await kube.get(kinds.NODES, "node-1")
    assert not node["spec"].get("taints")
    assert node["spec"]["podCIDR"] == "198.18.1.0/24"


# -- running, ready, logs, token, env ---------------------------------------------------------------------------
async def test_a_pod_runs_then_becomes_ready_by_its_tcp_probe(
    kube: KubeClient, start_runtime: Start, settings: NodeRuntimeSettings, record: FakeRecord
) -> None:
    await start_runtime()
    await kube.create(kinds.CONFIG_MAPS, {"metadata": {"name": "settings", "namespace": NS}, "data": {"c": "blue"}})
    port = free_port()
    app = container(
        "app",
        LISTENER,
        args=[str(port)],
        env=[
            {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "COLOR", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "c"}}},
        ],
        readinessProbe={"tcpSocket": {"port": port}, "periodSeconds": 1},
    )
    created = await kube.create(kinds.PODS, pod_manifest("web", app))
    uid = created["metadata"]["uid"]

    async def running() -> dict[str, Any] | None:
        pod = await get_pod(kube, "web")
        return pod if pod and pod["status"].get("phase") == "Running" else None

    pod = await running() or await eventually(running)
    assert pod["status"]["podIP"] == "127.0.0.1"
    assert pod["status"]["hostIP"] == "127.0.0.1"
    assert condition(pod, "PodReadyToStartContainers")["status"] == "True"
    assert condition(pod, "PodScheduled")["status"] == "True"
    status = container_state(pod)
    assert "running" in status["state"]
    assert status["started"] is True
    pid = int(status["containerID"].removeprefix("ambit://"))
    assert record.notes[0][0] == "process"
    assert record.notes[0][1]["pid"] == pid
    assert record.notes[0][1]["start_time"] == process_start_ticks(pid)

    async def ready() -> dict[str, Any] | None:
        pod = await get_pod(kube, "web")
        return pod if pod and condition(pod, "Ready").get("status") == "True" else None

    pod = await eventually(ready)
    assert condition(pod, "ContainersReady")["status"] == "True"
    assert container_state(pod)["ready"] is True

    token = settings.pods_dir / uid / "serviceaccount" / "token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o644  # the projected volume's mode (any user in the pod)
    assert stat.S_IMODE(token.parent.parent.stat().st_mode) == 0o700  # no one else on the host
    assert (token.parent / "namespace").read_text() == NS
    review = await kube.token_review(token.read_text())
    assert review["status"]["authenticated"] is True
    assert review["status"]["user"]["username"] == "system:serviceaccount:default:default"
    log = (settings.pods_dir / uid / "app.log").read_text()
    assert f"env web default 127.0.0.1 {token} 127.0.0.1 node-1 default blue" in log
    assert f"ambit from {settings.container_pythonpath}/ambit/__init__.py" in log  # the runtime's own, by PYTHONPATH


# -- restarts ---------------------------------------------------------------------------------------------------
async def test_a_crashing_container_restarts_with_back_off(kube: KubeClient, start_runtime: Start) -> None:
    await start_runtime()
    await kube.create(kinds.PODS, pod_manifest("crash", container("app", CRASH)))
    seen_backoff = False

    async def restarted_three_times() -> dict[str, Any] | None:
        nonlocal seen_backoff
        pod = await get_pod(kube, "crash")
        status = container_state(pod) if pod else {}
        waiting = (status.get("state") or {}).get("waiting") or {}
        seen_backoff = seen_backoff or waiting.get("reason") == "CrashLoopBackOff"
        return pod if status.get("restartCount", 0) >= 3 else None

    pod = await eventually(restarted_three_times)
    assert pod["status"]["phase"] == "Running"
    last = container_state(pod)["lastState"]["terminated"]
    assert (last["exitCode"], last["reason"]) == (3, "Error")
    assert last["startedAt"] <= last["finishedAt"]
    assert seen_backoff
    assert await eventually(lambda: events(kube, "BackOff"))


@pytest.mark.parametrize(("policy", "code", "phase"), [("Never", 7, "Failed"), ("OnFailure", 0, "Succeeded")])
async def test_a_container_that_will_not_restart_ends_the_pod(
    kube: KubeClient, start_runtime: Start, sandboxes: FakeSandboxes, policy: str, code: int, phase: str
) -> None:
    await start_runtime()
    created = await kube.create(
        kinds.PODS, pod_manifest("once", container("app", f"raise SystemExit({code})"), restartPolicy=policy)
    )

    async def done() -> dict[str, Any] | None:
        pod = await get_pod(kube, "once")
        return pod if pod and pod["status"].get("phase") == phase else None

    pod = await eventually(done)
    terminated = container_state(pod)["state"]["terminated"]
    assert terminated["exitCode"] == code
    assert terminated["reason"] == ("Completed" if code == 0 else "Error")
    assert container_state(pod)["restartCount"] == 0
    assert condition(pod, "Ready")["reason"] == "PodCompleted"
    await until(lambda: created["metadata"]["uid"] in sandboxes.destroyed)


async def test_a_failing_liveness_probe_restarts_the_container(kube: KubeClient, start_runtime: Start) -> None:
    await start_runtime()
    dead_port = free_port()
    probe = {"tcpSocket": {"port": dead_port}, "periodSeconds": 1, "failureThreshold": 1}
    await kube.create(kinds.PODS, pod_manifest("sick", container("app", POLITE, livenessProbe=probe)))

    async def restarted() -> dict[str, Any] | None:
        pod = await get_pod(kube, "sick")
        return pod if pod and container_state(pod).get("restartCount", 0) >= 1 else None

    pod = await eventually(restarted)
    # SIGTERM: 0 once the script handles it, 143 if it came before the handler was installed
    assert container_state(pod)["lastState"]["terminated"]["exitCode"] in (0, 143)
    killing = [e["note"] for e in await eventually(lambda: events(kube, "Killing"))]
    assert any("failed liveness probe" in note for note in killing)
    unhealthy = await eventually(lambda: events(kube, "Unhealthy"))
    assert "Liveness probe failed: dial tcp 127.0.0.1" in unhealthy[0]["note"]


LATE_LISTENER = """
import socket, sys, time
time.sleep(float(sys.argv[2]))
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
while True:
    s.accept()[0].close()
"""


async def test_a_startup_probe_holds_the_other_probes_then_readiness_is_probed_at_once(
    kube: KubeClient, start_runtime: Start
) -> None:
    """Istio's gateway template: a startup probe every second, a readiness probe every 15 s (here 60). The kubelet
    runs neither readiness nor liveness before the startup probe passed, then probes readiness at once: the pod is
    ready about when its port opens, not a readiness period later; no readiness or liveness attempt failed."""
    await start_runtime()
    port = free_port()
    tcp = {"tcpSocket": {"port": port}}
    app = container(
        "app",
        LATE_LISTENER,
        args=[str(port), "1.5"],
        startupProbe={**tcp, "periodSeconds": 1, "failureThreshold": 30},
        readinessProbe={**tcp, "periodSeconds": 60},
        livenessProbe={**tcp, "periodSeconds": 60, "failureThreshold": 1},
    )
    await kube.create(kinds.PODS, pod_manifest("late", app))

    async def running_unstarted() -> dict[str, Any] | None:
        pod = await get_pod(kube, "late")
        status = container_state(pod) if pod else {}
        return pod if "running" in (status.get("state") or {}) else None

    pod = await eventually(running_unstarted)
    assert container_state(pod)["started"] is False
    assert container_state(pod)["ready"] is False

    async def ready() -> dict[str, Any] | None:
        pod = await get_pod(kube, "late")
        return pod if pod and condition(pod, "Ready").get("status") == "True" else None

    pod = await eventually(ready)  # within 8 s: a readiness probe waiting for its period would take 60
    assert container_state(pod)["started"] is True
    assert container_state(pod)["restartCount"] == 0
    notes = [e["note"] for e in await events(kube, "Unhealthy")]
    assert notes and all(note.startswith("Startup probe failed: dial tcp") for note in notes), notes


async def test_a_failing_startup_probe_restarts_the_container(kube: KubeClient, start_runtime: Start) -> None:
    await start_runtime()
    dead = {"tcpSocket": {"port": free_port()}, "periodSeconds": 1}
    app = container(
        "app",
        POLITE,
        startupProbe={**dead, "failureThreshold": 2},
        livenessProbe={**dead, "failureThreshold": 1},  # would restart it too, were it run before startup
    )
    await kube.create(kinds.PODS, pod_manifest("slow", app))

    async def restarted() -> dict[str, Any] | None:
        pod = await get_pod(kube, "slow")
        return pod if pod and container_state(pod).get("restartCount", 0) >= 1 else None

    pod = await eventually(restarted)
    assert container_state(pod)["started"] is False
    killing = [e["note"] for e in await eventually(lambda: events(kube, "Killing"))]
    assert all("failed startup probe" in note for note in killing), killing
    notes = [e["note"] for e in await events(kube, "Unhealthy")]
    assert notes and all(note.startswith("Startup probe failed: dial tcp 127.0.0.1") for note in notes), notes


async def test_a_host_network_pod_runs_without_a_sandbox(
    kube: KubeClient, start_runtime: Start, sandboxes: FakeSandboxes
) -> None:
    await start_runtime()
    # The node's network is the baseline Pod Security level's to refuse: the namespace says privileged, as a user's
    # namespace for node-level pods would.
    await kube.patch(kinds.NAMESPACES, NS, {"metadata": {"labels": {PRIVILEGED: "privileged"}}})
    created = await kube.create(kinds.PODS, pod_manifest("hosty", container("app", POLITE), hostNetwork=True))

    async def running() -> dict[str, Any] | None:
        pod = await get_pod(kube, "hosty")
        return pod if pod and pod["status"].get("phase") == "Running" else None

    pod = await eventually(running)
    assert pod["status"]["podIP"] == "127.0.0.1"  # the node's address
    assert created["metadata"]["uid"] not in sandboxes.created
    await kube.delete(kinds.PODS, "hosty", NS)
    await eventually(lambda: _gone(kube, "hosty"))
    assert created["metadata"]["uid"] not in sandboxes.destroyed


# -- what cannot run --------------------------------------------------------------------------------------------
async def test_a_container_without_a_command_is_reported(kube: KubeClient, start_runtime: Start) -> None:
    await start_runtime()
    await kube.create(kinds.PODS, pod_manifest("imagey", {"name": "app", "image": "nginx"}))

    async def config_error() -> dict[str, Any] | None:
        pod = await get_pod(kube, "imagey")
        waiting = ((container_state(pod) if pod else {}).get("state") or {}).get("waiting") or {}
        return waiting if waiting.get("reason") == "CreateContainerConfigError" else None

    waiting = await eventually(config_error)
    assert "not images" in waiting["message"]
    failed = await eventually(lambda: events(kube, "Failed"))
    assert failed[0]["type"] == "Warning"
    assert "not images" in failed[0]["note"]
    pod = await get_pod(kube, "imagey")
    assert pod is not None and pod["status"]["phase"] == "Pending"


async def test_a_command_that_does_not_exist_is_a_start_error(kube: KubeClient, start_runtime: Start) -> None:
    await start_runtime()
    app = {"name": "app", "image": "none", "command": ["no-such-command-here"]}
    await kube.create(kinds.PODS, pod_manifest("typo", app, restartPolicy="Never"))

    async def failed() -> dict[str, Any] | None:
        pod = await get_pod(kube, "typo")
        return pod if pod and pod["status"].get("phase") == "Failed" else None

    pod = await eventually(failed)
    terminated = container_state(pod)["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (128, "StartError")
    assert "executable file not found" in terminated.get("message", "")
    notes = [e["note"] for e in await eventually(lambda: events(kube, "Failed"))]
    assert any("no-such-command-here" in note for note in notes)


async def test_a_sandbox_failure_is_reported_and_retried_until_it_works(
    kube: KubeClient, start_runtime: Start, sandboxes: FakeSandboxes
) -> None:
    sandboxes.failure = CniInvocationError(
        TryAgainLaterError("no IP addresses available"), plugin="host-local", command="ADD"
    )
    await start_runtime()
    await kube.create(kinds.PODS, pod_manifest("unlucky", container("app", POLITE)))

    async def reported() -> dict[str, Any] | None:
        pod = await get_pod(kube, "unlucky")
        return pod if pod and condition(pod, "PodReadyToStartContainers").get("message") else None

    pod = await eventually(reported)
    assert pod["status"]["phase"] == "Pending"
    cond = condition(pod, "PodReadyToStartContainers")
    assert cond["status"] == "False"
    assert cond["message"] == 'plugin type="host-local" failed (add): no IP addresses available'
    assert "no IP addresses available" in condition(pod, "ContainersReady")["message"]
    warnings = await eventually(lambda: events(kube, "FailedCreatePodSandBox"))
    assert warnings[0]["type"] == "Warning"
    assert "no IP addresses available" in warnings[0]["note"]
    await until(lambda: sandboxes.attempts >= 3)

    sandboxes.failure = None

    async def running() -> dict[str, Any] | None:
        pod = await get_pod(kube, "unlucky")
        return pod if pod and pod["status"].get("phase") == "Running" else None

    pod = await eventually(running)
    cond = condition(pod, "PodReadyToStartContainers")
    assert cond["status"] == "True"
    assert "message" not in cond


# -- deletion ---------------------------------------------------------------------------------------------------
async def test_deletion_sends_sigterm_then_removes_the_pod(
    kube: KubeClient, start_runtime: Start, settings: NodeRuntimeSettings, sandboxes: FakeSandboxes
) -> None:
    await start_runtime()
    created = await kube.create(kinds.PODS, pod_manifest("polite", container("app", POLITE)))
    uid = created["metadata"]["uid"]
    log = settings.pods_dir / uid / "app.log"
    await until(lambda: log.exists() and "up" in log.read_text())
    pod = await get_pod(kube, "polite")
    assert pod is not None
    pid = int(container_state(pod)["containerID"].removeprefix("ambit://"))

    marked = await kube.delete(kinds.PODS, "polite", NS)
    assert marked["metadata"]["deletionTimestamp"]  # graceful: the node finishes the deletion
    await eventually(lambda: _gone(kube, "polite"))
    assert "got SIGTERM" in log.read_text()
    assert not alive(pid)
    assert uid in sandboxes.destroyed
    assert not (settings.pods_dir / uid / "serviceaccount" / "token").exists()
    assert await eventually(lambda: events(kube, "Killing"))


async def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period(
    kube: KubeClient, start_runtime: Start, settings: NodeRuntimeSettings
) -> None:
    await start_runtime()
    created = await kube.create(kinds.PODS, pod_manifest("stubborn", container("app", STUBBORN)))
    log = settings.pods_dir / created["metadata"]["uid"] / "app.log"
    await until(lambda: log.exists() and "up" in log.read_text())
    pod = await get_pod(kube, "stubborn")
    assert pod is not None
    pid = int(container_state(pod)["containerID"].removeprefix("ambit://"))
    began = time.monotonic()
    await kube.delete(kinds.PODS, "stubborn", NS, grace_period_seconds=1)
    await eventually(lambda: _gone(kube, "stubborn"))
    assert time.monotonic() - began >= 1.0
    assert "ignoring SIGTERM" in log.read_text()
    assert not alive(pid)


STAMPED = """
import signal, sys, time
def bye(*_):
    print("SIGTERM at", time.monotonic(), flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
print("up", flush=True)
while True:
    time.sleep(1)
"""


async def _delete_and_time(kube: KubeClient, settings: NodeRuntimeSettings, name: str, app: dict[str, Any],
                           grace: int = 30) -> tuple[float, str]:  # fmt: skip
    """Create the pod, delete it once up: when its SIGTERM came (seconds after the delete) and its log."""
    created = await kube.create(kinds.PODS, pod_manifest(name, app))
    log = settings.pods_dir / created["metadata"]["uid"] / "app.log"
    await until(lambda: log.exists() and "up" in log.read_text())
    began = time.monotonic()
    await kube.delete(kinds.PODS, name, NS, grace_period_seconds=grace)
    await eventually(lambda: _gone(kube, name), within=15.0)
    text = log.read_text()
    stamps = [float(line.split()[-1]) for line in text.splitlines() if line.startswith("SIGTERM at")]
    return (stamps[0] - began if stamps else -1.0), text


async def test_a_pre_stop_hook_runs_before_the_sigterm(
    kube: KubeClient, start_runtime: Start, settings: NodeRuntimeSettings, tmp_path: Path
) -> None:
    """The kubelet runs lifecycle.preStop (exec or sleep) first, then sends SIGTERM: a rollout's old pod keeps
    serving while the endpoints controller and the proxies hear it is going."""
    await start_runtime()
    mark = tmp_path / "pre-stop"
    hook = {"exec": {"command": ["sh", "-c", f"echo ran > {mark}; sleep 1"]}}
    after, text = await _delete_and_time(
        kube, settings, "hooked", container("app", STAMPED, lifecycle={"preStop": hook})
    )
    assert mark.read_text() == "ran\n"
    assert 1.0 <= after < 10.0, (after, text)
    after, _ = await _delete_and_time(
        kube, settings, "slept", container("app", STAMPED, lifecycle={"preStop": {"sleep": {"seconds": 1}}})
    )
    assert 1.0 <= after < 10.0
    assert not await events(kube, "FailedPreStopHook")


async def test_a_failing_or_overlong_pre_stop_hook_is_reported_and_the_container_still_stops(
    kube: KubeClient, start_runtime: Start, settings: NodeRuntimeSettings
) -> None:
    await start_runtime()
    failing = {"preStop": {"exec": {"command": ["sh", "-c", "exit 3"]}}}
    after, _ = await _delete_and_time(kube, settings, "failing", container("app", STAMPED, lifecycle=failing))
    assert 0.0 <= after < 5.0
    notes = [e["note"] for e in await eventually(lambda: events(kube, "FailedPreStopHook"))]
    assert any("exited with 3" in note for note in notes), notes
    endless = {"preStop": {"sleep": {"seconds": 600}}}  # past the grace period: SIGTERM anyway, then the rest
    after, _ = await _delete_and_time(kube, settings, "endless", container("app", STAMPED, lifecycle=endless), grace=1)
    assert 1.0 <= after < 5.0
    notes = [e["note"] for e in await events(kube, "FailedPreStopHook")]
    assert any("did not finish within 1s" in note for note in notes), notes


async def test_a_post_start_hook_runs_before_the_container_is_ready_and_a_failing_one_restarts_it(
    kube: KubeClient, start_runtime: Start, tmp_path: Path
) -> None:
    await start_runtime()
    mark = tmp_path / "post-start"
    hook = {"exec": {"command": ["sh", "-c", f"sleep 1; echo ran > {mark}"]}}
    await kube.create(kinds.PODS, pod_manifest("warming", container("app", POLITE, lifecycle={"postStart": hook})))

    async def ready() -> dict[str, Any] | None:
        pod = await get_pod(kube, "warming")
        return pod if pod and condition(pod, "Ready").get("status") == "True" else None

    await eventually(ready)
    assert mark.read_text() == "ran\n"  # not ready before its hook finished
    failing = {"postStart": {"exec": {"command": ["sh", "-c", "exit 2"]}}}
    await kube.create(kinds.PODS, pod_manifest("cold", container("app", POLITE, lifecycle=failing)))

    async def restarted() -> dict[str, Any] | None:
        pod = await get_pod(kube, "cold")
        return pod if pod and container_state(pod).get("restartCount", 0) >= 1 else None

    await eventually(restarted)
    notes = [e["note"] for e in await eventually(lambda: events(kube, "FailedPostStartHook"))]
    assert any("exited with 2" in note for note in notes), notes


# -- init containers ----------------------------------------------------------------------------------------------
APPEND = "import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.write_text(p.read_text() + sys.argv[2] + chr(10))"

AFTER_GO = """
import pathlib, sys, time
go = pathlib.Path(sys.argv[1]) / "go"
while not go.exists():
    time.sleep(0.05)
trail = pathlib.Path(sys.argv[1]) / "trail"
trail.write_text(trail.read_text() + "second" + chr(10))
"""

READER = """
import pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("trail", pathlib.Path(sys.argv[1]).read_text().split(), flush=True)
while True:
    time.sleep(1)
"""


def init_state(pod: dict[str, Any], index: int) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    return dict(statuses[index]) if len(statuses) > index else {}


async def kubectl_status(kubeconfig: Path, name: str) -> str:
    """The STATUS column ``kubectl get pod`` prints (kubectl's own printer judges what the node wrote)."""
    proc = await asyncio.create_subprocess_exec(
        "kubectl",
        "get",
        "pod",
        name,
        "-n",
        NS,
        "--no-headers",
        env=dict(os.environ, KUBECONFIG=str(kubeconfig), KUBECACHEDIR=str(kubeconfig.parent / "kubecache")),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode().split()[2]


@pytest.mark.kubectl
async def test_init_containers_run_in_order_to_completion_before_the_app_container(
    kube: KubeClient, start_runtime: Start, settings: NodeRuntimeSettings, apiserver: ApiServer, tmp_path: Path
) -> None:
    await start_runtime()
    trail = tmp_path / "trail"
    trail.write_text("")
    manifest = pod_manifest(
        "inits",
        container("app", READER, args=[str(trail)]),
        initContainers=[
            container("first", APPEND, args=[str(trail), "first"]),
            container("second", AFTER_GO, args=[str(tmp_path)]),
        ],
    )
    uid = (await kube.create(kinds.PODS, manifest))["metadata"]["uid"]

    async def second_running() -> dict[str, Any] | None:
        pod = await get_pod(kube, "inits")
        return pod if pod and "running" in init_state(pod, 1).get("state", {}) else None

    pod = await eventually(second_running)
    assert trail.read_text() == "first\n"
    assert pod["status"]["phase"] == "Pending"
    initialized = condition(pod, "Initialized")
    assert (initialized["status"], initialized["reason"]) == ("False", "ContainersNotInitialized")
    assert initialized["message"] == "containers with incomplete status: [second]"
    first = init_state(pod, 0)
    assert first["state"]["terminated"]["reason"] == "Completed"
    assert (first["state"]["terminated"]["exitCode"], first["ready"], first["restartCount"]) == (0, True, 0)
    assert init_state(pod, 1)["ready"] is False
    assert container_state(pod)["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert not (settings.pods_dir / uid / "app.log").exists()
    assert await kubectl_status(apiserver.kubeconfig, "inits") == "Init:1/2"

    (tmp_path / "go").write_text("")

    async def running() -> dict[str, Any] | None:
        pod = await get_pod(kube, "inits")
        return pod if pod and pod["status"].get("phase") == "Running" else None

    pod = await eventually(running)
    assert condition(pod, "Initialized")["status"] == "True"
    assert [s["state"]["terminated"]["reason"] for s in pod["status"]["initContainerStatuses"]] == ["Completed"] * 2
    log = settings.pods_dir / uid / "app.log"
    await until(lambda: log.exists() and "trail ['first', 'second']" in log.read_text())
    assert await kubectl_status(apiserver.kubeconfig, "inits") == "Running"
    started = [e["note"] for e in await events(kube, "Started")]
    assert started[:3] == ["Started container first", "Started container second", "Started container app"]
    assert not await events(kube, "Failed")  # no more "not supported" warning


@pytest.mark.kubectl
async def test_a_failing_init_container_is_retried_and_the_app_container_never_starts(
    kube: KubeClient, start_runtime: Start, settings: NodeRuntimeSettings, apiserver: ApiServer
) -> None:
    await start_runtime()
    manifest = pod_manifest("stuck", container("app", POLITE), initContainers=[container("init", CRASH)])
    uid = (await kube.create(kinds.PODS, manifest))["metadata"]["uid"]
    shown: set[str] = set()

    async def retried() -> dict[str, Any] | None:
        pod = await get_pod(kube, "stuck")
        if pod is None:
            return None
        shown.add(await kubectl_status(apiserver.kubeconfig, "stuck"))
        return pod if init_state(pod, 0).get("restartCount", 0) >= 2 and "Init:CrashLoopBackOff" in shown else None

    pod = await eventually(retried, within=15)
    assert pod["status"]["phase"] == "Pending"
    last = init_state(pod, 0)["lastState"]["terminated"]
    assert (last["exitCode"], last["reason"]) == (3, "Error")
    assert condition(pod, "Initialized")["message"] == "containers with incomplete status: [init]"
    assert container_state(pod)["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert not (settings.pods_dir / uid / "app.log").exists()


@pytest.mark.kubectl
async def test_a_failed_init_container_fails_a_pod_that_never_restarts(
    kube: KubeClient,
    start_runtime: Start,
    settings: NodeRuntimeSettings,
    sandboxes: FakeSandboxes,
    apiserver: ApiServer,
) -> None:
    await start_runtime()
    manifest = pod_manifest(
        "doomed", container("app", POLITE), initContainers=[container("init", CRASH)], restartPolicy="Never"
    )
    uid = (await kube.create(kinds.PODS, manifest))["metadata"]["uid"]

    async def failed() -> dict[str, Any] | None:
        pod = await get_pod(kube, "doomed")
        return pod if pod and pod["status"].get("phase") == "Failed" else None

    pod = await eventually(failed)
    terminated = init_state(pod, 0)["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")
    assert init_state(pod, 0)["restartCount"] == 0
    assert condition(pod, "Initialized")["status"] == "False"
    assert container_state(pod)["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert await kubectl_status(apiserver.kubeconfig, "doomed") == "Init:Error"
    await until(lambda: uid in sandboxes.destroyed)
    assert not (settings.pods_dir / uid / "app.log").exists()


async def test_deleting_a_pod_during_initialization_stops_its_init_container_and_starts_nothing_more(
    kube: KubeClient, start_runtime: Start, settings: NodeRuntimeSettings
) -> None:
    await start_runtime()
    manifest = pod_manifest(
        "halted", container("app", POLITE), initContainers=[container("wait", POLITE), container("next", "pass")]
    )
    uid = (await kube.create(kinds.PODS, manifest))["metadata"]["uid"]
    log = settings.pods_dir / uid / "wait.log"
    await until(lambda: log.exists() and "up" in log.read_text())
    pod = await get_pod(kube, "halted")
    assert pod is not None
    pid = int(init_state(pod, 0)["containerID"].removeprefix("ambit://"))
    await kube.delete(kinds.PODS, "halted", NS)
    await eventually(lambda: _gone(kube, "halted"))
    assert "got SIGTERM" in log.read_text()
    assert not alive(pid)
    assert not (settings.pods_dir / uid / "next.log").exists()
    assert not (settings.pods_dir / uid / "app.log").exists()


async def test_a_restarted_runtime_does_not_run_the_init_containers_of_an_initialized_pod_again(
    kube: KubeClient, start_runtime: Start, record: FakeRecord, tmp_path: Path
) -> None:
    first = await start_runtime()
    trail = tmp_path / "trail"
    trail.write_text("")
    manifest = pod_manifest(
        "again", container("app", POLITE), initContainers=[container("init", APPEND, args=[str(trail), "ran"])]
    )
    await kube.create(kinds.PODS, manifest)

    async def app_pid() -> int | None:
        pod = await get_pod(kube, "again")
        cid = container_state(pod).get("containerID") if pod else None
        return int(cid.removeprefix("ambit://")) if cid and pod and pod["status"]["phase"] == "Running" else None

    pid = await eventually(app_pid)
    await first.aclose()  # as if killed: the app container keeps running
    # Even with the init container's status lost, the node knows the pod is initialized (runtime.json).
    await kube.patch_status(kinds.PODS, "again", {"status": {"initContainerStatuses": None}}, NS)
    notes = len(record.notes)
    await start_runtime()

    async def adopted() -> dict[str, Any] | None:
        pod = await get_pod(kube, "again")
        return pod if pod and condition(pod, "Ready").get("status") == "True" else None

    await asyncio.sleep(0.5)  # time enough for an init container to run again, were it started
    pod = await eventually(adopted)
    assert container_state(pod)["containerID"] == f"ambit://{pid}"
    assert init_state(pod, 0)["state"]["terminated"]["reason"] == "Completed"
    assert condition(pod, "Initialized")["status"] == "True"
    assert trail.read_text() == "ran\n"
    assert not [f for kind, f in record.notes[notes:] if kind == "process"]


SIDECAR = """
import pathlib, signal, sys, time
here = pathlib.Path(sys.argv[1])
def bye(*_):
    trail = here / "trail"
    trail.write_text(trail.read_text() + sys.argv[2] + "-stopped" + chr(10))
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
time.sleep(0.3)
(here / "ready").write_text("")
print("sidecar up", flush=True)
while True:
    time.sleep(1)
"""

CHECKS_READY = """
import pathlib, sys
here = pathlib.Path(sys.argv[1])
trail = here / "trail"
trail.write_text(trail.read_text() + ("saw-ready" if (here / "ready").exists() else "no-ready") + chr(10))
"""


async def test_a_native_sidecar_starts_before_the_next_init_container_and_runs_beside_the_app_until_after_it(
    kube: KubeClient, start_runtime: Start, settings: NodeRuntimeSettings, tmp_path: Path
) -> None:
    await start_runtime()
    trail = tmp_path / "trail"
    trail.write_text("")
    sidecar = container(
        "proxy",
        SIDECAR,
        args=[str(tmp_path), "proxy"],
        restartPolicy="Always",
        startupProbe={"exec": {"command": ["test", "-f", str(tmp_path / "ready")]}, "periodSeconds": 1},
    )
    manifest = pod_manifest(
        "sidecar",
        container("app", SIDECAR, args=[str(tmp_path), "app"]),
        initContainers=[sidecar, container("check", CHECKS_READY, args=[str(tmp_path)])],
    )
    uid = (await kube.create(kinds.PODS, manifest))["metadata"]["uid"]

    async def ready() -> dict[str, Any] | None:
        pod = await get_pod(kube, "sidecar")
        return pod if pod and condition(pod, "Ready").get("status") == "True" else None

    pod = await eventually(ready)
    assert trail.read_text() == "saw-ready\n"  # the next init container waited for the sidecar's startup probe
    assert pod["status"]["phase"] == "Running"
    assert condition(pod, "Initialized")["status"] == "True"
    proxy = init_state(pod, 0)
    assert "running" in proxy["state"]
    assert (proxy["started"], proxy["ready"]) == (True, True)
    assert init_state(pod, 1)["state"]["terminated"]["reason"] == "Completed"
    app_pid = int(container_state(pod)["containerID"].removeprefix("ambit://"))
    proxy_pid = int(proxy["containerID"].removeprefix("ambit://"))

    os.killpg(proxy_pid, signal.SIGKILL)  # a sidecar that exits is restarted; the app runs on

    async def restarted() -> dict[str, Any] | None:
        pod = await get_pod(kube, "sidecar")
        state = init_state(pod, 0) if pod else {}
        return pod if state.get("restartCount") == 1 and "running" in state.get("state", {}) else None

    pod = await eventually(restarted)
    assert condition(pod, "Initialized")["status"] == "True"
    assert container_state(pod)["containerID"] == f"ambit://{app_pid}"
    assert trail.read_text() == "saw-ready\n"  # the plain init container did not run again
    proxy_log = settings.pods_dir / uid / "proxy.log"
    await until(lambda: proxy_log.read_text().count("sidecar up") == 2)

    await kube.delete(kinds.PODS, "sidecar", NS)
    await eventually(lambda: _gone(kube, "sidecar"))
    assert trail.read_text() == "saw-ready\napp-stopped\nproxy-stopped\n"  # the sidecar stops after the app


async def test_a_native_sidecar_is_stopped_once_the_app_containers_completed(
    kube: KubeClient, start_runtime: Start, tmp_path: Path
) -> None:
    await start_runtime()
    trail = tmp_path / "trail"
    trail.write_text("")
    sidecar = container("proxy", SIDECAR, args=[str(tmp_path), "proxy"], restartPolicy="Always")
    manifest = pod_manifest(
        "job", container("app", "import time; time.sleep(0.5)"), initContainers=[sidecar], restartPolicy="Never"
    )
    await kube.create(kinds.PODS, manifest)

    async def succeeded() -> dict[str, Any] | None:
        pod = await get_pod(kube, "job")
        return pod if pod and pod["status"].get("phase") == "Succeeded" else None

    pod = await eventually(succeeded)
    await until(lambda: trail.read_text() == "proxy-stopped\n")
    assert container_state(pod)["state"]["terminated"]["exitCode"] == 0


async def test_a_force_deleted_pod_is_stopped_and_cleaned_up(
    kube: KubeClient, start_runtime: Start, sandboxes: FakeSandboxes
) -> None:
    await start_runtime()
    created = await kube.create(kinds.PODS, pod_manifest("forced", container("app", POLITE)))

    async def pid_of() -> int | None:
        pod = await get_pod(kube, "forced")
        cid = container_state(pod).get("containerID") if pod else None
        return int(cid.removeprefix("ambit://")) if cid else None

    pid = await eventually(pid_of)
    await kube.delete(kinds.PODS, "forced", NS, grace_period_seconds=0)
    assert await _gone(kube, "forced")
    await until(lambda: not alive(pid))
    await until(lambda: created["metadata"]["uid"] in sandboxes.destroyed)


async def _gone(kube: KubeClient, name: str) -> bool:
    return await get_pod(kube, name) is None


# -- the runtime restarting -------------------------------------------------------------------------------------
async def test_a_restarted_runtime_adopts_running_processes_and_restarts_dead_ones(
    kube: KubeClient, start_runtime: Start, record: FakeRecord
) -> None:
    first = await start_runtime()
    await kube.create(kinds.PODS, pod_manifest("stays", container("app", POLITE)))
    await kube.create(kinds.PODS, pod_manifest("dies", container("app", POLITE)))
    mixed = pod_manifest("mixed", container("done", "pass"), container("long", POLITE), restartPolicy="Never")
    await kube.create(kinds.PODS, mixed)

    async def done_exited() -> bool:
        pod = await get_pod(kube, "mixed")
        return bool(pod and "terminated" in container_state(pod, 0).get("state", {}))

    await eventually(done_exited)

    async def pids() -> dict[str, int] | None:
        found = {}
        for name in ("stays", "dies"):
            pod = await get_pod(kube, name)
            cid = container_state(pod).get("containerID") if pod else None
            if not cid or pod is None or pod["status"].get("phase") != "Running":
                return None
            found[name] = int(cid.removeprefix("ambit://"))
        return found

    before = await eventually(pids)
    await first.aclose()  # as if killed: the containers keep running
    assert alive(before["stays"]) and alive(before["dies"])
    os.killpg(before["dies"], signal.SIGKILL)
    await until(lambda: not alive(before["dies"]))
    notes = len(record.notes)

    await start_runtime()

    async def restarted() -> dict[str, Any] | None:
        pod = await get_pod(kube, "dies")
        return (
            pod
            if pod and container_state(pod).get("restartCount") == 1 and pod["status"]["phase"] == "Running"
            else None
        )

    dies = await eventually(restarted)
    # Another runtime process would not know the exit code (ContainerStatusUnknown); this one reaps its child.
    last = container_state(dies)["lastState"]["terminated"]
    assert (last["exitCode"], last["reason"]) in ((137, "Error"), (137, "ContainerStatusUnknown"))
    stays = await get_pod(kube, "stays")
    assert stays is not None
    assert container_state(stays)["containerID"] == f"ambit://{before['stays']}"
    assert container_state(stays)["restartCount"] == 0
    assert alive(before["stays"])
    pod = await get_pod(kube, "mixed")
    assert pod is not None
    assert container_state(pod, 0)["state"]["terminated"]["exitCode"] == 0  # completed: not run again
    assert container_state(pod, 0)["restartCount"] == 0
    assert "running" in container_state(pod, 1)["state"]
    new_pids = [f["pid"] for kind, f in record.notes[notes:] if kind == "process"]
    assert len(new_pids) == 1 and new_pids[0] != before["dies"]  # only the dead one was started again


async def test_pods_deleted_while_the_runtime_was_away_are_cleaned_up(
    kube: KubeClient, start_runtime: Start, sandboxes: FakeSandboxes, settings: NodeRuntimeSettings
) -> None:
    first = await start_runtime()
    created = await kube.create(kinds.PODS, pod_manifest("orphan", container("app", POLITE)))
    uid = created["metadata"]["uid"]

    async def pid_of() -> int | None:
        pod = await get_pod(kube, "orphan")
        cid = container_state(pod).get("containerID") if pod else None
        return int(cid.removeprefix("ambit://")) if cid else None

    pid = await eventually(pid_of)
    await first.aclose()
    await kube.delete(kinds.PODS, "orphan", NS, grace_period_seconds=0)
    assert alive(pid)

    await start_runtime()
    await until(lambda: not alive(pid))
    await until(lambda: uid in sandboxes.destroyed)
    assert not (settings.pods_dir / uid / "runtime.json").exists()
    assert (settings.pods_dir / uid / "app.log").exists()  # logs are kept


# -- volumes ------------------------------------------------------------------------------------------------------
def volume_dir(settings: NodeRuntimeSettings, uid: str, plugin: str, name: str) -> Path:
    return settings.pods_dir / uid / "volumes" / f"kubernetes.io~{plugin}" / name


async def running_pod(kube: KubeClient, name: str) -> dict[str, Any]:
    async def running() -> dict[str, Any] | None:
        pod = await get_pod(kube, name)
        return pod if pod and pod["status"].get("phase") == "Running" else None

    found: dict[str, Any] = await eventually(running)
    return found


async def test_volumes_are_written_as_kubelet_s_atomic_writer_and_follow_their_config_map(
    kube: KubeClient, start_runtime: Start, settings: NodeRuntimeSettings
) -> None:
    await start_runtime()
    await kube.create(kinds.CONFIG_MAPS, {"metadata": {"name": "app", "namespace": NS}, "data": {"color": "blue"}})
    await kube.create(kinds.SECRETS, {"metadata": {"name": "db", "namespace": NS}, "data": {"pw": "aHVudGVyMg=="}})
    volumes = [
        {"name": "cfg", "configMap": {"name": "app"}},
        {"name": "creds", "secret": {"secretName": "db", "defaultMode": 0o400}},
        {"name": "scratch", "emptyDir": {}},
        {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
        {
            "name": "mesh",
            "projected": {
                "sources": [
                    {"serviceAccountToken": {"audience": "istio-ca", "path": "istio-token", "expirationSeconds": 600}},
                    {"configMap": {"name": "app", "items": [{"key": "color", "path": "conf/color"}]}},
                ]
            },
        },
    ]
    manifest = pod_manifest("vols", container("app", POLITE), volumes=volumes)
    manifest["metadata"]["labels"] = {"app": "vols"}
    uid = (await kube.create(kinds.PODS, manifest))["metadata"]["uid"]
    await running_pod(kube, "vols")

    cfg = volume_dir(settings, uid, "configmap", "cfg")
    assert (cfg / "color").read_text() == "blue"
    assert os.readlink(cfg / "color") == "..data/color"
    first = os.readlink(cfg / "..data")
    assert first.startswith("..") and (cfg / first).is_dir()
    creds = volume_dir(settings, uid, "secret", "creds") / "pw"
    assert creds.read_text() == "hunter2" and stat.S_IMODE(creds.stat().st_mode) == 0o400
    assert stat.S_IMODE(volume_dir(settings, uid, "empty-dir", "scratch").stat().st_mode) == 0o777
    assert (volume_dir(settings, uid, "downward-api", "info") / "labels").read_text() == 'app="vols"'
    mesh = volume_dir(settings, uid, "projected", "mesh")
    assert (mesh / "conf" / "color").read_text() == "blue"
    review = await kube.token_review((mesh / "istio-token").read_text(), ["istio-ca"])
    assert review["status"]["authenticated"]
    assert review["status"]["user"]["username"] == "system:serviceaccount:default:default"
    assert stat.S_IMODE((settings.pods_dir / uid).stat().st_mode) == 0o700

    await kube.patch(kinds.CONFIG_MAPS, "app", {"data": {"color": "green"}}, NS)
    await kube.patch(kinds.PODS, "vols", {"metadata": {"labels": {"app": "vols", "v": "2"}}}, NS)
    await until(lambda: (cfg / "color").read_text() == "green")
    await until(lambda: (mesh / "conf" / "color").read_text() == "green")
    labels = volume_dir(settings, uid, "downward-api", "info") / "labels"
    await until(lambda: labels.read_text() == 'app="vols"\nv="2"')
    assert os.readlink(cfg / "..data") != first and not (cfg / first).exists()  # the old files are gone
    assert sorted(p.name for p in cfg.iterdir() if not p.name.startswith("..")) == ["color"]

    await kube.delete(kinds.PODS, "vols", NS)
    await until(lambda: not (settings.pods_dir / uid / "volumes").exists())


async def test_a_missing_config_map_is_a_failed_mount_until_it_appears(kube: KubeClient, start_runtime: Start) -> None:
    await start_runtime()
    volumes = [{"name": "cfg", "configMap": {"name": "later"}}]
    await kube.create(kinds.PODS, pod_manifest("waits", container("app", POLITE), volumes=volumes))
    failed = await eventually(lambda: events(kube, "FailedMount"))
    assert failed[0]["note"] == 'MountVolume.SetUp failed for volume "cfg" : configmap "later" not found'
    pod = await get_pod(kube, "waits")
    assert pod is not None and pod["status"]["phase"] == "Pending"
    assert container_state(pod)["state"]["waiting"]["reason"] == "ContainerCreating"
    await kube.create(kinds.CONFIG_MAPS, {"metadata": {"name": "later", "namespace": NS}, "data": {"k": "v"}})
    await running_pod(kube, "waits")


async def test_host_paths_are_checked_by_type_and_confined_to_the_node_s_tree(
    kube: KubeClient, start_runtime: Start, settings: NodeRuntimeSettings, tmp_path: Path
) -> None:
    await start_runtime()
    await kube.patch(kinds.NAMESPACES, NS, {"metadata": {"labels": {PRIVILEGED: "privileged"}}})
    node_root = tmp_path / "nodes" / "node-1" / "root"
    volumes = [
        {"name": "bin", "hostPath": {"path": "/opt/cni/bin", "type": "DirectoryOrCreate"}},
        {"name": "sock", "hostPath": {"path": "/agent.sock", "type": "FileOrCreate"}},  # kube makes no parents
        {"name": "proc", "hostPath": {"path": "/proc", "type": "Directory"}},
    ]
    await kube.create(kinds.PODS, pod_manifest("hosty", container("app", POLITE), volumes=volumes))
    await running_pod(kube, "hosty")
    assert (tmp_path / "nodes" / "node-1" / "cni" / "bin").is_dir()
    assert (node_root / "agent.sock").is_file()

    missing = [{"name": "gone", "hostPath": {"path": "/etc/not-there", "type": "Directory"}}]
    await kube.create(kinds.PODS, pod_manifest("missing", container("app", POLITE), volumes=missing))
    (node_root / "escape").symlink_to(tmp_path / "apiserver")  # a link a pod planted, towards the lab's state
    escape = [{"name": "state", "hostPath": {"path": "/escape"}}]
    await kube.create(kinds.PODS, pod_manifest("escaper", container("app", POLITE), volumes=escape))
    proc_escape = [{"name": "root", "hostPath": {"path": "/proc/self/root"}}]
    await kube.create(kinds.PODS, pod_manifest("procker", container("app", POLITE), volumes=proc_escape))

    async def notes() -> set[str] | None:
        found = {e["note"] for e in await events(kube, "FailedMount")}
        return found if len(found) >= 3 else None

    found = await eventually(notes)
    assert (
        'MountVolume.SetUp failed for volume "gone" : hostPath type check failed: /etc/not-there is not a directory'
        in found
    )
    assert (
        'MountVolume.SetUp failed for volume "state" : hostPath /escape leads outside the node\'s filesystem' in found
    )
    assert (
        'MountVolume.SetUp failed for volume "root" : hostPath /proc/self/root leads outside the node\'s filesystem'
        in found
    )
    for name in ("missing", "escaper", "procker"):
        pod = await get_pod(kube, name)
        assert pod is not None and pod["status"]["phase"] == "Pending"


async def test_pod_security_refuses_a_host_path_below_privileged(kube: KubeClient) -> None:
    volumes = [{"name": "bin", "hostPath": {"path": "/opt/cni/bin"}}]
    await kube.patch(kinds.NAMESPACES, NS, {"metadata": {"labels": {PRIVILEGED: "baseline"}}})
    with pytest.raises(KubeClientError, match="hostPath volumes"):
        await kube.create(kinds.PODS, pod_manifest("refused", container("app", POLITE), volumes=volumes))
    await kube.patch(kinds.NAMESPACES, NS, {"metadata": {"labels": {PRIVILEGED: "privileged"}}})
    await kube.create(kinds.PODS, pod_manifest("admitted", container("app", POLITE), volumes=volumes))


# -- probes from the node -----------------------------------------------------------------------------------------
async def test_tcp_and_http_probes_reach_a_listener() -> None:
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:  # the TCP probe only connects
            writer.close()
            return
        seen.append(head)
        code = b"200 OK" if head.startswith(b"GET /healthz ") else b"500 Oops"
        writer.write(b"HTTP/1.1 " + code + b"\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    target = ProbeTarget("127.0.0.1", "", {})
    container_ports = {"ports": [{"name": "web", "containerPort": port}]}
    async with server:
        tcp = ProbeSpec.parse({"tcpSocket": {"port": port}}, {})
        assert (await probe_once(tcp, target))[0] is ProbeResult.SUCCESS
        http = ProbeSpec.parse(
            {"httpGet": {"path": "/healthz", "port": "web", "httpHeaders": [{"name": "X-Probe", "value": "yes"}]}},
            container_ports,
        )
        assert await probe_once(http, target) == (ProbeResult.SUCCESS, "")
        assert b"X-Probe: yes\r\n" in seen[-1]
        assert b"User-Agent: kube-probe/" in seen[-1]
        bad = ProbeSpec.parse({"httpGet": {"path": "/other", "port": port}}, {})
        assert await probe_once(bad, target) == (ProbeResult.FAILURE, "HTTP probe failed with statuscode: 500")
    closed = free_port()  # nobody listens there
    result, message = await probe_once(ProbeSpec.parse({"tcpSocket": {"port": closed}}, {}), target)
    assert (result, message) == (ProbeResult.FAILURE, f"dial tcp 127.0.0.1:{closed}: connect: connection refused")


async def test_exec_probes_judge_by_exit_status_and_time_out() -> None:
    target = ProbeTarget("127.0.0.1", "", {"PATH": os.environ.get("PATH", ""), "WHO": "pod"})
    ok = ProbeSpec.parse({"exec": {"command": [PY, "-c", "import os; assert os.environ['WHO'] == 'pod'"]}}, {})
    assert (await probe_once(ok, target))[0] is ProbeResult.SUCCESS
    bad = ProbeSpec.parse({"exec": {"command": [PY, "-c", "print('sad'); raise SystemExit(2)"]}}, {})
    result, message = await probe_once(bad, target)
    assert result is ProbeResult.FAILURE and "exited with 2" in message and "sad" in message
    slow = ProbeSpec.parse({"exec": {"command": ["sleep", "5"]}, "timeoutSeconds": 1}, {})
    began = time.monotonic()
    result, message = await probe_once(slow, target)
    assert result is ProbeResult.FAILURE and "timeout" in message
    assert time.monotonic() - began < 3
