"""One Gateway API route's rules → :mod:`ambit.model.routes` entries, and what was wrong with them (spec §1.4).

Theory of operation: :func:`convert_route` turns one ``HTTPRoute``, ``GRPCRoute``, ``TCPRoute`` or ``TLSRoute`` (a plain
API dict) into a :class:`ConvertedRoute`: its HTTP entries (one per match of each rule, each with the key that orders it
by precedence), its TCP backends, and the problems found, each with the Gateway API (or istiod) reason that the route's
``ResolvedRefs`` condition reports. Which destinations the route attaches to is decided by
:mod:`ambit.controlplane.translate.routes`; this module only needs to resolve ``backendRefs`` (``lookup``).

Rules:

1. Defaults as the CRDs write them: a rule without ``matches`` has one match ``PathPrefix /``; a match without
   ``path`` has ``PathPrefix /``; a path, header, query-param or gRPC method match without ``type`` is ``Exact``;
   a ``backendRef`` without ``weight`` has weight 1, without ``group``/``kind`` is a core ``Service``.
2. Matches are validated: an Exact or PathPrefix path starts with ``/``; a RegularExpression (path, header, query
   param) compiles and uses only what RE2 (Envoy's engine) also accepts (no look-around, no back-references), at
   most 1024 characters; a method is one of HTTP's nine. An invalid match is dropped, so a rule whose every match
   is invalid is dropped whole; the problem is ``InvalidConfiguration``.
3. Filters: ``RequestHeaderModifier``, ``ResponseHeaderModifier``, ``RequestRedirect``, ``URLRewrite``,
   ``RequestMirror`` and ``CORS`` (:mod:`ambit.controlplane.translate.cors_filter`, on the rule as istiod puts it)
   (for GRPCRoute the header modifiers and the mirror). Anything else (``ExtensionRef``, an unknown type), or a
   header modifier naming an invalid header name or a value with CR, LF or NUL, makes the rule answer 500, as
   Gateway API requires ("the filter MUST NOT be skipped"); the problem is ``InvalidFilter``. A mirror whose
   backend does not resolve is dropped and reported as rule 4 says.
4. ``backendRefs``: a ``Service`` (group ``""``) named in the route's namespace, or in another namespace when a
   ``ReferenceGrant`` there admits the route's kind and namespace (``RefNotPermitted`` otherwise); a
   ``networking.istio.io`` ``Hostname`` (a ServiceEntry host, or any service hostname; no ``namespace`` allowed),
   as istiod supports; any other kind is ``InvalidKind``; a missing Service or host ``BackendNotFound``; a missing
   ``port`` ``InvalidDestination``. An unresolved backend stays in the rule as ``WeightedBackend(backend=None)``
   with its weight, so its share of requests answers 500. A ``backendRef``'s own filters may only be a
   ``RequestHeaderModifier`` or a ``ResponseHeaderModifier`` (istiod's header operations on the weighted
   destination, applied after the rule's); another (``CORS`` included, which istiod refuses there too) makes that
   backend unresolved (``InvalidFilter``).
5. Timeouts are Gateway API durations (``^([0-9]{1,5}(h|m|s|ms)){1,4}$``, e.g. ``10s``, ``500ms``, ``1m``); zero
   means no limit (istiod); an unparsable one makes the rule invalid (``InvalidConfiguration``).
6. Retries: without ``retry`` (and in every GRPCRoute rule) a rule gets the mesh config's
   ``defaultHttpRetryPolicy``, and without one Istio's default (2 attempts on connect failure and 503): istiod's
   conversion leaves such a rule's VirtualService retries unset. The mesh default's ``perTryTimeout`` becomes the
   rule's ``backendRequest`` unless the rule sets one (istiod would make a ``backendRequest`` the whole exchange's
   timeout there; Ambit bounds each try with it, :class:`~ambit.model.routes.Timeouts`). With ``retry``
   (istiod's reading of ``HTTPRouteRetry``): ``attempts`` (default 2; 0 = none), only the listed ``codes``,
   connection failures always, ``backoff`` a duration (default 25 ms, Envoy's).
7. GRPCRoute method matches become paths as istiod writes them: service and method → Exact
   ``/<service>/<method>``; service only → PathPrefix ``/<service>`` (element-wise, so ``/<service>/x`` matches);
   method only → RegularExpression ``/[^/]+/<method>``; the RegularExpression type → the same shapes as regular
   expressions. Every GRPCRoute match also carries method ``POST`` (:class:`~ambit.model.route_matches.RouteMatch`).
8. TCPRoute and TLSRoute: the backends of all rules, in order (a TLSRoute's ``hostnames`` are kept: which
   destination it applies to is the table's choice, :mod:`ambit.controlplane.translate.routes` rule 5).
9. Precedence (:func:`precedence`): Exact before PathPrefix before RegularExpression (istiod's rank), then the
   longer path value, then a method match before none, then more header matches, then more query-param matches;
   ties: the older route (``metadata.creationTimestamp``), then ``namespace/name``, then rule order, then match
   order.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ambit.controlplane.translate.cors_filter import cors_policy
from ambit.controlplane.translate.fields import mapping as _mapping
from ambit.controlplane.translate.fields import text as _text
from ambit.model.field_names import is_token
from ambit.model.route_matches import MAX_REGEX, PathMatch, PathMatchType, RouteMatch, ValueMatch, ValueMatchType
from ambit.model.routes import (
    ISTIO_RETRY,
    BackendService,
    CorsPolicy,
    HeaderModifier,
    HttpRetry,
    PathModifier,
    PathModifierType,
    RequestMirror,
    RequestRedirect,
    RetryPolicy,
    RouteRule,
    Timeouts,
    URLRewrite,
    WeightedBackend,
)

__all__ = [
    "GATEWAY_GROUP",
    "BackendLookup",
    "ConvertedRoute",
    "Problem",
    "RouteEntry",
    "convert_route",
    "parse_duration",
    "precedence",
    "regex_problem",
]

Obj = Mapping[str, Any]
GATEWAY_GROUP = "gateway.networking.k8s.io"
ISTIO_NETWORKING = "networking.istio.io"
METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"))
_DURATION = re.compile(r"(?:[0-9]{1,5}(?:h|ms|m|s)){1,4}")
_DURATION_PART = re.compile(r"([0-9]{1,5})(h|ms|m|s)")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_NOT_RE2 = re.compile(r"\(\?<?[=!]|\(\?P=|\\[1-9]|\\g<")
_PATH_KINDS = {k.value: k for k in PathMatchType}
_VALUE_KINDS = {k.value: k for k in ValueMatchType}
_RANK = {PathMatchType.EXACT: 3, PathMatchType.PATH_PREFIX: 2, PathMatchType.REGULAR_EXPRESSION: 1}

INVALID_CONFIGURATION = "InvalidConfiguration"
INVALID_FILTER = "InvalidFilter"
INVALID_DESTINATION = "InvalidDestination"
BACKEND_NOT_FOUND = "BackendNotFound"
REF_NOT_PERMITTED = "RefNotPermitted"
INVALID_KIND = "InvalidKind"


class _Invalid(Exception):
    """A part of a rule that cannot be used; carries the reason and message for the status."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a route: the ``ResolvedRefs`` reason and a message."""

    reason: str
    message: str


