"""The conditions a waypoint binding writes on Services and ServiceEntries (spec §10.3, istiod's ambient status):
``istio.io/WaypointBound`` from a :class:`~ambit.controlplane.translate.waypoints.Binding`, and
``istio.io/WaypointMissing`` on a ServiceEntry that needs a waypoint and has none. Pure; None means no condition
(the writer removes an old one).

Rules (numbered with :mod:`ambit.controlplane.translate.waypoints`'s):

7. The condition (:func:`bound_status`): bound → True, ``WaypointAccepted``, "Successfully attached to waypoint
   ns/name" (plus istiod's ingress note, then, when the canary was refused, ". Canary waypoint not attached: "
   and the canary's message); a problem → False with its reason and istiod's message; neither → no condition
   (the writer removes an old one).
11. ``istio.io/WaypointMissing`` (:func:`missing_status`, ServiceEntries only): an entry without a bound waypoint
    (none, or a problem) whose hosts include a wildcard gets True, ``NoWaypointForWildcardService``, "ServiceEntry
    will not apply until it is bound to a valid waypoint."; one whose ``istio.io/connect-strategy`` annotation is
    ``RACE_FIRST_TCP_CONNECT`` (any case) gets True, ``NoWaypointForRacingConnectStrategy`` and istiod's message
    instead (it wins when both hold). A bound entry, or one where neither holds, gets none, and the writer removes
    an old one (istiod prunes it when it no longer holds).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ambit.controlplane.translate.fields import metadata_text, object_annotations
from ambit.controlplane.translate.policies import PolicyStatus
from ambit.controlplane.translate.waypoints import Binding

__all__ = [
    "CONNECT_STRATEGY",
    "RACE_FIRST_TCP_CONNECT",
    "WAYPOINT_BOUND",
    "WAYPOINT_MISSING",
    "bound_status",
    "missing_status",
    "races_first_connect",
]

Obj = Mapping[str, Any]

WAYPOINT_BOUND = "istio.io/WaypointBound"
WAYPOINT_MISSING = "istio.io/WaypointMissing"
CONNECT_STRATEGY = "istio.io/connect-strategy"
RACE_FIRST_TCP_CONNECT = "RACE_FIRST_TCP_CONNECT"
NO_WAYPOINT_FOR_WILDCARD = "NoWaypointForWildcardService"
NO_WAYPOINT_FOR_RACING = "NoWaypointForRacingConnectStrategy"


def bound_status(obj: Obj, binding: Binding, *, ingress_label: bool = False) -> PolicyStatus | None:
    """The ``istio.io/WaypointBound`` condition for a Service or ServiceEntry, or None for none (rule 7)."""
    meta = obj.get("metadata")
    generation = meta.get("generation") if isinstance(meta, Mapping) else None
    namespace, name = metadata_text(obj, "namespace"), metadata_text(obj, "name")
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
    namespace, name = metadata_text(obj, "namespace"), metadata_text(obj, "name")
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
