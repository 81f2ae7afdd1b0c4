"""A Pod becomes a Workload (spec §4.1, istiod's ``workloads.go``), with the Services it serves.

Rules:

1. A pod is a workload once it has an address (``status.podIPs``, else ``status.podIP``) and until it has
   finished (phase ``Succeeded`` or ``Failed``). Its uid is ``<cluster>//Pod/<namespace>/<name>``.
2. ``tunnel_protocol`` is HBONE exactly when the annotation ``ambient.istio.io/redirection`` is ``enabled`` (the node
   agent's mark of a fully enrolled pod). A ``hostNetwork`` pod is still a workload (upstream: network mode
   HOST_NETWORK) but never HBONE: its address is the node's, shared with everything else on the node.
3. ``status`` is UNHEALTHY when the Ready condition is not ``True`` or a deletion has begun.
4. The canonical name is the first of the labels ``service.istio.io/canonical-name``, ``app.kubernetes.io/name``,
   ``app``, else the workload name; the revision the first of ``service.istio.io/canonical-revision``,
   ``app.kubernetes.io/version``, ``version``, else ``latest``.
5. The workload name is the owning controller's: a ReplicaSet's Deployment (its name less the
   ``pod-template-hash``), else the controller owner's name, else the pod's own.
6. The services map has one entry per Service of the pod's namespace that selects it: by ``spec.selector`` (a
   non-empty map, all labels equal), or, for a Service without a selector, by an EndpointSlice of that Service
   (label ``kubernetes.io/service-name``) with an endpoint whose ``targetRef`` is the pod. Each Service port maps
   to a numeric ``targetPort`` as is, or a named one to the pod's container port of that name and protocol; a
   name the pod does not have leaves that port out.
7. The network is the pod's ``topology.istio.io/network`` label, else the cluster's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.translate.services import NETWORK_LABEL, hostname, port_number, service_key, target_port
from ambit.model.workload import (
    AddressError,
    HealthStatus,
    IPAddress,
    PortMapping,
    TunnelProtocol,
    Workload,
    parse_ip,
)

REDIRECTION_ANNOTATION = "ambient.istio.io/redirection"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
POD_TEMPLATE_HASH = "pod-template-hash"
_NAME_LABELS = ("service.istio.io/canonical-name", "app.kubernetes.io/name", "app")
_REVISION_LABELS = ("service.istio.io/canonical-revision", "app.kubernetes.io/version", "version")

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class _ServiceEntry:
    key: str
    selector: Mapping[str, str] | None
    """The Service's selector; None for a Service without one (its pods come from its EndpointSlices)."""
    ports: tuple[Obj, ...]
    slice_pods: frozenset[str]


@dataclass(frozen=True, slots=True)
class ServiceIndex:
    """The Services of each namespace, ready to be matched against pods (rule 6)."""

    by_namespace: Mapping[str, tuple[_ServiceEntry, ...]]

    @classmethod
    def build(cls, services: Iterable[Obj], endpoint_slices: Iterable[Obj], *, domain: str) -> ServiceIndex:
        slice_pods: dict[tuple[str, str], set[str]] = {}
        for eps in endpoint_slices:
            meta = eps.get("metadata") or {}
            owner = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
            if not owner:
                continue
            pods = slice_pods.setdefault((str(meta.get("namespace", "")), str(owner)), set())
            for endpoint in eps.get("endpoints") or ():
                ref = endpoint.get("targetRef") or {}
                if ref.get("kind") == "Pod" and ref.get("name"):
                    pods.add(str(ref["name"]))
        out: dict[str, list[_ServiceEntry]] = {}
        for svc in services:
            meta, spec = svc.get("metadata") or {}, svc.get("spec") or {}
            name, namespace = str(meta.get("name", "")), str(meta.get("namespace", ""))
            if not name or not namespace or spec.get("type") == "ExternalName":
                continue
            selector = spec.get("selector") or None
            entry = _ServiceEntry(
                key=service_key(namespace, hostname(name, namespace, domain)),
                selector={str(k): str(v) for k, v in selector.items()} if selector else None,
                ports=tuple(spec.get("ports") or ()),
                slice_pods=frozenset(slice_pods.get((namespace, name), ())),
            )
            out.setdefault(namespace, []).append(entry)
        return cls({ns: tuple(sorted(entries, key=lambda e: e.key)) for ns, entries in out.items()})

    def find_services(self, pod: Obj) -> dict[str, tuple[PortMapping, ...]]:
        """The services map of ``pod``: service key → its port mappings for this pod."""
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        name = str(meta.get("name", ""))
        out: dict[str, tuple[PortMapping, ...]] = {}
        for entry in self.by_namespace.get(str(meta.get("namespace", "")), ()):
            if entry.selector is not None:
                selected = all(labels.get(k) == v for k, v in entry.selector.items())
            else:
                selected = name in entry.slice_pods
            if selected:
                out[entry.key] = _pod_ports(entry.ports, pod)
        return out


