"""Istio ``VirtualService`` objects → the route tables of the waypoints that serve their hosts (spec §11.3
TestServerRouting, TestTrafficSplit), as istiod's waypoint builds them (``listener_waypoint.go``
``getVirtualServiceForWaypoint``, ``waypointInboundRoute``; ``route.go`` ``TranslateRoute``).

Theory of operation: :func:`translate_virtual_services` takes the VirtualService objects (plain API dicts), every
translated Service (Kubernetes and ServiceEntry) with the waypoint it is bound to, and returns, per destination (a
Service port a waypoint serves), the HTTP rules each applicable VirtualService contributes (one
:class:`RouteBlock` per VirtualService, in written order) and its TCP/TLS choice (:class:`ConnectionRoute`).
:mod:`ambit.controlplane.translate.routes` merges them with the Gateway API routes attached to the same
destination. Pure: no I/O; what cannot be used is reported as a :class:`~ambit.controlplane.translate.skips.Skipped`
(a Warning Event on the VirtualService), never raised.

Rules:

1. Which VirtualServices apply to a Service bound to a waypoint: ``gateways`` empty or naming ``mesh``; in the
   Service's namespace or the (primary) waypoint's own; exported (``exportTo``: empty or ``*`` everywhere, ``.``
   its own namespace, ``~`` nowhere, else the listed namespaces) to the waypoint's namespace; and one of its
   ``hosts`` matches the Service's hostname. A short host ``reviews`` means ``reviews.<its namespace>.svc.<domain>``;
   ``*.example.com`` matches any host ending ``.example.com``; ``*`` any host (istio ``host.Name.Matches``).
2. Several apply to one destination: their rules are concatenated, as istiod's waypoint merges every matching
   VirtualService, in the order istiod lists them for the waypoint's namespace W (``VirtualServicesForGateway``):
   (0) those exported only to their own namespace W, (1) those exported to W by name, (2) public ones made from
   HTTPRoutes in W, (3) every other public one; within a group the oldest first (``metadata.creationTimestamp``,
   then name, then namespace: istiod's ``configCompareByCreationTime``). **A VirtualService and an HTTPRoute on
   one Service**: istiod turns the HTTPRoutes of a Service into one public VirtualService (their rules sorted by
   Gateway API precedence, dated by the oldest route, in that route's namespace) and the waypoint concatenates it
   with the real ones by that order; :mod:`~ambit.controlplane.translate.routes` does the same with the
   HTTPRoute block (:func:`route_block_order`). First match wins across the whole table.
3. Each applicable VirtualService's ``http``, ``tcp`` and ``tls`` rules are converted for each port of the Service
   by :mod:`ambit.controlplane.translate.virtualservice_rules` (match semantics, actions, what is dropped).
4. Bad content never raises: what cannot be used is reported once per (VirtualService, field) as a
   :class:`~ambit.controlplane.translate.skips.Skipped`.
5. A Service port's table takes at most :data:`MAX_ENTRIES` VirtualService entries, in the order of rule 2; the
   rest are left out (those requests then match a later rule or get 404, never a wider route) and reported on
   each VirtualService that lost entries. One VirtualService for ``*`` applies to every Service of its namespace
   and of the waypoints there, so without a bound one object could grow every table of a waypoint past what its
   config stream carries (a 2,000-rule one over 50 Services made a 10 MB config, 7 s to encode, 16 s to decode).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.translate.skips import ObjectKind, Skipped, skipped
from ambit.controlplane.translate.virtualservice_rules import (
    BadField,
    RuleContext,
    connection_route,
    for_mesh,
    fqdn,
    http_rules,
)
from ambit.model.routes import ISTIO_RETRY, HttpRetry, RouteRule, WeightedBackend
from ambit.model.workload import Service

__all__ = [
    "VIRTUAL_SERVICE",
    "ConnectionRoute",
    "RouteBlock",
    "VirtualServiceRoutes",
    "host_matches",
    "route_block_order",
    "translate_virtual_services",
]

VIRTUAL_SERVICE = ObjectKind("networking.istio.io/v1", "VirtualService")
MAX_ENTRIES = 256
"""VirtualService match entries one Service port's table takes (rule 5)."""
Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class RouteBlock:
    """The HTTP entries one VirtualService (or, in :mod:`routes`, the HTTPRoutes) gives one destination."""

    order: tuple[int, str, str, str]
    """(group, creationTimestamp, name, namespace): blocks are concatenated in this order (rule 2)."""
    rules: tuple[RouteRule, ...]


