"""Gateway API routes → each waypoint's :class:`~ambit.model.routes.WaypointConfig`, and each route's status
(spec §1.4, §7.5, §10.3).

Theory of operation: :func:`translate_routes` takes the ``HTTPRoute``, ``GRPCRoute``, ``TCPRoute``, ``TLSRoute``
and ``ReferenceGrant`` objects, the translated services with the waypoint each is bound to (by
:mod:`ambit.controlplane.translate.waypoints`: this module reuses that binding, it does not bind again) and the
waypoint index. Each route is converted once (:mod:`ambit.controlplane.translate.routerules`); its ``parentRefs``
decide which destinations (a bound Service's port) it attaches to; each ready waypoint gets one
:class:`~ambit.model.routes.RouteTable` per port of each Service bound to it, holding the entries of every route
attached there, sorted by precedence. Pure: no I/O, deterministic output.

Rules:

1. Parents we own: a ``Service`` (group ``""``), a ``networking.istio.io`` ``ServiceEntry`` (GAMMA), or a
   ``Gateway`` of class ``istio-waypoint``. Other parents (another controller's Gateway, a Gateway that does not
   exist) are not ours: no status, no attachment.
2. A Service or ServiceEntry parent (namespace defaults to the route's): missing → ``Accepted`` False
   ``NoMatchingParent`` (istiod's message). Found → ``Accepted`` True; it attaches to the Service's ports (only
   ``port`` when the parentRef names one) if the Service is bound to a waypoint. A waypoint applies only routes in
   the Service's namespace or in the waypoint's own (istiod's ``getVirtualServiceForWaypoint``): any other
   *consumer* route (GAMMA scopes those to the route's namespace's clients, and a waypoint serves every client)
   is refused (``Accepted`` False ``NotAllowedByListeners``) rather than let one namespace reroute another's. A
   Service without a waypoint is programmed nowhere in ambient; the route is still ``Accepted`` and, as istiod
   writes it, the ``ResolvedWaypoints`` condition says so. A Service with a canary waypoint is programmed on both
   waypoints alike; only the primary's namespace counts as "the waypoint's own" (the tables are per Service, so a
   route from the canary's namespace would also apply at the primary: refused, as from any other namespace).
3. A waypoint Gateway parent: ``port`` other than 15008, or a ``sectionName`` that is not one of its listeners →
   ``NoMatchingParent``; a route namespace its HBONE listener's ``allowedRoutes`` does not admit →
   ``NotAllowedByListeners``. Accepted, it attaches to every destination of the waypoint that is in the route's
   namespace, or to all of them when the route is in the waypoint's own namespace (the waypoint owner's); with
   ``hostnames``, only to Services whose hostname one of them matches (exact, or ``*.`` suffix).
4. ``ResolvedRefs`` is True (``ResolvedRefs``) unless the conversion found problems: then False with the first
   problem's reason and every message joined with ``; `` (istiod reports route errors this way on each parent).
5. A table's HTTP entries are those of the HTTPRoutes and GRPCRoutes attached to it, each route once, sorted by
   :func:`~ambit.controlplane.translate.routerules.precedence`; its TCP backends those of the oldest attached
   TLSRoute that applies to the Service (then name, then namespace, as istiod orders configs), else of the oldest
   attached TCPRoute: TLS routes win over TCP routes, as Gateway API's GEP-1294 and istiod's waypoint say. A TLSRoute
   applies when it has no ``hostnames`` or its hostnames are exactly the Service's hostname (istiod's waypoint does
   not read the SNI, so it takes only a route whose SNI match could only be that host); one with other hostnames is
   still ``Accepted`` but routes nothing there. Its hostnames the union of the attached HTTP and gRPC routes'.
6. Every ready waypoint of class ``istio-waypoint`` gets a config, even with no Service bound (an empty one); a
   sandwich (a Gateway of another class that Services bind to) gets none, as its own gateway config serves it.
   Tables are ordered by service key then port. The config lists the key of every Service bound to it
   (``services``, sorted; a Service with no port has no table but is listed): the same destinations its tables
   are built for, so a waypoint that sees a Service listed also holds what was chosen for it here and in the
   policies (both read ``bound``/``canaries``).
7. A waypoint's service account (the only identity that may read its config) is the Gateway's
   ``gateway.istio.io/service-account`` annotation, else the Gateway's name, as istiod's deployment controller
   names it.
8. VirtualServices (:mod:`ambit.controlplane.translate.virtualservices`) join the same tables as istiod's waypoint
   merges them: the HTTP and gRPC routes of a destination form one block (sorted as rule 5 says, dated by the
   oldest of them, as istiod's merged VirtualService for them is), each VirtualService another (its rules in
   written order); blocks are concatenated oldest first (creation timestamp, then name, then namespace) and the
   first matching entry of the whole table wins. For connections, a TLS rule (TLSRoute or VirtualService ``tls``)
   wins over a TCP one, then the oldest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.translate.reference_grants import ReferenceGrants
from ambit.controlplane.translate.routerules import (
    BACKEND_NOT_FOUND,
    GATEWAY_GROUP,
    INVALID_DESTINATION,
    INVALID_KIND,
    ISTIO_NETWORKING,
    REF_NOT_PERMITTED,
    ConvertedRoute,
    convert_route,
)
from ambit.controlplane.translate.virtualservices import RouteBlock, VirtualServiceRoutes, route_block_order
from ambit.controlplane.translate.waypoint_gateways import Waypoint
from ambit.controlplane.translate.waypoints import WaypointIndex
from ambit.model.routes import ISTIO_RETRY, BackendService, HttpRetry, RouteTable, WaypointConfig, WeightedBackend
from ambit.model.workload import HBONE_MTLS_PORT, Service

__all__ = [
    "CONTROLLER_NAME",
    "RouteCondition",
    "RouteParentStatus",
    "RouteStatus",
    "RouteTranslation",
    "service_account",
    "translate_routes",
]

Obj = Mapping[str, Any]
CONTROLLER_NAME = "istio.io/gateway-controller"
SERVICE_ACCOUNT_ANNOTATION = "gateway.istio.io/service-account"
MISSING_LABEL = (
    "istio.io/use-waypoint label missing from parent and parent namespace; in ambient mode, route will not be respected"
)
_PARENT_KEYS = ("group", "kind", "namespace", "name", "sectionName", "port")


@dataclass(frozen=True, slots=True)
class RouteCondition:
    type: str
    status: bool
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class RouteParentStatus:
    """One entry of a route's ``status.parents`` that we own."""

    parent_ref: tuple[tuple[str, Any], ...]
    """The parentRef as the route wrote it (only Gateway API's keys), as sorted pairs."""
    conditions: tuple[RouteCondition, ...]

    def parent_ref_dict(self) -> dict[str, Any]:
        return dict(self.parent_ref)


