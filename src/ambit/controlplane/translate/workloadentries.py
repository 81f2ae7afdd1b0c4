"""A WorkloadEntry (a VM, a machine outside Kubernetes) becomes a Workload (spec §4.1, istiod's ``workloads.go``).

Rules:

1. Its uid is ``<cluster>/networking.istio.io/WorkloadEntry/<namespace>/<name>``; its one address is
   ``spec.address`` when that is an IP. A DNS name there makes a Workload with that ``hostname`` and no address
   (istiod's ``workloads.go`` does the same), which the node proxy resolves when it picks it, as it does the
   endpoints of a ``resolution: DNS`` ServiceEntry. An entry without an address, or with a Unix socket path or
   something that is neither an IP nor a DNS name there, is left out and reported.
2. Its labels are ``spec.labels`` over ``metadata.labels``; Services and ServiceEntries select it by them
   (:mod:`ambit.controlplane.translate.index`), and its ``spec.ports`` map (service port name → number) overrides
   their target ports.
3. ``tunnel_protocol`` is HBONE when the label ``networking.istio.io/tunnel`` lists ``http`` (the entry runs a
   ztunnel of its own) or the annotation ``ambient.istio.io/redirection`` is ``enabled``.
4. The service account is ``spec.serviceAccount`` (default ``default``); the network ``spec.network``, else the
   cluster's. The workload name is the WorkloadGroup it was registered from (annotation
   ``istio.io/autoRegistrationGroup``), else its own name; canonical name and revision follow the pod rules.
5. ``status`` is UNHEALTHY when a deletion has begun or the ``Healthy`` condition is ``False`` (health checks of
   auto-registered entries write it).
6. The locality is ``spec.locality`` (``region/zone/subzone``,
   :func:`~ambit.controlplane.translate.nodes.split_locality`).
7. A ``spec.weight`` above 0 is the workload's ``capacity`` (its share of its services' traffic); 0 or none
   leaves the default 1. A weight that is not an integer 0..4294967295 is ignored and reported.

:func:`endpoint_workload` and :func:`endpoint_capacity` are shared with the inline endpoints of ServiceEntries,
which follow rules 2 to 4, 6 and 7.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ambit.controlplane.translate.index import ServiceIndex, entry_port_resolver
from ambit.controlplane.translate.nodes import split_locality
from ambit.controlplane.translate.skips import WORKLOAD_ENTRY, ObjectKind, Skipped, skipped
from ambit.controlplane.translate.workloads import (
    NAME_LABELS,
    REDIRECTION_ANNOTATION,
    REVISION_LABELS,
    first_label,
    supports_http_tunnel,
)
from ambit.model.dnsname import check_dns_name
from ambit.model.workload import (
    AddressError,
    HealthStatus,
    IPAddress,
    Locality,
    PortMapping,
    TunnelProtocol,
    Workload,
    parse_ip,
)

MAX_WEIGHT = 0xFFFFFFFF
"""The largest ``weight`` (the wire's ``capacity`` is a uint32)."""
AUTO_REGISTRATION_GROUP = "istio.io/autoRegistrationGroup"

Obj = Mapping[str, Any]


def endpoint_address(
    kind: ObjectKind, obj: Obj, field: str, value: Any, skips: list[Skipped], *, what: str
) -> IPAddress | None:
    """The IP of an endpoint's ``address``, or None after reporting why it cannot be used."""
    text = "" if value is None else str(value)
    if not text:
        reason = "required (an address-less endpoint behind a network gateway is not supported)"
    elif text.startswith("unix://"):
        reason = "Unix domain socket endpoints are not supported"
    else:
        try:
            return parse_ip(text)
        except AddressError:
            reason = (
                f"{text!r} is neither an IP address nor a DNS name"
                if check_dns_name(text)
                else f"{text!r} is not an IP address (a host name endpoint needs resolution DNS)"
            )
    skips.append(skipped(kind, obj, field, f"{reason}; {what} is left out"))
    return None


def endpoint_hostname(value: Any) -> str:
    """``value`` when it is a DNS name and not an IP address (a hostname endpoint), else ``""``."""
    text = "" if value is None else str(value)
    if not text or text.startswith("unix://") or check_dns_name(text):
        return ""
    try:
        parse_ip(text)
    except AddressError:
        return text
    return ""


def endpoint_capacity(kind: ObjectKind, obj: Obj, field: str, value: Any, skips: list[Skipped]) -> int:
    """The capacity a ``weight`` gives (rule 7): the weight when above 0, else 1; a bad one is reported."""
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_WEIGHT:
        skips.append(skipped(kind, obj, field, f"{value!r} is not a weight 0..{MAX_WEIGHT}; it is ignored"))
        return 1
    return value or 1


def endpoint_workload(
    *,
    uid: str,
    name: str,
    namespace: str,
    address: IPAddress | None,
    labels: Mapping[str, Any],
    annotations: Mapping[str, Any],
    network: str,
    service_account: str,
    workload_name: str,
    healthy: bool,
    trust_domain: str,
    cluster_id: str,
    services: Mapping[str, tuple[PortMapping, ...]],
    locality: Locality | None = None,
    hostname: str = "",
    capacity: int = 1,
) -> Workload:
    """A Workload for a WorkloadEntry or an inline ServiceEntry endpoint (rules 3, 4, 6 and 7)."""
    hbone = supports_http_tunnel(labels) or annotations.get(REDIRECTION_ANNOTATION) == "enabled"
    return Workload(
        uid=uid,
        name=name,
        namespace=namespace,
        addresses=(address,) if address is not None else (),
        hostname=hostname,
        network=network,
        tunnel_protocol=TunnelProtocol.HBONE if hbone else TunnelProtocol.NONE,
        trust_domain=trust_domain,
        service_account=service_account or "default",
        canonical_name=first_label(labels, NAME_LABELS) or workload_name,
        canonical_revision=first_label(labels, REVISION_LABELS) or "latest",
        workload_name=workload_name,
        workload_type="pod",
        cluster_id=cluster_id,
        status=HealthStatus.HEALTHY if healthy else HealthStatus.UNHEALTHY,
        services=services,
        locality=locality or Locality(),
        capacity=capacity,
    )


def string_map(value: Any) -> dict[str, str]:
    """A labels-like map with string keys and values; anything else is empty."""
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items() if v is not None}


