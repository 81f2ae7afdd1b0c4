"""Ingress Gateways (class ``istio``) and their HTTPRoutes, GRPCRoutes, TLSRoutes and TCPRoutes → each gateway's
:class:`~ambit.model.ingress.GatewayConfig`, who may read it, and the routes' parent status (spec §1.5, §10.3).

Theory of operation: :func:`translate_ingress` judges each ingress Gateway's listeners with the same judgement
its status is written from (:func:`ambit.controlplane.translate.listeners.judge_listeners`), so a listener is served
exactly when it is Programmed. Each route is converted once (:func:`~ambit.controlplane.translate.routerules.
convert_route`, as for waypoints), and each of its ``parentRefs`` that names an ingress Gateway attaches it to that
Gateway's listeners. Pure: no I/O, deterministic output.

Rules:

1. A parentRef is ours when its group and kind are Gateway API's ``Gateway`` (the defaults) and it names an
   ingress Gateway (namespace defaults to the route's). Other parents are left to others (waypoints:
   :mod:`ambit.controlplane.translate.routes`).
2. A listener takes the route when the parentRef's ``sectionName`` and ``port``, when given, are the listener's,
   the listener is ready, its ``supportedKinds`` (:mod:`ambit.controlplane.translate.route_kinds`, among the kinds
   an ingress serves: HTTPRoute and GRPCRoute on HTTP and HTTPS, TLSRoute on TLS passthrough, TLSRoute and
   TCPRoute on TLS ``Terminate``, TCPRoute on TCP)
   hold the route's kind, and its ``allowedRoutes.namespaces`` admits the route's namespace (``Same``, the
   default; ``All``; ``Selector`` on the namespace's labels). A GRPCRoute is an HTTPRoute for this: it attaches
   to HTTP and HTTPS listeners only (istiod converts both into the listener's virtual hosts), its method matches
   are paths and its entries share the virtual host's precedence order with the HTTPRoutes'
   (:mod:`ambit.controlplane.translate.routerules` rules 7 and 9). A client reaches it over HTTP/2: with ALPN
   ``h2`` on HTTPS, with prior knowledge (h2c) on HTTP.
3. Hostnames: a route without ``hostnames`` serves the listener's hostname (``*`` for none). Otherwise each of its
   hostnames that the listener's hostname covers is served as written, and where a route's wildcard covers the
   listener's hostname, the listener's hostname is served. A route none of whose hostnames meets the listener's is
   not attached there. A TLSRoute's hostnames are matched against the ClientHello's server name the same way, on
   a passthrough listener and on a terminating one alike; a TCPRoute has none and serves ``*``. On a terminating
   listener istiod matches the server name only against the listener's hostname and relays every connection by
   the first route bound there; Ambit picks among the routes attached there by the server name, which is the same
   whenever one route is attached (the usual case) and sends a connection to the route whose hostname it asked for
   otherwise.
4. The parent's ``Accepted``: True when at least one listener took the route; else False with
   ``NoMatchingParent`` (no listener of that sectionName/port), ``NotAllowedByListeners`` (namespaces not
   admitted, the route's kind not supported, or no such listener is served), or ``NoMatchingListenerHostname``.
   ``ResolvedRefs`` as for waypoint routes: True unless the conversion found problems.
5. Backends: a core ``Service`` that exists, in the route's namespace or in one whose ReferenceGrant lets
   routes of the route's kind and namespace refer to it (``to`` kind ``Service``, the name when given); otherwise
   ``RefNotPermitted`` (the share answers 500).
6. A virtual host holds the entries of every route attached there, sorted by Gateway API precedence; virtual
   hosts are ordered most specific first (exact names, then longer wildcards, then ``*``). On a TLS (either
   mode) or TCP listener, a connection cannot be split between routes: the virtual host takes the backends of the oldest
   attached route (then ``namespace/name``), as Gateway API resolves conflicting TLSRoutes and TCPRoutes.
7. The gateway's service account (the only identity that may read its config, certificates included) is the
   Gateway's ``gateway.istio.io/service-account`` annotation, else ``<name>-istio``, as the deployment controller
   names it.
8. Served listeners: the ready ones, except on a port where plain ``HTTP`` listeners and TLS-carrying ones
   (``HTTPS``, ``TLS``) are both ready (their hostnames differ, so istiod's status accepts them all,
   :mod:`ambit.controlplane.translate.listeners` rule 3). istiod merges the servers it generates per listener in
   the order of their generated names, which is the listeners' name order; a TLS server after a plain HTTP one on
   the port is skipped ("conflict with existing server"), so the listener stays Programmed but is not served.
   Ambit serves on such a port only the listeners of the kind (plain or TLS) that comes first in name order:
   where that is TLS, istiod's Envoy would also serve the later plain HTTP listeners as the port's fallback filter
   chain, which Ambit does not (a deviation on the side of serving less).
9. ListenerSets (:mod:`ambit.controlplane.translate.listener_sets`): the listeners of each ListenerSet an ingress
   Gateway admits are judged with the Gateway's (conflicts over the merged list) and served by the Gateway's
   proxy exactly as its own listeners are. A route attaches to them through a parentRef naming the ListenerSet
   (its group and kind, name, namespace, and the listener's name as ``sectionName``), never through one naming
   the Gateway, as istiod keeps the two parents apart; ``allowedRoutes`` ``Same`` means the ListenerSet's
   namespace. A ListenerSet the Gateway does not admit is no parent: nothing attaches to it.
10. The certificate each Gateway presents to backends (``spec.tls.backend.clientCertificateRef``, judged as its
    status is: :mod:`ambit.controlplane.translate.listeners` rules 6-7), for the BackendTLSPolicies' destination
    rules in its configuration (:mod:`ambit.controlplane.translate.backendtls` rule 9).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.translate.fields import mapping as _mapping
from ambit.controlplane.translate.fields import object_key as _key
from ambit.controlplane.translate.fields import text as _text
from ambit.controlplane.translate.listener_sets import merge_listener_sets
from ambit.controlplane.translate.listeners import (
    INGRESS_CLASS,
    JudgedListener,
    Origin,
    SecretLookup,
    deployed_name,
    no_config_maps,
    resolve_backend_client_certificate,
)
from ambit.controlplane.translate.reference_grants import ReferenceGrants
from ambit.controlplane.translate.route_kinds import INGRESS_ROUTE_KINDS, supported_kinds
from ambit.controlplane.translate.routerules import (
    BACKEND_NOT_FOUND,
    GATEWAY_GROUP,
    INVALID_KIND,
    REF_NOT_PERMITTED,
    ConvertedRoute,
    RouteEntry,
    convert_route,
)
from ambit.controlplane.translate.routes import (
    SERVICE_ACCOUNT_ANNOTATION,
    RouteCondition,
    RouteParentStatus,
    RouteStatus,
)
from ambit.model.ingress import (
    GatewayConfig,
    IngressCertificate,
    IngressListener,
    ListenerProtocol,
    VirtualHost,
    host_matches,
    host_order,
)
from ambit.model.labels import selector_from_spec
from ambit.model.routes import ISTIO_RETRY, BackendService, HttpRetry
from ambit.model.workload import Service
from ambit.tls.credentials import TlsCredential

__all__ = ["IngressTranslation", "merge_route_status", "served_listeners", "translate_ingress"]

Obj = Mapping[str, Any]
_PARENT_KEYS = ("group", "kind", "namespace", "name", "sectionName", "port")
_CONNECTION_KINDS = frozenset({"TLSRoute", "TCPRoute"})


@dataclass(frozen=True, slots=True)
class IngressTranslation:
    configs: tuple[GatewayConfig, ...] = ()
    accounts: tuple[tuple[str, str], ...] = ()
    """(Gateway key, service account) of each ingress Gateway (rule 7)."""
    status: tuple[RouteStatus, ...] = ()
    backend_certificates: Mapping[str, TlsCredential] = dataclasses.field(default_factory=dict)
    """Gateway key → the client certificate it presents to backends (rule 10)."""


def _account(gateway: Obj) -> str:
    annotations = _mapping(_mapping(gateway.get("metadata")).get("annotations"))
    return _text(annotations.get(SERVICE_ACCOUNT_ANNOTATION)) or deployed_name(gateway)


def listener_admits(
    listener: Obj, gateway_ns: str, route_ns: str, namespace_labels: Mapping[str, Mapping[str, str]]
) -> bool:
    """Whether the listener's ``allowedRoutes.namespaces`` admits routes of ``route_ns`` (``Same``, ``All``, or
    ``Selector`` against the namespaces' labels; a selector that does not parse admits none)."""
    namespaces = _mapping(_mapping(listener.get("allowedRoutes")).get("namespaces"))
    allowed = _text(namespaces.get("from")) or "Same"
    if allowed == "All":
        return True
    if allowed == "Selector":
        try:
            selector = selector_from_spec(namespaces.get("selector"))
        except (ValueError, TypeError):
            return False
        return selector is not None and selector.matches(namespace_labels.get(route_ns, {}))
    return route_ns == gateway_ns