@dataclass(frozen=True, slots=True)
class RouteStatus:
    """The parents we own of one route, with the generation the translation saw."""

    kind: str
    namespace: str
    name: str
    generation: int
    parents: tuple[RouteParentStatus, ...]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class RouteTranslation:
    configs: tuple[WaypointConfig, ...] = ()
    status: tuple[RouteStatus, ...] = ()
    accounts: tuple[tuple[str, str], ...] = ()
    """(waypoint key, its service account) for every ready waypoint (rule 7)."""


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _list(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _core(group: str) -> bool:
    return group in ("", "core")


@dataclass(frozen=True, slots=True)
class _Inputs:
    k8s_services: Mapping[tuple[str, str], Service]
    entry_services: Mapping[tuple[str, str], tuple[Service, ...]]
    by_hostname: Mapping[str, tuple[Service, ...]]
    bound: Mapping[str, str]
    waypoints: WaypointIndex
    listeners: Mapping[str, frozenset[str]]
    grants: ReferenceGrants

    def granted(self, route_kind: str, from_ns: str, to_ns: str, kind: str, name: str) -> bool:
        return self.grants.permits(
            from_group=GATEWAY_GROUP,
            from_kind=route_kind,
            from_namespace=from_ns,
            to_group="",
            to_kind=kind,
            to_namespace=to_ns,
            to_name=name,
        )

    def lookup_for(self, route_ns: str) -> Any:
        def lookup(group: str, kind: str, name: str, namespace: str, route_kind: str) -> BackendService | str:
            if _core(group) and kind == "Service":
                target = namespace or route_ns
                if target != route_ns and not self.granted(route_kind, route_ns, target, kind, name):
                    return REF_NOT_PERMITTED
                service = self.k8s_services.get((target, name))
                if service is None:
                    return BACKEND_NOT_FOUND
                return BackendService(service.namespace, service.hostname, 0)
            if group == ISTIO_NETWORKING and kind == "Hostname":
                if namespace:
                    return INVALID_DESTINATION
                found = sorted(self.by_hostname.get(name, ()), key=lambda s: (s.namespace != route_ns, s.namespace))
                if not found:
                    return BACKEND_NOT_FOUND
                return BackendService(found[0].namespace, found[0].hostname, 0)
            return INVALID_KIND

        return lookup


def _condition(kind: str, ok: bool, reason: str, message: str) -> RouteCondition:
    return RouteCondition(kind, ok, reason, message)


def _accepted(message: str = "Route was valid") -> RouteCondition:
    return _condition("Accepted", True, "Accepted", message)


def _refused(reason: str, message: str) -> RouteCondition:
    return _condition("Accepted", False, reason, message)


def _waypoints_resolved(message: str = "All waypoints resolved") -> RouteCondition:
    return _condition("ResolvedWaypoints", True, "ResolvedWaypoints", message)


def _hostname_matches(patterns: tuple[str, ...], hostname: str) -> bool:
    if not patterns:
        return True
    return any(p == hostname or (p.startswith("*.") and hostname.endswith(p[1:])) for p in patterns)


@dataclass(slots=True)
class _Attachments:
    """Destination (service key, port) → the routes attached there, by route key."""

    by_destination: dict[tuple[str, int], dict[str, ConvertedRoute]]

    def attach(self, service: Service, port: int | None, route: ConvertedRoute) -> None:
        for mapping in service.ports:
            if port is None or mapping.service_port == port:
                self.by_destination.setdefault((service.key, mapping.service_port), {})[route.key] = route


def _parent_status(
    ref: Obj, route: ConvertedRoute, inputs: _Inputs, attachments: _Attachments, destinations: dict[str, list[Service]]
) -> tuple[RouteCondition, RouteCondition] | None:
    """Accepted and ResolvedWaypoints for one parentRef, attaching the route on the way; None if not ours."""
    group = _text(ref.get("group")) if "group" in ref else GATEWAY_GROUP
    kind = _text(ref.get("kind")) or "Gateway"
    name = _text(ref.get("name"))
    namespace = _text(ref.get("namespace")) or route.namespace
    port = ref.get("port") if isinstance(ref.get("port"), int) else None
    if (_core(group) and kind == "Service") or (group == ISTIO_NETWORKING and kind == "ServiceEntry"):
        entry = kind == "ServiceEntry"
        services: tuple[Service, ...]
        if entry:
            services = inputs.entry_services.get((namespace, name), ())
        else:
            found = inputs.k8s_services.get((namespace, name))
            services = (found,) if found is not None else ()
        if not services:
            what = "service entry" if entry else "service"
            return _refused("NoMatchingParent", f'parent {what}: "{name}" not found'), _waypoints_resolved(
                "parent not found"
            )
        bound = [s for s in services if s.key in inputs.bound]
        if namespace != route.namespace:
            bound = [s for s in bound if inputs.bound[s.key].partition("/")[0] == route.namespace]
            if not bound:
                message = (
                    f'a {route.kind} in namespace "{route.namespace}" attached to {kind} {namespace}/{name} is a'
                    " consumer route; a waypoint applies only routes in the Service's namespace or its own"
                )
                return _refused("NotAllowedByListeners", message), _waypoints_resolved()
        for service in bound:
            attachments.attach(service, port, route)
        return _accepted(), _waypoints_resolved() if bound else _waypoints_resolved(MISSING_LABEL)
    if group != GATEWAY_GROUP or kind != "Gateway":
        return None
    key = f"{namespace}/{name}"
    if key not in inputs.waypoints.declared:
        return None
    if port is not None and port != HBONE_MTLS_PORT:
        return _refused("NoMatchingParent", f"port {port} not found"), _waypoints_resolved()
    section = _text(ref.get("sectionName"))
    if section and section not in inputs.listeners.get(key, frozenset()):
        return _refused("NoMatchingParent", f'sectionName "{section}" not found'), _waypoints_resolved()
    waypoint: Waypoint | None = inputs.waypoints.ready.get(key)
    if waypoint is None:
        return _accepted(), _waypoints_resolved(f'waypoint "{key}" is not ready')
    if not waypoint.admits(route.namespace, inputs.waypoints.namespace_labels.get(route.namespace, {})):
        message = f'{route.kind} in namespace "{route.namespace}" is not allowed by the listeners of waypoint {key}'
        return _refused("NotAllowedByListeners", message), _waypoints_resolved()
    for service in destinations.get(key, ()):
        if route.namespace not in (service.namespace, waypoint.namespace):
            continue
        if _hostname_matches(route.hostnames, service.hostname):
            attachments.attach(service, None, route)
    return _accepted(), _waypoints_resolved()


def _resolved_refs(route: ConvertedRoute) -> RouteCondition:
    if not route.problems:
        return _condition("ResolvedRefs", True, "ResolvedRefs", "All references resolved")
    message = "; ".join(dict.fromkeys(p.message for p in route.problems))
    return _condition("ResolvedRefs", False, route.problems[0].reason, message)


def _parent_ref(ref: Obj) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, ref[k]) for k in _PARENT_KEYS if isinstance(ref.get(k), str | int)))


