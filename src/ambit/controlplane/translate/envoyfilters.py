"""EnvoyFilters → the patches each waypoint honours (:class:`~ambit.model.envoyfilter.ProxyPatches`), and a note
for every patch it does not.

Theory of operation: :func:`translate_envoy_filters` reads every EnvoyFilter once into the patches Ambit can
honour (an Envoy configuration patch is turned into Ambit's own L7 model, since Ambit has no Envoy) and a
:class:`PatchNote` for each it cannot; then it picks, for each waypoint, the EnvoyFilters istiod would give that
waypoint and merges their honoured patches in istiod's order. Pure.

Rules (istiod's ``PushContext.EnvoyFilters`` with ``WorkloadPolicyMatcher`` for a waypoint; its patchers in
``pilot/pkg/networking/core``):

1. Candidates: the EnvoyFilters of the root namespace and of the waypoint's namespace.
2. A waypoint takes an EnvoyFilter only by ``targetRefs`` (``targetRef`` when there are none): one naming
   ``gateway.networking.k8s.io`` ``Gateway`` with the waypoint's name, when the filter is in the waypoint's
   namespace and the target names that namespace or none; or, from the root namespace, one naming the
   ``GatewayClass`` ``istio-waypoint``. A filter without targets (``workloadSelector`` or nothing) never applies
   to a waypoint, nor does a filter of another namespace, whatever namespace its target names. Service and
   ServiceEntry targets match nothing here (istiod asks without the services).
3. Order: ``priority`` (lower first), then root-namespace filters first, then creation time, then
   ``name.namespace``; each filter's patches in the order written.
4. A patch with ``match.proxy`` applies only when ``proxyVersion`` matches and no ``metadata`` is asked for
   (Ambit's waypoints send none that a filter could name). ``proxyVersion`` is a regular expression searched in
   the version Ambit's proxies state, :data:`ambit.ISTIO_VERSION` (the Istio release whose APIs Ambit
   implements; :mod:`ambit` says why), by :func:`ambit.model.envoyfilter.version_matches`: longer than 1024
   characters it matches nothing; an expression the webhook would refuse is ignored (the patch applies to every
   version, as istiod's compiles to nothing) and noted, as is an over-long one.
5. Contexts at a waypoint (istiod builds its listeners and routes as ``SIDECAR_INBOUND``, its few outbound
   clusters as ``SIDECAR_OUTBOUND`` and never patches its inbound clusters): HTTP_FILTER, VIRTUAL_HOST and
   ROUTE_CONFIGURATION patches apply in ``SIDECAR_INBOUND`` and ``ANY``; CLUSTER MERGE patches in
   ``SIDECAR_OUTBOUND`` and ``ANY``, and then only to backends the waypoint does not serve itself. Anything in
   another context has no effect at a waypoint and is noted as such.
6. Honoured, with Envoy's semantics (:mod:`ambit.model.envoyfilter` says where each runs):
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
7. Refused (noted, not applied; the object's other patches still apply): any other applyTo or operation, any
   other field in a value, a header name that is not a token or is ``host``, a pseudo-header or a framing
   header, a value with CR, LF or NUL or a ``%`` substitution, Lua outside the subset, a match Ambit cannot
   map. A note names the object, its generation and the patch (``spec.configPatches[i]``).
8. Ingress gateways (istiod's ``GATEWAY`` patch context, which ``ANY`` also matches): a Gateway API gateway takes
   a filter of its namespace whose targetRefs name its Gateway, or a filter of its namespace or the root namespace
   without targets whose ``workloadSelector`` (none: every workload) its pods' labels satisfy (istiod's
   selector-based gateway policy, on by default); an Istio Gateway's pods take only the selector kind. HTTP
   filters and header merges are honoured as at a waypoint, route merges matched by nothing or ``portNumber``
   (the listener's port) only; CLUSTER merges reach every backend cluster they match. A NETWORK_FILTER ``MERGE``
   into the HTTP connection manager (matched by that filter's name only) is honoured at gateways for
   ``xff_num_trusted_hops`` (the last merge wins) and ``normalize_path: true`` (what the gateway does anyway);
   any other field refuses the patch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ambit.controlplane.translate import shapes
from ambit.controlplane.translate.envoyfilter_routes import HEADER_LISTS, RouteMerge, RouteMergeError, read_route_merge
from ambit.model.envoyfilter import (
    EVERYWHERE,
    MAX_TRUSTED_HOPS,
    MAX_VERSION_PATTERN,
    NO_PATCHES,
    HeaderAction,
    HeaderOp,
    HeaderPatch,
    PatchScope,
    ProxyPatches,
    version_matches,
    version_pattern_problem,
)
from ambit.model.errors import LuaSubsetError
from ambit.model.field_names import is_token
from ambit.model.header_rules import has_line_break, is_framing
from ambit.model.lua_headers import parse_header_script

__all__ = ["EnvoyFilterTranslation", "PatchNote", "translate_envoy_filters"]

GATEWAY_GROUP = "gateway.networking.k8s.io"
WAYPOINT_CLASS = "istio-waypoint"
HCM = "envoy.filters.network.http_connection_manager"
HCM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ROUTER = "envoy.filters.http.router"
LUA_NAMES = frozenset({"envoy.lua", "envoy.filters.http.lua"})
LUA_TYPE = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"
HTTP_OPTIONS_KEY = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


_APPEND_ACTIONS = {a.value: a for a in HeaderAction if a is not HeaderAction.REMOVE}
_INBOUND_RC = re.compile(r"inbound-vip\|(\d{1,5})\|[^|]*\|(.+)")
_INBOUND_VHOST = re.compile(r"inbound\|http\|(\d{1,5})")
_OUTBOUND_CLUSTER = re.compile(r"outbound\|(\d{1,5})\|\|(.+)")


@dataclass(frozen=True, slots=True, order=True)
class PatchNote:
    """One patch (or one object) that Ambit does not apply, and why."""

    namespace: str
    name: str
    field: str
    """``spec.configPatches[i]`` (or ``spec``)."""
    reason: str
    uid: str = ""
    generation: int = 0


class _Refused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class _Effect:
    """One honoured patch: where it runs and what it does."""

    kind: str
    """``filter``, ``route``, ``http_route``, ``cluster`` or ``hcm``."""
    patch: HeaderPatch | None = None
    scope: PatchScope = EVERYWHERE
    version_pattern: str | None = None
    version_note: str = ""
    """Why ``version_pattern`` is ignored or matches nothing (rule 4), for a note; ``""``: it is fine."""
    route_merge: RouteMerge | None = None
    """For ``http_route``: the merge into route rules (:mod:`.envoyfilter_routes`)."""
    trusted_hops: int | None = None
    """For ``hcm``: the HTTP connection manager's ``xff_num_trusted_hops``."""


