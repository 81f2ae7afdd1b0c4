"""One pod's life on its node: the :class:`PodWorker`, the only writer of that pod's status and of its files under
``<pods_dir>/<uid>/``.

Theory of operation. The node runtime (:class:`ambit.lab.runtime.kubelet.NodeRuntime`) gives each pod bound to its node,
by uid, one worker, which sees the runtime only through :class:`PodHost`. Pods are network namespaces made by the
runtime's sandbox manager (CNI ADD/DEL); containers are processes run by one
:class:`~ambit.lab.runtime.containers_apply.ContainerSupervisor` each, with the worker as their hooks (environment,
recording of processes, Events, status changes).

Stages of a pod worker (rules, in the order they apply):

Rule 1. SANDBOX: create the sandbox. A failure leaves the pod Pending with ``PodReadyToStartContainers`` and
        ``ContainersReady`` false carrying the error, records a Warning ``FailedCreatePodSandBox`` Event and tries
        again after a back-off (``sandbox_backoff_initial`` doubling to ``sandbox_backoff_max``). A pod with
        ``hostNetwork`` gets no sandbox: it runs in the node's namespace with the node's address.
Rule 2. TOKEN: unless ``automountServiceAccountToken`` is false, write a service-account token bound to the pod to
        ``<pods_dir>/<uid>/token`` (0600) before any container starts, and refresh it at ``token_refresh_fraction``
        of its lifetime. Failures retry like rule 1 (Warning ``FailedMount``).
Rule 2b. VOLUMES: the pod's volumes (:mod:`ambit.lab.runtime.volumes_apply`) are set up before any container
        starts; a failure is a Warning ``FailedMount`` with the kubelet's text, the containers stay
        ``ContainerCreating`` and it is tried again after a back-off; a volume that can never work (an
        unsupported type) is reported once and the pod stays. While the pod runs, its volumes are refreshed every
        ``volume_resync_seconds`` (or sooner when a token is due). Each container binds the volumes its
        ``volumeMounts`` name.
Rule 2c. DNS: before each container starts in its own mount namespace, the pod's resolv.conf is formed
        (:mod:`ambit.lab.runtime.pod_dns`), written to ``<pods_dir>/<uid>/resolv.conf`` and bound read-only at
        ``/etc/resolv.conf``. A ``dnsPolicy``/``dnsConfig`` that cannot be used keeps the container from starting
        with a Warning ``Failed`` Event naming the field; omitted excess is a Warning ``DNSConfigForming``.
Rule 2d. INIT: then each of ``spec.initContainers`` runs in order, one at a time, to completion (exit code 0),
        prepared as app containers are but with no probes or lifecycle hooks; one that fails is restarted with the
        back-off unless the pod's ``restartPolicy`` is Never, which fails the pod. No app container starts before
        they all completed; the pod is Pending, ``Initialized`` false naming the incomplete ones, meanwhile.
        Rule 4 stops a running init container as any other, and nothing further starts. A native sidecar (an init
        container with ``restartPolicy: Always``) keeps its probes and hooks: once it is started (its startup
        probe passed) the next one starts; it runs beside the app containers, restarted whenever it exits, and is
        stopped after them (in reverse order) when they have all exited for good or the pod is deleted.
Rule 3. RUNNING: one supervisor per container starts, restarts and probes it (its own rules are in
        :mod:`ambit.lab.runtime.containers_apply`). When every container has exited for good the pod is Succeeded or
        Failed and its sandbox is destroyed; the worker then only waits for the pod's deletion.
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
        Succeeded or Failed is never started again. The record also says whether the init containers all
        completed (so are the reported app containers that ran); such a pod's init containers never run again.
        An init container found running is adopted as any container and the sequence goes on from it. After the
        first list, files of pods of this node that the API no longer has are cleaned up (processes stopped,
        sandbox destroyed) by the node runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ambit.k8s import kinds
from ambit.k8s.errors import KubeClientError, KubeNotFoundError
from ambit.lab.network.plugins import CniInvocationError
from ambit.lab.runtime.containers import (
    ContainerState,
    Exited,
    Phase,
    crash_loop_backoff,
    init_restart_policy,
    is_sidecar,
    parse_rfc3339,
    pod_phase,
    rfc3339,
)
from ambit.lab.runtime.containers_apply import (
    ContainerConfigError,
    ContainerRuntime,
    ContainerSupervisor,
    EventType,
    LaunchSpec,
)
from ambit.lab.runtime.node_view import view_mounts
from ambit.lab.runtime.oci_apply import read_seccomp_profile
from ambit.lab.runtime.oci_spec import (
    SERVICE_ACCOUNT_DIR,
    ProcessSpec,
    SecurityContextError,
    VolumeMount,
    container_config,
    container_id,
    security_view,
)
from ambit.lab.runtime.pod_dns import ClusterDns, DnsConfigError, PodDns, parse_resolv_conf, pod_dns
from ambit.lab.runtime.pod_env import config_refs, container_env, expand, fetch_configs
from ambit.lab.runtime.pod_record import STATE_FILE, PodRecord, SavedSandbox
from ambit.lab.runtime.pod_status import MANAGED_STATUS, PodView, pod_status, sandbox_error_message, status_patch
from ambit.lab.runtime.pod_userns import fd_path, open_owner
from ambit.lab.runtime.probes import ProbeTarget
from ambit.lab.runtime.processes import ProcessHandle, container_argv, find_process, pids_in_netns, reap, stop_process
from ambit.lab.runtime.seccomp import LOCALHOST, SeccompFieldError, SeccompProfileError, seccomp_choice
from ambit.lab.runtime.userns import USERNS_FILE, IdRange, UsernsError, hosts_users
from ambit.lab.runtime.volumes import EmptyDirVolume, VolumeError, container_mounts
from ambit.lab.runtime.volumes_apply import PodVolumes, mount_point_dirs, remove_volumes, resolve_mounts

ROOT_CA_CONFIG_MAP = "kube-root-ca.crt"

if TYPE_CHECKING:
    from ambit.k8s import KubeClient
    from ambit.lab.runtime.kubelet import NodeRuntimeSettings, SandboxManager
    from ambit.lab.runtime.node_status import HostInfo

RESOLV_CONF = "/etc/resolv.conf"
_NOT_FOR_INIT = frozenset({"startupProbe", "readinessProbe", "livenessProbe", "lifecycle"})
log = logging.getLogger("ambit.lab.runtime.kubelet")


class PodHost(Protocol):
    """What a pod worker uses of its node runtime (:class:`ambit.lab.runtime.kubelet.NodeRuntime` is the one)."""

    @property
    def settings(self) -> NodeRuntimeSettings: ...
    @property
    def client(self) -> KubeClient: ...
    @property
    def sandboxes(self) -> SandboxManager: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def sleep(self) -> Callable[[float], Awaitable[None]]: ...
    @property
    def containers(self) -> ContainerRuntime: ...
    @property
    def host(self) -> HostInfo: ...

    def event(self, regarding: Mapping[str, Any], type: EventType, reason: str, note: str) -> None:
        """Record a Kubernetes Event about ``regarding``."""
        ...

    def pod_dir(self, uid: str) -> Path:
        """The directory of the pod's files."""
        ...

    def user_namespace(self, uid: str) -> IdRange:
        """The pod's user namespace ids (``hostUsers: false``); raises :class:`UsernsError`."""
        ...

    def release_user_namespace(self, uid: str) -> None:
        """The pod is gone: its ids may go to another pod."""
        ...

    async def note_process(self, handle: ProcessHandle, what: str) -> None:
        """Note a started process in the lab's record (best effort)."""
        ...


