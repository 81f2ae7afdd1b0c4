"""Waypoints and what binds to them (spec §1.4, istiod's ambient ``waypoints.go``): the ``waypoint`` field of
Workloads and Services, and the ``istio.io/WaypointBound`` condition of Services and ServiceEntries (spec §10.3).

Theory of operation: :meth:`WaypointIndex.build` reads the Gateways, GatewayClasses and Namespaces once per
translation; then :meth:`WaypointIndex.find_for_service` and :meth:`WaypointIndex.find_for_workload` answer, for
one object's namespace and labels, a :class:`Binding`: the waypoint to use, or none, and the problem to report.
:func:`bound_status` turns a Service's or ServiceEntry's binding into the condition the control plane writes.
Pure: no I/O; labels are read as strings whatever the input holds.

Rules:

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
4. The binding label ``istio.io/use-waypoint`` names a waypoint, in the object's namespace or in the one
   ``istio.io/use-waypoint-namespace`` names. The value ``none`` opts out (of the namespace's default too). An
   object without the label takes its Namespace's labels the same way (the namespace's own namespace label, else
   the object's namespace). A named waypoint that is missing or not ready gives no waypoint and
   ``WaypointIsNotReady``; one that does not admit the object's namespace (rule 3) ``AttachmentDenied``.
5. Services: a Service labelled ``gateway.istio.io/managed`` ``istio.io-mesh-controller`` (a waypoint's own) or
   ``istio.io-eastwest-controller`` never has a waypoint. A waypoint for neither ``service`` nor ``all`` gives none
   and ``UnsupportedTrafficType``. ``ingress_use_waypoint`` follows ``istio.io/ingress-use-waypoint`` on the
   object, else on its Namespace, read as Go's ``ParseBool``, and only for a bound service.
6. Workloads (pods, WorkloadEntries, inline ServiceEntry endpoints, each by its own labels): a pod whose
   ``gateway.networking.k8s.io/gateway-name`` label names a waypoint Gateway of its namespace (declared, or a
   ready sandwich) is an instance of it and never has a waypoint (istiod checks only ready waypoints; we also
   skip waypoints still coming up, so that a waypoint never routes through another). A waypoint for neither
   ``workload`` nor ``all`` gives none; it is ``UnsupportedTrafficType`` only when the object's own label named
   it (a namespace default meant for services is not an error).
7. The condition (:func:`bound_status`): bound → True, ``WaypointAccepted``, "Successfully attached to waypoint
   ns/name" (plus istiod's ingress note, then, when the canary was refused, ". Canary waypoint not attached: "
   and the canary's message); a problem → False with its reason and istiod's message; neither → no condition
   (the writer removes an old one).
8. ``ambient.istio.io/xfcc-include-client-identity`` on the waypoint's Gateway, else on its
   GatewayClass (the Gateway's own annotation wins, as infrastructure annotations merge), read as istiod
   reads it: ``true`` in any case is on, anything else off. The waypoint then adds the source identity in
   ``x-forwarded-client-cert`` (:mod:`ambit.waypoint.client_cert`).
9. Canary waypoints (Services and ServiceEntries only, and only when the primary is bound without a problem): the
   label ``istio.io/use-waypoint-canary`` names a second waypoint, in the object's namespace or in the one
   ``istio.io/use-waypoint-canary-namespace`` (read from the same labels) names; ``""`` and ``none`` name none.
   The annotation ``istio.io/use-waypoint-canary-weight`` is its share of connections, read as Go's ``Atoi``
   into 0..100, missing meaning 0. An object with its own ``istio.io/use-waypoint`` reads both from itself only;
   one without reads each from itself, else from its Namespace. Checked in this order, each refusal keeping the
   primary alone and reporting the reason: the canary is the primary (``CanarySameAsPrimary``), the weight is not
   a percentage (``CanaryInvalidWeight``), then the checks of rules 4 and 5 on the canary (``WaypointIsNotReady``,
   ``AttachmentDenied``, ``UnsupportedTrafficType``). A usable canary gives :attr:`Binding.weighted`:
   ``[(primary, 100 - weight), (canary, weight)]``, weight 0 included (istiod sends it too).
10. Visibility (istiod's ``fetchWaypointForService``): a ServiceEntry of visibility NAMESPACE never binds to a
    waypoint in another namespace, which would make it reachable from there: no waypoint and
    ``CrossNamespaceWaypointForbidden``. Its visibility is the narrower of its ``exportTo`` one and the mesh
    config's ``serviceEntryVisibility`` one (:mod:`ambit.controlplane.translate.visibility`; istiod reads only the
    latter).
    A Kubernetes Service is not checked, as istiod does not check it, whatever its ``exportTo``. Its canary is
    refused the same way (istiod checks only the primary; the canary takes the same traffic, so the same reason
    holds).
11. ``istio.io/WaypointMissing`` (:func:`missing_status`, ServiceEntries only): an entry without a bound waypoint
    (none, or a problem) whose hosts include a wildcard gets True, ``NoWaypointForWildcardService``, "ServiceEntry
    will not apply until it is bound to a valid waypoint."; one whose ``istio.io/connect-strategy`` annotation is
    ``RACE_FIRST_TCP_CONNECT`` (any case) gets True, ``NoWaypointForRacingConnectStrategy`` and istiod's message
    instead (it wins when both hold). A bound entry, or one where neither holds, gets none, and the writer removes
    an old one (istiod prunes it when it no longer holds).
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

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ambit.controlplane.translate.policies import PolicyStatus
from ambit.controlplane.translate.skips import ObjectKind, Skipped, skipped
from ambit.model.errors import IdentityError
from ambit.model.identity import check_path_segment
from ambit.model.labels import LabelSelector, selector_from_spec
from ambit.model.workload import (
    HBONE_MTLS_PORT,
    AddressError,
    ApplicationTunnel,
    AppTunnelProtocol,
    GatewayAddress,
    NamespacedHostname,
    NetworkAddress,
    WeightedWaypoint,
    parse_ip,
)

__all__ = [
    "CONNECT_STRATEGY",
    "INBOUND_BINDING",
    "RACE_FIRST_TCP_CONNECT",
    "WAYPOINT_BOUND",
    "WAYPOINT_CLASS",
    "WAYPOINT_MISSING",
    "Binding",
    "Waypoint",
    "WaypointIndex",
    "bound_status",
    "missing_status",
    "object_annotations",
    "object_labels",
    "races_first_connect",
]

Obj = Mapping[str, Any]

WAYPOINT_CLASS = "istio-waypoint"
WAYPOINT_BOUND = "istio.io/WaypointBound"
WAYPOINT_MISSING = "istio.io/WaypointMissing"
CONNECT_STRATEGY = "istio.io/connect-strategy"
RACE_FIRST_TCP_CONNECT = "RACE_FIRST_TCP_CONNECT"
NO_WAYPOINT_FOR_WILDCARD = "NoWaypointForWildcardService"
NO_WAYPOINT_FOR_RACING = "NoWaypointForRacingConnectStrategy"
USE_WAYPOINT = "istio.io/use-waypoint"
USE_WAYPOINT_NAMESPACE = "istio.io/use-waypoint-namespace"
USE_WAYPOINT_CANARY = "istio.io/use-waypoint-canary"
USE_WAYPOINT_CANARY_NAMESPACE = "istio.io/use-waypoint-canary-namespace"
USE_WAYPOINT_CANARY_WEIGHT = "istio.io/use-waypoint-canary-weight"
_ATOI = re.compile(r"[+-]?([0-9]+)")
"""What Go's ``strconv.Atoi`` reads (ASCII digits, an optional sign, nothing else)."""
WAYPOINT_FOR = "istio.io/waypoint-for"
INGRESS_USE_WAYPOINT = "istio.io/ingress-use-waypoint"
GATEWAY_NAME = "gateway.networking.k8s.io/gateway-name"
GATEWAY_MANAGED = "gateway.istio.io/managed"
XFCC_CLIENT_IDENTITY = "ambient.istio.io/xfcc-include-client-identity"
INBOUND_BINDING = "ambient.istio.io/waypoint-inbound-binding"
SANDWICH_PROXY_PROTOCOL = "istio.io/PROXY"
"""The listener protocol that a PROXY binding without a port takes its ``allowedRoutes`` from (rule 3)."""
GATEWAY = ObjectKind("gateway.networking.k8s.io/v1", "Gateway")
GATEWAY_CLASS = ObjectKind("gateway.networking.k8s.io/v1", "GatewayClass")
NO_WAYPOINT_CONTROLLERS = ("istio.io-mesh-controller", "istio.io-eastwest-controller")
SERVICE_TRAFFIC, WORKLOAD_TRAFFIC, ALL_TRAFFIC = "service", "workload", "all"
_TRUE = ("1", "t", "T", "TRUE", "true", "True")
"""What Go's ``strconv.ParseBool`` reads as true."""