@dataclass(frozen=True, slots=True)
class _Filter:
    namespace: str
    name: str
    priority: int
    created: str
    targets: tuple[tuple[str, str, str, str], ...]
    """(group, kind, name, namespace) of each target."""
    selector: Mapping[str, str] | None
    """``workloadSelector.labels``; None: no selector (every workload)."""
    effects: Mapping[bool, tuple[_Effect, ...]]
    """What it does at a waypoint (False) and at an ingress gateway (True)."""
    notes: Mapping[bool, tuple[PatchNote, ...]]
    """What it does not, at each."""
    uid: str = ""
    generation: int = 0

    def sort_key(self, root: str) -> tuple[int, int, str, str]:
        return (self.priority, 0 if self.namespace == root else 1, self.created, f"{self.name}.{self.namespace}")

    def attaches_to(self, waypoint: str, root: str) -> bool:
        """Rule 2."""
        namespace, _, name = waypoint.partition("/")
        for group, kind, target, target_ns in self.targets:
            if self.namespace == root and (group, kind, target) == (GATEWAY_GROUP, "GatewayClass", WAYPOINT_CLASS):
                return True
            if self.namespace != namespace or target_ns not in ("", namespace):
                continue
            if group == GATEWAY_GROUP and kind == "Gateway" and target == name:
                return True
        return False

    def attaches_to_gateway(self, gateway: IngressProxy, root: str) -> bool:
        """Rule 8's selection."""
        namespace, _, name = gateway.key.partition("/")
        if self.namespace not in (namespace, root):
            return False
        if not self.targets:
            return self.selector is None or all(gateway.labels.get(k) == v for k, v in self.selector.items())
        if not gateway.gateway_api or self.namespace != namespace:
            return False
        return any(
            (group, kind, target) == (GATEWAY_GROUP, "Gateway", name) and target_ns in ("", namespace)
            for group, kind, target, target_ns in self.targets
        )