class PodWorker:
    """One pod's life on this node (rules 1 to 6 of the module docstring); the hooks of its containers."""

    def __init__(self, runtime: PodHost, pod: dict[str, Any]) -> None:
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
        self._volume_task: asyncio.Task[None] | None = None
        self._userns_fd: int | None = None
        """The pod's user namespace (owning its network namespace), held open for runc to join by path."""
        self.volumes = PodVolumes(
            runtime.client,
            pod,
            self.directory,
            s.host_path_layout,
            allocatable={"cpu": str(runtime.host.cpus), "memory": f"{runtime.host.memory_kib}Ki"},
            token_refresh_fraction=s.token_refresh_fraction,
            clock=runtime.clock,
        )
        saved = PodRecord.load(self.state_path)
        self._saved = saved if saved is not None and saved.node == s.node_name and saved.uid == self.uid else None
        self.record = (
            PodRecord(s.node_name, self.uid, self._saved.sandbox, dict(self._saved.processes), self._saved.initialized)
            if self._saved is not None
            else PodRecord(s.node_name, self.uid)
        )
        """What ``runtime.json`` says; it starts as the saved one so a crash before adoption loses nothing."""
        self._reported = {
            str(cs.get("name")): cs
            for key in ("initContainerStatuses", "containerStatuses")
            for cs in status.get(key) or ()
            if isinstance(cs, dict)
        }
        policy = str(spec.get("restartPolicy") or "Always")
        self.init_supervisors = [
            self._supervisor(c, "Always")
            if c.get("restartPolicy") == "Always"  # a native sidecar (rule 2d)
            # Kubernetes forbids probes and lifecycle hooks on plain init containers: whatever an unvalidated
            # manifest says, none run (rule 2d).
            else self._supervisor({k: v for k, v in c.items() if k not in _NOT_FOR_INIT}, init_restart_policy(policy))
            for c in spec.get("initContainers") or ()
            if isinstance(c, dict)
        ]
        self._progress = asyncio.Event()
        """Set at each change of a container's state (a sidecar's start is waited for with it)."""
        self.supervisors = [self._supervisor(c, policy) for c in spec.get("containers") or () if isinstance(c, dict)]
        ran = any(
            "running" in (cs.get("state") or {}) or "terminated" in (cs.get("state") or {})
            for cs in status.get("containerStatuses") or ()
            if isinstance(cs, dict)
        )
        self.record.initialized = self.record.initialized or ran or not self.init_supervisors
        self.update(pod)

    def _supervisor(self, container: dict[str, Any], policy: str) -> ContainerSupervisor:
        s = self.runtime.settings
        state = ContainerState(
            str(container.get("name")),
            policy,
            crash_loop_backoff(s.restart_backoff_initial, s.restart_backoff_max, s.restart_backoff_reset),
        )
        before = self._reported.get(state.name) or {}
        state.restart_count = int(before.get("restartCount") or 0)
        last = (before.get("lastState") or {}).get("terminated")
        state.last_termination = dict(last) if isinstance(last, dict) else None
        return ContainerSupervisor(
            container,
            state,
            self,
            config_retry=s.config_retry,
            clock=self.runtime.clock,
            sleep=self.runtime.sleep,
            runtime=self.runtime.containers,
            container_id=container_id(self.uid, state.name),
        )

    @property
    def all_supervisors(self) -> list[ContainerSupervisor]:
        return [*self.init_supervisors, *self.supervisors]

    @property
    def sidecars(self) -> list[ContainerSupervisor]:
        return [sup for sup in self.init_supervisors if is_sidecar(sup.state)]

    # -- paths ----------------------------------------------------------------------------------------------------
    @property
    def directory(self) -> Path:
        return self.runtime.pod_dir(self.uid)

    @property
    def state_path(self) -> Path:
        return self.directory / STATE_FILE

    @property
    def service_account_dir(self) -> Path:
        """``token``, ``ca.crt`` and ``namespace``: bound at ``/var/run/secrets/kubernetes.io/serviceaccount``."""
        return self.directory / "serviceaccount"

    @property
    def token_path(self) -> Path:
        return self.service_account_dir / "token"

    # -- from the informer ----------------------------------------------------------------------------------------
    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        self.volumes.update(pod)
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
            await asyncio.gather(*(sup.stop(grace) for sup in self.all_supervisors))
            await self._stop_unsupervised(grace)
            await self._destroy_sandbox()
            self._forget()
        else:
            await asyncio.gather(*(sup.detach() for sup in self.all_supervisors))
            self._close_user_namespace()

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
        # rule 2b
        await self._ensure_volumes()
        self._volume_task = asyncio.get_running_loop().create_task(
            self._resync_volumes(), name=f"pod {self.name} volumes"
        )
        # rule 6, then rules 2d and 3
        adopted = self._adopt()
        if not self.record.initialized and not await self._initialize(adopted):
            if pod_phase(self._policy, [], [sup.state for sup in self.init_supervisors]) == "Failed":
                await self._cancel_token_refresh()
                await self._destroy_sandbox()
            return
        for sup in self.sidecars:  # already running unless adopted (rule 6)
            if sup.state.phase is not Phase.EXITED:
                sup.start(adopted.get(sup.name))
        tasks = [sup.start(adopted.get(sup.name)) for sup in self.supervisors if sup.state.phase is not Phase.EXITED]
        self._changed.set()
        if tasks:
            await asyncio.wait(tasks)
        states = [sup.state for sup in self.supervisors]
        if pod_phase(self._policy, states) in ("Succeeded", "Failed"):
            await self._stop_sidecars(self._grace())
            await self._cancel_token_refresh()
            await self._destroy_sandbox()

    @property
    def _policy(self) -> str:
        return str((self.pod.get("spec") or {}).get("restartPolicy") or "Always")

    async def _initialize(self, adopted: Mapping[str, ProcessHandle]) -> bool:
        """Rule 2d: run the init containers in order, each to completion; False when one will not complete (the
        pod failed, or it cannot be started as specified)."""
        for sup in self.init_supervisors:
            if is_sidecar(sup.state):
                if not await self._sidecar_started(sup, adopted.get(sup.name)):
                    return False
                continue
            if sup.state.phase is not Phase.EXITED:
                # Not awaited directly: cancelling this stage (rule 4) must leave the container to sup.stop().
                await asyncio.wait([sup.start(adopted.get(sup.name))])
            if not sup.state.completed:
                return False
        self.record.initialized = True
        self._save()
        self._changed.set()
        return True

    async def _sidecar_started(self, sup: ContainerSupervisor, adopt: ProcessHandle | None) -> bool:
        """Start a sidecar and wait until it is started (rule 9); False when its supervisor gave up first."""
        task = sup.start(adopt)
        while not sup.state.started:
            if task.done():
                return False
            self._progress.clear()
            progress = asyncio.ensure_future(self._progress.wait())
            try:
                await asyncio.wait([task, progress], return_when=asyncio.FIRST_COMPLETED)
            finally:
                progress.cancel()
        return True

    async def _stop_sidecars(self, grace: float) -> None:
        """Sidecars stop after the app containers, the last started first (rule 2d)."""
        for sup in reversed(self.sidecars):
            if sup.state.phase is Phase.RUNNING:
                self.event("Normal", "Killing", f"Stopping container {sup.name}")
            await sup.stop(grace)

    def _adopt(self) -> dict[str, ProcessHandle]:
        """Rule 6: the processes of a previous runtime that still run, by container name; containers that
        exited for good before it went away stay exited."""
        saved = self._saved
        adopted: dict[str, ProcessHandle] = {}
        for sup in self.all_supervisors if saved is not None else ():
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
        for sup in self.init_supervisors if self.record.initialized else ():
            if sup.state.phase is not Phase.EXITED and not is_sidecar(sup.state):
                sup.state.assume_completed()
        if self.sandbox is not None and self.sandbox.netns_path:
            known: set[int] = set()
            for sup in self.all_supervisors:
                if sup.name in adopted:
                    known |= self.runtime.containers.members(sup.container_id, adopted[sup.name])
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
        began = time.monotonic()
        log.info("pod %s/%s: terminating (grace %.0fs)", self.namespace, self.name, grace)
        first = [*(sup for sup in self.init_supervisors if not is_sidecar(sup.state)), *self.supervisors]
        for sup in first:
            if sup.state.phase is Phase.RUNNING:
                self.event("Normal", "Killing", f"Stopping container {sup.name}")
        await asyncio.gather(*(sup.stop(grace) for sup in first))
        minimum = self.runtime.settings.minimum_grace_seconds
        await self._stop_sidecars(max(grace - (time.monotonic() - began), minimum))
        await self._stop_unsupervised(grace)
        log.info("pod %s/%s: containers stopped in %.1fs", self.namespace, self.name, time.monotonic() - began)
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
        await self.runtime.containers.remove_pod(self.uid)

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
        self._close_user_namespace()
        forget_pod_files(self.directory)
        self.runtime.release_user_namespace(self.uid)

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
                user_ids = None if hosts_users(self.pod) else self.runtime.user_namespace(self.uid)
                made = await self.runtime.sandboxes.create(self.pod, user_ids)
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
                    exc_info=not isinstance(exc, CniInvocationError),
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
        self._close_user_namespace()
        self._save()
        self._changed.set()

    def _user_namespace_path(self) -> str:
        """The pod's user namespace, for runc to join; empty when the host's owns its network namespace."""
        if self._userns_fd is None:
            netns_path = self.sandbox.netns_path if self.sandbox is not None else ""
            if not netns_path:
                return ""
            try:
                self._userns_fd = open_owner(netns_path)
            except OSError as exc:
                raise ContainerConfigError(
                    f"cannot open the pod's user namespace: {exc.strerror}", retry=True
                ) from None
            if self._userns_fd is None:
                return ""
        return fd_path(self._userns_fd)

    def _close_user_namespace(self) -> None:
        fd, self._userns_fd = self._userns_fd, None
        if fd is not None:
            os.close(fd)

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
        ca = await self._root_ca()
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)  # the host side: only the runtime reads a pod's files
        self.service_account_dir.mkdir(mode=0o755, exist_ok=True)
        # 0644, as the kubelet's projected volume: the container may run as any user; only this pod sees them.
        files = {"token": str(status["token"]), "namespace": self.namespace}
        if ca is not None:
            files["ca.crt"] = ca
        for name, text in files.items():
            _write_file(self.service_account_dir / name, text, 0o644)
        self._token_written = True
        return lifetime

    async def _root_ca(self) -> str | None:
        """The cluster's CA bundle, from the ``kube-root-ca.crt`` ConfigMap of the pod's namespace."""
        try:
            cm = await self.runtime.client.get(kinds.CONFIG_MAPS, ROOT_CA_CONFIG_MAP, self.namespace)
        except KubeNotFoundError:
            return None
        value = (cm.get("data") or {}).get("ca.crt")
        return value if isinstance(value, str) else None

    async def _refresh_tokens(self, lifetime: float) -> None:
        while True:
            await self.runtime.sleep(max(1.0, lifetime * self.runtime.settings.token_refresh_fraction))
            lifetime = await self._ensure_token()

    async def _cancel_token_refresh(self) -> None:
        """Also the volumes' refresh (rule 2b)."""
        tasks = (self._token_task, self._volume_task)
        self._token_task = self._volume_task = None
        for task in tasks:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    # -- volumes (rule 2b) ----------------------------------------------------------------------------------------
    async def _ensure_volumes(self) -> None:
        s = self.runtime.settings
        delay = s.sandbox_backoff_initial
        while True:
            try:
                await self.volumes.set_up()
                return
            except VolumeError as exc:
                self.event("Warning", "FailedMount", str(exc))
                if not exc.retry:
                    await asyncio.Event().wait()  # until the pod is deleted (rule 4 cancels this)
            await self.runtime.sleep(delay)
            delay = min(delay * 2, s.sandbox_backoff_max)

    async def _resync_volumes(self) -> None:
        s = self.runtime.settings
        while True:
            wait = s.volume_resync_seconds
            due = self.volumes.next_refresh()
            if due is not None:
                wait = max(1.0, min(wait, due - self.runtime.clock()))
            await self.runtime.sleep(wait)
            try:
                await self.volumes.resync()
            except VolumeError as exc:
                self.event("Warning", "FailedMount", str(exc))

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
                init_containers=[(sup.state, str(sup.spec.get("image") or "")) for sup in self.init_supervisors],
                initialized=self.record.initialized,
                pod_ref=f"{self.name}_{self.namespace}({self.uid})",
                host_ip=self.runtime.settings.node_ip,
                host_ip6=self.runtime.settings.node_ip6,
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
        self._progress.set()

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
        configs = await fetch_configs(self.runtime.client, self.namespace, config_refs(container))
        env = container_env(self.pod, container, self._base_env(), configs, self.pod_ips, s.node_ip)
        command_line = [expand(str(part), env) for part in command]
        args = [expand(str(part), env) for part in container.get("args") or ()]
        working_dir = str(container.get("workingDir") or "")
        netns = self.sandbox.netns if self.sandbox is not None else ""
        self.directory.mkdir(parents=True, exist_ok=True)
        log_path = self.directory / f"{name}.log"
        containers = self.runtime.containers
        cid = container_id(self.uid, name)
        if not containers.sandboxed:
            if not hosts_users(self.pod):
                raise ContainerConfigError("hostUsers: false needs a sandboxing container runtime (runc)", retry=False)
            argv = container_argv(netns, command_line, args, working_dir)
            target = ProbeTarget(self.pod_ips[0] if self.pod_ips else "", netns, env)
            return LaunchSpec(tuple(argv), env, log_path, target, self._grace(), cid)
        netns_path = self.sandbox.netns_path if self.sandbox is not None else ""
        try:
            privileged = security_view(self.pod, container).privileged
            plans = container_mounts(
                container, self.volumes.sources, privileged=privileged, expand=lambda text: expand(text, env)
            )
            paths = containers.bundle_paths(cid, netns_path, self.service_account_dir)
            mounts = view_mounts(resolve_mounts(plans), self.volumes.node_view, paths.masked)
            if all(m.destination != RESOLV_CONF for m in mounts):  # a volume there is the pod's own choice
                mounts = (*mounts, self._write_resolv_conf())
            rebuilt = mount_point_dirs([m.destination for m in mounts])
            user_namespace = self._user_namespace()
            profile = seccomp_choice(self.pod, container, privileged=privileged)
            localhost = read_seccomp_profile(s.seccomp_dir, profile.localhost) if profile.type == LOCALHOST else None
            paths = dataclasses.replace(
                paths,
                volume_mounts=mounts,
                mount_point_dirs=rebuilt,
                seccomp_localhost=localhost,
                user_namespace=user_namespace,
                user_namespace_path=self._user_namespace_path() if user_namespace is not None else "",
            )
            config = container_config(self.pod, container, ProcessSpec((*command_line, *args), env, working_dir), paths)
        except SeccompProfileError as exc:  # the file may yet appear: the runtime's error, tried again
            raise ContainerConfigError(str(exc), retry=True, reason=exc.reason) from None
        except UsernsError as exc:  # a pod may yet free a range
            raise ContainerConfigError(str(exc), retry=True) from None
        except (SecurityContextError, SeccompFieldError, VolumeError, DnsConfigError) as exc:
            retry = isinstance(exc, VolumeError) and exc.retry
            raise ContainerConfigError(str(exc), retry=retry) from None
        target = ProbeTarget(self.pod_ips[0] if self.pod_ips else "", "", env, containers.exec_prefix(cid))
        return LaunchSpec((*command_line, *args), env, log_path, target, self._grace(), cid, config)

    def _user_namespace(self) -> IdRange | None:
        """The pod's ids when it has a user namespace; its emptyDirs then belong to its root (host ids keep their
        owners without idmapped mounts, and an emptyDir is the pod's to write)."""
        if hosts_users(self.pod):
            return None
        ids = self.runtime.user_namespace(self.uid)
        for volume in self.volumes.volumes:
            source = self.volumes.sources.get(volume.name)
            if isinstance(volume, EmptyDirVolume) and source is not None:
                info = os.stat(source.path)
                if (info.st_uid, info.st_gid) != (ids.first, ids.first):
                    os.chown(source.path, ids.first, ids.first)
        return ids

    def _write_resolv_conf(self) -> VolumeMount:
        """Rule 2c: the pod's resolv.conf, written atomically, as a read-only mount of ``/etc/resolv.conf``."""
        s = self.runtime.settings
        try:
            node = parse_resolv_conf(s.node_resolv_conf.read_text(errors="replace"))
        except OSError:
            node = parse_resolv_conf("")
        formed: PodDns = pod_dns(self.pod, ClusterDns(s.cluster_dns, s.cluster_domain), node)
        for warning in formed.warnings:
            self.event("Warning", "DNSConfigForming", warning)
        path = self.directory / "resolv.conf"
        tmp = self.directory / ".resolv.conf.tmp"
        tmp.write_text(formed.resolv.render())
        tmp.chmod(0o644)
        tmp.replace(path)
        return VolumeMount(str(path), RESOLV_CONF, read_only=True)

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
        if s.container_pythonpath:
            env["PYTHONPATH"] = s.container_pythonpath
        if self._token_written:
            sandboxed = self.runtime.containers.sandboxed
            env["AMBIT_TOKEN_FILE"] = f"{SERVICE_ACCOUNT_DIR}/token" if sandboxed else str(self.token_path)
        return env


def _write_file(path: Path, text: str, mode: int) -> None:
    """Replace ``path`` atomically (a reader sees the old or the new content, never a part)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(tmp, mode)
    tmp.replace(path)


def forget_pod_files(directory: Path) -> None:
    """Remove a pod's record and service-account files (its logs stay)."""
    paths = [directory / STATE_FILE, directory / "token", directory / USERNS_FILE]
    sa_dir = directory / "serviceaccount"
    if sa_dir.is_dir():
        paths += list(sa_dir.iterdir())
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()
    with contextlib.suppress(OSError):
        sa_dir.rmdir()
    remove_volumes(directory)
