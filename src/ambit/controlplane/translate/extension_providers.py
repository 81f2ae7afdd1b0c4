"""The mesh config's ``extensionProviders``: the external authorizers (``envoyExtAuthzHttp``,
``envoyExtAuthzGrpc``) that AuthorizationPolicies of action CUSTOM name.

Theory of operation: pure. :func:`parse_extension_providers` reads the list as istiod's mesh validation
(``pkg/config/validation/agent/extensionprovider.go``) and its authorization builder
(``pilot/pkg/security/authz/builder/extauthz.go``) read it, and gives the usable authorizers by name. A
:class:`ValueError` with one line naming the entry and field is the caller's to report
(:mod:`ambit.controlplane.translate.meshconfig` rule 9: the previous good mesh config then stays).

Rules:

1. The list holds at most :data:`MAX_PROVIDERS` entries; each is an object with a ``name`` that is not empty and
   not used by another entry (of any kind): otherwise the mesh config is invalid, as istiod's validation says.
2. Only ``envoyExtAuthzHttp`` and ``envoyExtAuthzGrpc`` are read; every other kind of provider (tracing, access
   logs, metrics) is ignored.
3. Both need ``service`` (``namespace/hostname``, or a hostname or IP address) and ``port`` (1..65535);
   ``statusOnError`` is one of the HTTP statuses Envoy's ``StatusCode`` names (default 403); ``timeout`` a protobuf
   duration (``"0.5s"``; default 600 s); ``failOpen`` a boolean. HTTP's ``pathPrefix`` starts with ``/``; its header
   lists (``includeRequestHeadersInCheck``, or the deprecated ``includeHeadersInCheck`` when that is unset,
   ``headersToUpstreamOnAllow``, ``headersToDownstreamOnDeny``, ``headersToDownstreamOnAllow``) are Istio string
   patterns, a lone ``*`` refused (istiod's ``checkWildcard``); ``includeAdditionalHeadersInCheck`` maps header
   names (HTTP tokens) to values without control characters. ``includeRequestBodyInCheck`` (both kinds) needs
   ``maxRequestBytes`` of at least 1 (Envoy's ``BufferSettings`` refuses 0; above 1 MiB it is cut to 1 MiB);
   ``allowPartialMessage`` and ``packAsBytes`` are booleans. Any other value is an error. ``clearRouteCache`` is
   accepted and ignored.
4. A name that is not a DNS-1123 label of at most 63 characters is not an error of the mesh config: istiod's
   builder marks that provider unusable, so it is left out here and a CUSTOM policy naming it is treated as naming
   an unknown provider.
5. Bounds: at most :data:`MAX_PATTERNS` header patterns and additional headers in all, each name or value at
   most :data:`MAX_HEADER_BYTES` bytes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ambit.model.dnsname import is_ip
from ambit.model.extauthz import DEFAULT_TIMEOUT, MAX_CHECK_BODY, ExtAuthzProvider, HeaderPattern, ProviderKind
from ambit.model.field_names import is_token

__all__ = ["ENVOY_STATUS_CODES", "MAX_PATTERNS", "MAX_PROVIDERS", "parse_extension_providers"]

MAX_PROVIDERS = 1_000
MAX_PATTERNS = 10_000
MAX_HEADER_BYTES = 8_192

ENVOY_STATUS_CODES = frozenset(
    [
        *(100, 200, 201, 202, 203, 204, 205, 206, 207, 208, 226),
        *(300, 301, 302, 303, 304, 305, 307, 308),
        *range(400, 418),
        *(421, 422, 423, 424, 426, 428, 429, 431),
        *range(500, 509),
        *(510, 511),
    ]
)
"""Envoy's ``type.v3.StatusCode`` values (its ``Empty`` 0 aside): what ``statusOnError`` may say."""

