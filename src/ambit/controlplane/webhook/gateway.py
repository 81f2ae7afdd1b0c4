"""Validation of ``gateway.networking.k8s.io`` Gateway, HTTPRoute, GRPCRoute, TCPRoute and TLSRoute: the fields a
waypoint reads.

Theory of operation. These are plain Kubernetes objects (no protobuf snake_case aliases, integers are JSON
numbers). The checks mirror the Gateway API's own CRD validation rules, which a real cluster enforces with CEL
and our embedded API server does not:

- Gateway: ``gatewayClassName`` and 1-64 ``listeners``; each listener has a unique name, a port 1-65535 and a
  protocol (a name or a domain-prefixed one, by the CRD's pattern: an unknown name is admitted and its status says
  ``UnsupportedProtocol``); HTTPS needs ``tls``, HTTP/TCP/UDP forbid it; TCP and UDP
  take no hostname; port, protocol and hostname together are unique; each of ``addresses`` may leave out its
  ``value`` (the implementation picks one), and a value given is an IP address for type ``IPAddress`` (the
  default) and a DNS name, optionally ``*.``-prefixed, for ``Hostname``.
- Routes: ``parentRefs`` name their parent (port 1-65535 if given); ``hostnames`` are DNS names, optionally with
  a ``*.`` prefix, never IP addresses; each rule's ``matches`` use known match types, and an HTTP path value
  starts with ``/``; each ``backendRefs[]`` names its backend and, when it is a core Service, gives a ``port``;
  filters name their type and set the matching field and no other filter's; a redirect has no backends.
- HTTPRoute filters (a rule's and a backendRef's): at most one each of ``CORS``, ``RequestHeaderModifier``,
  ``ResponseHeaderModifier``, ``RequestRedirect`` and ``URLRewrite``. A ``cors`` object: ``allowOrigins`` at most
  64 distinct origins (``*`` alone, or ``http(s)://`` a host, ``*`` or DNS labels with an optional leading ``*.``,
  and an optional port; 253 characters at most), ``allowMethods`` at most 9 distinct HTTP methods or ``*``,
  ``allowHeaders`` and ``exposeHeaders`` at most 64 distinct header names (256 characters at most), ``*`` never
  beside another entry of ``allowOrigins``, ``allowMethods`` or ``allowHeaders``; ``allowCredentials`` a boolean;
  ``maxAge`` an integer of at least 1 second (int32).
- TCPRoute and TLSRoute (v1alpha2): 1-16 ``rules``, each with 1-16 ``backendRefs`` (as above, without filters) and
  a ``name`` unique within the route; a TLSRoute's ``hostnames`` are SNI names as above; a TCPRoute has none.
"""

from __future__ import annotations

import re
from typing import Any

from ambit.controlplane.translate.cors_filter import ORIGIN_MAX, is_cors_origin
from ambit.controlplane.webhook.fields import Fields, describe, is_dns_label, is_hostname
from ambit.model.dnsname import is_ip
from ambit.model.field_names import is_token

CORE_PROTOCOLS = ("HTTP", "HTTPS", "TLS", "TCP", "UDP", "HBONE")
_PROTOCOL = re.compile(
    r"^[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?\Z|[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]+\Z"
)
"""The CRD's pattern for a listener's protocol (searched, as the API server does): an unknown name such as
``INVALID`` is admitted and reported by the status (``UnsupportedProtocol``), as Gateway API requires. Go's ``$``
is the end of the text, which is Python's ``\\Z`` (Python's ``$`` also matches before a final newline). Searched
only within :data:`PROTOCOL_MAX` characters: its nested repetitions cost time quadratic in the length."""
PROTOCOL_MAX = 255
"""The CRD's ``maxLength`` of a listener's protocol."""
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH")
PATH_TYPES = ("Exact", "PathPrefix", "RegularExpression")
VALUE_TYPES = ("Exact", "RegularExpression")
HTTP_FILTERS = (
    "RequestHeaderModifier",
    "ResponseHeaderModifier",
    "RequestMirror",
    "RequestRedirect",
    "URLRewrite",
    "ExtensionRef",
    "CORS",
)
HTTP_SINGLE_FILTERS = ("CORS", "RequestHeaderModifier", "ResponseHeaderModifier", "RequestRedirect", "URLRewrite")
"""The HTTPRoute filters the CRD allows at most once in one list."""
HEADER_NAME_MAX = 256
"""The CRD's ``HTTPHeaderName`` pattern (used with ``fullmatch``)."""
INT32_MAX = 2**31 - 1
GRPC_FILTERS = ("RequestHeaderModifier", "ResponseHeaderModifier", "RequestMirror", "ExtensionRef")


