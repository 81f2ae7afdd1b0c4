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
``index`` (which services select which endpoints, on which ports), ``policies`` (an AuthorizationPolicy becomes a
Policy and a status), ``peerauth`` (PeerAuthentications become DENY policies), ``nodes`` (a Node's labels become its
pods' locality), ``waypoints`` (Gateways become waypoints, labels bind to them), ``routes`` and ``routerules``
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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ambit.controlplane.translate.backendtls import (
    CONFIG_MAP_CREDENTIAL,
    BackendTlsPolicyStatus,
    config_map_credential,
    translate_backend_tls,
    with_gateway_client_certificate,
)
from ambit.controlplane.translate.destinationrules import (
    DestinationRuleIndex,
    destination_policies,
    parse_destination_rules,
)
from ambit.controlplane.translate.discovery import EVERY_NAMESPACE, DiscoveryFilter
from ambit.controlplane.translate.endpointslices import SliceMemo, endpoint_slice_workloads
from ambit.controlplane.translate.envoyfilter_routes import merge_routes
from ambit.controlplane.translate.envoyfilters import IngressProxy, PatchNote, translate_envoy_filters
from ambit.controlplane.translate.gateway_policies import (
    IngressPods,
    gateway_authorization_policies,
    gateway_request_authentications,
)
from ambit.controlplane.translate.gateway_topology import gateway_forward_client_cert, gateway_trusted_proxies
from ambit.controlplane.translate.index import SelectionMemo, ServiceIndex
from ambit.controlplane.translate.ingress import merge_route_status, translate_ingress
from ambit.controlplane.translate.istio_gateways import translate_istio_gateways
from ambit.controlplane.translate.listeners import is_ingress
from ambit.controlplane.translate.meshconfig import MeshConfigMemo, mesh_config_of
from ambit.controlplane.translate.nodes import node_localities
from ambit.controlplane.translate.peerauth import PeerAuthIndex
from ambit.controlplane.translate.pod_workloads import Changes, PodEntry, PodWorkloads
from ambit.controlplane.translate.policies import (
    DEFAULT_ROOT_NAMESPACE,
    PolicySelection,
    PolicyStatus,
    PolicyTranslation,
    translate_authorization_policy,
)
from ambit.controlplane.translate.requestauth import (
    RequestAuthTranslation,
    bind_to_waypoints,
    translate_request_authentication,
)
from ambit.controlplane.translate.routes import RouteStatus, translate_routes
from ambit.controlplane.translate.serviceentries import (
    canonical_owners,
    parse_service_entries,
    selections,
    service_entry_services,
    service_entry_workloads,
)
from ambit.controlplane.translate.services import service_network, translate_service
from ambit.controlplane.translate.skips import SkipMemory, Skipped
from ambit.controlplane.translate.telemetry import ServiceRef, translate_telemetry, waypoint_metrics
from ambit.controlplane.translate.virtualservices import translate_virtual_services
from ambit.controlplane.translate.visibility import visibility_status
from ambit.controlplane.translate.waypoint_policies import (
    ServiceTarget,
    TargetIndex,
    WaypointPolicyTranslation,
    policies_for,
    translate_selected_policy,
    translate_waypoint_policy,
)
from ambit.controlplane.translate.waypoints import (
    Binding,
    WaypointIndex,
    bound_status,
    missing_status,
    object_annotations,
    object_labels,
    races_first_connect,
)
from ambit.controlplane.translate.workloadentries import translate_workload_entry
from ambit.controlplane.translate.workloads import translate_pod
from ambit.model.envoyfilter import ProxyPatches
from ambit.model.ingress import ForwardClientCert, GatewayConfig
from ambit.model.localconfig import LocalConfig
from ambit.model.policy import Policy
from ambit.model.routes import WaypointConfig
from ambit.model.workload import Locality, Service, Visibility, Workload

PolicyMemo = dict[tuple[str, str, str, bool], tuple[PolicyTranslation, tuple[Skipped, ...]]]
"""(uid, resourceVersion, root namespace, dry run enabled) → an AuthorizationPolicy's translation and skips."""


@dataclass(slots=True)
class TranslationMemo:
    """Each pod's workload and each Service's translation between calls of :func:`translate_all`, so that a pod
    change re-translates that pod only.

    Rules: a Service's entry is keyed by (uid, resourceVersion, domain, network, the mesh config's
    ``defaultServiceExportTo``), all its translation reads. The pods' entries
    (:class:`~ambit.controlplane.translate.pod_workloads.PodWorkloads`) hold each pod's finished workload (services
    map, policy keys and waypoint included), its labels and its skips, by pod key; they are reused only while the
    ``context`` (everything else a pod's workload is made from: the service index, the network, the nodes'
    localities, the policy selections and PeerAuthentications, the waypoints, the cluster and trust domain) is equal,
    by value, to this call's; otherwise every pod is translated again. A pod without a uid or resourceVersion is
    translated on every call that walks all pods. When the caller names what changed (``changed``), only the changed
    pods are looked at. After each call the memo holds exactly that call's pods. ``mesh`` keeps the last good mesh
    config (:class:`~ambit.controlplane.translate.meshconfig.MeshConfigMemo`).
    """

    pods: PodWorkloads = field(default_factory=PodWorkloads)
    services: dict[tuple[str, str, str, str, str], tuple[Service | None, tuple[Skipped, ...]]] = field(
        default_factory=dict
    )
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


@dataclass(frozen=True, slots=True)
class _PolicyKeys:
    """Which policy keys a workload lists: selector policies by namespace (root ones everywhere), PeerAuthentication."""

    by_namespace: Mapping[str, tuple[PolicySelection, ...]]
    everywhere: tuple[PolicySelection, ...]
    peer: PeerAuthIndex

    def find(self, namespace: str, labels: Mapping[str, Any]) -> tuple[str, ...]:
        text_labels = {str(k): str(v) for k, v in labels.items()}
        keys = {
            s.key
            for s in (*self.by_namespace.get(namespace, ()), *self.everywhere)
            if s.selects(namespace, text_labels)
        }
        keys.update(self.peer.find_keys(namespace, text_labels))
        return tuple(sorted(keys))


def _with_trusted_proxies(patches: ProxyPatches, count: int | None) -> ProxyPatches:
    """The gateway's ``xff_num_trusted_hops``: an EnvoyFilter's merge, else ``numTrustedProxies``
    (:mod:`ambit.controlplane.translate.gateway_topology` rule 3)."""
    if patches.xff_trusted_hops is not None or not count:
        return patches
    return replace(patches, xff_trusted_hops=count)


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
    (:mod:`~ambit.controlplane.translate.pod_workloads` rule 2). The output is the same either way.
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
    export_default = mesh.default_service_export_to
    policies: list[Policy] = []
    statuses: list[PolicyStatus] = []
    by_namespace: dict[str, list[PolicySelection]] = {}
    everywhere: list[PolicySelection] = []
    fresh_memo: PolicyMemo = {}
    policy_objects = list(authorization_policies)
    for obj in policy_objects:
        meta = obj.get("metadata") or {}
        memo_key = (str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""), root_namespace, enable_dry_run)
        remembered = policy_memo.get(memo_key) if policy_memo is not None and all(memo_key[:2]) else None
        if remembered is None:
            own_skips: list[Skipped] = []
            result = translate_authorization_policy(
                obj, root_namespace=root_namespace, enable_dry_run=enable_dry_run, skips=own_skips
            )
            remembered = (result, tuple(own_skips))
        result, own = remembered
        skips.extend(own)
        if all(memo_key[:2]):
            fresh_memo[memo_key] = remembered
        if result.policy is not None:
            policies.append(result.policy)
        if result.status is not None:
            statuses.append(result.status)
        if result.selection is not None:
            target = (
                everywhere if result.selection.everywhere else by_namespace.setdefault(result.selection.namespace, [])
            )
            target.append(result.selection)
    if policy_memo is not None:
        policy_memo.clear()
        policy_memo.update(fresh_memo)
    peer = PeerAuthIndex.build(peer_authentications, root_namespace=root_namespace, skips=skips)
    policies.extend(peer.policies)
    keys = _PolicyKeys({ns: tuple(items) for ns, items in by_namespace.items()}, tuple(everywhere), peer)
    network = service_network(namespace_list)
    gateway_list = list(gateways)
    class_list = list(gateway_classes)
    waypoints = WaypointIndex.build(gateway_list, class_list, namespace_list, network=network)
    skips.extend(waypoints.problems)
    service_list = list(services)
    slice_list = list(endpoint_slices)
    translated: list[Service] = []
    service_status: list[PolicyStatus] = []
    bound: dict[str, str] = {}
    canaries: dict[str, str] = {}
    service_targets: dict[str, ServiceTarget] = {}
    known_services = translation_memo.services if translation_memo is not None else {}
    remembered_services: dict[tuple[str, str, str, str, str], tuple[Service | None, tuple[Skipped, ...]]] = {}
    for svc in service_list:
        svc_meta = svc.get("metadata") or {}
        svc_key = (
            str(svc_meta.get("uid") or ""),
            str(svc_meta.get("resourceVersion") or ""),
            domain,
            network,
            "\n".join(export_default) if export_default is not None else "",
        )
        svc_entry = known_services.get(svc_key)
        if svc_entry is None:
            svc_skips: list[Skipped] = []
            svc_entry = (
                translate_service(
                    svc, domain=domain, network=network, skips=svc_skips, default_export_to=export_default
                ),
                tuple(svc_skips),
            )
        if all(svc_key[:2]):
            remembered_services[svc_key] = svc_entry
        service, svc_own_skips = svc_entry
        skips.extend(svc_own_skips)
        if service is not None:
            binding = _service_binding(svc, waypoints, service_status)
            translated.append(_with_binding(service, binding, bound, canaries))
            service_targets[_object_key(svc)] = _service_target((service.key,), binding)
    k8s_services = list(translated)
    taken = {s.key for s in translated}
    entry_objects = list(service_entries)
    namespace_labels = {str((ns.get("metadata") or {}).get("name") or ""): object_labels(ns) for ns in namespace_list}
    entries = parse_service_entries(
        entry_objects, taken=taken, skips=skips, mesh=mesh, namespace_labels=namespace_labels
    )
    canonical = canonical_owners(entries, (s.hostname for s in translated))
    entry_status: list[PolicyStatus] = []
    entry_targets: dict[str, ServiceTarget] = {}
    racing: set[str] = set()
    dynamic: set[str] = set()
    for entry in entries:
        binding = _service_binding(
            entry.obj, waypoints, entry_status, namespace_only=entry.visibility is Visibility.NAMESPACE
        )
        if (missing := missing_status(entry.obj, binding)) is not None:
            entry_status.append(missing)
        if (applied := visibility_status(entry.obj, entry.visibility, entry.visibility_configured)) is not None:
            entry_status.append(applied)
        entry_services = [
            _with_binding(s, binding, bound, canaries)
            for s in service_entry_services(entry, network=network, canonical=canonical)
        ]
        translated.extend(entry_services)
        if races_first_connect(entry.obj):
            racing.update(s.key for s in entry_services)
        if entry.resolution.upper() == "DYNAMIC_DNS":
            dynamic.update(s.key for s in entry_services)
        entry_targets[_object_key(entry.obj)] = _service_target(tuple(s.key for s in entry_services), binding)
    ingress_pods = [IngressPods.of(g) for g in gateway_list if is_ingress(g)]
    targets = TargetIndex(
        waypoints=waypoints.declared,
        gateways=frozenset(p.key for p in ingress_pods),
        gateway_classes={_object_key(c).partition("/")[2]: _controller(c) for c in class_list},
        services=service_targets,
        service_entries=entry_targets,
    )
    waypoint_policies: list[WaypointPolicyTranslation] = [
        translate_waypoint_policy(obj, targets, root_namespace=root_namespace, skips=skips) for obj in policy_objects
    ]
    http_routes, reference_grants = list(http_routes), list(reference_grants)
    tcp_routes, tls_routes = list(tcp_routes), list(tls_routes)
    routes = translate_routes(
        http_routes=http_routes,
        grpc_routes=grpc_routes,
        tcp_routes=tcp_routes,
        tls_routes=tls_routes,
        reference_grants=reference_grants,
        k8s_services=k8s_services,
        entry_services=translated[len(k8s_services) :],
        bound=bound,
        canaries=canaries,
        waypoints=waypoints,
        gateways=gateway_list,
        virtual_services=translate_virtual_services(
            virtual_services,
            translated,
            bound,
            domain=domain,
            skips=skips,
            default_export_to=mesh.default_virtual_service_export_to,
        ),
    )
    authn_translations = [
        translate_request_authentication(obj, root_namespace=root_namespace, skips=skips)
        for obj in request_authentications
    ]
    authn = _request_authentications(
        authn_translations,
        {"Service": k8s_services, "ServiceEntry": translated[len(k8s_services) :]},
        bound,
        canaries,
        routes.configs,
    )
    authn = _telemetry(
        telemetries,
        {"Service": k8s_services, "ServiceEntry": translated[len(k8s_services) :]},
        bound,
        canaries,
        authn,
        root_namespace=root_namespace,
        skips=skips,
    )
    secret_table = {
        (str((s.get("metadata") or {}).get("namespace")), str((s.get("metadata") or {}).get("name"))): s
        for s in secrets
    }
    config_map_by_key = {
        (str((c.get("metadata") or {}).get("namespace")), str((c.get("metadata") or {}).get("name"))): c
        for c in config_maps
    }
    ingress = translate_ingress(
        find_config_map=lambda namespace, name: config_map_by_key.get((namespace, name)),
        gateways=gateway_list,
        http_routes=http_routes,
        grpc_routes=grpc_routes,
        tls_routes=tls_routes,
        tcp_routes=tcp_routes,
        k8s_services=k8s_services,
        find_secret=lambda namespace, name: secret_table.get((namespace, name)),
        reference_grants=reference_grants,
        namespace_labels={str((n.get("metadata") or {}).get("name")): object_labels(n) for n in namespace_list},
        listener_sets=listener_sets,
    )
    classic = translate_istio_gateways(
        gateways=istio_gateways,
        virtual_services=virtual_services,
        pods=pods,
        services=translated,
        service_objects=service_list,
        find_secret=lambda namespace, name: secret_table.get((namespace, name)),
        taken=frozenset(c.gateway for c in ingress.configs),
        domain=domain,
        skips=skips,
        default_export_to=mesh.default_virtual_service_export_to,
    )
    gateway_api_keys = {p.key for p in ingress_pods}
    ingress_pods.extend(g.as_ingress_pods() for g in classic.pods)
    gateway_authz = gateway_authorization_policies(
        ingress_pods,
        waypoint_policies,
        # Only ingress gateways enforce selector policies here: without one, translating every policy's L7 form
        # again on each translation was a fifth of its time at 500 policies (issue 22).
        [p for p in map(translate_selected_policy, policy_objects) if p is not None] if ingress_pods else [],
        root_namespace=root_namespace,
    )
    gateway_authn = gateway_request_authentications(ingress_pods, authn_translations, root_namespace=root_namespace)
    index = ServiceIndex.build(
        service_list,
        slice_list,
        domain=domain,
        extra=selections(entries),
        memo=translation_memo.selections if translation_memo is not None else None,
    )
    localities = node_localities(nodes)
    context = (index, network, localities, keys, waypoints, cluster_id, trust_domain)
    pod_state = translation_memo.pods if translation_memo is not None else PodWorkloads()

    def pod_entry(pod: Mapping[str, Any]) -> PodEntry:
        return _pod_workload(pod, index, keys, waypoints, cluster_id, trust_domain, network, localities)

    if changed is not None and pod_state.can_patch(context, seen, changed):
        pod_state.patch(changed, pod_entry)
    else:
        pod_state.build(pods, context, seen, pod_entry)
    skips.extend(pod_state.all_skips())
    if translation_memo is not None:
        translation_memo.services = remembered_services
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
    workloads.extend(
        endpoint_slice_workloads(
            slice_list,
            service_list,
            domain=domain,
            cluster_id=cluster_id,
            trust_domain=trust_domain,
            network=network,
            skips=skips,
            memo=translation_memo.slices if translation_memo is not None else None,
        )
    )
    for entry in entries:
        for w, endpoint_labels in service_entry_workloads(
            entry,
            cluster_id=cluster_id,
            trust_domain=trust_domain,
            network=network,
            skips=skips,
            policy_keys=keys.find,
            waypoint_of=lambda namespace, labels: waypoints.find_for_workload(namespace, labels).address,
        ):
            workload_labels[w.uid] = endpoint_labels  # DestinationRule subsets select inline endpoints by these
            workloads.append(w)
    backend_tls = translate_backend_tls(
        backend_tls_policies,
        service_list,
        entry_objects,
        domain=domain,
        skips=skips,
        config_maps=config_map_by_key,
        routes=[
            *(("HTTPRoute", r) for r in http_routes),
            *(("GRPCRoute", r) for r in grpc_routes),
            *(("TCPRoute", r) for r in tcp_routes),
            *(("TLSRoute", r) for r in tls_routes),
        ],
    )
    backend_rules = backend_tls.rules
    config_map_table = config_map_by_key

    def find_credential(namespace: str, name: str) -> Mapping[str, Any] | None:
        if name.startswith(CONFIG_MAP_CREDENTIAL):
            return config_map_credential(name, config_map_table, namespace)
        return secret_table.get((namespace, name))

    rule_index = DestinationRuleIndex(
        parse_destination_rules(
            destination_rules,
            domain=domain,
            skips=skips,
            find_secret=find_credential,
            default_export_to=mesh.default_destination_rule_export_to,
            generated=backend_rules,
        ),
        root_namespace=root_namespace,
    )
    all_workloads = pod_state.workloads_with(workloads)
    workload_changes = None
    if translation_memo is not None:
        workload_changes = _workload_changes(translation_memo, pod_state.changed_uids, workloads)
        translation_memo.workloads, translation_memo.other_workloads = all_workloads, tuple(workloads)
    members: dict[str, list[tuple[str, Mapping[str, str]]]] = {}
    if rule_index.has_rules:
        # Each service's (uid, labels) of its workloads, for DestinationRule subsets (a set of uids each): read
        # only where a rule applies, so only built when there is one.
        pod_labels = pod_state.labels
        for w in all_workloads:
            found = workload_labels.get(w.uid)
            member_labels = pod_labels.get(w.uid, {}) if found is None else found
            for key in w.services:
                members.setdefault(key, []).append((w.uid, member_labels))
    by_key = {s.key: s for s in translated}

    envoy = translate_envoy_filters(
        envoy_filters,
        (c.waypoint for c in authn),
        root_namespace=root_namespace,
        proxy_version=proxy_version,
        gateways=[IngressProxy(p.key, p.labels, p.key in gateway_api_keys) for p in ingress_pods],
    )
    gateway_labels = {p.key: p.labels for p in ingress_pods}
    default_trust = mesh.trusted_proxies
    trusted = {_object_key(g): gateway_trusted_proxies(g, default_trust) for g in gateway_list if is_ingress(g)}
    default_xfcc = mesh.forward_client_cert
    xfcc = {_object_key(g): gateway_forward_client_cert(g, default_xfcc) for g in gateway_list if is_ingress(g)}
    gateway_configs = tuple(
        replace(
            c,
            policies=gateway_authz.get(c.gateway, ()),
            request_authentications=gateway_authn.get(c.gateway, ()),
            destination_rules=with_gateway_client_certificate(
                destination_policies(
                    rule_index,
                    c.gateway.partition("/")[0],
                    [by_key[k] for k in c.backend_keys() if k in by_key],
                    members,
                    gateway_labels.get(c.gateway, {}),
                ),
                ingress.backend_certificates.get(c.gateway),
            ),
            envoy_patches=_with_trusted_proxies(envoy.for_gateway(c.gateway), trusted.get(c.gateway, default_trust)),
            forward_client_cert=xfcc.get(c.gateway, default_xfcc) or ForwardClientCert.SANITIZE_SET,
        )
        for c in (*ingress.configs, *classic.configs)
    )

    def served_by(waypoint: str) -> list[Service]:
        keys = {k for k, v in bound.items() if v == waypoint} | {k for k, v in canaries.items() if v == waypoint}
        return [by_key[k] for k in keys if k in by_key]

    return Translation(
        config=LocalConfig(
            workloads=all_workloads,
            services=tuple(sorted(translated, key=lambda s: (s.namespace, s.hostname))),
            policies=tuple(sorted({p.key: p for p in policies}.values(), key=lambda p: p.key)),
        ),
        skipped=tuple(sorted(set(skips))),
        policy_status=tuple(sorted(statuses, key=lambda s: s.key)),
        service_status=tuple(sorted(service_status, key=lambda s: s.key)),
        service_entry_status=tuple(sorted(entry_status, key=lambda s: s.key)),
        waypoint_configs=tuple(
            replace(
                c,
                policies=policies_for(waypoint_policies, c.waypoint),
                destination_rules=destination_policies(
                    rule_index, c.waypoint.partition("/")[0], served_by(c.waypoint), members
                ),
                race_first_connect=tuple(k for k in c.services if k in racing),
                dynamic_dns=tuple(k for k in c.services if k in dynamic),
                envoy_patches=envoy.for_waypoint(c.waypoint),
                tables=merge_routes(c.tables, envoy.route_merges_for(c.waypoint)),
            )
            for c in authn
        ),
        route_status=merge_route_status(routes.status, ingress.status),
        waypoint_accounts=routes.accounts,
        gateway_configs=gateway_configs,
        gateway_accounts=(*ingress.accounts, *classic.accounts),
        waypoint_policy_status=tuple(
            sorted((t.status for t in waypoint_policies if t.status is not None), key=lambda s: s.key)
        ),
        backend_tls_status=backend_tls.status,
        discovery=seen,
        envoy_filter_notes=envoy.notes,
        workload_changes=workload_changes,
    )


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
    keys: _PolicyKeys,
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