def _listener_names(gateways: Iterable[Obj]) -> dict[str, frozenset[str]]:
    out: dict[str, frozenset[str]] = {}
    for gateway in gateways:
        spec = _mapping(gateway.get("spec"))
        names = frozenset(_text(listener.get("name")) for listener in _list(spec.get("listeners")))
        meta = _meta(gateway)
        out[f"{_text(meta.get('namespace'))}/{_text(meta.get('name'))}"] = names
    return out


def service_account(gateway: Obj) -> str:
    """The service account a waypoint Gateway's pods run as (rule 7)."""
    meta = _meta(gateway)
    annotation = _text(_mapping(meta.get("annotations")).get(SERVICE_ACCOUNT_ANNOTATION))
    return annotation or _text(meta.get("name"))


def translate_routes(
    *,
    http_routes: Iterable[Obj] = (),
    grpc_routes: Iterable[Obj] = (),
    tcp_routes: Iterable[Obj] = (),
    tls_routes: Iterable[Obj] = (),
    reference_grants: Iterable[Obj] = (),
    k8s_services: Iterable[Service] = (),
    entry_services: Iterable[Service] = (),
    bound: Mapping[str, str],
    canaries: Mapping[str, str] | None = None,
    waypoints: WaypointIndex,
    gateways: Iterable[Obj] = (),
    virtual_services: VirtualServiceRoutes | None = None,
    default_retry: HttpRetry = ISTIO_RETRY,
) -> RouteTranslation:
    """Each ready waypoint's config and each route's status (rules 1-8). ``bound`` maps a service key to the key
    of the waypoint it is bound to; ``canaries`` to its canary waypoint's, which gets the same tables;
    ``virtual_services`` what the VirtualServices give each destination (rule 8); ``default_retry`` the mesh
    config's ``defaultHttpRetryPolicy`` (a rule without retries, and each waypoint's default route)."""
    canaries = canaries or {}
    gateway_list = list(gateways)
    k8s = {(s.namespace, s.name): s for s in k8s_services}
    entries: dict[tuple[str, str], list[Service]] = {}
    by_hostname: dict[str, list[Service]] = {}
    for service in (*k8s.values(), *entry_services):
        by_hostname.setdefault(service.hostname, []).append(service)
    for service in entry_services:
        entries.setdefault((service.namespace, service.name), []).append(service)
    inputs = _Inputs(
        k8s,
        {k: tuple(v) for k, v in entries.items()},
        {k: tuple(v) for k, v in by_hostname.items()},
        bound,
        waypoints,
        _listener_names(gateway_list),
        ReferenceGrants.build(reference_grants),
    )
    destinations: dict[str, list[Service]] = {}
    for service in (s for services in inputs.by_hostname.values() for s in services):
        for waypoint_key in (bound.get(service.key), canaries.get(service.key)):
            if waypoint_key is not None:
                destinations.setdefault(waypoint_key, []).append(service)
    attachments = _Attachments({})
    statuses: list[RouteStatus] = []
    kinds = (("HTTPRoute", http_routes), ("GRPCRoute", grpc_routes), ("TCPRoute", tcp_routes), ("TLSRoute", tls_routes))
    for kind, objects in kinds:
        for obj in objects:
            meta = _meta(obj)
            namespace = _text(meta.get("namespace"))
            route = convert_route(kind, obj, inputs.lookup_for(namespace), default_retry)
            spec = _mapping(obj.get("spec"))
            parents: dict[tuple[tuple[str, Any], ...], RouteParentStatus] = {}
            for ref in _list(spec.get("parentRefs")):
                wire = _parent_ref(ref)
                if wire in parents:
                    continue
                conditions = _parent_status(ref, route, inputs, attachments, destinations)
                if conditions is None:
                    continue
                accepted, waypoints_resolved = conditions
                parents[wire] = RouteParentStatus(wire, (accepted, _resolved_refs(route), waypoints_resolved))
            if parents:
                generation = meta.get("generation")
                observed = generation if isinstance(generation, int) and not isinstance(generation, bool) else 0
                statuses.append(
                    RouteStatus(kind, namespace, _text(meta.get("name")), observed, tuple(parents.values()))
                )
    configs: list[WaypointConfig] = []
    served_here = sorted(key for key, waypoint in waypoints.ready.items() if not waypoint.sandwich)
    for key in served_here:
        served = sorted(destinations.get(key, ()), key=lambda s: s.key)
        configs.append(
            WaypointConfig(
                key,
                _tables(served, attachments, virtual_services, bound),
                xfcc_client_identity=waypoints.ready[key].xfcc_client_identity,
                services=tuple(dict.fromkeys(s.key for s in served)),
                default_retry=default_retry,
            )
        )
    accounts = {
        f"{_text(_meta(g).get('namespace'))}/{_text(_meta(g).get('name'))}": service_account(g) for g in gateway_list
    }
    return RouteTranslation(
        tuple(configs),
        tuple(sorted(statuses, key=lambda s: (s.kind, s.key))),
        tuple((key, accounts[key]) for key in served_here if key in accounts),
    )