def _intersect(listener_host: str, route_host: str) -> str | None:
    """The narrower of a listener's and a route's hostname when one covers the other, else None."""
    if not listener_host or listener_host == route_host:
        return route_host
    listener_wild, route_wild = listener_host.startswith("*."), route_host.startswith("*.")
    if listener_wild and route_wild:
        if route_host.endswith(listener_host[1:]):
            return route_host
        return listener_host if listener_host.endswith(route_host[1:]) else None
    if listener_wild:
        return route_host if host_matches(listener_host, route_host) else None
    if route_wild:
        return listener_host if host_matches(route_host, listener_host) else None
    return None


def served_hostnames(listener_host: str, route_hosts: tuple[str, ...]) -> tuple[str, ...]:
    """Rule 3: the hostnames a route serves on a listener (empty: it does not attach)."""
    if not route_hosts:
        return (listener_host or "*",)
    served = (_intersect(listener_host, host.lower()) for host in route_hosts)
    return tuple(dict.fromkeys(h for h in served if h is not None))


def _lookup_for(
    route_ns: str, services: Mapping[tuple[str, str], Service], grants: ReferenceGrants
) -> Callable[..., BackendService | str]:
    def lookup(group: str, kind: str, name: str, namespace: str, route_kind: str) -> BackendService | str:
        if group not in ("", "core") or kind != "Service":
            return INVALID_KIND
        target = namespace or route_ns
        if target != route_ns and not grants.permits(
            from_group=GATEWAY_GROUP,
            from_kind=route_kind,
            from_namespace=route_ns,
            to_group="",
            to_kind="Service",
            to_namespace=target,
            to_name=name,
        ):
            return REF_NOT_PERMITTED
        service = services.get((target, name))
        if service is None:
            return BACKEND_NOT_FOUND
        return BackendService(service.namespace, service.hostname, 0)

    return lookup