BackendLookup = Callable[[str, str, str, str, str], BackendService | str]
"""``(group, kind, name, namespace as written, route kind)`` → the backend (its port is ignored: the
``backendRef``'s is used) or a problem reason (``BackendNotFound``, ``RefNotPermitted``, ``InvalidKind``,
``InvalidDestination``)."""


@dataclass(frozen=True, slots=True)
class RouteEntry:
    """One flattened match of one rule, with the key that orders it (rule 9)."""

    key: tuple[Any, ...]
    rule: RouteRule


@dataclass(frozen=True, slots=True)
class ConvertedRoute:
    kind: str
    namespace: str
    name: str
    http: tuple[RouteEntry, ...] = ()
    tcp_backends: tuple[WeightedBackend, ...] = ()
    hostnames: tuple[str, ...] = ()
    problems: tuple[Problem, ...] = ()
    created: str = ""

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


def regex_problem(pattern: str) -> str | None:
    """Why ``pattern`` is not a usable regular expression (rule 2), or None."""
    if len(pattern) > MAX_REGEX:
        return f"regular expression longer than {MAX_REGEX} characters"
    if _NOT_RE2.search(pattern):
        return f"regular expression {pattern!r} uses look-around or a back-reference, which RE2 does not support"
    try:
        with warnings.catch_warnings():
            # Python warns (FutureWarning) where a set's meaning will change, e.g. ``[[`` or ``[[:alpha:]]``, which
            # RE2 reads as a POSIX class: refused rather than matched differently from Envoy.
            warnings.simplefilter("error", FutureWarning)
            re.compile(pattern)
    except FutureWarning as exc:
        return f"regular expression {pattern!r} is ambiguous ({exc}); escape the bracket"
    except (re.error, RecursionError, OverflowError) as exc:
        return f"invalid regular expression {pattern!r}: {exc}"
    return None