_DURATION = re.compile(r"([0-9]{1,12})(?:\.([0-9]{1,9}))?s")
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_DNS_NAME = re.compile(r"[A-Za-z0-9*](?:[A-Za-z0-9.*_-]{0,252})")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_KINDS = {"envoyExtAuthzHttp": ProviderKind.HTTP, "envoyExtAuthzGrpc": ProviderKind.GRPC}


def _camel_to_snake(name: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "_" + m.group(0).lower(), name)


def _get(obj: Mapping[str, Any], camel: str) -> Any:
    """A field by its protobuf JSON name or its proto name (meshconfig rule 3)."""
    return obj[camel] if camel in obj else obj.get(_camel_to_snake(camel))


class _Budget:
    def __init__(self) -> None:
        self.left = MAX_PATTERNS

    def spend(self, count: int, where: str) -> None:
        self.left -= count
        if self.left < 0:
            raise ValueError(f"{where}: more than {MAX_PATTERNS} header patterns in all")


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a string")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_HEADER_BYTES:
        raise ValueError(f"{where}: longer than {MAX_HEADER_BYTES} bytes")
    return value


def _service(value: Any, where: str) -> str:
    service = _text(value if value is not None else "", where)
    if not service:
        raise ValueError(f"{where}: service must not be empty")
    namespace, slash, host = service.partition("/")
    if slash and (not _LABEL.fullmatch(namespace) and namespace not in ("*", ".")):
        raise ValueError(f"{where}: {service!r}: the namespace before '/' is not a DNS-1123 label")
    if not slash and is_ip(service):
        return service
    if not _DNS_NAME.fullmatch(host if slash else service) or "/" in host:
        raise ValueError(f"{where}: {service!r} is not a hostname, an IP address or namespace/hostname")
    return service


def _port(value: Any, where: str) -> int:
    if isinstance(value, str) and value.isdigit() and len(value) <= 10:
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        raise ValueError(f"{where}: port must be in the range [1, 65535], found: {value!r}")
    return value


def _status(value: Any, where: str) -> int:
    if value is None or value == "":
        return 403
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not text.isdigit() or len(text) > 3 or int(text) not in ENVOY_STATUS_CODES:
        raise ValueError(f"{where}: unsupported statusOnError value {value!r} (an HTTP status Envoy names)")
    return int(text)


def _timeout(value: Any, where: str) -> float:
    if value is None:
        return DEFAULT_TIMEOUT
    match = _DURATION.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f'{where}: expected a duration such as "0.5s", got {value!r}')
    seconds = int(match.group(1)) + (int(match.group(2).ljust(9, "0")) / 1e9 if match.group(2) else 0.0)
    if seconds <= 0:
        raise ValueError(f"{where}: the timeout must be positive")
    return seconds


