"""Endpoints added to a Service's EndpointSlices by hand become Workloads (istiod's ``endpointSlicesBuilder``).

Kubernetes puts every selected pod in its Service's EndpointSlices; those endpoints name the pod as ``targetRef``
and the pod itself is translated, with far more to say than the slice. Endpoints without a pod behind them (the
API server's own ``default/kubernetes`` Service, a selector-less Service pointing at machines outside the cluster)
exist only in the slice, and without a Workload for them a captured client would find the Service's VIP with no
endpoint and be refused.

Rules:

1. Only a slice labelled ``kubernetes.io/service-name`` with the name of a Kubernetes Service of its namespace counts
   (a ServiceEntry's hostname never matches: ServiceEntries are not selected by slices); a slice of address type
   ``FQDN`` is ignored, as istiod does.
2. Each endpoint whose ``targetRef`` is not a Pod, with at least one address, becomes one Workload: uid
   ``<cluster>/discovery.k8s.io/EndpointSlice/<namespace>/<slice>/<first address>``, name the slice's, its
   addresses, ``HOST_NETWORK`` (such an address may be shared with anything, so it is never taken as one
   workload's), no tunnel, no service account, no waypoint and no policies (it is only ever a destination).
   An endpoint with an address that is not an IP is left out and reported; a first address seen twice in one
   slice is kept once.
3. It is HEALTHY unless ``conditions.ready`` is ``false``.
4. Its services map holds the one Service: each TCP port of the slice with a name and a number maps the Service's
   port of that name to the slice's number. Ports of other protocols, or unnamed, are left out.
5. A slice's workloads and skips depend on the slice and its Service only (and the domain, cluster, trust domain
   and network): a memo keyed by both objects' uid and resourceVersion reuses them, so a translation walks the
   endpoints of changed slices only, and reads the ports of their Services only.
6. A slice none of whose endpoints has a ``targetRef`` other than a Pod gives no workload and no skip, whatever its
   Service (:func:`gives_workloads`): a change of such a slice leaves the output as it was.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ambit.controlplane.translate.fields import mapping, sequence
from ambit.controlplane.translate.index import SERVICE_NAME_LABEL
from ambit.controlplane.translate.services import hostname, port_number, service_key
from ambit.controlplane.translate.skips import ENDPOINT_SLICE, Skipped, skipped
from ambit.model.workload import (
    AddressError,
    HealthStatus,
    IPAddress,
    NetworkMode,
    PortMapping,
    TunnelProtocol,
    Workload,
    parse_ip,
)

Obj = Mapping[str, Any]
SliceKey = tuple[str, str, str, str, str, str, str, str]
"""(uid, resourceVersion, the owning Service's uid and resourceVersion, domain, cluster, trust domain, network): all
a slice's workloads are made from."""
SliceMemo = dict[SliceKey, tuple[tuple[Workload, ...], tuple[Skipped, ...]]]


def endpoint_slice_workloads(
    slices: Iterable[Obj],
    services: Iterable[Obj],
    *,
    domain: str,
    cluster_id: str,
    trust_domain: str,
    network: str,
    skips: list[Skipped],
    memo: SliceMemo | None = None,
) -> Iterator[Workload]:
    """The Workloads of the hand-added endpoints of ``slices`` (rules 1 to 4).

    ``memo``, when given, keeps each slice's workloads and skips by everything they are made from (rule 5); after
    the call it holds exactly this call's slices that have a uid and resourceVersion."""
    by_key: dict[tuple[str, str], Obj] = {}
    for svc in services:
        meta = mapping(svc.get("metadata"))
        by_key[(str(meta.get("namespace") or ""), str(meta.get("name") or ""))] = svc
    ports_by_service = _NamedPorts(by_key)
    if memo is None:
        for eps in slices:
            yield from _slice_workloads(eps, ports_by_service, domain, cluster_id, trust_domain, network, skips)
        return
    known, memo_dict = dict(memo), memo
    memo_dict.clear()
    for eps in slices:
        meta = mapping(eps.get("metadata"))
        owner = str(mapping(meta.get("labels")).get(SERVICE_NAME_LABEL) or "")
        service_meta = mapping(by_key.get((str(meta.get("namespace") or ""), owner), {}).get("metadata"))
        key: SliceKey = (
            str(meta.get("uid") or ""),
            str(meta.get("resourceVersion") or ""),
            str(service_meta.get("uid") or ""),
            str(service_meta.get("resourceVersion") or ""),
            domain,
            cluster_id,
            trust_domain,
            network,
        )
        entry = known.get(key) if all(key[:4]) else None
        if entry is None:
            own: list[Skipped] = []
            made = tuple(_slice_workloads(eps, ports_by_service, domain, cluster_id, trust_domain, network, own))
            entry = (made, tuple(own))
        if all(key[:4]):
            memo_dict[key] = entry
        skips.extend(entry[1])
        yield from entry[0]


def gives_workloads(eps: Obj) -> bool:
    """Whether ``eps`` may give a workload or a skip: it has an endpoint whose ``targetRef`` is not a Pod (rule 6)."""
    return any(
        isinstance(endpoint, Mapping) and mapping(endpoint.get("targetRef")).get("kind") != "Pod"
        for endpoint in sequence(eps.get("endpoints"))
    )


class _NamedPorts(Mapping[tuple[str, str], Mapping[str, int]]):
    """Each non-ExternalName Service's ports by name (name → number), by (namespace, name), made when first read."""

    def __init__(self, services: Mapping[tuple[str, str], Obj]) -> None:
        self._services = services
        self._made: dict[tuple[str, str], Mapping[str, int] | None] = {}

    def __getitem__(self, key: tuple[str, str]) -> Mapping[str, int]:
        if key not in self._made:
            svc = self._services[key]
            spec = mapping(svc.get("spec"))
            self._made[key] = (
                None
                if spec.get("type") == "ExternalName"
                else {
                    str(p.get("name") or ""): number
                    for p in sequence(spec.get("ports"))
                    if isinstance(p, Mapping) and (number := port_number(p.get("port"))) is not None
                }
            )
        made = self._made[key]
        if made is None:
            raise KeyError(key)
        return made

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return (k for k in self._services if k in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _slice_workloads(
    eps: Obj,
    ports_by_service: Mapping[tuple[str, str], Mapping[str, int]],
    domain: str,
    cluster_id: str,
    trust_domain: str,
    network: str,
    skips: list[Skipped],
) -> Iterator[Workload]:
    meta = mapping(eps.get("metadata"))
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    owner = str(mapping(meta.get("labels")).get(SERVICE_NAME_LABEL) or "")
    service_ports = ports_by_service.get((namespace, owner))
    if not owner or not name or service_ports is None or eps.get("addressType") == "FQDN":
        return
    mappings: list[PortMapping] = []
    for port in sequence(eps.get("ports")):
        if not isinstance(port, Mapping) or str(port.get("protocol") or "TCP") != "TCP":
            continue
        number, port_name = port_number(port.get("port")), port.get("name")
        if number is None or port_name is None or str(port_name) not in service_ports:
            continue
        mappings.append(PortMapping(service_ports[str(port_name)], number))
    services = {service_key(namespace, hostname(owner, namespace, domain)): tuple(mappings)}
    seen: set[str] = set()
    for i, endpoint in enumerate(sequence(eps.get("endpoints"))):
        if not isinstance(endpoint, Mapping) or mapping(endpoint.get("targetRef")).get("kind") == "Pod":
            continue
        texts = [str(a) for a in sequence(endpoint.get("addresses"))]
        if not texts or texts[0] in seen:
            continue
        addresses: list[IPAddress] = []
        for text in texts:
            try:
                addresses.append(parse_ip(text))
            except AddressError:
                break
        if len(addresses) != len(texts):
            field = f"endpoints[{i}].addresses"
            skips.append(skipped(ENDPOINT_SLICE, eps, field, f"{texts!r} holds a non-IP address; left out"))
            continue
        seen.add(texts[0])
        ready = mapping(endpoint.get("conditions")).get("ready")
        yield Workload(
            uid=f"{cluster_id}/discovery.k8s.io/EndpointSlice/{namespace}/{name}/{texts[0]}",
            name=name,
            namespace=namespace,
            addresses=tuple(addresses),
            network=network,
            tunnel_protocol=TunnelProtocol.NONE,
            trust_domain=trust_domain,
            service_account="",
            workload_name=name,
            cluster_id=cluster_id,
            status=HealthStatus.UNHEALTHY if ready is False else HealthStatus.HEALTHY,
            services=services,
            network_mode=NetworkMode.HOST_NETWORK,
        )
