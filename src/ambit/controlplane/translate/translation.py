"""What a translation gives (:class:`Translation`, with :class:`WorkloadChanges`) and what it keeps between calls
(:class:`TranslationMemo`, with each stage's last value in :class:`StageMemos`). Values only; the translation
itself is :func:`ambit.controlplane.translate.pipeline.translate_all`.

Every :class:`Translation` field is ordered (by key, uid or as documented on it), so equal inputs give equal
values; :attr:`Translation.workload_changes` is a hint that takes no part in comparing them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ambit.controlplane.translate.backendtls import BackendTlsPolicyStatus
from ambit.controlplane.translate.discovery import EVERY_NAMESPACE, DiscoveryFilter
from ambit.controlplane.translate.endpointslices import SliceMemo
from ambit.controlplane.translate.envoyfilters import PatchNote
from ambit.controlplane.translate.gateway_side import GatewaySide
from ambit.controlplane.translate.index import SelectionMemo, ServiceIndex
from ambit.controlplane.translate.meshconfig import MeshConfigMemo
from ambit.controlplane.translate.pod_workloads import PodWorkloads
from ambit.controlplane.translate.policies import PolicyStatus
from ambit.controlplane.translate.policy_side import PolicySide
from ambit.controlplane.translate.routes import RouteStatus
from ambit.controlplane.translate.service_side import ServiceMemo, ServiceSide
from ambit.controlplane.translate.skips import Skipped
from ambit.controlplane.translate.stage_memo import StageMemo
from ambit.model.ingress import GatewayConfig
from ambit.model.localconfig import LocalConfig
from ambit.model.routes import WaypointConfig
from ambit.model.workload import Workload

__all__ = [
    "EntryWorkloads",
    "SliceWorkloads",
    "StageMemos",
    "Translation",
    "TranslationMemo",
    "WorkloadChanges",
]

EntryWorkloads = tuple[tuple[tuple[Workload, Mapping[str, str]], ...], tuple[Skipped, ...]]
"""The ServiceEntries' inline endpoints' workloads with their labels, and the skips."""
SliceWorkloads = tuple[tuple[Workload, ...], tuple[Skipped, ...], frozenset[str]]
"""The hand-added endpoints' workloads, the skips, and ``namespace/name`` of each slice that may give any."""


@dataclass(slots=True)
class StageMemos:
    """Each stage's last value (:mod:`~ambit.controlplane.translate.stage_memo`)."""

    policies: StageMemo[PolicySide] = field(default_factory=StageMemo)
    services: StageMemo[ServiceSide] = field(default_factory=StageMemo)
    gateways: StageMemo[GatewaySide] = field(default_factory=StageMemo)
    index: StageMemo[tuple[ServiceIndex, frozenset[str]]] = field(default_factory=StageMemo)
    """The service index and ``namespace/name`` of each slice it read."""
    slices: StageMemo[SliceWorkloads] = field(default_factory=StageMemo)
    entry_workloads: StageMemo[EntryWorkloads] = field(default_factory=StageMemo)


@dataclass(slots=True)
class TranslationMemo:
    """Each pod's workload and each Service's translation between calls of :func:`translate_all`, so that a pod
    change re-translates that pod only.

    Rules: a Service's entry is keyed by (uid, resourceVersion, domain, network, the mesh config's
    ``defaultServiceExportTo``, its namespace's traffic distribution annotation), all its translation reads. The
    pods' entries (:class:`~ambit.controlplane.translate.pod_workloads.PodWorkloads`) hold each pod's finished
    workload (services map, policy keys and waypoint included), its labels and its skips, by pod key; they are
    reused only while the ``context`` (everything else a pod's workload is made from: the service index, the
    network, the nodes' localities, the policy selections and PeerAuthentications, the waypoints, the cluster and
    trust domain) is equal, by value, to this call's; otherwise every pod is translated again. A pod without a uid
    or resourceVersion is translated on every call that walks all pods. When the caller names what changed
    (``changed``), only the changed pods are looked at. After each call the memo holds exactly that call's pods.
    ``mesh`` keeps the last good mesh config (:class:`~ambit.controlplane.translate.meshconfig.MeshConfigMemo`).
    ``stages`` keeps each stage's last value (:mod:`~ambit.controlplane.translate.stage_memo`): a call told what
    changed takes the value of each stage whose kinds did not change as it is, so the pods' context then holds the
    same objects and compares by identity.
    """

    pods: PodWorkloads = field(default_factory=PodWorkloads)
    services: ServiceMemo = field(default_factory=dict)
    mesh: MeshConfigMemo = field(default_factory=MeshConfigMemo)
    workloads: tuple[Workload, ...] | None = None
    """The previous call's workloads (:class:`WorkloadChanges` are relative to them)."""
    other_workloads: tuple[Workload, ...] = ()
    """The previous call's workloads that are not pods', in the order they were made."""
    slices: SliceMemo = field(default_factory=dict)
    """Each EndpointSlice's hand-added endpoints' workloads (:mod:`~ambit.controlplane.translate.endpointslices`
    rule 5)."""
    selections: SelectionMemo = field(default_factory=dict)
    """Each Service's selection in the service index (:mod:`~ambit.controlplane.translate.index` rule 4)."""
    stages: StageMemos = field(default_factory=StageMemos)
    """Each stage's last value, reused while its inputs did not change
    (:mod:`~ambit.controlplane.translate.stage_memo`)."""
    complete: bool = False
    """Whether the last call through this memo ended normally (an interrupted one reuses nothing next time)."""

    @property
    def hits(self) -> int:
        """Pods whose translation was reused, in the last call (for tests and logs)."""
        return self.pods.hits