def validate_gateway(obj: dict[str, Any]) -> Fields:
    f = Fields(proto=False)
    spec = f.mapping(obj.get("spec"), "spec", required=True)
    f.string(spec.get("gatewayClassName"), "spec.gatewayClassName", required=True)
    names: set[str] = set()
    combos: set[tuple[int, str, str]] = set()
    for path, listener in f.objects(spec.get("listeners"), "spec.listeners", required=True, limit=64):
        name = f.string(listener.get("name"), f"{path}.name", required=True)
        if name is not None:
            if name in names:
                f.error(f"{path}.name", f"listener name {name!r} is not unique")
            names.add(name)
        port = f.port(listener.get("port"), f"{path}.port", required=True)
        protocol = f.string(listener.get("protocol"), f"{path}.protocol", required=True)
        if protocol is not None and len(protocol) > PROTOCOL_MAX:
            f.error(f"{path}.protocol", f"longer than {PROTOCOL_MAX} characters ({len(protocol)})")
        elif protocol is not None and not _PROTOCOL.search(protocol):
            f.error(
                f"{path}.protocol",
                f"invalid protocol {protocol!r}: expected a name such as {', '.join(CORE_PROTOCOLS)} or a "
                "domain-prefixed one (example.com/name)",
            )
        hostname = _hostname(f, listener.get("hostname"), f"{path}.hostname")
        if listener.get("tls") is not None:
            tls = f.mapping(listener.get("tls"), f"{path}.tls")
            f.enum(tls.get("mode"), f"{path}.tls.mode", ("Terminate", "Passthrough"))
            if protocol in ("HTTP", "TCP", "UDP"):
                f.error(f"{path}.tls", f"must not be set for protocol {protocol}")
        elif protocol == "HTTPS":
            f.error(f"{path}.tls", "required for protocol HTTPS")
        if hostname is not None and protocol in ("TCP", "UDP"):
            f.error(f"{path}.hostname", f"must not be set for protocol {protocol}")
        if port is not None and protocol is not None:
            combo = (port, protocol, hostname or "")
            if combo in combos:
                f.error(path, "port, protocol and hostname together must be unique among listeners")
            combos.add(combo)
        f.mapping(listener.get("allowedRoutes"), f"{path}.allowedRoutes")
    for path, address in f.objects(spec.get("addresses"), "spec.addresses", limit=16):
        kind = f.string(address.get("type"), f"{path}.type") or "IPAddress"
        value = f.string(address.get("value"), f"{path}.value")  # optional: the implementation assigns one
        if value and kind == "IPAddress" and not is_ip(value):
            f.error(f"{path}.value", f"{value!r} is not an IP address")
        elif value and kind == "Hostname" and not is_hostname(value, wildcard=True):
            f.error(f"{path}.value", f"{value!r} is not a DNS name (a '*.' prefix is allowed)")
    return f


def validate_http_route(obj: dict[str, Any]) -> Fields:
    f = Fields(proto=False)
    spec = _route_common(f, obj)
    for path, rule in f.objects(spec.get("rules"), "spec.rules", limit=16):
        for match_path, match in f.objects(rule.get("matches"), f"{path}.matches", limit=64):
            route_path = f.mapping(match.get("path"), f"{match_path}.path")
            kind = f.enum(route_path.get("type"), f"{match_path}.path.type", PATH_TYPES) or "PathPrefix"
            value = f.string(route_path.get("value"), f"{match_path}.path.value")
            if value is not None and kind != "RegularExpression" and not value.startswith("/"):
                f.error(f"{match_path}.path.value", f"{value!r} must start with '/'")
            _name_value_matches(f, match.get("headers"), f"{match_path}.headers")
            _name_value_matches(f, match.get("queryParams"), f"{match_path}.queryParams")
            f.enum(match.get("method"), f"{match_path}.method", HTTP_METHODS)
        filters = _filters(f, rule.get("filters"), f"{path}.filters", HTTP_FILTERS, single=HTTP_SINGLE_FILTERS)
        if "RequestRedirect" in filters and "URLRewrite" in filters:
            f.error(f"{path}.filters", "RequestRedirect and URLRewrite cannot be used together")
        backends = _backend_refs(f, rule.get("backendRefs"), f"{path}.backendRefs")
        if "RequestRedirect" in filters and backends:
            f.error(f"{path}.backendRefs", "must be empty when a RequestRedirect filter is used")
        f.mapping(rule.get("timeouts"), f"{path}.timeouts")
    return f


