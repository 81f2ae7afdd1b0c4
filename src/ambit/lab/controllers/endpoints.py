"""A Service's endpoints, from its pods (pure): EndpointSlice endpoints and legacy Endpoints subsets.

Which pods: those of the Service's namespace matching its selector that have a pod IP of the family asked for
(IPv4 unless said: kube's controller makes the slices of each of the Service's ``ipFamilies``; the legacy
Endpoints object is IPv4) and are not terminal (Succeeded, Failed). Terminating pods stay in EndpointSlices,
flagged, as kube does since 1.22; the legacy Endpoints object leaves them out.

Conditions of an endpoint (kube's semantics): ``ready`` = the pod's Ready condition is True and it is not
terminating; ``serving`` = its Ready condition is True; ``terminating`` = it has a ``deletionTimestamp``. With
``spec.publishNotReadyAddresses`` ready and serving are always true.

Ports: each Service port maps to a port on the pod. A numeric ``targetPort`` is that number; a named one is
looked up among the pod's container ports (name and protocol). A name the pod does not define leaves that
Service port out *for that pod*, so pods can have different port lists; endpoints are grouped by their port list
(the slices and subsets of one Service each carry one list).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambit.lab.controllers import pods as podstate
from ambit.lab.controllers.ownership import Object, is_deleting, key_of, name_of, uid_of

PortKey = tuple[tuple[str, int, str, str], ...]
"""A port list in canonical form: sorted (name, port, protocol, appProtocol)."""


ADDRESS_TYPES = {"IPv4": 4, "IPv6": 6}


def pod_ip(pod: Mapping[str, Any], family: str) -> str | None:
    """The pod's first address of ``family`` (``IPv4`` or ``IPv6``), or None."""
    status = pod.get("status") or {}
    candidates = [p.get("ip") for p in status.get("podIPs") or () if isinstance(p, dict)]
    candidates.append(status.get("podIP"))
    for ip in candidates:
        if isinstance(ip, str) and ip:
            try:
                if ipaddress.ip_address(ip).version == ADDRESS_TYPES[family]:
                    return ip
            except ValueError:
                continue
    return None


def service_address_types(service: Mapping[str, Any]) -> list[str]:
    """The address types of the Service's slices: its ``ipFamilies`` (IPv4 when it says none)."""
    families = (service.get("spec") or {}).get("ipFamilies")
    found = [f for f in families if f in ADDRESS_TYPES] if isinstance(families, list) else []
    return list(dict.fromkeys(found)) or ["IPv4"]


def legacy_address(service: Mapping[str, Any], pod: Mapping[str, Any]) -> str | None:
    """The pod's address in the legacy Endpoints of ``service``, which hold one family, as kube's endpoints
    controller picks it: the family of the Service's ClusterIP; for a headless Service, its first ``ipFamilies``
    entry, else the family of the pod's primary address. None when the pod has no address of that family."""
    spec = service.get("spec") or {}
    cluster_ip = spec.get("clusterIP")
    try:
        family = f"IPv{ipaddress.ip_address(cluster_ip).version}" if isinstance(cluster_ip, str) else ""
    except ValueError:  # None or "" (headless)
        family = ""
    if not family:
        families = spec.get("ipFamilies")
        first = families[0] if isinstance(families, list) and families else None
        if first in ADDRESS_TYPES:
            family = str(first)
        else:
            primary = (pod.get("status") or {}).get("podIP")
            family = "IPv6" if isinstance(primary, str) and ":" in primary else "IPv4"
    return pod_ip(pod, family)


