"""Validation of ``networking.istio.io`` ServiceEntry and WorkloadEntry, the workloads the control plane reads.

Theory of operation. Both specs are decoded strictly (unknown fields are errors). A ServiceEntry's ``endpoints``
are WorkloadEntry specs, so :func:`check_workload_entry` serves both, told the service's resolution and port
names when it checks an inline endpoint.

ServiceEntry rules (istiod's): ``hosts`` is required, each a DNS name or ``*.``-prefixed wildcard (never ``*``
alone); ``addresses`` are IPs or CIDR prefixes; each port has a number, a DNS-label name and a known protocol,
numbers and names unique; ``resolution`` is NONE (default), STATIC, DNS, DNS_ROUND_ROBIN or DYNAMIC_DNS and
decides what endpoints may be:

- STATIC: endpoints are IP addresses (or ``unix://`` paths) and are required unless ``workloadSelector`` picks
  the workloads instead;
- DNS / DNS_ROUND_ROBIN: endpoints are DNS names or IPs; without endpoints the hosts are resolved, so they may not
  be wildcards; DNS_ROUND_ROBIN takes at most one endpoint;
- NONE: no endpoints (traffic goes to the address it was sent to);
- DYNAMIC_DNS (an egress waypoint resolves each name as it is asked): every host is a ``*.`` wildcard, no
  ``addresses``, no endpoints, every port HTTP, TLS, GRPC or HTTP2, and not MESH_INTERNAL when the entry is bound
  to a waypoint (label ``istio.io/use-waypoint`` set and not ``none``).

``workloadSelector`` and ``endpoints`` are exclusive, and an endpoint's ``ports`` keys must name service ports.

WorkloadEntry: ``address`` is required unless ``network`` is set (a workload reached through that network's
gateway); ``ports`` maps port names to numbers; ``weight`` is an unsigned 32-bit integer.
"""

from __future__ import annotations

from typing import Any

from ambit.controlplane.webhook.fields import Fields, is_dns_label, is_hostname, is_ip_or_cidr
from ambit.model.dnsname import is_ip

RESOLUTIONS = ("NONE", "STATIC", "DNS", "DNS_ROUND_ROBIN", "DYNAMIC_DNS")
DYNAMIC_DNS_PROTOCOLS = ("HTTP", "TLS", "GRPC", "HTTP2")
LOCATIONS = ("MESH_EXTERNAL", "MESH_INTERNAL")
PROTOCOLS = ("HTTP", "HTTPS", "GRPC", "GRPC-WEB", "HTTP2", "HTTP_PROXY", "MONGO", "MYSQL", "REDIS", "TCP", "TLS", "UDP")
_SERVICE_ENTRY = (
    "hosts",
    "addresses",
    "ports",
    "location",
    "resolution",
    "endpoints",
    "workloadSelector",
    "exportTo",
    "subjectAltNames",
)
_WORKLOAD_ENTRY = ("address", "ports", "labels", "network", "locality", "weight", "serviceAccount")


def validate_service_entry(obj: dict[str, Any]) -> Fields:
    f = Fields()
    spec = f.mapping(obj.get("spec"), "spec", known=_SERVICE_ENTRY)
    hosts = f.strings(spec.get("hosts"), "spec.hosts", required=True)
    for path, host in hosts:
        if host == "*":
            f.error(path, "a host of only '*' is not allowed")
        elif not is_hostname(host):
            f.error(path, f"{host!r} is not a DNS name (a '*.' prefix is allowed)")
    for path, address in f.strings(spec.get("addresses"), "spec.addresses"):
        if not is_ip_or_cidr(address):
            f.error(path, f"{address!r} is not an IP address or CIDR prefix")
    port_names = _check_ports(f, spec.get("ports"))
    f.enum(spec.get("location"), "spec.location", LOCATIONS)
    resolution = f.enum(spec.get("resolution"), "spec.resolution", RESOLUTIONS) or "NONE"
    selector = f.selector(f.get(spec, "workloadSelector"), "spec.workloadSelector", labels_name="labels")
    endpoints = f.objects(spec.get("endpoints"), "spec.endpoints")
    if selector is not None and endpoints:
        f.error("spec.workloadSelector", "only one of workloadSelector or endpoints can be set")
    if resolution == "STATIC" and selector is None and not endpoints:
        f.error("spec.endpoints", "resolution STATIC needs endpoints (or a workloadSelector)")
    elif resolution == "NONE" and endpoints:
        f.error("spec.endpoints", "no endpoints may be given with resolution NONE")
    elif resolution == "DNS_ROUND_ROBIN" and len(endpoints) > 1:
        f.error("spec.endpoints", "resolution DNS_ROUND_ROBIN takes at most one endpoint")
    if resolution in ("DNS", "DNS_ROUND_ROBIN") and not endpoints:
        for path, host in hosts:
            if host.startswith("*"):
                f.error(path, f"wildcard host {host!r} cannot be resolved: resolution {resolution} needs endpoints")
    if resolution == "DYNAMIC_DNS":
        _check_dynamic_dns(f, obj, spec, hosts, endpoints)
    for path, endpoint in endpoints:
        check_workload_entry(f, endpoint, path, resolution=resolution, port_names=port_names)
    for path, namespace in f.strings(f.get(spec, "exportTo"), "spec.exportTo"):
        if namespace not in (".", "*", "~") and not is_dns_label(namespace):
            f.error(path, f"{namespace!r} is not '.', '*', '~' or a namespace name")
    f.strings(f.get(spec, "subjectAltNames"), "spec.subjectAltNames")
    return f