def _resolved_refs(route: ConvertedRoute) -> RouteCondition:
    if not route.problems:
        return RouteCondition("ResolvedRefs", True, "ResolvedRefs", "All references resolved")
    message = "; ".join(dict.fromkeys(p.message for p in route.problems))
    return RouteCondition("ResolvedRefs", False, route.problems[0].reason, message)


@dataclass(slots=True)
class _Gateway:
    obj: Obj
    namespace: str
    judged: tuple[JudgedListener, ...]
    """Its own listeners, then those of its ListenerSets, named ``<set namespace>/<set name>/<listener>``."""
    raw: dict[str, Obj]
    """Listener name (as in ``judged``) → its spec."""
    hosts: dict[tuple[str, str], list[RouteEntry]]
    """(listener name, hostname) → attached entries."""
    connections: dict[tuple[str, str], list[ConvertedRoute]]
    """(listener name, hostname) → attached TLSRoutes and TCPRoutes."""


@dataclass(frozen=True, slots=True)
class _Parent:
    """What a parentRef can name (rule 9): a Gateway, or one of its ListenerSets."""

    gateway: _Gateway
    namespace: str
    """Whose ``Same`` a listener's ``allowedRoutes`` means: the Gateway's, or the ListenerSet's."""
    listeners: tuple[tuple[str, JudgedListener], ...]
    """(sectionName, judged listener as the gateway's config names it)."""


