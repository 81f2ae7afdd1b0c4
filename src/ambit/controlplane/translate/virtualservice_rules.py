"""One VirtualService's rules → :mod:`ambit.model.routes` entries for one destination port of a waypoint, as
istiod's waypoint translates them (``listener_waypoint.go`` ``waypointInboundRoute``, ``getWaypointTCPRoutes``;
``route.go`` ``TranslateRoute``). Which VirtualServices apply where, and how their rules join a table, is
:mod:`ambit.controlplane.translate.virtualservices`'s business; reading and checking each value,
:mod:`ambit.controlplane.translate.virtualservice_values`'s; a match entry's values,
:mod:`ambit.controlplane.translate.virtualservice_matches`'s; a redirect, direct response, header operations,
regular-expression rewrite, fault or CORS policy, :mod:`ambit.controlplane.translate.virtualservice_actions`'s. The
same rules serve an Istio Gateway's server (:mod:`ambit.controlplane.translate.istio_gateways`): its
:class:`RuleContext` names the Gateway, the server's port is the destination port, and a match's ``gateways`` must
name that Gateway instead of ``mesh``; :func:`connection_match_holds` and :func:`connection_backends` serve its TCP
and TLS passthrough servers.

Rules:

1. ``http`` rules keep their written order. A rule without ``match`` matches everything and ends the
   VirtualService's rules (istiod stops there). Each ``match`` entry becomes one table entry (entries ORed, fields
   ANDed). An entry is dropped, never widened, when it cannot hold at this waypoint: ``sourceLabels`` (istiod drops
   them: ambient has no source labels), ``gateways`` not naming ``mesh``, ``port`` other than the destination's,
   or a ``sourceNamespace`` (istiod keeps one equal to the waypoint's namespace *without* testing the source;
   we drop it rather than widen it to every source). Invalid values (a regular expression RE2 would refuse, a
   malformed ``@request.auth.claims`` name; :mod:`~ambit.controlplane.translate.virtualservice_matches`) drop the
   entry too, and are reported.
2. Actions, one of: ``redirect``, ``directResponse``
   (:mod:`~ambit.controlplane.translate.virtualservice_actions` rules 1-2), or ``route``. One destination takes
   every request whatever its weight; several are weighted, weight 0 left out (istiod). A destination's ``host``
   resolves like ``hosts`` (a Service of that hostname, the VirtualService's namespace first); unknown, it answers
   503 (Envoy's cluster not found). Its port: ``port.number``, else the Service's only port, else the
   destination's port. ``subset`` is carried (:attr:`~ambit.model.routes.BackendService.subset`).
3. ``headers`` (rule and destination; read by
   :mod:`~ambit.controlplane.translate.virtualservice_actions` rule 3): with one destination its headers join the
   rule's; with several, its request headers are its own, and so is a ``host``/``:authority`` it sets unless the
   rule sets the authority itself (``headers`` or ``rewrite.authority``: that one wins, as in istiod's routes); its
   response headers are reported, not applied.
4. ``rewrite.uri`` replaces the matched prefix (the whole path after an exact or regular-expression match, as Envoy's
   ``prefix_rewrite`` does); ``rewrite.authority`` the authority; ``uriRegexRewrite`` replaces every match in the
   path (:mod:`~ambit.controlplane.translate.virtualservice_actions` rule 4). ``timeout`` bounds the exchange
   (``0s`` none); ``retries``: ``attempts`` (0 none), ``perTryTimeout``, ``retryOn`` (``5xx``, ``gateway-error``,
   ``retriable-4xx``, status codes, ``connect-failure``/``refused-stream``/``reset``; ``5xx`` and
   ``gateway-error`` also retry a connection failure, as Envoy counts an upstream reset as a 5xx for both; gRPC
   conditions cannot be judged by status and are ignored; :mod:`ambit.controlplane.translate.http_retry`); without
   ``retries``, the mesh config's ``defaultHttpRetryPolicy`` (istiod's ``TranslateRoute``), its ``perTryTimeout``
   included, and without one Istio's default. ``mirror`` with ``mirrorPercentage`` and ``mirrors`` with
   ``percentage`` (0 percent: none). ``fault`` and ``corsPolicy`` are carried to the engine
   (:mod:`~ambit.controlplane.translate.virtualservice_actions` rules 5-6).
5. ``tcp`` and ``tls`` rules (istiod's ``getWaypointTCPRoutes``): the first ``tls`` rule whose match names
   exactly the Service's hostname as its only ``sniHosts`` (the waypoint reads no SNI) and the port, else the first
   ``tcp`` rule whose match holds for the port; a rule without ``match`` always holds. Its ``route`` gives the
   destination's ``tcp_backends``.
6. Bad content (a field of the wrong type, an unparsable duration, an invalid header) drops that rule, reported
   with the field; nothing raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ambit.controlplane.translate.http_retry import read_http_retry
from ambit.controlplane.translate.virtualservice_actions import (
    join_headers,
    read_cors,
    read_direct_response,
    read_fault,
    read_headers,
    read_redirect,
    read_regex_rewrite,
)
from ambit.controlplane.translate.virtualservice_matches import read_route_match
from ambit.controlplane.translate.virtualservice_values import (
    BadField,
    parse_duration,
    read_int,
    read_list,
    read_mapping,
    read_percent,
    read_printable,
    read_text,
    read_weight,
)
from ambit.model.route_matches import PathMatchType, RouteMatch
from ambit.model.routes import (
    ISTIO_RETRY,
    SUBSET_NAME,
    BackendService,
    HeaderModifier,
    HttpRetry,
    PathModifier,
    PathModifierType,
    RequestMirror,
    RouteRule,
    Timeouts,
    URLRewrite,
    WeightedBackend,
)
from ambit.model.workload import Service

__all__ = [
    "MESH",
    "BadField",
    "RuleContext",
    "connection_backends",
    "connection_match_holds",
    "connection_route",
    "for_mesh",
    "fqdn",
    "gateway_key",
    "http_rules",
    "parse_duration",
]

MESH = "mesh"
MISSING_BACKEND = 503

Obj = Mapping[str, Any]


def fqdn(host: str, namespace: str, domain: str) -> str:
    """A short name resolved in ``namespace`` (istiod's ``ResolveShortnameToFQDN``)."""
    if host == "*" or "." in host:
        return host
    return f"{host}.{namespace}.svc.{domain}"


def for_mesh(gateways: Any) -> bool:
    return not isinstance(gateways, list) or not gateways or MESH in gateways


def gateway_key(reference: str, namespace: str) -> str:
    """A VirtualService's ``gateways`` entry as ``namespace/name``: ``name`` is in the VirtualService's
    ``namespace``; ``mesh`` stays ``mesh``."""
    if reference == MESH or "/" in reference:
        return reference
    return f"{namespace}/{reference}"


@dataclass(frozen=True, slots=True)
class RuleContext:
    """What converting one VirtualService for one destination port needs."""

    namespace: str
    name: str
    domain: str
    port: int
    by_hostname: Mapping[str, tuple[Service, ...]]
    gateway: str = ""
    """``namespace/name`` of the Istio Gateway whose server the rules are for; empty: for the waypoints (``mesh``)."""
    default_retry: HttpRetry = ISTIO_RETRY
    """The mesh config's ``defaultHttpRetryPolicy``: the retries of a rule that states none (rule 4)."""

    def holds_for(self, gateways: Any) -> bool:
        """Whether a ``gateways`` list (of a rule's match) lets it hold here: at a waypoint, empty or naming
        ``mesh``; at an Istio Gateway's server, empty or naming that Gateway (``name`` in the VirtualService's
        namespace, or ``namespace/name``)."""
        if not self.gateway:
            return for_mesh(gateways)
        if not isinstance(gateways, list) or not gateways:
            return True
        return self.gateway in {gateway_key(g, self.namespace) for g in gateways if isinstance(g, str)}

    @property
    def route(self) -> str:
        return f"VirtualService/{self.namespace}/{self.name}"

    def backend(self, destination: Any, field: str) -> BackendService | None:
        """A ``Destination`` resolved (rule 2); None when no Service has that host."""
        spec = read_mapping(destination, field)
        host = read_text(spec.get("host"), f"{field}.host")
        if not host:
            raise BadField(f"{field}.host", "required")
        subset = read_text(spec.get("subset"), f"{field}.subset")
        if subset and not SUBSET_NAME.fullmatch(subset):
            raise BadField(f"{field}.subset", "not a DNS label (a DestinationRule subset name)")
        port = read_int(read_mapping(spec.get("port"), f"{field}.port").get("number"), f"{field}.port.number")
        if port is not None and not 0 < port < 65536:
            raise BadField(f"{field}.port.number", f"out of range 1..65535: {port}")
        hostname = fqdn(host, self.namespace, self.domain)
        found = sorted(self.by_hostname.get(hostname, ()), key=lambda s: (s.namespace != self.namespace, s.namespace))
        if not found:
            return None
        service = found[0]
        if port is None:
            ports = sorted({m.service_port for m in service.ports})
            port = ports[0] if len(ports) == 1 else self.port
        return BackendService(service.namespace, service.hostname, port, subset)


def _match_holds_here(match: Obj, ctx: RuleContext) -> bool:
    """Rule 1: whether a match entry can hold at this waypoint (or gateway server) for its port (else dropped)."""
    if match.get("sourceLabels"):
        return False
    if not ctx.holds_for(match.get("gateways")):
        return False
    wanted = match.get("port")
    if isinstance(wanted, int) and wanted and wanted != ctx.port:
        return False
    return not match.get("sourceNamespace")


def _mirrors(rule: Obj, ctx: RuleContext, field: str, notes: list[tuple[str, str]]) -> tuple[RequestMirror, ...]:
    wanted: list[tuple[Any, float | None, str]] = []
    if rule.get("mirror") is not None:
        percent = read_percent(rule.get("mirrorPercentage"), f"{field}.mirrorPercentage")
        wanted.append((rule["mirror"], percent, f"{field}.mirror"))
    for i, item in enumerate(read_list(rule.get("mirrors"), f"{field}.mirrors")):
        spec = read_mapping(item, f"{field}.mirrors[{i}]")
        percent = read_percent(spec.get("percentage"), f"{field}.mirrors[{i}].percentage")
        wanted.append((spec.get("destination"), percent, f"{field}.mirrors[{i}].destination"))
    out: list[RequestMirror] = []
    for destination, percent, where in wanted:
        if percent == 0.0:
            continue
        backend = ctx.backend(destination, where)
        if backend is None:
            notes.append((f"{where}.host", "no service has this host; the mirror is left out"))
            continue
        out.append(RequestMirror(backend, 100.0 if percent is None else percent))
    return tuple(out)


def _backends(
    rule: Obj, ctx: RuleContext, field: str, notes: list[tuple[str, str]], *, rule_authority: bool
) -> tuple[tuple[WeightedBackend, ...], HeaderModifier | None, HeaderModifier | None, str | None]:
    """The weighted backends, and with one destination its request and response headers and authority (rule 3).
    ``rule_authority``: the rule sets the authority itself (then a destination's is ignored)."""
    routes = read_list(rule.get("route"), f"{field}.route")
    if not routes:
        raise BadField(f"{field}.route", "a rule needs a route, a redirect or a direct response")
    single = len(routes) == 1
    out: list[WeightedBackend] = []
    request: HeaderModifier | None = None
    response: HeaderModifier | None = None
    authority: str | None = None
    for i, item in enumerate(routes):
        where = f"{field}.route[{i}]"
        spec = read_mapping(item, where)
        weight = read_weight(spec.get("weight"), f"{where}.weight")
        if not single and weight == 0:
            continue
        backend = ctx.backend(spec.get("destination"), f"{where}.destination")
        own_request, own_response, own_authority = read_headers(spec.get("headers"), f"{where}.headers")
        if single:
            request, response, authority = own_request, own_response, own_authority
            own_request = None
        else:
            if own_response is not None:
                notes.append((f"{where}.headers", "response headers of one of several destinations are ignored"))
            if own_authority is not None and not rule_authority:  # its own host rewrite, after the rule's edits
                own_request = join_headers(own_request, HeaderModifier(set=(("host", own_authority),)))
        out.append(WeightedBackend(backend, 100 if single else weight, own_request))
    return tuple(out), request, response, authority


def _http_rule(rule: Obj, match: RouteMatch, ctx: RuleContext, field: str, notes: list[tuple[str, str]]) -> RouteRule:
    """One entry: ``match`` with the rule's actions (rules 2-4, 6)."""
    name = read_printable(rule.get("name"), f"{field}.name")
    request, response, authority = read_headers(rule.get("headers"), f"{field}.headers")
    fault = read_fault(rule.get("fault"), f"{field}.fault", notes)
    cors = read_cors(rule["corsPolicy"], f"{field}.corsPolicy") if rule.get("corsPolicy") is not None else None
    if rule.get("delegate") is not None:
        raise BadField(f"{field}.delegate", "delegation is not supported at the waypoint")
    base = RouteRule(
        route=ctx.route,
        match=match,
        request_headers=request,
        response_headers=response,
        fault=fault,
        rule_name=name,
        missing_backend_status=MISSING_BACKEND,
        cors=cors,
    )
    if rule.get("redirect") is not None:
        return replace(base, redirect=read_redirect(rule["redirect"], ctx.port, f"{field}.redirect"))
    if rule.get("directResponse") is not None:
        return replace(base, direct_response=read_direct_response(rule["directResponse"], f"{field}.directResponse"))
    rewrite_spec = read_mapping(rule.get("rewrite"), f"{field}.rewrite")
    rule_authority = bool(authority or read_printable(rewrite_spec.get("authority"), f"{field}.rewrite.authority"))
    backends, dest_request, dest_response, dest_authority = _backends(
        rule, ctx, field, notes, rule_authority=rule_authority
    )
    regex_rewrite = read_regex_rewrite(rewrite_spec.get("uriRegexRewrite"), f"{field}.rewrite.uriRegexRewrite")
    uri = read_printable(rewrite_spec.get("uri"), f"{field}.rewrite.uri")
    path: PathModifier | None = None
    if uri:
        prefix = match.path is None or match.path.kind is PathMatchType.PREFIX
        path = PathModifier(
            PathModifierType.REPLACE_PREFIX_MATCH if prefix else PathModifierType.REPLACE_FULL_PATH, uri
        )
    host = read_printable(rewrite_spec.get("authority"), f"{field}.rewrite.authority") or authority or dest_authority
    rewrite = URLRewrite(hostname=host or None, path=path) if host or path else None
    timeout = parse_duration(rule["timeout"], f"{field}.timeout") if rule.get("timeout") is not None else None
    retry = read_http_retry(rule.get("retries"), f"{field}.retries", ctx.default_retry)
    return replace(
        base,
        backends=backends,
        request_headers=join_headers(request, dest_request),
        response_headers=join_headers(response, dest_response),
        rewrite=rewrite,
        mirrors=_mirrors(rule, ctx, field, notes),
        timeouts=Timeouts(request=timeout or None, backend_request=retry.per_try_timeout),
        retry=retry.policy,
        regex_rewrite=regex_rewrite,
    )


def http_rules(spec: Obj, ctx: RuleContext, problems: list[tuple[str, str]]) -> tuple[RouteRule, ...]:
    """Rules 1-4 and 6 for one destination port; what is dropped is added to ``problems``."""
    out: list[RouteRule] = []
    try:
        rules = read_list(spec.get("http"), "spec.http")
    except BadField as bad:
        problems.append((bad.field, bad.reason))
        return ()
    for i, raw in enumerate(rules):
        field = f"spec.http[{i}]"
        notes: list[tuple[str, str]] = []
        catch_all = False
        try:
            rule = read_mapping(raw, field)
            matches = read_list(rule.get("match"), f"{field}.match")
            if not matches:
                out.append(_http_rule(rule, RouteMatch(), ctx, field, notes))
                problems.extend(notes)
                break
            for j, raw_match in enumerate(matches):
                where = f"{field}.match[{j}]"
                try:
                    match_spec = read_mapping(raw_match, where)
                    if not _match_holds_here(match_spec, ctx):
                        continue
                    route_match = read_route_match(match_spec, where)
                    out.append(_http_rule(rule, route_match, ctx, field, notes))
                    if route_match == RouteMatch():
                        catch_all = True
                        break
                except BadField as bad:
                    if bad.field.startswith(where):
                        problems.append((bad.field, f"{bad.reason}; this match is left out"))
                        continue
                    raise
        except BadField as bad:
            problems.append((bad.field, f"{bad.reason}; this rule is left out"))
            continue
        problems.extend(dict.fromkeys(notes))
        if catch_all:
            break  # every later rule is unreachable (istiod stops here too)
    return tuple(out)


def connection_backends(routes: Any, ctx: RuleContext, field: str) -> tuple[WeightedBackend, ...]:
    items = read_list(routes, field)
    single = len(items) == 1
    out: list[WeightedBackend] = []
    for i, item in enumerate(items):
        spec = read_mapping(item, f"{field}[{i}]")
        weight = read_weight(spec.get("weight"), f"{field}[{i}].weight")
        if not single and weight <= 0:
            continue
        out.append(
            WeightedBackend(
                ctx.backend(spec.get("destination"), f"{field}[{i}].destination"), 100 if single else weight
            )
        )
    return tuple(out)


def connection_match_holds(match: Obj, ctx: RuleContext) -> bool:
    if match.get("sourceLabels") or match.get("sourceNamespace") or match.get("destinationSubnets"):
        return False
    wanted = match.get("port")
    return ctx.holds_for(match.get("gateways")) and not (isinstance(wanted, int) and wanted and wanted != ctx.port)


def connection_route(spec: Obj, ctx: RuleContext, hostname: str) -> tuple[bool, tuple[WeightedBackend, ...]] | None:
    """Rule 5: the first TLS rule for ``hostname``, else the first TCP rule, holding for the port."""
    for tls, key in ((True, "tls"), (False, "tcp")):
        for i, raw in enumerate(read_list(spec.get(key), f"spec.{key}")):
            rule = read_mapping(raw, f"spec.{key}[{i}]")
            matches = [
                read_mapping(m, f"spec.{key}[{i}].match")
                for m in read_list(rule.get("match"), f"spec.{key}[{i}].match")
            ]
            holds = not matches or any(
                connection_match_holds(m, ctx) and (not tls or m.get("sniHosts") == [hostname]) for m in matches
            )
            if holds:
                return tls, connection_backends(rule.get("route"), ctx, f"spec.{key}[{i}].route")
    return None