def parse_duration(text: Any) -> float | None:
    """A Gateway API duration in seconds (rule 5); None for zero. Raises ``ValueError`` when unparsable."""
    if not isinstance(text, str) or not _DURATION.fullmatch(text):
        raise ValueError(f"invalid duration {text!r} (expected e.g. 10s, 500ms, 1m, 1h30m)")
    seconds = sum(int(n) * _UNIT[unit] for n, unit in _DURATION_PART.findall(text))
    return seconds or None


def precedence(match: RouteMatch, created: str, route: str, rule: int, index: int) -> tuple[Any, ...]:
    """The sort key of one flattened match (rule 9): smaller sorts first."""
    path = match.path
    rank = _RANK[path.kind] if path is not None else 0
    length = len(path.value) if path is not None else 0
    return (
        -rank,
        -length,
        0 if match.method is not None else 1,
        -len(match.headers),
        -len(match.query_params),
        created,
        route,
        rule,
        index,
    )


def _list(value: Any) -> list[Any]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _kind(value: Any, kinds: Mapping[str, Any], what: str) -> Any:
    text = "Exact" if value is None else value
    if not isinstance(text, str) or text not in kinds:
        raise _Invalid(INVALID_CONFIGURATION, f"unknown type: {text!r} is not a supported {what} type")
    return kinds[text]


def _checked_regex(pattern: str) -> str:
    problem = regex_problem(pattern)
    if problem is not None:
        raise _Invalid(INVALID_CONFIGURATION, problem)
    return pattern


def _path(value: Any) -> PathMatch:
    if not isinstance(value, Mapping):
        return PathMatch(PathMatchType.PATH_PREFIX, "/")
    kind = _kind(value.get("type") or "PathPrefix", _PATH_KINDS, "path match")
    text = value.get("value", "/")
    if not isinstance(text, str) or not text:
        raise _Invalid(INVALID_CONFIGURATION, "path match value must be a non-empty string")
    if kind is PathMatchType.REGULAR_EXPRESSION:
        return PathMatch(kind, _checked_regex(text))
    if not text.startswith("/"):
        raise _Invalid(INVALID_CONFIGURATION, f"path {text!r} must start with /")
    return PathMatch(kind, text)


def _values(items: Any, what: str, *, lower: bool) -> tuple[ValueMatch, ...]:
    out: list[ValueMatch] = []
    for item in _list(items):
        name, value = _text(item.get("name")), item.get("value")
        if not name or not isinstance(value, str):
            raise _Invalid(INVALID_CONFIGURATION, f"{what} match needs a name and a string value")
        kind = _kind(item.get("type"), _VALUE_KINDS, f"{what} match")
        if kind is ValueMatchType.REGULAR_EXPRESSION:
            _checked_regex(value)
        out.append(ValueMatch(name.lower() if lower else name, value, kind))
    return tuple(out)


def _http_match(match: Obj) -> RouteMatch:
    method = match.get("method")
    if method is not None and (not isinstance(method, str) or method not in METHODS):
        raise _Invalid(INVALID_CONFIGURATION, f"unknown method {method!r}")
    return RouteMatch(
        path=_path(match.get("path")),
        headers=_values(match.get("headers"), "header", lower=True),
        query_params=_values(match.get("queryParams"), "query param", lower=False),
        method=method,
    )