def _request_authentications(
    translations: list[RequestAuthTranslation],
    services: Mapping[str, Iterable[Service]],
    bound: Mapping[str, str],
    canaries: Mapping[str, str],
    configs: tuple[WaypointConfig, ...],
) -> tuple[WaypointConfig, ...]:
    """``configs`` with the RequestAuthentications attached to each waypoint by ``targetRefs``; ``services`` are
    the translated services by the kind of object they came from."""
    if not translations:
        return configs
    service_keys: dict[tuple[str, str, str], list[str]] = {}
    for kind, of_kind in services.items():
        for service in of_kind:
            service_keys.setdefault((kind, service.namespace, service.name), []).append(service.key)
    attached = bind_to_waypoints(
        translations,
        waypoints=[c.waypoint for c in configs],
        service_keys={k: tuple(v) for k, v in service_keys.items()},
        bound=bound,
        canaries=canaries,
    )
    return tuple(replace(c, request_authentications=attached.get(c.waypoint, ())) for c in configs)


def _telemetry(
    objects: Iterable[Mapping[str, Any]],
    services: Mapping[str, Iterable[Service]],
    bound: Mapping[str, str],
    canaries: Mapping[str, str],
    configs: tuple[WaypointConfig, ...],
    *,
    root_namespace: str,
    skips: list[Skipped],
) -> tuple[WaypointConfig, ...]:
    """``configs`` with the metric overrides of the Telemetries that reach each waypoint."""
    translations = [t for t in (translate_telemetry(obj, skips=skips) for obj in objects) if t is not None]
    if not translations:
        return configs
    refs = {s.key: ServiceRef(kind, s.namespace, s.name) for kind, of_kind in services.items() for s in of_kind}
    found = waypoint_metrics(
        translations,
        waypoints=[c.waypoint for c in configs],
        services=refs,
        bound=bound,
        canaries=canaries,
        root_namespace=root_namespace,
    )
    return tuple(replace(c, metrics=found.get(c.waypoint, ())) for c in configs)