def validate_grpc_route(obj: dict[str, Any]) -> Fields:
    f = Fields(proto=False)
    spec = _route_common(f, obj)
    for path, rule in f.objects(spec.get("rules"), "spec.rules", limit=16):
        for match_path, match in f.objects(rule.get("matches"), f"{path}.matches", limit=64):
            method = f.mapping(match.get("method"), f"{match_path}.method")
            f.enum(method.get("type"), f"{match_path}.method.type", VALUE_TYPES)
            service = f.string(method.get("service"), f"{match_path}.method.service")
            name = f.string(method.get("method"), f"{match_path}.method.method")
            if match.get("method") is not None and service is None and name is None:
                f.error(f"{match_path}.method", "one or both of service and method must be set")
            _name_value_matches(f, match.get("headers"), f"{match_path}.headers")
        _filters(f, rule.get("filters"), f"{path}.filters", GRPC_FILTERS)
        _backend_refs(f, rule.get("backendRefs"), f"{path}.backendRefs", filters=GRPC_FILTERS)
    return f


def validate_tcp_route(obj: dict[str, Any]) -> Fields:
    f = Fields(proto=False)
    _stream_rules(f, _route_common(f, obj, hostnames=False))
    return f


def validate_tls_route(obj: dict[str, Any]) -> Fields:
    f = Fields(proto=False)
    _stream_rules(f, _route_common(f, obj))
    return f


def _stream_rules(f: Fields, spec: dict[str, Any]) -> None:
    """The rules of a TCPRoute or TLSRoute: no matches, no filters, at least one backend each."""
    names: set[str] = set()
    for path, rule in f.objects(spec.get("rules"), "spec.rules", required=True, limit=16):
        name = f.string(rule.get("name"), f"{path}.name")
        if name is not None:
            if name in names:
                f.error(f"{path}.name", f"rule name {name!r} is not unique within the route")
            names.add(name)
        _backend_refs(f, rule.get("backendRefs"), f"{path}.backendRefs", required=True, filters=())


def _route_common(f: Fields, obj: dict[str, Any], *, hostnames: bool = True) -> dict[str, Any]:
    spec = f.mapping(obj.get("spec"), "spec", required=True)
    for path, ref in f.objects(spec.get("parentRefs"), "spec.parentRefs", limit=32):
        f.string(ref.get("name"), f"{path}.name", required=True)
        f.string(ref.get("group"), f"{path}.group")
        f.string(ref.get("kind"), f"{path}.kind")
        f.string(ref.get("sectionName"), f"{path}.sectionName")
        _namespace(f, ref.get("namespace"), f"{path}.namespace")
        f.port(ref.get("port"), f"{path}.port")
    for i, value in enumerate(f.sequence(spec.get("hostnames") if hostnames else None, "spec.hostnames", limit=16)):
        _hostname(f, value, f"spec.hostnames[{i}]", required=True)
    return spec


def _hostname(f: Fields, value: Any, path: str, *, required: bool = False) -> str | None:
    hostname = f.string(value, path, required=required)
    if hostname is not None and (is_ip(hostname) or not is_hostname(hostname)):
        f.error(path, f"{hostname!r} is not a DNS name (a '*.' prefix is allowed, IP addresses are not)")
        return None
    return hostname


def _namespace(f: Fields, value: Any, path: str) -> None:
    namespace = f.string(value, path)
    if namespace is not None and not is_dns_label(namespace):
        f.error(path, f"{namespace!r} is not a namespace name")


def _name_value_matches(f: Fields, value: Any, path: str) -> None:
    for match_path, match in f.objects(value, path, limit=16):
        f.string(match.get("name"), f"{match_path}.name", required=True)
        f.enum(match.get("type"), f"{match_path}.type", VALUE_TYPES)
        f.string(match.get("value"), f"{match_path}.value", required=True)


def _filter_field(kind: str) -> str:
    """The field a filter type sets: ``RequestMirror`` → ``requestMirror``, ``URLRewrite`` → ``urlRewrite``."""
    return {"URLRewrite": "urlRewrite", "CORS": "cors"}.get(kind) or kind[0].lower() + kind[1:]