def object_labels(obj: Obj) -> dict[str, str]:
    """An API object's ``metadata.labels`` as strings (anything else in the input is ignored)."""
    meta = obj.get("metadata")
    return _string_map(meta.get("labels") if isinstance(meta, Mapping) else None)


def object_annotations(obj: Obj) -> dict[str, str]:
    """An API object's ``metadata.annotations`` as strings (anything else in the input is ignored)."""
    meta = obj.get("metadata")
    return _string_map(meta.get("annotations") if isinstance(meta, Mapping) else None)


def _string_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def _annotations(obj: Obj) -> dict[str, str]:
    meta = obj.get("metadata")
    return _string_map(meta.get("annotations") if isinstance(meta, Mapping) else None)


def _xfcc_client_identity(gateway: Obj, class_annotations: Mapping[str, str]) -> bool:
    """Rule 8."""
    own = _annotations(gateway)
    value = (
        own[XFCC_CLIENT_IDENTITY] if XFCC_CLIENT_IDENTITY in own else class_annotations.get(XFCC_CLIENT_IDENTITY, "")
    )
    return value.lower() == "true"


def _valid_namespace(namespace: str) -> bool:
    try:
        check_path_segment("namespace", namespace)
    except IdentityError:
        return False
    return True


def _meta_text(obj: Obj, key: str) -> str:
    meta = obj.get("metadata")
    value = meta.get(key) if isinstance(meta, Mapping) else None
    return value if isinstance(value, str) else ""


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