def _object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def _controller(gateway_class: Mapping[str, Any]) -> str:
    spec = gateway_class.get("spec")
    name = spec.get("controllerName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) else ""


def _service_binding(
    obj: Mapping[str, Any], waypoints: WaypointIndex, statuses: list[PolicyStatus], *, namespace_only: bool = False
) -> Binding:
    """The binding of a Service or ServiceEntry; its ``WaypointBound`` condition, if any, goes to ``statuses``."""
    namespace = str((obj.get("metadata") or {}).get("namespace") or "")
    labels = object_labels(obj)
    binding = waypoints.find_for_service(namespace, labels, object_annotations(obj), namespace_only=namespace_only)
    status = bound_status(obj, binding, ingress_label=waypoints.ingress_label_present(namespace, labels))
    if status is not None:
        statuses.append(status)
    return binding


def _with_binding(service: Service, binding: Binding, bound: dict[str, str], canaries: dict[str, str]) -> Service:
    """``service`` with its waypoint and weighted set; ``bound`` learns the waypoint's key by service key,
    ``canaries`` the canary's."""
    if binding.waypoint is None:
        return service
    bound[service.key] = binding.waypoint.key
    if binding.canary is not None:
        canaries[service.key] = binding.canary.key
    return replace(
        service,
        waypoint=binding.address,
        ingress_use_waypoint=binding.ingress_use_waypoint,
        weighted_waypoints=binding.weighted,
    )


def _service_target(keys: tuple[str, ...], binding: Binding) -> ServiceTarget:
    waypoint, canary = binding.waypoint, binding.canary
    return ServiceTarget(keys, None if waypoint is None else waypoint.key, None if canary is None else canary.key)


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