def translate_ingress(
    *,
    gateways: Iterable[Obj],
    http_routes: Iterable[Obj],
    grpc_routes: Iterable[Obj] = (),
    tls_routes: Iterable[Obj] = (),
    tcp_routes: Iterable[Obj] = (),
    k8s_services: Iterable[Service],
    find_secret: SecretLookup,
    namespace_labels: Mapping[str, Mapping[str, str]],
    reference_grants: Iterable[Obj] = (),
    find_config_map: SecretLookup | None = None,
    listener_sets: Iterable[tuple[Origin, Obj]] = (),
    default_retry: HttpRetry = ISTIO_RETRY,
) -> IngressTranslation:
    """Rules 1-9; ``listener_sets`` are (group and kind, object) pairs; ``default_retry`` is the mesh config's
    ``defaultHttpRetryPolicy``, for route rules without ``retry``."""
    grants = ReferenceGrants.build(reference_grants)
    found: dict[str, _Gateway] = {}
    parent_of: dict[tuple[Origin, str], _Parent] = {}
    set_list = list(listener_sets)
    for gateway in gateways:
        spec = _mapping(gateway.get("spec"))
        meta = _mapping(gateway.get("metadata"))
        if spec.get("gatewayClassName") != INGRESS_CLASS or meta.get("deletionTimestamp"):
            continue
        listeners = spec.get("listeners")
        raw = {
            _text(item.get("name")): item
            for item in (listeners if isinstance(listeners, list) else ())
            if isinstance(item, Mapping)
        }
        merged = merge_listener_sets(
            gateway,
            set_list,
            find_secret=find_secret,
            find_config_map=find_config_map or no_config_maps,
            grants=grants,
            namespace_labels=namespace_labels,
        )
        judged = list(merged.judged)
        from_sets: list[tuple[tuple[Origin, str], str, tuple[tuple[str, JudgedListener], ...]]] = []
        for verdict in merged.sets:
            if verdict.refusal is not None:
                continue
            named = tuple((j.name, dataclasses.replace(j, name=f"{verdict.key}/{j.name}")) for j in verdict.judged)
            judged += [j for _, j in named]
            raw.update({f"{verdict.key}/{name}": item for name, item in verdict.raw.items()})
            from_sets.append(((verdict.origin, verdict.key), verdict.namespace, named))
        key = _key(gateway)
        held = _Gateway(gateway, _text(meta.get("namespace")), tuple(judged), raw, {}, {})
        found[key] = held
        own = tuple((j.name, j) for j in merged.judged)
        parent_of[((GATEWAY_GROUP, "Gateway"), key)] = _Parent(held, held.namespace, own)
        for parent_key, namespace, named in from_sets:
            parent_of[parent_key] = _Parent(held, namespace, named)
    services = {(s.namespace, s.name): s for s in k8s_services}
    statuses: list[RouteStatus] = []
    routes = [
        *(("HTTPRoute", o) for o in http_routes),
        *(("GRPCRoute", o) for o in grpc_routes),
        *(("TLSRoute", o) for o in tls_routes),
        *(("TCPRoute", o) for o in tcp_routes),
    ]
    for kind_of_route, obj in routes:
        meta = _mapping(obj.get("metadata"))
        route_ns = _text(meta.get("namespace"))
        parents: dict[tuple[tuple[str, Any], ...], RouteParentStatus] = {}
        route: ConvertedRoute | None = None
        refs = _mapping(obj.get("spec")).get("parentRefs")
        for ref in refs if isinstance(refs, list) else ():
            if not isinstance(ref, Mapping):
                continue
            group = _text(ref.get("group")) if "group" in ref else GATEWAY_GROUP
            kind = _text(ref.get("kind")) or "Gateway"
            target = parent_of.get(
                ((group, kind), f"{_text(ref.get('namespace')) or route_ns}/{_text(ref.get('name'))}")
            )
            if target is None:
                continue
            wire = tuple(sorted((k, ref[k]) for k in _PARENT_KEYS if isinstance(ref.get(k), str | int)))
            if wire in parents:
                continue
            if route is None:
                route = convert_route(kind_of_route, obj, _lookup_for(route_ns, services, grants), default_retry)
            accepted = _attach(target, ref, route, route_ns, namespace_labels)
            parents[wire] = RouteParentStatus(wire, (accepted, _resolved_refs(route)))
        if parents:
            generation = meta.get("generation")
            observed = generation if isinstance(generation, int) and not isinstance(generation, bool) else 0
            statuses.append(
                RouteStatus(kind_of_route, route_ns, _text(meta.get("name")), observed, tuple(parents.values()))
            )
    configs = tuple(_config(key, gw) for key, gw in sorted(found.items()))
    accounts = tuple((key, _account(gw.obj)) for key, gw in sorted(found.items()))
    certificates = {key: resolve_backend_client_certificate(gw.obj, find_secret, grants) for key, gw in found.items()}
    return IngressTranslation(
        configs,
        accounts,
        tuple(sorted(statuses, key=lambda s: (s.kind, s.key))),
        {key: found_cert for key, found_cert in certificates.items() if found_cert is not None},
    )


