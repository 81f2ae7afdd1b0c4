"""The node runtime: the kubelet's role for one lab node (node registration, pods' lives, their status).

Theory of operation. :class:`NodeRuntime` registers its Node (labels, ``podCIDR``, address, a Ready condition
with a heartbeat) and a Lease in ``kube-node-lease``, both renewed every ``heartbeat_interval``. An informer
watches the pods bound to the node (``spec.nodeName=<node>``); each pod, by uid, gets one :class:`PodWorker`, the
only writer of that pod's status and of its files under ``<pods_dir>/<uid>/``. Pods are network namespaces made by
the :class:`SandboxManager` (CNI ADD/DEL); containers are processes (:mod:`ambit.lab.containers`); readiness and
liveness are probed from the node's namespace (:mod:`ambit.lab.probes`).

Stages of a pod worker (rules, in the order they apply):

Rule 1. SANDBOX: create the sandbox. A failure leaves the pod Pending with ``PodReadyToStartContainers`` and
        ``ContainersReady`` false carrying the error, records a Warning ``FailedCreatePodSandBox`` Event and tries
        again after a back-off (``sandbox_backoff_initial`` doubling to ``sandbox_backoff_max``). A pod with
        ``hostNetwork`` gets no sandbox: it runs in the node's namespace with the node's address.
Rule 2. TOKEN: unless ``automountServiceAccountToken`` is false, write a service-account token bound to the pod to
        ``<pods_dir>/<uid>/token`` (0600) before any container starts, and refresh it at ``token_refresh_fraction``
        of its lifetime. Failures retry like rule 1 (Warning ``FailedMount``).
Rule 3. RUNNING: one supervisor per container starts, restarts and probes it (its own rules are in
        :mod:`ambit.lab.containers`). When every container has exited for good the pod is Succeeded or Failed
        and its sandbox is destroyed; the worker then only waits for the pod's deletion.
Rule 4. TERMINATING preempts every stage, once the pod has a ``deletionTimestamp`` or is gone from the API (force
        deletion): SIGTERM to every container's process group, SIGKILL after the grace period
        (``deletionGracePeriodSeconds``, else ``spec.terminationGracePeriodSeconds``, at least
        ``minimum_grace_seconds``), destroy the sandbox, write the final status, then delete the pod with grace 0
        (the API server keeps a node-bound pod until then). A pod already gone from the API is only cleaned up.
Rule 5. Status is computed from the worker's state and written (``pods/status``, merge patch) only when it
        differs from what was last written, or from what the API holds when the worker starts.
Rule 6. Adoption: ``<pods_dir>/<uid>/runtime.json`` records the node, the sandbox and each container's pid with its
        start time, rewritten after each change. A worker starting for a pod that has that file takes over the
        sandbox and the processes that still run (the same pid and start time) instead of starting new ones;
        processes found in the pod's namespace that it does not know are killed. A pod the API already reports
        Succeeded or Failed is never started again. After the first list, files of pods of this node that the
        API no longer has are cleaned up (processes stopped, sandbox destroyed).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import inspect
import json
import logging
import os
import platform
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from ambit.k8s import EventRecorder, EventRecorderSettings, Informer, InformerSettings, KubeClient, kinds
from ambit.k8s.errors import KubeAlreadyExistsError, KubeClientError, KubeNotFoundError
from ambit.k8s.events import micro_time
from ambit.lab.cni import CniError
from ambit.lab.containers import (
    ContainerConfigError,
    ContainerState,
    ContainerSupervisor,
    Exited,
    LaunchSpec,
    Phase,
    ProcessHandle,
    RestartBackoff,
    container_argv,
    container_status,
    find_process,
    parse_rfc3339,
    pids_in_netns,
    pod_phase,
    reap,
    rfc3339,
    spawn,
    stop_process,
)
from ambit.lab.probes import ProbeTarget
from ambit.lab.topology import API_PORT, BRIDGE_ADDRESS, Topology

log = logging.getLogger("ambit.lab.kubelet")

KUBELET_VERSION = "v1.32.0-ambit"
RUNTIME_VERSION = "ambit://0.1.0"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NODE_LEASE_NAMESPACE = "kube-node-lease"
STATE_FILE = "runtime.json"
MANAGED_STATUS = ("phase", "conditions", "hostIP", "hostIPs", "podIP", "podIPs", "startTime", "containerStatuses")
EventType = Literal["Normal", "Warning"]


# -- seams --------------------------------------------------------------------------------------------------------
class SandboxInfo(Protocol):
    @property
    def netns(self) -> str: ...
    @property
    def netns_path(self) -> str: ...
    @property
    def ips(self) -> tuple[str, ...]: ...


class SandboxManager(Protocol):
    """Pod network namespaces (``ambit.lab.sandbox.PodSandboxes``); ``create`` raises ``CniError`` on failure."""

    async def create(self, pod: dict[str, Any]) -> SandboxInfo: ...

    async def destroy(self, pod_uid: str) -> None: ...


class ProcessRecord(Protocol):
    """The lab's crash-safe record (``ambit.lab.record.Record``); ``note`` may be a plain or a coroutine method."""

    def note(self, kind: str, **fields: Any) -> object: ...