@dataclass(frozen=True, slots=True)
class ConnectionRoute:
    """The TLS or TCP rule one VirtualService gives one destination (rule 8)."""

    tls: bool
    order: tuple[int, str, str, str]
    backends: tuple[WeightedBackend, ...]


@dataclass(frozen=True, slots=True)
class VirtualServiceRoutes:
    http: Mapping[tuple[str, int], tuple[RouteBlock, ...]]
    """(service key, port) → the blocks of the VirtualServices that apply, oldest first."""
    connections: Mapping[tuple[str, int], tuple[ConnectionRoute, ...]]


def host_matches(pattern: str, hostname: str) -> bool:
    """Istio's ``host.Name.Matches``: exact, or either side a ``*`` / ``*.suffix`` wildcard covering the other."""
    if pattern.startswith("*"):
        if hostname.startswith("*"):
            return len(pattern) <= len(hostname) and hostname.endswith(pattern[1:])
        return hostname.endswith(pattern[1:])
    if hostname.startswith("*"):
        return pattern.endswith(hostname[1:])
    return pattern == hostname


PRIVATE, EXPORTED, ROUTES_HERE, PUBLIC = range(4)
"""istiod's groups of VirtualServices for a namespace (rule 2)."""


def _export_group(spec: Obj, vs_namespace: str, consumer: str, default: tuple[str, ...] | None = None) -> int | None:
    """Which of istiod's groups the VirtualService is in for namespace ``consumer``; None: not visible there.
    ``default`` is the mesh config's ``defaultVirtualServiceExportTo``."""
    export = spec.get("exportTo")
    entries = {e for e in export if isinstance(e, str)} if isinstance(export, list) and export else set(default or "*")
    if "*" in entries:
        return PUBLIC
    if "~" in entries:
        return None
    named = {vs_namespace if e == "." else e for e in entries}
    if consumer not in named:
        return None
    return PRIVATE if consumer == vs_namespace else EXPORTED


def route_block_order(created: str, name: str, namespace: str, waypoint_namespace: str) -> tuple[int, str, str, str]:
    """Where the HTTPRoutes' block of a destination goes among its VirtualServices (rule 2)."""
    return (ROUTES_HERE if namespace == waypoint_namespace else PUBLIC, created, name, namespace)


def _object(value: Any) -> Obj:
    return value if isinstance(value, Mapping) else {}


def _matching(pool: Mapping[str, Service], patterns: list[str]) -> list[Service]:
    """The Services of ``pool`` one of ``patterns`` matches (rule 1), by key; a direct lookup for plain hosts."""
    found: dict[str, Service] = {}
    plain = set(patterns)
    wild = [p for p in patterns if p.startswith("*")]
    for key, service in pool.items():
        if service.hostname in plain or (
            (wild or service.hostname.startswith("*")) and any(host_matches(p, service.hostname) for p in patterns)
        ):
            found[key] = service
    return [found[key] for key in sorted(found)]


