"""Enrolling pods in the mesh on one node: redirection rules in the pod netns, the node proxy told, the pod marked.

Theory of operation (spec §1.2, AddPodToMesh / RemovePodFromMesh). Each pod, by uid, is in one
:class:`EnrolmentState`. The rules, in the order :meth:`EnrolmentManager.enrol` applies them:

1. Install the in-pod redirection (:mod:`ambit.redirect`) in the pod's netns. It is idempotent: the rendering
   replaces our tables atomically, so applying again after a restart leaves no duplicates. A failure here (a bad
   pod annotation, a failing ``nft``) is the pod's or the node's problem, not a transient one: a Warning Event
   says what to do, no annotation is written, and the state does not change.
2. Tell the node proxy (:class:`NodeProxyLink.add`) and wait for its ack. If it is unreachable or nacks, the pod
   becomes PENDING, is annotated ``ambient.istio.io/redirection: pending`` and gets a Warning Event; the error is
   retryable (the CNI plugin fails the ADD and the runtime retries; the agent retries PENDING pods itself).
3. Patch ``pods/status`` (merge patch) with ``ambient.istio.io/redirection: enabled`` and record a Normal Event:
   only now is the pod ENROLLED.

:meth:`EnrolmentManager.unenrol` removes the rules (when the netns still exists), tells the node proxy
(:meth:`NodeProxyLink.delete`), removes the annotation (null merge patch; a pod that is gone is fine) and forgets
the pod. Operations on one pod are serialised by a per-pod lock; different pods proceed concurrently.

Host probes (spec §2.3): the node runtime probes a pod from the node's namespace, and the in-pod rules would send
that to the node proxy. The agent keeps the IPv4 addresses of its ENROLLED pods (``status.podIPs`` /
``status.podIP``, or the CNI result's addresses on an ADD) and after every enrol and unenrol re-applies the host
rules (:func:`ambit.redirect.apply.apply_host_async`) with the whole current set: locally generated TCP to those
addresses is SNATed to the probe address, which the in-pod rules accept without redirecting. The agent process
runs in the node's namespace, so the host rules are applied with no ``ip netns exec``. The script replaces the
host table atomically; applies are serialised by one lock and each renders the set as it is when it runs, so
the last apply always carries the latest set. A failing host apply is logged, not raised: the pod is enrolled
either way, and the next enrol or unenrol applies the set again. :meth:`EnrolmentManager.sync_host` applies the
set on its own (the agent calls it on start, when the set is empty).

Transitions (anything missing is not a transition: the state stays)::

    (state,         outcome)           -> state
    (any,           LINK_ACKED)        -> ENROLLED      rules + proxy ack + annotation
    (any,           LINK_FAILED)       -> PENDING
    (any,           REMOVED)           -> NOT_ENROLLED
    (NOT_ENROLLED,  RULES_FAILED)      -> NOT_ENROLLED
    (PENDING,       RULES_FAILED)      -> PENDING

Errors (``AmbitError`` subtree)::

    EnrolmentError                  ``reason`` names it for Events and HTTP answers
    ├── RedirectionFailedError      rules could not be installed (not retryable)
    ├── ProxyUnavailableError       the node proxy is unreachable or nacked (retryable: the pod is PENDING)
    └── AnnotationFailedError       the API server refused the annotation (retryable)
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import logging
import os.path
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ambit.cni import netns
from ambit.commands import CommandRunner
from ambit.errors import AmbitError
from ambit.k8s import EventRecorder, KubeClient, KubeClientError, KubeNotFoundError
from ambit.k8s.kinds import PODS
from ambit.redirect import InPodSettings, RedirectError
from ambit.redirect.apply import apply_host_async, apply_inpod_async, remove_inpod_async

log = logging.getLogger("ambit.cni.enrolment")

REDIRECTION_ANNOTATION = "ambient.istio.io/redirection"
REDIRECTION_ENABLED = "enabled"
REDIRECTION_PENDING = "pending"
ACTION = "Enrol"


class EnrolmentState(enum.Enum):
    NOT_ENROLLED = "not enrolled"
    PENDING = "pending"
    ENROLLED = "enrolled"


class Outcome(enum.Enum):
    RULES_FAILED = "rules failed"
    LINK_FAILED = "link failed"
    LINK_ACKED = "link acked"
    REMOVED = "removed"


_S, _O = EnrolmentState, Outcome
TRANSITIONS: dict[tuple[EnrolmentState, Outcome], EnrolmentState] = {
    **{(s, _O.LINK_ACKED): _S.ENROLLED for s in _S},
    **{(s, _O.LINK_FAILED): _S.PENDING for s in _S},
    **{(s, _O.REMOVED): _S.NOT_ENROLLED for s in _S},
    (_S.NOT_ENROLLED, _O.RULES_FAILED): _S.NOT_ENROLLED,
    (_S.PENDING, _O.RULES_FAILED): _S.PENDING,
}


def next_state(state: EnrolmentState, outcome: Outcome) -> EnrolmentState:
    """The state after ``outcome``; an outcome with no rule leaves the state as it is."""
    return TRANSITIONS.get((state, outcome), state)


class EnrolmentError(AmbitError):
    reason = "AmbientEnrolmentFailed"
    retryable = True


class RedirectionFailedError(EnrolmentError):
    reason = "AmbientRedirectionFailed"
    retryable = False


class ProxyUnavailableError(EnrolmentError):
    reason = "AmbientProxyUnavailable"


class AnnotationFailedError(EnrolmentError):
    reason = "AmbientAnnotationFailed"


class NodeProxyLink(Protocol):
    """The node agent's side of ZDS to the node proxy (written in :mod:`ambit.zds`)."""

    async def add(self, pod_uid: str, netns_path: str, workload: dict[str, Any]) -> None:
        """Hand the pod's netns to the node proxy and wait for its ack; raise when it nacks or is unreachable."""
        ...

    async def delete(self, pod_uid: str) -> None:
        """Tell the node proxy the pod is gone."""
        ...


