"""Waypoints and what binds to them (spec §1.4, istiod's ambient ``waypoints.go``): the ``waypoint`` field of
Workloads and Services, and the binding the ``istio.io/WaypointBound`` condition of Services and ServiceEntries
reports (spec §10.3).

Theory of operation: :meth:`WaypointIndex.build` reads the Gateways, GatewayClasses and Namespaces once per
translation (each Gateway as :mod:`~ambit.controlplane.translate.waypoint_gateways` reads it); then
:meth:`WaypointIndex.find_for_service` and :meth:`WaypointIndex.find_for_workload` answer, for one object's
namespace and labels, a :class:`Binding`: the waypoint to use, or none, and the problem to report.
:func:`~ambit.controlplane.translate.waypoint_status.bound_status` turns a Service's or ServiceEntry's binding into
the condition the control plane writes. Pure: no I/O; labels are read as strings whatever the input holds.

Rules (1-3, 8 and 12, a Gateway as a waypoint, are :mod:`ambit.controlplane.translate.waypoint_gateways`'s; 7 and
11, the conditions written, :mod:`ambit.controlplane.translate.waypoint_status`'s):

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
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ambit.controlplane.translate.fields import metadata_text, object_annotations, object_labels
from ambit.controlplane.translate.skips import Skipped
from ambit.controlplane.translate.waypoint_gateways import (
    SERVICE_TRAFFIC,
    WAYPOINT_CLASS,
    WAYPOINT_FOR,
    WORKLOAD_TRAFFIC,
    Waypoint,
    allowed_routes,
    gateway_address,
    inbound_binding,
    xfcc_client_identity,
)
from ambit.model.errors import IdentityError
from ambit.model.identity import check_path_segment
from ambit.model.workload import ApplicationTunnel, GatewayAddress, WeightedWaypoint

__all__ = ["Binding", "WaypointIndex"]

Obj = Mapping[str, Any]

USE_WAYPOINT = "istio.io/use-waypoint"
USE_WAYPOINT_NAMESPACE = "istio.io/use-waypoint-namespace"
USE_WAYPOINT_CANARY = "istio.io/use-waypoint-canary"
USE_WAYPOINT_CANARY_NAMESPACE = "istio.io/use-waypoint-canary-namespace"
USE_WAYPOINT_CANARY_WEIGHT = "istio.io/use-waypoint-canary-weight"
_ATOI = re.compile(r"[+-]?([0-9]+)")
"""What Go's ``strconv.Atoi`` reads (ASCII digits, an optional sign, nothing else)."""
INGRESS_USE_WAYPOINT = "istio.io/ingress-use-waypoint"
GATEWAY_NAME = "gateway.networking.k8s.io/gateway-name"
GATEWAY_MANAGED = "gateway.istio.io/managed"
NO_WAYPOINT_CONTROLLERS = ("istio.io-mesh-controller", "istio.io-eastwest-controller")
_TRUE = ("1", "t", "T", "TRUE", "true", "True")
"""What Go's ``strconv.ParseBool`` reads as true."""


def _valid_namespace(namespace: str) -> bool:
    try:
        check_path_segment("namespace", namespace)
    except IdentityError:
        return False
    return True


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
        classes = {metadata_text(c, "name"): c for c in gateway_classes}
        ready: dict[str, Waypoint] = {}
        declared: set[str] = set()
        tunnels: dict[str, ApplicationTunnel] = {}
        problems: set[Skipped] = set()
        for gateway in gateways:
            spec = gateway.get("spec")
            name, namespace = metadata_text(gateway, "name"), metadata_text(gateway, "namespace")
            class_name = spec.get("gatewayClassName") if isinstance(spec, Mapping) else None
            if not isinstance(spec, Mapping) or not isinstance(class_name, str) or not class_name or not name:
                continue
            if not _valid_namespace(namespace):
                continue  # the API server would not have stored it; it could not name a waypoint on the wire
            sandwich = class_name != WAYPOINT_CLASS
            if not sandwich:
                declared.add(f"{namespace}/{name}")
            gateway_class = classes.get(class_name)
            tunnel, problem = inbound_binding(gateway, gateway_class)
            if tunnel is not None:
                tunnels[f"{namespace}/{name}"] = tunnel
            if problem is not None:
                problems.add(problem)
            address = gateway_address(gateway, network)
            if address is None:
                continue
            class_for = object_labels(gateway_class).get(WAYPOINT_FOR) if gateway_class is not None else None
            class_annotations = object_annotations(gateway_class) if gateway_class is not None else {}
            allowed_from, selector = allowed_routes(spec, tunnel)
            own_labels = object_labels(gateway)
            traffic = own_labels.get(WAYPOINT_FOR, SERVICE_TRAFFIC if class_for is None else class_for)
            xfcc = xfcc_client_identity(gateway, class_annotations)
            ready[f"{namespace}/{name}"] = Waypoint(
                namespace, name, address, traffic, allowed_from, selector, xfcc, sandwich
            )
        namespace_list = list(namespaces)
        labels = {metadata_text(ns, "name"): object_labels(ns) for ns in namespace_list}
        annotations = {metadata_text(ns, "name"): object_annotations(ns) for ns in namespace_list}
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
