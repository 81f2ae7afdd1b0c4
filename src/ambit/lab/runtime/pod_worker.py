"""One pod's life on its node: the :class:`PodWorker`, the only writer of that pod's status and of its files under
``<pods_dir>/<uid>/``.

Theory of operation. The node runtime (:class:`ambit.lab.runtime.kubelet.NodeRuntime`) gives each pod bound to its node,
by uid, one worker, which sees the runtime only through :class:`~ambit.lab.runtime.pod_host.PodHost`. Pods are network
namespaces made by the runtime's sandbox manager (CNI ADD/DEL); containers are processes run by one
:class:`~ambit.lab.runtime.containers_apply.ContainerSupervisor` each, with the worker as their hooks (environment,
recording of processes, Events, status changes).

The worker decides; the steps it takes are carried out by its parts, each in its own module: the sandbox and the
volumes (rules 1 and 2b, :mod:`ambit.lab.runtime.pod_setup`), the service-account token (rule 2,
:mod:`ambit.lab.runtime.pod_token`), the preparation of each container's start (rule 2c and the environment,
:mod:`ambit.lab.runtime.pod_launch`) and adoption (rule 6, :mod:`ambit.lab.runtime.pod_adopt`). The status it
computes with :mod:`ambit.lab.runtime.pod_status` and writes itself (rule 5).

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
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ambit.k8s import kinds
from ambit.k8s.errors import KubeClientError, KubeNotFoundError
from ambit.lab.runtime.containers import (
    ContainerState,
    Phase,
    crash_loop_backoff,
    init_restart_policy,
    is_sidecar,
    pod_phase,
    rfc3339,
)
from ambit.lab.runtime.containers_apply import ContainerSupervisor, EventType, LaunchSpec
from ambit.lab.runtime.oci_spec import container_id
from ambit.lab.runtime.pod_adopt import adopt, stop_unsupervised
from ambit.lab.runtime.pod_host import PodHost
from ambit.lab.runtime.pod_launch import ContainerLauncher
from ambit.lab.runtime.pod_record import STATE_FILE, PodRecord, SavedSandbox
from ambit.lab.runtime.pod_setup import PodSetup
from ambit.lab.runtime.pod_status import MANAGED_STATUS, PodView, pod_status, status_patch
from ambit.lab.runtime.pod_token import ServiceAccountToken, forget_pod_files
from ambit.lab.runtime.processes import ProcessHandle
from ambit.lab.runtime.volumes_apply import PodVolumes

_NOT_FOR_INIT = frozenset({"startupProbe", "readinessProbe", "livenessProbe", "lifecycle"})
log = logging.getLogger("ambit.lab.runtime.kubelet")


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
        self.volumes = PodVolumes(
            runtime.client,
            pod,
            self.directory,
            s.host_path_layout,
            allocatable={"cpu": str(runtime.host.cpus), "memory": f"{runtime.host.memory_kib}Ki"},
            token_refresh_fraction=s.token_refresh_fraction,
            clock=runtime.clock,
        )
        self.setup = PodSetup(runtime, lambda: self.pod, self.uid, self.volumes, self.event)
        """Rules 1 and 2b carried out (:mod:`ambit.lab.runtime.pod_setup`)."""
        self.token = ServiceAccountToken(runtime, lambda: self.pod, self.directory, self.event)
        """Rule 2 (:mod:`ambit.lab.runtime.pod_token`)."""
        self.launcher = ContainerLauncher(self)
        """The ``prepare`` hook of the containers (:mod:`ambit.lab.runtime.pod_launch`)."""
        saved = PodRecord.load(self.state_path)
        self.saved = saved if saved is not None and saved.node == s.node_name and saved.uid == self.uid else None
        self.record = (
            PodRecord(s.node_name, self.uid, self.saved.sandbox, dict(self.saved.processes), self.saved.initialized)
            if self.saved is not None
            else PodRecord(s.node_name, self.uid)
        )
        """What ``runtime.json`` says; it starts as the saved one so a crash before adoption loses nothing."""
        self.reported = {
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
        before = self.reported.get(state.name) or {}
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
            await stop_unsupervised(self, grace)
            await self._destroy_sandbox()
            self._forget()
        else:
            await asyncio.gather(*(sup.detach() for sup in self.all_supervisors))
            self.launcher.close_user_namespace()

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
            if self.saved is not None and self.saved.sandbox is not None:
                self._sandbox_attempted = True
                await self._destroy_sandbox()
            return
        s = self.runtime.settings
        saved = self.saved
        # rule 1
        if self._host_network:
            self.sandbox = SavedSandbox("", "", (s.node_ip,))
        elif saved is not None and saved.sandbox is not None:
            self.sandbox, self._sandbox_attempted = saved.sandbox, True
        else:
            self.save()  # before CNI ADD: a crash during it still leaves something to clean up
            self.sandbox = await self._create_sandbox()
        self.pod_ips = self.sandbox.ips
        self.record.sandbox = None if self._host_network else self.sandbox
        self.save()
        self._changed.set()
        # rule 2
        if (self.pod.get("spec") or {}).get("automountServiceAccountToken") is not False:
            lifetime = await self.token.ensure()
            self._token_task = asyncio.get_running_loop().create_task(
                self.token.refresh(lifetime), name=f"pod {self.name} token"
            )
        # rule 2b
        await self.setup.ensure_volumes()
        self._volume_task = asyncio.get_running_loop().create_task(
            self.setup.resync_volumes(), name=f"pod {self.name} volumes"
        )
        # rule 6, then rules 2d and 3
        adopted = adopt(self)
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
            await self._stop_sidecars(self.grace())
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
        self.save()
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

    async def _terminate(self) -> None:
        """Rule 4."""
        grace = self.grace()
        began = time.monotonic()
        log.info("pod %s/%s: terminating (grace %.0fs)", self.namespace, self.name, grace)
        first = [*(sup for sup in self.init_supervisors if not is_sidecar(sup.state)), *self.supervisors]
        for sup in first:
            if sup.state.phase is Phase.RUNNING:
                self.event("Normal", "Killing", f"Stopping container {sup.name}")
        await asyncio.gather(*(sup.stop(grace) for sup in first))
        minimum = self.runtime.settings.minimum_grace_seconds
        await self._stop_sidecars(max(grace - (time.monotonic() - began), minimum))
        await stop_unsupervised(self, grace)
        log.info("pod %s/%s: containers stopped in %.1fs", self.namespace, self.name, time.monotonic() - began)
        self._stopped = True
        await self._cancel_token_refresh()
        await self._destroy_sandbox()
        if not self.removed:
            await self._write_status()
            await self._delete_from_api()
        self._forget()

    def grace(self) -> float:
        meta, spec = self.pod.get("metadata") or {}, self.pod.get("spec") or {}
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds")
        value = float(grace) if isinstance(grace, int | float) else 30.0
        return max(value, self.runtime.settings.minimum_grace_seconds)

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
        self.launcher.close_user_namespace()
        forget_pod_files(self.directory)
        self.runtime.release_user_namespace(self.uid)

    def save(self) -> None:
        try:
            self.record.save(self.state_path)
        except OSError as exc:
            log.error("pod %s/%s: cannot write %s: %s", self.namespace, self.name, self.state_path, exc)

    # -- the sandbox (rule 1, :mod:`ambit.lab.runtime.pod_setup`) ----------------------------------------------
    async def _create_sandbox(self) -> SavedSandbox:
        self._sandbox_attempted = True
        made = await self.setup.create_sandbox(self._sandbox_failed)
        self.sandbox_error = ""
        return made

    def _sandbox_failed(self, message: str) -> None:
        self.sandbox_error = message
        self._changed.set()

    async def _destroy_sandbox(self) -> None:
        if not self._sandbox_attempted:
            if self.sandbox is not None:  # the node's namespace (hostNetwork): nothing to destroy
                self.sandbox = None
                self._changed.set()
            return
        await self.setup.destroy_sandbox()
        self.sandbox, self._sandbox_attempted, self.record.sandbox = None, False, None
        self.launcher.close_user_namespace()
        self.save()
        self._changed.set()

    # -- the service-account token (rule 2, :mod:`ambit.lab.runtime.pod_token`) ---------------------------------
    async def _cancel_token_refresh(self) -> None:
        """Also the volumes' refresh (rule 2b)."""
        tasks = (self._token_task, self._volume_task)
        self._token_task = self._volume_task = None
        for task in tasks:
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
        self.save()

    async def prepare(self, container: Mapping[str, Any]) -> LaunchSpec:
        return await self.launcher.prepare(container)
