"""A Gateway as a waypoint (spec §1.4, istiod's ambient ``waypoints.go`` ``gatewayToWaypointTransform``): whether
it is one, and of which kind, its address once ready, the namespaces it admits, its traffic type, its XFCC setting
and its inbound binding. :class:`~ambit.controlplane.translate.waypoints.WaypointIndex` reads every Gateway with
these once per translation; what binds to a waypoint is :mod:`ambit.controlplane.translate.waypoints`'s business.
Pure: no I/O; labels and annotations are read as strings whatever the input holds.

Rules (numbered with :mod:`ambit.controlplane.translate.waypoints`'s, which holds 4-7 and 9-11):

1. A waypoint is a Gateway with a usable address in its status (rule 2), whatever its class, as istiod makes one
   of every such Gateway (``gatewayToWaypointTransform``). One of class ``istio-waypoint`` is *declared*
   (:attr:`WaypointIndex.declared`, even before it is ready): Ambit's waypoint process serves it, and routes,
   policies and the waypoint config are translated for it. One of any other class is a *sandwich*
   (:attr:`Waypoint.sandwich`): typically an ingress Gateway of class ``istio`` whose pods are captured by the
   node proxy (``istio.io/dataplane-mode: ambient``); objects bind to it and node proxies tunnel to it exactly as
   to a waypoint, but its own gateway config (:mod:`ambit.controlplane.translate.ingress`) is what serves the
   traffic, so no waypoint config, waypoint route or waypoint policy is made for it. Its traffic type is its
   ``istio.io/waypoint-for`` label, else that label on its own GatewayClass, else ``service``; values are
   ``service``, ``workload``, ``all`` and ``none`` (any other value, like ``none``, takes no traffic).
2. A waypoint is ready once ``status.addresses`` holds a usable address: the first of type ``Hostname`` gives the
   hostname form ``{gateway namespace, hostname}``; else the first parsable one of type ``IPAddress`` (or no
   type, the API's default) the address form on the cluster's network. HBONE port 15008 either way. A Gateway
   whose addresses are all unusable is not ready (istiod would bind to it and send no address).
3. Which namespaces may bind: the ``allowedRoutes.namespaces`` of the listener the inbound binding (rule 12)
   names (its port; for PROXY without a port, the listener of protocol ``istio.io/PROXY``), else of the listener
   with protocol HBONE on port 15008 (``from``: ``Same``, the default and anything unknown; ``All``;
   ``Selector``, whose label selector is matched against the binding namespace's labels; a missing or malformed
   selector matches nothing). A Gateway without either listener, like a plain sandwich, admits its own namespace
   only (istiod's ``makeAllowedRoutes``).
8. ``ambient.istio.io/xfcc-include-client-identity`` on the waypoint's Gateway, else on its
   GatewayClass (the Gateway's own annotation wins, as infrastructure annotations merge), read as istiod
   reads it: ``true`` in any case is on, anything else off. The waypoint then adds the source identity in
   ``x-forwarded-client-cert`` (:mod:`ambit.waypoint.client_cert`).
12. The inbound binding (istiod's ``makeInboundBinding``): ``ambient.istio.io/waypoint-inbound-binding`` on the
    Gateway, else on its GatewayClass (present, even empty, on the Gateway wins), is ``<protocol>`` or
    ``<protocol>/<port>`` with protocol ``NONE`` or ``PROXY``. It becomes the
    :class:`~ambit.model.workload.ApplicationTunnel` of every pod that is an instance of the Gateway (its
    ``gateway.networking.k8s.io/gateway-name`` label, ready or not, as istiod's waypoint collection holds every
    Gateway): :meth:`WaypointIndex.find_application_tunnel`. Port 0, or none given, keeps the client's port (the
    node proxy's rule; istiod sends 0). More than one ``/`` or another protocol: no binding. A port that is not
    decimal digits in 0..65535: the binding with port 0, as istiod keeps it (istiod reads up to 2^32-1 and
    ztunnel truncates to 16 bits; we take none of that). Each problem is a :class:`Skipped` of the object that
    carries the annotation (:attr:`WaypointIndex.problems`, a Warning Event; istiod logs a warning).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.translate.fields import metadata_text, object_annotations
from ambit.controlplane.translate.skips import ObjectKind, Skipped, skipped
from ambit.model.labels import LabelSelector, selector_from_spec
from ambit.model.workload import (
    HBONE_MTLS_PORT,
    AddressError,
    ApplicationTunnel,
    AppTunnelProtocol,
    GatewayAddress,
    NamespacedHostname,
    NetworkAddress,
    parse_ip,
)

__all__ = [
    "ALL_TRAFFIC",
    "INBOUND_BINDING",
    "SERVICE_TRAFFIC",
    "WAYPOINT_CLASS",
    "WAYPOINT_FOR",
    "WORKLOAD_TRAFFIC",
    "Waypoint",
    "allowed_routes",
    "gateway_address",
    "inbound_binding",
    "xfcc_client_identity",
]

Obj = Mapping[str, Any]

WAYPOINT_CLASS = "istio-waypoint"
WAYPOINT_FOR = "istio.io/waypoint-for"
XFCC_CLIENT_IDENTITY = "ambient.istio.io/xfcc-include-client-identity"
INBOUND_BINDING = "ambient.istio.io/waypoint-inbound-binding"
SANDWICH_PROXY_PROTOCOL = "istio.io/PROXY"
"""The listener protocol that a PROXY binding without a port takes its ``allowedRoutes`` from (rule 3)."""
GATEWAY = ObjectKind("gateway.networking.k8s.io/v1", "Gateway")
GATEWAY_CLASS = ObjectKind("gateway.networking.k8s.io/v1", "GatewayClass")
SERVICE_TRAFFIC, WORKLOAD_TRAFFIC, ALL_TRAFFIC = "service", "workload", "all"


def xfcc_client_identity(gateway: Obj, class_annotations: Mapping[str, str]) -> bool:
    """Rule 8."""
    own = object_annotations(gateway)
    value = (
        own[XFCC_CLIENT_IDENTITY] if XFCC_CLIENT_IDENTITY in own else class_annotations.get(XFCC_CLIENT_IDENTITY, "")
    )
    return value.lower() == "true"


@dataclass(frozen=True, slots=True)
class Waypoint:
    """A ready waypoint (rules 1-3)."""

    namespace: str
    name: str
    address: GatewayAddress
    traffic_type: str = SERVICE_TRAFFIC
    allowed_from: str = "Same"
    allowed_selector: LabelSelector | None = None
    """For ``allowed_from == "Selector"``: the namespaces it admits; None admits none."""
    xfcc_client_identity: bool = False
    """Rule 8."""
    sandwich: bool = False
    """A Gateway of another class than ``istio-waypoint`` (rule 1): bound to and tunnelled to like a waypoint,
    served by its own gateway config."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def admits(self, namespace: str, namespace_labels: Mapping[str, str]) -> bool:
        """Whether an object of ``namespace`` may bind to this waypoint (rule 3)."""
        if self.allowed_from == "All":
            return True
        if self.allowed_from == "Selector":
            return self.allowed_selector is not None and self.allowed_selector.matches(namespace_labels)
        return namespace == self.namespace

    def takes(self, traffic: str) -> bool:
        return self.traffic_type in (traffic, ALL_TRAFFIC)


