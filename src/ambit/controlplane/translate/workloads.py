"""A Pod becomes a Workload (spec §4.1, istiod's ``workloads.go``), with the Services it serves.

Rules:

1. A pod is a workload once it has an address (``status.podIPs``, else ``status.podIP``) and until it has
   finished (phase ``Succeeded`` or ``Failed``). Its uid is ``<cluster>//Pod/<namespace>/<name>``.
2. ``tunnel_protocol`` is HBONE when the annotation ``ambient.istio.io/redirection`` is ``enabled`` (the node
   agent's mark of a fully enrolled pod), or when the label ``networking.istio.io/tunnel`` lists ``http`` (a
   comma-separated list, istiod's ``SupportsTunnel``: the pod terminates HBONE itself, as the node proxy's own pod
   does with its self-proxy listener). A ``hostNetwork: true`` pod is still a workload, with network mode
   HOST_NETWORK, but never HBONE: its address is the node's, shared with everything else on the node.
3. ``status`` is UNHEALTHY when the Ready condition is not ``True`` or a deletion has begun.
4. The canonical name is the first of the labels ``service.istio.io/canonical-name``, ``app.kubernetes.io/name``,
   ``app``, else the workload name; the revision the first of ``service.istio.io/canonical-revision``,
   ``app.kubernetes.io/version``, ``version``, else ``latest``.
5. The workload name is the owning controller's: a ReplicaSet's Deployment (its name less the
   ``pod-template-hash``), else the controller owner's name, else the pod's own.
6. The services map has one entry per Service (or ServiceEntry host) that selects the pod, with the ports
   resolved for it (:mod:`ambit.controlplane.translate.index`).
7. The network is the pod's ``topology.istio.io/network`` label, else the cluster's.
8. An address that is not an IP is left out and reported (:class:`Skipped`); a pod left with none is not a
   workload. An address not assigned yet is not a problem.
9. The locality is that of the pod's node (:mod:`ambit.controlplane.translate.nodes`), unknown without one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ambit.controlplane.translate.index import ServiceIndex, pod_port_resolver
from ambit.controlplane.translate.services import NETWORK_LABEL
from ambit.controlplane.translate.skips import POD, Skipped, skipped
from ambit.model.workload import (
    AddressError,
    HealthStatus,
    IPAddress,
    Locality,
    NetworkMode,
    TunnelProtocol,
    Workload,
    parse_ip,
)

REDIRECTION_ANNOTATION = "ambient.istio.io/redirection"
POD_TEMPLATE_HASH = "pod-template-hash"
NAME_LABELS = ("service.istio.io/canonical-name", "app.kubernetes.io/name", "app")
REVISION_LABELS = ("service.istio.io/canonical-revision", "app.kubernetes.io/version", "version")

Obj = Mapping[str, Any]


def translate_pod(
    pod: Obj,
    services: ServiceIndex,
    *,
    cluster_id: str,
    trust_domain: str,
    network: str,
    skips: list[Skipped] | None = None,
    localities: Mapping[str, Locality] | None = None,
) -> Workload | None:
    """The Workload for ``pod``, or None while it is not one (rule 1); problems go to ``skips`` (rule 8).

    ``localities`` maps node names to their locality (:func:`~ambit.controlplane.translate.nodes.node_localities`).
    """
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    name, namespace = str(meta.get("name", "")), str(meta.get("namespace", ""))
    if not name or not namespace or status.get("phase") in ("Succeeded", "Failed"):
        return None
    addresses = _addresses(pod, [] if skips is None else skips)
    if not addresses:
        return None
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    host_network = spec.get("hostNetwork") is True
    hbone = (annotations.get(REDIRECTION_ANNOTATION) == "enabled" or supports_http_tunnel(labels)) and not host_network
    workload_name = _workload_name(meta)
    node = str(spec.get("nodeName") or "")
    return Workload(
        uid=f"{cluster_id}//Pod/{namespace}/{name}",
        name=name,
        namespace=namespace,
        addresses=addresses,
        network=str(labels.get(NETWORK_LABEL) or network),
        tunnel_protocol=TunnelProtocol.HBONE if hbone else TunnelProtocol.NONE,
        trust_domain=trust_domain,
        service_account=str(spec.get("serviceAccountName") or "default"),
        node=node,
        canonical_name=first_label(labels, NAME_LABELS) or workload_name,
        canonical_revision=first_label(labels, REVISION_LABELS) or "latest",
        workload_name=workload_name,
        workload_type="pod",
        cluster_id=cluster_id,
        status=HealthStatus.HEALTHY if _ready(status) and not meta.get("deletionTimestamp") else HealthStatus.UNHEALTHY,
        services=services.find_services(namespace, labels, pod_port_resolver(pod), pod_name=name),
        network_mode=NetworkMode.HOST_NETWORK if host_network else NetworkMode.STANDARD,
        locality=(localities or {}).get(node, Locality()),
    )


TUNNEL_LABEL = "networking.istio.io/tunnel"


def supports_http_tunnel(labels: Mapping[str, Any]) -> bool:
    """Rule 2: whether ``networking.istio.io/tunnel`` names ``http`` among its comma-separated values."""
    value = labels.get(TUNNEL_LABEL)
    return isinstance(value, str) and "http" in value.split(",")


def _addresses(pod: Obj, skips: list[Skipped]) -> tuple[IPAddress, ...]:
    status = pod.get("status") or {}
    if status.get("podIPs"):
        raw = [(f"status.podIPs[{i}].ip", p.get("ip", "")) for i, p in enumerate(status["podIPs"])]
    else:
        raw = [("status.podIP", status.get("podIP") or "")]
    out: list[IPAddress] = []
    for field, value in raw:
        if value in ("", None):
            continue  # not assigned yet: normal while the pod starts
        try:
            address = parse_ip(str(value))
        except AddressError as exc:
            skips.append(skipped(POD, pod, field, f"{exc}; the pod is left out" if len(raw) == 1 else str(exc)))
            continue
        if address not in out:
            out.append(address)
    return tuple(out)


def _ready(status: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


def first_label(labels: Mapping[str, Any], names: Iterable[str]) -> str:
    for name in names:
        if labels.get(name):
            return str(labels[name])
    return ""


def _workload_name(meta: Obj) -> str:
    name = str(meta.get("name", ""))
    owner = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
    if owner is None or not owner.get("name"):
        return name
    owner_name = str(owner["name"])
    template_hash = (meta.get("labels") or {}).get(POD_TEMPLATE_HASH)
    if owner.get("kind") == "ReplicaSet" and template_hash and owner_name.endswith(f"-{template_hash}"):
        return owner_name.removesuffix(f"-{template_hash}")
    return owner_name
