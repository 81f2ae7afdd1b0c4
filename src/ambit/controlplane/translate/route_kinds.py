"""Which route kinds a Gateway listener supports: its status's ``supportedKinds`` and the ``ResolvedRefs``
``InvalidRouteKinds`` condition (Gateway API ``ListenerStatus``; istiod's ``GenerateGatewaySupportedKinds``).

Theory of operation: pure. :func:`supported_kinds` reads one listener's ``protocol``, ``tls.mode`` and
``allowedRoutes.kinds`` and says which kinds it supports, given the kinds this kind of gateway serves at all.

Rules:

1. By protocol, as Gateway API and istiod pair them: ``HTTP`` and ``HTTPS`` take HTTPRoute and GRPCRoute; ``TCP``
   takes TCPRoute; ``TLS`` takes TLSRoute, and TCPRoute too when its ``tls.mode`` is ``Terminate`` (the stream is
   plain once terminated); any other protocol (``UDP``, ``HBONE``, a custom one) takes none.
2. Only kinds the gateway serves are listed (``served``): the spec says ``supportedKinds`` MUST be what the
   implementation supports for that listener, so a kind Ambit does not route there is not claimed.
3. ``allowedRoutes.kinds``, when it lists any, narrows the list to the supported kinds it names (a missing group
   is ``gateway.networking.k8s.io``); if it names one that is not supported, the listener's ``ResolvedRefs`` is
   False/``InvalidRouteKinds`` "Invalid route kinds" (istiod's message) and the valid ones are still listed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

__all__ = ["ALL_ROUTE_KINDS", "INGRESS_ROUTE_KINDS", "INVALID_ROUTE_KINDS", "supported_kinds"]

GATEWAY_GROUP = "gateway.networking.k8s.io"
HTTP_ROUTE, GRPC_ROUTE, TCP_ROUTE, TLS_ROUTE = "HTTPRoute", "GRPCRoute", "TCPRoute", "TLSRoute"
ALL_ROUTE_KINDS = frozenset({HTTP_ROUTE, GRPC_ROUTE, TCP_ROUTE, TLS_ROUTE})
INGRESS_ROUTE_KINDS = frozenset({HTTP_ROUTE, GRPC_ROUTE, TCP_ROUTE, TLS_ROUTE})
"""The kinds an ingress gateway (class ``istio``) routes: HTTPRoute and GRPCRoute on HTTP and HTTPS listeners,
TLSRoute on TLS passthrough listeners, TCPRoute on TCP listeners."""
INVALID_ROUTE_KINDS = (False, "InvalidRouteKinds", "Invalid route kinds")
"""The listener's ``ResolvedRefs`` (status, reason, message) when rule 3 finds an unsupported kind."""

_BY_PROTOCOL = {
    "HTTP": (HTTP_ROUTE, GRPC_ROUTE),
    "HTTPS": (HTTP_ROUTE, GRPC_ROUTE),
    "TCP": (TCP_ROUTE,),
}


def _by_protocol(listener: Mapping[str, Any]) -> tuple[str, ...]:
    protocol = listener.get("protocol")
    if protocol == "TLS":
        tls = listener.get("tls")
        mode = tls.get("mode") if isinstance(tls, Mapping) else None
        return (TLS_ROUTE, TCP_ROUTE) if mode == "Terminate" else (TLS_ROUTE,)
    return _BY_PROTOCOL.get(protocol, ()) if isinstance(protocol, str) else ()


def supported_kinds(listener: Mapping[str, Any], served: Collection[str]) -> tuple[list[dict[str, str]], bool]:
    """The listener's ``supportedKinds`` and whether every kind its ``allowedRoutes`` names is among them."""
    kinds = [kind for kind in _by_protocol(listener) if kind in served]
    allowed = listener.get("allowedRoutes")
    wanted = allowed.get("kinds") if isinstance(allowed, Mapping) else None
    if isinstance(wanted, list) and wanted:
        named = {
            (str(item.get("group") or GATEWAY_GROUP), str(item.get("kind")))
            for item in wanted
            if isinstance(item, Mapping)
        }
        chosen = [kind for kind in kinds if (GATEWAY_GROUP, kind) in named]
        valid = len(chosen) == len(wanted)
        kinds = chosen
    else:
        valid = True
    return [{"group": GATEWAY_GROUP, "kind": kind} for kind in kinds], valid