@dataclass(frozen=True, slots=True)
class IngressProxy:
    """An ingress gateway as EnvoyFilter selection sees it."""

    key: str
    """``namespace/name`` of its config (:class:`~ambit.model.ingress.GatewayConfig`)."""
    labels: Mapping[str, str]
    """Its pods' labels."""
    gateway_api: bool
    """A Gateway API Gateway (its pods carry ``gateway.networking.k8s.io/gateway-name``), not an Istio Gateway's
    selected pods."""


@dataclass(frozen=True, slots=True)
class EnvoyFilterTranslation:
    """What each waypoint honours, and the notes on everything not applied."""

    by_waypoint: Mapping[str, ProxyPatches] = field(default_factory=dict)
    notes: tuple[PatchNote, ...] = ()
    by_gateway: Mapping[str, ProxyPatches] = field(default_factory=dict)
    route_merges: Mapping[str, tuple[RouteMerge, ...]] = field(default_factory=dict)
    """Each waypoint's HTTP_ROUTE merges, in order (:func:`.envoyfilter_routes.merge_routes` applies them)."""

    def for_waypoint(self, key: str) -> ProxyPatches:
        return self.by_waypoint.get(key, NO_PATCHES)

    def route_merges_for(self, key: str) -> tuple[RouteMerge, ...]:
        return self.route_merges.get(key, ())

    def for_gateway(self, key: str) -> ProxyPatches:
        return self.by_gateway.get(key, NO_PATCHES)


def _header_name(name: object, at: str) -> str:
    if not isinstance(name, str) or not is_token(name):
        raise _Refused(f"{at}: {name!r} is not a header name Ambit edits (a token; no pseudo-headers)")
    if name.lower() == "host" or is_framing(name):
        raise _Refused(f"{at}: {name!r} is the request's authority or a framing header")
    return name.lower()


def _header_value(value: object, at: str, *, formatted: bool = True) -> str:
    """A value to write; ``formatted``: Envoy's formatter reads it (``%%`` is one ``%``), as in a route's headers
    but not in Lua."""
    if not isinstance(value, str):
        raise _Refused(f"{at}: expected a string")
    if has_line_break(value):
        raise _Refused(f"{at}: a header value may not hold CR, LF or NUL")
    if not formatted:
        return value
    if "%" in value.replace("%%", ""):
        raise _Refused(f"{at}: %-substitutions (Envoy's formatter) are not supported")
    return value.replace("%%", "%")


def _ops(script_ops: Iterable[HeaderOp], at: str) -> tuple[HeaderOp, ...]:
    return tuple(
        HeaderOp(op.action, _header_name(op.name, at), _header_value(op.value, at, formatted=False))
        for op in script_ops
    )


def _header_option(raw: object, at: str) -> HeaderOp | None:
    """One ``HeaderValueOption``; None: an empty value Envoy would not add."""
    option = shapes.mapping(raw, at)
    unknown = set(option) - {"header", "append", "append_action", "appendAction", "keep_empty_value", "keepEmptyValue"}
    if unknown:
        raise _Refused(f"{at}: {', '.join(sorted(unknown))} not supported")
    header = shapes.mapping(option.get("header"), f"{at}.header", required=True)
    if set(header) - {"key", "value"}:
        raise _Refused(f"{at}.header: only key and value are supported")
    name = _header_name(header.get("key"), f"{at}.header.key")
    value = _header_value(header.get("value", ""), f"{at}.header.value")
    append, action_text = option.get("append"), option.get("append_action", option.get("appendAction"))
    if append is not None and action_text is not None:
        raise _Refused(f"{at}: append and append_action may not both be set (Envoy refuses it)")
    if action_text is not None:
        action = _APPEND_ACTIONS.get(str(action_text))
        if action is None:
            raise _Refused(f"{at}.append_action: unknown action {action_text!r}")
    elif append is not None:
        if not isinstance(append, bool):
            raise _Refused(f"{at}.append: expected a boolean")
        action = HeaderAction.APPEND if append else HeaderAction.OVERWRITE
    else:
        action = HeaderAction.APPEND
    keep = option.get("keep_empty_value", option.get("keepEmptyValue", False))
    if not value and keep is not True:
        return None
    return HeaderOp(action, name, value)


