"""Service VIPs to endpoints with nftables: kube-proxy's job inside one lab node (pure rendering; no I/O).

Input: the cluster's Services (core/v1) and EndpointSlices (discovery.k8s.io/v1) as plain dicts. Output: one
nftables script for the table ``ip ambit-lab-services`` (``family=4``, the default) or ``ip6 ambit-lab-services``
(``family=6``, a dual-stack lab's second table) that the node applies with ``nft -f`` (see
:mod:`ambit.lab.network.services_apply`). Each table serves its family only: a Service's cluster IP of that family
(from ``spec.clusterIPs``; a Service with none is not in the table), and the EndpointSlices of that
``addressType`` (kube makes one set of slices per family of the Service). The script starts with ``add table`` +
``delete table`` and then declares the whole table again, so one ``nft -f`` replaces the previous rules in a
single transaction.

What the table does, in packet order:

1. ``nat-prerouting`` (pods on ``cni0``, other nodes) and ``nat-output`` (the node's own processes) look up
   ``daddr . l4proto . dport`` in the map ``service-ips`` and go to the Service port's chain, which picks one
   ready endpoint with ``numgen random mod N`` and goes to that endpoint's chain: ``dnat to ip:port``. NAT chains
   see only the first packet of a connection, so the choice is made once per connection. The node's own
   connections are routed before the output hook sees them: the node needs a route covering the Service range
   (on ``cni0``, or on ``eth0`` when the Service range is given so that nothing to it can leave), or they fail
   with ENETUNREACH.
2. ``filter-prerouting`` (after DNAT, before routing) and ``filter-output`` (after the output DNAT) catch a new
   connection still addressed to a VIP, i.e. not translated, and reject it so that clients fail at once instead
   of timing out: a Service port without ready endpoints (map ``no-endpoint-services``) with a TCP reset, or
   ICMP port-unreachable for UDP; any other port of a known cluster IP (and, given the Service range, any other
   address in it) with ICMP port-unreachable. Not
   host-unreachable for UDP: Linux treats it as a soft error that a UDP socket never reports, so the client
   would wait for its timeout. Not in forward either: a pod's packet to a VIP routed back out of ``cni0`` makes
   the node send the pod an ICMP redirect, which resets the kernel's per-host ICMP rate limit and suppresses
   the reject that follows. (Reject in prerouting needs a kernel that allows it, as kube-proxy's nftables mode
   does.)
3. ``nat-postrouting``: without br_netfilter, a connection DNATed from this node's pod range to this node's pod
   range is SNATed to the node's ``cni0`` address: its reply would otherwise go from pod to pod across the bridge
   and never be un-DNATed. With br_netfilter (``bridge_netfilter``: the node's bridge hands its frames to
   netfilter, as Kubernetes nodes require) the reply is un-DNATed on the bridge, so only a pod reaching itself
   through a Service is SNATed (its reply never leaves the pod), as kube-proxy does: the endpoint's chain marks a
   connection from the endpoint's own address (``HAIRPIN_MARK``) and postrouting SNATs what is marked. Every other
   pod keeps its own address, which the server sees (Istio's TestServices checks the original source IP). A
   connection DNATed from a load-balancer address is masqueraded (to the
   node's address towards the endpoint), as kube-proxy does for external traffic: the endpoint may be on another
   node, whose reply would otherwise go straight to the client with the pod's address. Nothing else is NATed:
   the lab never masquerades towards an uplink.

LoadBalancer Services: the addresses in ``status.loadBalancer.ingress[].ip`` (assigned by the lab's load-balancer
controller, :mod:`ambit.lab.controllers.loadbalancer`) are proxied like the cluster IP, port for port, when they lie
in the node's ``load_balancer_cidr``; any other address is left out with a reason (whoever may write a Service's
status must not be able to capture traffic to an arbitrary address, such as the API server's). Other ports of a
load-balancer address are rejected like those of a cluster IP.

Invariants: only validated tokens reach the script (DNS-label names, IP addresses of the table's family, port
numbers), so no object
can inject nft syntax, and chain names (``service-<ns>/<name>/<proto>/<port>``,
``endpoint-<ns>/<name>/<proto>/<port>__<ip>/<port>``, an IPv6 address written in full with ``.`` for ``:``)
cannot collide since ``/`` is in no label. Every map key is
unique: a later Service claiming a taken ``ip . proto . port`` is skipped, because one duplicate element would
fail the whole transaction. Output is sorted, so the same objects always give the same text. Malformed or
unsupported objects (or ports, or endpoints) are left out with a reason, never raised; headless and ExternalName
Services are valid and simply not proxied, so they give no reason.

nft pitfalls (nftables 1.0.6): ``priority dstnat`` is refused for the ``output`` hook (written ``-100``); a rule
followed by ``}`` on the same line needs a ``;``; an empty set or map must leave out ``elements``; ``nft -c``
does not run the kernel's hook checks (a ``reject`` in postrouting passes it and fails to load).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

TABLE = "ambit-lab-services"
FAMILY = "ip"
FAMILY6 = "ip6"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"

_PROXIED_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
_PROTOCOLS = {"TCP": "tcp", "UDP": "udp"}
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class _Family:
    """How one IP version is written: table family and match keyword, set element type, slice address type."""

    version: int
    keyword: str
    addr_type: str
    address_type: str
    udp_reject: str


_FAMILIES = {
    4: _Family(4, FAMILY, "ipv4_addr", "IPv4", "reject with icmp type port-unreachable"),
    6: _Family(6, FAMILY6, "ipv6_addr", "IPv6", "reject with icmpv6 type port-unreachable"),
}

_BackendKey = tuple[str, str, str, str]
"""A Service port's backends: (namespace, Service name, port name, protocol)."""


