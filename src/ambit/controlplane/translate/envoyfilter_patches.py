"""One EnvoyFilter configuration patch → the :class:`Effect` Ambit honours at a waypoint or at an ingress gateway,
or :class:`~ambit.controlplane.translate.envoyfilter_values.PatchRefused` saying why not (istiod's patchers in
``pilot/pkg/networking/core``; an Envoy configuration patch becomes Ambit's own L7 model, since Ambit has no Envoy).
Which EnvoyFilters a proxy takes, and in what order their effects merge, is
:mod:`ambit.controlplane.translate.envoyfilters`'s business; reading the patched values,
:mod:`ambit.controlplane.translate.envoyfilter_values`'s.

Rules:

1. A patch with ``match.proxy`` applies only when ``proxyVersion`` matches and no ``metadata`` is asked for
   (Ambit's waypoints send none that a filter could name). ``proxyVersion`` is a regular expression searched in
   the version Ambit's proxies state, :data:`ambit.ISTIO_VERSION` (the Istio release whose APIs Ambit
   implements; :mod:`ambit` says why), by :func:`ambit.model.envoyfilter.version_matches`: longer than 1024
   characters it matches nothing; an expression the webhook would refuse is ignored (the patch applies to every
   version, as istiod's compiles to nothing) and noted, as is an over-long one.
2. Contexts at a waypoint (istiod builds its listeners and routes as ``SIDECAR_INBOUND``, its few outbound
   clusters as ``SIDECAR_OUTBOUND`` and never patches its inbound clusters): HTTP_FILTER, VIRTUAL_HOST and
   ROUTE_CONFIGURATION patches apply in ``SIDECAR_INBOUND`` and ``ANY``; CLUSTER MERGE patches in
   ``SIDECAR_OUTBOUND`` and ``ANY``, and then only to backends the waypoint does not serve itself. Anything in
   another context has no effect at a waypoint and is noted as such.
3. Honoured, with Envoy's semantics (:mod:`ambit.model.envoyfilter` says where each runs):
   - HTTP_FILTER ``INSERT_BEFORE`` the router (``subFilter.name: envoy.filters.http.router``), or
     ``INSERT_AFTER`` a named filter other than the router, of an ``envoy.lua`` / ``envoy.filters.http.lua``
     filter whose ``inlineCode`` is in :mod:`ambit.model.lua_headers`'s subset; the listener match may name only
     the HTTP connection manager.
   - VIRTUAL_HOST and ROUTE_CONFIGURATION ``MERGE`` of ``request_headers_to_add``, ``request_headers_to_remove``,
     ``response_headers_to_add`` and ``response_headers_to_remove`` (and nothing else), with ``append`` /
     ``append_action`` / ``keep_empty_value``; matched by route configuration ``name``
     (``inbound-vip|<port>|<protocol>|<host>``), ``portNumber``, virtual host ``name`` (``inbound|http|<port>``)
     and ``domainName`` (the Service's host).
   - HTTP_ROUTE ``MERGE`` of the route fields the waypoint's engine has (timeout, retries, header lists), at
     waypoints only, made by the control plane on the route rules it selects
     (:mod:`ambit.controlplane.translate.envoyfilter_routes`).
   - CLUSTER ``MERGE`` of ``http2_protocol_options`` (or ``typed_extension_protocol_options`` with an explicit
     HTTP/2 config): those backends are spoken to in HTTP/2; matched by ``service``, ``portNumber`` and an
     ``outbound|<port>||<host>`` name.
4. Refused (noted, not applied; the object's other patches still apply): any other applyTo or operation, any
   other field in a value, a header name that is not a token or is ``host``, a pseudo-header or a framing
   header, a value with CR, LF or NUL or a ``%`` substitution, Lua outside the subset, a match Ambit cannot
   map (:mod:`~ambit.controlplane.translate.envoyfilter_values` says what of a value is honoured).
5. At ingress gateways (istiod's ``GATEWAY`` patch context, which ``ANY`` also matches): HTTP filters and header
   merges are honoured as at a waypoint, route merges matched by nothing or ``portNumber`` (the listener's port)
   only; CLUSTER merges reach every backend cluster they match. A NETWORK_FILTER ``MERGE`` into the HTTP
   connection manager (matched by that filter's name only) is honoured at gateways for ``xff_num_trusted_hops``
   (the last merge wins) and ``normalize_path: true`` (what the gateway does anyway); any other field refuses the
   patch. HTTP_ROUTE patches are honoured at waypoints only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.translate import shapes
from ambit.controlplane.translate.envoyfilter_routes import RouteMerge, RouteMergeError, read_route_merge
from ambit.controlplane.translate.envoyfilter_values import (
    PatchRefused,
    check_h2_options,
    read_hcm_merge,
    read_header_merge,
    read_lua,
)
from ambit.model.envoyfilter import (
    EVERYWHERE,
    MAX_VERSION_PATTERN,
    HeaderPatch,
    PatchScope,
    version_pattern_problem,
)

__all__ = ["HCM", "ROUTER", "Effect", "read_effect"]

HCM = "envoy.filters.network.http_connection_manager"
ROUTER = "envoy.filters.http.router"

_INBOUND_RC = re.compile(r"inbound-vip\|(\d{1,5})\|[^|]*\|(.+)")
_INBOUND_VHOST = re.compile(r"inbound\|http\|(\d{1,5})")
_OUTBOUND_CLUSTER = re.compile(r"outbound\|(\d{1,5})\|\|(.+)")


@dataclass(frozen=True, slots=True)
class Effect:
    """One honoured patch: where it runs and what it does."""

    kind: str
    """``filter``, ``route``, ``http_route``, ``cluster`` or ``hcm``."""
    patch: HeaderPatch | None = None
    scope: PatchScope = EVERYWHERE
    version_pattern: str | None = None
    version_note: str = ""
    """Why ``version_pattern`` is ignored or matches nothing (rule 1), for a note; ``""``: it is fine."""
    route_merge: RouteMerge | None = None
    """For ``http_route``: the merge into route rules (:mod:`.envoyfilter_routes`)."""
    trusted_hops: int | None = None
    """For ``hcm``: the HTTP connection manager's ``xff_num_trusted_hops``."""


