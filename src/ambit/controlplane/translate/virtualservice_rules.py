"""One VirtualService's rules → :mod:`ambit.model.routes` entries for one destination port of a waypoint, as
istiod's waypoint translates them (``listener_waypoint.go`` ``waypointInboundRoute``, ``getWaypointTCPRoutes``;
``route.go`` ``TranslateRoute``, ``TranslateRouteMatch``). Which VirtualServices apply where, and how their rules
join a table, is :mod:`ambit.controlplane.translate.virtualservices`'s business; reading and checking each value,
:mod:`ambit.controlplane.translate.virtualservice_values`'s. The same rules serve an Istio Gateway's server
(:mod:`ambit.controlplane.translate.istio_gateways`): its :class:`RuleContext` names the Gateway, the server's
port is the destination port, and a match's ``gateways`` must name that Gateway instead of ``mesh``;
:func:`connection_match_holds` and :func:`connection_backends` serve its TCP and TLS passthrough servers.

Rules:

1. ``http`` rules keep their written order. A rule without ``match`` matches everything and ends the
   VirtualService's rules (istiod stops there). Each ``match`` entry becomes one table entry (entries ORed, fields
   ANDed). An entry is dropped, never widened, when it cannot hold at this waypoint: ``sourceLabels`` (istiod drops
   them: ambient has no source labels), ``gateways`` not naming ``mesh``, ``port`` other than the destination's,
   or a ``sourceNamespace`` (istiod keeps one equal to the waypoint's namespace *without* testing the source;
   we drop it rather than widen it to every source). Invalid values (a regular expression RE2 would refuse, a
   malformed ``@request.auth.claims`` name) drop the entry too, and are reported.
2. ``StringMatch``: ``exact``, ``prefix`` (a plain string prefix, as Envoy's), ``regex`` (RE2, full match); an
   empty one (``{}``) or ``regex: "*"`` means "present" (istiod's ``present_match``). Header names are
   lower-cased; ``authority`` is a match on the ``host``, ``scheme`` on ``:scheme`` (``https`` only where an
   ingress gateway terminated the client's TLS), ``method`` on the method (exact only; another kind drops
   the entry). A header match may name a pseudo-header (``:method``, ``:authority``, ``:path``, ``:scheme``), as
   Envoy's header matcher reads them. A header named ``@request.auth.claims.a.b`` or ``@request.auth.claims[a][b]``
   matches the verified JWT's claim ``a.b`` instead (istiod's ``translateMetadataMatch``), in ``headers`` and
   ``withoutHeaders`` (:class:`~ambit.model.routes.ClaimMatch`). ``ignoreUriCase`` and ``withoutHeaders`` are
   carried to the engine.
3. Actions, one of: ``redirect`` (``uri``, or ``prefixRewrite`` replacing the matched prefix and preferred to
   ``uri`` as istiod does, ``authority``, ``port`` or ``derivePort``, ``scheme``,
   ``redirectCode`` 301 by default, one of 301/302/303/307/308), ``directResponse`` (``status``, ``body.string``
   or ``body.bytes``), or ``route``. One destination takes every request whatever its weight; several are
   weighted, weight 0 left out (istiod). A destination's ``host`` resolves like ``hosts`` (a Service of that
   hostname, the VirtualService's namespace first); unknown, it answers 503 (Envoy's cluster not found). Its port:
   ``port.number``, else the Service's only port, else the destination's port. ``subset`` is carried
   (:attr:`~ambit.model.routes.BackendService.subset`).
4. ``headers`` (rule and destination): ``request``/``response`` ``set``/``add``/``remove``; a ``host`` or
   ``:authority`` set or added rewrites the authority (istiod). With one destination its headers join the
   rule's; with several, its request headers are its own, and so is a ``host``/``:authority`` it sets unless
   the rule sets the authority itself (``headers`` or ``rewrite.authority``: that one wins, as in istiod's
   routes); its response headers are reported, not applied.
5. ``rewrite.uri`` replaces the matched prefix (the whole path after an exact or regular-expression match, as Envoy's
   ``prefix_rewrite`` does); ``rewrite.authority`` the authority; ``uriRegexRewrite`` replaces every match in the
   path (an RE2 pattern; one RE2 would refuse, or a bad substitution, drops the rule). ``timeout`` bounds the
   exchange (``0s`` none); ``retries``: ``attempts`` (0 none), ``perTryTimeout``, ``retryOn`` (``5xx``,
   ``gateway-error``, ``retriable-4xx``, status codes, ``connect-failure``/``refused-stream``/``reset``; ``5xx``
   and ``gateway-error`` also retry a connection failure, as Envoy counts an upstream reset as a 5xx for both;
   gRPC conditions cannot be judged by status and are ignored; :mod:`ambit.controlplane.translate.http_retry`);
   without ``retries``, the mesh config's ``defaultHttpRetryPolicy`` (istiod's ``TranslateRoute``), its
   ``perTryTimeout`` included, and without one Istio's default. ``mirror`` with
   ``mirrorPercentage`` and ``mirrors`` with ``percentage`` (0 percent: none). ``fault``: ``delay.fixedDelay`` with
   ``percentage``, ``abort.httpStatus`` or ``abort.grpcStatus`` (a status name, sent as its code) with
   ``percentage``. ``corsPolicy`` is carried to the engine (rule 8).
6. ``tcp`` and ``tls`` rules (istiod's ``getWaypointTCPRoutes``): the first ``tls`` rule whose match names
   exactly the Service's hostname as its only ``sniHosts`` (the waypoint reads no SNI) and the port, else the first
   ``tcp`` rule whose match holds for the port; a rule without ``match`` always holds. Its ``route`` gives the
   destination's ``tcp_backends``.
7. Bad content (a field of the wrong type, an unparsable duration, an invalid header) drops that rule, reported
   with the field; nothing raises.
8. ``corsPolicy`` as istiod's ``TranslateCORSPolicy``: ``allowOrigins`` (a ``StringMatch`` each, with a value; the
   deprecated ``allowOrigin`` strings as exact matches when ``allowOrigins`` is empty), ``allowMethods`` (the
   methods Istio's validation accepts), ``allowHeaders`` and ``exposeHeaders`` (header names or ``*``) joined with
   ``,``, ``maxAge`` in whole seconds, ``allowCredentials``, ``unmatchedPreflights`` (``FORWARD``, the default, or
   ``IGNORE``); a bad value drops the rule (rule 7).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ambit.controlplane.translate.http_retry import read_http_retry
from ambit.controlplane.translate.routerules import regex_problem
from ambit.controlplane.translate.virtualservice_values import (
    BadField,
    parse_duration,
    read_header_value,
    read_int,
    read_list,
    read_mapping,
    read_percent,
    read_printable,
    read_string_match,
    read_text,
    read_weight,
)
from ambit.model.field_names import is_token
from ambit.model.routes import (
    GRPC_STATUS_CODES,
    ISTIO_RETRY,
    MAX_CLAIM_PATH,
    PSEUDO_HEADERS,
    BackendService,
    ClaimMatch,
    CorsPolicy,
    DirectResponse,
    Fault,
    HeaderModifier,
    HttpRetry,
    PathMatch,
    PathMatchType,
    PathModifier,
    PathModifierType,
    RegexRewrite,
    RequestMirror,
    RequestRedirect,
    RouteMatch,
    RouteRule,
    Timeouts,
    URLRewrite,
    ValueMatch,
    ValueMatchType,
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
CLAIM_HEADER = "@request.auth.claims"
"""The header-name prefix of a JWT claim match (istiod's ``jwt.HeaderJWTClaim``)."""
MAX_DIRECT_BODY = 64 * 1024
_SUBSET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_REDIRECT_CODES = frozenset((301, 302, 303, 307, 308))
_AUTHORITY = frozenset(("host", ":authority"))
_CORS_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"))

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
    """The mesh config's ``defaultHttpRetryPolicy``: the retries of a rule that states none (rule 5)."""

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
        """A ``Destination`` resolved (rule 5); None when no Service has that host."""
        spec = read_mapping(destination, field)
        host = read_text(spec.get("host"), f"{field}.host")
        if not host:
            raise BadField(f"{field}.host", "required")
        subset = read_text(spec.get("subset"), f"{field}.subset")
        if subset and not _SUBSET_NAME.fullmatch(subset):
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


def _path_match(value: Any, field: str) -> PathMatch | None:
    if value is None:
        return None
    match = read_string_match("", value, field)
    if match.kind is ValueMatchType.PRESENT:
        return None
    if match.kind is ValueMatchType.EXACT:
        if not match.value.startswith("/"):
            raise BadField(f"{field}.exact", "an exact path must start with /")
        return PathMatch(PathMatchType.EXACT, match.value)
    if match.kind is ValueMatchType.PREFIX:
        return PathMatch(PathMatchType.PREFIX, match.value)
    return PathMatch(PathMatchType.REGULAR_EXPRESSION, match.value)


def _claim_path(name: str) -> tuple[str, ...] | None:
    """The claim names of a ``@request.auth.claims`` header name (istiod's ``jwt.ToRoutingClaim``): ``.a.b`` or
    ``[a][b]`` after the prefix (matched case-insensitively); None when ``name`` is not such a name. Empty names
    and more than :data:`~ambit.model.routes.MAX_CLAIM_PATH` of them are refused (no claim could hold)."""
    if not name.lower().startswith(CLAIM_HEADER):
        return None
    rest = name[len(CLAIM_HEADER) :]
    if rest.startswith(".") and len(rest) > 1:
        path = tuple(rest[1:].split("."))
    elif rest.startswith("[") and rest.endswith("]") and len(rest) > 2:
        path = tuple(rest[1:-1].split("]["))
    else:
        return None
    if len(path) > MAX_CLAIM_PATH or not all(step and step.isprintable() for step in path):
        return None
    return path


def _header_matches(value: Any, field: str) -> tuple[tuple[ValueMatch, ...], tuple[ClaimMatch, ...]]:
    """Header matches, and the JWT claim matches written as ``@request.auth.claims`` headers (rule 2)."""
    out: list[ValueMatch] = []
    claims: list[ClaimMatch] = []
    for name, match in sorted(read_mapping(value, field).items(), key=lambda item: str(item[0]).lower()):
        if isinstance(name, str) and name.lower().startswith(CLAIM_HEADER):
            path = _claim_path(name)
            if path is None:
                raise BadField(f"{field}.{name}", "not a claim name (@request.auth.claims.a.b or [a][b])")
            found = read_string_match(name, match, f"{field}.{name}")
            claims.append(ClaimMatch(path, found.value, found.kind))
            continue
        pseudo = isinstance(name, str) and name.lower() in PSEUDO_HEADERS
        if not isinstance(name, str) or not (pseudo or is_token(name)):
            raise BadField(f"{field}", f"not a header name: {name!r}")
        out.append(read_string_match(name.lower(), match, f"{field}.{name}"))
    return tuple(out), tuple(claims)


def _match_holds_here(match: Obj, ctx: RuleContext) -> bool:
    """Rule 3: whether a match entry can hold at this waypoint (or gateway server) for its port (else dropped)."""
    if match.get("sourceLabels"):
        return False
    if not ctx.holds_for(match.get("gateways")):
        return False
    wanted = match.get("port")
    if isinstance(wanted, int) and wanted and wanted != ctx.port:
        return False
    return not match.get("sourceNamespace")


def _route_match(match: Obj, field: str) -> RouteMatch:
    method: str | None = None
    if match.get("method") is not None:
        found = read_string_match(":method", match["method"], f"{field}.method")
        if found.kind is not ValueMatchType.EXACT or not found.value:
            raise BadField(f"{field}.method", "only an exact method match is supported")
        method = read_printable(found.value, f"{field}.method.exact")
    plain, claims = _header_matches(match.get("headers"), f"{field}.headers")
    headers = list(plain)
    if match.get("authority") is not None:
        headers.append(read_string_match("host", match["authority"], f"{field}.authority"))
    if match.get("scheme") is not None:  # istiod: a header match on :scheme
        headers.append(read_string_match(":scheme", match["scheme"], f"{field}.scheme"))
    query = tuple(
        read_string_match(_query_name(name, f"{field}.queryParams"), value, f"{field}.queryParams.{name}")
        for name, value in sorted(
            read_mapping(match.get("queryParams"), f"{field}.queryParams").items(), key=lambda i: str(i[0])
        )
    )
    ignore_case = match.get("ignoreUriCase")
    without, without_claims = _header_matches(match.get("withoutHeaders"), f"{field}.withoutHeaders")
    return RouteMatch(
        path=_path_match(match.get("uri"), f"{field}.uri"),
        headers=tuple(headers),
        query_params=query,
        method=method,
        ignore_path_case=ignore_case is True,
        without_headers=without,
        claims=claims,
        without_claims=without_claims,
    )


def _query_name(name: Any, field: str) -> str:
    text = read_text(name, field)
    if not text:
        raise BadField(field, "a query parameter needs a name")
    return text


def _modifier(value: Any, field: str) -> tuple[HeaderModifier | None, str | None]:
    """A ``HeaderOperations`` and the authority it sets (rule 6)."""
    spec = read_mapping(value, field)
    authority: str | None = None
    pairs: dict[str, list[tuple[str, str]]] = {"set": [], "add": []}
    for op in ("add", "set"):
        for name, raw in sorted(read_mapping(spec.get(op), f"{field}.{op}").items(), key=lambda item: str(item[0])):
            if not isinstance(name, str) or not is_token(name.lstrip(":")):
                raise BadField(f"{field}.{op}", f"not a header name: {name!r}")
            text = read_header_value(raw, f"{field}.{op}.{name}")
            if name.lower() in _AUTHORITY:
                authority = read_printable(text, f"{field}.{op}.{name}")
            else:
                pairs[op].append((name.lower(), text))
    remove = []
    for i, name in enumerate(read_list(spec.get("remove"), f"{field}.remove")):
        text = read_text(name, f"{field}.remove[{i}]")
        if not is_token(text):
            continue  # pseudo-headers and "host" are never removed (istiod drops internal headers)
        if text.lower() not in _AUTHORITY:
            remove.append(text.lower())
    modifier = HeaderModifier(set=tuple(pairs["set"]), add=tuple(pairs["add"]), remove=tuple(remove))
    return (modifier if modifier != HeaderModifier() else None), authority


def _join(first: HeaderModifier | None, second: HeaderModifier | None) -> HeaderModifier | None:
    if first is None or second is None:
        return first or second
    return HeaderModifier(first.set + second.set, first.add + second.add, first.remove + second.remove)


def _headers(value: Any, field: str) -> tuple[HeaderModifier | None, HeaderModifier | None, str | None]:
    spec = read_mapping(value, field)
    request, authority = _modifier(spec.get("request"), f"{field}.request")
    response, _ = _modifier(spec.get("response"), f"{field}.response")
    return request, response, authority


def _regex_rewrite(value: Any, field: str) -> RegexRewrite | None:
    if value is None:
        return None
    spec = read_mapping(value, field)
    pattern = read_text(spec.get("match"), f"{field}.match")
    problem = regex_problem(pattern) if pattern else "required"
    if problem is not None:
        raise BadField(f"{field}.match", problem)
    substitution = read_printable(spec.get("rewrite"), f"{field}.rewrite")
    try:
        re.compile(pattern).sub(substitution, "")  # parses the substitution as the waypoint will
    except (re.error, IndexError) as exc:
        raise BadField(f"{field}.rewrite", f"invalid substitution: {exc}") from None
    return RegexRewrite(pattern, substitution)


def _redirect(value: Any, port: int, field: str) -> RequestRedirect:
    spec = read_mapping(value, field)
    code = read_int(spec.get("redirectCode"), f"{field}.redirectCode") or 301
    if code not in _REDIRECT_CODES:
        raise BadField(f"{field}.redirectCode", f"not a supported redirect status: {code}")
    uri = read_printable(spec.get("uri"), f"{field}.uri")
    prefix = read_printable(spec.get("prefixRewrite"), f"{field}.prefixRewrite")
    path: PathModifier | None = None
    if prefix:  # istiod's ApplyRedirect: prefixRewrite wins over uri
        path = PathModifier(PathModifierType.REPLACE_PREFIX_MATCH, prefix)
    elif uri:
        path = PathModifier(PathModifierType.REPLACE_FULL_PATH, uri)
    redirect_port = read_int(spec.get("port"), f"{field}.port")
    if redirect_port is not None and not 0 < redirect_port < 65536:
        raise BadField(f"{field}.port", f"out of range 1..65535: {redirect_port}")
    if spec.get("derivePort") == "FROM_REQUEST_PORT":
        redirect_port = port
    return RequestRedirect(
        scheme=read_printable(spec.get("scheme"), f"{field}.scheme") or None,
        hostname=read_printable(spec.get("authority"), f"{field}.authority") or None,
        path=path,
        port=redirect_port,
        status_code=code,
        keeps_host_port=True,
    )


def _direct(value: Any, field: str) -> DirectResponse:
    spec = read_mapping(value, field)
    status = read_int(spec.get("status"), f"{field}.status")
    if status is None or not 200 <= status <= 599:
        raise BadField(f"{field}.status", "expected an HTTP status from 200 to 599")
    body_spec = read_mapping(spec.get("body"), f"{field}.body")
    body = b""
    if "string" in body_spec:
        body = read_text(body_spec["string"], f"{field}.body.string").encode()
    elif "bytes" in body_spec:
        try:
            body = base64.b64decode(read_text(body_spec["bytes"], f"{field}.body.bytes"), validate=True)
        except (binascii.Error, ValueError):
            raise BadField(f"{field}.body.bytes", "not base64") from None
    if len(body) > MAX_DIRECT_BODY:
        raise BadField(f"{field}.body", f"longer than {MAX_DIRECT_BODY} bytes")
    return DirectResponse(status, body)


def _fault(value: Any, field: str, notes: list[tuple[str, str]]) -> Fault | None:
    if value is None:
        return None
    spec = read_mapping(value, field)
    delay_spec = read_mapping(spec.get("delay"), f"{field}.delay")
    abort_spec = read_mapping(spec.get("abort"), f"{field}.abort")
    delay = parse_duration(delay_spec["fixedDelay"], f"{field}.delay.fixedDelay") if "fixedDelay" in delay_spec else 0.0
    delay_percent = read_percent(delay_spec.get("percentage"), f"{field}.delay.percentage")
    status = read_int(abort_spec.get("httpStatus"), f"{field}.abort.httpStatus") or 0
    if status and not 200 <= status <= 599:
        raise BadField(f"{field}.abort.httpStatus", "expected an HTTP status from 200 to 599")
    grpc_status = None
    if abort_spec.get("grpcStatus") is not None:
        name = abort_spec["grpcStatus"]
        if status:
            raise BadField(f"{field}.abort", "httpStatus and grpcStatus are exclusive")
        if not isinstance(name, str) or name not in GRPC_STATUS_CODES:
            expected = f"expected a gRPC status name such as UNAVAILABLE, not {name!r}"
            raise BadField(f"{field}.abort.grpcStatus", expected)
        grpc_status = GRPC_STATUS_CODES[name]
    abort_percent = read_percent(abort_spec.get("percentage"), f"{field}.abort.percentage")
    return Fault(
        delay=delay,
        delay_percent=100.0 if delay_percent is None else delay_percent,
        abort_status=status,
        abort_percent=100.0 if abort_percent is None else abort_percent,
        abort_grpc_status=grpc_status,
    )


def _cors(value: Any, field: str) -> CorsPolicy:
    """A ``corsPolicy`` (rule 8)."""
    spec = read_mapping(value, field)
    if spec.get("allowOrigins"):
        origins = []
        for i, item in enumerate(read_list(spec["allowOrigins"], f"{field}.allowOrigins")):
            origin = read_string_match("origin", item, f"{field}.allowOrigins[{i}]")
            if origin.kind is ValueMatchType.PRESENT or not origin.value:
                raise BadField(f"{field}.allowOrigins[{i}]", "expected exact, prefix or regex with a value")
            origins.append(origin)
    else:
        origins = [
            ValueMatch("origin", read_header_value(o, f"{field}.allowOrigin[{i}]"))
            for i, o in enumerate(read_list(spec.get("allowOrigin"), f"{field}.allowOrigin"))
        ]
    methods = [
        read_text(m, f"{field}.allowMethods[{i}]")
        for i, m in enumerate(read_list(spec.get("allowMethods"), f"{field}.allowMethods"))
    ]
    for i, method in enumerate(methods):
        if method not in _CORS_METHODS:
            raise BadField(f"{field}.allowMethods[{i}]", f"not a supported HTTP method: {method[:16]!r}")
    names: dict[str, str] = {}
    for key in ("allowHeaders", "exposeHeaders"):
        items = [read_text(n, f"{field}.{key}[{i}]") for i, n in enumerate(read_list(spec.get(key), f"{field}.{key}"))]
        for i, name in enumerate(items):
            if not is_token(name):
                raise BadField(f"{field}.{key}[{i}]", f"not a header name: {name[:32]!r}")
        names[key] = ",".join(items)
    max_age: int | None = None
    if spec.get("maxAge") is not None:
        seconds = parse_duration(spec["maxAge"], f"{field}.maxAge")
        if seconds != int(seconds):
            raise BadField(f"{field}.maxAge", "whole seconds only")
        max_age = int(seconds)
    credentials = spec.get("allowCredentials")
    if credentials is not None and not isinstance(credentials, bool):
        raise BadField(f"{field}.allowCredentials", "expected true or false")
    unmatched = read_text(spec.get("unmatchedPreflights"), f"{field}.unmatchedPreflights") or "UNSPECIFIED"
    if unmatched not in ("UNSPECIFIED", "FORWARD", "IGNORE"):
        raise BadField(f"{field}.unmatchedPreflights", f"expected FORWARD or IGNORE, got {unmatched[:16]!r}")
    return CorsPolicy(
        allow_origins=tuple(origins),
        allow_methods=",".join(methods),
        allow_headers=names["allowHeaders"],
        expose_headers=names["exposeHeaders"],
        max_age=max_age,
        allow_credentials=credentials is True,
        forward_unmatched_preflights=unmatched != "IGNORE",
    )


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
    """The weighted backends, and with one destination its request and response headers and authority (rule 4).
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
        own_request, own_response, own_authority = _headers(spec.get("headers"), f"{where}.headers")
        if single:
            request, response, authority = own_request, own_response, own_authority
            own_request = None
        else:
            if own_response is not None:
                notes.append((f"{where}.headers", "response headers of one of several destinations are ignored"))
            if own_authority is not None and not rule_authority:  # its own host rewrite, after the rule's edits
                own_request = _join(own_request, HeaderModifier(set=(("host", own_authority),)))
        out.append(WeightedBackend(backend, 100 if single else weight, own_request))
    return tuple(out), request, response, authority


def _http_rule(rule: Obj, match: RouteMatch, ctx: RuleContext, field: str, notes: list[tuple[str, str]]) -> RouteRule:
    """One entry: ``match`` with the rule's actions (rules 5-7)."""
    name = read_printable(rule.get("name"), f"{field}.name")
    request, response, authority = _headers(rule.get("headers"), f"{field}.headers")
    fault = _fault(rule.get("fault"), f"{field}.fault", notes)
    cors = _cors(rule["corsPolicy"], f"{field}.corsPolicy") if rule.get("corsPolicy") is not None else None
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
        return replace(base, redirect=_redirect(rule["redirect"], ctx.port, f"{field}.redirect"))
    if rule.get("directResponse") is not None:
        return replace(base, direct_response=_direct(rule["directResponse"], f"{field}.directResponse"))
    rewrite_spec = read_mapping(rule.get("rewrite"), f"{field}.rewrite")
    rule_authority = bool(authority or read_printable(rewrite_spec.get("authority"), f"{field}.rewrite.authority"))
    backends, dest_request, dest_response, dest_authority = _backends(
        rule, ctx, field, notes, rule_authority=rule_authority
    )
    regex_rewrite = _regex_rewrite(rewrite_spec.get("uriRegexRewrite"), f"{field}.rewrite.uriRegexRewrite")
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
        request_headers=_join(request, dest_request),
        response_headers=_join(response, dest_response),
        rewrite=rewrite,
        mirrors=_mirrors(rule, ctx, field, notes),
        timeouts=Timeouts(request=timeout or None, backend_request=retry.per_try_timeout),
        retry=retry.policy,
        regex_rewrite=regex_rewrite,
    )


def http_rules(spec: Obj, ctx: RuleContext, problems: list[tuple[str, str]]) -> tuple[RouteRule, ...]:
    """Rules 3-7 for one destination port; what is dropped is added to ``problems``."""
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
                    route_match = _route_match(match_spec, where)
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
    """Rule 8: the first TLS rule for ``hostname``, else the first TCP rule, holding for the port."""
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