# -- settings -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class NodeRuntimeSettings:
    node_name: str
    node_ip: str
    """The node's InternalIP; pods' ``hostIP``."""
    pod_cidr: str
    pods_dir: Path
    """Per-pod files: ``<pods_dir>/<uid>/token``, ``<container>.log``, ``runtime.json``."""
    api_host: str = BRIDGE_ADDRESS
    """``KUBERNETES_SERVICE_HOST`` for pods."""
    api_port: int = API_PORT
    labels: Mapping[str, str] = field(default_factory=dict)
    """Node labels besides ``kubernetes.io/hostname`` and ``kubernetes.io/os``."""
    container_path: str = DEFAULT_PATH
    """``PATH`` of containers (no image brings one)."""
    heartbeat_interval: float = 10.0
    """Seconds between Node status heartbeats and Lease renewals."""
    lease_duration_seconds: int = 40
    sandbox_backoff_initial: float = 1.0
    sandbox_backoff_max: float = 300.0
    restart_backoff_initial: float = 10.0
    restart_backoff_max: float = 300.0
    restart_backoff_reset: float = 600.0
    """A container that ran this long starts its restart back-off over."""
    config_retry: float = 10.0
    """Seconds before retrying a container whose ConfigMap or Secret reference could not be resolved."""
    token_expiration_seconds: int = 3600
    token_refresh_fraction: float = 0.8
    minimum_grace_seconds: float = 2.0
    """The kubelet's floor on termination grace periods (a force deletion still gets this long)."""
    informer: InformerSettings = field(default_factory=InformerSettings)

    @classmethod
    def for_lab(cls, topology: Topology, node_name: str, **overrides: Any) -> NodeRuntimeSettings:
        node = topology.node_named(node_name)
        if node is None:
            raise ValueError(f"the lab has no node {node_name!r}")
        base = cls(node.name, node.address, node.pod_cidr, topology.path / "pods")
        return dataclasses.replace(base, **overrides)


# -- environment (pure) -------------------------------------------------------------------------------------------
def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined names are replaced, others kept; ``$$`` is a literal ``$``."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            if text[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            if text[i + 1] == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env[name] if name in env else text[i : end + 1])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


ConfigKey = tuple[str, str]  # ("configmap" | "secret", name)


def config_refs(container: Mapping[str, Any]) -> set[ConfigKey]:
    """The ConfigMaps and Secrets a container's environment reads."""
    refs: set[ConfigKey] = set()
    for source in container.get("envFrom") or ():
        for key, kind in (("configMapRef", "configmap"), ("secretRef", "secret")):
            if isinstance(source, dict) and isinstance(source.get(key), dict):
                refs.add((kind, str(source[key].get("name", ""))))
    for entry in container.get("env") or ():
        value_from = entry.get("valueFrom") if isinstance(entry, dict) else None
        for key, kind in (("configMapKeyRef", "configmap"), ("secretKeyRef", "secret")):
            if isinstance(value_from, dict) and isinstance(value_from.get(key), dict):
                refs.add((kind, str(value_from[key].get("name", ""))))
    return refs


def field_value(pod: Mapping[str, Any], path: str, pod_ips: Sequence[str], host_ip: str) -> str:
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    for prefix, source in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
        if path.startswith(prefix + "['") and path.endswith("']"):
            return str((meta.get(source) or {}).get(path[len(prefix) + 2 : -2], ""))
    values = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
        "status.podIP": pod_ips[0] if pod_ips else "",
        "status.podIPs": ",".join(pod_ips),
    }
    if path not in values:
        raise ContainerConfigError(f"unsupported fieldRef {path!r}", retry=False)
    return str(values[path] or "")


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    base: Mapping[str, str],
    configs: Mapping[ConfigKey, Mapping[str, str] | None],
    pod_ips: Sequence[str],
    host_ip: str,
) -> dict[str, str]:
    """``base`` (the runtime's variables), then ``envFrom``, then ``env``, as the kubelet orders them."""
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    env = dict(base)
    for source in container.get("envFrom") or ():
        for key, kind in (("configMapRef", "configmap"), ("secretRef", "secret")):
            ref = source.get(key) if isinstance(source, dict) else None
            if isinstance(ref, dict):
                data = configs.get((kind, str(ref.get("name", ""))))
                if data is None:
                    if ref.get("optional"):
                        continue
                    raise ContainerConfigError(f'{kind} "{ref.get("name")}" not found', retry=True)
                prefix = str(source.get("prefix") or "")
                env.update({prefix + k: v for k, v in data.items()})
    for entry in container.get("env") or ():
        if not isinstance(entry, dict) or not entry.get("name"):
            continue
        name = str(entry["name"])
        value_from = entry.get("valueFrom")
        if not isinstance(value_from, dict):
            env[name] = expand(str(entry.get("value") or ""), env)
            continue
        if isinstance(value_from.get("fieldRef"), dict):
            env[name] = field_value(pod, str(value_from["fieldRef"].get("fieldPath", "")), pod_ips, host_ip)
            continue
        for key, kind, title in (("configMapKeyRef", "configmap", "ConfigMap"), ("secretKeyRef", "secret", "Secret")):
            ref = value_from.get(key)
            if isinstance(ref, dict):
                ref_name, ref_key = str(ref.get("name", "")), str(ref.get("key", ""))
                data = configs.get((kind, ref_name))
                if data is not None and ref_key in data:
                    env[name] = data[ref_key]
                elif not ref.get("optional"):
                    problem = (
                        f'{kind} "{ref_name}" not found'
                        if data is None
                        else f"couldn't find key {ref_key} in {title} {namespace}/{ref_name}"
                    )
                    raise ContainerConfigError(problem, retry=True)
                break
        else:
            raise ContainerConfigError(f"env {name}: unsupported valueFrom {sorted(value_from)}", retry=False)
    return env


# -- pod status (pure) --------------------------------------------------------------------------------------------
def _condition(
    kind: str, ok: bool, now: float, previous: Mapping[str, Mapping[str, Any]], reason: str = "", message: str = ""
) -> dict[str, Any]:
    status = "True" if ok else "False"
    before = previous.get(kind) or {}
    since = before.get("lastTransitionTime") if before.get("status") == status else None
    cond: dict[str, Any] = {"type": kind, "status": status, "lastTransitionTime": since or rfc3339(now)}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