@dataclass(frozen=True, slots=True)
class Binding:
    """The answer for one object: the waypoint it uses (or None) and, when it asked for one and cannot have it,
    the reason and istiod's message."""

    waypoint: Waypoint | None = None
    reason: str = ""
    """With a waypoint, the reason its canary was refused (rule 9); without, why there is no waypoint."""
    message: str = ""
    ingress_use_waypoint: bool = False
    canary: Waypoint | None = None
    """The canary waypoint that takes :attr:`canary_weight` percent of new connections (rule 9)."""
    canary_weight: int = 0

    @property
    def address(self) -> GatewayAddress | None:
        return None if self.waypoint is None else self.waypoint.address

    @property
    def weighted(self) -> tuple[WeightedWaypoint, ...]:
        """``[(primary, 100 - weight), (canary, weight)]`` with a canary, else nothing (rule 9)."""
        if self.waypoint is None or self.canary is None:
            return ()
        return (
            WeightedWaypoint(self.waypoint.address, 100 - self.canary_weight),
            WeightedWaypoint(self.canary.address, self.canary_weight),
        )

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys of the waypoints that front the object: the primary, then the canary."""
        return tuple(w.key for w in (self.waypoint, self.canary) if w is not None)


def _not_ready(key: str) -> Binding:
    return Binding(reason="WaypointIsNotReady", message=f'waypoint "{key}" is not ready')


def _denied(key: str) -> Binding:
    return Binding(
        reason="AttachmentDenied",
        message=f'we are not permitted to attach to waypoint "{key}" (missing allowedRoutes?)',
    )


def _unsupported(key: str, traffic: str) -> Binding:
    return Binding(
        reason="UnsupportedTrafficType",
        message=f'attempting to bind to traffic type "{traffic}" which the waypoint "{key}" does not support',
    )


def _cross_namespace(key: str) -> Binding:
    return Binding(
        reason="CrossNamespaceWaypointForbidden",
        message=(
            f'cannot bind to waypoint "{key}" in another namespace: cross-namespace waypoint binding is not '
            "permitted for a ServiceEntry with NAMESPACE visibility"
        ),
    )


def _canary_refused(reason: str, message: str) -> Binding:
    return Binding(reason=reason, message=message)


def _gateway_address(gateway: Obj, network: str) -> GatewayAddress | None:
    status = gateway.get("status")
    addresses = status.get("addresses") if isinstance(status, Mapping) else None
    entries = [a for a in addresses if isinstance(a, Mapping)] if isinstance(addresses, list) else []
    namespace = _meta_text(gateway, "namespace")
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


def _inbound_binding(gateway: Obj, gateway_class: Obj | None) -> tuple[ApplicationTunnel | None, Skipped | None]:
    """Rule 12: the binding, and the problem to report (on the object that carries the annotation)."""
    own = _annotations(gateway)
    if INBOUND_BINDING in own:
        value, kind, holder = own[INBOUND_BINDING], GATEWAY, gateway
    elif gateway_class is not None and INBOUND_BINDING in _annotations(gateway_class):
        value, kind, holder = _annotations(gateway_class)[INBOUND_BINDING], GATEWAY_CLASS, gateway_class
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


def _allowed_routes(spec: Obj, tunnel: ApplicationTunnel | None = None) -> tuple[str, LabelSelector | None]:
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


def _use_waypoint(labels: Mapping[str, str], default_namespace: str) -> str | None:
    """``ns/name`` the labels bind to, ``""`` for an explicit ``none``, None when they say nothing (rule 4)."""
    name = labels.get(USE_WAYPOINT)
    if name is None:
        return None
    if name == "none":
        return ""
    return f"{labels.get(USE_WAYPOINT_NAMESPACE, default_namespace)}/{name}"


def _canary_weight(value: str | None) -> int | None:
    """The canary's percentage: 0 when missing, None when not an integer in 0..100 (rule 9)."""
    if value is None:
        return 0
    match = _ATOI.fullmatch(value)
    if match is None:
        return None
    digits = match.group(1).lstrip("0") or "0"
    if len(digits) > 3:  # also keeps int() away from arbitrarily long input
        return None
    weight = -int(digits) if value.startswith("-") else int(digits)
    return weight if 0 <= weight <= 100 else None


