"""The records cluster DNS answers from, built from Services, EndpointSlices and the lab's zone (pure).

Theory of operation: the server keeps the API objects it watches and rebuilds a :class:`ClusterRecords` from them
after each change; answering (:mod:`ambit.lab.dns.answer`) only reads it. Building never raises: an object that
is malformed in a way the API server would not let through (a missing name, a bad address) is left out, and a
lab-zone entry that is not an address is reported in :attr:`ClusterRecords.zone_errors`.

Rules:

1. A Service is ``(namespace, name)``. ``clusterIP: None`` makes it headless; ``type: ExternalName`` gives it a
   CNAME target; otherwise its ``clusterIPs`` (or ``clusterIP``) are its addresses.
2. Endpoints come from EndpointSlices labelled ``kubernetes.io/service-name``; only ready endpoints are kept
   (``conditions.ready`` absent counts as ready, as in Kubernetes). An endpoint's name is its ``hostname`` when it
   has one, else its address with ``.`` and ``:`` as ``-`` (CoreDNS's endpoint names).
3. Named ports: the Service's ports with a name, by ``(name, protocol)``; for a headless Service the port number of
   an SRV target is the EndpointSlice's port of that name (the target port), as CoreDNS answers.
4. PTR: each Service address names the Service; each ready headless endpoint with a hostname names that host.
   When two objects claim one address, the first in (namespace, name) order wins, so answers are deterministic.
5. The lab zone maps fully qualified names (lower case, no trailing dot needed) to addresses; it comes from the
   ConfigMap ``kube-system/lab-dns-zone``, one key per name, the value addresses separated by spaces or commas.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

CLUSTER_DOMAIN = "cluster.local"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
ZONE_CONFIGMAP = ("kube-system", "lab-dns-zone")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True, slots=True)
class NamedPort:
    name: str
    protocol: str  # "tcp", "udp" or "sctp" (lower case, as in the SRV owner name)
    port: int


@dataclass(frozen=True, slots=True)
class Endpoint:
    address: IPAddress
    name: str
    """The endpoint's label under its Service: ``hostname`` or the dashed address (rule 2)."""
    ports: tuple[NamedPort, ...] = ()
    has_hostname: bool = False


