"""The service stage of a translation: Services, ServiceEntries, waypoints, routes and their policies.

Theory of operation: :func:`service_side` makes everything of a translation that no pod, EndpointSlice, Node or
WorkloadEntry takes part in: the Kubernetes Services (through the caller's per-Service memo) and the ServiceEntries'
services with their waypoint bindings and ``WaypointBound``/``WaypointMissing`` statuses, the waypoint index, the
targetRefs AuthorizationPolicies (:mod:`~ambit.controlplane.translate.waypoint_policies`), the Gateway API routes
and VirtualServices at the waypoints, the RequestAuthentications and Telemetries joined to their configs, the
ingress Gateways' listeners, the BackendTLSPolicies and the DestinationRule index. The result, :class:`ServiceSide`,
is one immutable value, so a translation whose changes name only the pod side's kinds takes the previous call's as
it is (:mod:`~ambit.controlplane.translate.stage_memo` rule 4); the pods' context then holds the same waypoint index
object, compared by identity.

Rules:

1. Each Kubernetes Service is translated from the Service alone (and the domain, the network, the mesh config's
   ``defaultServiceExportTo`` and its namespace's traffic distribution annotation): kept by uid and
   resourceVersion (with those) in ``known`` between calls; ``remembered`` holds exactly this call's after it.
2. Services are bound to waypoints first, then ServiceEntries (whose hosts may not take a Service's key); then the
   targetRefs policies, the routes (over the bound services), the RequestAuthentications and the Telemetries.
3. Everything read later per waypoint is indexed here once: the services each waypoint serves (bound or canary)
   and the services by key, so that the rest of the translation does not walk every Service per waypoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ambit.controlplane.translate.backendtls import (
    CONFIG_MAP_CREDENTIAL,
    BackendTlsTranslation,
    config_map_credential,
    translate_backend_tls,
)
from ambit.controlplane.translate.destinationrules import DestinationRuleIndex, parse_destination_rules
from ambit.controlplane.translate.fields import object_annotations, object_labels
from ambit.controlplane.translate.gateway_policies import IngressPods
from ambit.controlplane.translate.gateway_topology import gateway_forward_client_cert, gateway_trusted_proxies
from ambit.controlplane.translate.ingress import IngressTranslation, translate_ingress
from ambit.controlplane.translate.listeners import is_ingress
from ambit.controlplane.translate.manual_gateways import Requested, is_managed, requested_services
from ambit.controlplane.translate.meshconfig import MeshConfig
from ambit.controlplane.translate.policies import PolicyStatus
from ambit.controlplane.translate.requestauth import (
    RequestAuthTranslation,
    bind_to_waypoints,
    translate_request_authentication,
)
from ambit.controlplane.translate.routes import RouteTranslation, translate_routes
from ambit.controlplane.translate.serviceentries import (
    ServiceEntrySpec,
    canonical_owners,
    parse_service_entries,
    service_entry_services,
)
from ambit.controlplane.translate.services import service_network, translate_service
from ambit.controlplane.translate.skips import Skipped
from ambit.controlplane.translate.stage_memo import ConfigMapReads
from ambit.controlplane.translate.telemetry import ServiceRef, translate_telemetry, waypoint_metrics
from ambit.controlplane.translate.traffic_distribution import TRAFFIC_DISTRIBUTION_ANNOTATION
from ambit.controlplane.translate.virtualservices import translate_virtual_services
from ambit.controlplane.translate.visibility import visibility_status
from ambit.controlplane.translate.waypoint_policies import (
    ServiceTarget,
    TargetIndex,
    WaypointPolicyTranslation,
    translate_waypoint_policy,
)
from ambit.controlplane.translate.waypoint_status import bound_status, missing_status, races_first_connect
from ambit.controlplane.translate.waypoints import Binding, WaypointIndex
from ambit.model.ingress import ForwardClientCert
from ambit.model.routes import WaypointConfig
from ambit.model.workload import Service, Visibility

__all__ = ["ServiceMemo", "ServiceSide", "service_side"]

Obj = Mapping[str, Any]
ServiceMemo = dict[tuple[str, str, str, str, str, str], tuple[Service | None, tuple[Skipped, ...]]]
"""(uid, resourceVersion, domain, network, ``defaultServiceExportTo``, the namespace's traffic distribution
annotation) → a Service's translation and skips."""


