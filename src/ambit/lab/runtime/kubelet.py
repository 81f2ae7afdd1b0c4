"""The node runtime: the kubelet's role for one lab node (node registration, pods' lives, their status).

Theory of operation. :class:`NodeRuntime` registers its Node (labels, ``podCIDR``, address, a Ready condition
with a heartbeat; :mod:`ambit.lab.runtime.node_status`) and a Lease in ``kube-node-lease``, both renewed every
``heartbeat_interval``; a Node deleted behind its back is registered again. An informer watches the pods bound to
the node (``spec.nodeName=<node>``); each pod, by uid, gets one :class:`~ambit.lab.runtime.pod_worker.PodWorker`, the
only writer of that pod's status and of its files under ``<pods_dir>/<uid>/`` (its rules are in
:mod:`ambit.lab.runtime.pod_worker`). A pod whose worker deleted it gets no new worker from late updates. Pods are
network namespaces made by the :class:`SandboxManager` (CNI ADD/DEL); containers run through a
:class:`~ambit.lab.runtime.containers_apply.ContainerRuntime` (runc in the lab, :mod:`ambit.lab.runtime.oci_apply`);
readiness and liveness are probed from the node's namespace, exec probes inside the container
(:mod:`ambit.lab.runtime.probes`). After the informer's first list, the runtime cleans up the files, processes and
sandboxes of pods of this node that the API no longer has (deleted while it was not running; rule 6).
Closing the runtime leaves pods' containers running, as a kubelet's containers outlive it, unless asked to stop
them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ambit.k8s import EventRecorder, EventRecorderSettings, Informer, InformerSettings, KubeClient, kinds
from ambit.k8s.errors import KubeAlreadyExistsError, KubeClientError, KubeNotFoundError
from ambit.k8s.events import micro_time
from ambit.lab.network.topology import (
    API_PORT,
    BRIDGE_ADDRESS,
    CLUSTER_DNS_ADDRESS,
    CLUSTER_DOMAIN,
    HostPathLayout,
    Topology,
)
from ambit.lab.runtime.containers import parse_rfc3339
from ambit.lab.runtime.containers_apply import ContainerRuntime, EventType
from ambit.lab.runtime.node_status import HostInfo, node_manifest, node_status
from ambit.lab.runtime.node_taints import NodeTaint
from ambit.lab.runtime.pod_record import STATE_FILE, PodRecord
from ambit.lab.runtime.pod_status import sandbox_error_message
from ambit.lab.runtime.pod_token import forget_pod_files
from ambit.lab.runtime.pod_worker import PodWorker
from ambit.lab.runtime.processes import ProcessHandle, find_process, stop_process
from ambit.lab.runtime.seccomp import SECCOMP_DIR
from ambit.lab.runtime.userns import (
    NODE_BLOCKS,
    USERNS_FILE,
    USERNS_LENGTH,
    IdRange,
    UsernsAllocator,
    UsernsError,
    node_id_range,
    parse_saved,
    render_saved,
)

log = logging.getLogger("ambit.lab.runtime.kubelet")

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NODE_LEASE_NAMESPACE = "kube-node-lease"


# -- seams --------------------------------------------------------------------------------------------------------
class SandboxInfo(Protocol):
    @property
    def netns(self) -> str: ...
    @property
    def netns_path(self) -> str: ...
    @property
    def ips(self) -> tuple[str, ...]: ...


class SandboxManager(Protocol):
    """Pod network namespaces (``ambit.lab.runtime.sandbox.PodSandboxes``); ``create`` raises ``CniInvocationError``
    on failure."""

    async def create(self, pod: dict[str, Any], user_ids: IdRange | None = None) -> SandboxInfo: ...

    async def destroy(self, pod_uid: str) -> None: ...


class ProcessRecord(Protocol):
    """The lab's crash-safe record (``ambit.lab.cluster.record.Record``); ``note`` may be a plain or a coroutine
    method."""

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
    register_with_taints: tuple[NodeTaint, ...] = ()
    """Taints the Node is created with (kubelet's ``--register-with-taints``); never re-added to an existing Node."""
    container_path: str = DEFAULT_PATH
    """``PATH`` of containers (no image brings one)."""
    container_pythonpath: str = ""
    """``PYTHONPATH`` of containers when not empty: the directory the lab imports Ambit from, so that a pod's
    ``python3 -m ambit ...`` runs the lab's own code even when the interpreter's installed Ambit is another
    checkout's (a git worktree sharing a virtual environment)."""
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
    volume_resync_seconds: float = 10.0
    """Seconds between refreshes of a running pod's configMap, secret, downwardAPI and projected volumes."""
    host_paths: HostPathLayout | None = None
    """The node's filesystem for hostPath volumes; None: ``<pods_dir>/../nodes/<node>/root`` and the real
    ``/proc``, ``/sys``, ``/dev``, ``/run/netns``."""
    minimum_grace_seconds: float = 2.0
    """The kubelet's floor on termination grace periods (a force deletion still gets this long)."""
    informer: InformerSettings = field(default_factory=InformerSettings)
    cluster_dns: tuple[str, ...] = (CLUSTER_DNS_ADDRESS,)
    """The kubelet's ``clusterDNS``: the nameservers of ``ClusterFirst`` pods (:mod:`ambit.lab.runtime.pod_dns`)."""
    cluster_domain: str = CLUSTER_DOMAIN
    node_resolv_conf: Path = Path("/etc/resolv.conf")
    """The node's resolver configuration (the kubelet's ``--resolv-conf``): ``Default`` pods get it, read-only."""
    userns_first_id: int = USERNS_LENGTH
    """The first host id of this node's user namespaces (``hostUsers: false`` pods); the lab gives each node its
    own stretch (:func:`ambit.lab.runtime.userns.node_id_range`)."""
    userns_blocks: int = NODE_BLOCKS
    """How many pods of this node may have a user namespace at once."""
    pod_cidr6: str = ""
    """The node's IPv6 pod range in a dual-stack lab (the Node's second ``spec.podCIDRs`` entry), else ""."""
    node_ip6: str = ""
    """The node's IPv6 InternalIP in a dual-stack lab, else ""."""

    @classmethod
    def for_lab(cls, topology: Topology, node_name: str, **overrides: Any) -> NodeRuntimeSettings:
        node = topology.node_named(node_name)
        if node is None:
            raise ValueError(f"the lab has no node {node_name!r}")
        base = cls(node.name, node.address, node.pod_cidr, topology.path / "pods")
        first_id, blocks = node_id_range(node.index)
        fields = {
            "host_paths": topology.host_paths(node.name),
            "userns_first_id": first_id,
            "userns_blocks": blocks,
            "pod_cidr6": node.pod_cidr6,
            "node_ip6": node.address6,
        }
        return dataclasses.replace(base, **{**fields, **overrides})

    @property
    def host_path_layout(self) -> HostPathLayout:
        return self.host_paths or HostPathLayout(self.pods_dir.parent, self.node_name)

    @property
    def seccomp_dir(self) -> Path:
        """The kubelet's ``--seccomp-profile-root``: ``Localhost`` profiles are read below it."""
        return self.host_path_layout.root / SECCOMP_DIR


_ACTIONS = {
    "Started": "StartContainer",
    "Failed": "StartContainer",
    "BackOff": "StartContainer",
    "Unhealthy": "Probe",
    "Killing": "KillContainer",
    "FailedCreatePodSandBox": "CreatePodSandbox",
    "FailedKillPod": "KillPodSandbox",
    "FailedMount": "MountVolume",
    "DNSConfigForming": "CreatePodSandbox",
    "SuccessfulMountVolume": "MountVolume",
}


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
        containers: ContainerRuntime,
        host: HostInfo | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.sandboxes = sandboxes
        self.record = record
        self.clock = clock
        self.sleep = sleep
        self.containers = containers
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
        self.userns = UsernsAllocator(settings.userns_first_id, settings.userns_blocks)
        self._userns_loaded = False

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

    def find_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod of this node named ``namespace/name``, as its worker last saw it (the kubelet API's lookup)."""
        for worker in self.workers.values():
            meta = worker.pod.get("metadata") or {}
            if meta.get("namespace") == namespace and meta.get("name") == name and not worker.removed:
                return worker.pod
        return None

    def container_log(self, uid: str, container: str) -> Path:
        """The file a pod's container writes its output to."""
        return self.pod_dir(uid) / f"{container}.log"

    def user_namespace(self, uid: str) -> IdRange:
        """The pod's user namespace ids: allocated at first use and saved in its directory (``userns.json``), taken
        back from there after a restart; :class:`UsernsError` when the node has none free."""
        self._load_user_namespaces()
        ids = self.userns.find(uid)
        if ids is None:
            ids = self.userns.allocate(uid)
            directory = self.pod_dir(uid)
            directory.mkdir(parents=True, exist_ok=True)
            tmp = directory / f".{USERNS_FILE}.tmp"
            tmp.write_text(render_saved(ids))
            tmp.replace(directory / USERNS_FILE)
        return ids

    def release_user_namespace(self, uid: str) -> None:
        self.userns.release(uid)

    def _load_user_namespaces(self) -> None:
        if self._userns_loaded or not self.settings.pods_dir.is_dir():
            return
        self._userns_loaded = True
        for entry in sorted(self.settings.pods_dir.iterdir()):
            saved = entry / USERNS_FILE
            try:
                self.userns.restore(entry.name, parse_saved(saved.read_text()))
            except FileNotFoundError:
                continue
            except (OSError, UsernsError) as exc:
                log.warning("pod %s: its saved user namespace is not used: %s", entry.name, exc)

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
            await self.containers.remove_pod(saved.uid)
            try:  # also without a saved sandbox: a crash during CNI ADD leaves no record of one
                await self.sandboxes.destroy(saved.uid)
            except Exception as exc:
                log.warning("pod %s: destroying its sandbox failed: %s", saved.uid, sandbox_error_message(exc))
                continue
            forget_pod_files(entry)
            self.release_user_namespace(saved.uid)

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
            # The taints were for the Node's first moment: whoever removed them since meant it.
            spec = {k: v for k, v in body["spec"].items() if k != "taints"}
            patch = {"metadata": {"labels": body["metadata"]["labels"]}, "spec": spec}
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
    "NodeRuntime",
    "NodeRuntimeSettings",
    "ProcessRecord",
    "SandboxInfo",
    "SandboxManager",
]