def _grpc_match(match: Obj) -> RouteMatch:
    headers = _values(match.get("headers"), "header", lower=True)
    method = match.get("method")
    if not isinstance(method, Mapping):
        return RouteMatch(headers=headers, method="POST")
    regex = _kind(method.get("type"), _VALUE_KINDS, "gRPC method match") is ValueMatchType.REGULAR_EXPRESSION
    service, name = _text(method.get("service")), _text(method.get("method"))
    if not service and not name:
        raise _Invalid(INVALID_CONFIGURATION, "gRPC match must have method or service defined")
    if regex:
        _checked_regex(service or "x")
        _checked_regex(name or "x")
        pattern = f"/{service}/{name}" if service and name else f"/{service}/.+" if service else f"/[^/]+/{name}"
        path = PathMatch(PathMatchType.REGULAR_EXPRESSION, _checked_regex(pattern))
    elif service and name:
        path = PathMatch(PathMatchType.EXACT, f"/{service}/{name}")
    elif service:
        path = PathMatch(PathMatchType.PATH_PREFIX, f"/{service}")
    else:
        path = PathMatch(PathMatchType.REGULAR_EXPRESSION, f"/[^/]+/{re.escape(name)}")
    return RouteMatch(path=path, headers=headers, method="POST")


def _header_pairs(items: Any) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for item in _list(items):
        name, value = _text(item.get("name")), item.get("value")
        if not is_token(name) or not isinstance(value, str) or any(c in value for c in "\r\n\0"):
            raise _Invalid(INVALID_FILTER, f"invalid header {name!r} in a header modifier")
        out.append((name.lower(), value))
    return tuple(out)


def _header_modifier(value: Any) -> HeaderModifier:
    spec = value if isinstance(value, Mapping) else {}
    remove = spec.get("remove")
    names = [n for n in remove if isinstance(n, str)] if isinstance(remove, list) else []
    if any(not is_token(n) for n in names):
        raise _Invalid(INVALID_FILTER, "invalid header name in a header modifier's remove list")
    return HeaderModifier(
        set=_header_pairs(spec.get("set")), add=_header_pairs(spec.get("add")), remove=tuple(n.lower() for n in names)
    )


def _path_modifier(value: Any) -> PathModifier | None:
    if not isinstance(value, Mapping):
        return None
    kind = value.get("type")
    if kind == "ReplaceFullPath":
        return PathModifier(PathModifierType.REPLACE_FULL_PATH, _text(value.get("replaceFullPath")))
    if kind == "ReplacePrefixMatch":
        return PathModifier(PathModifierType.REPLACE_PREFIX_MATCH, _text(value.get("replacePrefixMatch")))
    raise _Invalid(INVALID_FILTER, f"unknown path modifier type {kind!r}")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _redirect(value: Any) -> RequestRedirect:
    spec = value if isinstance(value, Mapping) else {}
    status = _int(spec.get("statusCode"))
    scheme = spec.get("scheme")
    hostname = spec.get("hostname")
    return RequestRedirect(
        scheme=scheme if isinstance(scheme, str) else None,
        hostname=hostname if isinstance(hostname, str) else None,
        path=_path_modifier(spec.get("path")),
        port=_int(spec.get("port")),
        status_code=status if status in (301, 302, 303, 307, 308) else 302,
    )


def _rewrite(value: Any) -> URLRewrite:
    spec = value if isinstance(value, Mapping) else {}
    hostname = spec.get("hostname")
    return URLRewrite(hostname=hostname if isinstance(hostname, str) else None, path=_path_modifier(spec.get("path")))


@dataclass(slots=True)
class _RuleParts:
    request_headers: HeaderModifier | None = None
    response_headers: HeaderModifier | None = None
    redirect: RequestRedirect | None = None
    rewrite: URLRewrite | None = None
    mirrors: list[RequestMirror] = field(default_factory=list)
    cors: CorsPolicy | None = None
    answer_500: bool = False


@dataclass(slots=True)
class _Context:
    kind: str
    namespace: str
    lookup: BackendLookup
    problems: list[Problem]

    def backend(self, ref: Obj) -> BackendService | None:
        """Resolve one backendRef (rule 4), recording the problem; None when it does not resolve."""
        group, kind = _text(ref.get("group")), _text(ref.get("kind")) or "Service"
        name = _text(ref.get("name"))
        found = self.lookup(group, kind, name, _text(ref.get("namespace")), self.kind)
        if isinstance(found, str):
            self.problems.append(Problem(found, _backend_message(found, ref, self.kind, self.namespace)))
            return None
        port = _int(ref.get("port"))
        if port is None or not 0 < port < 65536:
            self.problems.append(Problem(INVALID_DESTINATION, "port is required in backendRef"))
            return None
        return BackendService(found.namespace, found.hostname, port)


