"""An ingress Gateway's ``spec.addresses`` (class ``istio``) as istiod reads them: whether the Gateway is deployed,
which Services it is bound to, and what its status says of them (Gateway API's static addresses). Pure: Services
and their EndpointSlices come through a :class:`ServiceLookup`.

Theory of operation: a Gateway that names its addresses by hostname is a "manual deployment": the proxies behind
the named Services are its gateway, so nothing is deployed for it
(:func:`~ambit.controlplane.translate.manual_gateways.is_managed`). Its status is judged from those Services:
:func:`~ambit.controlplane.translate.manual_gateways.requested_services` reads the addresses, :func:`resolve` looks
at each Service on each listener port, and :func:`bound_programmed` and :func:`reported_addresses` turn that into
the ``Programmed`` condition and ``status.addresses``, with istiod's reasons and messages.

Rules:

1. Managed or manual (:mod:`ambit.controlplane.translate.manual_gateways` rule 1): a manual deployment is not
   deployed.
2. Requested services (:mod:`ambit.controlplane.translate.manual_gateways` rule 2): an ignored address makes
   ``Accepted`` False/``UnsupportedAddress`` "only Hostname is supported, ignoring [<values>]" (Go's way of
   printing a list); with no Hostname left, ``Programmed`` is False/``UnsupportedAddress`` "Failed to assign to
   any requested addresses" and nothing else is judged (no listener status is written, as istiod returns early).
3. Resolution (istiod's ``ResolveGatewayInstances``), per requested hostname: one that is not a Service of the
   Gateway's namespace warns 'hostname "<h>" not found' (or '... not found in namespace "<ns>", but it was found
   in namespace(s) "<other>"' when it names a Service of another namespace) and is unusable. Then per listener
   port P: a Service port P with endpoints makes ``<h>:P`` an internal address (and, of a ``LoadBalancer``
   Service, its load-balancer ingress, and of any its ``externalIPs``, external ones; a ``LoadBalancer`` Service
   without them warns 'address pending for hostname "<h>"', once, still usable); a Service with no endpoints at
   all warns 'no instances found for hostname "<h>"' (usable: the pods may come); endpoints whose target port is
   P hint at the Service ports that lead there ('port P not found for hostname "<h>" (hint: the service port
   should be specified, not the workload port. Did you mean one of these ports: [80]?)', unusable); otherwise
   'port P not found for hostname "<h>"', unusable, unless the Service is one a Gateway controller manages and
   has port P (its endpoints are late).
   Warnings are sorted; addresses are sorted and distinct. Endpoints count whether ready or not, as istiod's
   index holds them all.
4. ``Programmed`` (istiod's ``SetProgrammedCondition``): True/``Programmed`` "Resource programmed, assigned to
   service(s) <internal>" ("Resource programmed" alone without internal addresses); with warnings, False with
   'Assigned to service(s) <internal>, but failed to assign to all requested addresses: <warnings joined by
   "; ">' (or 'Failed to assign to any requested addresses: <warnings>' without internal addresses), reason
   ``AddressNotUsable`` when some hostname or port is unusable, else ``AddressNotAssigned``. Internal addresses
   are joined as English lists ("a and b", "a, b, and c"). Messages are cut to ``MESSAGE_MAX`` characters (a
   Gateway may name many Services).
5. ``status.addresses``: the external addresses; without any, those of the class's address type, ``Hostname``
   for class ``istio`` (the hostnames of the internal addresses whose address is not pending) unless the
   Gateway's ``networking.istio.io/address-type`` annotation asks for ``IPAddress`` (the Services' cluster IPs)
   or for both (an empty value). Each is typed ``IPAddress`` when it parses as one, else ``Hostname``. With
   nothing to report, the addresses the status has are kept (istiod never removes an address once reported).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ambit.controlplane.gateway.status import MESSAGE_MAX, cluster_ips, condition
from ambit.controlplane.translate.manual_gateways import HOSTNAME, IP_ADDRESS, Requested, service_key
from ambit.model.dnsname import is_ip

__all__ = [
    "ADDRESS_TYPE_ANNOTATION",
    "NO_SERVICES",
    "SERVICE_NAME_LABEL",
    "Bound",
    "Resolution",
    "ServiceLookup",
    "bind",
    "bound_programmed",
    "english_join",
    "load_balancer_addresses",
    "reported_addresses",
    "resolve",
]

Obj = Mapping[str, Any]

ADDRESS_TYPE_ANNOTATION = "networking.istio.io/address-type"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_LABEL = "gateway.istio.io/managed"


class ServiceLookup(Protocol):
    """The cluster's Services and EndpointSlices, as last seen."""

    def find_service(self, namespace: str, name: str) -> Obj | None: ...

    def endpoint_slices(self, namespace: str, service: str) -> Sequence[Obj]: ...


