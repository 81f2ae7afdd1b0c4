"""A Kubernetes Service becomes a Workload API Service (spec §4.1).

Rules:

1. The hostname is ``<name>.<namespace>.svc.<domain>``; the services map of a workload is keyed by
   ``<namespace>/<hostname>`` (:func:`service_key`).
2. VIPs are ``spec.clusterIPs`` (or the older ``spec.clusterIP``), each on the cluster's network; a headless
   Service (``None``) and one without an address yet have none. Unparsable addresses are left out and reported.
3. Each port maps ``port`` to a numeric ``targetPort``; a named ``targetPort`` maps to 0, which tells the node proxy
   to look the number up in each workload's own port map. A missing ``targetPort`` means the same as ``port``.
   A port number given twice (53/TCP and 53/UDP) keeps its first mapping: the map is keyed by number.
4. ``ExternalName`` Services carry no endpoints of the mesh and are not translated.
5. The cluster's network is the ``topology.istio.io/network`` label of the system namespace (``istio-system``),
   or "" (the default network) without one.
6. Every Kubernetes Service is ``canonical`` (it is the authority for its hostname, as in istiod).
7. ``ip_families`` follows ``spec.ipFamilies``: two families are DUAL, one IPv4 or IPv6 is IPV4_ONLY or IPV6_ONLY,
   none (or anything else) AUTOMATIC.
8. Each port's ``app_protocol`` comes from its ``appProtocol``, name and number
   (:mod:`ambit.model.port_protocols`).
9. The ``networking.istio.io/exportTo`` annotation (without one, the mesh config's ``defaultServiceExportTo``)
   gives the visibility (:mod:`ambit.controlplane.translate.visibility`); a namespace-visible Service stays
   canonical.
10. ``spec.internalTrafficPolicy``, ``spec.trafficDistribution``, the ``networking.istio.io/traffic-distribution``
    annotation of the Service or else of its namespace, and ``spec.publishNotReadyAddresses`` give the load
    balancing (:mod:`ambit.controlplane.translate.traffic_distribution`); an annotation value not known there is
    reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ambit.controlplane.translate.skips import SERVICE, Skipped, skipped
from ambit.controlplane.translate.traffic_distribution import ANNOTATION_FIELD, service_load_balancing
from ambit.controlplane.translate.visibility import EXPORT_TO_ANNOTATION, export_visibility
from ambit.model.port_protocols import kube_port_app_protocol
from ambit.model.workload import (
    AddressError,
    IPAddress,
    IPFamilies,
    NetworkAddress,
    PortMapping,
    Service,
    parse_ip,
)

SYSTEM_NAMESPACE = "istio-system"
NETWORK_LABEL = "topology.istio.io/network"


def hostname(name: str, namespace: str, domain: str) -> str:
    return f"{name}.{namespace}.svc.{domain}"


def service_key(namespace: str, host: str) -> str:
    """The key of a workload's services map: ``<namespace>/<hostname>``."""
    return f"{namespace}/{host}"


def service_network(namespaces: Iterable[Mapping[str, Any]]) -> str:
    """The cluster's network (rule 5)."""
    for ns in namespaces:
        meta = ns.get("metadata") or {}
        if meta.get("name") == SYSTEM_NAMESPACE:
            return str((meta.get("labels") or {}).get(NETWORK_LABEL, ""))
    return ""


def port_number(value: Any) -> int | None:
    """A port given as an int (or a string of digits) in 1..65535, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, int) and 0 < value < 65536:
        return value
    return None


def target_port(port: Mapping[str, Any], number: int) -> Any:
    """A Service port's ``targetPort`` as given (a number or a name), or ``number`` when it is not given."""
    target = port.get("targetPort")
    return number if target in (None, "", 0) else target


def translate_service(
    svc: Mapping[str, Any],
    *,
    domain: str,
    network: str,
    skips: list[Skipped] | None = None,
    default_export_to: tuple[str, ...] | None = None,
    namespace_annotations: Mapping[str, Any] | None = None,
) -> Service | None:
    """The Workload API Service for a Kubernetes Service, or None for one that has none (rule 4, no name).

    Unusable VIPs are reported to ``skips`` (rule 2); ``default_export_to`` is the mesh config's
    ``defaultServiceExportTo`` (rule 9); ``namespace_annotations`` are the annotations of the Service's namespace
    (rule 10).
    """
    meta, spec = svc.get("metadata") or {}, svc.get("spec") or {}
    name, namespace = str(meta.get("name", "")), str(meta.get("namespace", ""))
    if not name or not namespace or spec.get("type") == "ExternalName":
        return None
    ports: dict[int, PortMapping] = {}
    for port in spec.get("ports") or ():
        number = port_number(port.get("port"))
        if number is None or number in ports:
            continue
        ports[number] = PortMapping(
            number, port_number(target_port(port, number)) or 0, kube_port_app_protocol(port, number)
        )
    export = (meta.get("annotations") or {}).get(EXPORT_TO_ANNOTATION)
    balancing = service_load_balancing(svc, namespace_annotations or {})
    if balancing.problem and skips is not None:
        skips.append(skipped(SERVICE, svc, ANNOTATION_FIELD, balancing.problem))
    return Service(
        name=name,
        namespace=namespace,
        hostname=hostname(name, namespace, domain),
        visibility=export_visibility(
            SERVICE,
            svc,
            f"metadata.annotations[{EXPORT_TO_ANNOTATION!r}]",
            export,
            [] if skips is None else skips,
            default=default_export_to,
        ),
        vips=tuple(NetworkAddress(network, ip) for ip in _cluster_ips(svc, [] if skips is None else skips)),
        ports=tuple(ports.values()),
        canonical=True,
        ip_families=ip_families(spec.get("ipFamilies")),
        load_balancing_mode=balancing.mode,
        routing_preference=balancing.routing_preference,
        health_policy=balancing.health_policy,
    )


def ip_families(value: Any) -> IPFamilies:
    """``spec.ipFamilies`` as the Workload API says it (rule 7)."""
    families = list(value) if isinstance(value, list) else []
    if len(families) == 2:
        return IPFamilies.DUAL
    if families == ["IPv4"]:
        return IPFamilies.IPV4_ONLY
    if families == ["IPv6"]:
        return IPFamilies.IPV6_ONLY
    return IPFamilies.AUTOMATIC


def _cluster_ips(svc: Mapping[str, Any], skips: list[Skipped]) -> list[IPAddress]:
    spec = svc.get("spec") or {}
    if spec.get("clusterIPs"):
        raw = [(f"spec.clusterIPs[{i}]", value) for i, value in enumerate(spec["clusterIPs"])]
    else:
        raw = [("spec.clusterIP", spec["clusterIP"])] if spec.get("clusterIP") else []
    out: list[IPAddress] = []
    for field, value in raw:
        if value in ("", "None"):
            continue
        try:
            out.append(parse_ip(str(value)))
        except AddressError as exc:
            skips.append(skipped(SERVICE, svc, field, f"{exc}; the VIP is left out"))
    return out
