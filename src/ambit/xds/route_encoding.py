"""Model route rules → their ``ambit.waypoint.v1`` messages: the parts of a WaypointConfig's encoding that a
gateway's configuration shares (:mod:`ambit.xds.gateway`).

Theory of operation: each function encodes one model value field for field; nothing is judged here (the model was
judged when it was built, and the receiving side judges what it reads: :mod:`ambit.xds.route_reader`). Durations
travel as ``google.protobuf.Duration`` with the seconds rounded to nanoseconds, so that seconds given in
milliseconds come back exactly (routes rule 6). The enum tables map the model's match and modifier kinds to their
wire values; the reader inverts them.
"""

from __future__ import annotations

from google.protobuf import duration_pb2

from ambit.api import waypoint_pb2 as pb
from ambit.model.route_matches import ClaimMatch, PathMatchType, RouteMatch, ValueMatch, ValueMatchType
from ambit.model.routes import (
    BackendService,
    CorsPolicy,
    HeaderModifier,
    PathModifier,
    PathModifierType,
    RequestRedirect,
    RetryPolicy,
    RouteRule,
    Timeouts,
    WeightedBackend,
)

__all__ = [
    "MODIFIER_KINDS",
    "PATH_KINDS",
    "VALUE_KINDS",
    "duration_to_proto",
    "retry_to_proto",
    "rule_to_proto",
    "weighted_to_proto",
]

PATH_KINDS = {
    PathMatchType.EXACT: pb.PATH_EXACT,
    PathMatchType.PATH_PREFIX: pb.PATH_PREFIX,
    PathMatchType.REGULAR_EXPRESSION: pb.PATH_REGULAR_EXPRESSION,
    PathMatchType.PREFIX: pb.PATH_STRING_PREFIX,
}
VALUE_KINDS = {
    ValueMatchType.EXACT: pb.VALUE_EXACT,
    ValueMatchType.REGULAR_EXPRESSION: pb.VALUE_REGULAR_EXPRESSION,
    ValueMatchType.PREFIX: pb.VALUE_PREFIX,
    ValueMatchType.PRESENT: pb.VALUE_PRESENT,
}
MODIFIER_KINDS = {
    PathModifierType.REPLACE_FULL_PATH: pb.REPLACE_FULL_PATH,
    PathModifierType.REPLACE_PREFIX_MATCH: pb.REPLACE_PREFIX_MATCH,
}


def duration_to_proto(seconds: float) -> duration_pb2.Duration:
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


def weighted_to_proto(item: WeightedBackend) -> pb.WeightedBackend:
    out = pb.WeightedBackend(weight=item.weight)
    if item.backend is not None:
        out.backend.CopyFrom(_backend(item.backend))
    if item.request_headers is not None:
        out.request_headers.CopyFrom(_header_modifier(item.request_headers))
    if item.response_headers is not None:
        out.response_headers.CopyFrom(_header_modifier(item.response_headers))
    return out


def _path_modifier(modifier: PathModifier) -> pb.PathModifier:
    return pb.PathModifier(kind=MODIFIER_KINDS[modifier.kind], value=modifier.value)


def _value_matches(matches: tuple[ValueMatch, ...]) -> list[pb.ValueMatch]:
    return [pb.ValueMatch(name=m.name, value=m.value, kind=VALUE_KINDS[m.kind]) for m in matches]


def _claim_matches(matches: tuple[ClaimMatch, ...]) -> list[pb.ClaimMatch]:
    return [pb.ClaimMatch(path=m.path, value=m.value, kind=VALUE_KINDS[m.kind]) for m in matches]


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
        out.path.CopyFrom(pb.PathMatch(kind=PATH_KINDS[match.path.kind], value=match.path.value))
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


def retry_to_proto(retry: RetryPolicy) -> pb.RetryPolicy:
    return pb.RetryPolicy(
        attempts=retry.attempts,
        codes=list(retry.codes),
        backoff=duration_to_proto(retry.backoff),
        on_connect_failure=retry.on_connect_failure,
    )


def rule_to_proto(rule: RouteRule) -> pb.RouteRule:
    out = pb.RouteRule(
        route=rule.route,
        match=_match(rule.match),
        backends=[weighted_to_proto(b) for b in rule.backends],
        mirrors=[pb.RequestMirror(backend=_backend(m.backend), percent=m.percent) for m in rule.mirrors],
        retry=retry_to_proto(rule.retry),
        rule_name=rule.rule_name,
        missing_backend_status=rule.missing_backend_status,
    )
    if rule.fault is not None:
        out.fault.CopyFrom(
            pb.Fault(
                delay=duration_to_proto(rule.fault.delay),
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
            timeouts.request.CopyFrom(duration_to_proto(rule.timeouts.request))
        if rule.timeouts.backend_request is not None:
            timeouts.backend_request.CopyFrom(duration_to_proto(rule.timeouts.backend_request))
        out.timeouts.CopyFrom(timeouts)
    return out