def gateway_address(gateway: Obj, network: str) -> GatewayAddress | None:
    status = gateway.get("status")
    addresses = status.get("addresses") if isinstance(status, Mapping) else None
    entries = [a for a in addresses if isinstance(a, Mapping)] if isinstance(addresses, list) else []
    namespace = metadata_text(gateway, "namespace")
    for entry in entries:
        value = entry.get("value")
        if entry.get("type") == "Hostname" and isinstance(value, str) and value and value.isprintable():
            return GatewayAddress(NamespacedHostname(namespace, value), HBONE_MTLS_PORT)
    for entry in entries:
        value = entry.get("value")
        if entry.get("type") in (None, "IPAddress") and isinstance(value, str):
            try:
                return GatewayAddress(NetworkAddress(network, parse_ip(value)), HBONE_MTLS_PORT)
            except AddressError:
                continue
    return None


def inbound_binding(gateway: Obj, gateway_class: Obj | None) -> tuple[ApplicationTunnel | None, Skipped | None]:
    """Rule 12: the binding, and the problem to report (on the object that carries the annotation)."""
    own = object_annotations(gateway)
    if INBOUND_BINDING in own:
        value, kind, holder = own[INBOUND_BINDING], GATEWAY, gateway
    elif gateway_class is not None and INBOUND_BINDING in object_annotations(gateway_class):
        value, kind, holder = object_annotations(gateway_class)[INBOUND_BINDING], GATEWAY_CLASS, gateway_class
    else:
        return None, None
    field_path = f"metadata.annotations[{INBOUND_BINDING!r}]"
    parts = value.split("/")
    if len(parts) > 2:
        reason = f'invalid value {value!r}: must be of the format "<protocol>" or "<protocol>/<port>"'
        return None, skipped(kind, holder, field_path, reason)
    protocol = {"NONE": AppTunnelProtocol.NONE, "PROXY": AppTunnelProtocol.PROXY}.get(parts[0])
    if protocol is None:
        return None, skipped(kind, holder, field_path, f"invalid protocol {parts[0]!r}: only NONE or PROXY")
    if len(parts) == 1:
        return ApplicationTunnel(protocol), None
    text = parts[1]
    if text.isascii() and text.isdigit() and len(text.lstrip("0")) <= 5 and int(text) <= 65535:
        return ApplicationTunnel(protocol, int(text)), None
    reason = f"invalid port {text!r}: expected 0..65535; the client's port is used"
    return ApplicationTunnel(protocol), skipped(kind, holder, field_path, reason)


def _bound_listener(listener: Obj, tunnel: ApplicationTunnel | None) -> bool:
    """Whether ``listener`` is the one the inbound binding names (rule 3)."""
    if tunnel is None:
        return False
    if tunnel.port:
        return listener.get("port") == tunnel.port
    return tunnel.protocol is AppTunnelProtocol.PROXY and listener.get("protocol") == SANDWICH_PROXY_PROTOCOL


def allowed_routes(spec: Obj, tunnel: ApplicationTunnel | None = None) -> tuple[str, LabelSelector | None]:
    listeners = [item for item in spec.get("listeners") or () if isinstance(item, Mapping)]
    if not isinstance(spec.get("listeners"), list):
        listeners = []
    bound = [item for item in listeners if _bound_listener(item, tunnel)]
    hbone = [item for item in listeners if item.get("protocol") == "HBONE" and item.get("port") == 15008]
    for listener in (bound or hbone)[:1]:
        routes = listener.get("allowedRoutes")
        namespaces = routes.get("namespaces") if isinstance(routes, Mapping) else None
        if not isinstance(namespaces, Mapping):
            break
        origin = namespaces.get("from")
        if origin == "All":
            return "All", None
        if origin == "Selector":
            return "Selector", selector_from_spec(namespaces.get("selector"))
        break
    return "Same", None
