"""The AuthorizationPolicies and RequestAuthentications that apply at each ingress gateway (a Gateway of class
``istio``), as istiod chooses them for a gateway proxy (spec §1.5, §7.1): the policies of its
:class:`~ambit.model.ingress.GatewayConfig`.

Theory of operation: the objects are translated once, by the waypoint translations (AuthorizationPolicy:
:mod:`~ambit.controlplane.translate.waypoint_policies`, which knows the ingress Gateways as targets and gives a
policy without targetRefs with its L7 fields through ``translate_selected_policy``; RequestAuthentication:
:mod:`~ambit.controlplane.translate.requestauth`). :func:`gateway_authorization_policies` and
:func:`gateway_request_authentications` only choose, per gateway. Pure; equal inputs give equal outputs.

Rules:

1. Attached: an AuthorizationPolicy whose ``targetRefs`` name the Gateway (group ``gateway.networking.k8s.io``,
   the policy's namespace; its ``WaypointAccepted`` says "bound to ns/name"); a RequestAuthentication whose
   ``targetRefs`` name the Gateway. A GatewayClass target never reaches an ingress gateway, as in istiod (its
   policy matcher attaches one only to waypoints, by the name ``istio-waypoint``): an AuthorizationPolicy naming
   the class ``istio`` is ``Invalid``, "GatewayClass must use controller name `istio.io/mesh-controller` for
   waypoints", and a RequestAuthentication's such target is skipped with a reason.
2. Selected: a policy without ``targetRefs``, in the Gateway's namespace or in the root namespace (which selects in
   every namespace), applies when its ``selector.matchLabels`` (none, or empty: every workload) are all among the
   labels of the gateway's pods (:func:`ambit.controlplane.translate.gateway_pods.pod_labels`; a policy is chosen
   per Gateway, whose pods all carry those labels).
3. Each applies to every request through the gateway: AuthorizationPolicies with scope WAYPOINT, RequestAuthentications
   without services. A policy reaches a gateway once; they are ordered by namespace then name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ambit.controlplane.translate.gateway_pods import pod_labels
from ambit.controlplane.translate.requestauth import RequestAuthTranslation, bind_to_waypoints
from ambit.controlplane.translate.waypoint_policies import SelectedPolicy, WaypointPolicyTranslation
from ambit.model.policy import Policy
from ambit.model.requestauth import RequestAuthentication

__all__ = ["IngressPods", "gateway_authorization_policies", "gateway_request_authentications"]

_P = TypeVar("_P", Policy, RequestAuthentication)


@dataclass(frozen=True, slots=True)
class IngressPods:
    """One ingress Gateway as policies see it: its key, namespace and its pods' labels (rule 2)."""

    key: str
    namespace: str
    labels: Mapping[str, str]

    @classmethod
    def of(cls, gateway: Mapping[str, Any]) -> IngressPods:
        meta = gateway.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        return cls(f"{namespace}/{name}", namespace, pod_labels(gateway))

    def selected_by(self, namespace: str, labels: Iterable[tuple[str, str]], root_namespace: str) -> bool:
        """Rule 2 for a policy of ``namespace`` needing ``labels``."""
        if namespace not in (self.namespace, root_namespace):
            return False
        return all(self.labels.get(key) == value for key, value in labels)


def gateway_authorization_policies(
    gateways: Sequence[IngressPods],
    attached: Iterable[WaypointPolicyTranslation],
    selected: Iterable[SelectedPolicy],
    *,
    root_namespace: str,
) -> dict[str, tuple[Policy, ...]]:
    """Each gateway's AuthorizationPolicies (rules 1-3), by gateway key; gateways without any are left out."""
    chosen: dict[str, dict[str, Policy]] = {g.key: {} for g in gateways}
    for translation in attached:
        for pods in gateways:
            for policy in translation.for_gateway(pods.key):
                chosen[pods.key].setdefault(policy.key, policy)
    for item in selected:
        for pods in gateways:
            if pods.selected_by(item.policy.namespace, item.labels, root_namespace):
                chosen[pods.key].setdefault(item.policy.key, item.policy)
    return {key: _ordered(policies) for key, policies in chosen.items() if policies}


def gateway_request_authentications(
    gateways: Sequence[IngressPods], translations: Sequence[RequestAuthTranslation], *, root_namespace: str
) -> dict[str, tuple[RequestAuthentication, ...]]:
    """Each gateway's RequestAuthentications (rules 1-3), by gateway key; gateways without any are left out."""
    keys = [g.key for g in gateways]
    attached = bind_to_waypoints(translations, waypoints=keys, service_keys={}, bound={}, waypoint_class=False)
    chosen: dict[str, dict[str, RequestAuthentication]] = {
        key: {p.key: p for p in attached.get(key, ())} for key in keys
    }
    for translation in translations:
        policy, labels = translation.policy, translation.workload_labels
        if policy is None or labels is None:
            continue
        for pods in gateways:
            if pods.selected_by(policy.namespace, labels, root_namespace):
                chosen[pods.key].setdefault(policy.key, policy)
    return {key: _ordered(policies) for key, policies in chosen.items() if policies}


def _ordered(by_key: dict[str, _P]) -> tuple[_P, ...]:
    return tuple(by_key[key] for key in sorted(by_key, key=lambda k: tuple(k.split("/", 1))))