def _check_dynamic_dns(
    f: Fields, obj: dict[str, Any], spec: dict[str, Any], hosts: list[tuple[str, str]], endpoints: list[Any]
) -> None:
    for path, host in hosts:
        if not host.startswith("*."):
            f.error(path, f"{host!r} is not a '*.' wildcard, as resolution DYNAMIC_DNS requires")
    if spec.get("addresses"):
        f.error("spec.addresses", "no addresses may be given with resolution DYNAMIC_DNS")
    if endpoints:
        f.error("spec.endpoints", "no endpoints may be given with resolution DYNAMIC_DNS")
    ports = spec.get("ports")
    for i, port in enumerate(ports if isinstance(ports, list) else ()):
        protocol = str((port.get("protocol") if isinstance(port, dict) else None) or "TCP").upper()
        if protocol not in DYNAMIC_DNS_PROTOCOLS:
            f.error(
                f"spec.ports[{i}].protocol",
                f"resolution DYNAMIC_DNS takes only {', '.join(DYNAMIC_DNS_PROTOCOLS)} ports, not {protocol}",
            )
    labels = (obj.get("metadata") or {}).get("labels") or {}
    waypoint = str(labels.get("istio.io/use-waypoint") or "") if isinstance(labels, dict) else ""
    if spec.get("location") == "MESH_INTERNAL" and waypoint and waypoint.lower() != "none":
        f.error("spec.location", "MESH_INTERNAL with resolution DYNAMIC_DNS cannot be bound to a waypoint")


def _check_ports(f: Fields, value: Any) -> set[str]:
    names: set[str] = set()
    numbers: set[int] = set()
    for path, port in f.objects(value, "spec.ports"):
        f.mapping(port, path, known=("number", "protocol", "name", "targetPort"))
        number = f.port(port.get("number"), f"{path}.number", required=True)
        if number is not None:
            if number in numbers:
                f.error(f"{path}.number", f"port number {number} is not unique")
            numbers.add(number)
        name = f.string(port.get("name"), f"{path}.name", required=True)
        if name is not None:
            if not is_dns_label(name):
                f.error(f"{path}.name", f"{name!r} is not a DNS label (lower case letters, digits and '-')")
            if name in names:
                f.error(f"{path}.name", f"port name {name!r} is not unique")
            names.add(name)
        protocol = f.string(port.get("protocol"), f"{path}.protocol")
        if protocol is not None and protocol.upper() not in PROTOCOLS:
            f.error(f"{path}.protocol", f"unsupported protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}")
        f.port(f.get(port, "targetPort"), f"{path}.targetPort")
    return names


def validate_workload_entry(obj: dict[str, Any]) -> Fields:
    f = Fields()
    check_workload_entry(f, f.mapping(obj.get("spec"), "spec", required=True), "spec")
    return f


def check_workload_entry(
    f: Fields, entry: dict[str, Any], path: str, *, resolution: str | None = None, port_names: set[str] | None = None
) -> None:
    """One WorkloadEntry spec, standalone (``resolution`` None) or as a ServiceEntry endpoint."""
    f.mapping(entry, path, known=_WORKLOAD_ENTRY)
    address = f.string(entry.get("address"), f"{path}.address")
    network = f.string(entry.get("network"), f"{path}.network")
    if address is None and network is None:
        f.error(f"{path}.address", "required unless network is set")
    elif address is not None:
        if address.startswith("unix://"):
            if not address[len("unix://") :].startswith("/"):
                f.error(f"{path}.address", f"{address!r} is not a unix:// socket with an absolute path")
        elif resolution == "STATIC" and not is_ip(address):
            f.error(f"{path}.address", f"{address!r} is not an IP address, as resolution STATIC requires")
        elif not is_ip(address) and not is_hostname(address, wildcard=False):
            f.error(f"{path}.address", f"{address!r} is not an IP address or a DNS name")
    for name, number in f.mapping(entry.get("ports"), f"{path}.ports").items():
        port_path = f"{path}.ports[{name}]"
        f.port(number, port_path, required=True)
        if port_names is not None and name not in port_names:
            f.error(port_path, f"port {name!r} is not one of the service entry's port names")
    f.labels(entry.get("labels"), f"{path}.labels")
    f.string(entry.get("locality"), f"{path}.locality")
    f.integer(entry.get("weight"), f"{path}.weight", low=0, high=2**32 - 1, what="weight")
    f.string(f.get(entry, "serviceAccount"), f"{path}.serviceAccount")