def _backend_message(reason: str, ref: Obj, route_kind: str, namespace: str) -> str:
    name = _text(ref.get("name"))
    if reason == REF_NOT_PERMITTED:
        return (
            f"backendRef {name}/{_text(ref.get('namespace'))} not accessible to a {route_kind} in namespace "
            f'"{namespace}" (missing a ReferenceGrant?)'
        )
    if reason == INVALID_KIND:
        return f'referencing unsupported backendRef: group "{_text(ref.get("group"))}" kind "{_text(ref.get("kind"))}"'
    if reason == INVALID_DESTINATION:
        return "namespace may not be set with Hostname type"
    return f"backend({name}) not found"


def _filters(filters: Any, ctx: _Context, allowed: frozenset[str]) -> _RuleParts:
    parts = _RuleParts()
    for item in _list(filters):
        kind = item.get("type")
        try:
            if not isinstance(kind, str) or kind not in allowed:
                raise _Invalid(INVALID_FILTER, f'unsupported filter type "{kind}"')
            if kind == "RequestHeaderModifier":
                parts.request_headers = _header_modifier(item.get("requestHeaderModifier"))
            elif kind == "ResponseHeaderModifier":
                parts.response_headers = _header_modifier(item.get("responseHeaderModifier"))
            elif kind == "RequestRedirect":
                parts.redirect = _redirect(item.get("requestRedirect"))
            elif kind == "URLRewrite":
                parts.rewrite = _rewrite(item.get("urlRewrite"))
            elif kind == "CORS":
                parts.cors = cors_policy(item.get("cors"))
            else:
                mirror = _mirror(item.get("requestMirror"), ctx)
                if mirror is not None:
                    parts.mirrors.append(mirror)
        except _Invalid as exc:
            ctx.problems.append(Problem(exc.reason, exc.message))
            parts.answer_500 = True
    return parts


def _mirror(value: Any, ctx: _Context) -> RequestMirror | None:
    spec = value if isinstance(value, Mapping) else {}
    ref = spec.get("backendRef")
    backend = ctx.backend(ref) if isinstance(ref, Mapping) else None
    if backend is None:
        return None
    percent = spec.get("percent")
    fraction = spec.get("fraction")
    share = 100.0
    whole = _int(percent)
    if whole is not None:
        share = float(whole)
    elif isinstance(fraction, Mapping) and _int(fraction.get("numerator")) is not None:
        denominator = _int(fraction.get("denominator")) or 100
        share = 100.0 * int(fraction["numerator"]) / denominator
    return RequestMirror(backend, min(max(share, 0.0), 100.0))


def _backends(refs: Any, ctx: _Context) -> tuple[WeightedBackend, ...]:
    out: list[WeightedBackend] = []
    for ref in _list(refs):
        weight = _int(ref.get("weight"))
        weight = 1 if weight is None else max(weight, 0)
        backend = ctx.backend(ref)
        headers: HeaderModifier | None = None
        response: HeaderModifier | None = None
        for item in _list(ref.get("filters")):
            try:
                kind = item.get("type")
                if kind == "RequestHeaderModifier":
                    headers = _header_modifier(item.get("requestHeaderModifier"))
                elif kind == "ResponseHeaderModifier":
                    response = _header_modifier(item.get("responseHeaderModifier"))
                else:
                    raise _Invalid(INVALID_FILTER, f'unsupported backendRef filter type "{kind}"')
            except _Invalid as exc:
                ctx.problems.append(Problem(exc.reason, exc.message))
                backend = None
        out.append(WeightedBackend(backend, weight, headers, response))
    return tuple(out)


def _retry(value: Any, default: HttpRetry) -> RetryPolicy:
    if not isinstance(value, Mapping):
        return default.policy  # istiod's conversion leaves the VirtualService's retries unset: the mesh default
    attempts = _int(value.get("attempts"))
    codes = value.get("codes")
    backoff = value.get("backoff")
    return RetryPolicy(
        attempts=2 if attempts is None else max(attempts, 0),
        codes=tuple(c for c in codes if _int(c) is not None) if isinstance(codes, list) else (),
        backoff=0.025 if backoff is None else (parse_duration(backoff) or 0.0),
        on_connect_failure=True,
    )