@dataclass(frozen=True, slots=True)
class EnrolmentSettings:
    node_name: str
    """The node this agent serves (Events name it; the CNI plugin only talks to its own node's agent)."""
    backend: Literal["nftables", "iptables"] = "nftables"
    dns_capture: bool = True
    """The node-wide DNS capture default; ``ambient.istio.io/dns-capture`` overrides it per pod."""
    ipv6: bool = False
    """Redirect IPv6 in every pod (istio-cni's ``ipv6`` setting); off, a pod is redirected in IPv6 too as soon as
    it has an IPv6 address (a dual-stack pod), so its IPv6 traffic is captured like its IPv4 traffic."""


@dataclass(slots=True)
class Enrolment:
    """What the agent knows of one pod."""

    uid: str
    namespace: str
    name: str
    state: EnrolmentState = EnrolmentState.NOT_ENROLLED
    netns_path: str | None = None
    settings: InPodSettings | None = None
    ips: tuple[str, ...] = ()
    """The pod's IPv4 addresses (for the host probe SNAT set)."""


def pod_ipv4s(pod: dict[str, Any], extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The pod's IPv4 addresses from ``status.podIPs`` and ``status.podIP`` plus ``extra``, sorted, no duplicates."""
    status = pod.get("status") or {}
    texts: list[Any] = [entry.get("ip") for entry in status.get("podIPs") or [] if isinstance(entry, dict)]
    texts += [status.get("podIP"), *extra]
    found: set[ipaddress.IPv4Address] = set()
    for text in texts:
        if not isinstance(text, str):
            continue
        try:
            addr = ipaddress.ip_address(text.split("/")[0])
        except ValueError:
            continue
        if isinstance(addr, ipaddress.IPv4Address):
            found.add(addr)
    return tuple(str(a) for a in sorted(found))


def pod_has_ipv6(pod: dict[str, Any], extra: Iterable[str] = ()) -> bool:
    """Whether ``status.podIPs``/``status.podIP`` or ``extra`` (the CNI result's addresses) hold an IPv6 address."""
    status = pod.get("status") or {}
    texts: list[Any] = [entry.get("ip") for entry in status.get("podIPs") or [] if isinstance(entry, dict)]
    for text in [*texts, status.get("podIP"), *extra]:
        if not isinstance(text, str):
            continue
        try:
            if ipaddress.ip_address(text.split("/")[0]).version == 6:
                return True
        except ValueError:
            continue
    return False


def workload_info(pod: dict[str, Any]) -> dict[str, Any]:
    """The ZDS ``WorkloadInfo`` of a pod: name, namespace, service account."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    return {
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "service_account": spec.get("serviceAccountName") or "default",
    }


def redirection_annotation(pod: dict[str, Any]) -> str | None:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(REDIRECTION_ANNOTATION)
    return value if isinstance(value, str) else None


class EnrolmentManager:
    """Owns the enrolment of this node's pods (rules at the top of the module)."""

    def __init__(
        self,
        client: KubeClient,
        recorder: EventRecorder,
        runner: CommandRunner,
        link: NodeProxyLink,
        settings: EnrolmentSettings,
        *,
        netns_exists: Callable[[str], bool] = os.path.exists,
    ) -> None:
        self.client = client
        self.recorder = recorder
        self.runner = runner
        self.link = link
        self.settings = settings
        self._netns_exists = netns_exists
        self._pods: dict[str, Enrolment] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._host_lock = asyncio.Lock()

    # -- lookups (synchronous) ------------------------------------------------------------------------------
    def find(self, uid: str) -> Enrolment | None:
        return self._pods.get(uid)

    def state(self, uid: str) -> EnrolmentState:
        found = self._pods.get(uid)
        return found.state if found is not None else EnrolmentState.NOT_ENROLLED

    def pending(self) -> list[Enrolment]:
        return [e for e in self._pods.values() if e.state is EnrolmentState.PENDING]

    def probe_ips(self) -> list[str]:
        """The IPv4 addresses of the ENROLLED pods: the host probe SNAT set."""
        ips = {ip for e in self._pods.values() if e.state is EnrolmentState.ENROLLED for ip in e.ips}
        return sorted(ips, key=ipaddress.IPv4Address)

    # -- operations -----------------------------------------------------------------------------------------
    async def enrol(self, pod: dict[str, Any], netns_path: str, *, ips: Iterable[str] = ()) -> None:
        """Rules 1-3, then the host rules; returns once ENROLLED, raises :class:`EnrolmentError` otherwise.

        ``ips``: addresses known besides the pod's status (the CNI result's, before the status has them).
        """
        ips = tuple(ips)
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        async with self._lock(uid):
            record = self._pods.get(uid) or Enrolment(uid, str(meta.get("namespace", "")), str(meta.get("name", "")))
            try:
                ipv6 = self.settings.ipv6 or pod_has_ipv6(pod, ips)
                settings = InPodSettings.for_pod(
                    meta.get("annotations") or {}, dns_capture=self.settings.dns_capture, ipv6=ipv6
                )
                name, runner = netns.target(netns_path, self.runner)
                await apply_inpod_async(name, settings, self.settings.backend, runner)
            except RedirectError as exc:
                self._settle(record, Outcome.RULES_FAILED)
                note = (
                    f"Traffic redirection could not be installed in the pod's network namespace on node "
                    f"{self.settings.node_name}: {exc}. Fix the pod's ambient annotations or the node's "
                    f"{self.settings.backend} setup; the pod is not in the mesh until then."
                )
                self.recorder.record(pod, "Warning", RedirectionFailedError.reason, note, ACTION)
                raise RedirectionFailedError(note) from exc
            record.netns_path, record.settings = netns_path, settings
            record.ips = pod_ipv4s(pod, ips) or record.ips
            try:
                await self.link.add(uid, netns_path, workload_info(pod))
            except Exception as exc:  # the link is another component's code: any failure means "no ack"
                self._settle(record, Outcome.LINK_FAILED)
                note = (
                    f"The node proxy on node {self.settings.node_name} did not accept the pod ({exc or type(exc)}); "
                    "enrolment will be retried. Check that the node proxy is running on this node."
                )
                self.recorder.record(pod, "Warning", ProxyUnavailableError.reason, note, ACTION)
                await self._annotate(pod, REDIRECTION_PENDING, missing_ok=True)
                raise ProxyUnavailableError(note) from exc
            try:
                await self._annotate(pod, REDIRECTION_ENABLED, missing_ok=False)
            except KubeClientError as exc:
                raise AnnotationFailedError(f"could not mark pod {record.namespace}/{record.name}: {exc}") from exc
            self._settle(record, Outcome.LINK_ACKED)
            note = f"Pod enrolled in ambient mode on node {self.settings.node_name}."
            self.recorder.record(pod, "Normal", "AmbientEnrolled", note, ACTION)
        await self.sync_host()

    async def update_ips(self, pod: dict[str, Any]) -> None:
        """Take up an ENROLLED pod's addresses from its status when they changed (re-applying the host rules)."""
        record = self._pods.get(str((pod.get("metadata") or {}).get("uid", "")))
        if record is None or record.state is not EnrolmentState.ENROLLED:
            return
        ips = pod_ipv4s(pod)
        if ips and ips != record.ips:
            record.ips = ips
            await self.sync_host()

    async def sync_host(self) -> None:
        """Apply the host probe SNAT rules for exactly the ENROLLED pods' addresses, in the node namespace."""
        async with self._host_lock:
            ips = self.probe_ips()
            try:
                await apply_host_async(ips, self.settings.backend, self.runner)
            except (RedirectError, OSError) as exc:
                log.warning(
                    "node %s: applying the host probe rules for %s failed: %s", self.settings.node_name, ips, exc
                )

    async def unenrol(self, pod: dict[str, Any], netns_path: str | None = None) -> None:
        """RemovePodFromMesh; ``netns_path`` is used when the agent has no record of the pod (after a restart)."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        async with self._lock(uid):
            record = self._pods.get(uid)
            path = record.netns_path if record is not None and record.netns_path else netns_path
            settings = record.settings if record is not None and record.settings else InPodSettings()
            if path is not None and self._netns_exists(path):
                name, runner = netns.target(path, self.runner)
                try:
                    await remove_inpod_async(name, settings, self.settings.backend, runner)
                except RedirectError as exc:
                    log.warning(
                        "pod %s/%s: removing redirection failed: %s", meta.get("namespace"), meta.get("name"), exc
                    )
            try:
                await self.link.delete(uid)
            except Exception as exc:  # the link's failures must not keep a pod half-removed
                log.warning("pod %s/%s: node proxy delete failed: %s", meta.get("namespace"), meta.get("name"), exc)
            if redirection_annotation(pod) is not None or record is not None:
                try:
                    await self._annotate(pod, None, missing_ok=True)
                except KubeClientError as exc:
                    log.warning(
                        "pod %s/%s: removing the annotation failed: %s", meta.get("namespace"), meta.get("name"), exc
                    )
            if record is not None:
                self._settle(record, Outcome.REMOVED)
            self._locks.pop(uid, None)
        await self.sync_host()

    # -- internals ------------------------------------------------------------------------------------------
    def _lock(self, uid: str) -> asyncio.Lock:
        return self._locks.setdefault(uid, asyncio.Lock())

    def _settle(self, record: Enrolment, outcome: Outcome) -> None:
        record.state = next_state(record.state, outcome)
        if record.state is EnrolmentState.NOT_ENROLLED:
            self._pods.pop(record.uid, None)
        else:
            self._pods[record.uid] = record

    async def _annotate(self, pod: dict[str, Any], value: str | None, *, missing_ok: bool) -> None:
        meta = pod.get("metadata") or {}
        patch = {"metadata": {"annotations": {REDIRECTION_ANNOTATION: value}}}
        try:
            await self.client.patch_status(PODS, str(meta.get("name")), patch, str(meta.get("namespace")))
        except KubeNotFoundError:
            if not missing_ok:
                raise
        except KubeClientError as exc:
            if not missing_ok:
                raise
            log.warning("pod %s/%s: annotating %s failed: %s", meta.get("namespace"), meta.get("name"), value, exc)