@dataclass(frozen=True, slots=True)
class RenderedRules:
    """The script for one node, and what was left out of it."""

    script: str
    skipped: list[str]
    """One line per object, port or endpoint left out, with the reason."""
    services: int
    """Services with at least one port in the script."""
    endpoints: int
    """Endpoint chains in the script (one per ready endpoint per Service port)."""


class _Malformed(Exception):
    """The object (or part) being read is unusable; the message is the reason. Never leaves this module."""


@dataclass(frozen=True, slots=True, order=True)
class _Endpoint:
    ip: IPAddress
    port: int


@dataclass(frozen=True, slots=True)
class _ServicePort:
    name: str
    protocol: str  # "tcp" | "udp"
    port: int


@dataclass(frozen=True, slots=True)
class _Service:
    namespace: str
    name: str
    cluster_ip: IPAddress
    ports: tuple[_ServicePort, ...]
    load_balancer_ips: tuple[IPAddress, ...] = ()


@dataclass(frozen=True, slots=True)
class _Node:
    pod_cidr: IPNetwork
    gateway: IPAddress
    service_cidr: IPNetwork | None
    load_balancer_cidr: IPNetwork | None = None
    bridge_netfilter: bool = False
    family: _Family = _FAMILIES[4]


HAIRPIN_MARK = 0x4000
"""The packet mark of a connection from an endpoint to itself through a Service (kube-proxy's masquerade bit)."""


def render_service_rules(
    services: Iterable[object],
    slices: Iterable[object],
    *,
    node_pod_cidr: str,
    node_gateway: str,
    service_cidr: str | None = None,
    load_balancer_cidr: str | None = None,
    bridge_netfilter: bool = False,
    family: int = 4,
) -> RenderedRules:
    """Render the node's table from the cluster's Services and EndpointSlices.

    ``node_pod_cidr`` and ``node_gateway`` are the node's pod range and its ``cni0`` address. With
    ``service_cidr``, new connections to any other address of the Service range are rejected too (ICMP
    port-unreachable), so that nothing addressed to the range leaves the node whatever its routes. With
    ``load_balancer_cidr``, LoadBalancer Services' addresses in that range are proxied too. ``bridge_netfilter``:
    the node's bridge passes its frames through netfilter (br_netfilter), so only a pod reaching itself needs the
    SNAT (rule 3). ``family`` (4 or 6) picks the table, and every address setting must be of that family. These
    are the node's own settings, not input: a bad one is a ``ValueError``.
    """
    fam = _FAMILIES[family]
    node = _Node(
        _network(node_pod_cidr, fam),
        _address(node_gateway, fam),
        _network(service_cidr, fam) if service_cidr is not None else None,
        _network(load_balancer_cidr, fam) if load_balancer_cidr is not None else None,
        bridge_netfilter,
        fam,
    )
    skipped: list[str] = []
    parsed: list[_Service] = []
    for obj in services:
        try:
            svc = _read_service(obj, skipped, node.load_balancer_cidr, fam)
        except _Malformed as exc:
            skipped.append(f"Service {_describe(obj)}: {exc}")
            continue
        if svc is not None:
            parsed.append(svc)
    backends: dict[_BackendKey, set[_Endpoint]] = {}
    for obj in slices:
        try:
            found = _read_slice(obj, skipped, fam)
        except _Malformed as exc:
            skipped.append(f"EndpointSlice {_describe(obj)}: {exc}")
            continue
        for key, endpoints in found.items():
            backends.setdefault(key, set()).update(endpoints)
    return _render(parsed, backends, skipped, node)