@dataclass(frozen=True, slots=True)
class ServiceSide:
    """The service stage's value (what the rest of the translation reads of it)."""

    network: str
    waypoints: WaypointIndex
    translated: tuple[Service, ...]
    """The Kubernetes Services' services, then the ServiceEntries', in the order they were made."""
    k8s_count: int
    """How many of ``translated`` are Kubernetes Services'."""
    sorted_services: tuple[Service, ...]
    """``translated`` by namespace then hostname (the translation's output)."""
    by_key: Mapping[str, Service]
    served: Mapping[str, tuple[Service, ...]]
    """The services each waypoint serves, bound or as canary, by waypoint key (rule 3)."""
    service_status: tuple[PolicyStatus, ...]
    entry_status: tuple[PolicyStatus, ...]
    entries: tuple[ServiceEntrySpec, ...]
    racing: frozenset[str]
    dynamic: frozenset[str]
    waypoint_policies: tuple[WaypointPolicyTranslation, ...]
    routes: RouteTranslation
    configs: tuple[WaypointConfig, ...]
    """Each ready waypoint's routes with its RequestAuthentications and metric overrides."""
    authn_translations: tuple[RequestAuthTranslation, ...]
    secret_table: Mapping[tuple[str, str], Obj]
    ingress: IngressTranslation
    ingress_pods: tuple[IngressPods, ...]
    """The Gateway API ingress Gateways' pods (by the Gateways' labels)."""
    backend_tls: BackendTlsTranslation
    rule_index: DestinationRuleIndex
    trusted: Mapping[str, int | None]
    forward_client_cert: Mapping[str, ForwardClientCert | None]
    selectorless: frozenset[tuple[str, str]]
    """(namespace, name) of each Kubernetes Service without a selector: whose EndpointSlices the index reads."""
    skips: tuple[Skipped, ...]
    manual_gateways: tuple[tuple[str, Requested], ...] = ()
    """Gateway key → the Services it names, for each ingress Gateway deployed by hand
    (:mod:`~ambit.controlplane.translate.manual_gateways`): the gateway stage finds the pods behind them."""
    config_maps: ConfigMapReads | None = None
    """The ConfigMaps this stage looked up (:mod:`~ambit.controlplane.translate.stage_memo` rule 9)."""


