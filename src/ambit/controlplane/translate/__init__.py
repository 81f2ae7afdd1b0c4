"""Kubernetes and Istio objects → the Workload API (spec §4.1), as pure functions over plain API dicts.

Theory of operation: :func:`translate_all` takes snapshots of the kinds istiod's ambient index reads for L4 (Pods,
Services, EndpointSlices, Namespaces, ServiceEntries, WorkloadEntries, and Nodes for the pods' locality; spec §10.1)
and for L4 policy (AuthorizationPolicies, PeerAuthentications; spec §7) and for waypoints (Gateways, GatewayClasses,
the HTTPRoutes, GRPCRoutes, TCPRoutes, TLSRoutes, ReferenceGrants and VirtualServices of their routing, spec §1.4,
the RequestAuthentications attached to them, spec §7.5, and the DestinationRules that apply to their Services), and
Istio's own Gateways with the VirtualServices bound to them (classic ingress gateways, ``istio_gateways``), and
returns a
:class:`Translation`: one :class:`LocalConfig` (workloads, services, policies), the ``ZtunnelAccepted`` status of
each AuthorizationPolicy, the ``istio.io/WaypointBound`` status of Services and ServiceEntries and the
``istio.io/WaypointMissing`` status of ServiceEntries (:class:`PolicyStatus`, for the control plane to write),
each ready waypoint's :class:`~ambit.model.routes.WaypointConfig` with the routes' status (:class:`RouteStatus`),
and the list of what had to be left out (:class:`Skipped`, each naming the object and the field to fix).
:func:`translate` is the same without the list. Nothing here keeps state between calls or does I/O: the caller (an
informer-driven view, a test) decides when to translate again.

Order of work: the mesh config first, and with it the namespaces the translation sees (``discoverySelectors``,
:mod:`~ambit.controlplane.translate.discovery`: the objects of other namespaces are dropped from every input before
anything else reads them); then Kubernetes Services, then ServiceEntries (their hosts may not take a Service's key),
then one index of every selecting service, then the workloads (pods, WorkloadEntries, hand-added EndpointSlice
endpoints, inline ServiceEntry endpoints) with their services maps and the policy keys they list (selector
AuthorizationPolicies of their namespace and of the root namespace, then what PeerAuthentication resolves to for
them). Waypoints are indexed once, before the services, and every Service, ServiceEntry host and workload gets the
waypoint its labels (or its namespace's) bind it to; the routes come last, over the bound services
(:mod:`~ambit.controlplane.translate.routes`), and each waypoint's config then gets the targetRefs
AuthorizationPolicies bound to it, with their ``WaypointAccepted`` status
(:mod:`~ambit.controlplane.translate.waypoint_policies`).

The output is deterministic: workloads are ordered by uid, services by namespace then hostname, policies and
statuses by key, each workload's policy keys sorted, skips sorted, and equal inputs give equal outputs, so a writer
can compare renderings to skip rewriting an unchanged file.

Modules: ``workloads`` (a Pod becomes a Workload), ``pod_workloads`` (the pods' workloads kept between calls and
patched by the pods that changed), ``services`` (a Service becomes a Service), ``serviceentries`` (a
ServiceEntry becomes Services and endpoint Workloads), ``workloadentries`` (a WorkloadEntry becomes a Workload),
``endpointslices`` (endpoints added to a Service's EndpointSlices by hand become Workloads),
``index`` (which services select which endpoints, on which ports), ``stage_memo`` (which stages a translation told
what changed takes from the previous one), ``policy_side``, ``service_side`` and ``gateway_side`` (those stages),
``policies`` (an AuthorizationPolicy becomes a Policy and a status), ``peerauth`` (PeerAuthentications become DENY
policies), ``nodes`` (a Node's labels become its pods' locality), ``waypoints`` (Gateways become waypoints,
labels bind to them), ``routes`` and ``routerules``
(Gateway API routes become waypoint route tables), ``virtualservices`` (VirtualServices join those tables),
``requestauth`` (RequestAuthentications attached by ``targetRefs`` join their waypoints' configs),
``destinationrules`` (the DestinationRule each waypoint applies to each Service it serves, subsets resolved to
workload uids), ``telemetry`` (Telemetries become each waypoint's metric overrides per destination service),
``istio_gateways`` (Istio Gateways and their VirtualServices become the configs of the gateway pods they select),
``envoyfilters`` (the EnvoyFilters a waypoint takes become the header edits and HTTP/2 backends it honours, the
rest notes the control plane logs),
``protocols`` (a port's application protocol), ``skips`` (what was left out).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ambit.controlplane.translate.backendtls import BackendTlsPolicyStatus, with_gateway_client_certificate
from ambit.controlplane.translate.destinationrules import destination_policies
from ambit.controlplane.translate.discovery import EVERY_NAMESPACE, DiscoveryFilter
from ambit.controlplane.translate.endpointslices import SliceMemo, endpoint_slice_workloads, gives_workloads
from ambit.controlplane.translate.envoyfilters import PatchNote
from ambit.controlplane.translate.gateway_side import GatewaySide, gateway_side
from ambit.controlplane.translate.index import SERVICE_NAME_LABEL, SelectionMemo, ServiceIndex
from ambit.controlplane.translate.ingress import merge_route_status
from ambit.controlplane.translate.meshconfig import MESH_CONFIG_MAP, MeshConfigMemo, mesh_config_of
from ambit.controlplane.translate.nodes import node_localities
from ambit.controlplane.translate.pod_workloads import Changes, PodEntry, PodWorkloads
from ambit.controlplane.translate.policies import DEFAULT_ROOT_NAMESPACE, PolicyStatus
from ambit.controlplane.translate.policy_side import PolicyKeys, PolicyMemo, PolicySide, policy_side
from ambit.controlplane.translate.routes import RouteStatus
from ambit.controlplane.translate.service_side import ServiceMemo, ServiceSide, service_side
from ambit.controlplane.translate.serviceentries import selections, service_entry_workloads
from ambit.controlplane.translate.skips import SkipMemory, Skipped
from ambit.controlplane.translate.stage_memo import POD_SIDE, POLICY_KINDS, ChangedKinds, StageMemo
from ambit.controlplane.translate.waypoints import WaypointIndex, object_labels
from ambit.controlplane.translate.workloadentries import translate_workload_entry
from ambit.controlplane.translate.workloads import translate_pod
from ambit.model.ingress import GatewayConfig
from ambit.model.localconfig import LocalConfig
from ambit.model.locality_lb import MESH_DEFAULT as MESH_LOCALITY
from ambit.model.routes import WaypointConfig
from ambit.model.workload import Locality, Workload

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


__all__ = [
    "DEFAULT_ROOT_NAMESPACE",
    "Changes",
    "PolicyMemo",
    "PolicyStatus",
    "RouteStatus",
    "SkipMemory",
    "Skipped",
    "Translation",
    "TranslationMemo",
    "WorkloadChanges",
    "translate",
    "translate_all",
]


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


def translate_all(
    pods: Iterable[Mapping[str, Any]],
    services: Iterable[Mapping[str, Any]],
    endpoint_slices: Iterable[Mapping[str, Any]],
    namespaces: Iterable[Mapping[str, Any]],
    *,
    service_entries: Iterable[Mapping[str, Any]] = (),
    workload_entries: Iterable[Mapping[str, Any]] = (),
    authorization_policies: Iterable[Mapping[str, Any]] = (),
    peer_authentications: Iterable[Mapping[str, Any]] = (),
    nodes: Iterable[Mapping[str, Any]] = (),
    gateways: Iterable[Mapping[str, Any]] = (),
    gateway_classes: Iterable[Mapping[str, Any]] = (),
    http_routes: Iterable[Mapping[str, Any]] = (),
    grpc_routes: Iterable[Mapping[str, Any]] = (),
    tcp_routes: Iterable[Mapping[str, Any]] = (),
    tls_routes: Iterable[Mapping[str, Any]] = (),
    reference_grants: Iterable[Mapping[str, Any]] = (),
    virtual_services: Iterable[Mapping[str, Any]] = (),
    istio_gateways: Iterable[Mapping[str, Any]] = (),
    request_authentications: Iterable[Mapping[str, Any]] = (),
    destination_rules: Iterable[Mapping[str, Any]] = (),
    secrets: Iterable[Mapping[str, Any]] = (),
    telemetries: Iterable[Mapping[str, Any]] = (),
    backend_tls_policies: Iterable[Mapping[str, Any]] = (),
    listener_sets: Iterable[tuple[tuple[str, str], Mapping[str, Any]]] = (),
    config_maps: Iterable[Mapping[str, Any]] = (),
    envoy_filters: Iterable[Mapping[str, Any]] = (),
    proxy_version: str = "",
    cluster_id: str = "Kubernetes",
    trust_domain: str = "cluster.local",
    domain: str = "cluster.local",
    root_namespace: str = DEFAULT_ROOT_NAMESPACE,
    enable_dry_run: bool = False,
    policy_memo: PolicyMemo | None = None,
    translation_memo: TranslationMemo | None = None,
    changed: Changes | None = None,
) -> Translation:
    """The workloads, services and policies the node proxies should know, policy status, and the problems found.

    ``policy_memo``, when given, keeps each AuthorizationPolicy's translation by uid and resourceVersion between
    calls (the caller owns it and passes the same one each time), so only changed policies are translated again;
    ``translation_memo`` does the same for pods and Services (:class:`TranslationMemo`). ``changed`` names the
    objects that changed since the previous call through the same ``translation_memo`` (``(kind plural,
    "namespace/name")`` → the object now, None when deleted; None: not known): while the pods' context holds, only
    the changed pods are translated and the other pods' workloads are taken from the memo as they are
    (:mod:`~ambit.controlplane.translate.pod_workloads` rule 2), and each stage whose kinds of objects did not
    change (the policies, the Services with their waypoints and routes, the gateways, the service index, the
    hand-added and ServiceEntry endpoints) is taken from the memo as it is
    (:mod:`~ambit.controlplane.translate.stage_memo`). The output is the same either way.
    """
    skips: list[Skipped] = []
    config_maps = list(config_maps)
    mesh = mesh_config_of(
        config_maps,
        namespace=root_namespace,
        memo=translation_memo.mesh if translation_memo is not None else None,
        skips=skips,
    )
    namespace_list = list(namespaces)
    seen = DiscoveryFilter.build(namespace_list, mesh, root_namespace=root_namespace)
    pods, services, endpoint_slices = seen.keep(pods), seen.keep(services), seen.keep(endpoint_slices)
    service_entries, workload_entries = seen.keep(service_entries), seen.keep(workload_entries)
    authorization_policies, peer_authentications = seen.keep(authorization_policies), seen.keep(peer_authentications)
    request_authentications, telemetries = seen.keep(request_authentications), seen.keep(telemetries)
    destination_rules, virtual_services = seen.keep(destination_rules), seen.keep(virtual_services)
    gateways, istio_gateways = seen.keep(gateways), seen.keep(istio_gateways)
    http_routes, grpc_routes = seen.keep(http_routes), seen.keep(grpc_routes)
    tcp_routes, tls_routes, reference_grants = seen.keep(tcp_routes), seen.keep(tls_routes), seen.keep(reference_grants)
    backend_tls_policies, secrets = seen.keep(backend_tls_policies), seen.keep(secrets)
    config_maps = seen.keep(config_maps)  # after the mesh config was read: the rest are credentials
    envoy_filters = seen.keep(envoy_filters)
    listener_sets = [(origin, obj) for origin, obj in listener_sets if seen.admits(obj)]
    stages = translation_memo.stages if translation_memo is not None else StageMemos()
    known = ChangedKinds.of(changed if translation_memo is not None and translation_memo.complete else None)
    read = stages.services.value.config_maps if stages.services.value is not None else None
    if read is not None:  # stage memo rule 9: a ConfigMap nothing read is no change
        mesh_key = f"{root_namespace}/{MESH_CONFIG_MAP}"
        known = known.ignoring("configmaps", lambda key: key != mesh_key and not read.was_read(key))
    if translation_memo is not None:
        translation_memo.complete = False
    policy_objects = list(authorization_policies)
    policy_settings = (root_namespace, enable_dry_run)
    policy = stages.policies.find(policy_settings, known.none_of(POLICY_KINDS))
    if policy is None:
        policy = stages.policies.keep(
            policy_settings,
            policy_side(
                policy_objects,
                peer_authentications,
                root_namespace=root_namespace,
                enable_dry_run=enable_dry_run,
                memo=policy_memo,
            ),
        )
    skips.extend(policy.skips)
    keys = policy.keys
    service_list = list(services)
    service_settings = (domain, cluster_id, trust_domain, root_namespace)
    side = stages.services.find(service_settings, known.only(POD_SIDE))
    if side is None:
        remembered_services: ServiceMemo = {}
        side = stages.services.keep(
            service_settings,
            service_side(
                namespaces=namespace_list,
                mesh=mesh,
                services=service_list,
                service_entries=service_entries,
                authorization_policies=policy_objects,
                gateways=gateways,
                gateway_classes=list(gateway_classes),
                http_routes=http_routes,
                grpc_routes=grpc_routes,
                tcp_routes=tcp_routes,
                tls_routes=tls_routes,
                reference_grants=reference_grants,
                virtual_services=virtual_services,
                request_authentications=request_authentications,
                telemetries=telemetries,
                secrets=secrets,
                config_maps=config_maps,
                backend_tls_policies=backend_tls_policies,
                destination_rules=destination_rules,
                listener_sets=listener_sets,
                domain=domain,
                root_namespace=root_namespace,
                known=translation_memo.services if translation_memo is not None else {},
                remembered=remembered_services,
            ),
        )
        if translation_memo is not None:
            translation_memo.services = remembered_services
    skips.extend(side.skips)
    network, waypoints = side.network, side.waypoints
    gateway_settings = (proxy_version,)
    gateway = stages.gateways.find(
        gateway_settings,
        stages.services.reused
        and (
            (not istio_gateways and not side.manual_gateways) or not any(kind == "pods" for kind in known.kinds or ())
        ),
    )
    if gateway is None:
        gateway = stages.gateways.keep(
            gateway_settings,
            gateway_side(
                side,
                pods=pods,
                istio_gateways=istio_gateways,
                virtual_services=virtual_services,
                services=service_list,
                authorization_policies=policy_objects,
                envoy_filters=envoy_filters,
                mesh=mesh,
                domain=domain,
                root_namespace=root_namespace,
                proxy_version=proxy_version,
            ),
        )
    skips.extend(gateway.skips)
    slice_list = list(endpoint_slices)
    index = _service_index(stages, known, side, service_list, slice_list, domain, translation_memo)
    localities = node_localities(nodes)
    context = (index, network, localities, keys, waypoints, cluster_id, trust_domain)
    pod_state = translation_memo.pods if translation_memo is not None else PodWorkloads()

    def pod_entry(pod: Mapping[str, Any]) -> PodEntry:
        return _pod_workload(pod, index, keys, waypoints, cluster_id, trust_domain, network, localities)

    if known.changed is not None and pod_state.can_patch(context, seen, known.changed):
        pod_state.patch(known.changed, pod_entry)
    else:
        pod_state.build(pods, context, seen, pod_entry)
    skips.extend(pod_state.all_skips())
    # The workloads that are not pods', in the order they are made, and their labels by uid (over the pods' of an
    # equal uid).
    workloads: list[Workload] = []
    workload_labels: dict[str, Mapping[str, str]] = {}
    for wle in workload_entries:
        w = translate_workload_entry(
            wle, index, cluster_id=cluster_id, trust_domain=trust_domain, network=network, skips=skips
        )
        if w is not None:
            meta, spec = wle.get("metadata") or {}, wle.get("spec") or {}
            labels = {**(meta.get("labels") or {}), **(spec.get("labels") or {})}
            workload_labels[w.uid] = {str(k): str(v) for k, v in labels.items()}
            waypoint = waypoints.find_for_workload(w.namespace, object_labels(wle)).address
            workloads.append(replace(w, authorization_policies=keys.find(w.namespace, labels), waypoint=waypoint))
    slice_workloads, slice_skips = _slice_workloads(
        stages, known, side, service_list, slice_list, domain, cluster_id, trust_domain, translation_memo
    )
    workloads.extend(slice_workloads)
    skips.extend(slice_skips)
    entry_settings = (cluster_id, trust_domain)
    entry_made = stages.entry_workloads.find(entry_settings, stages.policies.reused and stages.services.reused)
    if entry_made is None:
        entry_skips: list[Skipped] = []
        entry_made = stages.entry_workloads.keep(
            entry_settings,
            (
                tuple(
                    made
                    for entry in side.entries
                    for made in service_entry_workloads(
                        entry,
                        cluster_id=cluster_id,
                        trust_domain=trust_domain,
                        network=network,
                        skips=entry_skips,
                        policy_keys=keys.find,
                        waypoint_of=lambda namespace, labels: waypoints.find_for_workload(namespace, labels).address,
                    )
                ),
                tuple(entry_skips),
            ),
        )
    for w, endpoint_labels in entry_made[0]:
        workload_labels[w.uid] = endpoint_labels  # DestinationRule subsets select inline endpoints by these
        workloads.append(w)
    skips.extend(entry_made[1])
    rule_index = side.rule_index
    all_workloads = pod_state.workloads_with(workloads)
    workload_changes = None
    if translation_memo is not None:
        workload_changes = _workload_changes(translation_memo, pod_state.changed_uids, workloads)
        translation_memo.workloads, translation_memo.other_workloads = all_workloads, tuple(workloads)
    waypoint_configs, gateway_configs = gateway.waypoint_configs, gateway.gateway_configs
    if rule_index.has_rules:
        # Each service's (uid, labels) of its workloads, for DestinationRule subsets (a set of uids each): read
        # only where a rule applies, so only built when there is one.
        members: dict[str, list[tuple[str, Mapping[str, str]]]] = {}
        pod_labels = pod_state.labels
        for w in all_workloads:
            found = workload_labels.get(w.uid)
            member_labels = pod_labels.get(w.uid, {}) if found is None else found
            for key in w.services:
                members.setdefault(key, []).append((w.uid, member_labels))
        by_key = side.by_key
        certificates = side.ingress.backend_certificates
        gateway_configs = tuple(
            replace(
                c,
                destination_rules=with_gateway_client_certificate(
                    destination_policies(
                        rule_index,
                        c.gateway.partition("/")[0],
                        [by_key[k] for k in c.backend_keys() if k in by_key],
                        members,
                        gateway.gateway_labels.get(c.gateway, {}),
                    ),
                    certificates.get(c.gateway),
                ),
            )
            for c in gateway_configs
        )
        waypoint_configs = tuple(
            replace(
                c,
                destination_rules=destination_policies(
                    rule_index, c.waypoint.partition("/")[0], side.served.get(c.waypoint, ()), members
                ),
            )
            for c in waypoint_configs
        )
    if mesh.locality_lb != MESH_LOCALITY:  # the mesh config's localityLbSetting, for the rules that state none
        waypoint_configs = tuple(replace(c, mesh_locality=mesh.locality_lb) for c in waypoint_configs)
        gateway_configs = tuple(replace(c, mesh_locality=mesh.locality_lb) for c in gateway_configs)
    translation = Translation(
        config=LocalConfig(workloads=all_workloads, services=side.sorted_services, policies=policy.policies),
        skipped=tuple(sorted(set(skips))),
        policy_status=policy.statuses,
        service_status=side.service_status,
        service_entry_status=side.entry_status,
        waypoint_configs=waypoint_configs,
        route_status=merge_route_status(side.routes.status, side.ingress.status),
        waypoint_accounts=side.routes.accounts,
        gateway_configs=gateway_configs,
        gateway_accounts=gateway.gateway_accounts,
        waypoint_policy_status=tuple(
            sorted((t.status for t in side.waypoint_policies if t.status is not None), key=lambda s: s.key)
        ),
        backend_tls_status=side.backend_tls.status,
        discovery=seen,
        envoy_filter_notes=gateway.envoy_filter_notes,
        workload_changes=workload_changes,
    )
    if translation_memo is not None:
        translation_memo.complete = True
    return translation


def _slices_untouched(known: ChangedKinds, used: Collection[str], matters: Callable[[Mapping[str, Any]], bool]) -> bool:
    """Whether no changed EndpointSlice is one a stage used last time (``used``) or one that ``matters`` to it now."""
    return not any(key in used or (eps is not None and matters(eps)) for key, eps in known.objects("endpointslices"))


def _service_index(
    stages: StageMemos,
    known: ChangedKinds,
    side: ServiceSide,
    services: list[Mapping[str, Any]],
    slices: list[Mapping[str, Any]],
    domain: str,
    translation_memo: TranslationMemo | None,
) -> ServiceIndex:
    """The service index, the previous call's while the slices it reads did not change (:mod:`~ambit.controlplane.
    translate.stage_memo` rule 6)."""
    previous = stages.index.value
    unchanged = (
        stages.services.reused
        and previous is not None
        and _slices_untouched(known, previous[1], lambda eps: _slice_owner(eps) in side.selectorless)
    )
    found = stages.index.find(domain, unchanged)
    if found is not None:
        return found[0]
    index = ServiceIndex.build(
        services,
        slices,
        domain=domain,
        extra=selections(side.entries),
        memo=translation_memo.selections if translation_memo is not None else None,
    )
    read_now = frozenset(
        _object_key(eps) for eps in slices if side.selectorless and _slice_owner(eps) in side.selectorless
    )
    return stages.index.keep(domain, (index, read_now))[0]


def _slice_workloads(
    stages: StageMemos,
    known: ChangedKinds,
    side: ServiceSide,
    services: list[Mapping[str, Any]],
    slices: list[Mapping[str, Any]],
    domain: str,
    cluster_id: str,
    trust_domain: str,
    translation_memo: TranslationMemo | None,
) -> tuple[tuple[Workload, ...], tuple[Skipped, ...]]:
    """The hand-added endpoints' workloads and skips, the previous call's while no changed slice gives or gave any
    (:mod:`~ambit.controlplane.translate.stage_memo` rule 7)."""
    previous = stages.slices.value
    unchanged = (
        stages.services.reused and previous is not None and _slices_untouched(known, previous[2], gives_workloads)
    )
    settings = (domain, cluster_id, trust_domain)
    found = stages.slices.find(settings, unchanged)
    if found is not None:
        return found[0], found[1]
    own: list[Skipped] = []
    made = tuple(
        endpoint_slice_workloads(
            slices,
            services,
            domain=domain,
            cluster_id=cluster_id,
            trust_domain=trust_domain,
            network=side.network,
            skips=own,
            memo=translation_memo.slices if translation_memo is not None else None,
        )
    )
    giving_now = frozenset(_object_key(eps) for eps in slices if gives_workloads(eps))
    kept = stages.slices.keep(settings, (made, tuple(own), giving_now))
    return kept[0], kept[1]


def _slice_owner(eps: Mapping[str, Any]) -> tuple[str, str]:
    meta = eps.get("metadata") or {}
    return (str(meta.get("namespace", "")), str((meta.get("labels") or {}).get(SERVICE_NAME_LABEL) or ""))


def _workload_changes(
    memo: TranslationMemo, pod_changes: set[str] | None, others: list[Workload]
) -> WorkloadChanges | None:
    """The changes since the memo's previous workloads: the pods' (when patched), and every uid of the other
    workloads (not pods') unless they are equal, in order, to the previous call's."""
    if pod_changes is None or memo.workloads is None:
        return None
    uids = set(pod_changes)
    previous = memo.other_workloads
    if len(previous) != len(others) or any(a is not b and a != b for a, b in zip(previous, others, strict=True)):
        uids.update(w.uid for w in previous)
        uids.update(w.uid for w in others)
    return WorkloadChanges(memo.workloads, frozenset(uids))


def _pod_workload(
    pod: Mapping[str, Any],
    index: ServiceIndex,
    keys: PolicyKeys,
    waypoints: WaypointIndex,
    cluster_id: str,
    trust_domain: str,
    network: str,
    localities: Mapping[str, Locality],
) -> PodEntry:
    """One pod's finished workload (or None), its labels and what had to be left out of it."""
    own_skips: list[Skipped] = []
    w = translate_pod(
        pod,
        index,
        cluster_id=cluster_id,
        trust_domain=trust_domain,
        network=network,
        skips=own_skips,
        localities=localities,
    )
    if w is None:
        return None, {}, tuple(own_skips)
    labels = (pod.get("metadata") or {}).get("labels") or {}
    pod_labels = object_labels(pod)
    waypoint = waypoints.find_for_workload(w.namespace, pod_labels, pod=True).address
    w = replace(
        w,
        authorization_policies=keys.find(w.namespace, labels),
        waypoint=waypoint,
        application_tunnel=waypoints.find_application_tunnel(w.namespace, pod_labels),
    )
    return w, pod_labels, tuple(own_skips)


def _object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def translate(
    pods: Iterable[Mapping[str, Any]],
    services: Iterable[Mapping[str, Any]],
    endpoint_slices: Iterable[Mapping[str, Any]],
    namespaces: Iterable[Mapping[str, Any]],
    *,
    service_entries: Iterable[Mapping[str, Any]] = (),
    workload_entries: Iterable[Mapping[str, Any]] = (),
    authorization_policies: Iterable[Mapping[str, Any]] = (),
    peer_authentications: Iterable[Mapping[str, Any]] = (),
    nodes: Iterable[Mapping[str, Any]] = (),
    gateways: Iterable[Mapping[str, Any]] = (),
    gateway_classes: Iterable[Mapping[str, Any]] = (),
    cluster_id: str = "Kubernetes",
    trust_domain: str = "cluster.local",
    domain: str = "cluster.local",
    root_namespace: str = DEFAULT_ROOT_NAMESPACE,
    enable_dry_run: bool = False,
) -> LocalConfig:
    """:func:`translate_all` without the problems."""
    return translate_all(
        pods,
        services,
        endpoint_slices,
        namespaces,
        service_entries=service_entries,
        workload_entries=workload_entries,
        authorization_policies=authorization_policies,
        peer_authentications=peer_authentications,
        nodes=nodes,
        gateways=gateways,
        gateway_classes=gateway_classes,
        cluster_id=cluster_id,
        trust_domain=trust_domain,
        domain=domain,
        root_namespace=root_namespace,
        enable_dry_run=enable_dry_run,
    ).config