def translate_workload_entry(
    entry: Obj,
    services: ServiceIndex,
    *,
    cluster_id: str,
    trust_domain: str,
    network: str,
    skips: list[Skipped],
) -> Workload | None:
    """The Workload for a WorkloadEntry, or None (reported to ``skips``) when it cannot be one (rule 1)."""
    meta = entry.get("metadata") or {}
    spec = entry.get("spec") or {}
    name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "")
    if not name or not namespace:
        return None
    hostname = endpoint_hostname(spec.get("address"))
    address = (
        None
        if hostname
        else endpoint_address(
            WORKLOAD_ENTRY, entry, "spec.address", spec.get("address"), skips, what="the WorkloadEntry"
        )
    )
    if address is None and not hostname:
        return None
    labels = {**string_map(meta.get("labels")), **string_map(spec.get("labels"))}
    annotations = string_map(meta.get("annotations"))
    unhealthy = bool(meta.get("deletionTimestamp")) or any(
        c.get("type") == "Healthy" and c.get("status") == "False"
        for c in (entry.get("status") or {}).get("conditions") or ()
    )
    resolve = entry_port_resolver(spec.get("ports") if isinstance(spec.get("ports"), Mapping) else None)
    return endpoint_workload(
        uid=f"{cluster_id}/networking.istio.io/WorkloadEntry/{namespace}/{name}",
        name=name,
        namespace=namespace,
        address=address,
        hostname=hostname,
        labels=labels,
        annotations=annotations,
        network=str(spec.get("network") or network),
        service_account=str(spec.get("serviceAccount") or ""),
        workload_name=annotations.get(AUTO_REGISTRATION_GROUP) or name,
        healthy=not unhealthy,
        trust_domain=trust_domain,
        cluster_id=cluster_id,
        services=services.find_services(namespace, labels, resolve),
        locality=split_locality(spec.get("locality")),
        capacity=endpoint_capacity(WORKLOAD_ENTRY, entry, "spec.weight", spec.get("weight"), skips),
    )
