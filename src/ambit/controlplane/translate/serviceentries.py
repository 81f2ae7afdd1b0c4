"""A ServiceEntry becomes one Service per host, and its inline endpoints Workloads (spec §4.1).

Rules:

1. Each host of ``spec.hosts`` is a Service named after the entry, in its namespace, with that hostname (its
   resource name ``<namespace>/<host>``). An entry without hosts is left out. A wildcard host (``*.example.com``)
   is a Service when the entry has ``spec.addresses`` and endpoints (inline or selected), or resolves by
   ``DYNAMIC_DNS`` (its VIPs are then the addresses allocated to the wildcard, rule 2, and it has no endpoints:
   an egress waypoint bound to it resolves each name as it is asked, as in istiod: its WaypointConfig lists the
   Service in ``dynamic_dns``, :mod:`ambit.waypoint.dynamic_hosts`); the DNS proxy answers every name under it
   with the VIPs (spec §9). Another wildcard host is left out. A host whose
   key a Kubernetes Service or an earlier entry (by namespace, then name) already has is left out, so that every
   resource name has one owner.
2. VIPs are ``spec.addresses`` on the cluster's network; a CIDR range is a VIP with a prefix length (istiod's
   ``toNetworkAddressFromCidr``: host bits cleared, a full-length prefix is one address), and any address in it is
   the Service's (the node proxy and the waypoint look VIPs up by longest prefix). An entry without any takes, per
   host, the addresses the control plane allocated to it and keeps in its ``status.addresses``
   (:mod:`~ambit.controlplane.translate.autoallocate`), as istiod does.
3. Ports are ``spec.ports``: ``number`` to ``targetPort``, 0 when unset (each endpoint says its own number); the
   port's ``protocol`` gives its ``app_protocol`` (:mod:`ambit.model.port_protocols`).
   A repeated or invalid number is left out.
4. With ``spec.workloadSelector``, the entry selects pods and WorkloadEntries of its namespace
   (:mod:`ambit.controlplane.translate.index`) and its ``spec.endpoints`` are ignored (reported).
5. Without one, each of ``spec.endpoints`` is a Workload with uid
   ``<cluster>/networking.istio.io/ServiceEntry/<namespace>/<name>/<address>``, named after the entry, serving
   every host of it; its ``ports`` map overrides target ports by port name, as a WorkloadEntry's does. An endpoint
   whose address is not an IP (a Unix socket; a hostname unless the entry resolves by DNS, rule 6) or repeats an
   earlier one is left out. Policies select an endpoint by its own labels in the entry's namespace, as they
   select a pod. Its ``weight`` is its capacity, as a WorkloadEntry's.
6. A ``DNS`` or ``DNS_ROUND_ROBIN`` entry's endpoint whose address is a host name is a Workload with that
   ``hostname`` and no address (the node proxy resolves it when it picks it). Without endpoints or selector, each
   host (never a wildcard) is its own endpoint, as in istiod: a Workload with uid ``.../<name>/<host>``, hostname
   the host, serving only that host's Service.
7. One Service per hostname is ``canonical`` (istiod's ``selectWorkloadServices``): a Kubernetes Service when one
   has that hostname, else the Service of the oldest public entry with the host (``creationTimestamp``, then
   namespace and name) (:func:`canonical_owners`); a namespace-visible entry is never canonical.
8. ``spec.exportTo`` and the mesh config's ``serviceEntryVisibility`` for the entry's namespace labels give each
   Service's visibility (:mod:`ambit.controlplane.translate.visibility`); an entry the mesh config makes ``NONE``
   is left out (reported), before its hosts are taken.
9. ``resolution: NONE`` (the default) makes each Service's load balancing ``PASSTHROUGH`` with health policy
   ``ALLOW_ALL``, as istiod's ``services.go`` does: a connection to its VIP that finds no endpoint goes to the
   address it was sent to (the node proxy's rule 4, the waypoint's original destination). Any other resolution
   takes the traffic distribution of the entry's or its namespace's ``networking.istio.io/traffic-distribution``
   annotation (:mod:`ambit.controlplane.translate.traffic_distribution`; a value not known there is reported).

Everything left out is reported as :class:`Skipped` naming the field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ambit.controlplane.translate.autoallocate import auto_vips
from ambit.controlplane.translate.index import (
    Selection,
    ServicePort,
    entry_port_resolver,
    resolve_ports,
)
from ambit.controlplane.translate.meshconfig import DEFAULT_MESH_CONFIG, MeshConfig
from ambit.controlplane.translate.nodes import split_locality
from ambit.controlplane.translate.services import port_number, service_key
from ambit.controlplane.translate.skips import SERVICE_ENTRY, Skipped, skipped
from ambit.controlplane.translate.traffic_distribution import (
    ANNOTATION_FIELD,
    LoadBalancing,
    entry_load_balancing,
)
from ambit.controlplane.translate.visibility import entry_visibility, export_visibility
from ambit.controlplane.translate.workloadentries import (
    endpoint_address,
    endpoint_capacity,
    endpoint_workload,
    string_map,
)
from ambit.model.dnsname import check_dns_name, is_ip
from ambit.model.port_protocols import protocol_app_protocol
from ambit.model.workload import (
    AddressError,
    GatewayAddress,
    IPAddress,
    NetworkAddress,
    PortMapping,
    Service,
    Visibility,
    Workload,
    parse_ip,
)

Obj = Mapping[str, Any]
DNS_RESOLUTIONS = ("DNS", "DNS_ROUND_ROBIN")


@dataclass(frozen=True, slots=True)
class ServiceEntrySpec:
    """The usable parts of one ServiceEntry, checked once (problems already reported)."""

    obj: Obj
    name: str
    namespace: str
    hosts: tuple[str, ...]
    vips: tuple[tuple[IPAddress, int | None], ...] = ()
    """(address, prefix length or None for one address) of each of ``spec.addresses``."""
    ports: tuple[ServicePort, ...] = ()
    selector: Mapping[str, str] | None = None
    endpoints: tuple[tuple[int, Obj], ...] = ()
    """(index in ``spec.endpoints``, endpoint) of the endpoints to translate."""
    subject_alt_names: tuple[str, ...] = field(default=())
    auto_vips: Mapping[str, tuple[IPAddress, ...]] = field(default_factory=dict)
    """Host → the addresses allocated to it (rule 2), used when ``vips`` is empty."""
    resolution: str = "NONE"
    visibility: Visibility = Visibility.PUBLIC
    visibility_configured: bool = False
    """Whether the mesh config's ``serviceEntryVisibility`` is set (the ``VisibilityApplied`` condition is due)."""
    load_balancing: LoadBalancing | None = None
    """Rule 9's load balancing; None: by ``resolution`` alone, without annotations."""