@dataclass(frozen=True, slots=True)
class WaypointIndex:
    """The ready waypoints (sandwiches included) by ``ns/name``, the key of every Gateway of class
    ``istio-waypoint`` (ready or not), and the namespaces' labels."""

    ready: Mapping[str, Waypoint]
    declared: frozenset[str]
    namespace_labels: Mapping[str, Mapping[str, str]]
    namespace_annotations: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    tunnels: Mapping[str, ApplicationTunnel] = field(default_factory=dict)
    """The inbound binding of every Gateway that has one, by ``ns/name`` (rule 12)."""
    problems: tuple[Skipped, ...] = ()
    """Inbound binding annotations that could not be read as written (rule 12)."""

    @classmethod
    def build(
        cls, gateways: Iterable[Obj], gateway_classes: Iterable[Obj], namespaces: Iterable[Obj], *, network: str
    ) -> WaypointIndex:
        classes = {_meta_text(c, "name"): c for c in gateway_classes}
        ready: dict[str, Waypoint] = {}
        declared: set[str] = set()
        tunnels: dict[str, ApplicationTunnel] = {}
        problems: set[Skipped] = set()
        for gateway in gateways:
            spec = gateway.get("spec")
            name, namespace = _meta_text(gateway, "name"), _meta_text(gateway, "namespace")
            class_name = spec.get("gatewayClassName") if isinstance(spec, Mapping) else None
            if not isinstance(spec, Mapping) or not isinstance(class_name, str) or not class_name or not name:
                continue
            if not _valid_namespace(namespace):
                continue  # the API server would not have stored it; it could not name a waypoint on the wire
            sandwich = class_name != WAYPOINT_CLASS
            if not sandwich:
                declared.add(f"{namespace}/{name}")
            gateway_class = classes.get(class_name)
            tunnel, problem = _inbound_binding(gateway, gateway_class)
            if tunnel is not None:
                tunnels[f"{namespace}/{name}"] = tunnel
            if problem is not None:
                problems.add(problem)
            address = _gateway_address(gateway, network)
            if address is None:
                continue
            class_for = object_labels(gateway_class).get(WAYPOINT_FOR) if gateway_class is not None else None
            class_annotations = _annotations(gateway_class) if gateway_class is not None else {}
            allowed_from, selector = _allowed_routes(spec, tunnel)
            own_labels = object_labels(gateway)
            traffic = own_labels.get(WAYPOINT_FOR, SERVICE_TRAFFIC if class_for is None else class_for)
            xfcc = _xfcc_client_identity(gateway, class_annotations)
            ready[f"{namespace}/{name}"] = Waypoint(
                namespace, name, address, traffic, allowed_from, selector, xfcc, sandwich
            )
        namespace_list = list(namespaces)
        labels = {_meta_text(ns, "name"): object_labels(ns) for ns in namespace_list}
        annotations = {_meta_text(ns, "name"): object_annotations(ns) for ns in namespace_list}
        return cls(ready, frozenset(declared), labels, annotations, tunnels, tuple(sorted(problems)))

    def _target(self, namespace: str, labels: Mapping[str, str]) -> tuple[Binding, bool]:
        """The binding named by the object's labels, else its namespace's (rule 4); and whether the object's own
        label named it."""
        own = _use_waypoint(labels, namespace)
        inherited = False
        if own is None:
            own = _use_waypoint(self.namespace_labels.get(namespace, {}), namespace)
            inherited = True
        if not own:
            return Binding(), not inherited
        waypoint = self.ready.get(own)
        if waypoint is None:
            return _not_ready(own), not inherited
        if not waypoint.admits(namespace, self.namespace_labels.get(namespace, {})):
            return _denied(own), not inherited
        return Binding(waypoint), not inherited

    def find_for_service(
        self,
        namespace: str,
        labels: Mapping[str, str],
        annotations: Mapping[str, str] | None = None,
        *,
        namespace_only: bool = False,
    ) -> Binding:
        """A Service's or ServiceEntry's binding (rules 4, 5, 9 and 10: ``namespace_only`` for a ServiceEntry of
        visibility NAMESPACE)."""
        if labels.get(GATEWAY_MANAGED) in NO_WAYPOINT_CONTROLLERS:
            return Binding()
        binding, _own = self._target(namespace, labels)
        waypoint = binding.waypoint
        if waypoint is None:
            return binding
        if not waypoint.takes(SERVICE_TRAFFIC):
            return _unsupported(waypoint.key, SERVICE_TRAFFIC)
        if namespace_only and waypoint.namespace != namespace:
            return _cross_namespace(waypoint.key)
        primary = Binding(waypoint, ingress_use_waypoint=self._ingress(namespace, labels))
        canary = self._canary(namespace, labels, annotations or {}, waypoint, namespace_only)
        return replace(
            primary,
            canary=canary.canary,
            canary_weight=canary.canary_weight,
            reason=canary.reason,
            message=canary.message,
        )

    def _canary(
        self,
        namespace: str,
        labels: Mapping[str, str],
        annotations: Mapping[str, str],
        primary: Waypoint,
        namespace_only: bool,
    ) -> Binding:
        """The canary of a bound Service (rule 9): a binding with ``canary`` set, or the refusal, or nothing."""
        inherit = USE_WAYPOINT not in labels
        ns_labels = self.namespace_labels.get(namespace, {}) if inherit else {}
        ns_annotations = self.namespace_annotations.get(namespace, {}) if inherit else {}
        source = labels if USE_WAYPOINT_CANARY in labels else ns_labels
        name = source.get(USE_WAYPOINT_CANARY)
        if not name or name == "none":
            return Binding()
        key = f"{source.get(USE_WAYPOINT_CANARY_NAMESPACE, namespace)}/{name}"
        if key == primary.key:
            return _canary_refused(
                "CanarySameAsPrimary", f'canary waypoint "{key}" must differ from the primary waypoint'
            )
        weight = _canary_weight(
            annotations.get(USE_WAYPOINT_CANARY_WEIGHT, ns_annotations.get(USE_WAYPOINT_CANARY_WEIGHT))
        )
        if weight is None:
            return _canary_refused(
                "CanaryInvalidWeight", f'canary waypoint "{key}" has an invalid weight; must be an integer in [0,100]'
            )
        canary = self.ready.get(key)
        if canary is None:
            return _not_ready(key)
        if not canary.admits(namespace, self.namespace_labels.get(namespace, {})):
            return _denied(key)
        if not canary.takes(SERVICE_TRAFFIC):
            return _unsupported(key, SERVICE_TRAFFIC)
        if namespace_only and canary.namespace != namespace:
            return _cross_namespace(key)
        return Binding(canary=canary, canary_weight=weight)

    def find_for_workload(self, namespace: str, labels: Mapping[str, str], *, pod: bool = False) -> Binding:
        """A workload's binding (rules 4 and 6); ``pod`` for pods, which may be a waypoint's own."""
        instance_of = f"{namespace}/{labels.get(GATEWAY_NAME)}"
        if pod and labels.get(GATEWAY_NAME) and (instance_of in self.declared or instance_of in self.ready):
            return Binding()
        binding, own = self._target(namespace, labels)
        waypoint = binding.waypoint
        if waypoint is None or waypoint.takes(WORKLOAD_TRAFFIC):
            return binding
        return _unsupported(waypoint.key, WORKLOAD_TRAFFIC) if own else Binding()

    def find_application_tunnel(self, namespace: str, labels: Mapping[str, str]) -> ApplicationTunnel | None:
        """The application tunnel of a pod that is an instance of a Gateway with an inbound binding (rule 12)."""
        name = labels.get(GATEWAY_NAME)
        return self.tunnels.get(f"{namespace}/{name}") if name else None

    def _ingress(self, namespace: str, labels: Mapping[str, str]) -> bool:
        value = labels.get(INGRESS_USE_WAYPOINT)
        if value is None:
            value = self.namespace_labels.get(namespace, {}).get(INGRESS_USE_WAYPOINT)
        return value in _TRUE

    def ingress_label_present(self, namespace: str, labels: Mapping[str, str]) -> bool:
        return INGRESS_USE_WAYPOINT in labels or INGRESS_USE_WAYPOINT in self.namespace_labels.get(namespace, {})