def _filters(f: Fields, value: Any, path: str, allowed: tuple[str, ...], *, single: tuple[str, ...] = ()) -> list[str]:
    kinds: list[str] = []
    fields = {_filter_field(k) for k in allowed}
    for filter_path, item in f.objects(value, path, limit=16):
        kind = f.enum(item.get("type"), f"{filter_path}.type", allowed, required=True)
        if kind is None:
            continue
        if kind in single and kind in kinds:
            f.error(f"{filter_path}.type", f"{kind} filter cannot be repeated")
        kinds.append(kind)
        field = _filter_field(kind)
        spec = f.mapping(item.get(field), f"{filter_path}.{field}", required=True)
        for other in sorted(fields - {field}):
            if item.get(other) is not None:
                f.error(f"{filter_path}.{other}", f"must not be set when the filter type is {kind}")
        if kind == "CORS":
            _cors(f, spec, f"{filter_path}.cors")
    return kinds


def _cors(f: Fields, spec: dict[str, Any], path: str) -> None:
    """A ``cors`` filter object, as the CRD validates it."""
    origins = _set_of_strings(f, spec.get("allowOrigins"), f"{path}.allowOrigins", limit=64)
    for item_path, origin in origins:
        if len(origin) > ORIGIN_MAX:
            f.error(item_path, f"longer than {ORIGIN_MAX} characters ({len(origin)})")
        elif not is_cors_origin(origin):
            f.error(
                item_path,
                f"{origin!r} is not an origin: expected '*' or http(s)://host[:port], the host '*' or DNS labels "
                "with an optional leading '*.'",
            )
    methods = _set_of_strings(f, spec.get("allowMethods"), f"{path}.allowMethods", limit=9)
    for item_path, method in methods:
        if method != "*" and method not in HTTP_METHODS:
            f.error(item_path, f"unsupported value {method[:16]!r}: expected one of {', '.join(HTTP_METHODS)} or *")
    allow_headers = _set_of_strings(f, spec.get("allowHeaders"), f"{path}.allowHeaders", limit=64)
    expose_headers = _set_of_strings(f, spec.get("exposeHeaders"), f"{path}.exposeHeaders", limit=64)
    for item_path, name in allow_headers + expose_headers:
        if len(name) > HEADER_NAME_MAX:
            f.error(item_path, f"longer than {HEADER_NAME_MAX} characters ({len(name)})")
        elif not is_token(name):
            f.error(item_path, f"{name[:32]!r} is not a header name")
    for key, items in (("allowOrigins", origins), ("allowMethods", methods), ("allowHeaders", allow_headers)):
        if len(items) > 1 and any(text == "*" for _, text in items):
            f.error(f"{path}.{key}", "'*' cannot be used alongside other entries")
    credentials = spec.get("allowCredentials")
    if credentials is not None and not isinstance(credentials, bool):
        f.error(f"{path}.allowCredentials", f"expected a boolean, got {describe(credentials)}")
    f.integer(spec.get("maxAge"), f"{path}.maxAge", low=1, high=INT32_MAX, what="maxAge (seconds)")


def _set_of_strings(f: Fields, value: Any, path: str, *, limit: int) -> list[tuple[str, str]]:
    """The strings of a ``listType=set`` array with their paths: at most ``limit``, each non-empty and distinct."""
    seen: set[str] = set()
    items: list[tuple[str, str]] = []
    for i, item in enumerate(f.sequence(value, path, limit=limit)):
        text = f.string(item, f"{path}[{i}]", required=True)
        if text is None:
            continue
        if text in seen:
            f.error(f"{path}[{i}]", f"duplicate value {text[:32]!r}")
            continue
        seen.add(text)
        items.append((f"{path}[{i}]", text))
    return items


def _backend_refs(
    f: Fields, value: Any, path: str, *, required: bool = False, filters: tuple[str, ...] = HTTP_FILTERS
) -> list[tuple[str, dict[str, Any]]]:
    """The backendRefs of a rule; ``filters`` the filter types a backendRef may carry (none: no ``filters``)."""
    refs = f.objects(value, path, required=required, limit=16)
    for ref_path, ref in refs:
        f.string(ref.get("name"), f"{ref_path}.name", required=True)
        group = f.string(ref.get("group"), f"{ref_path}.group") or ""
        kind = f.string(ref.get("kind"), f"{ref_path}.kind") or "Service"
        _namespace(f, ref.get("namespace"), f"{ref_path}.namespace")
        port = f.port(ref.get("port"), f"{ref_path}.port")
        if port is None and ref.get("port") is None and group in ("", "core") and kind == "Service":
            f.error(f"{ref_path}.port", "required for a Service backend")
        f.integer(ref.get("weight"), f"{ref_path}.weight", low=0, high=1_000_000, what="weight")
        if filters:
            single = HTTP_SINGLE_FILTERS if filters == HTTP_FILTERS else ()
            _filters(f, ref.get("filters"), f"{ref_path}.filters", filters, single=single)
    return refs