def _network(text: str, fam: _Family) -> IPNetwork:
    network = ipaddress.ip_network(text)
    if network.version != fam.version:
        raise ValueError(f"{text} is not an IPv{fam.version} range")
    return network


def _address(text: str, fam: _Family) -> IPAddress:
    address = ipaddress.ip_address(text)
    if address.version != fam.version:
        raise ValueError(f"{text} is not an IPv{fam.version} address")
    return address


# -- rendering ---------------------------------------------------------------------------------------------------


def _render(
    services: list[_Service],
    backends: dict[_BackendKey, set[_Endpoint]],
    skipped: list[str],
    node: _Node,
) -> RenderedRules:
    cluster_ips: set[IPAddress] = set()
    lb_ips: set[IPAddress] = set()
    service_map: dict[tuple[int, str, int], str] = {}
    reject_map: dict[tuple[int, str, int], str] = {}
    owners: dict[tuple[int, str, int], str] = {}
    chains: list[tuple[str, list[str]]] = []  # (name, its rules)
    seen: set[str] = set()
    rendered_services = endpoint_count = 0
    for svc in sorted(services, key=lambda s: (s.namespace, s.name)):
        who = f"{svc.namespace}/{svc.name}"
        if who in seen:
            skipped.append(f"Service {who}: listed twice; the first one is used")
            continue
        seen.add(who)
        rendered_ports = 0
        for port in sorted(svc.ports, key=lambda p: (p.protocol, p.port)):
            keys = []
            for address in (svc.cluster_ip, *svc.load_balancer_ips):
                key = (int(address), port.protocol, port.port)
                owner = owners.setdefault(key, who)
                if owner != who:
                    skipped.append(f"Service {who}: {address} {port.protocol} {port.port} is taken by {owner}")
                    continue
                keys.append(key)
            if not keys or keys[0][0] != int(svc.cluster_ip):
                continue  # the cluster IP's port is another Service's: none of this port is proxied
            rendered_ports += 1
            lb_ips.update(ipaddress.ip_address(k[0]) if node.family.version == 4 else ipaddress.IPv6Address(k[0])
                          for k in keys[1:])  # fmt: skip
            endpoints = sorted(backends.get((svc.namespace, svc.name, port.name, port.protocol), ()))
            if not endpoints:
                reject_map.update((key, f"goto reject-{port.protocol}") for key in keys)
                continue
            base = f"{svc.namespace}/{svc.name}/{port.protocol}/{port.port}"
            targets = [f"endpoint-{base}__{_chain_address(ep.ip)}/{ep.port}" for ep in endpoints]
            service_map.update((key, f"goto service-{base}") for key in keys)
            chains.append((f"service-{base}", [_spread(targets)]))
            for target, ep in zip(targets, endpoints, strict=True):
                host = f"[{ep.ip}]" if ep.ip.version == 6 else str(ep.ip)
                dnat = f"meta l4proto {port.protocol} dnat to {host}:{ep.port}"
                mark = f"{node.family.keyword} saddr {ep.ip} meta mark set meta mark | {HAIRPIN_MARK:#x}"
                chains.append((target, [mark, dnat] if node.bridge_netfilter else [dnat]))
            endpoint_count += len(endpoints)
        if rendered_ports:
            cluster_ips.add(svc.cluster_ip)
            rendered_services += 1
    script = _script(sorted(cluster_ips), sorted(lb_ips), service_map, reject_map, chains, node)
    return RenderedRules(script, skipped, rendered_services, endpoint_count)


def _chain_address(ip: IPAddress) -> str:
    """An address as a chain name may hold it: IPv6's ``:`` is not allowed, so it is written in full with ``.``."""
    return str(ip) if ip.version == 4 else ip.exploded.replace(":", ".")


def _spread(targets: list[str]) -> str:
    if len(targets) == 1:
        return f"goto {targets[0]}"
    arms = ", ".join(f"{i} : goto {target}" for i, target in enumerate(targets))
    return f"numgen random mod {len(targets)} vmap {{ {arms} }}"