class _NoServices:
    def find_service(self, namespace: str, name: str) -> Obj | None:
        return None

    def endpoint_slices(self, namespace: str, service: str) -> Sequence[Obj]:
        return ()


NO_SERVICES: ServiceLookup = _NoServices()
"""A lookup that finds nothing (every requested hostname is "not found")."""


@dataclass(frozen=True, slots=True)
class Resolution:
    """Rule 3: what the requested Services give."""

    internal: tuple[str, ...] = ()
    """``<hostname>:<port>`` for each Service and listener port with endpoints."""
    internal_ips: tuple[str, ...] = ()
    external: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()
    """Hostnames of ``LoadBalancer`` Services still without an external address."""
    warnings: tuple[str, ...] = ()
    all_usable: bool = True


@dataclass(frozen=True, slots=True)
class Bound:
    """A manual deployment's requested Services and what they gave."""

    requested: Requested
    resolution: Resolution


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _service_ports(service: Obj) -> list[tuple[str, int]]:
    """(name, port) of each of the Service's ports (the name "" when left out)."""
    spec = service.get("spec")
    ports = spec.get("ports") if isinstance(spec, Mapping) else None
    out: list[tuple[str, int]] = []
    for item in ports if isinstance(ports, list) else ():
        if isinstance(item, Mapping) and (port := _int(item.get("port"))) is not None:
            name = item.get("name")
            out.append((name if isinstance(name, str) else "", port))
    return out


def _endpoint_ports(slices: Iterable[Obj]) -> dict[str, set[int]]:
    """Port name → the target ports it has endpoints on, over the slices that hold at least one endpoint."""
    out: dict[str, set[int]] = {}
    for item in slices:
        endpoints = item.get("endpoints")
        if not isinstance(endpoints, list) or not any(
            isinstance(e, Mapping) and isinstance(e.get("addresses"), list) and e["addresses"] for e in endpoints
        ):
            continue
        ports = item.get("ports")
        for port in ports if isinstance(ports, list) else ():
            if isinstance(port, Mapping) and (number := _int(port.get("port"))) is not None:
                name = port.get("name")
                out.setdefault(name if isinstance(name, str) else "", set()).add(number)
    return out


def load_balancer_addresses(service: Obj | None) -> tuple[dict[str, str], ...]:
    """The addresses a Service's ``status.loadBalancer.ingress`` gives."""
    status = (service or {}).get("status")
    lb = status.get("loadBalancer") if isinstance(status, Mapping) else None
    ingress = lb.get("ingress") if isinstance(lb, Mapping) else None
    out: list[dict[str, str]] = []
    for item in ingress if isinstance(ingress, list) else ():
        if not isinstance(item, Mapping):
            continue
        if isinstance(item.get("ip"), str) and item["ip"]:
            out.append({"type": "IPAddress", "value": item["ip"]})
        elif isinstance(item.get("hostname"), str) and item["hostname"]:
            out.append({"type": "Hostname", "value": item["hostname"]})
    return tuple(out)


def _external(service: Obj) -> list[str]:
    """A load balancer's addresses (of a ``LoadBalancer`` Service only), then ``externalIPs`` (of any), as istiod's
    Service conversion gathers them."""
    spec = service.get("spec")
    external_ips = spec.get("externalIPs") if isinstance(spec, Mapping) else None
    balanced = isinstance(spec, Mapping) and spec.get("type") == "LoadBalancer"
    out = [a["value"] for a in load_balancer_addresses(service)] if balanced else []
    out += [ip for ip in external_ips if isinstance(ip, str) and ip] if isinstance(external_ips, list) else []
    return out