@dataclass(frozen=True, slots=True)
class ServiceRecord:
    namespace: str
    name: str
    addresses: tuple[IPAddress, ...] = ()
    headless: bool = False
    external_name: str | None = None
    ports: tuple[NamedPort, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterRecords:
    """Everything cluster DNS answers, indexed for lookups by name and by address."""

    services: Mapping[tuple[str, str], ServiceRecord] = field(default_factory=dict)
    endpoints: Mapping[tuple[str, str], tuple[Endpoint, ...]] = field(default_factory=dict)
    zone: Mapping[str, tuple[IPAddress, ...]] = field(default_factory=dict)
    pointers: Mapping[IPAddress, str] = field(default_factory=dict)
    """Address → the fully qualified name (no trailing dot) a PTR query for it answers (rule 4)."""
    namespaces: frozenset[str] = frozenset()
    domain: str = CLUSTER_DOMAIN
    zone_errors: tuple[str, ...] = ()

    def find_service(self, namespace: str, name: str) -> ServiceRecord | None:
        return self.services.get((namespace, name))

    def find_endpoints(self, namespace: str, name: str) -> tuple[Endpoint, ...]:
        return self.endpoints.get((namespace, name), ())


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _address(value: Any) -> IPAddress | None:
    try:
        return ipaddress.ip_address(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _ports(items: Any) -> tuple[NamedPort, ...]:
    ports: list[NamedPort] = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        name, number = _text(item.get("name")), item.get("port")
        protocol = (_text(item.get("protocol")) or "TCP").lower()
        port = number if isinstance(number, int) and not isinstance(number, bool) else 0
        if name and _LABEL.fullmatch(name) and 0 < port < 65536 and protocol in ("tcp", "udp", "sctp"):
            ports.append(NamedPort(name, protocol, port))
    return tuple(ports)


def service_record(obj: Mapping[str, Any]) -> ServiceRecord | None:
    """Rule 1; None for an object without a usable namespace and name."""
    meta, spec = obj.get("metadata"), obj.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        return None
    namespace, name = _text(meta.get("namespace")), _text(meta.get("name"))
    if not _LABEL.fullmatch(namespace) or not _LABEL.fullmatch(name):
        return None
    ports = _ports(spec.get("ports"))
    if spec.get("type") == "ExternalName":
        target = _text(spec.get("externalName")).rstrip(".").lower()
        return ServiceRecord(namespace, name, external_name=target or None, ports=ports)
    ips = spec.get("clusterIPs")
    texts = ips if isinstance(ips, list) and ips else [spec.get("clusterIP")]
    if "None" in texts:
        return ServiceRecord(namespace, name, headless=True, ports=ports)
    addresses = tuple(a for a in (_address(t) for t in texts) if a is not None)
    return ServiceRecord(namespace, name, addresses=addresses, ports=ports)


def slice_endpoints(obj: Mapping[str, Any]) -> tuple[tuple[str, str], tuple[Endpoint, ...]] | None:
    """Rule 2 for one EndpointSlice: its Service's key and its ready endpoints; None without a Service label."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return None
    labels = meta.get("labels")
    service = _text(labels.get(SERVICE_NAME_LABEL)) if isinstance(labels, dict) else ""
    namespace = _text(meta.get("namespace"))
    if not service or not namespace:
        return None
    ports = _ports(obj.get("ports"))
    found: list[Endpoint] = []
    items = obj.get("endpoints")
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        conditions = item.get("conditions")
        ready = conditions.get("ready") if isinstance(conditions, dict) else None
        if ready is False:
            continue
        hostname = _text(item.get("hostname")).lower()
        addresses = item.get("addresses")
        for text in addresses if isinstance(addresses, list) else []:
            address = _address(text)
            if address is None:
                continue
            if hostname and _LABEL.fullmatch(hostname):
                found.append(Endpoint(address, hostname, ports, has_hostname=True))
            else:
                found.append(Endpoint(address, str(address).replace(".", "-").replace(":", "-"), ports))
    return (namespace, service), tuple(found)


def parse_zone(data: Mapping[str, Any]) -> tuple[dict[str, tuple[IPAddress, ...]], list[str]]:
    """Rule 5: the lab zone from a ConfigMap's ``data``, and one message per entry that was left out."""
    zone: dict[str, tuple[IPAddress, ...]] = {}
    errors: list[str] = []
    for key, value in sorted(data.items()):
        name = str(key).rstrip(".").lower()
        labels = name.split(".")
        if len(labels) < 2 or not all(_LABEL.fullmatch(label) for label in labels) or len(name) > 253:
            errors.append(f"lab-dns-zone: {key!r} is not a domain name")
            continue
        addresses: list[IPAddress] = []
        for word in re.split(r"[\s,]+", value.strip()) if isinstance(value, str) else [None]:
            address = _address(word)
            if address is None:
                errors.append(f"lab-dns-zone: {key!r}: {word!r} is not an IP address")
                break
            addresses.append(address)
        else:
            zone[name] = tuple(addresses)
    return zone, errors


def build_records(
    services: Iterable[Mapping[str, Any]],
    slices: Iterable[Mapping[str, Any]],
    zone_data: Mapping[str, Any] | None = None,
    *,
    domain: str = CLUSTER_DOMAIN,
) -> ClusterRecords:
    """Rules 1 to 5 over everything the server watches."""
    by_key: dict[tuple[str, str], ServiceRecord] = {}
    for obj in services:
        record = service_record(obj)
        if record is not None:
            by_key[(record.namespace, record.name)] = record
    endpoints: dict[tuple[str, str], list[Endpoint]] = {}
    for obj in slices:
        found = slice_endpoints(obj)
        if found is not None:
            endpoints.setdefault(found[0], []).extend(found[1])
    pointers: dict[IPAddress, str] = {}
    for key in sorted(by_key):
        record = by_key[key]
        fqdn = f"{record.name}.{record.namespace}.svc.{domain}"
        for address in record.addresses:
            pointers.setdefault(address, fqdn)
        if record.headless:
            for endpoint in sorted(endpoints.get(key, []), key=lambda e: (e.name, str(e.address))):
                if endpoint.has_hostname:
                    pointers.setdefault(endpoint.address, f"{endpoint.name}.{fqdn}")
    zone, errors = parse_zone(zone_data or {})
    return ClusterRecords(
        services=by_key,
        endpoints={key: tuple(found) for key, found in endpoints.items()},
        zone=zone,
        pointers=pointers,
        namespaces=frozenset(namespace for namespace, _ in by_key),
        domain=domain,
        zone_errors=tuple(errors),
    )
