"""Model route tables ↔ the ``ambit.waypoint.v1.WaypointConfig`` resource (``proto/waypoint.proto``).

Theory of operation: :func:`waypoint_config_to_proto` encodes a :class:`~ambit.model.routes.WaypointConfig` field
for field (the control plane's side). :func:`decode_waypoint_config` is where a waypoint judges what it was sent,
as :mod:`ambit.xds.convert` does for addresses: the first problem raises :class:`XdsConversionError` naming the
resource and the field (e.g. ``app/waypoint: tables[0].http[2].match.path.value: invalid regular expression``), so
that the client NACKs that one resource and keeps the rest.

Rules:

1. The resource name is the body's ``waypoint`` (``namespace/name``); a resource whose name disagrees is refused.
2. Ports (table, backend, redirect) are 1..65535; a redirect's status code is 301, 302, 303, 307 or 308; a mirror's
   percent is 0..100; durations are non-negative.
3. A path match has a known type and a value; an Exact or PathPrefix value starts with ``/`` (a plain
   string Prefix may be any string); a regular
   expression (path, header, query param) compiles and is at most 1024 characters. A header name is a token
   (a header match may also name one of :data:`~ambit.model.routes.PSEUDO_HEADERS`); a claim match has 1 to
   :data:`~ambit.model.routes.MAX_CLAIM_PATH` printable names in its path;
   header values carry no CR, LF or NUL (they are written into requests and responses as they are).
4. Enum values this build does not know are refused (they would change what a rule matches).
5. An absent ``retry`` is Istio's default policy; an absent ``timeouts`` or duration is no limit; an absent
   ``backend`` of a weighted backend is an unresolved one (answers 500).
6. Durations travel as ``google.protobuf.Duration``; seconds given in milliseconds come back exactly.
7. Nothing but :class:`XdsConversionError` escapes decoding.
8. ``policies`` (the AuthorizationPolicies bound to the waypoint) are judged by :mod:`ambit.xds.waypoint_policies`.
9. ``request_authentications`` (field 4) are judged by :mod:`ambit.xds.requestauth`.
10. A fault's percents are 0..100 and its abort status 200..599 (0: no abort), or its gRPC abort status 0..16
    (never both); a direct response's status is
    200..599 and its body at most :data:`MAX_DIRECT_BODY` bytes; ``missing_backend_status`` is 0 (500) or 500..599.
11. ``destination_rules`` (field 6) are judged by :mod:`ambit.xds.destinationrules`.
12. ``metrics`` (field 7, the Telemetry API's overrides) are judged by :mod:`ambit.xds.metric_overrides`.
13. ``services`` (field 8, the Services bound to the waypoint) are printable ``namespace/hostname`` keys, each
    given once; they are kept sorted. ``race_first_connect`` (field 9) and ``dynamic_dns`` (field 10) are read the
    same way.
14. A CORS policy's origin matches are Exact, Prefix or RegularExpression (rule 3's limits) with a value; its
    header values carry no CR, LF or NUL; ``max_age`` is at most :data:`MAX_CORS_AGE` seconds.
15. ``envoy_patches`` (field 11, the EnvoyFilter patches the waypoint honours) are judged by
    :mod:`ambit.xds.envoy_patches`.
16. ``default_retry`` and ``default_per_try_timeout`` (fields 12, 13: the mesh config's ``defaultHttpRetryPolicy``)
    give the retries of the waypoint's default route; both absent is Istio's default (rule 5), a timeout alone
    joins Istio's default policy.
17. ``mesh_locality_lb`` (field 14, the mesh config's ``localityLbSetting``) is judged by
    :mod:`ambit.xds.destinationrules` (its rule 8); absent, Istio's default.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import DecodeError

from ambit.api import waypoint_pb2 as pb
from ambit.model.field_names import is_token
from ambit.model.routes import (
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
    RetryPolicy,
    RouteMatch,
    RouteRule,
    RouteTable,
    Timeouts,
    URLRewrite,
    ValueMatch,
    ValueMatchType,
    WaypointConfig,
    WeightedBackend,
)
from ambit.xds.authorization import PolicyReader
from ambit.xds.convert import FieldReader
from ambit.xds.destinationrules import DestinationPolicyReader, destination_policy_to_proto, mesh_locality_to_proto
from ambit.xds.envoy_patches import EnvoyPatchesReader, envoy_patches_to_proto
from ambit.xds.errors import XdsConversionError
from ambit.xds.metric_overrides import MetricOverridesReader, service_metrics_to_proto
from ambit.xds.requestauth import RequestAuthReader, request_authentication_to_proto
from ambit.xds.waypoint_policies import waypoint_policy_from_proto, waypoint_policy_to_proto

__all__ = [
    "WAYPOINT_CONFIG_TYPE_URL",
    "decode_waypoint_config",
    "pack_waypoint_config",
    "waypoint_config_from_proto",
    "waypoint_config_to_proto",
]

WAYPOINT_CONFIG_TYPE_URL = "type.googleapis.com/ambit.waypoint.v1.WaypointConfig"
MAX_REGEX = 1024
MAX_DIRECT_BODY = 64 * 1024
"""A direct response's body is held in every waypoint's memory: bounded like any other configuration value."""
MAX_CORS_AGE = 366 * 24 * 3600
"""The longest duration the translator reads (a VirtualService duration): browsers cap preflight caching far lower."""
MAX_GRPC_STATUS = 16
"""The highest gRPC status code (UNAUTHENTICATED)."""
SUBSET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_REDIRECT_CODES = frozenset((301, 302, 303, 307, 308))

_PATH_KINDS = {
    PathMatchType.EXACT: pb.PATH_EXACT,
    PathMatchType.PATH_PREFIX: pb.PATH_PREFIX,
    PathMatchType.REGULAR_EXPRESSION: pb.PATH_REGULAR_EXPRESSION,
    PathMatchType.PREFIX: pb.PATH_STRING_PREFIX,
}
_PATH_KIND_NAMES = {v: k for k, v in _PATH_KINDS.items()}
_VALUE_KINDS = {
    ValueMatchType.EXACT: pb.VALUE_EXACT,
    ValueMatchType.REGULAR_EXPRESSION: pb.VALUE_REGULAR_EXPRESSION,
    ValueMatchType.PREFIX: pb.VALUE_PREFIX,
    ValueMatchType.PRESENT: pb.VALUE_PRESENT,
}
_VALUE_KIND_NAMES = {v: k for k, v in _VALUE_KINDS.items()}
_MODIFIER_KINDS = {
    PathModifierType.REPLACE_FULL_PATH: pb.REPLACE_FULL_PATH,
    PathModifierType.REPLACE_PREFIX_MATCH: pb.REPLACE_PREFIX_MATCH,
}
_MODIFIER_KIND_NAMES = {v: k for k, v in _MODIFIER_KINDS.items()}


# Encoding.


def _duration(seconds: float) -> duration_pb2.Duration:
    nanos = round(seconds * 1_000_000_000)
    return duration_pb2.Duration(seconds=nanos // 1_000_000_000, nanos=nanos % 1_000_000_000)


def _header_modifier(modifier: HeaderModifier) -> pb.HeaderModifier:
    return pb.HeaderModifier(
        set=[pb.HeaderValue(name=n, value=v) for n, v in modifier.set],
        add=[pb.HeaderValue(name=n, value=v) for n, v in modifier.add],
        remove=list(modifier.remove),
    )


def _backend(backend: BackendService) -> pb.BackendService:
    return pb.BackendService(
        namespace=backend.namespace, hostname=backend.hostname, port=backend.port, subset=backend.subset
    )


def _weighted(item: WeightedBackend) -> pb.WeightedBackend:
    out = pb.WeightedBackend(weight=item.weight)
    if item.backend is not None:
        out.backend.CopyFrom(_backend(item.backend))
    if item.request_headers is not None:
        out.request_headers.CopyFrom(_header_modifier(item.request_headers))
    if item.response_headers is not None:
        out.response_headers.CopyFrom(_header_modifier(item.response_headers))
    return out


def _path_modifier(modifier: PathModifier) -> pb.PathModifier:
    return pb.PathModifier(kind=_MODIFIER_KINDS[modifier.kind], value=modifier.value)


def _value_matches(matches: tuple[ValueMatch, ...]) -> list[pb.ValueMatch]:
    return [pb.ValueMatch(name=m.name, value=m.value, kind=_VALUE_KINDS[m.kind]) for m in matches]


def _claim_matches(matches: tuple[ClaimMatch, ...]) -> list[pb.ClaimMatch]:
    return [pb.ClaimMatch(path=m.path, value=m.value, kind=_VALUE_KINDS[m.kind]) for m in matches]


def _match(match: RouteMatch) -> pb.RouteMatch:
    out = pb.RouteMatch(
        headers=_value_matches(match.headers),
        query_params=_value_matches(match.query_params),
        ignore_path_case=match.ignore_path_case,
        without_headers=_value_matches(match.without_headers),
        claims=_claim_matches(match.claims),
        without_claims=_claim_matches(match.without_claims),
    )
    if match.path is not None:
        out.path.CopyFrom(pb.PathMatch(kind=_PATH_KINDS[match.path.kind], value=match.path.value))
    if match.method is not None:
        out.method = match.method
    return out


def _redirect(redirect: RequestRedirect) -> pb.RequestRedirect:
    out = pb.RequestRedirect(status_code=redirect.status_code, keeps_host_port=redirect.keeps_host_port)
    if redirect.scheme is not None:
        out.scheme = redirect.scheme
    if redirect.hostname is not None:
        out.hostname = redirect.hostname
    if redirect.path is not None:
        out.path.CopyFrom(_path_modifier(redirect.path))
    if redirect.port is not None:
        out.port = redirect.port
    return out


def _cors(cors: CorsPolicy) -> pb.CorsPolicy:
    out = pb.CorsPolicy(
        allow_origins=_value_matches(cors.allow_origins),
        allow_methods=cors.allow_methods,
        allow_headers=cors.allow_headers,
        expose_headers=cors.expose_headers,
        allow_credentials=cors.allow_credentials,
        ignore_unmatched_preflights=not cors.forward_unmatched_preflights,
    )
    if cors.max_age is not None:
        out.max_age = cors.max_age
    return out


def _retry(retry: RetryPolicy) -> pb.RetryPolicy:
    return pb.RetryPolicy(
        attempts=retry.attempts,
        codes=list(retry.codes),
        backoff=_duration(retry.backoff),
        on_connect_failure=retry.on_connect_failure,
    )


def _rule(rule: RouteRule) -> pb.RouteRule:
    out = pb.RouteRule(
        route=rule.route,
        match=_match(rule.match),
        backends=[_weighted(b) for b in rule.backends],
        mirrors=[pb.RequestMirror(backend=_backend(m.backend), percent=m.percent) for m in rule.mirrors],
        retry=_retry(rule.retry),
        rule_name=rule.rule_name,
        missing_backend_status=rule.missing_backend_status,
    )
    if rule.fault is not None:
        out.fault.CopyFrom(
            pb.Fault(
                delay=_duration(rule.fault.delay),
                delay_percent=rule.fault.delay_percent,
                abort_status=rule.fault.abort_status,
                abort_percent=rule.fault.abort_percent,
                abort_grpc_status=rule.fault.abort_grpc_status,
            )
        )
    if rule.regex_rewrite is not None:
        out.regex_rewrite.CopyFrom(
            pb.RegexRewrite(pattern=rule.regex_rewrite.pattern, substitution=rule.regex_rewrite.substitution)
        )
    if rule.cors is not None:
        out.cors.CopyFrom(_cors(rule.cors))
    if rule.direct_response is not None:
        out.direct_response.CopyFrom(
            pb.DirectResponse(status=rule.direct_response.status, body=rule.direct_response.body)
        )
    if rule.request_headers is not None:
        out.request_headers.CopyFrom(_header_modifier(rule.request_headers))
    if rule.response_headers is not None:
        out.response_headers.CopyFrom(_header_modifier(rule.response_headers))
    if rule.redirect is not None:
        out.redirect.CopyFrom(_redirect(rule.redirect))
    if rule.rewrite is not None:
        rewrite = pb.URLRewrite()
        if rule.rewrite.hostname is not None:
            rewrite.hostname = rule.rewrite.hostname
        if rule.rewrite.path is not None:
            rewrite.path.CopyFrom(_path_modifier(rule.rewrite.path))
        out.rewrite.CopyFrom(rewrite)
    if rule.timeouts != Timeouts():
        timeouts = pb.Timeouts()
        if rule.timeouts.request is not None:
            timeouts.request.CopyFrom(_duration(rule.timeouts.request))
        if rule.timeouts.backend_request is not None:
            timeouts.backend_request.CopyFrom(_duration(rule.timeouts.backend_request))
        out.timeouts.CopyFrom(timeouts)
    return out


def waypoint_config_to_proto(config: WaypointConfig) -> pb.WaypointConfig:
    """``config`` as the wire message. A rule shared by several tables (a VirtualService for many hosts) is built
    once."""
    built: dict[int, pb.RouteRule] = {}

    def rule(item: RouteRule) -> pb.RouteRule:
        found = built.get(id(item))
        if found is None:
            found = built[id(item)] = _rule(item)
        return found

    return pb.WaypointConfig(
        waypoint=config.waypoint,
        tables=[
            pb.RouteTable(
                service_key=t.service_key,
                port=t.port,
                http=[rule(r) for r in t.http],
                tcp_backends=[_weighted(b) for b in t.tcp_backends],
                hostnames=list(t.hostnames),
            )
            for t in config.tables
        ],
        policies=[waypoint_policy_to_proto(p) for p in config.policies],
        request_authentications=[request_authentication_to_proto(p) for p in config.request_authentications],
        xfcc_client_identity=config.xfcc_client_identity,
        destination_rules=[destination_policy_to_proto(d) for d in config.destination_rules],
        metrics=[service_metrics_to_proto(m) for m in config.metrics],
        services=list(config.services),
        race_first_connect=list(config.race_first_connect),
        dynamic_dns=list(config.dynamic_dns),
        envoy_patches=envoy_patches_to_proto(config.envoy_patches) if config.envoy_patches else None,
        # Istio's default travels as an absent field, so configs without a mesh default keep their bytes.
        default_retry=_retry(config.default_retry.policy) if config.default_retry.policy != RetryPolicy() else None,
        default_per_try_timeout=None
        if config.default_retry.per_try_timeout is None
        else _duration(config.default_retry.per_try_timeout),
        mesh_locality_lb=mesh_locality_to_proto(config.mesh_locality),
    )


def pack_waypoint_config(message: pb.WaypointConfig) -> any_pb2.Any:
    """``message`` as a google.protobuf.Any with the WaypointConfig type URL (deterministic bytes)."""
    return any_pb2.Any(type_url=WAYPOINT_CONFIG_TYPE_URL, value=message.SerializeToString(deterministic=True))


# Decoding.


class _Reader(FieldReader):
    def __init__(self, resource: str) -> None:
        super().__init__(resource)
        self.rules: dict[bytes, RouteRule] = {}

    def port(self, field: str, value: int) -> int:
        if not 1 <= value <= 65535:
            raise self.fail(field, f"out of range 1..65535: {value}")
        return value

    def seconds(self, field: str, value: duration_pb2.Duration) -> float:
        if value.seconds < 0 or value.nanos < 0 or value.nanos >= 1_000_000_000:
            raise self.fail(field, "must be a non-negative duration")
        return (value.seconds * 1_000_000_000 + value.nanos) / 1_000_000_000

    def regex(self, field: str, pattern: str) -> str:
        if len(pattern) > MAX_REGEX:
            raise self.fail(field, f"regular expression longer than {MAX_REGEX} characters")
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as exc:
            raise self.fail(field, f"invalid regular expression: {exc}") from None
        return pattern

    def header_name(self, field: str, name: str) -> str:
        if not is_token(name):
            raise self.fail(field, f"not a header name: {name!r}")
        return name

    def header_value(self, field: str, value: str) -> str:
        if any(c in value for c in "\r\n\0"):
            raise self.fail(field, "a header value may not hold CR, LF or NUL")
        return value

    def header_modifier(self, field: str, message: pb.HeaderModifier) -> HeaderModifier:
        def pairs(name: str, items: Iterable[pb.HeaderValue]) -> tuple[tuple[str, str], ...]:
            return tuple(
                (
                    self.header_name(f"{field}.{name}[{i}].name", h.name),
                    self.header_value(f"{field}.{name}[{i}].value", h.value),
                )
                for i, h in enumerate(items)
            )

        return HeaderModifier(
            set=pairs("set", message.set),
            add=pairs("add", message.add),
            remove=tuple(self.header_name(f"{field}.remove[{i}]", n) for i, n in enumerate(message.remove)),
        )

    def backend(self, field: str, message: pb.BackendService) -> BackendService:
        namespace = self.text(f"{field}.namespace", message.namespace, required=True)
        self.identity_part(f"{field}.namespace", namespace, "namespace")
        hostname = self.text(f"{field}.hostname", message.hostname, required=True)
        subset = message.subset
        if subset and not SUBSET_NAME.fullmatch(subset):
            raise self.fail(f"{field}.subset", "not a DNS label (a DestinationRule subset name)")
        return BackendService(namespace, hostname, self.port(f"{field}.port", message.port), subset)

    def weighted(self, field: str, message: pb.WeightedBackend) -> WeightedBackend:
        return WeightedBackend(
            backend=self.backend(f"{field}.backend", message.backend) if message.HasField("backend") else None,
            weight=message.weight,
            request_headers=self.header_modifier(f"{field}.request_headers", message.request_headers)
            if message.HasField("request_headers")
            else None,
            response_headers=self.header_modifier(f"{field}.response_headers", message.response_headers)
            if message.HasField("response_headers")
            else None,
        )

    def value_match(self, field: str, message: pb.ValueMatch, *, header: bool) -> ValueMatch:
        kind = _VALUE_KIND_NAMES.get(message.kind)
        if kind is None:
            raise self.fail(f"{field}.kind", f"unknown match type {message.kind}")
        pseudo = header and message.name in PSEUDO_HEADERS
        name = self.header_name(f"{field}.name", message.name) if header and not pseudo else message.name
        if not name:
            raise self.fail(f"{field}.name", "required")
        value = (
            self.regex(f"{field}.value", message.value) if kind is ValueMatchType.REGULAR_EXPRESSION else message.value
        )
        return ValueMatch(name, value, kind)

    def match(self, field: str, message: pb.RouteMatch) -> RouteMatch:
        path: PathMatch | None = None
        if message.HasField("path"):
            kind = _PATH_KIND_NAMES.get(message.path.kind)
            if kind is None:
                raise self.fail(f"{field}.path.kind", f"unknown path match type {message.path.kind}")
            value = message.path.value
            if kind is PathMatchType.REGULAR_EXPRESSION:
                self.regex(f"{field}.path.value", value)
            elif kind is not PathMatchType.PREFIX and not value.startswith("/"):
                raise self.fail(f"{field}.path.value", f"must start with /: {value!r}")
            path = PathMatch(kind, value)
        method = self.text(f"{field}.method", message.method, required=True) if message.HasField("method") else None
        return RouteMatch(
            path=path,
            headers=tuple(
                self.value_match(f"{field}.headers[{i}]", m, header=True) for i, m in enumerate(message.headers)
            ),
            query_params=tuple(
                self.value_match(f"{field}.query_params[{i}]", m, header=False)
                for i, m in enumerate(message.query_params)
            ),
            method=method,
            ignore_path_case=message.ignore_path_case,
            without_headers=tuple(
                self.value_match(f"{field}.without_headers[{i}]", m, header=True)
                for i, m in enumerate(message.without_headers)
            ),
            claims=tuple(self.claim_match(f"{field}.claims[{i}]", m) for i, m in enumerate(message.claims)),
            without_claims=tuple(
                self.claim_match(f"{field}.without_claims[{i}]", m) for i, m in enumerate(message.without_claims)
            ),
        )

    def claim_match(self, field: str, message: pb.ClaimMatch) -> ClaimMatch:
        kind = _VALUE_KIND_NAMES.get(message.kind)
        if kind is None:
            raise self.fail(f"{field}.kind", f"unknown match type {message.kind}")
        if not 0 < len(message.path) <= MAX_CLAIM_PATH:
            raise self.fail(f"{field}.path", f"expected 1 to {MAX_CLAIM_PATH} names, got {len(message.path)}")
        path = tuple(self.text(f"{field}.path[{i}]", name, required=True) for i, name in enumerate(message.path))
        value = (
            self.regex(f"{field}.value", message.value) if kind is ValueMatchType.REGULAR_EXPRESSION else message.value
        )
        return ClaimMatch(path, value, kind)

    def percent(self, field: str, value: float) -> float:
        if not 0.0 <= value <= 100.0:
            raise self.fail(field, f"out of range 0..100: {value}")
        return value

    def fault(self, field: str, message: pb.Fault) -> Fault:
        if message.abort_status and not 200 <= message.abort_status <= 599:
            raise self.fail(f"{field}.abort_status", f"not an HTTP status: {message.abort_status}")
        grpc_status = message.abort_grpc_status if message.HasField("abort_grpc_status") else None
        if grpc_status is not None and grpc_status > MAX_GRPC_STATUS:
            raise self.fail(f"{field}.abort_grpc_status", f"not a gRPC status: {grpc_status}")
        if grpc_status is not None and message.abort_status:
            raise self.fail(f"{field}.abort_grpc_status", "given with abort_status")
        return Fault(
            delay=self.seconds(f"{field}.delay", message.delay),
            delay_percent=self.percent(f"{field}.delay_percent", message.delay_percent),
            abort_status=message.abort_status,
            abort_percent=self.percent(f"{field}.abort_percent", message.abort_percent),
            abort_grpc_status=grpc_status,
        )

    def direct_response(self, field: str, message: pb.DirectResponse) -> DirectResponse:
        if not 200 <= message.status <= 599:
            raise self.fail(f"{field}.status", f"not an HTTP status: {message.status}")
        if len(message.body) > MAX_DIRECT_BODY:
            raise self.fail(f"{field}.body", f"longer than {MAX_DIRECT_BODY} bytes")
        return DirectResponse(message.status, message.body)

    def cors(self, field: str, message: pb.CorsPolicy) -> CorsPolicy:
        """Rule 14."""
        origins = []
        for i, m in enumerate(message.allow_origins):
            where = f"{field}.allow_origins[{i}]"
            origin = self.value_match(where, m, header=False)
            if origin.kind is ValueMatchType.PRESENT or not origin.value:
                raise self.fail(f"{where}.value", "an origin match needs an exact, prefix or regular expression value")
            origins.append(origin)
        if message.HasField("max_age") and message.max_age > MAX_CORS_AGE:
            raise self.fail(f"{field}.max_age", f"more than {MAX_CORS_AGE} seconds: {message.max_age}")
        return CorsPolicy(
            allow_origins=tuple(origins),
            allow_methods=self.header_value(f"{field}.allow_methods", message.allow_methods),
            allow_headers=self.header_value(f"{field}.allow_headers", message.allow_headers),
            expose_headers=self.header_value(f"{field}.expose_headers", message.expose_headers),
            max_age=message.max_age if message.HasField("max_age") else None,
            allow_credentials=message.allow_credentials,
            forward_unmatched_preflights=not message.ignore_unmatched_preflights,
        )

    def path_modifier(self, field: str, message: pb.PathModifier) -> PathModifier:
        kind = _MODIFIER_KIND_NAMES.get(message.kind)
        if kind is None:
            raise self.fail(f"{field}.kind", f"unknown path modifier type {message.kind}")
        return PathModifier(kind, self.text(f"{field}.value", message.value))

    def redirect(self, field: str, message: pb.RequestRedirect) -> RequestRedirect:
        if message.status_code not in _REDIRECT_CODES:
            raise self.fail(f"{field}.status_code", f"not a redirect status: {message.status_code}")
        return RequestRedirect(
            scheme=self.text(f"{field}.scheme", message.scheme) if message.HasField("scheme") else None,
            hostname=self.text(f"{field}.hostname", message.hostname) if message.HasField("hostname") else None,
            path=self.path_modifier(f"{field}.path", message.path) if message.HasField("path") else None,
            port=self.port(f"{field}.port", message.port) if message.HasField("port") else None,
            status_code=message.status_code,
            keeps_host_port=message.keeps_host_port,
        )

    def rule(self, field: str, message: pb.RouteRule) -> RouteRule:
        rewrite = None
        if message.HasField("rewrite"):
            rewrite = URLRewrite(
                hostname=self.text(f"{field}.rewrite.hostname", message.rewrite.hostname)
                if message.rewrite.HasField("hostname")
                else None,
                path=self.path_modifier(f"{field}.rewrite.path", message.rewrite.path)
                if message.rewrite.HasField("path")
                else None,
            )
        mirrors = []
        for i, mirror in enumerate(message.mirrors):
            if not 0.0 <= mirror.percent <= 100.0:
                raise self.fail(f"{field}.mirrors[{i}].percent", f"out of range 0..100: {mirror.percent}")
            mirrors.append(RequestMirror(self.backend(f"{field}.mirrors[{i}].backend", mirror.backend), mirror.percent))
        retry = self.retry(f"{field}.retry", message.retry) if message.HasField("retry") else RetryPolicy()
        t = message.timeouts
        timeouts = Timeouts(
            request=self.seconds(f"{field}.timeouts.request", t.request) if t.HasField("request") else None,
            backend_request=self.seconds(f"{field}.timeouts.backend_request", t.backend_request)
            if t.HasField("backend_request")
            else None,
        )
        return RouteRule(
            route=self.text(f"{field}.route", message.route),
            match=self.match(f"{field}.match", message.match),
            backends=tuple(self.weighted(f"{field}.backends[{i}]", b) for i, b in enumerate(message.backends)),
            request_headers=self.header_modifier(f"{field}.request_headers", message.request_headers)
            if message.HasField("request_headers")
            else None,
            response_headers=self.header_modifier(f"{field}.response_headers", message.response_headers)
            if message.HasField("response_headers")
            else None,
            redirect=self.redirect(f"{field}.redirect", message.redirect) if message.HasField("redirect") else None,
            rewrite=rewrite,
            mirrors=tuple(mirrors),
            timeouts=timeouts,
            retry=retry,
            rule_name=self.text(f"{field}.rule_name", message.rule_name),
            fault=self.fault(f"{field}.fault", message.fault) if message.HasField("fault") else None,
            direct_response=self.direct_response(f"{field}.direct_response", message.direct_response)
            if message.HasField("direct_response")
            else None,
            regex_rewrite=RegexRewrite(
                self.regex(f"{field}.regex_rewrite.pattern", message.regex_rewrite.pattern),
                self.text(f"{field}.regex_rewrite.substitution", message.regex_rewrite.substitution),
            )
            if message.HasField("regex_rewrite")
            else None,
            cors=self.cors(f"{field}.cors", message.cors) if message.HasField("cors") else None,
            missing_backend_status=self.missing_status(
                f"{field}.missing_backend_status", message.missing_backend_status
            ),
        )

    def missing_status(self, field: str, value: int) -> int:
        if value == 0:
            return 500
        if not 500 <= value <= 599:
            raise self.fail(field, f"not a server error status: {value}")
        return value

    def shared_rule(self, field: str, message: pb.RouteRule) -> RouteRule:
        """:meth:`rule`, judged once per distinct rule: a VirtualService for many hosts repeats one rule in many
        tables (the first failure still names the first field it occurs in)."""
        key = message.SerializeToString(deterministic=True)
        found = self.rules.get(key)
        if found is None:
            found = self.rules[key] = self.rule(field, message)
        return found

    def services(self, field: str, keys: Iterable[str]) -> tuple[str, ...]:
        """Rule 13: ``namespace/hostname`` keys, each once; returned sorted."""
        out: set[str] = set()
        for i, key in enumerate(keys):
            self.text(f"{field}[{i}]", key, required=True)
            namespace, slash, host = key.partition("/")
            if not (namespace and slash and host) or "/" in host:
                raise self.fail(f"{field}[{i}]", f"expected namespace/hostname, got {key!r}")
            if key in out:
                raise self.fail(f"{field}[{i}]", f"{key!r} is given twice")
            out.add(key)
        return tuple(sorted(out))

    def retry(self, field: str, message: pb.RetryPolicy) -> RetryPolicy:
        return RetryPolicy(
            attempts=message.attempts,
            codes=tuple(message.codes),
            backoff=self.seconds(f"{field}.backoff", message.backoff),
            on_connect_failure=message.on_connect_failure,
        )

    def default_retry(self, message: pb.WaypointConfig) -> HttpRetry:
        """Rule 16."""
        policy = self.retry("default_retry", message.default_retry) if message.HasField("default_retry") else None
        per_try = (
            self.seconds("default_per_try_timeout", message.default_per_try_timeout)
            if message.HasField("default_per_try_timeout")
            else None
        )
        if policy is None and per_try is None:
            return ISTIO_RETRY
        return HttpRetry(RetryPolicy() if policy is None else policy, per_try)

    def table(self, field: str, message: pb.RouteTable) -> RouteTable:
        return RouteTable(
            service_key=self.text(f"{field}.service_key", message.service_key),
            port=self.port(f"{field}.port", message.port),
            http=tuple(self.shared_rule(f"{field}.http[{i}]", r) for i, r in enumerate(message.http)),
            tcp_backends=tuple(
                self.weighted(f"{field}.tcp_backends[{i}]", b) for i, b in enumerate(message.tcp_backends)
            ),
            hostnames=tuple(self.text(f"{field}.hostnames[{i}]", h) for i, h in enumerate(message.hostnames)),
        )


def waypoint_config_from_proto(message: pb.WaypointConfig, name: str) -> WaypointConfig:
    """Judge and convert a WaypointConfig received as resource ``name`` (rules 1-17)."""
    reader = _Reader(name)
    if message.waypoint != name:
        raise reader.fail("waypoint", f"the resource is named {name!r} but describes {message.waypoint!r}")
    authn = RequestAuthReader(name)
    try:
        return WaypointConfig(
            waypoint=message.waypoint,
            tables=tuple(reader.table(f"tables[{i}]", t) for i, t in enumerate(message.tables)),
            policies=tuple(
                waypoint_policy_from_proto(PolicyReader(name), f"policies[{i}]", p)
                for i, p in enumerate(message.policies)
            ),
            request_authentications=tuple(
                authn.request_authentication(f"request_authentications[{i}]", p)
                for i, p in enumerate(message.request_authentications)
            ),
            xfcc_client_identity=message.xfcc_client_identity,
            destination_rules=DestinationPolicyReader(name).destination_rules(list(message.destination_rules)),
            metrics=MetricOverridesReader(name).all("metrics", message.metrics),
            services=reader.services("services", message.services),
            race_first_connect=reader.services("race_first_connect", message.race_first_connect),
            dynamic_dns=reader.services("dynamic_dns", message.dynamic_dns),
            envoy_patches=EnvoyPatchesReader(name).patches("envoy_patches", message.envoy_patches),
            default_retry=reader.default_retry(message),
            mesh_locality=DestinationPolicyReader(name).mesh_locality(
                "mesh_locality_lb", message.mesh_locality_lb, present=message.HasField("mesh_locality_lb")
            ),
        )
    except XdsConversionError:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise reader.fail("(message)", f"cannot be read: {exc}") from None


def decode_waypoint_config(name: str, body: any_pb2.Any) -> WaypointConfig:
    """Unpack and convert one xDS resource body of type :data:`WAYPOINT_CONFIG_TYPE_URL`."""
    if body.type_url != WAYPOINT_CONFIG_TYPE_URL:
        raise XdsConversionError(
            name, "resource.type_url", f"expected {WAYPOINT_CONFIG_TYPE_URL}, got {body.type_url!r}"
        )
    message = pb.WaypointConfig()
    try:
        message.ParseFromString(body.value)
    except (DecodeError, ValueError, RecursionError) as exc:
        raise XdsConversionError(name, "resource.value", f"not a valid WaypointConfig message: {exc}") from None
    return waypoint_config_from_proto(message, name)