def resolve(
    namespace: str, hostnames: Sequence[str], ports: Iterable[int], lookup: ServiceLookup, domain: str
) -> Resolution:
    """Rule 3: ``hostnames`` as requested by a Gateway of ``namespace`` with listeners on ``ports``."""
    wanted_ports = sorted(set(ports))
    internal: set[str] = set()
    internal_ips: set[str] = set()
    external: set[str] = set()
    pending: list[str] = []
    warnings: list[str] = []
    unusable = False
    for host in hostnames:
        key = service_key(host, domain)
        service = lookup.find_service(namespace, key[1]) if key is not None and key[0] == namespace else None
        if service is None:
            elsewhere = lookup.find_service(*key) if key is not None and key[0] != namespace else None
            if elsewhere is not None and key is not None:
                warnings.append(
                    f'hostname "{host}" not found in namespace "{namespace}", but it was found in namespace(s) '
                    f'"{key[0]}"'
                )
            else:
                warnings.append(f'hostname "{host}" not found')
            unusable = True
            continue
        assert key is not None
        service_ports = _service_ports(service)
        by_name = _endpoint_ports(lookup.endpoint_slices(namespace, key[1]))
        with_endpoints = {port for name, port in service_ports if by_name.get(name)}
        spec = service.get("spec")
        kind = spec.get("type") if isinstance(spec, Mapping) else None
        for port in wanted_ports:
            if port in with_endpoints:
                internal.add(f"{host}:{port}")
                internal_ips.update(cluster_ips(service))
                if found := _external(service):
                    external.update(found)
                elif kind == "LoadBalancer" and host not in pending:
                    warnings.append(f'address pending for hostname "{host}"')
                    pending.append(host)
            elif not with_endpoints:
                warnings.append(f'no instances found for hostname "{host}"')
            elif hints := sorted({str(p) for name, p in service_ports if port in by_name.get(name, ())}):
                warnings.append(
                    f'port {port} not found for hostname "{host}" (hint: the service port should be specified, not '
                    f"the workload port. Did you mean one of these ports: [{' '.join(hints)}]?)"
                )
                unusable = True
            else:
                labels = (service.get("metadata") or {}).get("labels")
                managed = isinstance(labels, Mapping) and MANAGED_LABEL in labels
                if not managed or port not in {p for _, p in service_ports}:
                    warnings.append(f'port {port} not found for hostname "{host}"')
                    unusable = True
    return Resolution(
        internal=tuple(sorted(internal)),
        internal_ips=tuple(sorted(internal_ips)),
        external=tuple(sorted(external)),
        pending=tuple(sorted(pending)),
        warnings=tuple(sorted(warnings)),
        all_usable=not unusable,
    )


def bind(requested: Requested, ports: Iterable[int], lookup: ServiceLookup, domain: str) -> Bound:
    """``requested`` resolved (rule 3) on ``ports``."""
    return Bound(requested, resolve(requested.namespace, requested.services, ports, lookup, domain))


def english_join(items: Sequence[str]) -> str:
    """Rule 4's list: "a", "a and b", "a, b, and c"."""
    if len(items) <= 2:
        return " and ".join(items)
    return ", ".join(items[:-1]) + ", and " + items[-1]


def bound_programmed(bound: Bound, generation: Any) -> dict[str, Any]:
    """Rule 4 (and rule 2's ``Programmed`` when no Hostname is left)."""
    resolution = bound.resolution
    if not bound.requested.services:
        return condition(
            "Programmed", False, "UnsupportedAddress", "Failed to assign to any requested addresses", generation
        )
    internal = english_join(resolution.internal)
    if resolution.warnings:
        problems = "; ".join(resolution.warnings)
        message = (
            f"Assigned to service(s) {internal}, but failed to assign to all requested addresses: {problems}"
            if resolution.internal
            else f"Failed to assign to any requested addresses: {problems}"
        )
        reason = "AddressNotAssigned" if resolution.all_usable else "AddressNotUsable"
        return condition("Programmed", False, reason, message[:MESSAGE_MAX], generation)
    message = f"Resource programmed, assigned to service(s) {internal}" if internal else "Resource programmed"
    return condition("Programmed", True, "Programmed", message[:MESSAGE_MAX], generation)


def _typed(value: str) -> dict[str, str]:
    return {"type": IP_ADDRESS if is_ip(value) else HOSTNAME, "value": value}


def reported_addresses(gateway: Obj, resolution: Resolution) -> list[dict[str, str]] | None:
    """Rule 5: the addresses to report; None when there are none (the current ones stay)."""
    report = list(resolution.external)
    if not report:
        annotations = (gateway.get("metadata") or {}).get("annotations")
        wanted = HOSTNAME
        if isinstance(annotations, Mapping) and isinstance(annotations.get(ADDRESS_TYPE_ANNOTATION), str):
            wanted = annotations[ADDRESS_TYPE_ANNOTATION]
        if wanted != HOSTNAME:
            report = list(resolution.internal_ips)
        if wanted != IP_ADDRESS:
            for hostport in resolution.internal:
                host = hostport.rpartition(":")[0]
                if host not in resolution.pending and host not in report:
                    report.append(host)
    return [_typed(value) for value in report] or None