def _script(
    cluster_ips: list[IPAddress],
    lb_ips: list[IPAddress],
    service_map: dict[tuple[int, str, int], str],
    reject_map: dict[tuple[int, str, int], str],
    chains: list[tuple[str, list[str]]],
    node: _Node,
) -> str:
    fam = node.family
    ip = fam.keyword
    lines = [
        f"# Service VIPs of the lab for the node with pods in {node.pod_cidr}"
        " (generated by ambit.lab.network.services).",
        f"add table {fam.keyword} {TABLE}",
        f"delete table {fam.keyword} {TABLE}",
        f"table {fam.keyword} {TABLE} {{",
    ]
    lines += _collection("set cluster-ips", fam.addr_type, [str(a) for a in cluster_ips])
    if node.load_balancer_cidr is not None:
        lines += _collection("set load-balancer-ips", fam.addr_type, [str(a) for a in lb_ips])
    verdict_type = f"{fam.addr_type} . inet_proto . inet_service : verdict"
    lines += _collection("map service-ips", verdict_type, _elements(service_map, fam))
    lines += _collection("map no-endpoint-services", verdict_type, _elements(reject_map, fam))
    lookup = f"{ip} daddr . meta l4proto . th dport vmap @service-ips"
    lines += _chain("nat-prerouting", "type nat hook prerouting priority dstnat; policy accept;", [lookup])
    lines += _chain("nat-output", "type nat hook output priority -100; policy accept;", [lookup])
    if node.bridge_netfilter:
        hairpin = f"meta mark & {HAIRPIN_MARK:#x} == {HAIRPIN_MARK:#x} snat to {node.gateway}"
    else:
        hairpin = f"ct status dnat {ip} saddr {node.pod_cidr} {ip} daddr {node.pod_cidr} snat to {node.gateway}"
    postrouting = [hairpin]
    if node.load_balancer_cidr is not None:
        postrouting.append(f"ct status dnat ct original {ip} daddr @load-balancer-ips masquerade")
    lines += _chain("nat-postrouting", "type nat hook postrouting priority srcnat; policy accept;", postrouting)
    check = ["ct state new jump services-check"]
    lines += _chain("filter-prerouting", "type filter hook prerouting priority dstnat + 10; policy accept;", check)
    lines += _chain("filter-output", "type filter hook output priority filter; policy accept;", check)
    checks = [f"{ip} daddr . meta l4proto . th dport vmap @no-endpoint-services", f"{ip} daddr @cluster-ips reject"]
    if node.load_balancer_cidr is not None:
        checks.append(f"{ip} daddr @load-balancer-ips reject")
    if node.service_cidr is not None:
        checks.append(f"{ip} daddr {node.service_cidr} reject")
    lines += _chain("services-check", None, checks)
    rejects = {"tcp": "meta l4proto tcp reject with tcp reset", "udp": fam.udp_reject}
    for protocol, how in rejects.items():
        lines += _chain(f"reject-{protocol}", None, [how])
    for name, rules in chains:
        lines += _chain(name, None, rules)
    lines[-1:] = ["}"]  # drop the blank line after the last chain
    return "\n".join(lines) + "\n"


def _elements(entries: dict[tuple[int, str, int], str], fam: _Family) -> list[str]:
    as_address = ipaddress.IPv4Address if fam.version == 4 else ipaddress.IPv6Address
    return [
        f"{as_address(ip)} . {proto} . {port} : {verdict}" for (ip, proto, port), verdict in sorted(entries.items())
    ]


def _collection(head: str, type_: str, elements: list[str]) -> list[str]:
    lines = [f"\t{head} {{", f"\t\ttype {type_}"]
    if elements:  # nft refuses "elements = { }"
        lines += ["\t\telements = {", *(f"\t\t\t{e}," for e in elements), "\t\t}"]
    return [*lines, "\t}", ""]


def _chain(name: str, base: str | None, rules: list[str]) -> list[str]:
    head = [f"\t\t{base}"] if base else []
    return [f"\tchain {name} {{", *head, *(f"\t\t{rule}" for rule in rules), "\t}", ""]


# -- reading objects ---------------------------------------------------------------------------------------------


