"""Which pods an Istio ``Gateway`` (``networking.istio.io``) selects, grouped into classic gateways (spec §1.5): the
pods whose config :mod:`ambit.controlplane.translate.istio_gateways` builds, and who may read it.

Theory of operation: a classic gateway is a group of pods (istio's ``istio-ingressgateway`` Deployment, label
``istio: ingressgateway``), not a Gateway object: every Gateway whose ``selector`` matches a pod's labels puts its
servers on that pod. Pure; what cannot be served is a :class:`~ambit.controlplane.translate.skips.Skipped`.

Rules:

1. Selection: a Gateway with a non-empty ``spec.selector`` (label map) selects every pod, in any namespace (istiod's
   default, ``PILOT_SCOPE_GATEWAY_TO_NAMESPACE=false``), whose labels hold all of it, that is not being deleted, not
   finished, and not deployed by the Gateway API controller (label ``gateway.istio.io/managed``). An empty selector
   is skipped (it would put the servers on every pod of the cluster).
2. Groups: selected pods of one namespace with one canonical name (label ``service.istio.io/canonical-name``, else
   ``app.kubernetes.io/name``, else ``app``; none: the pod is skipped) form one gateway, keyed ``namespace/name``:
   the name its process asks for (``GATEWAY_NAME`` of ``ambit gateway``). Its labels are those of its first pod by
   name, its reader that pod's service account (a pod of the group with another account is left out: it cannot
   read the config). A key that a Gateway API ingress Gateway already uses is left to that Gateway. The Gateways
   of a group are ordered by creation time, then namespace/name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.translate.fields import mapping as _mapping
from ambit.controlplane.translate.fields import object_key as _key
from ambit.controlplane.translate.fields import strings as _strings
from ambit.controlplane.translate.fields import text as _text
from ambit.controlplane.translate.gateway_policies import IngressPods
from ambit.controlplane.translate.skips import POD, ObjectKind, Skipped, skipped

__all__ = ["ISTIO_GATEWAY", "GatewayPods", "find_gateway_pods", "gateway_order"]

ISTIO_GATEWAY = ObjectKind("networking.istio.io/v1", "Gateway")
MANAGED_LABEL = "gateway.istio.io/managed"
_CANONICAL_LABELS = ("service.istio.io/canonical-name", "app.kubernetes.io/name", "app")
Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class GatewayPods:
    """One classic gateway: a group of selected pods (rule 2)."""

    key: str
    namespace: str
    account: str
    labels: Mapping[str, str]
    gateways: tuple[Obj, ...]
    """The Gateways selecting it, in rule 2's order."""

    def as_ingress_pods(self) -> IngressPods:
        return IngressPods(self.key, self.namespace, self.labels)


def gateway_order(obj: Obj) -> tuple[str, str]:
    return (_text(_mapping(obj.get("metadata")).get("creationTimestamp")), _key(obj))


def _selector(gateway: Obj) -> dict[str, str]:
    return _strings(_mapping(gateway.get("spec")).get("selector"))


def find_gateway_pods(
    pods: Iterable[Obj], gateways: Iterable[Obj], *, taken: frozenset[str], skips: list[Skipped]
) -> list[GatewayPods]:
    """Rules 1-2: the groups of selected pods, by key."""
    live = [g for g in gateways if isinstance(g, Mapping) and not _mapping(g.get("metadata")).get("deletionTimestamp")]
    selecting: list[tuple[Obj, dict[str, str]]] = []
    for gateway in sorted(live, key=gateway_order):
        selector = _selector(gateway)
        if selector:
            selecting.append((gateway, selector))
        else:
            reason = "an empty selector is not served: name the gateway pods' labels (e.g. istio: ingressgateway)"
            skips.append(skipped(ISTIO_GATEWAY, gateway, "spec.selector", reason))
    if not selecting:
        return []
    groups: dict[str, list[tuple[Obj, dict[str, str], list[Obj]]]] = {}
    for pod in pods:
        meta = _mapping(pod.get("metadata"))
        labels = _strings(meta.get("labels"))
        if meta.get("deletionTimestamp") or MANAGED_LABEL in labels:
            continue
        if _text(_mapping(pod.get("status")).get("phase")) in ("Succeeded", "Failed"):
            continue
        chosen = [g for g, selector in selecting if all(labels.get(k) == v for k, v in selector.items())]
        if not chosen:
            continue
        name = next((labels[k] for k in _CANONICAL_LABELS if labels.get(k)), "")
        if not name:
            reason = "selected by an Istio Gateway but has no app label (service.istio.io/canonical-name, app)"
            skips.append(skipped(POD, pod, "metadata.labels", reason))
            continue
        key = f"{_text(meta.get('namespace'))}/{name}"
        groups.setdefault(key, []).append((pod, labels, chosen))
    found: list[GatewayPods] = []
    for key, members in sorted(groups.items()):
        if key in taken:
            for pod, _, _ in members:
                reason = (
                    f"its gateway name {key} is an ingress Gateway's (Gateway API): the Istio Gateways are left out"
                )
                skips.append(skipped(POD, pod, "metadata.labels", reason))
            continue
        members.sort(key=lambda m: _text(_mapping(m[0].get("metadata")).get("name")))
        first, labels, _ = members[0]
        account = _text(_mapping(first.get("spec")).get("serviceAccountName")) or "default"
        chosen_keys: dict[str, Obj] = {}
        for pod, _, chosen in members:
            if (_text(_mapping(pod.get("spec")).get("serviceAccountName")) or "default") != account:
                reason = f"gateway {key}: its pods run as {account}; this pod's service account cannot read the config"
                skips.append(skipped(POD, pod, "spec.serviceAccountName", reason))
                continue
            chosen_keys.update((_key(g), g) for g in chosen)
        ordered = tuple(sorted(chosen_keys.values(), key=gateway_order))
        found.append(GatewayPods(key, key.partition("/")[0], account, labels, ordered))
    return found