@dataclass(frozen=True, slots=True)
class Translation:
    """The workload API's content, and what the translation had to leave out."""

    config: LocalConfig
    skipped: tuple[Skipped, ...] = ()
    policy_status: tuple[PolicyStatus, ...] = ()
    """The ``ZtunnelAccepted`` condition of each AuthorizationPolicy that has one, by key."""
    service_status: tuple[PolicyStatus, ...] = ()
    """The ``istio.io/WaypointBound`` condition of each Service that has one, by key."""
    service_entry_status: tuple[PolicyStatus, ...] = ()
    """The ``istio.io/WaypointBound`` and ``istio.io/WaypointMissing`` conditions of each ServiceEntry that has
    them, by key then in that order."""
    waypoint_configs: tuple[WaypointConfig, ...] = ()
    """Each ready waypoint's routes (:mod:`ambit.controlplane.translate.routes`), by waypoint key."""
    route_status: tuple[RouteStatus, ...] = ()
    """The parents we own of each HTTPRoute, GRPCRoute, TCPRoute and TLSRoute that has any, by kind then key."""
    waypoint_accounts: tuple[tuple[str, str], ...] = ()
    """(waypoint key, service account) of each ready waypoint: who may read its config."""
    gateway_configs: tuple[GatewayConfig, ...] = ()
    """Each ingress Gateway's served listeners (:mod:`ambit.controlplane.translate.ingress`) and the policies that
    apply at it (:mod:`ambit.controlplane.translate.gateway_policies`), by Gateway key."""
    gateway_accounts: tuple[tuple[str, str], ...] = ()
    """(Gateway key, service account) of each ingress Gateway: who may read its config (certificates included)."""
    waypoint_policy_status: tuple[PolicyStatus, ...] = ()
    """The ``WaypointAccepted`` condition of each targetRefs AuthorizationPolicy, by key."""
    backend_tls_status: tuple[BackendTlsPolicyStatus, ...] = ()
    """The ancestors we own of each BackendTLSPolicy (:mod:`~ambit.controlplane.translate.backendtls`), by key."""
    discovery: DiscoveryFilter = EVERY_NAMESPACE
    """The namespaces this translation saw (``discoverySelectors``); the CA applies the same filter."""
    envoy_filter_notes: tuple[PatchNote, ...] = ()
    """The EnvoyFilter patches (and objects) no proxy applies, and why
    (:mod:`~ambit.controlplane.translate.envoyfilters`), sorted; the control plane logs each once per generation."""
    workload_changes: WorkloadChanges | None = field(default=None, compare=False)
    """Which workloads differ from the previous translation through the same memo, when that is known without
    comparing them all (a hint for the encoders, not part of the translation's value)."""


@dataclass(frozen=True, slots=True)
class WorkloadChanges:
    """The workloads of a translation as changes to the previous one: every workload whose uid is not in ``uids``
    is the object the previous translation's ``since`` held under that uid (or one equal to it), and ``uids`` names
    each workload added, removed or replaced (a uid may be named that did not change)."""

    since: tuple[Workload, ...]
    """The previous translation's workloads (compare by identity: the changes apply to that tuple only)."""
    uids: frozenset[str]