def _pod_ports(ports: Iterable[Obj], pod: Obj) -> tuple[PortMapping, ...]:
    out: dict[int, PortMapping] = {}
    for port in ports:
        number = port_number(port.get("port"))
        if number is None or number in out:
            continue
        target = target_port(port, number)
        resolved = port_number(target)
        if resolved is None and isinstance(target, str):
            resolved = _container_port(pod, target, str(port.get("protocol") or "TCP"))
        if resolved is not None:
            out[number] = PortMapping(number, resolved)
    return tuple(out.values())


def _container_port(pod: Obj, name: str, protocol: str) -> int | None:
    for container in (pod.get("spec") or {}).get("containers") or ():
        for port in container.get("ports") or ():
            if port.get("name") == name and str(port.get("protocol") or "TCP") == protocol:
                return port_number(port.get("containerPort"))
    return None


def translate_pod(
    pod: Obj, services: ServiceIndex, *, cluster_id: str, trust_domain: str, network: str
) -> Workload | None:
    """The Workload for ``pod``, or None while it is not one (rule 1)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    name, namespace = str(meta.get("name", "")), str(meta.get("namespace", ""))
    addresses = _addresses(status)
    if not name or not namespace or not addresses or status.get("phase") in ("Succeeded", "Failed"):
        return None
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    hbone = annotations.get(REDIRECTION_ANNOTATION) == "enabled" and not spec.get("hostNetwork")
    workload_name = _workload_name(meta)
    return Workload(
        uid=f"{cluster_id}//Pod/{namespace}/{name}",
        name=name,
        namespace=namespace,
        addresses=addresses,
        network=str(labels.get(NETWORK_LABEL) or network),
        tunnel_protocol=TunnelProtocol.HBONE if hbone else TunnelProtocol.NONE,
        trust_domain=trust_domain,
        service_account=str(spec.get("serviceAccountName") or "default"),
        node=str(spec.get("nodeName") or ""),
        canonical_name=_first_label(labels, _NAME_LABELS) or workload_name,
        canonical_revision=_first_label(labels, _REVISION_LABELS) or "latest",
        workload_name=workload_name,
        workload_type="pod",
        cluster_id=cluster_id,
        status=HealthStatus.HEALTHY if _ready(status) and not meta.get("deletionTimestamp") else HealthStatus.UNHEALTHY,
        services=services.find_services(pod),
    )


def _addresses(status: Obj) -> tuple[IPAddress, ...]:
    raw = [str(p.get("ip", "")) for p in status.get("podIPs") or ()] or [str(status.get("podIP") or "")]
    out: list[IPAddress] = []
    for value in raw:
        try:
            address = parse_ip(value)
        except AddressError:
            continue
        if address not in out:
            out.append(address)
    return tuple(out)


def _ready(status: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


def _first_label(labels: Mapping[str, Any], names: Iterable[str]) -> str:
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