def _read_service(obj: object, skipped: list[str], lb_cidr: IPNetwork | None, fam: _Family) -> _Service | None:
    """The Service to proxy; None for a valid Service with nothing to proxy (headless, ExternalName, or no cluster
    IP of the table's family)."""
    meta = _mapping(obj, "metadata")
    namespace, name = _label(meta, "namespace"), _label(meta, "name")
    spec = _mapping(obj, "spec")
    kind = spec.get("type") or "ClusterIP"
    if kind == "ExternalName":
        return None
    if kind not in _PROXIED_TYPES:
        raise _Malformed(f"spec.type {_show(kind)} is not a Service type")
    cluster_ip = spec.get("clusterIP")
    if cluster_ip == "None":
        return None
    if not isinstance(cluster_ip, str) or not cluster_ip:
        raise _Malformed("spec.clusterIP is missing")
    ip = _family_cluster_ip(spec, cluster_ip, fam)
    if ip is None:
        return None
    raw_ports = spec.get("ports")
    if not isinstance(raw_ports, list) or not raw_ports:
        raise _Malformed("spec.ports is missing or empty")
    ports: dict[tuple[str, int], _ServicePort] = {}
    for i, raw in enumerate(raw_ports):
        try:
            port = _read_service_port(raw)
        except _Malformed as exc:
            skipped.append(f"Service {namespace}/{name}: spec.ports[{i}]: {exc}")
            continue
        if ports.setdefault((port.protocol, port.port), port) is not port:
            skipped.append(f"Service {namespace}/{name}: spec.ports[{i}]: {port.protocol} {port.port} is listed twice")
    lb_ips = _load_balancer_ips(obj, kind, lb_cidr, f"Service {namespace}/{name}", skipped, fam)
    return _Service(namespace, name, ip, tuple(ports.values()), lb_ips)


def _family_cluster_ip(spec: dict[str, Any], cluster_ip: str, fam: _Family) -> IPAddress | None:
    """The Service's cluster IP of the table's family: ``clusterIP`` itself, or the other entry of a dual-stack
    Service's ``clusterIPs``; None when it has none of that family."""
    primary = _ip(cluster_ip, "spec.clusterIP")
    if primary.version == fam.version:
        return primary
    ips = spec.get("clusterIPs")
    for i, text in enumerate(ips if isinstance(ips, list) else ()):
        if i == 0 or not isinstance(text, str):
            continue
        address = _ip(text, f"spec.clusterIPs[{i}]")
        if address.version == fam.version:
            return address
    return None


def _load_balancer_ips(
    obj: object, kind: str, lb_cidr: IPNetwork | None, who: str, skipped: list[str], fam: _Family
) -> tuple[IPAddress, ...]:
    """The addresses of ``status.loadBalancer.ingress`` to proxy: a LoadBalancer Service's, in ``lb_cidr``."""
    if kind != "LoadBalancer" or lb_cidr is None or not isinstance(obj, dict):
        return ()
    status = obj.get("status")
    lb = status.get("loadBalancer") if isinstance(status, dict) else None
    ingress = lb.get("ingress") if isinstance(lb, dict) else None
    out: list[IPAddress] = []
    for i, item in enumerate(ingress if isinstance(ingress, list) else ()):
        raw = item.get("ip") if isinstance(item, dict) else None
        if not isinstance(raw, str):
            continue
        try:
            address = _ip(raw, f"status.loadBalancer.ingress[{i}].ip")
        except _Malformed as exc:
            skipped.append(f"{who}: {exc}")
            continue
        if address.version != fam.version:
            continue  # the other family's table serves it
        if address not in lb_cidr:
            skipped.append(f"{who}: status.loadBalancer.ingress[{i}].ip {address} is outside {lb_cidr}")
            continue
        if address not in out:
            out.append(address)
    return tuple(out)


def _read_service_port(raw: object) -> _ServicePort:
    if not isinstance(raw, dict):
        raise _Malformed(f"{_show(raw)} is not an object")
    name = raw.get("name") or ""
    if not isinstance(name, str):
        raise _Malformed(f"name {_show(name)} is not a string")
    return _ServicePort(name, _protocol(raw.get("protocol")), _port(raw.get("port"), "port"))