def parse_service_entries(
    entries: Iterable[Obj],
    *,
    taken: set[str],
    skips: list[Skipped],
    mesh: MeshConfig = DEFAULT_MESH_CONFIG,
    namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
    namespace_annotations: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[ServiceEntrySpec]:
    """The entries that have something to translate, in (namespace, name) order; ``taken`` gains their keys.
    ``namespace_labels`` (namespace → its labels) is what ``mesh``'s ``serviceEntryVisibility`` selects on;
    ``namespace_annotations`` (namespace → its annotations) gives a namespace's traffic distribution (rule 9)."""
    out: list[ServiceEntrySpec] = []
    labels_of = namespace_labels or {}
    annotations_of = namespace_annotations or {}
    for obj in sorted(entries, key=_order):
        spec = _parse(obj, taken, skips, mesh, labels_of, annotations_of)
        if spec is not None:
            out.append(spec)
    return out


def _order(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _parse(
    obj: Obj,
    taken: set[str],
    skips: list[Skipped],
    mesh: MeshConfig,
    labels_of: Mapping[str, Mapping[str, str]],
    annotations_of: Mapping[str, Mapping[str, Any]],
) -> ServiceEntrySpec | None:
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "")
    if not name or not namespace:
        return None
    export = export_visibility(
        SERVICE_ENTRY, obj, "spec.exportTo", spec.get("exportTo"), skips, default=mesh.default_service_export_to
    )
    visibility = entry_visibility(export, mesh.entry_visibility(labels_of.get(namespace) or {}))
    if visibility is None:
        reason = (
            f"the mesh config's serviceEntryVisibility makes entries of namespace {namespace} visible to no one "
            "(NONE); the entry is left out"
        )
        skips.append(skipped(SERVICE_ENTRY, obj, "metadata.namespace", reason))
        return None
    raw_hosts = spec.get("hosts") or []
    if not isinstance(raw_hosts, list) or not raw_hosts:
        skips.append(skipped(SERVICE_ENTRY, obj, "spec.hosts", "required: at least one host; the entry is left out"))
        return None
    hosts: list[str] = []
    selected = isinstance((spec.get("workloadSelector") or {}).get("labels"), Mapping)
    for i, host in enumerate(raw_hosts):
        where = f"spec.hosts[{i}]"
        text = str(host or "")
        if not text or any(c.isspace() or c == "/" for c in text):
            skips.append(skipped(SERVICE_ENTRY, obj, where, f"{text!r} is not a host name; the host is left out"))
        elif (
            text.startswith("*")
            and not (spec.get("addresses") and (spec.get("endpoints") or selected))
            and str(spec.get("resolution") or "").upper() != "DYNAMIC_DNS"
        ):
            reason = (
                "a wildcard host needs addresses and endpoints, or resolution DYNAMIC_DNS and an egress waypoint; "
                "the host is left out"
            )
            skips.append(skipped(SERVICE_ENTRY, obj, where, reason))
        elif service_key(namespace, text) in taken:
            reason = f"another Service or ServiceEntry of namespace {namespace} has host {text}; the host is left out"
            skips.append(skipped(SERVICE_ENTRY, obj, where, reason))
        else:
            taken.add(service_key(namespace, text))
            hosts.append(text)
    if not hosts:
        return None
    labels = (spec.get("workloadSelector") or {}).get("labels")
    selector = string_map(labels) if isinstance(labels, Mapping) else None
    endpoints = tuple(enumerate(spec.get("endpoints") or ()))
    if selector is not None and endpoints:
        reason = "ignored because spec.workloadSelector is set (use one or the other)"
        skips.append(skipped(SERVICE_ENTRY, obj, "spec.endpoints", reason))
        endpoints = ()
    resolution = str(spec.get("resolution") or "NONE")
    annotations = meta.get("annotations")
    balancing = entry_load_balancing(
        resolution, annotations if isinstance(annotations, Mapping) else {}, annotations_of.get(namespace) or {}
    )
    if balancing.problem:
        skips.append(skipped(SERVICE_ENTRY, obj, ANNOTATION_FIELD, balancing.problem))
    return ServiceEntrySpec(
        obj=obj,
        name=name,
        namespace=namespace,
        hosts=tuple(hosts),
        vips=_vips(obj, spec.get("addresses") or (), skips),
        ports=_ports(obj, spec.get("ports") or (), skips),
        selector=selector,
        endpoints=endpoints,
        subject_alt_names=tuple(str(s) for s in spec.get("subjectAltNames") or ()),
        auto_vips=auto_vips(obj),
        resolution=resolution,
        visibility=visibility,
        visibility_configured=mesh.service_entry_visibility is not None,
        load_balancing=balancing,
    )


def _vips(obj: Obj, raw: Iterable[Any], skips: list[Skipped]) -> tuple[tuple[IPAddress, int | None], ...]:
    out: list[tuple[IPAddress, int | None]] = []
    for i, value in enumerate(raw):
        text = str(value)
        try:
            address = NetworkAddress.of_cidr("", text)
        except AddressError as exc:
            skips.append(skipped(SERVICE_ENTRY, obj, f"spec.addresses[{i}]", f"{exc}; the VIP is left out"))
            continue
        if (address.ip, address.length) not in out:
            out.append((address.ip, address.length))
    return tuple(out)


def _ports(obj: Obj, raw: Iterable[Any], skips: list[Skipped]) -> tuple[ServicePort, ...]:
    out: dict[int, ServicePort] = {}
    for i, item in enumerate(raw):
        port: Obj = item if isinstance(item, Mapping) else {}
        number = port_number(port.get("number"))
        if number is None or number in out:
            problem = "not a port number" if number is None else f"port {number} is given twice"
            skips.append(skipped(SERVICE_ENTRY, obj, f"spec.ports[{i}].number", f"{problem}; the port is left out"))
            continue
        target = port_number(port.get("targetPort")) or 0
        out[number] = ServicePort(number, target, str(port.get("name") or ""), str(port.get("protocol") or "TCP"))
    return tuple(out.values())


def selections(entries: Iterable[ServiceEntrySpec]) -> list[tuple[str, Selection]]:
    """(namespace, selection) for every host of every entry with a workload selector (rule 4)."""
    out: list[tuple[str, Selection]] = []
    for entry in entries:
        if entry.selector is None:
            continue
        ports = tuple(ServicePort(p.number, p.target or p.number, p.name, p.protocol) for p in entry.ports)
        for host in entry.hosts:
            out.append((entry.namespace, Selection(service_key(entry.namespace, host), entry.selector, ports)))
    return out


def canonical_owners(
    entries: Iterable[ServiceEntrySpec], kubernetes_hosts: Iterable[str]
) -> dict[str, tuple[str, str]]:
    """Hostname → (namespace, name) of the entry whose Service for that host is canonical (rule 7)."""
    taken = set(kubernetes_hosts)
    owners: dict[str, tuple[str, str]] = {}
    for entry in sorted(entries, key=lambda e: (_created(e.obj), e.namespace, e.name)):
        if entry.visibility is not Visibility.PUBLIC:
            continue
        for host in entry.hosts:
            if host not in taken:
                owners.setdefault(host, (entry.namespace, entry.name))
    return owners


def _created(obj: Obj) -> str:
    # RFC 3339 timestamps in UTC ("2024-05-01T10:00:00Z") sort as text; a missing one sorts first.
    return str((obj.get("metadata") or {}).get("creationTimestamp") or "")


def service_entry_services(
    entry: ServiceEntrySpec, *, network: str, canonical: Mapping[str, tuple[str, str]] | None = None
) -> list[Service]:
    """One Service per host (rules 1 to 3, 9, and 7 given :func:`canonical_owners`)."""
    balancing = entry.load_balancing or entry_load_balancing(entry.resolution, {}, {})
    ports = tuple(
        PortMapping(p.number, p.target if isinstance(p.target, int) else 0, protocol_app_protocol(p.protocol))
        for p in entry.ports
    )
    return [
        Service(
            name=entry.name,
            namespace=entry.namespace,
            hostname=host,
            vips=tuple(NetworkAddress(network, ip, length) for ip, length in entry.vips)
            or tuple(NetworkAddress(network, ip) for ip in entry.auto_vips.get(host, ())),
            ports=ports,
            subject_alt_names=entry.subject_alt_names,
            canonical=canonical is not None and canonical.get(host) == (entry.namespace, entry.name),
            visibility=entry.visibility,
            load_balancing_mode=balancing.mode,
            routing_preference=balancing.routing_preference,
            health_policy=balancing.health_policy,
        )
        for host in entry.hosts
    ]


def service_entry_workloads(
    entry: ServiceEntrySpec,
    *,
    cluster_id: str,
    trust_domain: str,
    network: str,
    skips: list[Skipped],
    policy_keys: Callable[[str, Mapping[str, Any]], tuple[str, ...]] | None = None,
    waypoint_of: Callable[[str, Mapping[str, str]], GatewayAddress | None] | None = None,
) -> list[tuple[Workload, Mapping[str, str]]]:
    """One Workload per usable inline endpoint (rule 5), or per host of a DNS entry without any (rule 6), each with
    the endpoint's ``labels`` (what DestinationRule subsets select); ``policy_keys`` names the policies that
    select an endpoint's labels in its namespace, as istiod lists them for every workload it builds, and
    ``waypoint_of`` the waypoint its labels bind it to."""
    out: list[tuple[Workload, Mapping[str, str]]] = []
    seen: set[IPAddress | str] = set()
    ports = tuple(ServicePort(p.number, p.target or p.number, p.name, p.protocol) for p in entry.ports)
    dns = entry.resolution in DNS_RESOLUTIONS
    for index, item, hosts in _endpoints(entry):
        endpoint: Obj = item if isinstance(item, Mapping) else {}
        where = f"spec.endpoints[{index}]"
        raw = str(endpoint.get("address") or "")
        hostname = raw if dns and _is_hostname(raw) else ""
        # An address with a zone id is neither: parse_ip refuses it (mesh addresses are global).
        if dns and not hostname and raw and not (is_ip(raw) and "%" not in raw) and not raw.startswith("unix://"):
            reason = f"{raw!r} is neither an IP address nor a host name; the endpoint is left out"
            skips.append(skipped(SERVICE_ENTRY, entry.obj, f"{where}.address", reason))
            continue
        address: IPAddress | str | None = hostname or endpoint_address(
            SERVICE_ENTRY, entry.obj, f"{where}.address", endpoint.get("address"), skips, what="the endpoint"
        )
        if address is None:
            continue
        if address in seen:
            reason = f"{address} is given twice; the endpoint is left out"
            skips.append(skipped(SERVICE_ENTRY, entry.obj, f"{where}.address", reason))
            continue
        seen.add(address)
        endpoint_ports = endpoint.get("ports")
        resolve = entry_port_resolver(endpoint_ports if isinstance(endpoint_ports, Mapping) else None)
        mappings = resolve_ports(ports, resolve)
        labels = string_map(endpoint.get("labels"))
        workload = endpoint_workload(
            uid=f"{cluster_id}/networking.istio.io/ServiceEntry/{entry.namespace}/{entry.name}/{address}",
            name=entry.name,
            namespace=entry.namespace,
            address=None if hostname else parse_ip(str(address)),
            hostname=hostname,
            labels=labels,
            annotations={},
            network=str(endpoint.get("network") or network),
            service_account=str(endpoint.get("serviceAccount") or ""),
            workload_name=entry.name,
            healthy=True,
            trust_domain=trust_domain,
            cluster_id=cluster_id,
            services={service_key(entry.namespace, host): mappings for host in hosts},
            locality=split_locality(endpoint.get("locality")),
            capacity=endpoint_capacity(SERVICE_ENTRY, entry.obj, f"{where}.weight", endpoint.get("weight"), skips),
        )
        if policy_keys is not None:
            workload = replace(workload, authorization_policies=policy_keys(entry.namespace, labels))
        if waypoint_of is not None:
            workload = replace(workload, waypoint=waypoint_of(entry.namespace, labels))
        out.append((workload, labels))
    return out


def _endpoints(entry: ServiceEntrySpec) -> list[tuple[int, Obj, tuple[str, ...]]]:
    """(index, endpoint, hosts it serves): the inline endpoints, or for a DNS entry without endpoints or selector
    one endpoint per host, serving that host alone (rule 6)."""
    if entry.endpoints or entry.selector is not None or entry.resolution not in DNS_RESOLUTIONS:
        return [(index, item, entry.hosts) for index, item in entry.endpoints]
    return [(-1, {"address": host}, (host,)) for host in entry.hosts if not host.startswith("*")]


def _is_hostname(text: str) -> bool:
    """A DNS name that is not an IP address (an IPv4 address passes the name check too)."""
    return not is_ip(text) and not check_dns_name(text)
