"""Reading a WaypointConfig's route tables: :class:`RouteReader`, the field-by-field judge of what a waypoint or
gateway was sent.

Theory of operation: :class:`RouteReader` extends :class:`~ambit.xds.convert.FieldReader` with one method per
message of a route table (matches, backends, rewrites, redirects, faults, direct responses, CORS, retries); each
returns the model value or raises :class:`~ambit.xds.errors.XdsConversionError` naming the field, by
:mod:`ambit.xds.routes`' rules (cited here as "routes rule N"). A rule repeated in many tables (a VirtualService
for many hosts) is judged once (:meth:`RouteReader.shared_rule`). :mod:`ambit.xds.gateway` reads its routes with
the same reader.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from google.protobuf import duration_pb2

from ambit.api import waypoint_pb2 as pb
from ambit.model.field_names import is_token
from ambit.model.route_matches import (
    MAX_CLAIM_PATH,
    MAX_REGEX,
    PSEUDO_HEADERS,
    ClaimMatch,
    PathMatch,
    PathMatchType,
    RouteMatch,
    ValueMatch,
    ValueMatchType,
)
from ambit.model.routes import (
    ISTIO_RETRY,
    MAX_DIRECT_BODY,
    SUBSET_NAME,
    BackendService,
    CorsPolicy,
    DirectResponse,
    Fault,
    HeaderModifier,
    HttpRetry,
    PathModifier,
    RegexRewrite,
    RequestMirror,
    RequestRedirect,
    RetryPolicy,
    RouteRule,
    RouteTable,
    Timeouts,
    URLRewrite,
    WeightedBackend,
)
from ambit.xds.convert import FieldReader
from ambit.xds.route_encoding import MODIFIER_KINDS, PATH_KINDS, VALUE_KINDS

__all__ = ["MAX_CORS_AGE", "MAX_GRPC_STATUS", "RouteReader"]

MAX_CORS_AGE = 366 * 24 * 3600
"""The longest duration the translator reads (a VirtualService duration): browsers cap preflight caching far lower."""
MAX_GRPC_STATUS = 16
"""The highest gRPC status code (UNAUTHENTICATED)."""
_REDIRECT_CODES = frozenset((301, 302, 303, 307, 308))
_PATH_KIND_NAMES = {v: k for k, v in PATH_KINDS.items()}
_VALUE_KIND_NAMES = {v: k for k, v in VALUE_KINDS.items()}
_MODIFIER_KIND_NAMES = {v: k for k, v in MODIFIER_KINDS.items()}


class RouteReader(FieldReader):
    """Judges the parts of a route table as it reads them (routes rules 2-6, 10, 13, 14, 16)."""

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
        """Routes rule 14."""
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
        """Routes rule 13: ``namespace/hostname`` keys, each once; returned sorted."""
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
        """Routes rule 16."""
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