def _read_slice(obj: object, skipped: list[str], fam: _Family) -> dict[_BackendKey, set[_Endpoint]]:
    """Ready endpoints per Service port; empty for a slice of another address family."""
    meta = _mapping(obj, "metadata")
    namespace = _label(meta, "namespace")
    labels = meta.get("labels")
    service = labels.get(SERVICE_NAME_LABEL) if isinstance(labels, dict) else None
    if not isinstance(service, str) or not _LABEL.fullmatch(service):
        raise _Malformed(f"label {SERVICE_NAME_LABEL} is {_show(service)}, not a Service name")
    assert isinstance(obj, dict)  # _mapping checked it
    address_type = obj.get("addressType")
    if address_type not in ("IPv4", "IPv6", "FQDN"):
        raise _Malformed(f"addressType {_show(address_type)} is not IPv4, IPv6 or FQDN")
    if address_type != fam.address_type:
        return {}
    where = f"EndpointSlice {namespace}/{_show_name(meta.get('name'))}"
    ports: list[tuple[str, str, int]] = []
    for i, raw in enumerate(_list(obj, "ports")):
        try:
            if not isinstance(raw, dict):
                raise _Malformed(f"{_show(raw)} is not an object")
            if raw.get("port") is None:
                continue  # a slice port without a number applies to no Service port
            name = raw.get("name") or ""
            if not isinstance(name, str):
                raise _Malformed(f"name {_show(name)} is not a string")
            ports.append((name, _protocol(raw.get("protocol")), _port(raw.get("port"), "port")))
        except _Malformed as exc:
            skipped.append(f"{where}: ports[{i}]: {exc}")
    ready: list[IPAddress] = []
    for i, raw in enumerate(_list(obj, "endpoints")):
        try:
            address = _ready_address(raw, fam)
        except _Malformed as exc:
            skipped.append(f"{where}: endpoints[{i}]: {exc}")
            continue
        if address is not None:
            ready.append(address)
    found: dict[_BackendKey, set[_Endpoint]] = {}
    for port_name, protocol, number in ports:
        found.setdefault((namespace, service, port_name, protocol), set()).update(_Endpoint(ip, number) for ip in ready)
    return found


def _ready_address(raw: object, fam: _Family) -> IPAddress | None:
    """The endpoint's address when it is ready (``conditions.ready`` true or unknown), else None."""
    if not isinstance(raw, dict):
        raise _Malformed(f"{_show(raw)} is not an object")
    addresses = raw.get("addresses")
    if not isinstance(addresses, list) or not addresses or not isinstance(addresses[0], str):
        raise _Malformed(f"addresses {_show(addresses)} is not a list of addresses")
    address = _ip(addresses[0], "addresses[0]")
    if address.version != fam.version:
        raise _Malformed(f"addresses[0] {address} is not an {fam.address_type} address (the slice's addressType)")
    conditions = raw.get("conditions")
    if conditions is None:
        return address
    if not isinstance(conditions, dict):
        raise _Malformed(f"conditions {_show(conditions)} is not an object")
    ready = conditions.get("ready")
    if ready is not None and not isinstance(ready, bool):
        raise _Malformed(f"conditions.ready {_show(ready)} is not a boolean")
    return None if ready is False else address


# -- field checks -----------------------------------------------------------------------------------------------


def _mapping(obj: object, field: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise _Malformed(f"{_show(obj)} is not an object")
    value = obj.get(field)
    if not isinstance(value, dict):
        raise _Malformed(f"{field} is {_show(value)}, not an object")
    return value


def _list(obj: dict[str, Any], field: str) -> list[Any]:
    value = obj.get(field)
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Malformed(f"{field} is {_show(value)}, not a list")
    return value


def _label(meta: dict[str, Any], field: str) -> str:
    value = meta.get(field)
    if not isinstance(value, str) or not _LABEL.fullmatch(value):
        raise _Malformed(f"metadata.{field} {_show(value)} is not a DNS label")
    return value


def _protocol(value: object) -> str:
    if value is None:
        return "tcp"
    protocol = _PROTOCOLS.get(value) if isinstance(value, str) else None
    if protocol is None:
        raise _Malformed(f"protocol {_show(value)} is not supported (TCP and UDP are)")
    return protocol


def _port(value: object, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        raise _Malformed(f"{field} {_show(value)} is not a port number")
    return value


def _ip(value: str, field: str) -> IPAddress:
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        raise _Malformed(f"{field} {_show(value)} is not an IP address") from None


def _describe(obj: object) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return "(no metadata)"
    return f"{_show_name(meta.get('namespace'))}/{_show_name(meta.get('name'))}"


def _show_name(value: object) -> str:
    return value if isinstance(value, str) and _LABEL.fullmatch(value) else _show(value)


def _show(value: object) -> str:
    """An untrusted value in a reason: a short repr (one line, whatever it holds)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
