"""The cells kube-apiserver prints for the plain objects in ``kubectl get`` (pure; the columns are in
:data:`ambit.apiserver.printers.PRINTERS`): core/v1 services, nodes, events (also events.k8s.io/v1), endpoints,
namespaces, config maps, secrets and service accounts; EndpointSlices, Leases, PriorityClasses,
PodDisruptionBudgets and NetworkPolicies.

Invariants (those of :mod:`ambit.apiserver.printers`): a cell function never raises on any JSON-shaped object
(missing or mistyped fields print as kubectl's placeholders), returns one cell per column, and takes time as
``now``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ambit.apiserver.cells import (
    Cell,
    abbreviate,
    age,
    as_int,
    as_list,
    as_map,
    as_maps,
    as_str,
    format_label_selector,
    format_labels,
    name_of,
    parse_timestamp,
    since,
)


def service_cells(svc: Mapping[str, Any], now: float) -> list[Cell]:
    spec = as_map(svc.get("spec"))
    kind = as_str(spec.get("type"), "ClusterIP")
    external_ips = [ip for ip in as_list(spec.get("externalIPs")) if isinstance(ip, str)]
    if kind in ("ClusterIP", "NodePort"):
        external = ",".join(external_ips) or "<none>"
    elif kind == "LoadBalancer":
        ingress = as_maps(as_map(as_map(svc.get("status")).get("loadBalancer")).get("ingress"))
        lb = [as_str(i.get("ip")) or as_str(i.get("hostname")) for i in ingress]
        external = ",".join([a for a in lb if a] + external_ips) or "<pending>"
    elif kind == "ExternalName":
        external = as_str(spec.get("externalName"))
    else:
        external = "<unknown>"
    ports = []
    for port in as_maps(spec.get("ports")):
        protocol = as_str(port.get("protocol"), "TCP")
        node_port = as_int(port.get("nodePort"))
        number = as_int(port.get("port"))
        ports.append(f"{number}:{node_port}/{protocol}" if node_port else f"{number}/{protocol}")
    return [
        name_of(svc),
        kind,
        as_str(spec.get("clusterIP")) or "<none>",
        external,
        ",".join(ports) or "<none>",
        age(svc, now),
        format_labels(spec.get("selector")),
    ]


def node_cells(node: Mapping[str, Any], now: float) -> list[Cell]:
    spec, status = as_map(node.get("spec")), as_map(node.get("status"))
    ready = next((c for c in as_maps(status.get("conditions")) if c.get("type") == "Ready"), None)
    states = ["Unknown" if ready is None else ("Ready" if ready.get("status") == "True" else "NotReady")]
    if spec.get("unschedulable") is True:
        states.append("SchedulingDisabled")
    roles = set()
    for key, value in as_map(as_map(node.get("metadata")).get("labels")).items():
        if key.startswith("node-role.kubernetes.io/") and key != "node-role.kubernetes.io/":
            roles.add(key.removeprefix("node-role.kubernetes.io/"))
        elif key == "kubernetes.io/role" and isinstance(value, str) and value:
            roles.add(value)
    addresses = as_maps(status.get("addresses"))
    info = as_map(status.get("nodeInfo"))

    def address(kind: str) -> str:
        return next((as_str(a.get("address")) for a in addresses if a.get("type") == kind), "") or "<none>"

    return [
        name_of(node),
        ",".join(states),
        ",".join(sorted(roles)) or "<none>",
        age(node, now),
        as_str(info.get("kubeletVersion")),
        address("InternalIP"),
        address("ExternalIP"),
        as_str(info.get("osImage")) or "<unknown>",
        as_str(info.get("kernelVersion")) or "<unknown>",
        as_str(info.get("containerRuntimeVersion")) or "<unknown>",
    ]


def event_cells(event: Mapping[str, Any], now: float) -> list[Cell]:
    """core/v1 Event; events.k8s.io/v1 events are mapped onto this shape by :func:`events_v1_cells`."""
    first = since(event.get("firstTimestamp"), now)
    if parse_timestamp(event.get("firstTimestamp")) is None:
        first = since(event.get("eventTime"), now)
    last = since(event.get("lastTimestamp"), now)
    if parse_timestamp(event.get("lastTimestamp")) is None:
        last = first
    count = as_int(event.get("count"))
    series = event.get("series")
    if isinstance(series, Mapping):
        last = since(series.get("lastObservedTime"), now)
        count = as_int(series.get("count"))
    elif count == 0:
        count = 1  # a singleton event in the new API carries no count
    involved = as_map(event.get("involvedObject"))
    target = as_str(involved.get("kind")).lower()
    if as_str(involved.get("name")):
        target = f"{target}/{as_str(involved.get('name'))}"
    source = as_map(event.get("source"))
    component = as_str(source.get("component")) or as_str(event.get("reportingComponent"))
    host = as_str(source.get("host")) or as_str(event.get("reportingInstance"))
    return [
        last,
        as_str(event.get("type")),
        as_str(event.get("reason")),
        target,
        as_str(involved.get("fieldPath")),
        f"{component}, {host}" if host else component,
        as_str(event.get("message")).strip(),
        first,
        count,
        name_of(event),
    ]


def events_v1_cells(event: Mapping[str, Any], now: float) -> list[Cell]:
    core = {
        "metadata": event.get("metadata"),
        "type": event.get("type"),
        "reason": event.get("reason"),
        "involvedObject": event.get("regarding"),
        "message": event.get("note"),
        "source": event.get("deprecatedSource"),
        "reportingComponent": event.get("reportingController"),
        "reportingInstance": event.get("reportingInstance"),
        "firstTimestamp": event.get("deprecatedFirstTimestamp"),
        "lastTimestamp": event.get("deprecatedLastTimestamp"),
        "count": event.get("deprecatedCount"),
        "eventTime": event.get("eventTime"),
        "series": event.get("series"),
    }
    return event_cells(core, now)


def endpoints_cells(ep: Mapping[str, Any], now: float) -> list[Cell]:
    pairs: list[str] = []
    for subset in as_maps(ep.get("subsets")):
        ports = [as_int(p.get("port")) for p in as_maps(subset.get("ports"))]
        for address in as_maps(subset.get("addresses")):
            ip = as_str(address.get("ip"))
            pairs.extend([f"{ip}:{port}" for port in ports] if ports else [ip])
    return [name_of(ep), abbreviate(pairs), age(ep, now)]


def endpoint_slice_cells(eps: Mapping[str, Any], now: float) -> list[Cell]:
    ports = []
    for port in as_maps(eps.get("ports")):
        number = port.get("port")
        ports.append(str(as_int(number)) if number is not None else as_str(port.get("name")) or "*")
    addresses = [a for e in as_maps(eps.get("endpoints")) for a in as_list(e.get("addresses")) if isinstance(a, str)]
    return [
        name_of(eps),
        as_str(eps.get("addressType")),
        abbreviate(ports, empty="<unset>"),
        abbreviate(addresses, empty="<unset>"),
        age(eps, now),
    ]


def namespace_cells(ns: Mapping[str, Any], now: float) -> list[Cell]:
    return [name_of(ns), as_str(as_map(ns.get("status")).get("phase")), age(ns, now)]


def config_map_cells(cm: Mapping[str, Any], now: float) -> list[Cell]:
    return [name_of(cm), len(as_map(cm.get("data"))) + len(as_map(cm.get("binaryData"))), age(cm, now)]


def secret_cells(secret: Mapping[str, Any], now: float) -> list[Cell]:
    kind = as_str(secret.get("type"), "Opaque")
    return [name_of(secret), kind, len(as_map(secret.get("data"))), age(secret, now)]


def service_account_cells(sa: Mapping[str, Any], now: float) -> list[Cell]:
    return [name_of(sa), len(as_list(sa.get("secrets"))), age(sa, now)]


def lease_cells(lease: Mapping[str, Any], now: float) -> list[Cell]:
    return [name_of(lease), as_str(as_map(lease.get("spec")).get("holderIdentity")), age(lease, now)]


def priority_class_cells(pc: Mapping[str, Any], now: float) -> list[Cell]:
    policy = as_str(pc.get("preemptionPolicy"), "PreemptLowerPriority")
    return [name_of(pc), as_int(pc.get("value")), pc.get("globalDefault") is True, age(pc, now), policy]


def pod_disruption_budget_cells(pdb: Mapping[str, Any], now: float) -> list[Cell]:
    spec, status = as_map(pdb.get("spec")), as_map(pdb.get("status"))

    def shown(value: Any) -> str:
        return "N/A" if value is None or isinstance(value, dict | list | bool) else str(value)

    return [
        name_of(pdb),
        shown(spec.get("minAvailable")),
        shown(spec.get("maxUnavailable")),
        as_int(status.get("disruptionsAllowed")),
        age(pdb, now),
    ]


def network_policy_cells(policy: Mapping[str, Any], now: float) -> list[Cell]:
    return [name_of(policy), format_label_selector(as_map(policy.get("spec")).get("podSelector")), age(policy, now)]
