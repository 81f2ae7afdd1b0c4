"""The file form of a local config's workloads and services: the dicts :func:`~ambit.model.localconfig.
render_local_config` writes out, and what the admin ``/config_dump`` shows.

Theory of operation: :func:`workload_to_dict` and :func:`service_to_dict` write every field, defaults included, in
the shape :mod:`ambit.model.localconfig` reads (port maps keep int keys: servicePort → targetPort, or ``{targetPort,
appProtocol}`` for a port with an application protocol, rule 4). The newer fields (rules 9-14: a waypoint,
``ingressUseWaypoint``, a workload's ``hostname``, ``capacity`` and ``applicationTunnel``, a service's
``visibility``, ``weightedWaypoints``, ``loadBalancingMode`` and ``routingPreferences``) are written only when set,
so files written before them render the same. Rule numbers are :mod:`ambit.model.localconfig`'s.
"""

from __future__ import annotations

from typing import Any

from ambit.model.errors import LocalConfigError
from ambit.model.workload import (
    AppProtocol,
    GatewayAddress,
    LoadBalancingMode,
    NamespacedHostname,
    PortMapping,
    Service,
    TunnelProtocol,
    Visibility,
    Workload,
)

__all__ = ["TUNNEL_PROTOCOLS", "service_to_dict", "waypoint_to_dict", "workload_to_dict"]

TUNNEL_PROTOCOLS = {"HBONE": TunnelProtocol.HBONE, "TCP": TunnelProtocol.NONE}
_PROTOCOL_NAMES = {value: key for key, value in TUNNEL_PROTOCOLS.items()}


def _port_map(ports: tuple[PortMapping, ...]) -> dict[int, int | dict[str, Any]]:
    mapped: dict[int, int | dict[str, Any]] = {
        mapping.service_port: (
            mapping.target_port
            if mapping.app_protocol is AppProtocol.UNKNOWN
            else {"targetPort": mapping.target_port, "appProtocol": mapping.app_protocol.value}
        )
        for mapping in ports
    }
    if len(mapped) != len(ports):
        raise LocalConfigError(f"cannot render ports {ports!r}: a service port is given twice")
    return mapped


def waypoint_to_dict(waypoint: GatewayAddress) -> dict[str, Any]:
    """The file form of a waypoint's address (rule 9)."""
    destination = waypoint.destination
    if isinstance(destination, NamespacedHostname):
        where: dict[str, Any] = {"hostname": destination.hostname, "namespace": destination.namespace}
    else:
        where = {"address": str(destination)}
    return {**where, "hboneMtlsPort": waypoint.hbone_mtls_port}


def workload_to_dict(workload: Workload) -> dict[str, Any]:
    """The file form of one workload, every field included but an unset waypoint (port maps have int keys)."""
    out: dict[str, Any] = {
        "uid": workload.uid,
        "name": workload.name,
        "namespace": workload.namespace,
        "workloadIps": [str(ip) for ip in workload.addresses],
        "protocol": _PROTOCOL_NAMES[workload.tunnel_protocol],
        "serviceAccount": workload.service_account,
        "trustDomain": workload.trust_domain,
        "node": workload.node,
        "network": workload.network,
        "canonicalName": workload.canonical_name,
        "canonicalRevision": workload.canonical_revision,
        "workloadName": workload.workload_name,
        "workloadType": workload.workload_type,
        "clusterId": workload.cluster_id,
        "status": workload.status.value,
        "services": {key: _port_map(ports) for key, ports in workload.services.items()},
        "authorizationPolicies": list(workload.authorization_policies),
        "networkMode": workload.network_mode.value,
        "locality": {
            "region": workload.locality.region,
            "zone": workload.locality.zone,
            "subzone": workload.locality.subzone,
        },
    }
    if workload.waypoint is not None:
        out["waypoint"] = waypoint_to_dict(workload.waypoint)
    if workload.hostname:
        out["hostname"] = workload.hostname
    if workload.capacity != 1:
        out["capacity"] = workload.capacity
    if workload.application_tunnel is not None:
        tunnel = workload.application_tunnel
        out["applicationTunnel"] = {"protocol": tunnel.protocol.value, "port": tunnel.port}
    return out


def service_to_dict(service: Service) -> dict[str, Any]:
    """The file form of one service (port maps have int keys); waypoint fields only when set (rule 9)."""
    out: dict[str, Any] = {
        "name": service.name,
        "namespace": service.namespace,
        "hostname": service.hostname,
        "vips": [str(vip) for vip in service.vips],
        "ports": _port_map(service.ports),
        "subjectAltNames": list(service.subject_alt_names),
        "healthPolicy": service.health_policy.value,
        "canonical": service.canonical,
        "ipFamilies": service.ip_families.value,
    }
    if service.waypoint is not None:
        out["waypoint"] = waypoint_to_dict(service.waypoint)
    if service.ingress_use_waypoint:
        out["ingressUseWaypoint"] = True
    if service.visibility is not Visibility.PUBLIC:
        out["visibility"] = service.visibility.value
    if service.weighted_waypoints:
        out["weightedWaypoints"] = [
            {"destination": waypoint_to_dict(w.destination), "weight": w.weight} for w in service.weighted_waypoints
        ]
    if service.load_balancing_mode is not LoadBalancingMode.UNSPECIFIED:
        out["loadBalancingMode"] = service.load_balancing_mode.value
    if service.routing_preference:
        out["routingPreferences"] = [scope.value for scope in service.routing_preference]
    return out
