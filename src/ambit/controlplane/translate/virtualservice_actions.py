"""The actions of one VirtualService ``http`` rule, each read from its plain API value into
:mod:`ambit.model.routes` terms as istiod's ``route.go`` ``TranslateRoute`` does: a redirect, a direct response,
header operations, a regular-expression path rewrite, a fault and a CORS policy. How a rule puts them together with
its destinations, rewrites, timeout, retries and mirrors is :mod:`ambit.controlplane.translate.virtualservice_rules`'s
business. A value that cannot be used raises
:class:`~ambit.controlplane.translate.virtualservice_values.BadField` naming the field; the rule is then dropped
and reported (:mod:`~ambit.controlplane.translate.virtualservice_rules` rule 6); nothing else raises.

Rules:

1. ``redirect``: ``uri``, or ``prefixRewrite`` replacing the matched prefix and preferred to ``uri`` as istiod
   does, ``authority``, ``port`` or ``derivePort``, ``scheme``, ``redirectCode`` 301 by default, one of
   301/302/303/307/308.
2. ``directResponse``: ``status`` (200 to 599), ``body.string`` or ``body.bytes`` (base64), at most
   :data:`~ambit.model.routes.MAX_DIRECT_BODY` bytes.
3. ``headers``: ``request``/``response`` ``set``/``add``/``remove``; a ``host`` or ``:authority`` set or added
   rewrites the authority (given apart from the other operations, istiod); pseudo-headers and ``host`` are never
   removed.
4. ``rewrite.uriRegexRewrite`` replaces every match in the path (an RE2 pattern; one RE2 would refuse, or a bad
   substitution, drops the rule).
5. ``fault``: ``delay.fixedDelay`` with ``percentage``, ``abort.httpStatus`` or ``abort.grpcStatus`` (a status
   name, sent as its code) with ``percentage`` (100 when not given).
6. ``corsPolicy`` as istiod's ``TranslateCORSPolicy``: ``allowOrigins`` (a ``StringMatch`` each, with a value; the
   deprecated ``allowOrigin`` strings as exact matches when ``allowOrigins`` is empty), ``allowMethods`` (the
   methods Istio's validation accepts), ``allowHeaders`` and ``exposeHeaders`` (header names or ``*``) joined with
   ``,``, ``maxAge`` in whole seconds, ``allowCredentials``, ``unmatchedPreflights`` (``FORWARD``, the default, or
   ``IGNORE``).
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

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
)
from ambit.model.field_names import is_token
from ambit.model.route_matches import ValueMatch, ValueMatchType
from ambit.model.routes import (
    GRPC_STATUS_CODES,
    MAX_DIRECT_BODY,
    CorsPolicy,
    DirectResponse,
    Fault,
    HeaderModifier,
    PathModifier,
    PathModifierType,
    RegexRewrite,
    RequestRedirect,
)

__all__ = [
    "join_headers",
    "read_cors",
    "read_direct_response",
    "read_fault",
    "read_headers",
    "read_redirect",
    "read_regex_rewrite",
]

_REDIRECT_CODES = frozenset((301, 302, 303, 307, 308))
_AUTHORITY = frozenset(("host", ":authority"))
_CORS_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"))


def _modifier(value: Any, field: str) -> tuple[HeaderModifier | None, str | None]:
    """A ``HeaderOperations`` and the authority it sets (rule 3)."""
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


def join_headers(first: HeaderModifier | None, second: HeaderModifier | None) -> HeaderModifier | None:
    if first is None or second is None:
        return first or second
    return HeaderModifier(first.set + second.set, first.add + second.add, first.remove + second.remove)


def read_headers(value: Any, field: str) -> tuple[HeaderModifier | None, HeaderModifier | None, str | None]:
    spec = read_mapping(value, field)
    request, authority = _modifier(spec.get("request"), f"{field}.request")
    response, _ = _modifier(spec.get("response"), f"{field}.response")
    return request, response, authority


def read_regex_rewrite(value: Any, field: str) -> RegexRewrite | None:
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


def read_redirect(value: Any, port: int, field: str) -> RequestRedirect:
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


def read_direct_response(value: Any, field: str) -> DirectResponse:
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


def read_fault(value: Any, field: str, notes: list[tuple[str, str]]) -> Fault | None:
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


def read_cors(value: Any, field: str) -> CorsPolicy:
    """A ``corsPolicy`` (rule 6)."""
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
