"""The node agent: watches its node's Pods and all Namespaces, serves the CNI plugin, and enrols pods.

Theory of operation (spec §1.2, "Other agent behavior"). ``start()`` starts the Namespace informer and waits for
it to sync, then the Pod informer (``spec.nodeName=<node>``), so that every pod handler sees its namespace. Every
pod event is *reconciled* against the selection rules (:func:`ambit.cni.selection.is_ambient`):

- a running pod that is ambient and not ENROLLED or PENDING is enrolled, in the netns ``netns_for(pod)`` gives;
  this is also how, after the agent's own restart, running pods are found again (the first list delivers them
  all): the rules are re-applied (idempotently) and the node proxy told again;
- a pod that is not ambient, but that we enrolled or that carries the redirection annotation, is unenrolled;
- a deleted pod, or one in a terminal phase (Succeeded, Failed), is unenrolled.

A Namespace whose labels change reconciles the running pods of that namespace on this node. PENDING pods (the
node proxy was unreachable or refused them: e.g. the pod's own application holds a port the proxy must listen on
in its netns) are retried by a retry task with a per-pod exponential back-off, ``retry_initial`` seconds doubling up
to ``retry_interval`` (not on their own update events: our pending annotation is itself an update); each failed
attempt is logged and recorded as a Warning Event on the pod by the enrolment manager. A pod stays redirected
while PENDING, so its traffic is refused (fail closed) until the node proxy takes it. When the node proxy restarts,
the node agent's snapshot to it carries the PENDING pods too, and the next retry (at most ``retry_interval`` later)
marks them enrolled once it acks.

``POST /cmdadd`` (:mod:`ambit.cni.pluginevent`) enrols the pod in the netns the runtime gives and answers only
when it is enrolled; before anything else it checks that the pod is on this node and that the netns is that pod's
sandbox namespace on this node (:mod:`ambit.cni.addcheck`), refusing the event otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ambit.cni.addcheck import (
    DEFAULT_NETNS_DIRS,
    KernelNetnsProbe,
    NetnsProbe,
    check_add_event,
    resolved_dirs,
)
from ambit.cni.enrolment import (
    Enrolment,
    EnrolmentError,
    EnrolmentManager,
    EnrolmentState,
    redirection_annotation,
)
from ambit.cni.pluginevent import AddEvent, PluginEventServer
from ambit.cni.selection import DEFAULT_EXCLUDED_NAMESPACES, is_ambient
from ambit.k8s import Informer, InformerSettings, KubeClient, KubeClientError, KubeNotFoundError
from ambit.k8s.kinds import NAMESPACES, PODS
from ambit.supervision import watch

log = logging.getLogger("ambit.cni.agent")

Pod = dict[str, Any]
NetnsResolver = Callable[[Pod], "str | None"]
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class PodNotFoundError(EnrolmentError):
    reason = "PodNotFound"


@dataclass(frozen=True, slots=True)
class NodeAgentSettings:
    node_name: str
    socket_path: str = "/var/run/ambit-cni/pluginevent.sock"
    """Where the plugin event server listens (the plugin's ``agent_socket``)."""
    excluded_namespaces: frozenset[str] = DEFAULT_EXCLUDED_NAMESPACES
    retry_interval: float = 5.0
    """The longest wait, in seconds, between two retries of a PENDING pod (the back-off's cap)."""
    retry_initial: float = 1.0
    """Seconds before a PENDING pod's first retry; the wait doubles after each failed one, up to
    ``retry_interval``."""
    informer: InformerSettings = field(default_factory=InformerSettings)
    netns_dirs: tuple[str, ...] = DEFAULT_NETNS_DIRS
    """Where pod sandboxes' network namespaces are mounted; a ``/cmdadd`` netns elsewhere is refused."""


def _meta(obj: Pod) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _phase(pod: Pod) -> str:
    status = pod.get("status")
    return str(status.get("phase", "")) if isinstance(status, dict) else ""


class NodeAgent:
    """Informers, the plugin event server and the enrolment manager of one node; ``start()`` / ``aclose()``."""

    def __init__(
        self,
        client: KubeClient,
        manager: EnrolmentManager,
        settings: NodeAgentSettings,
        netns_for: NetnsResolver,
        *,
        netns_probe: NetnsProbe | None = None,
    ) -> None:
        self.client = client
        self.manager = manager
        self.settings = settings
        self.netns_for = netns_for
        self.netns_probe = netns_probe or KernelNetnsProbe()
        self.namespaces = Informer(client, NAMESPACES, on_update=self._namespace_updated, settings=settings.informer)
        self.pods = Informer(
            client,
            PODS,
            field_selector=f"spec.nodeName={settings.node_name}",
            on_add=self._reconcile,
            on_update=self._pod_updated,
            on_delete=self._pod_deleted,
            settings=settings.informer,
        )
        self.server = PluginEventServer(settings.socket_path, self._cmdadd)
        self._retry_task: asyncio.Task[None] | None = None
        self._retries: dict[str, tuple[int, float]] = {}
        """PENDING pod uid -> (failed retries so far, loop time of its next retry)."""

    async def start(self, *, before_serving: Callable[[], Awaitable[None]] | None = None) -> None:
        """Sync the informers (enrolling the running pods), run ``before_serving``, then serve the CNI plugin.

        The daemon passes the ZDS server's ``start`` as ``before_serving``: the running pods are then all in the
        node proxy's first snapshot (see :mod:`ambit.zds.server`).
        """
        await self.manager.sync_host()  # no pod is enrolled yet: the host probe set starts empty
        self.namespaces.start()
        await self.namespaces.wait_synced()
        self.pods.start()
        await self.pods.wait_synced()
        if before_serving is not None:
            await before_serving()
        await self.server.start()
        name = f"node agent {self.settings.node_name} pending retries"
        self._retry_task = watch(asyncio.get_running_loop().create_task(self._retry_pending(), name=name))

    async def aclose(self) -> None:
        task, self._retry_task = self._retry_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.server.aclose()
        await self.pods.aclose()
        await self.namespaces.aclose()

    # -- lookups --------------------------------------------------------------------------------------------
    def find_namespace(self, name: str) -> dict[str, Any]:
        """The cached Namespace, or a bare one (a namespace we have not seen selects nothing by its labels)."""
        return self.namespaces.find(name) or {"metadata": {"name": name}}

    def wants(self, pod: Pod) -> bool:
        """Whether ``pod`` should be enrolled by the selection rules."""
        namespace = self.find_namespace(str(_meta(pod).get("namespace", "")))
        return is_ambient(pod, namespace, excluded_namespaces=self.settings.excluded_namespaces).enrolled

    # -- reconciliation -------------------------------------------------------------------------------------
    async def _reconcile(self, pod: Pod) -> None:
        uid = str(_meta(pod).get("uid", ""))
        state = self.manager.state(uid)
        if _phase(pod) in TERMINAL_PHASES:
            await self._unenrol_if_known(pod)
        elif self.wants(pod):
            if _phase(pod) == "Running" and state is EnrolmentState.NOT_ENROLLED:
                await self._enrol_running(pod)
            elif state is EnrolmentState.ENROLLED:
                await self.manager.update_ips(pod)
        else:
            await self._unenrol_if_known(pod)

    async def _enrol_running(self, pod: Pod) -> None:
        meta = _meta(pod)
        path = self.netns_for(pod)
        if path is None:
            log.info("pod %s/%s: no network namespace found; not enrolled", meta.get("namespace"), meta.get("name"))
            return
        try:
            await self.manager.enrol(pod, path)
        except EnrolmentError as exc:
            log.warning("pod %s/%s: %s", meta.get("namespace"), meta.get("name"), exc)

    async def _unenrol_if_known(self, pod: Pod) -> None:
        uid = str(_meta(pod).get("uid", ""))
        if self.manager.find(uid) is not None or redirection_annotation(pod) is not None:
            await self.manager.unenrol(pod, self.netns_for(pod))

    async def _pod_updated(self, old: Pod, new: Pod) -> None:
        await self._reconcile(new)

    async def _pod_deleted(self, pod: Pod) -> None:
        uid = str(_meta(pod).get("uid", ""))
        if self.manager.find(uid) is not None or redirection_annotation(pod) is not None:
            await self.manager.unenrol(pod, self.netns_for(pod))

    async def _namespace_updated(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        if _meta(old).get("labels") == _meta(new).get("labels"):
            return
        name = _meta(new).get("name")
        for pod in self.pods.items():
            if _meta(pod).get("namespace") == name:
                await self._reconcile(pod)

    def retry_delay(self, failures: int) -> float:
        """Seconds from a PENDING pod's ``failures``-th failed retry (0: it just became PENDING) to its next."""
        initial, cap = self.settings.retry_initial, self.settings.retry_interval
        return float(min(cap, initial * 2 ** min(failures, 32)))

    async def _retry_pending(self) -> None:
        loop = asyncio.get_running_loop()
        tick = min(self.settings.retry_initial, self.settings.retry_interval) / 2
        while True:
            await asyncio.sleep(tick)
            pending = self.manager.pending()
            for gone in self._retries.keys() - {r.uid for r in pending}:
                del self._retries[gone]
            for record in pending:  # each on its own: see _retry_one
                try:
                    await self._retry_one(record, loop.time())
                except Exception:  # a defect with one pod must not end the retries of every other pod of the node
                    failures = self._retries.get(record.uid, (0, 0.0))[0] + 1
                    self._retries[record.uid] = (failures, loop.time() + self.retry_delay(failures))
                    log.exception("pod %s/%s: retry %d failed", record.namespace, record.name, failures)

    async def _retry_one(self, record: Enrolment, now: float) -> None:
        loop = asyncio.get_running_loop()
        failures, due = self._retries.setdefault(record.uid, (0, now + self.retry_delay(0)))
        if now < due:
            return
        pod = self.pods.find(record.name, record.namespace)
        if pod is None or str(_meta(pod).get("uid")) != record.uid:
            return
        if not self.wants(pod) or _phase(pod) in TERMINAL_PHASES:
            await self.manager.unenrol(pod, record.netns_path)
            return
        path = record.netns_path or self.netns_for(pod)
        if path is None:
            return
        try:
            await self.manager.enrol(pod, path)
        except EnrolmentError as exc:
            delay = self.retry_delay(failures + 1)
            self._retries[record.uid] = (failures + 1, loop.time() + delay)
            log.warning(
                "pod %s/%s still pending (retry %d), next retry in %.1fs: %s",
                record.namespace,
                record.name,
                failures + 1,
                delay,
                exc,
            )
        else:
            self._retries.pop(record.uid, None)
            log.info("pod %s/%s enrolled on retry %d", record.namespace, record.name, failures + 1)

    # -- the CNI plugin's add event -------------------------------------------------------------------------
    async def _cmdadd(self, event: AddEvent) -> None:
        pod = await self._fetch_pod(event)
        self._check_add(event, pod)
        if not self.wants(pod):
            log.info("cmdadd for %s/%s: not ambient; nothing to do", event.pod_namespace, event.pod_name)
            return
        state = self.manager.find(str(_meta(pod).get("uid", "")))
        if state is not None and state.state is EnrolmentState.ENROLLED and state.netns_path == event.netns:
            return
        await self.manager.enrol(pod, event.netns, ips=[ip.address for ip in event.ips])

    def _check_add(self, event: AddEvent, pod: Pod) -> None:
        """:func:`~ambit.cni.addcheck.check_add_event` with the kernel's answers; refusals are logged."""
        probe = self.netns_probe
        sandbox_path = (
            self.netns_for(pod) if (pod.get("spec") or {}).get("nodeName") == self.settings.node_name else None
        )
        try:
            check_add_event(
                pod,
                event.netns,
                node_name=self.settings.node_name,
                netns_dirs=resolved_dirs(self.settings.netns_dirs),
                facts=probe.inspect(event.netns),
                forbidden=probe.forbidden(),
                sandbox=probe.inspect(sandbox_path) if sandbox_path else None,
            )
        except EnrolmentError as exc:
            log.warning("cmdadd refused: %s", exc)
            raise

    async def _fetch_pod(self, event: AddEvent) -> Pod:
        """The pod from the cache when it is the one the runtime means (same uid), else from the API server."""
        cached = self.pods.find(event.pod_name, event.pod_namespace)
        if cached is not None and (event.pod_uid is None or _meta(cached).get("uid") == event.pod_uid):
            return cached
        try:
            pod = await self.client.get(PODS, event.pod_name, event.pod_namespace)
        except KubeNotFoundError:
            raise PodNotFoundError(f"pod {event.pod_namespace}/{event.pod_name} does not exist") from None
        except KubeClientError as exc:
            raise PodNotFoundError(f"could not read pod {event.pod_namespace}/{event.pod_name}: {exc}") from exc
        if event.pod_uid is not None and _meta(pod).get("uid") != event.pod_uid:
            raise PodNotFoundError(
                f"pod {event.pod_namespace}/{event.pod_name} has uid {_meta(pod).get('uid')}, not {event.pod_uid}"
            )
        return pod