def resolve_ports(service: Mapping[str, Any], pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Service's ports as they land on ``pod`` (EndpointPort objects; unresolvable named ports left out)."""
    ports: list[dict[str, Any]] = []
    for sp in (service.get("spec") or {}).get("ports") or ():
        if not isinstance(sp, dict):
            continue
        protocol = str(sp.get("protocol") or "TCP")
        target = sp.get("targetPort", sp.get("port"))
        number = _container_port(pod, target, protocol) if isinstance(target, str) else target
        if not isinstance(number, int) or not 0 < number < 65536:
            continue
        port: dict[str, Any] = {"name": str(sp.get("name") or ""), "port": number, "protocol": protocol}
        if sp.get("appProtocol"):
            port["appProtocol"] = sp["appProtocol"]
        ports.append(port)
    return ports


def _container_port(pod: Mapping[str, Any], name: str, protocol: str) -> int | None:
    for container in (pod.get("spec") or {}).get("containers") or ():
        for port in (container or {}).get("ports") or ():
            if (
                isinstance(port, dict)
                and port.get("name") == name
                and str(port.get("protocol") or "TCP") == protocol
                and isinstance(port.get("containerPort"), int)
            ):
                return int(port["containerPort"])
    return None


def port_key(ports: Sequence[Mapping[str, Any]]) -> PortKey:
    return tuple(
        sorted(
            (
                str(p.get("name") or ""),
                int(p.get("port") or 0),
                str(p.get("protocol") or "TCP"),
                str(p.get("appProtocol") or ""),
            )
            for p in ports
        )
    )


def _target_ref(pod: Mapping[str, Any]) -> dict[str, Any]:
    namespace, name = key_of(pod)
    return {"kind": "Pod", "namespace": namespace, "name": name, "uid": uid_of(pod)}


def _hostname(service: Mapping[str, Any], pod: Mapping[str, Any]) -> str | None:
    spec = pod.get("spec") or {}
    if spec.get("hostname") and spec.get("subdomain") == name_of(service):
        return str(spec["hostname"])
    return None


@dataclass(frozen=True, slots=True)
class PodEndpoint:
    """One pod's endpoint in a Service, with the ports it resolves."""

    endpoint: dict[str, Any]
    ports: list[dict[str, Any]]

    @property
    def ports_key(self) -> PortKey:
        return port_key(self.ports)


def pod_endpoints(service: Mapping[str, Any], pods: Sequence[Object], family: str = "IPv4") -> list[PodEndpoint]:
    """The EndpointSlice endpoints of ``pods`` (already selected) in ``family``'s slices, sorted by pod name."""
    publish = bool((service.get("spec") or {}).get("publishNotReadyAddresses"))
    result = []
    for pod in sorted(pods, key=name_of):
        ip = pod_ip(pod, family)
        if ip is None or podstate.is_terminal(pod):
            continue
        terminating = is_deleting(pod)
        ready = podstate.is_ready(pod)
        endpoint: dict[str, Any] = {
            "addresses": [ip],
            "conditions": {
                "ready": publish or (ready and not terminating),
                "serving": publish or ready,
                "terminating": terminating,
            },
            "targetRef": _target_ref(pod),
        }
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            endpoint["nodeName"] = node
        hostname = _hostname(service, pod)
        if hostname:
            endpoint["hostname"] = hostname
        result.append(PodEndpoint(endpoint, resolve_ports(service, pod)))
    return result


def endpoints_subsets(service: Mapping[str, Any], pods: Sequence[Object]) -> list[dict[str, Any]]:
    """The legacy Endpoints ``subsets``: addresses grouped by their port list, ready ones apart from the others."""
    publish = bool((service.get("spec") or {}).get("publishNotReadyAddresses"))
    has_ports = bool((service.get("spec") or {}).get("ports"))
    groups: dict[PortKey, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
    for pod in pods:
        ip = legacy_address(service, pod)
        if ip is None or podstate.is_terminal(pod) or (is_deleting(pod) and not publish):
            continue
        ports = resolve_ports(service, pod)
        if has_ports and not ports:
            continue
        address: dict[str, Any] = {"ip": ip, "targetRef": _target_ref(pod)}
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            address["nodeName"] = node
        hostname = _hostname(service, pod)
        if hostname:
            address["hostname"] = hostname
        ready, not_ready = groups.setdefault(port_key(ports), ([], []))
        (ready if publish or podstate.is_ready(pod) else not_ready).append(address)
    subsets = []
    for key in sorted(groups):
        ready, not_ready = groups[key]
        subset: dict[str, Any] = {}
        if ready:
            subset["addresses"] = sorted(ready, key=lambda a: (a["ip"], a["targetRef"]["name"]))
        if not_ready:
            subset["notReadyAddresses"] = sorted(not_ready, key=lambda a: (a["ip"], a["targetRef"]["name"]))
        if key:
            subset["ports"] = [_legacy_port(p) for p in key]
        subsets.append(subset)
    return subsets


def _legacy_port(key: tuple[str, int, str, str]) -> dict[str, Any]:
    name, number, protocol, app_protocol = key
    port: dict[str, Any] = {"port": number, "protocol": protocol}
    if name:
        port["name"] = name
    if app_protocol:
        port["appProtocol"] = app_protocol
    return port
