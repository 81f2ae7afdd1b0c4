"""What the pods deployed for a Gateway carry: their labels and annotations, as the deployment controller renders
them (:mod:`ambit.controlplane.gateway.render`, rules 3 and 4) and as policy selectors see them.

Theory of operation: the deployment controller and the policy translation need the same answer (a
RequestAuthentication or AuthorizationPolicy with a ``selector`` applies at an ingress gateway whose pods carry its
labels), so both read it here, from the Gateway alone: the pods may not exist yet, and every pod of one Gateway
carries the same labels. Pure.

Rules:

1. Infrastructure labels and annotations are those of ``spec.infrastructure`` when it has them, else the Gateway's
   own (istiod copies them); keys under ``gateway.networking.k8s.io/`` and istiod's own control annotations are
   dropped, non-string values are ignored.
2. The fixed labels win over copied ones: ``gateway.networking.k8s.io/gateway-name``,
   ``gateway.networking.k8s.io/gateway-class-name``, ``gateway.istio.io/managed`` (``istio.io-mesh-controller`` for
   a waypoint, ``istio.io-gateway-controller`` for an ingress gateway), on the pods also the canonical service
   labels and, for an ingress gateway, ``istio.io/gateway-name`` (Istio's older selector label); then, on a
   waypoint's pods, ``istio.io/dataplane-mode: none`` and ``sidecar.istio.io/inject: "false"`` (a waypoint
   captured by the node proxy would steer its own traffic back into itself).
3. An ingress gateway's pods get ``istio.io/dataplane-mode: none`` and ``sidecar.istio.io/inject: "false"`` only as
   defaults that the infrastructure labels override, as istiod's ``kube-gateway`` template orders them: a Gateway
   labelled ``istio.io/dataplane-mode: ambient`` has captured pods, a "sandwich" (:mod:`.waypoint_gateways` rule 1),
   whose inbound arrives over HBONE through their node proxy and whose outbound that node proxy carries. (istiod's
   template sets no ``dataplane-mode`` at all, so its gateways in an ambient namespace are captured too; Ambit keeps an
   ingress gateway out of its namespace's capture unless the Gateway asks.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ambit.controlplane.translate.fields import strings as _strings
from ambit.controlplane.translate.listeners import deployed_name, is_ingress

__all__ = [
    "CONTROLLER_LABEL",
    "GATEWAY_CLASS_LABEL",
    "GATEWAY_CONTROLLER",
    "GATEWAY_CONTROLLER_LABEL",
    "GATEWAY_NAME_LABEL",
    "ISTIO_GATEWAY_NAME_LABEL",
    "MANAGED_LABEL",
    "MESH_CONTROLLER",
    "fixed_labels",
    "infrastructure",
    "pod_labels",
]

Obj = Mapping[str, Any]

MESH_CONTROLLER = "istio.io/mesh-controller"
"""The ``controllerName`` of the waypoint GatewayClass."""
MANAGED_LABEL = "gateway.istio.io/managed"
CONTROLLER_LABEL = MESH_CONTROLLER.replace("/", "-")
"""The value of :data:`MANAGED_LABEL` on what this controller deploys for waypoints (``istio.io-mesh-controller``)."""
GATEWAY_CONTROLLER = "istio.io/gateway-controller"
"""The ``controllerName`` of the ingress GatewayClass."""
GATEWAY_CONTROLLER_LABEL = GATEWAY_CONTROLLER.replace("/", "-")
"""The value of :data:`MANAGED_LABEL` on what this controller deploys for ingress gateways."""
ISTIO_GATEWAY_NAME_LABEL = "istio.io/gateway-name"
GATEWAY_NAME_LABEL = "gateway.networking.k8s.io/gateway-name"
GATEWAY_CLASS_LABEL = "gateway.networking.k8s.io/gateway-class-name"

_DROPPED_ANNOTATIONS = frozenset(
    {
        "kubectl.kubernetes.io/last-applied-configuration",
        "gateway.istio.io/name-override",
        "gateway.istio.io/service-account",
        "gateway.istio.io/controller-version",
    }
)


def infrastructure(gateway: Obj, field: str) -> dict[str, str]:
    """Rule 1: the ``labels`` or ``annotations`` copied from the Gateway."""
    meta = gateway.get("metadata") or {}
    spec = gateway.get("spec") or {}
    infra = spec.get("infrastructure") if isinstance(spec, Mapping) else None
    source = infra.get(field) if isinstance(infra, Mapping) and isinstance(infra.get(field), Mapping) else None
    copied = _strings(source if source is not None else meta.get(field) if isinstance(meta, Mapping) else None)
    copied = {k: v for k, v in copied.items() if not k.startswith("gateway.networking.k8s.io/")}
    if field == "annotations":
        copied = {k: v for k, v in copied.items() if k not in _DROPPED_ANNOTATIONS}
    return copied


def fixed_labels(gateway: Obj) -> dict[str, str]:
    """Rule 2's labels of every object deployed for ``gateway``."""
    meta = gateway.get("metadata") or {}
    name = meta.get("name") if isinstance(meta, Mapping) else None
    spec = gateway.get("spec") or {}
    class_name = spec.get("gatewayClassName") if isinstance(spec, Mapping) else None
    managed = GATEWAY_CONTROLLER_LABEL if is_ingress(gateway) else CONTROLLER_LABEL
    return {
        GATEWAY_NAME_LABEL: name if isinstance(name, str) else "",
        GATEWAY_CLASS_LABEL: class_name if isinstance(class_name, str) else "",
        MANAGED_LABEL: managed,
    }


def pod_labels(gateway: Obj) -> dict[str, str]:
    """The labels of every pod deployed for ``gateway`` (rules 1-3)."""
    fixed = fixed_labels(gateway)
    unenrolled = {"istio.io/dataplane-mode": "none", "sidecar.istio.io/inject": "false"}
    if is_ingress(gateway):  # rule 3
        return {
            **unenrolled,
            **infrastructure(gateway, "labels"),
            "service.istio.io/canonical-name": deployed_name(gateway),
            "service.istio.io/canonical-revision": "latest",
            **fixed,
            ISTIO_GATEWAY_NAME_LABEL: fixed[GATEWAY_NAME_LABEL],
        }
    return {
        **infrastructure(gateway, "labels"),
        "service.istio.io/canonical-name": deployed_name(gateway),
        "service.istio.io/canonical-revision": "latest",
        **fixed,
        **unenrolled,
    }