def _timeouts(value: Any) -> Timeouts:
    if not isinstance(value, Mapping):
        return Timeouts()
    request, backend = value.get("request"), value.get("backendRequest")
    return Timeouts(
        request=None if request is None else parse_duration(request),
        backend_request=None if backend is None else parse_duration(backend),
    )


_HTTP_FILTERS = frozenset(
    ("RequestHeaderModifier", "ResponseHeaderModifier", "RequestRedirect", "URLRewrite", "RequestMirror", "CORS")
)
_GRPC_FILTERS = frozenset(("RequestHeaderModifier", "ResponseHeaderModifier", "RequestMirror"))


_OPAQUE_KINDS = frozenset(("TCPRoute", "TLSRoute"))
"""Routes of connections (rule 8): backends only."""


def _created(obj: Obj) -> str:
    meta = obj.get("metadata")
    return _text(meta.get("creationTimestamp")) if isinstance(meta, Mapping) else ""


def convert_route(kind: str, obj: Obj, lookup: BackendLookup, default_retry: HttpRetry = ISTIO_RETRY) -> ConvertedRoute:
    """One route's entries, backends and problems (rules 1-9); ``default_retry`` is the mesh config's
    ``defaultHttpRetryPolicy``, for a rule without ``retry`` (and every GRPCRoute rule)."""
    meta = _mapping(obj.get("metadata"))
    namespace, name = _text(meta.get("namespace")), _text(meta.get("name"))
    spec = _mapping(obj.get("spec"))
    ctx = _Context(kind, namespace, lookup, [])
    raw_hostnames = spec.get("hostnames")
    hostnames = tuple(h for h in raw_hostnames if isinstance(h, str)) if isinstance(raw_hostnames, list) else ()
    created = _created(obj)
    route_key = f"{kind}/{namespace}/{name}"
    if kind in _OPAQUE_KINDS:
        backends = tuple(b for rule in _list(spec.get("rules")) for b in _backends(rule.get("backendRefs"), ctx))
        return ConvertedRoute(kind, namespace, name, (), backends, hostnames, tuple(ctx.problems), created)
    grpc = kind == "GRPCRoute"
    entries: list[RouteEntry] = []
    for rule_index, rule in enumerate(_list(spec.get("rules"))):
        try:
            timeouts = Timeouts() if grpc else _timeouts(rule.get("timeouts"))
            retry = default_retry.policy if grpc else _retry(rule.get("retry"), default_retry)
            if (grpc or not isinstance(rule.get("retry"), Mapping)) and timeouts.backend_request is None:
                timeouts = replace(timeouts, backend_request=default_retry.per_try_timeout)
        except ValueError as exc:
            ctx.problems.append(Problem(INVALID_CONFIGURATION, str(exc)))
            continue
        matches: list[RouteMatch] = []
        raw = _list(rule.get("matches")) or [{}]
        for match in raw:
            try:
                matches.append(_grpc_match(match) if grpc else _http_match(match))
            except _Invalid as exc:
                ctx.problems.append(Problem(exc.reason, exc.message))
        if not matches:
            continue
        parts = _filters(rule.get("filters"), ctx, _GRPC_FILTERS if grpc else _HTTP_FILTERS)
        backends = () if parts.answer_500 else _backends(rule.get("backendRefs"), ctx)
        for match_index, match in enumerate(matches):
            entry = RouteRule(
                route=route_key,
                match=match,
                backends=backends,
                request_headers=None if parts.answer_500 else parts.request_headers,
                response_headers=None if parts.answer_500 else parts.response_headers,
                redirect=None if parts.answer_500 else parts.redirect,
                rewrite=None if parts.answer_500 else parts.rewrite,
                mirrors=() if parts.answer_500 else tuple(parts.mirrors),
                cors=None if parts.answer_500 else parts.cors,
                timeouts=timeouts,
                retry=retry,
                rule_name=_text(rule.get("name")),
            )
            key = precedence(match, created, f"{namespace}/{name}", rule_index, match_index)
            entries.append(RouteEntry(key, entry))
    return ConvertedRoute(kind, namespace, name, tuple(entries), (), hostnames, tuple(ctx.problems), created)
