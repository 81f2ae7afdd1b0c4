"""How a Service's or ServiceEntry's endpoints are picked: its load balancing (spec §4.1 ``LoadBalancing``).

Theory of operation: pure. :func:`service_load_balancing` reads a Kubernetes Service (and its namespace's
annotations), :func:`entry_load_balancing` a ServiceEntry, and both return the :class:`LoadBalancing` the node
proxy gets (:mod:`ambit.model.routing_preference` says how it picks with it). istiod's ``services.go`` and
``GetTrafficDistribution`` are the reference.

Rules:

1. ``spec.internalTrafficPolicy: Local`` (Services) is STRICT ``[NODE]``: only endpoints on the client's node.
2. Otherwise the traffic distribution is the first of: ``spec.trafficDistribution`` (Services; exact spelling, as
   the API server validates it; a value not known here is passed over), the object's annotation
   ``networking.istio.io/traffic-distribution``, its namespace's annotation of that name. Annotation values are
   read case-insensitively; a set annotation with a value not known here means no distribution (the namespace's
   is not consulted then). The object's own is reported on it; the namespace's is not (it would be reported again
   on every Service of the namespace).
3. ``PreferClose`` and ``PreferSameZone`` are FAILOVER ``[NETWORK, REGION, ZONE]``; ``PreferSameNode`` is FAILOVER
   ``[NETWORK, REGION, ZONE, SUBZONE, NODE]``: the closest endpoints while there are any, the next ring out when
   not. No distribution is the default: no preference.
4. ``spec.publishNotReadyAddresses: true`` (Services) makes the health policy ALLOW_ALL: endpoints that are not
   ready may be picked, as Kubernetes publishes them.
5. A ServiceEntry with ``resolution: NONE`` is PASSTHROUGH with ALLOW_ALL (a connection goes where it was sent);
   no distribution applies to it. Other ServiceEntries take rules 2 and 3 by annotation only.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ambit.model.workload import HealthPolicy, LoadBalancingMode, RoutingScope

__all__ = [
    "ANNOTATION_FIELD",
    "TRAFFIC_DISTRIBUTION_ANNOTATION",
    "Distribution",
    "LoadBalancing",
    "entry_load_balancing",
    "service_load_balancing",
    "traffic_distribution",
]

TRAFFIC_DISTRIBUTION_ANNOTATION = "networking.istio.io/traffic-distribution"


class Distribution(enum.Enum):
    """A traffic distribution, as istiod reduces one (rule 3)."""

    ANY = "Any"
    PREFER_SAME_ZONE = "PreferSameZone"
    PREFER_SAME_NODE = "PreferSameNode"


_SPEC_VALUES = {
    "PreferClose": Distribution.PREFER_SAME_ZONE,
    "PreferSameZone": Distribution.PREFER_SAME_ZONE,
    "PreferSameNode": Distribution.PREFER_SAME_NODE,
}
_ANNOTATION_VALUES = {key.lower(): value for key, value in _SPEC_VALUES.items()}

_PREFERENCES = {
    Distribution.ANY: (),
    Distribution.PREFER_SAME_ZONE: (RoutingScope.NETWORK, RoutingScope.REGION, RoutingScope.ZONE),
    Distribution.PREFER_SAME_NODE: (
        RoutingScope.NETWORK,
        RoutingScope.REGION,
        RoutingScope.ZONE,
        RoutingScope.SUBZONE,
        RoutingScope.NODE,
    ),
}


@dataclass(frozen=True, slots=True)
class LoadBalancing:
    """What a translated service carries of its load balancing, and what was wrong with its input."""

    mode: LoadBalancingMode = LoadBalancingMode.UNSPECIFIED
    routing_preference: tuple[RoutingScope, ...] = ()
    health_policy: HealthPolicy = HealthPolicy.ONLY_HEALTHY
    problem: str = ""
    """A line about the object's annotation value when it is not known here (rule 2), for the caller's skips (at
    :data:`ANNOTATION_FIELD`); empty when none."""


ANNOTATION_FIELD = f"metadata.annotations[{TRAFFIC_DISTRIBUTION_ANNOTATION!r}]"


def traffic_distribution(
    spec_value: Any, annotations: Mapping[str, Any], namespace_annotations: Mapping[str, Any]
) -> tuple[Distribution, str]:
    """The distribution (rule 2), and a problem line when the object's annotation value is not known."""
    if isinstance(spec_value, str) and spec_value in _SPEC_VALUES:
        return _SPEC_VALUES[spec_value], ""
    for own, source in ((True, annotations), (False, namespace_annotations)):
        value = source.get(TRAFFIC_DISTRIBUTION_ANNOTATION)
        if not isinstance(value, str) or not value:
            continue
        found = _ANNOTATION_VALUES.get(value.lower())
        if found is not None:
            return found, ""
        if not own:
            return Distribution.ANY, ""
        # A value is echoed at most 64 characters long: the Event stays one short line.
        return Distribution.ANY, (
            f"{value[:64]!r} is not a traffic distribution: expected one of {', '.join(_SPEC_VALUES)} (any letter "
            "case); none applies"
        )
    return Distribution.ANY, ""


def _of(distribution: Distribution) -> tuple[LoadBalancingMode, tuple[RoutingScope, ...]]:
    preference = _PREFERENCES[distribution]
    return (LoadBalancingMode.FAILOVER if preference else LoadBalancingMode.UNSPECIFIED), preference


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def service_load_balancing(svc: Mapping[str, Any], namespace_annotations: Mapping[str, Any]) -> LoadBalancing:
    """A Kubernetes Service's load balancing (rules 1 to 4)."""
    meta, spec = _mapping(svc.get("metadata")), _mapping(svc.get("spec"))
    problem = ""
    preference: tuple[RoutingScope, ...]
    if spec.get("internalTrafficPolicy") == "Local":
        mode, preference = LoadBalancingMode.STRICT, (RoutingScope.NODE,)
    else:
        distribution, problem = traffic_distribution(
            spec.get("trafficDistribution"), _mapping(meta.get("annotations")), namespace_annotations
        )
        mode, preference = _of(distribution)
    health = HealthPolicy.ALLOW_ALL if spec.get("publishNotReadyAddresses") is True else HealthPolicy.ONLY_HEALTHY
    return LoadBalancing(mode, preference, health, problem)


def entry_load_balancing(
    resolution: str, annotations: Mapping[str, Any], namespace_annotations: Mapping[str, Any]
) -> LoadBalancing:
    """A ServiceEntry's load balancing (rule 5); ``resolution`` as the entry says it (``NONE``, ``DNS``...)."""
    if resolution.upper() == "NONE":
        return LoadBalancing(LoadBalancingMode.PASSTHROUGH, (), HealthPolicy.ALLOW_ALL)
    distribution, problem = traffic_distribution(None, annotations, namespace_annotations)
    mode, preference = _of(distribution)
    return LoadBalancing(mode, preference, HealthPolicy.ONLY_HEALTHY, problem)