def _header_merge(value: Mapping[str, Any], at: str) -> tuple[tuple[HeaderOp, ...], tuple[HeaderOp, ...]]:
    if not value:
        raise _Refused(f"{at}: an empty merge changes nothing")
    unknown = set(value) - set(HEADER_LISTS)
    if unknown:
        raise _Refused(f"{at}: merging {', '.join(sorted(unknown))} is not supported (only the header lists)")
    sides: dict[str, list[HeaderOp]] = {"request": [], "response": []}
    for key, raw in value.items():
        side, remove = HEADER_LISTS[key]
        for i, item in enumerate(shapes.list_of(raw, f"{at}.{key}")):
            if remove:
                sides[side].append(HeaderOp(HeaderAction.REMOVE, _header_name(item, f"{at}.{key}[{i}]")))
            elif (op := _header_option(item, f"{at}.{key}[{i}]")) is not None:
                sides[side].append(op)
    return tuple(sides["request"]), tuple(sides["response"])


def _is_port(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535


def _generation(meta: Mapping[str, Any]) -> int:
    value = meta.get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _route_scope(match: Mapping[str, Any], at: str) -> PatchScope:
    """Rule 6's route-configuration match."""
    rc = shapes.mapping(match.get("routeConfiguration", match.get("route_configuration")), f"{at}.routeConfiguration")
    hostname, port = "", 0
    name = shapes.text(rc.get("name"), f"{at}.routeConfiguration.name")
    if name:
        parsed = _INBOUND_RC.fullmatch(name)
        if parsed is None:
            raise _Refused(f"{at}.routeConfiguration.name: {name!r} names no route configuration of a waypoint")
        port, hostname = int(parsed.group(1)), parsed.group(2)
    number = rc.get("portNumber", rc.get("port_number", 0))
    if number:
        if (
            not isinstance(number, int)
            or isinstance(number, bool)
            or not 1 <= number <= 65535
            or port not in (0, number)
        ):
            raise _Refused(f"{at}.routeConfiguration.portNumber: matches no route configuration")
        port = number
    vhost = shapes.mapping(rc.get("vhost"), f"{at}.routeConfiguration.vhost")
    vhost_name = shapes.text(vhost.get("name"), f"{at}.routeConfiguration.vhost.name")
    if vhost_name:
        parsed = _INBOUND_VHOST.fullmatch(vhost_name)
        if parsed is None or port not in (0, int(parsed.group(1))):
            raise _Refused(f"{at}.routeConfiguration.vhost.name: {vhost_name!r} names no virtual host of a waypoint")
        port = int(parsed.group(1))
    domain = shapes.text(vhost.get("domainName", vhost.get("domain_name")), f"{at}.routeConfiguration.vhost.domainName")
    if domain:
        if hostname not in ("", domain):
            raise _Refused(f"{at}.routeConfiguration.vhost.domainName: matches no virtual host")
        hostname = domain
    if port and not 1 <= port <= 65535:
        raise _Refused(f"{at}.routeConfiguration: port out of range")
    return PatchScope(hostname, port)


def _gateway_route_scope(match: Mapping[str, Any], at: str) -> PatchScope:
    """Rule 8's route-configuration match at an ingress gateway: none, or ``portNumber`` (the listener's port)."""
    rc = shapes.mapping(match.get("routeConfiguration", match.get("route_configuration")), f"{at}.routeConfiguration")
    extra = set(rc) - {"portNumber", "port_number"}
    if extra:
        raise _Refused(f"{at}.routeConfiguration: only portNumber is matched at an ingress gateway ({sorted(extra)})")
    number = rc.get("portNumber", rc.get("port_number", 0))
    if number and not _is_port(number):
        raise _Refused(f"{at}.routeConfiguration.portNumber: expected a port")
    return PatchScope("", number or 0)


def _cluster_scope(match: Mapping[str, Any], at: str) -> PatchScope:
    cluster = shapes.mapping(match.get("cluster"), f"{at}.cluster")
    if cluster.get("subset"):
        raise _Refused(f"{at}.cluster.subset: subset clusters are not supported")
    hostname = shapes.text(cluster.get("service"), f"{at}.cluster.service")
    port = cluster.get("portNumber", cluster.get("port_number", 0)) or 0
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise _Refused(f"{at}.cluster.portNumber: expected a port")
    name = shapes.text(cluster.get("name"), f"{at}.cluster.name")
    if name:
        parsed = _OUTBOUND_CLUSTER.fullmatch(name)
        if parsed is None:
            raise _Refused(f"{at}.cluster.name: {name!r} names no outbound cluster of a waypoint")
        return PatchScope(parsed.group(2), int(parsed.group(1)))
    return PatchScope(hostname, port)


def _wants_h2(value: Mapping[str, Any], at: str) -> None:
    """Rule 6's cluster merge: ``http2_protocol_options``, or the typed HTTP options with an explicit HTTP/2
    config; anything else is refused."""
    keys = set(value)
    if keys and keys <= {"http2_protocol_options", "http2ProtocolOptions"}:
        return
    if keys and keys <= {"typed_extension_protocol_options", "typedExtensionProtocolOptions"}:
        typed = shapes.mapping(next(iter(value.values())), f"{at}.typed_extension_protocol_options")
        options = shapes.mapping(typed.get(HTTP_OPTIONS_KEY), f"{at}.typed_extension_protocol_options")
        explicit = shapes.mapping(
            options.get("explicit_http_config", options.get("explicitHttpConfig")), f"{at}.explicit_http_config"
        )
        only_explicit = set(options) - {"@type"} <= {"explicit_http_config", "explicitHttpConfig"}
        h2 = set(explicit) & {"http2_protocol_options", "http2ProtocolOptions"}
        if set(typed) == {HTTP_OPTIONS_KEY} and only_explicit and h2:
            return
    raise _Refused(f"{at}: only http2_protocol_options is honoured in a cluster merge")


def _lua(value: Mapping[str, Any], at: str) -> HeaderPatch:
    name = shapes.text(value.get("name"), f"{at}.name")
    typed = shapes.mapping(value.get("typed_config", value.get("typedConfig")), f"{at}.typed_config")
    kind = shapes.text(typed.get("@type"), f"{at}.typed_config.@type")
    if name not in LUA_NAMES and kind != LUA_TYPE:
        raise _Refused(f"{at}: HTTP filter {name or kind!r} is not run by Ambit (only envoy.lua header edits)")
    if kind != LUA_TYPE:
        raise _Refused(f"{at}.typed_config: expected {LUA_TYPE}")
    if set(typed) - {"@type", "inlineCode", "inline_code"}:
        raise _Refused(f"{at}.typed_config: only inlineCode is supported")
    code = typed.get("inlineCode", typed.get("inline_code", ""))
    if not isinstance(code, str):
        raise _Refused(f"{at}.typed_config.inlineCode: expected a string")
    try:
        script = parse_header_script(code)
    except LuaSubsetError as exc:
        raise _Refused(f"{at}.typed_config.inlineCode: not run, outside the header-edit subset: {exc}") from None
    return HeaderPatch("", _ops(script.request, f"{at}.inlineCode"), _ops(script.response, f"{at}.inlineCode"))


def _filter_position(match: Mapping[str, Any], operation: str, at: str) -> None:
    listener = shapes.mapping(match.get("listener"), f"{at}.listener")
    if set(listener) - {"filterChain", "filter_chain"}:
        raise _Refused(f"{at}.listener: only filterChain.filter may be matched at a waypoint")
    chain = shapes.mapping(listener.get("filterChain", listener.get("filter_chain")), f"{at}.listener.filterChain")
    if set(chain) - {"filter"}:
        raise _Refused(f"{at}.listener.filterChain: only filter may be matched at a waypoint")
    chain_filter = shapes.mapping(chain.get("filter"), f"{at}.listener.filterChain.filter")
    if shapes.text(chain_filter.get("name"), f"{at}.filter.name") not in ("", HCM):
        raise _Refused(f"{at}.listener.filterChain.filter.name: Ambit runs HTTP filters only in {HCM}")
    sub = shapes.mapping(chain_filter.get("subFilter", chain_filter.get("sub_filter")), f"{at}.filter.subFilter")
    sub_name = shapes.text(sub.get("name"), f"{at}.filter.subFilter.name")
    if operation == "INSERT_BEFORE" and sub_name == ROUTER:
        return
    if operation == "INSERT_AFTER" and sub_name and sub_name != ROUTER:
        return
    raise _Refused(
        f"{at}: {operation} {sub_name or '(no subFilter)'} is not supported; "
        f"Ambit runs a Lua filter INSERT_BEFORE {ROUTER} (or INSERT_AFTER a filter before it)"
    )


def _effect(raw: object, at: str, source: str, gateway: bool) -> _Effect:
    """One configuration patch as Ambit honours it at a waypoint, or with ``gateway`` at an ingress gateway
    (rules 4-8), or :class:`_Refused`."""
    patch_spec = shapes.mapping(raw, at)
    apply_to = shapes.text(patch_spec.get("applyTo", patch_spec.get("apply_to")), f"{at}.applyTo") or "INVALID"
    match = shapes.mapping(patch_spec.get("match"), f"{at}.match")
    context = shapes.text(match.get("context"), f"{at}.match.context") or "ANY"
    patch = shapes.mapping(patch_spec.get("patch"), f"{at}.patch")
    operation = shapes.text(patch.get("operation"), f"{at}.patch.operation") or "INVALID"
    value = shapes.mapping(patch.get("value"), f"{at}.patch.value")
    proxy = shapes.mapping(match.get("proxy"), f"{at}.match.proxy")
    if shapes.mapping(proxy.get("metadata"), f"{at}.match.proxy.metadata"):
        raise _Refused(f"{at}.match.proxy.metadata: Ambit's proxies send no metadata a filter can match")
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
            raise _Refused(f"{at}.match.context: {context} has no effect at {where}")
        if apply_to == "HTTP_FILTER":
            if operation not in ("INSERT_BEFORE", "INSERT_AFTER"):
                raise _Refused(f"{at}.patch.operation: {operation} of an HTTP filter is not supported")
            _filter_position(match, operation, f"{at}.match")
            lua = _lua(value, f"{at}.patch.value")
            patch_value = HeaderPatch(source, lua.request, lua.response)
            return _Effect("filter", patch_value, EVERYWHERE, version_pattern, version_note)
        if operation != "MERGE":
            raise _Refused(f"{at}.patch.operation: {operation} of {apply_to} is not supported (only MERGE)")
        scope = _gateway_route_scope(match, f"{at}.match") if gateway else _route_scope(match, f"{at}.match")
        request, response = _header_merge(value, f"{at}.patch.value")
        level = 0 if apply_to == "VIRTUAL_HOST" else 1
        patch_value = HeaderPatch(source, request, response, scope, level)
        return _Effect("route", patch_value, scope, version_pattern, version_note)
    if apply_to == "HTTP_ROUTE":
        if gateway:
            raise _Refused(f"{at}.applyTo: HTTP_ROUTE patches are honoured at waypoints only")
        if context not in ("SIDECAR_INBOUND", "ANY"):
            raise _Refused(f"{at}.match.context: {context} has no effect at {where}")
        if operation != "MERGE":
            raise _Refused(f"{at}.patch.operation: {operation} of an HTTP route is not supported (only MERGE)")
        scope = _route_scope(match, f"{at}.match")
        try:
            merge = read_route_merge(match, value, at, source, scope)
        except RouteMergeError as exc:
            raise _Refused(str(exc)) from None
        return _Effect("http_route", None, scope, version_pattern, version_note, merge)
    if apply_to == "CLUSTER":
        if operation != "MERGE":
            raise _Refused(f"{at}.patch.operation: {operation} of a cluster is not supported (only MERGE)")
        if context == "SIDECAR_INBOUND" and not gateway:
            raise _Refused(f"{at}.match.context: istiod patches no inbound cluster of a waypoint; no effect")
        if context not in (("GATEWAY", "ANY") if gateway else ("SIDECAR_OUTBOUND", "ANY")):
            raise _Refused(f"{at}.match.context: {context} has no effect at {where}")
        scope = _cluster_scope(match, f"{at}.match")
        _wants_h2(value, f"{at}.patch.value")
        return _Effect("cluster", None, scope, version_pattern, version_note)
    if apply_to == "NETWORK_FILTER":
        if not gateway:
            raise _Refused(f"{at}.applyTo: NETWORK_FILTER patches are honoured at ingress gateways only")
        if context not in ("GATEWAY", "ANY"):
            raise _Refused(f"{at}.match.context: {context} has no effect at {where}")
        if operation != "MERGE":
            raise _Refused(f"{at}.patch.operation: {operation} of a network filter is not supported (only MERGE)")
        _hcm_listener(match, f"{at}.match")
        hops = _hcm_merge(value, f"{at}.patch.value")
        return _Effect("hcm", None, EVERYWHERE, version_pattern, version_note, trusted_hops=hops)
    raise _Refused(f"{at}.applyTo: {apply_to} is not honoured by Ambit")


def _hcm_listener(match: Mapping[str, Any], at: str) -> None:
    """A NETWORK_FILTER merge's match: the HTTP connection manager of any listener, nothing else."""
    listener = shapes.mapping(match.get("listener"), f"{at}.listener")
    if set(listener) - {"filterChain", "filter_chain"}:
        raise _Refused(f"{at}.listener: only filterChain.filter may be matched in a network filter merge")
    chain = shapes.mapping(listener.get("filterChain", listener.get("filter_chain")), f"{at}.listener.filterChain")
    if set(chain) - {"filter"}:
        raise _Refused(f"{at}.listener.filterChain: only filter may be matched in a network filter merge")
    chain_filter = shapes.mapping(chain.get("filter"), f"{at}.listener.filterChain.filter")
    if set(chain_filter) != {"name"} or shapes.text(chain_filter.get("name"), f"{at}.filter.name") != HCM:
        raise _Refused(f"{at}.listener.filterChain.filter: only a merge into {HCM} is honoured")


def _hcm_merge(value: Mapping[str, Any], at: str) -> int | None:
    """The HTTP connection manager fields Ambit honours in a merge (rule 6): ``xff_num_trusted_hops``, and
    ``normalize_path: true`` (what the gateway always does); anything else is refused."""
    typed = shapes.mapping(value.get("typed_config", value.get("typedConfig")), f"{at}.typed_config")
    if set(value) - {"typed_config", "typedConfig"} or shapes.text(typed.get("@type"), f"{at}.@type") != HCM_TYPE:
        raise _Refused(f"{at}: only a typed_config of {HCM_TYPE} is honoured")
    fields = {k: v for k, v in typed.items() if k != "@type"}
    hops: int | None = None
    for key, raw in fields.items():
        if key in ("xff_num_trusted_hops", "xffNumTrustedHops"):
            if not isinstance(raw, int) or isinstance(raw, bool) or not 0 <= raw <= MAX_TRUSTED_HOPS:
                raise _Refused(f"{at}.typed_config.{key}: expected an integer from 0 to {MAX_TRUSTED_HOPS}")
            hops = raw
        elif key in ("normalize_path", "normalizePath") and raw is True:
            continue
        else:
            raise _Refused(f"{at}.typed_config.{key}: not honoured (only xff_num_trusted_hops, normalize_path: true)")
    return hops


def _targets(spec: Mapping[str, Any]) -> tuple[tuple[str, str, str, str], ...]:
    refs = shapes.list_of(spec.get("targetRefs"), "spec.targetRefs")
    if not refs and spec.get("targetRef") is not None:
        refs = [spec.get("targetRef")]
    out = []
    for i, raw in enumerate(refs):
        ref = shapes.mapping(raw, f"spec.targetRefs[{i}]")
        out.append(
            (
                shapes.text(ref.get("group"), f"spec.targetRefs[{i}].group"),
                shapes.text(ref.get("kind"), f"spec.targetRefs[{i}].kind"),
                shapes.text(ref.get("name"), f"spec.targetRefs[{i}].name"),
                shapes.text(ref.get("namespace"), f"spec.targetRefs[{i}].namespace"),
            )
        )
    return tuple(out)


def _read(obj: Mapping[str, Any], notes: list[PatchNote]) -> _Filter | None:
    """The object's targets, selector and, for each proxy kind, its effects and notes; None (and a note in
    ``notes``) when its spec has not the schema's shape."""
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    generation = _generation(meta)
    uid = str(meta.get("uid") or "")

    def note(at: str, reason: str) -> PatchNote:
        return PatchNote(namespace, name, at, reason, uid, generation)

    try:
        spec = shapes.mapping(obj.get("spec"), "spec")
        targets = _targets(spec)
        priority = spec.get("priority", 0) or 0
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise shapes.ShapeError("spec.priority", "expected an integer")
        patches = shapes.list_of(spec.get("configPatches"), "spec.configPatches")
        selector_spec = shapes.mapping(spec.get("workloadSelector"), "spec.workloadSelector")
        labels = shapes.mapping(selector_spec.get("labels"), "spec.workloadSelector.labels")
        selector = {str(k): str(v) for k, v in labels.items()} if "workloadSelector" in spec else None
    except shapes.ShapeError as exc:
        notes.append(note(exc.field, exc.reason))
        return None
    effects: dict[bool, tuple[_Effect, ...]] = {}
    kind_notes: dict[bool, tuple[PatchNote, ...]] = {}
    for gateway in (False, True):
        found: list[_Effect] = []
        refused: list[PatchNote] = []
        for i, raw in enumerate(patches):
            at = f"spec.configPatches[{i}]"
            try:
                effect = _effect(raw, at, f"{namespace}/{name}[{i}]", gateway)
                found.append(effect)
                if effect.version_note:
                    refused.append(note(f"{at}.match.proxy.proxyVersion", effect.version_note))
            except _Refused as exc:
                refused.append(note(at, exc.reason.removeprefix(f"{at}.").removeprefix(f"{at}: ")))
            except shapes.ShapeError as exc:
                refused.append(note(at, f"{exc.field}: {exc.reason}"))
        effects[gateway], kind_notes[gateway] = tuple(found), tuple(refused)
    created = str(meta.get("creationTimestamp") or "")
    return _Filter(namespace, name, priority, created, targets, selector, effects, kind_notes, uid, generation)


def _merge(filters: Iterable[_Filter], version: str, gateway: bool) -> ProxyPatches:
    lua: list[HeaderPatch] = []
    routes: list[HeaderPatch] = []
    h2: list[PatchScope] = []
    hops: int | None = None
    for f in filters:
        for effect in f.effects[gateway]:
            if not version_matches(effect.version_pattern, version):
                continue
            if effect.kind == "filter" and effect.patch is not None:
                lua.append(effect.patch)
            elif effect.kind == "route" and effect.patch is not None:
                routes.append(effect.patch)
            elif effect.kind == "cluster":
                h2.append(effect.scope)
            elif effect.kind == "hcm" and effect.trusted_hops is not None:
                hops = effect.trusted_hops  # merges apply in order: the last one wins
    routes.sort(key=lambda p: p.level)  # stable: the filters' order within a level
    return ProxyPatches(tuple(lua), tuple(routes), tuple(dict.fromkeys(h2)), hops)


def translate_envoy_filters(
    objects: Iterable[Mapping[str, Any]],
    waypoints: Iterable[str],
    *,
    root_namespace: str,
    proxy_version: str,
    gateways: Iterable[IngressProxy] = (),
) -> EnvoyFilterTranslation:
    """Rules 1-8 for every waypoint in ``waypoints`` (``namespace/name`` keys) and every ingress gateway in
    ``gateways``; ``proxy_version``: the version Ambit's proxies state (``ISTIO_VERSION``)."""
    notes: list[PatchNote] = []
    by_namespace: dict[str, list[_Filter]] = {}
    read: list[_Filter] = []
    for obj in objects:
        f = _read(obj, notes)
        if f is not None:
            by_namespace.setdefault(f.namespace, []).append(f)
            read.append(f)

    def candidates(namespace: str) -> list[_Filter]:
        found = [*by_namespace.get(root_namespace, ())]
        if namespace != root_namespace:
            found.extend(by_namespace.get(namespace, ()))
        return found

    attached: dict[tuple[str, str], set[bool]] = {}
    out: dict[str, ProxyPatches] = {}
    route_merges: dict[str, tuple[RouteMerge, ...]] = {}
    for key in sorted(set(waypoints)):
        chosen = [f for f in candidates(key.partition("/")[0]) if f.attaches_to(key, root_namespace)]
        chosen.sort(key=lambda f: f.sort_key(root_namespace))
        for f in chosen:
            attached.setdefault((f.namespace, f.name), set()).add(False)
        if merged := _merge(chosen, proxy_version, False):
            out[key] = merged
        merges = tuple(
            e.route_merge
            for f in chosen
            for e in f.effects[False]
            if e.route_merge is not None and version_matches(e.version_pattern, proxy_version)
        )
        if merges:
            route_merges[key] = merges
    out_gateways: dict[str, ProxyPatches] = {}
    for gateway in sorted(gateways, key=lambda g: g.key):
        chosen = [
            f for f in candidates(gateway.key.partition("/")[0]) if f.attaches_to_gateway(gateway, root_namespace)
        ]
        chosen.sort(key=lambda f: f.sort_key(root_namespace))
        for f in chosen:
            attached.setdefault((f.namespace, f.name), set()).add(True)
        if merged := _merge(chosen, proxy_version, True):
            out_gateways[gateway.key] = merged
    for f in read:
        kinds = attached.get((f.namespace, f.name))
        if kinds is None:
            notes.append(
                PatchNote(
                    f.namespace,
                    f.name,
                    "spec",
                    "applies to no Ambit proxy: waypoints take an EnvoyFilter only by targetRefs to their Gateway "
                    f"(same namespace) or to GatewayClass {WAYPOINT_CLASS} (root namespace), ingress gateways by "
                    "targetRefs or workloadSelector; Ambit runs no sidecars",
                    f.uid,
                    f.generation,
                )
            )
            continue
        for kind in sorted(kinds):
            notes.extend(f.notes[kind])
    return EnvoyFilterTranslation(out, tuple(sorted(set(notes))), out_gateways, route_merges)