@dataclass(frozen=True, slots=True)
class PodView:
    """What a pod's status is computed from."""

    restart_policy: str
    containers: Sequence[tuple[ContainerState, str]]
    """Each container's state with its image."""
    pod_ref: str
    host_ip: str
    pod_ips: tuple[str, ...]
    sandbox_ready: bool
    sandbox_error: str
    start_time: str
    deleted: bool = False
    """Being terminated: the phase is final (Succeeded when every container exited 0, else Failed)."""


def pod_status(view: PodView, previous: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The status the node reports; ``previous`` is the pod's current status (for transition times)."""
    states = [state for state, _ in view.containers]
    phase = pod_phase(view.restart_policy, states)
    if view.deleted and phase not in ("Succeeded", "Failed"):
        all_ok = all((s.last_termination or {}).get("exitCode") == 0 and s.phase is Phase.EXITED for s in states)
        phase = "Succeeded" if all_ok and states else "Failed"
    conditions = {
        str(c.get("type")): c for c in previous.get("conditions") or () if isinstance(c, dict) and c.get("type")
    }
    unready = [s.name for s in states if not (s.ready and s.phase is Phase.RUNNING)]
    terminal = phase in ("Succeeded", "Failed")
    if terminal:
        ready_reason, ready_message = "PodCompleted", ""
    elif unready:
        ready_reason, ready_message = "ContainersNotReady", f"containers with unready status: [{' '.join(unready)}]"
        if view.sandbox_error:
            ready_message += f"; pod sandbox not created: {view.sandbox_error}"
    else:
        ready_reason = ready_message = ""
    sandbox_reason = "FailedCreatePodSandBox" if view.sandbox_error else ""
    scheduled = conditions.get("PodScheduled")
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [
            _condition(
                "PodReadyToStartContainers", view.sandbox_ready, now, conditions, sandbox_reason, view.sandbox_error
            ),
            _condition("Initialized", True, now, conditions, "PodCompleted" if terminal else ""),
            _condition("Ready", not unready and not terminal, now, conditions, ready_reason, ready_message),
            _condition("ContainersReady", not unready and not terminal, now, conditions, ready_reason, ready_message),
            dict(scheduled) if scheduled else _condition("PodScheduled", True, now, conditions),
        ],
        "hostIP": view.host_ip,
        "hostIPs": [{"ip": view.host_ip}],
        "startTime": view.start_time,
        "containerStatuses": [container_status(state, image, view.pod_ref) for state, image in view.containers],
    }
    if view.pod_ips:
        status["podIP"] = view.pod_ips[0]
        status["podIPs"] = [{"ip": ip} for ip in view.pod_ips]
    return status


def status_patch(written: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any] | None:
    """A merge patch from ``written`` to ``status`` (managed keys only), or None when nothing changed."""
    patch = {k: v for k, v in status.items() if written.get(k) != v}
    patch.update({k: None for k in MANAGED_STATUS if k in written and k not in status})
    return {"status": patch} if patch else None


def sandbox_error_message(exc: BaseException) -> str:
    """What a sandbox failure says, in the kubelet's words for a CNI plugin's error."""
    if isinstance(exc, CniError):
        text = exc.msg or "no message"
        if exc.plugin:
            text = f'plugin type="{exc.plugin}" failed ({(exc.command or "add").lower()}): {text}'
        return f"{text}: {exc.details}" if exc.details else text
    return str(exc) or type(exc).__name__


# -- node (pure) --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class HostInfo:
    machine_id: str
    boot_id: str
    kernel: str
    os_image: str
    architecture: str
    cpus: int
    memory_kib: int

    @classmethod
    def read(cls) -> HostInfo:
        def first(path: str) -> str:
            with contextlib.suppress(OSError):
                return Path(path).read_text().strip()
            return ""

        os_image = "Linux"
        for line in first("/etc/os-release").splitlines():
            if line.startswith("PRETTY_NAME="):
                os_image = line.split("=", 1)[1].strip('"')
        memory = 0
        for line in first("/proc/meminfo").splitlines():
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1])
        machine = platform.machine()
        arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)
        return cls(
            first("/etc/machine-id"),
            first("/proc/sys/kernel/random/boot_id"),
            platform.release(),
            os_image,
            arch,
            os.cpu_count() or 1,
            memory,
        )


def node_manifest(settings: NodeRuntimeSettings) -> dict[str, Any]:
    labels = {**settings.labels, "kubernetes.io/hostname": settings.node_name, "kubernetes.io/os": "linux"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": settings.node_name, "labels": labels},
        "spec": {"podCIDR": settings.pod_cidr, "podCIDRs": [settings.pod_cidr]},
    }