def _attach(
    parent: _Parent,
    ref: Obj,
    route: ConvertedRoute,
    route_ns: str,
    namespace_labels: Mapping[str, Mapping[str, str]],
) -> RouteCondition:
    gateway = parent.gateway
    section = _text(ref.get("sectionName"))
    port = ref.get("port") if isinstance(ref.get("port"), int) else None
    candidates = [
        j for name, j in parent.listeners if (not section or name == section) and (port is None or j.port == port)
    ]
    if not candidates:
        what = f'sectionName "{section}"' if section else f"port {port}"
        return RouteCondition("Accepted", False, "NoMatchingParent", f"{what} not found")
    admitted = [
        j
        for j in candidates
        if j.ready
        and _kind_supported(gateway.raw.get(j.name, {}), route.kind)
        and listener_admits(gateway.raw.get(j.name, {}), parent.namespace, route_ns, namespace_labels)
    ]
    if not admitted:
        message = f'{route.kind} in namespace "{route_ns}" is not allowed by the listeners of {_key(gateway.obj)}'
        return RouteCondition("Accepted", False, "NotAllowedByListeners", message)
    attached = False
    for listener in admitted:
        hostnames = () if route.kind == "TCPRoute" else tuple(route.hostnames)
        listener_host = "" if route.kind == "TCPRoute" else listener.hostname
        for host in served_hostnames(listener_host, hostnames):
            if route.kind in _CONNECTION_KINDS:
                gateway.connections.setdefault((listener.name, host), []).append(route)
            else:
                gateway.hosts.setdefault((listener.name, host), []).extend(route.http)
            attached = True
    if not attached:
        message = "no hostname of the route matches a listener's hostname"
        return RouteCondition("Accepted", False, "NoMatchingListenerHostname", message)
    return RouteCondition("Accepted", True, "Accepted", "Route was valid")


def _kind_supported(listener: Obj, kind: str) -> bool:
    """Rule 2: ``kind`` is among the listener's ``supportedKinds``."""
    kinds, _ = supported_kinds(listener, INGRESS_ROUTE_KINDS)
    return any(item["kind"] == kind for item in kinds)


def _oldest(routes: list[ConvertedRoute]) -> ConvertedRoute:
    return min(routes, key=lambda r: (r.created, r.key))


def served_listeners(judged: Iterable[JudgedListener]) -> tuple[JudgedListener, ...]:
    """Rule 8: the listeners served, in their order."""
    ready = [j for j in judged if j.ready]
    first_plain: dict[int, bool] = {}
    for item in sorted(ready, key=lambda j: j.name):
        if item.protocol in ("HTTP", "HTTPS", "TLS"):
            first_plain.setdefault(item.port, item.protocol == "HTTP")
    return tuple(
        j for j in ready if j.protocol not in ("HTTP", "HTTPS", "TLS") or first_plain[j.port] == (j.protocol == "HTTP")
    )


def _config(key: str, gateway: _Gateway) -> GatewayConfig:
    listeners = []
    for judged in served_listeners(gateway.judged):
        protocol = (
            ListenerProtocol.TLS_TERMINATE if judged.tls_mode == "Terminate" else ListenerProtocol(judged.protocol)
        )
        if protocol.carries_http:
            hosts = sorted((h for (name, h) in gateway.hosts if name == judged.name), key=host_order)
            virtual_hosts = tuple(
                VirtualHost(
                    host, tuple(e.rule for e in sorted(gateway.hosts[(judged.name, host)], key=lambda e: e.key))
                )
                for host in hosts
            )
        else:
            hosts = sorted((h for (name, h) in gateway.connections if name == judged.name), key=host_order)
            virtual_hosts = tuple(
                VirtualHost(host, tcp_backends=_oldest(gateway.connections[(judged.name, host)]).tcp_backends)
                for host in hosts
            )
        listeners.append(
            IngressListener(
                judged.name,
                judged.port,
                protocol,
                judged.hostname,
                tuple(IngressCertificate(c.cert_pem, c.key_pem) for c in judged.credentials),
                virtual_hosts,
                judged.client_tls,
            )
        )
    return GatewayConfig(key, tuple(listeners))


def merge_route_status(*groups: Iterable[RouteStatus]) -> tuple[RouteStatus, ...]:
    """One RouteStatus per route, the parents of every group together (waypoint parents and ingress parents)."""
    merged: dict[tuple[str, str], RouteStatus] = {}
    for group in groups:
        for status in group:
            key = (status.kind, status.key)
            have = merged.get(key)
            if have is None:
                merged[key] = status
            else:
                merged[key] = RouteStatus(
                    status.kind, status.namespace, status.name, status.generation, have.parents + status.parents
                )
    return tuple(merged[k] for k in sorted(merged))