def translate_virtual_services(
    virtual_services: Iterable[Obj],
    services: Iterable[Service],
    bound: Mapping[str, str],
    *,
    domain: str = "cluster.local",
    skips: list[Skipped] | None = None,
    default_export_to: tuple[str, ...] | None = None,
    default_retry: HttpRetry = ISTIO_RETRY,
) -> VirtualServiceRoutes:
    """Each bound destination's VirtualService blocks and connection routes (rules 1-9). ``bound`` maps a service
    key to its (primary) waypoint's key; ``skips`` receives what had to be left out; ``default_export_to`` is the
    mesh config's ``defaultVirtualServiceExportTo``, ``default_retry`` its ``defaultHttpRetryPolicy``."""
    service_list = list(services)
    by_hostname: dict[str, list[Service]] = {}
    for service in service_list:
        by_hostname.setdefault(service.hostname, []).append(service)
    hostnames = {k: tuple(v) for k, v in by_hostname.items()}
    # A VirtualService can only apply in its own namespace's Services or those of the waypoints in its namespace.
    by_namespace: dict[str, dict[str, Service]] = {}
    for service in service_list:
        if service.key in bound:
            by_namespace.setdefault(service.namespace, {})[service.key] = service
            by_namespace.setdefault(bound[service.key].partition("/")[0], {})[service.key] = service
    http: dict[tuple[str, int], list[RouteBlock]] = {}
    connections: dict[tuple[str, int], list[ConnectionRoute]] = {}
    reported: set[Skipped] = set()
    objects: dict[tuple[str, str], Obj] = {}
    for obj in virtual_services:
        if not isinstance(obj, Mapping):
            continue
        meta, spec = _object(obj.get("metadata")), _object(obj.get("spec"))
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        if not namespace or not name or not for_mesh(spec.get("gateways")):
            continue
        hosts = spec.get("hosts")
        patterns = (
            [fqdn(h, namespace, domain) for h in hosts if isinstance(h, str) and h] if isinstance(hosts, list) else []
        )
        created = meta.get("creationTimestamp")
        stamp = created if isinstance(created, str) else ""
        problems: list[tuple[str, str]] = []
        converted: dict[int, tuple[RouteRule, ...]] = {}  # rules depend on the port, not the Service: once a port
        for service in _matching(by_namespace.get(namespace, {}), patterns):
            group = _export_group(spec, namespace, bound[service.key].partition("/")[0], default_export_to)
            if group is None:
                continue
            order = (group, stamp, name, namespace)
            for port in sorted({m.service_port for m in service.ports}):
                ctx = RuleContext(namespace, name, domain, port, hostnames, default_retry=default_retry)
                if port not in converted:
                    converted[port] = http_rules(spec, ctx, problems)
                if converted[port]:
                    http.setdefault((service.key, port), []).append(RouteBlock(order, converted[port]))
                try:
                    found = connection_route(spec, ctx, service.hostname)
                    connection = ConnectionRoute(found[0], order, found[1]) if found is not None else None
                except BadField as bad:
                    problems.append((bad.field, f"{bad.reason}; the TCP/TLS routes are left out"))
                    connection = None
                if connection is not None:
                    connections.setdefault((service.key, port), []).append(connection)
        reported.update(skipped(VIRTUAL_SERVICE, obj, field, reason) for field, reason in problems)
        objects[(namespace, name)] = obj
    bounded: dict[tuple[str, int], tuple[RouteBlock, ...]] = {}
    for destination, blocks in http.items():
        kept, cut = _bounded(sorted(blocks, key=lambda b: b.order))
        bounded[destination] = kept
        for block in cut:
            obj = objects[(block.order[3], block.order[2])]
            reason = (
                f"the waypoint takes at most {MAX_ENTRIES} VirtualService match entries for one Service port;"
                f" entries past that for {destination[0]} port {destination[1]} are left out"
            )
            reported.add(skipped(VIRTUAL_SERVICE, obj, "spec.http", reason))
    if skips is not None:
        skips.extend(sorted(reported))
    return VirtualServiceRoutes(
        http=bounded,
        connections={k: tuple(sorted(v, key=lambda c: c.order)) for k, v in connections.items()},
    )


def _bounded(blocks: list[RouteBlock]) -> tuple[tuple[RouteBlock, ...], list[RouteBlock]]:
    """The first :data:`MAX_ENTRIES` entries of ``blocks`` (rule 5), and the blocks that lost entries."""
    kept: list[RouteBlock] = []
    cut: list[RouteBlock] = []
    room = MAX_ENTRIES
    for block in blocks:
        if len(block.rules) > room:
            cut.append(block)
            if room:
                kept.append(RouteBlock(block.order, block.rules[:room]))
            room = 0
        else:
            kept.append(block)
            room -= len(block.rules)
    return tuple(kept), cut