def _is_port(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535


def _route_scope(match: Mapping[str, Any], at: str) -> PatchScope:
    """Rule 3's route-configuration match."""
    rc = shapes.mapping(match.get("routeConfiguration", match.get("route_configuration")), f"{at}.routeConfiguration")
    hostname, port = "", 0
    name = shapes.text(rc.get("name"), f"{at}.routeConfiguration.name")
    if name:
        parsed = _INBOUND_RC.fullmatch(name)
        if parsed is None:
            raise PatchRefused(f"{at}.routeConfiguration.name: {name!r} names no route configuration of a waypoint")
        port, hostname = int(parsed.group(1)), parsed.group(2)
    number = rc.get("portNumber", rc.get("port_number", 0))
    if number:
        if (
            not isinstance(number, int)
            or isinstance(number, bool)
            or not 1 <= number <= 65535
            or port not in (0, number)
        ):
            raise PatchRefused(f"{at}.routeConfiguration.portNumber: matches no route configuration")
        port = number
    vhost = shapes.mapping(rc.get("vhost"), f"{at}.routeConfiguration.vhost")
    vhost_name = shapes.text(vhost.get("name"), f"{at}.routeConfiguration.vhost.name")
    if vhost_name:
        parsed = _INBOUND_VHOST.fullmatch(vhost_name)
        if parsed is None or port not in (0, int(parsed.group(1))):
            raise PatchRefused(
                f"{at}.routeConfiguration.vhost.name: {vhost_name!r} names no virtual host of a waypoint"
            )
        port = int(parsed.group(1))
    domain = shapes.text(vhost.get("domainName", vhost.get("domain_name")), f"{at}.routeConfiguration.vhost.domainName")
    if domain:
        if hostname not in ("", domain):
            raise PatchRefused(f"{at}.routeConfiguration.vhost.domainName: matches no virtual host")
        hostname = domain
    if port and not 1 <= port <= 65535:
        raise PatchRefused(f"{at}.routeConfiguration: port out of range")
    return PatchScope(hostname, port)


def _gateway_route_scope(match: Mapping[str, Any], at: str) -> PatchScope:
    """Rule 5's route-configuration match at an ingress gateway: none, or ``portNumber`` (the listener's port)."""
    rc = shapes.mapping(match.get("routeConfiguration", match.get("route_configuration")), f"{at}.routeConfiguration")
    extra = set(rc) - {"portNumber", "port_number"}
    if extra:
        raise PatchRefused(
            f"{at}.routeConfiguration: only portNumber is matched at an ingress gateway ({sorted(extra)})"
        )
    number = rc.get("portNumber", rc.get("port_number", 0))
    if number and not _is_port(number):
        raise PatchRefused(f"{at}.routeConfiguration.portNumber: expected a port")
    return PatchScope("", number or 0)


def _cluster_scope(match: Mapping[str, Any], at: str) -> PatchScope:
    cluster = shapes.mapping(match.get("cluster"), f"{at}.cluster")
    if cluster.get("subset"):
        raise PatchRefused(f"{at}.cluster.subset: subset clusters are not supported")
    hostname = shapes.text(cluster.get("service"), f"{at}.cluster.service")
    port = cluster.get("portNumber", cluster.get("port_number", 0)) or 0
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise PatchRefused(f"{at}.cluster.portNumber: expected a port")
    name = shapes.text(cluster.get("name"), f"{at}.cluster.name")
    if name:
        parsed = _OUTBOUND_CLUSTER.fullmatch(name)
        if parsed is None:
            raise PatchRefused(f"{at}.cluster.name: {name!r} names no outbound cluster of a waypoint")
        return PatchScope(parsed.group(2), int(parsed.group(1)))
    return PatchScope(hostname, port)


def _filter_position(match: Mapping[str, Any], operation: str, at: str) -> None:
    listener = shapes.mapping(match.get("listener"), f"{at}.listener")
    if set(listener) - {"filterChain", "filter_chain"}:
        raise PatchRefused(f"{at}.listener: only filterChain.filter may be matched at a waypoint")
    chain = shapes.mapping(listener.get("filterChain", listener.get("filter_chain")), f"{at}.listener.filterChain")
    if set(chain) - {"filter"}:
        raise PatchRefused(f"{at}.listener.filterChain: only filter may be matched at a waypoint")
    chain_filter = shapes.mapping(chain.get("filter"), f"{at}.listener.filterChain.filter")
    if shapes.text(chain_filter.get("name"), f"{at}.filter.name") not in ("", HCM):
        raise PatchRefused(f"{at}.listener.filterChain.filter.name: Ambit runs HTTP filters only in {HCM}")
    sub = shapes.mapping(chain_filter.get("subFilter", chain_filter.get("sub_filter")), f"{at}.filter.subFilter")
    sub_name = shapes.text(sub.get("name"), f"{at}.filter.subFilter.name")
    if operation == "INSERT_BEFORE" and sub_name == ROUTER:
        return
    if operation == "INSERT_AFTER" and sub_name and sub_name != ROUTER:
        return
    raise PatchRefused(
        f"{at}: {operation} {sub_name or '(no subFilter)'} is not supported; "
        f"Ambit runs a Lua filter INSERT_BEFORE {ROUTER} (or INSERT_AFTER a filter before it)"
    )


def read_effect(raw: object, at: str, source: str, gateway: bool) -> Effect:
    """One configuration patch as Ambit honours it at a waypoint, or with ``gateway`` at an ingress gateway
    (rules 1-5), or :class:`PatchRefused`."""
    patch_spec = shapes.mapping(raw, at)
    apply_to = shapes.text(patch_spec.get("applyTo", patch_spec.get("apply_to")), f"{at}.applyTo") or "INVALID"
    match = shapes.mapping(patch_spec.get("match"), f"{at}.match")
    context = shapes.text(match.get("context"), f"{at}.match.context") or "ANY"
    patch = shapes.mapping(patch_spec.get("patch"), f"{at}.patch")
    operation = shapes.text(patch.get("operation"), f"{at}.patch.operation") or "INVALID"
    value = shapes.mapping(patch.get("value"), f"{at}.patch.value")
    proxy = shapes.mapping(match.get("proxy"), f"{at}.match.proxy")
    if shapes.mapping(proxy.get("metadata"), f"{at}.match.proxy.metadata"):
        raise PatchRefused(f"{at}.match.proxy.metadata: Ambit's proxies send no metadata a filter can match")
    version = shapes.text(proxy.get("proxyVersion", proxy.get("proxy_version")), f"{at}.match.proxy.proxyVersion")
    version_pattern = version or None
    version_note = ""
    if len(version) > MAX_VERSION_PATTERN:
        version_note = f"longer than {MAX_VERSION_PATTERN} characters: the patch matches no proxy"
    elif version and (problem := version_pattern_problem(version)):
        version_note = f"{problem}; the version match is ignored, as istiod ignores it"
    where = "an ingress gateway" if gateway else "a waypoint"
    if apply_to in ("HTTP_FILTER", "VIRTUAL_HOST", "ROUTE_CONFIGURATION"):
        if context not in (("GATEWAY", "ANY") if gateway else ("SIDECAR_INBOUND", "ANY")):
            raise PatchRefused(f"{at}.match.context: {context} has no effect at {where}")
        if apply_to == "HTTP_FILTER":
            if operation not in ("INSERT_BEFORE", "INSERT_AFTER"):
                raise PatchRefused(f"{at}.patch.operation: {operation} of an HTTP filter is not supported")
            _filter_position(match, operation, f"{at}.match")
            lua = read_lua(value, f"{at}.patch.value")
            patch_value = HeaderPatch(source, lua.request, lua.response)
            return Effect("filter", patch_value, EVERYWHERE, version_pattern, version_note)
        if operation != "MERGE":
            raise PatchRefused(f"{at}.patch.operation: {operation} of {apply_to} is not supported (only MERGE)")
        scope = _gateway_route_scope(match, f"{at}.match") if gateway else _route_scope(match, f"{at}.match")
        request, response = read_header_merge(value, f"{at}.patch.value")
        level = 0 if apply_to == "VIRTUAL_HOST" else 1
        patch_value = HeaderPatch(source, request, response, scope, level)
        return Effect("route", patch_value, scope, version_pattern, version_note)
    if apply_to == "HTTP_ROUTE":
        if gateway:
            raise PatchRefused(f"{at}.applyTo: HTTP_ROUTE patches are honoured at waypoints only")
        if context not in ("SIDECAR_INBOUND", "ANY"):
            raise PatchRefused(f"{at}.match.context: {context} has no effect at {where}")
        if operation != "MERGE":
            raise PatchRefused(f"{at}.patch.operation: {operation} of an HTTP route is not supported (only MERGE)")
        scope = _route_scope(match, f"{at}.match")
        try:
            merge = read_route_merge(match, value, at, source, scope)
        except RouteMergeError as exc:
            raise PatchRefused(str(exc)) from None
        return Effect("http_route", None, scope, version_pattern, version_note, merge)
    if apply_to == "CLUSTER":
        if operation != "MERGE":
            raise PatchRefused(f"{at}.patch.operation: {operation} of a cluster is not supported (only MERGE)")
        if context == "SIDECAR_INBOUND" and not gateway:
            raise PatchRefused(f"{at}.match.context: istiod patches no inbound cluster of a waypoint; no effect")
        if context not in (("GATEWAY", "ANY") if gateway else ("SIDECAR_OUTBOUND", "ANY")):
            raise PatchRefused(f"{at}.match.context: {context} has no effect at {where}")
        scope = _cluster_scope(match, f"{at}.match")
        check_h2_options(value, f"{at}.patch.value")
        return Effect("cluster", None, scope, version_pattern, version_note)
    if apply_to == "NETWORK_FILTER":
        if not gateway:
            raise PatchRefused(f"{at}.applyTo: NETWORK_FILTER patches are honoured at ingress gateways only")
        if context not in ("GATEWAY", "ANY"):
            raise PatchRefused(f"{at}.match.context: {context} has no effect at {where}")
        if operation != "MERGE":
            raise PatchRefused(f"{at}.patch.operation: {operation} of a network filter is not supported (only MERGE)")
        _hcm_listener(match, f"{at}.match")
        hops = read_hcm_merge(value, f"{at}.patch.value")
        return Effect("hcm", None, EVERYWHERE, version_pattern, version_note, trusted_hops=hops)
    raise PatchRefused(f"{at}.applyTo: {apply_to} is not honoured by Ambit")


def _hcm_listener(match: Mapping[str, Any], at: str) -> None:
    """A NETWORK_FILTER merge's match: the HTTP connection manager of any listener, nothing else."""
    listener = shapes.mapping(match.get("listener"), f"{at}.listener")
    if set(listener) - {"filterChain", "filter_chain"}:
        raise PatchRefused(f"{at}.listener: only filterChain.filter may be matched in a network filter merge")
    chain = shapes.mapping(listener.get("filterChain", listener.get("filter_chain")), f"{at}.listener.filterChain")
    if set(chain) - {"filter"}:
        raise PatchRefused(f"{at}.listener.filterChain: only filter may be matched in a network filter merge")
    chain_filter = shapes.mapping(chain.get("filter"), f"{at}.listener.filterChain.filter")
    if set(chain_filter) != {"name"} or shapes.text(chain_filter.get("name"), f"{at}.filter.name") != HCM:
        raise PatchRefused(f"{at}.listener.filterChain.filter: only a merge into {HCM} is honoured")