def _bool(value: Any, where: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ValueError(f"{where}: expected true or false")
    return value


def _body(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected an object with maxRequestBytes")
    size = _get(value, "maxRequestBytes")
    if isinstance(size, str) and size.isdigit() and len(size) <= 10:
        size = int(size)
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= 0xFFFFFFFF:
        raise ValueError(f"{where}.maxRequestBytes: expected a number of bytes of at least 1, got {size!r}")
    return {
        "max_request_bytes": min(size, MAX_CHECK_BODY),
        "allow_partial_message": _bool(_get(value, "allowPartialMessage"), f"{where}.allowPartialMessage"),
        "pack_as_bytes": _bool(_get(value, "packAsBytes"), f"{where}.packAsBytes"),
    }


def _patterns(value: Any, where: str, budget: _Budget) -> tuple[HeaderPattern, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValueError(f"{where}: expected a list of header names")
    budget.spend(len(value), where)
    out = []
    for i, item in enumerate(value):
        text = _text(item, f"{where}[{i}]")
        if text == "*":
            raise ValueError(
                f'{where}[{i}]: a single wildcard ("*") is not supported, change it to either prefix or suffix match'
            )
        out.append(HeaderPattern.of(text))
    return tuple(out)


def _additional(value: Any, where: str, budget: _Budget) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected a map of header names to values")
    budget.spend(len(value), where)
    out = []
    for name, header_value in value.items():
        if not isinstance(name, str) or not is_token(name) or len(name) > MAX_HEADER_BYTES:
            raise ValueError(f"{where}: {name!r} is not a header name")
        text = _text(header_value, f"{where}[{name!r}]")
        if _CONTROL.search(text):
            raise ValueError(f"{where}[{name!r}]: a header value may not hold control characters")
        out.append((name.lower(), text))
    return tuple(sorted(out))


def _provider(name: str, kind: ProviderKind, raw: Any, where: str, budget: _Budget) -> ExtAuthzProvider:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected an object")
    common: dict[str, Any] = {
        "service": _service(raw.get("service"), f"{where}.service"),
        "port": _port(raw.get("port"), f"{where}.port"),
        "timeout": _timeout(raw.get("timeout"), f"{where}.timeout"),
        "fail_open": _bool(_get(raw, "failOpen"), f"{where}.failOpen"),
        "status_on_error": _status(_get(raw, "statusOnError"), f"{where}.statusOnError"),
    }
    common |= _body(_get(raw, "includeRequestBodyInCheck"), f"{where}.includeRequestBodyInCheck")
    if kind is ProviderKind.GRPC:
        return ExtAuthzProvider(name, kind, **common)
    prefix = _text(_get(raw, "pathPrefix") or "", f"{where}.pathPrefix")
    if prefix and (not prefix.startswith("/") or _CONTROL.search(prefix) or " " in prefix):
        raise ValueError(f"{where}.pathPrefix: should begin with `/` (and be a path), found {prefix!r}")
    included = _get(raw, "includeRequestHeadersInCheck")
    included_where = "includeRequestHeadersInCheck"
    if not included:  # the deprecated field counts only when the new one is unset (istiod)
        included, included_where = _get(raw, "includeHeadersInCheck"), "includeHeadersInCheck"
    return ExtAuthzProvider(
        name,
        kind,
        **common,
        path_prefix=prefix,
        include_request_headers=_patterns(included, f"{where}.{included_where}", budget),
        include_additional_headers=_additional(
            _get(raw, "includeAdditionalHeadersInCheck"), f"{where}.includeAdditionalHeadersInCheck", budget
        ),
        headers_to_upstream_on_allow=_patterns(
            _get(raw, "headersToUpstreamOnAllow"), f"{where}.headersToUpstreamOnAllow", budget
        ),
        headers_to_downstream_on_deny=_patterns(
            _get(raw, "headersToDownstreamOnDeny"), f"{where}.headersToDownstreamOnDeny", budget
        ),
        headers_to_downstream_on_allow=_patterns(
            _get(raw, "headersToDownstreamOnAllow"), f"{where}.headersToDownstreamOnAllow", budget
        ),
    )


def parse_extension_providers(value: Any) -> tuple[ExtAuthzProvider, ...]:
    """The usable external authorizers of ``extensionProviders`` (rules 1-5), in the list's order; raises
    :class:`ValueError` with one line for an invalid list."""
    where = "extensionProviders"
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValueError(f"{where}: expected a list")
    if len(value) > MAX_PROVIDERS:
        raise ValueError(f"{where}: {len(value)} providers, at most {MAX_PROVIDERS}")
    seen: set[str] = set()
    budget = _Budget()
    out = []
    for i, entry in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{at}: expected an object with name and a provider")
        name = entry.get("name")
        if name is None or name == "":
            raise ValueError(f"{at}.name: empty extension provider name")
        name = _text(name, f"{at}.name")
        if name in seen:
            raise ValueError(f"{at}.name: duplicate extension provider name {name}")
        seen.add(name)
        for field, kind in _KINDS.items():
            raw = _get(entry, field)
            if raw is None:
                continue
            provider = _provider(name, kind, raw, f"{at}.{field}", budget)
            if _LABEL.fullmatch(name):  # rule 4
                out.append(provider)
            break
    return tuple(out)
