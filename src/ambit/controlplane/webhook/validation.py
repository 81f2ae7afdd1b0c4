"""Which validator checks which kind, and the one entry point :func:`validate`.

Theory of operation. Every validator is a pure function from a decoded object to a :class:`Fields` accumulator;
:data:`VALIDATORS` maps each (API group, kind) this webhook serves to its function, version-agnostic as istiod
looks schemas up by group and kind. :func:`validate` adds the checks common to every kind and guarantees its
contract: for any JSON value it returns a list of :class:`FieldError` and raises only :class:`UnknownKindError`,
for a kind not in the table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ambit.controlplane.webhook.authentication import validate_peer_authentication, validate_request_authentication
from ambit.controlplane.webhook.authorization import validate_authorization_policy
from ambit.controlplane.webhook.envoyfilter import validate_envoy_filter
from ambit.controlplane.webhook.errors import UnknownKindError
from ambit.controlplane.webhook.fields import FieldError, Fields
from ambit.controlplane.webhook.gateway import (
    validate_gateway,
    validate_grpc_route,
    validate_http_route,
    validate_tcp_route,
    validate_tls_route,
)
from ambit.controlplane.webhook.serviceentry import validate_service_entry, validate_workload_entry
from ambit.controlplane.webhook.telemetry import validate_telemetry
from ambit.controlplane.webhook.traffic import (
    validate_destination_rule,
    validate_istio_gateway,
    validate_sidecar,
    validate_virtual_service,
)

SECURITY = "security.istio.io"
NETWORKING = "networking.istio.io"
GATEWAY_API = "gateway.networking.k8s.io"
TELEMETRY = "telemetry.istio.io"

VALIDATORS: dict[tuple[str, str], Callable[[dict[str, Any]], Fields]] = {
    (SECURITY, "AuthorizationPolicy"): validate_authorization_policy,
    (SECURITY, "PeerAuthentication"): validate_peer_authentication,
    (SECURITY, "RequestAuthentication"): validate_request_authentication,
    (NETWORKING, "ServiceEntry"): validate_service_entry,
    (NETWORKING, "WorkloadEntry"): validate_workload_entry,
    (NETWORKING, "DestinationRule"): validate_destination_rule,
    (NETWORKING, "VirtualService"): validate_virtual_service,
    (NETWORKING, "Sidecar"): validate_sidecar,
    (NETWORKING, "EnvoyFilter"): validate_envoy_filter,
    (TELEMETRY, "Telemetry"): validate_telemetry,
    (GATEWAY_API, "Gateway"): validate_gateway,
    (GATEWAY_API, "HTTPRoute"): validate_http_route,
    (GATEWAY_API, "GRPCRoute"): validate_grpc_route,
    (GATEWAY_API, "TCPRoute"): validate_tcp_route,
    (GATEWAY_API, "TLSRoute"): validate_tls_route,
    (NETWORKING, "Gateway"): validate_istio_gateway,  # Istio's own, after Gateway API's: see _BY_KIND
}
"""(API group, kind) → validator; also what :mod:`registration` asks the API server to send us."""

_BY_KIND = {kind: group for group, kind in VALIDATORS if (group, kind) != (NETWORKING, "Gateway")}
"""A kind's group when the caller names none: a bare ``Gateway`` is Gateway API's, as it is for kubectl."""


def group_of(kind: str) -> str:
    """The API group of a kind this webhook validates; :class:`UnknownKindError` for any other kind."""
    try:
        return _BY_KIND[kind]
    except KeyError:
        raise UnknownKindError(f"no validator for kind {kind!r}: expected one of {', '.join(_BY_KIND)}") from None


def validate(kind: str, obj: Any, *, group: str | None = None) -> list[FieldError]:
    """Everything wrong with ``obj`` as a ``kind`` (of ``group``, by default the kind's own), errors and warnings.

    Never raises for any ``obj``; raises :class:`UnknownKindError` when (group, kind) has no validator.
    """
    validator = VALIDATORS.get((group if group is not None else group_of(kind), kind))
    if validator is None:
        raise UnknownKindError(f"no validator for kind {kind!r} in group {group!r}")
    if not isinstance(obj, dict):
        return [FieldError("<object>", "expected a JSON object")]
    return validator(obj).errors


def rejections(errors: list[FieldError]) -> list[FieldError]:
    """The errors that reject the object (warnings only inform)."""
    return [e for e in errors if not e.warning]


def invalid_message(errors: list[FieldError]) -> str:
    """istiod's denial message: ``configuration is invalid: <path>: <problem>; ...``."""
    return "configuration is invalid: " + "; ".join(str(e) for e in rejections(errors))