def _object_key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def service_side(
    *,
    namespaces: list[Obj],
    mesh: MeshConfig,
    services: list[Obj],
    service_entries: list[Obj],
    authorization_policies: list[Obj],
    gateways: list[Obj],
    gateway_classes: list[Obj],
    http_routes: list[Obj],
    grpc_routes: list[Obj],
    tcp_routes: list[Obj],
    tls_routes: list[Obj],
    reference_grants: list[Obj],
    virtual_services: list[Obj],
    request_authentications: list[Obj],
    telemetries: list[Obj],
    secrets: list[Obj],
    config_maps: list[Obj],
    backend_tls_policies: list[Obj],
    destination_rules: list[Obj],
    listener_sets: list[tuple[tuple[str, str], Obj]],
    domain: str,
    root_namespace: str,
    known: ServiceMemo,
    remembered: ServiceMemo,
) -> ServiceSide:
    """The service stage (rules 1 to 3)."""
    skips: list[Skipped] = []
    export_default = mesh.default_service_export_to
    network = service_network(namespaces)
    waypoints = WaypointIndex.build(gateways, gateway_classes, namespaces, network=network)
    skips.extend(waypoints.problems)
    translated: list[Service] = []
    service_status: list[PolicyStatus] = []
    bound: dict[str, str] = {}
    canaries: dict[str, str] = {}
    service_targets: dict[str, ServiceTarget] = {}
    selectorless: set[tuple[str, str]] = set()
    exported = "\n".join(export_default) if export_default is not None else ""
    namespace_annotations = {
        str((ns.get("metadata") or {}).get("name") or ""): object_annotations(ns) for ns in namespaces
    }
    for svc in services:
        svc_meta = svc.get("metadata") or {}
        ns_annotations = namespace_annotations.get(str(svc_meta.get("namespace") or "")) or {}
        if not (svc.get("spec") or {}).get("selector"):
            selectorless.add((str(svc_meta.get("namespace", "")), str(svc_meta.get("name", ""))))
        svc_key = (
            str(svc_meta.get("uid") or ""),
            str(svc_meta.get("resourceVersion") or ""),
            domain,
            network,
            exported,
            ns_annotations.get(TRAFFIC_DISTRIBUTION_ANNOTATION, ""),
        )
        svc_entry = known.get(svc_key)
        if svc_entry is None:
            svc_skips: list[Skipped] = []
            svc_entry = (
                translate_service(
                    svc,
                    domain=domain,
                    network=network,
                    skips=svc_skips,
                    default_export_to=export_default,
                    namespace_annotations=ns_annotations,
                ),
                tuple(svc_skips),
            )
        if all(svc_key[:2]):
            remembered[svc_key] = svc_entry
        service, svc_own_skips = svc_entry
        skips.extend(svc_own_skips)
        if service is not None:
            binding = _service_binding(svc, waypoints, service_status)
            translated.append(_with_binding(service, binding, bound, canaries))
            service_targets[_object_key(svc)] = _service_target((service.key,), binding)
    k8s_services = list(translated)
    taken = {s.key for s in translated}
    namespace_labels = {str((ns.get("metadata") or {}).get("name") or ""): object_labels(ns) for ns in namespaces}
    entries = parse_service_entries(
        service_entries,
        taken=taken,
        skips=skips,
        mesh=mesh,
        namespace_labels=namespace_labels,
        namespace_annotations=namespace_annotations,
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
    entry_services_all = translated[len(k8s_services) :]
    ingress_pods = tuple(IngressPods.of(g) for g in gateways if is_ingress(g))
    targets = TargetIndex(
        waypoints=waypoints.declared,
        gateways=frozenset(p.key for p in ingress_pods),
        gateway_classes={_object_key(c).partition("/")[2]: _controller(c) for c in gateway_classes},
        services=service_targets,
        service_entries=entry_targets,
    )
    waypoint_policies = tuple(
        translate_waypoint_policy(
            obj, targets, root_namespace=root_namespace, skips=skips, providers=mesh.ext_authz_providers
        )
        for obj in authorization_policies
    )
    routes = translate_routes(
        http_routes=http_routes,
        grpc_routes=grpc_routes,
        tcp_routes=tcp_routes,
        tls_routes=tls_routes,
        reference_grants=reference_grants,
        k8s_services=k8s_services,
        entry_services=entry_services_all,
        bound=bound,
        canaries=canaries,
        waypoints=waypoints,
        gateways=gateways,
        virtual_services=translate_virtual_services(
            virtual_services,
            translated,
            bound,
            domain=domain,
            skips=skips,
            default_export_to=mesh.default_virtual_service_export_to,
            default_retry=mesh.default_http_retry,
        ),
        default_retry=mesh.default_http_retry,
    )
    authn_translations = [
        translate_request_authentication(obj, root_namespace=root_namespace, skips=skips)
        for obj in request_authentications
    ]
    by_kind = {"Service": k8s_services, "ServiceEntry": entry_services_all}
    configs = _request_authentications(authn_translations, by_kind, bound, canaries, routes.configs)
    configs = _telemetry(telemetries, by_kind, bound, canaries, configs, root_namespace=root_namespace, skips=skips)
    secret_table = {
        (str((s.get("metadata") or {}).get("namespace")), str((s.get("metadata") or {}).get("name"))): s
        for s in secrets
    }
    config_map_by_key = ConfigMapReads(
        {
            (str((c.get("metadata") or {}).get("namespace")), str((c.get("metadata") or {}).get("name"))): c
            for c in config_maps
        }
    )
    ingress = translate_ingress(
        find_config_map=lambda namespace, name: config_map_by_key.get((namespace, name)),
        gateways=gateways,
        http_routes=http_routes,
        grpc_routes=grpc_routes,
        tls_routes=tls_routes,
        tcp_routes=tcp_routes,
        k8s_services=k8s_services,
        find_secret=lambda namespace, name: secret_table.get((namespace, name)),
        reference_grants=reference_grants,
        namespace_labels=namespace_labels,
        listener_sets=listener_sets,
        default_retry=mesh.default_http_retry,
    )
    backend_tls = translate_backend_tls(
        backend_tls_policies,
        services,
        service_entries,
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

    def find_credential(namespace: str, name: str) -> Mapping[str, Any] | None:
        if name.startswith(CONFIG_MAP_CREDENTIAL):
            return config_map_credential(name, config_map_by_key, namespace)
        return secret_table.get((namespace, name))

    rule_index = DestinationRuleIndex(
        parse_destination_rules(
            destination_rules,
            domain=domain,
            skips=skips,
            find_secret=find_credential,
            default_export_to=mesh.default_destination_rule_export_to,
            generated=backend_tls.rules,
        ),
        root_namespace=root_namespace,
    )
    by_key = {s.key: s for s in translated}
    served: dict[str, set[str]] = {}
    for waypoint_of in (bound, canaries):
        for key, waypoint in waypoint_of.items():
            served.setdefault(waypoint, set()).add(key)
    ingress_gateways = [g for g in gateways if is_ingress(g)]
    return ServiceSide(
        config_maps=config_map_by_key,
        network=network,
        waypoints=waypoints,
        translated=tuple(translated),
        k8s_count=len(k8s_services),
        sorted_services=tuple(sorted(translated, key=lambda s: (s.namespace, s.hostname))),
        by_key=by_key,
        served={w: tuple(by_key[k] for k in keys if k in by_key) for w, keys in served.items()},
        service_status=tuple(sorted(service_status, key=lambda s: s.key)),
        entry_status=tuple(sorted(entry_status, key=lambda s: s.key)),
        entries=tuple(entries),
        racing=frozenset(racing),
        dynamic=frozenset(dynamic),
        waypoint_policies=waypoint_policies,
        routes=routes,
        configs=configs,
        authn_translations=tuple(authn_translations),
        secret_table=secret_table,
        ingress=ingress,
        ingress_pods=ingress_pods,
        backend_tls=backend_tls,
        rule_index=rule_index,
        trusted={_object_key(g): gateway_trusted_proxies(g, mesh.trusted_proxies) for g in ingress_gateways},
        forward_client_cert={
            _object_key(g): gateway_forward_client_cert(g, mesh.forward_client_cert) for g in ingress_gateways
        },
        selectorless=frozenset(selectorless),
        skips=tuple(skips),
        manual_gateways=tuple(
            (_object_key(g), requested_services(g, domain)) for g in ingress_gateways if not is_managed(g)
        ),
    )


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
    objects: Iterable[Obj],
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


def _controller(gateway_class: Obj) -> str:
    spec = gateway_class.get("spec")
    name = spec.get("controllerName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) else ""


def _service_binding(
    obj: Obj, waypoints: WaypointIndex, statuses: list[PolicyStatus], *, namespace_only: bool = False
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