def _tables(
    services: list[Service],
    attachments: _Attachments,
    virtual_services: VirtualServiceRoutes | None,
    bound: Mapping[str, str],
) -> tuple[RouteTable, ...]:
    tables: list[RouteTable] = []
    for service in services:
        here = bound.get(service.key, "").partition("/")[0]
        for port in sorted({m.service_port for m in service.ports}):
            destination = (service.key, port)
            routes = attachments.by_destination.get(destination, {})
            http = sorted((e for r in routes.values() for e in r.http), key=lambda e: e.key)
            blocks = list(virtual_services.http.get(destination, ())) if virtual_services is not None else []
            if http:
                dated = (r for r in routes.values() if r.kind in _REQUEST_KINDS and r.http)
                oldest = min((r.created, r.name, r.namespace) for r in dated)
                blocks.append(RouteBlock(route_block_order(*oldest, here), tuple(e.rule for e in http)))
            connections: list[tuple[bool, tuple[int, str, str, str], tuple[WeightedBackend, ...]]] = [
                (r.kind != "TLSRoute", route_block_order(r.created, r.name, r.namespace, here), r.tcp_backends)
                for r in routes.values()
                if _applies_to_connections(r, service)
            ]
            if virtual_services is not None:
                connections.extend(
                    (not c.tls, c.order, c.backends) for c in virtual_services.connections.get(destination, ())
                )
            hostnames = sorted({h for r in routes.values() if r.kind in _REQUEST_KINDS for h in r.hostnames})
            tables.append(
                RouteTable(
                    service_key=service.key,
                    port=port,
                    http=tuple(rule for block in sorted(blocks, key=lambda b: b.order) for rule in block.rules),
                    tcp_backends=min(connections, key=lambda c: c[:2])[2] if connections else (),
                    hostnames=tuple(hostnames),
                )
            )
    return tuple(tables)


_REQUEST_KINDS = frozenset(("HTTPRoute", "GRPCRoute"))


def _applies_to_connections(route: ConvertedRoute, service: Service) -> bool:
    """A TCPRoute, or a TLSRoute with no hostnames or exactly the Service's (rule 5)."""
    if route.kind == "TCPRoute":
        return True
    return route.kind == "TLSRoute" and route.hostnames in ((), (service.hostname,))