def node_status(settings: NodeRuntimeSettings, host: HostInfo, ready_since: float, now: float) -> dict[str, Any]:
    def condition(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
        return {
            "type": kind,
            "status": "True" if ok else "False",
            "lastHeartbeatTime": rfc3339(now),
            "lastTransitionTime": rfc3339(ready_since),
            "reason": reason,
            "message": message,
        }

    resources = {"cpu": str(host.cpus), "memory": f"{host.memory_kib}Ki", "pods": "110"}
    return {
        "addresses": [
            {"type": "InternalIP", "address": settings.node_ip},
            {"type": "Hostname", "address": settings.node_name},
        ],
        "conditions": [
            condition("MemoryPressure", False, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            condition("DiskPressure", False, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            condition("PIDPressure", False, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            condition("Ready", True, "KubeletReady", "kubelet is posting ready status"),
        ],
        "capacity": resources,
        "allocatable": resources,
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {
            "machineID": host.machine_id,
            "systemUUID": host.machine_id,
            "bootID": host.boot_id,
            "kernelVersion": host.kernel,
            "osImage": host.os_image,
            "containerRuntimeVersion": RUNTIME_VERSION,
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": KUBELET_VERSION,
            "operatingSystem": "linux",
            "architecture": host.architecture,
        },
    }


# -- the per-pod state file ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SavedSandbox:
    netns: str
    netns_path: str
    ips: tuple[str, ...]


@dataclass(slots=True)
class PodRecord:
    """``runtime.json``: what rule 6 needs to adopt a pod after the runtime restarted."""

    node: str
    uid: str
    sandbox: SavedSandbox | None = None
    processes: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Container name → (pid, start ticks)."""

    def save(self, path: Path) -> None:
        data = {
            "node": self.node,
            "uid": self.uid,
            "sandbox": dataclasses.asdict(self.sandbox) if self.sandbox else None,
            "processes": {name: list(p) for name, p in self.processes.items()},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> PodRecord | None:
        try:
            data = json.loads(path.read_text())
            sandbox = data.get("sandbox")
            return cls(
                str(data["node"]),
                str(data["uid"]),
                SavedSandbox(str(sandbox["netns"]), str(sandbox["netns_path"]), tuple(sandbox["ips"]))
                if sandbox
                else None,
                {str(k): (int(v[0]), int(v[1])) for k, v in (data.get("processes") or {}).items()},
            )
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            return None


_ACTIONS = {
    "Started": "StartContainer",
    "Failed": "StartContainer",
    "BackOff": "StartContainer",
    "Unhealthy": "Probe",
    "Killing": "KillContainer",
    "FailedCreatePodSandBox": "CreatePodSandbox",
    "FailedKillPod": "KillPodSandbox",
    "FailedMount": "MountVolume",
}


class PodWorker:
    """One pod's life on this node (rules 1 to 6 of the module docstring); the hooks of its containers."""

    def __init__(self, runtime: NodeRuntime, pod: dict[str, Any]) -> None:
        self.runtime = runtime
        self.pod = pod
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        self.uid = str(meta["uid"])
        self.name = str(meta.get("name") or "")
        self.namespace = str(meta.get("namespace") or "")
        s = runtime.settings
        self.removed = False
        """The pod is gone from the API (deleted with grace 0, by us or by force)."""
        self.deleting = asyncio.Event()
        self.sandbox: SavedSandbox | None = None
        self.sandbox_error = ""
        self.pod_ips: tuple[str, ...] = ()
        self._sandbox_attempted = False
        self._host_network = bool(spec.get("hostNetwork"))
        self._token_written = False
        self._frozen = status.get("phase") in ("Succeeded", "Failed")
        """The pod finished before this worker started: its status is no longer ours to write (rule 6)."""
        self._stopped = False
        """Rule 4 stopped the containers: the phase is final."""
        self._written: dict[str, Any] = {k: status[k] for k in MANAGED_STATUS if k in status}
        self._start_time = str(status.get("startTime") or rfc3339(runtime.clock()))
        self._changed = asyncio.Event()
        self._status_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._token_task: asyncio.Task[None] | None = None
        saved = PodRecord.load(self.state_path)
        self._saved = saved if saved is not None and saved.node == s.node_name and saved.uid == self.uid else None
        self.record = (
            PodRecord(s.node_name, self.uid, self._saved.sandbox, dict(self._saved.processes))
            if self._saved is not None
            else PodRecord(s.node_name, self.uid)
        )
        """What ``runtime.json`` says; it starts as the saved one so a crash before adoption loses nothing."""
        reported = {str(cs.get("name")): cs for cs in status.get("containerStatuses") or () if isinstance(cs, dict)}
        self._reported = reported
        policy = str(spec.get("restartPolicy") or "Always")
        self.supervisors: list[ContainerSupervisor] = []
        for container in spec.get("containers") or ():
            state = ContainerState(
                str(container.get("name")),
                policy,
                RestartBackoff(s.restart_backoff_initial, s.restart_backoff_max, s.restart_backoff_reset),
            )
            before = reported.get(state.name) or {}
            state.restart_count = int(before.get("restartCount") or 0)
            last = (before.get("lastState") or {}).get("terminated")
            state.last_termination = dict(last) if isinstance(last, dict) else None
            self.supervisors.append(
                ContainerSupervisor(
                    container,
                    state,
                    self,
                    config_retry=s.config_retry,
                    clock=runtime.clock,
                    sleep=runtime.sleep,
                    spawner=runtime.spawner,
                )
            )
        self.update(pod)

    # -- paths ----------------------------------------------------------------------------------------------------
    @property
    def directory(self) -> Path:
        return self.runtime.pod_dir(self.uid)

    @property
    def state_path(self) -> Path:
        return self.directory / STATE_FILE

    @property
    def token_path(self) -> Path:
        return self.directory / "token"

    # -- from the informer ----------------------------------------------------------------------------------------
    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            self.deleting.set()

    def remove(self) -> None:
        self.removed = True
        self.deleting.set()

    # -- lifecycle ------------------------------------------------------------------------------------------------
    def start(self) -> asyncio.Task[None]:
        if self._task is None:
            name = f"pod {self.namespace}/{self.name} on {self.runtime.settings.node_name}"
            self._task = asyncio.get_running_loop().create_task(self._run(), name=name)
        return self._task

    async def shutdown(self, *, stop: bool) -> None:
        """The runtime is closing: leave the containers running (rule 6 adopts them later), or stop them."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._cancel_token_refresh()
        if stop:
            grace = self.runtime.settings.minimum_grace_seconds
            await asyncio.gather(*(sup.stop(grace) for sup in self.supervisors))
            await self._stop_unsupervised(grace)
            await self._destroy_sandbox()
            self._forget()
        else:
            await asyncio.gather(*(sup.detach() for sup in self.supervisors))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        status_task = loop.create_task(self._status_loop(), name=f"pod {self.name} status")
        life = loop.create_task(self._live(), name=f"pod {self.name} life")
        try:
            await self.deleting.wait()
            life.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await life
            await self._terminate()
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug: the pod may be left behind; the runtime carries on
            log.exception("pod %s/%s: terminating failed", self.namespace, self.name)
        finally:
            for task in (life, status_task):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _live(self) -> None:
        try:
            await self._stages()
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug: this pod stays as it is until deleted; the runtime carries on
            log.exception("pod %s/%s: worker failed", self.namespace, self.name)

    async def _stages(self) -> None:
        if self._frozen:
            if self._saved is not None and self._saved.sandbox is not None:
                self._sandbox_attempted = True
                await self._destroy_sandbox()
            return
        s = self.runtime.settings
        saved = self._saved
        if (self.pod.get("spec") or {}).get("initContainers"):
            self.event("Warning", "Failed", "init containers are not supported by the lab: they are not run")
        # rule 1
        if self._host_network:
            self.sandbox = SavedSandbox("", "", (s.node_ip,))
        elif saved is not None and saved.sandbox is not None:
            self.sandbox, self._sandbox_attempted = saved.sandbox, True
        else:
            self._save()  # before CNI ADD: a crash during it still leaves something to clean up
            self.sandbox = await self._create_sandbox()
        self.pod_ips = self.sandbox.ips
        self.record.sandbox = None if self._host_network else self.sandbox
        self._save()
        self._changed.set()
        # rule 2
        if (self.pod.get("spec") or {}).get("automountServiceAccountToken") is not False:
            lifetime = await self._ensure_token()
            self._token_task = asyncio.get_running_loop().create_task(
                self._refresh_tokens(lifetime), name=f"pod {self.name} token"
            )
        # rule 6, then rule 3
        adopted = self._adopt()
        tasks = [sup.start(adopted.get(sup.name)) for sup in self.supervisors if sup.state.phase is not Phase.EXITED]
        self._changed.set()
        if tasks:
            await asyncio.wait(tasks)
        states = [sup.state for sup in self.supervisors]
        if pod_phase(str((self.pod.get("spec") or {}).get("restartPolicy") or "Always"), states) in (
            "Succeeded",
            "Failed",
        ):
            await self._cancel_token_refresh()
            await self._destroy_sandbox()

    def _adopt(self) -> dict[str, ProcessHandle]:
        """Rule 6: the processes of a previous runtime that still run, by container name; containers that
        exited for good before it went away stay exited."""
        saved = self._saved
        adopted: dict[str, ProcessHandle] = {}
        for sup in self.supervisors if saved is not None else ():
            reported = self._reported.get(sup.name) or {}
            state = reported.get("state") or {}
            entry = saved.processes.get(sup.name) if saved is not None else None
            handle = find_process(*entry) if entry is not None else None
            if entry is not None and handle is not None:
                sup.state.restore(reported, entry[0])
                adopted[sup.name] = handle
                log.info("pod %s/%s: adopted %s (pid %d)", self.namespace, self.name, sup.name, entry[0])
            elif entry is not None and "running" in state:
                sup.state.restore(reported, entry[0])
                code = reap(entry[0])  # known only when this very process had started it
                sup.state.apply(Exited(code, self.runtime.clock()))
                shown = "unknown" if code is None else str(code)
                note = f"Container {sup.name} exited while the node runtime was away (exit code {shown})"
                self.event("Warning", "Failed", note)
            elif isinstance(state.get("terminated"), dict):
                sup.state.resume_exited(reported)
            if sup.name not in adopted:
                self.record.processes.pop(sup.name, None)
        if self.sandbox is not None and self.sandbox.netns_path:
            known = {handle.pid for handle in adopted.values()}
            for pid in pids_in_netns(self.sandbox.netns_path):
                if pid not in known:
                    log.warning("pod %s/%s: killing stray pid %d in its namespace", self.namespace, self.name, pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        self._save()
        return adopted

    async def _terminate(self) -> None:
        """Rule 4."""
        grace = self._grace()
        for sup in self.supervisors:
            if sup.state.phase is Phase.RUNNING:
                self.event("Normal", "Killing", f"Stopping container {sup.name}")
        await asyncio.gather(*(sup.stop(grace) for sup in self.supervisors))
        await self._stop_unsupervised(grace)
        self._stopped = True
        await self._cancel_token_refresh()
        await self._destroy_sandbox()
        if not self.removed:
            await self._write_status()
            await self._delete_from_api()
        self._forget()

    def _grace(self) -> float:
        meta, spec = self.pod.get("metadata") or {}, self.pod.get("spec") or {}
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds")
        value = float(grace) if isinstance(grace, int | float) else 30.0
        return max(value, self.runtime.settings.minimum_grace_seconds)

    async def _stop_unsupervised(self, grace: float) -> None:
        """Processes of a previous runtime that were never adopted (deletion came first)."""
        entries = set(self.record.processes.values())
        if self._saved is not None:
            entries |= set(self._saved.processes.values())
        for pid, ticks in entries:
            handle = find_process(pid, ticks)
            if handle is not None:
                await stop_process(handle, grace)

    async def _delete_from_api(self) -> None:
        s = self.runtime.settings
        delay = s.sandbox_backoff_initial
        while not self.removed:
            try:
                await self.runtime.client.delete(kinds.PODS, self.name, self.namespace, grace_period_seconds=0)
                return
            except KubeNotFoundError:
                return
            except KubeClientError as exc:
                log.warning("pod %s/%s: delete failed (retrying in %.0fs): %s", self.namespace, self.name, delay, exc)
                await self.runtime.sleep(delay)
                delay = min(delay * 2, s.sandbox_backoff_max)

    def _forget(self) -> None:
        for path in (self.state_path, self.token_path):
            with contextlib.suppress(OSError):
                path.unlink()

    def _save(self) -> None:
        try:
            self.record.save(self.state_path)
        except OSError as exc:
            log.error("pod %s/%s: cannot write %s: %s", self.namespace, self.name, self.state_path, exc)

    # -- the sandbox (rule 1) -------------------------------------------------------------------------------------
    async def _create_sandbox(self) -> SavedSandbox:
        s = self.runtime.settings
        delay = s.sandbox_backoff_initial
        while True:
            self._sandbox_attempted = True
            try:
                made = await self.runtime.sandboxes.create(self.pod)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                message = sandbox_error_message(exc)
                log.warning(
                    "pod %s/%s: sandbox: %s (retrying in %gs)",
                    self.namespace,
                    self.name,
                    message,
                    delay,
                    exc_info=not isinstance(exc, CniError),
                )
                self.sandbox_error = message
                self.event("Warning", "FailedCreatePodSandBox", f"Failed to create pod sandbox: {message}")
                self._changed.set()
                await self.runtime.sleep(delay)
                delay = min(delay * 2, s.sandbox_backoff_max)
                continue
            self.sandbox_error = ""
            return SavedSandbox(str(made.netns), str(made.netns_path), tuple(str(ip) for ip in made.ips))

    async def _destroy_sandbox(self) -> None:
        if not self._sandbox_attempted:
            if self.sandbox is not None:  # the node's namespace (hostNetwork): nothing to destroy
                self.sandbox = None
                self._changed.set()
            return
        s = self.runtime.settings
        delay = s.sandbox_backoff_initial
        for attempt in range(3):
            try:
                await self.runtime.sandboxes.destroy(self.uid)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                message = sandbox_error_message(exc)
                self.event("Warning", "FailedKillPod", f"error killing pod: failed to destroy its sandbox: {message}")
                if attempt < 2:
                    await self.runtime.sleep(delay)
                    delay = min(delay * 2, s.sandbox_backoff_max)
        self.sandbox, self._sandbox_attempted, self.record.sandbox = None, False, None
        self._save()
        self._changed.set()

    # -- the service-account token (rule 2) -----------------------------------------------------------------------
    async def _ensure_token(self) -> float:
        s = self.runtime.settings
        delay = s.sandbox_backoff_initial
        while True:
            try:
                return await self._write_token()
            except (KubeClientError, OSError, KeyError, TypeError) as exc:
                note = f'MountVolume.SetUp failed for volume "kube-api-access" : {exc}'
                self.event("Warning", "FailedMount", note)
                await self.runtime.sleep(delay)
                delay = min(delay * 2, s.sandbox_backoff_max)

    async def _write_token(self) -> float:
        """Write a fresh token; its lifetime in seconds."""
        s = self.runtime.settings
        account = str((self.pod.get("spec") or {}).get("serviceAccountName") or "default")
        answer = await self.runtime.client.create_token(
            self.namespace, account, (), expiration_seconds=s.token_expiration_seconds, bound_pod=self.pod
        )
        status = answer["status"]
        expires = parse_rfc3339(status.get("expirationTimestamp"))
        now = self.runtime.clock()
        lifetime = expires - now if expires is not None and expires > now else float(s.token_expiration_seconds)
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.token_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(str(status["token"]))
        os.chmod(tmp, 0o600)
        tmp.replace(self.token_path)
        self._token_written = True
        return lifetime

    async def _refresh_tokens(self, lifetime: float) -> None:
        while True:
            await self.runtime.sleep(max(1.0, lifetime * self.runtime.settings.token_refresh_fraction))
            lifetime = await self._ensure_token()

    async def _cancel_token_refresh(self) -> None:
        task, self._token_task = self._token_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- status (rule 5) ------------------------------------------------------------------------------------------
    async def _status_loop(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            await self._write_status()

    async def _write_status(self) -> None:
        async with self._status_lock:
            if self.removed or self._frozen:
                return
            spec = self.pod.get("spec") or {}
            view = PodView(
                restart_policy=str(spec.get("restartPolicy") or "Always"),
                containers=[(sup.state, str(sup.spec.get("image") or "")) for sup in self.supervisors],
                pod_ref=f"{self.name}_{self.namespace}({self.uid})",
                host_ip=self.runtime.settings.node_ip,
                pod_ips=self.pod_ips,
                sandbox_ready=self.sandbox is not None,
                sandbox_error=self.sandbox_error,
                start_time=self._start_time,
                deleted=self._stopped,
            )
            status = pod_status(view, self._written, self.runtime.clock())
            patch = status_patch(self._written, status)
            if patch is None:
                return
            patch["metadata"] = {"uid": self.uid}  # a precondition: never write to a successor of the same name
            try:
                await self.runtime.client.patch_status(kinds.PODS, self.name, patch, self.namespace)
            except KubeNotFoundError:
                return
            except KubeClientError as exc:
                log.warning("pod %s/%s: status update failed: %s", self.namespace, self.name, exc)
                asyncio.get_running_loop().call_later(1.0, self._changed.set)
                return
            self._written = status

    # -- container hooks ------------------------------------------------------------------------------------------
    def event(self, type: EventType, reason: str, note: str) -> None:
        self.runtime.event(self.pod, type, reason, note)

    def changed(self) -> None:
        self._changed.set()

    async def spawned(self, name: str, handle: ProcessHandle) -> None:
        await self.runtime.note_process(handle, f"container {self.namespace}/{self.name}/{name}")
        self.record.processes[name] = (handle.pid, handle.start_ticks)
        self._save()

    async def prepare(self, container: Mapping[str, Any]) -> LaunchSpec:
        name = str(container.get("name"))
        command = container.get("command")
        if not command:
            raise ContainerConfigError(
                f'container "{name}" has no command: the lab runs commands from this machine\'s filesystem, '
                f"not images (image {container.get('image')!r} is not run)",
                retry=False,
            )
        s = self.runtime.settings
        configs = await self._fetch_configs(config_refs(container))
        env = container_env(self.pod, container, self._base_env(), configs, self.pod_ips, s.node_ip)
        argv = container_argv(
            self.sandbox.netns if self.sandbox is not None else "",
            [expand(str(part), env) for part in command],
            [expand(str(part), env) for part in container.get("args") or ()],
            str(container.get("workingDir") or ""),
        )
        self.directory.mkdir(parents=True, exist_ok=True)
        netns = self.sandbox.netns if self.sandbox is not None else ""
        target = ProbeTarget(self.pod_ips[0] if self.pod_ips else "", netns, env)
        return LaunchSpec(tuple(argv), env, self.directory / f"{name}.log", target, self._grace())

    def _base_env(self) -> dict[str, str]:
        s = self.runtime.settings
        account = str((self.pod.get("spec") or {}).get("serviceAccountName") or "default")
        env = {
            "PATH": s.container_path,
            "HOSTNAME": self.name,
            "KUBERNETES_SERVICE_HOST": s.api_host,
            "KUBERNETES_SERVICE_PORT": str(s.api_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(s.api_port),
            "KUBERNETES_PORT": f"tcp://{s.api_host}:{s.api_port}",
            "POD_NAME": self.name,
            "POD_NAMESPACE": self.namespace,
            "POD_IP": self.pod_ips[0] if self.pod_ips else "",
            "NODE_NAME": s.node_name,
            "SERVICE_ACCOUNT": account,
        }
        if self._token_written:
            env["AMBIT_TOKEN_FILE"] = str(self.token_path)
        return env

    async def _fetch_configs(self, refs: set[ConfigKey]) -> dict[ConfigKey, Mapping[str, str] | None]:
        found: dict[ConfigKey, Mapping[str, str] | None] = {}
        for kind, name in sorted(refs):
            resource = kinds.CONFIG_MAPS if kind == "configmap" else kinds.SECRETS
            try:
                obj = await self.runtime.client.get(resource, name, self.namespace)
            except KubeNotFoundError:
                found[(kind, name)] = None
                continue
            except KubeClientError as exc:
                raise ContainerConfigError(f'reading {kind} "{name}": {exc}', retry=True) from None
            data = obj.get("data") or {}
            if kind == "secret":
                decoded = {}
                for key, value in data.items():
                    with contextlib.suppress(binascii.Error, ValueError):
                        decoded[str(key)] = base64.b64decode(str(value)).decode("utf-8", "replace")
                found[(kind, name)] = decoded
            else:
                found[(kind, name)] = {str(k): str(v) for k, v in data.items()}
        return found


class NodeRuntime:
    """The kubelet of one node: ``await start()``, then ``await aclose()`` (containers keep running unless
    ``stop_pods``, as a kubelet's containers outlive it)."""

    def __init__(
        self,
        client: KubeClient,
        settings: NodeRuntimeSettings,
        sandboxes: SandboxManager,
        record: ProcessRecord,
        *,
        events: EventRecorder | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        spawner: Callable[[Sequence[str], Mapping[str, str], Path], ProcessHandle] = spawn,
        host: HostInfo | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.sandboxes = sandboxes
        self.record = record
        self.clock = clock
        self.sleep = sleep
        self.spawner = spawner
        self.host = host or HostInfo.read()
        self._own_events = events is None
        self.events = events or EventRecorder(
            client, EventRecorderSettings(reporting_controller="kubelet", reporting_instance=settings.node_name)
        )
        self.informer = Informer(
            client,
            kinds.PODS,
            field_selector=f"spec.nodeName={settings.node_name}",
            on_add=self._pod_seen,
            on_update=lambda _old, new: self._pod_seen(new),
            on_delete=self._pod_gone,
            settings=settings.informer,
        )
        self.workers: dict[str, PodWorker] = {}
        """Pod uid → its worker."""
        self._finished: set[str] = set()
        """Pods whose worker deleted them, until the informer reports them gone (late updates are ignored)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self._node_uid = ""
        self._ready_since = 0.0

    # -- lifecycle --------------------------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._own_events:
            self.events.start()
        try:
            await self._register_node()
        except KubeClientError as exc:
            log.warning("node %s: registration failed (retrying): %s", self.settings.node_name, exc)
        self.events.record(self._node_ref(), "Normal", "Starting", "Starting kubelet.", "Start")
        self._tasks.append(loop.create_task(self._heartbeats(), name=f"node {self.settings.node_name} heartbeat"))
        self.informer.start()
        self._tasks.append(loop.create_task(self._collect_orphans(), name=f"node {self.settings.node_name} cleanup"))

    async def aclose(self, *, stop_pods: bool = False) -> None:
        self._closing = True
        await self.informer.aclose()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await asyncio.gather(*(worker.shutdown(stop=stop_pods) for worker in list(self.workers.values())))
        self.workers.clear()
        if self._own_events:
            await self.events.aclose()

    async def __aenter__(self) -> NodeRuntime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- pods ---------------------------------------------------------------------------------------------------
    def _pod_seen(self, pod: dict[str, Any]) -> None:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if not uid or self._closing or uid in self._finished:
            return
        worker = self.workers.get(uid)
        if worker is not None:
            worker.update(pod)
            return
        worker = PodWorker(self, pod)
        self.workers[uid] = worker
        worker.start().add_done_callback(lambda _t: self._worker_done(uid, worker))

    def _pod_gone(self, pod: dict[str, Any]) -> None:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        self._finished.discard(uid)
        worker = self.workers.get(uid)
        if worker is not None:
            worker.remove()

    def _worker_done(self, uid: str, worker: PodWorker) -> None:
        if self.workers.get(uid) is worker and not self._closing:
            del self.workers[uid]
            if not worker.removed:
                self._finished.add(uid)

    def event(self, regarding: Mapping[str, Any], type: EventType, reason: str, note: str) -> None:
        self.events.record(regarding, type, reason, note, _ACTIONS.get(reason, reason))

    def pod_dir(self, uid: str) -> Path:
        return self.settings.pods_dir / uid

    async def note_process(self, handle: ProcessHandle, what: str) -> None:
        try:
            result = self.record.note("process", pid=handle.pid, start_time=handle.start_ticks, what=what)
            if inspect.isawaitable(result):
                await result
        except Exception:  # the process runs either way; the record is best effort from here
            log.exception("recording process %d (%s) failed", handle.pid, what)

    async def _collect_orphans(self) -> None:
        """Rule 6: clean up after pods of this node that were deleted while the runtime was not running."""
        try:
            await self.informer.wait_synced()
            await self._clean_up_orphans()
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug: what was left stays for `lab down`; the runtime carries on
            log.exception("node %s: cleaning up deleted pods failed", self.settings.node_name)

    async def _clean_up_orphans(self) -> None:
        if not self.settings.pods_dir.is_dir():
            return
        for entry in sorted(self.settings.pods_dir.iterdir()):
            saved = PodRecord.load(entry / STATE_FILE)
            if saved is None or saved.node != self.settings.node_name or saved.uid in self.workers:
                continue
            log.info("node %s: cleaning up pod %s, deleted while the runtime was away", saved.node, saved.uid)
            for pid, ticks in saved.processes.values():
                handle = find_process(pid, ticks)
                if handle is not None:
                    await stop_process(handle, self.settings.minimum_grace_seconds)
            try:  # also without a saved sandbox: a crash during CNI ADD leaves no record of one
                await self.sandboxes.destroy(saved.uid)
            except Exception as exc:
                log.warning("pod %s: destroying its sandbox failed: %s", saved.uid, sandbox_error_message(exc))
                continue
            for name in (STATE_FILE, "token"):
                with contextlib.suppress(OSError):
                    (entry / name).unlink()

    # -- the node -----------------------------------------------------------------------------------------------
    def _node_ref(self) -> dict[str, Any]:
        meta = {"name": self.settings.node_name, "uid": self._node_uid} if self._node_uid else {}
        return {"apiVersion": "v1", "kind": "Node", "metadata": meta or {"name": self.settings.node_name}}

    async def _register_node(self) -> None:
        s = self.settings
        body = node_manifest(s)
        try:
            node = await self.client.create(kinds.NODES, body)
        except KubeAlreadyExistsError:
            patch = {"metadata": {"labels": body["metadata"]["labels"]}, "spec": body["spec"]}
            node = await self.client.patch(kinds.NODES, s.node_name, patch)
        self._node_uid = str(node["metadata"].get("uid") or "")
        self._ready_since = self.clock()
        for cond in (node.get("status") or {}).get("conditions") or ():
            if cond.get("type") == "Ready" and cond.get("status") == "True":
                self._ready_since = parse_rfc3339(cond.get("lastTransitionTime")) or self._ready_since
        await self._heartbeat()

    async def _heartbeat(self) -> None:
        s = self.settings
        now = self.clock()
        status = node_status(s, self.host, self._ready_since, now)
        await self.client.patch_status(kinds.NODES, s.node_name, {"status": status})
        spec = {"holderIdentity": s.node_name, "leaseDurationSeconds": s.lease_duration_seconds}
        spec["renewTime"] = micro_time(now)
        try:
            await self.client.patch(kinds.LEASES, s.node_name, {"spec": spec}, namespace=NODE_LEASE_NAMESPACE)
        except KubeNotFoundError:
            owner = {"apiVersion": "v1", "kind": "Node", "name": s.node_name, "uid": self._node_uid}
            meta: dict[str, Any] = {"name": s.node_name, "namespace": NODE_LEASE_NAMESPACE}
            if self._node_uid:
                meta["ownerReferences"] = [owner]
            await self.client.create(kinds.LEASES, {"metadata": meta, "spec": spec})

    async def _heartbeats(self) -> None:
        while True:
            await self.sleep(self.settings.heartbeat_interval)
            try:
                if not self._node_uid:
                    await self._register_node()
                else:
                    await self._heartbeat()
            except KubeNotFoundError:
                self._node_uid = ""  # the Node was deleted: register again at once
                with contextlib.suppress(KubeClientError):
                    await self._register_node()
            except KubeClientError as exc:
                log.warning("node %s: heartbeat failed: %s", self.settings.node_name, exc)


__all__ = [
    "HostInfo",
    "NodeRuntime",
    "NodeRuntimeSettings",
    "PodView",
    "PodWorker",
    "ProcessRecord",
    "SandboxInfo",
    "SandboxManager",
    "container_env",
    "pod_status",
]