def bound_status(obj: Obj, binding: Binding, *, ingress_label: bool = False) -> PolicyStatus | None:
    """The ``istio.io/WaypointBound`` condition for a Service or ServiceEntry, or None for none (rule 7)."""
    meta = obj.get("metadata")
    generation = meta.get("generation") if isinstance(meta, Mapping) else None
    namespace, name = _meta_text(obj, "namespace"), _meta_text(obj, "name")
    observed = generation if isinstance(generation, int) and not isinstance(generation, bool) else 0
    if binding.waypoint is not None:
        message = f"Successfully attached to waypoint {binding.waypoint.key}"
        if binding.ingress_use_waypoint:
            message += ". Ingress traffic will traverse the waypoint"
        elif ingress_label:
            message += (
                ". Ingress traffic is not using the waypoint, set the istio.io/ingress-use-waypoint label to true"
                " if desired."
            )
        if binding.reason:
            message += f". Canary waypoint not attached: {binding.message}"
        return PolicyStatus(namespace, name, observed, True, "WaypointAccepted", message, WAYPOINT_BOUND)
    if binding.reason:
        return PolicyStatus(namespace, name, observed, False, binding.reason, binding.message, WAYPOINT_BOUND)
    return None


def races_first_connect(obj: Obj) -> bool:
    """Whether a ServiceEntry asks for racing connects to its resolved addresses (``istio.io/connect-strategy:
    RACE_FIRST_TCP_CONNECT``, read in any case as istiod's ``GetDNSConnectStrategy`` does)."""
    return object_annotations(obj).get(CONNECT_STRATEGY, "").casefold() == RACE_FIRST_TCP_CONNECT.casefold()


