"""Model external authorizer ↔ ``ambit.waypoint.v1.ExtAuthzProvider`` (field 8 of a CUSTOM WaypointPolicy).

Theory of operation: :func:`ext_authz_to_proto` encodes an :class:`~ambit.model.extauthz.ExtAuthzProvider` field for
field; :func:`ext_authz_from_proto` judges one received, the first problem raising
:class:`~ambit.xds.errors.XdsConversionError` naming the field.

Rules:

1. The kind is HTTP or gRPC (unspecified or unknown values are refused); name and service are required and
   printable; the port is 1..65535; the timeout at least 1 ms; ``status_on_error`` an HTTP status 100..599.
2. A header pattern is non-empty, printable and not a lone ``*``; an additional header's name is an HTTP token and
   its value printable (so nothing the control plane sends can split the check request's head).
3. A path prefix is empty or starts with ``/`` and has no space; ``max_request_bytes`` is at most
   :data:`~ambit.model.extauthz.MAX_CHECK_BODY` (0: no body in the check).
"""

from __future__ import annotations

from collections.abc import Iterable

from ambit.api import waypoint_pb2 as pb
from ambit.model.extauthz import MAX_CHECK_BODY, ExtAuthzProvider, HeaderPattern, ProviderKind
from ambit.model.field_names import is_token
from ambit.xds.authorization import PolicyReader

__all__ = ["ext_authz_from_proto", "ext_authz_to_proto"]

_KINDS = {ProviderKind.HTTP: pb.EXT_AUTHZ_KIND_HTTP, ProviderKind.GRPC: pb.EXT_AUTHZ_KIND_GRPC}
_KIND_OF = {v: k for k, v in _KINDS.items()}


def ext_authz_to_proto(provider: ExtAuthzProvider) -> pb.ExtAuthzProvider:
    return pb.ExtAuthzProvider(
        name=provider.name,
        kind=_KINDS[provider.kind],
        service=provider.service,
        port=provider.port,
        timeout_ms=max(1, round(provider.timeout * 1000)),
        fail_open=provider.fail_open,
        status_on_error=provider.status_on_error,
        path_prefix=provider.path_prefix,
        include_request_headers=[str(p) for p in provider.include_request_headers],
        include_additional_headers=[pb.HeaderValue(name=n, value=v) for n, v in provider.include_additional_headers],
        headers_to_upstream_on_allow=[str(p) for p in provider.headers_to_upstream_on_allow],
        headers_to_downstream_on_deny=[str(p) for p in provider.headers_to_downstream_on_deny],
        headers_to_downstream_on_allow=[str(p) for p in provider.headers_to_downstream_on_allow],
        max_request_bytes=provider.max_request_bytes or 0,
        allow_partial_message=provider.allow_partial_message,
        pack_as_bytes=provider.pack_as_bytes,
    )


def _patterns(read: PolicyReader, field: str, values: Iterable[str]) -> tuple[HeaderPattern, ...]:
    out = []
    for i, value in enumerate(values):
        text = read.text(f"{field}[{i}]", value, required=True)
        if text == "*":
            raise read.fail(f"{field}[{i}]", "a lone '*' is not a header pattern")
        out.append(HeaderPattern.of(text))
    return tuple(out)


def ext_authz_from_proto(read: PolicyReader, field: str, message: pb.ExtAuthzProvider) -> ExtAuthzProvider:
    """Judge and convert the authorizer at ``field`` (rules 1-3)."""
    kind = _KIND_OF.get(message.kind)
    if kind is None:
        raise read.fail(f"{field}.kind", f"unsupported value {message.kind}")
    if message.timeout_ms < 1:
        raise read.fail(f"{field}.timeout_ms", "at least 1")
    if not 100 <= message.status_on_error <= 599:
        raise read.fail(f"{field}.status_on_error", f"not an HTTP status: {message.status_on_error}")
    if message.max_request_bytes > MAX_CHECK_BODY:
        raise read.fail(f"{field}.max_request_bytes", f"at most {MAX_CHECK_BODY}")
    prefix = read.text(f"{field}.path_prefix", message.path_prefix)
    if prefix and (not prefix.startswith("/") or " " in prefix):
        raise read.fail(f"{field}.path_prefix", f"expected a path, got {prefix!r}")
    additional = []
    for i, header in enumerate(message.include_additional_headers):
        at = f"{field}.include_additional_headers[{i}]"
        if not is_token(header.name):
            raise read.fail(f"{at}.name", f"not a header name: {header.name!r}")
        additional.append((header.name.lower(), read.text(f"{at}.value", header.value)))
    return ExtAuthzProvider(
        name=read.text(f"{field}.name", message.name, required=True),
        kind=kind,
        service=read.text(f"{field}.service", message.service, required=True),
        port=read.port(f"{field}.port", message.port),
        timeout=message.timeout_ms / 1000,
        fail_open=message.fail_open,
        status_on_error=message.status_on_error,
        path_prefix=prefix,
        include_request_headers=_patterns(read, f"{field}.include_request_headers", message.include_request_headers),
        include_additional_headers=tuple(additional),
        headers_to_upstream_on_allow=_patterns(
            read, f"{field}.headers_to_upstream_on_allow", message.headers_to_upstream_on_allow
        ),
        headers_to_downstream_on_deny=_patterns(
            read, f"{field}.headers_to_downstream_on_deny", message.headers_to_downstream_on_deny
        ),
        headers_to_downstream_on_allow=_patterns(
            read, f"{field}.headers_to_downstream_on_allow", message.headers_to_downstream_on_allow
        ),
        max_request_bytes=message.max_request_bytes or None,
        allow_partial_message=message.allow_partial_message,
        pack_as_bytes=message.pack_as_bytes,
    )