def missing_status(obj: Obj, binding: Binding) -> PolicyStatus | None:
    """The ``istio.io/WaypointMissing`` condition of a ServiceEntry, or None for none (rule 11)."""
    if binding.waypoint is not None:
        return None
    meta = obj.get("metadata")
    generation = meta.get("generation") if isinstance(meta, Mapping) else None
    observed = generation if isinstance(generation, int) and not isinstance(generation, bool) else 0
    namespace, name = _meta_text(obj, "namespace"), _meta_text(obj, "name")
    if races_first_connect(obj):
        message = (
            "ServiceEntry has a non-default connect strategy but no waypoint bound. "
            "A waypoint is required for connect strategies to take effect for ambient clients."
        )
        return PolicyStatus(namespace, name, observed, True, NO_WAYPOINT_FOR_RACING, message, WAYPOINT_MISSING)
    spec = obj.get("spec")
    hosts = spec.get("hosts") if isinstance(spec, Mapping) else None
    if isinstance(hosts, list) and any(isinstance(h, str) and h.startswith("*") for h in hosts):
        message = "ServiceEntry will not apply until it is bound to a valid waypoint."
        return PolicyStatus(namespace, name, observed, True, NO_WAYPOINT_FOR_WILDCARD, message, WAYPOINT_MISSING)
    return None
