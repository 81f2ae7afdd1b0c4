"""The topology model behind ``ambit dashboard``: who talks to whom, from the proxies' flows and config dumps.

Theory of operation
-------------------
The dashboard's sources (:mod:`ambit.cli.dashboard`) feed this module two things, and it does no I/O itself:

- flows (:class:`~ambit.telemetry.flows.Flow`, as the proxies' ``/flows`` pages give them) into a
  :class:`FlowStore`, a bounded buffer of the most recent ones;
- what the proxies know (their ``config_dump``: workloads, services, policies) into an :class:`Inventory` with
  :func:`read_inventory`, merged across proxies with :meth:`Inventory.merge`.

:func:`build_graph` turns both into a :class:`Graph` at a given ``now`` over the last ``window`` seconds, and
:func:`edge_flows` lists the flows of one edge. Rules:

1. A flow's source is its source workload (``wl:<namespace>/<name>``) when the proxy named it, else its source
   address (``ip:<address without port>``). Its destination is the destination workload, else the destination
   service (``svc:<hostname>``), else the destination address. Those ids are the graph's node ids.
2. Every flow in the window counts on exactly one edge, (source, destination): the sum of the edges' ``flows`` is the
   number of flows in the window, and each edge's ``mtls + plaintext == flows`` and ``allowed + denied + failed ==
   flows``. A connection between meshed pods is reported by both ends' node proxies: each report counts (the edge
   says how many reports, not how many connections).
3. The nodes are every workload and service of the inventory (they show even without traffic) and every endpoint
   of an edge the inventory does not know (``known`` false: a pod of another cluster, a plaintext client).
4. A workload node's policies are those that apply to it as the node proxy applies them: scope ``GLOBAL`` (from
   the root namespace), scope ``NAMESPACE`` in its namespace, and those its ``authorizationPolicies`` name.
5. Bounded: a store keeps at most ``capacity`` flows (the oldest dropped first); an inventory at most
   :data:`MAX_ITEMS` workloads, services and policies; an edge lists at most ``limit`` flows, newest first.
6. An edge's rates (requests, bytes and connections per second, 5xx ratio, mTLS) come from the proxies' metrics
   (:mod:`ambit.telemetry.rates`), not from the flows (a store drops flows; counters do not). An edge the metrics
   name and no flow in the window does is listed with ``flows`` zero and its rates, so rule 2's sums still hold.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ambit.errors import AmbitError
from ambit.telemetry.flows import Flow, flow_to_json
from ambit.telemetry.rates import EdgeRate

DEFAULT_WINDOW = 300.0
"""Seconds of flows the graph shows (five minutes)."""
DEFAULT_CAPACITY = 20_000
MAX_ITEMS = 10_000
"""Most workloads (and services, and policies) an inventory keeps."""
MAX_EDGE_FLOWS = 200


class TopologyError(AmbitError):
    """A config dump that cannot be read as an inventory: says which field was wrong."""


@dataclass(frozen=True, slots=True)
class WorkloadInfo:
    id: str
    name: str
    namespace: str
    identity: str
    node: str
    waypoint: str
    protocol: str
    addresses: tuple[str, ...]
    policy_refs: tuple[str, ...]
    """The ``namespace/name`` of the workload-selector policies the workload names (rule 4)."""
    workload_name: str = ""
    """The owner's name (a Deployment's), which the metrics' ``*_workload`` labels carry (rule 6)."""


@dataclass(frozen=True, slots=True)
class ServiceInfo:
    id: str
    name: str
    namespace: str
    hostname: str
    vips: tuple[str, ...]
    waypoint: str


@dataclass(frozen=True, slots=True)
class PolicyInfo:
    name: str
    namespace: str
    scope: str
    action: str

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Inventory:
    workloads: tuple[WorkloadInfo, ...] = ()
    services: tuple[ServiceInfo, ...] = ()
    policies: tuple[PolicyInfo, ...] = ()

    def merge(self, other: Inventory) -> Inventory:
        """Both inventories; an id both hold keeps this one's entry."""
        workloads = {w.id: w for w in (*other.workloads, *self.workloads)}
        services = {s.id: s for s in (*other.services, *self.services)}
        policies = {p.ref: p for p in (*other.policies, *self.policies)}
        return Inventory(
            tuple(sorted(workloads.values(), key=lambda w: w.id))[:MAX_ITEMS],
            tuple(sorted(services.values(), key=lambda s: s.id))[:MAX_ITEMS],
            tuple(sorted(policies.values(), key=lambda p: p.ref))[:MAX_ITEMS],
        )


def _items(dump: Mapping[str, Any], section: str) -> list[Mapping[str, Any]]:
    value = dump.get(section, [])
    if not isinstance(value, list):
        raise TopologyError(f"config_dump {section} is not a list")
    if len(value) > MAX_ITEMS:
        raise TopologyError(f"config_dump {section} holds more than {MAX_ITEMS} entries")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise TopologyError(f"config_dump {section}[{i}] is not an object")
    return value


def _text(item: Mapping[str, Any], key: str, where: str, default: str = "") -> str:
    value = item.get(key, default)
    if not isinstance(value, str) or len(value) > 1024:
        raise TopologyError(f"config_dump {where}.{key} is not a string of at most 1024 characters")
    return value


def _texts(item: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = item.get(key, [])
    if not isinstance(value, list) or len(value) > 64:
        raise TopologyError(f"config_dump {where}.{key} is not a list of at most 64 strings")
    return tuple(_text({key: v}, key, where) for v in value)


def _waypoint(item: Mapping[str, Any], where: str) -> str:
    waypoint = item.get("waypoint")
    if waypoint is None:
        return ""
    if not isinstance(waypoint, dict):
        raise TopologyError(f"config_dump {where}.waypoint is not an object")
    if "hostname" in waypoint:
        return _text(waypoint, "hostname", f"{where}.waypoint")
    return _text(waypoint, "address", f"{where}.waypoint").rpartition("/")[2]


def read_inventory(dump: Mapping[str, Any]) -> Inventory:
    """The workloads, services and policies of one proxy's ``config_dump`` (a waypoint's dump has none: empty)."""
    trust_default = ""
    config = dump.get("config")
    if isinstance(config, dict):
        trust_default = _text(config, "trustDomain", "config")
    workloads = []
    for i, item in enumerate(_items(dump, "workloads")):
        where = f"workloads[{i}]"
        name, namespace = _text(item, "name", where), _text(item, "namespace", where)
        protocol = _text(item, "protocol", where, "TCP")
        account = _text(item, "serviceAccount", where, "default") or "default"
        trust = _text(item, "trustDomain", where, trust_default) or trust_default or "cluster.local"
        identity = f"spiffe://{trust}/ns/{namespace}/sa/{account}" if protocol == "HBONE" else ""
        workloads.append(
            WorkloadInfo(
                id=f"wl:{namespace}/{name}",
                name=name,
                namespace=namespace,
                identity=identity,
                node=_text(item, "node", where),
                waypoint=_waypoint(item, where),
                protocol=protocol,
                addresses=_texts(item, "workloadIps", where),
                policy_refs=_texts(item, "authorizationPolicies", where),
                workload_name=_text(item, "workloadName", where),
            )
        )
    services = []
    for i, item in enumerate(_items(dump, "services")):
        where = f"services[{i}]"
        hostname = _text(item, "hostname", where)
        services.append(
            ServiceInfo(
                id=f"svc:{hostname}",
                name=_text(item, "name", where),
                namespace=_text(item, "namespace", where),
                hostname=hostname,
                vips=tuple(v.rpartition("/")[2] for v in _texts(item, "vips", where)),
                waypoint=_waypoint(item, where),
            )
        )
    policies = [
        PolicyInfo(
            name=_text(item, "name", f"policies[{i}]"),
            namespace=_text(item, "namespace", f"policies[{i}]"),
            scope=_text(item, "scope", f"policies[{i}]", "WORKLOAD_SELECTOR"),
            action=_text(item, "action", f"policies[{i}]", "ALLOW"),
        )
        for i, item in enumerate(_items(dump, "policies"))
    ]
    return Inventory().merge(Inventory(tuple(workloads), tuple(services), tuple(policies)))


class FlowStore:
    """The most recent flows of every source, at most ``capacity`` of them (rule 5)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("a flow store holds at least one flow")
        self._flows: collections.deque[Flow] = collections.deque(maxlen=capacity)

    def add(self, flows: Iterable[Flow]) -> None:
        self._flows.extend(flows)

    def recent(self, now: float, window: float) -> list[Flow]:
        """The flows that ended in ``[now - window, now]``, in the order they were added."""
        since = now - window
        return [f for f in self._flows if since <= f.time <= now]

    def __len__(self) -> int:
        return len(self._flows)


def _address(addr: str) -> str:
    """``ip:port`` or ``[v6]:port`` → the address alone."""
    if addr.startswith("["):
        return addr[1:].partition("]")[0]
    host, sep, port = addr.rpartition(":")
    return host if sep and port.isdigit() and ":" not in host else addr


def source_id(flow: Flow) -> str:
    if flow.src_workload:
        return f"wl:{flow.src_namespace}/{flow.src_workload}"
    return f"ip:{_address(flow.src_addr) or '?'}"


def destination_id(flow: Flow) -> str:
    if flow.dst_workload:
        return f"wl:{flow.dst_namespace}/{flow.dst_workload}"
    if flow.dst_service:
        return f"svc:{flow.dst_service}"
    return f"ip:{_address(flow.dst_addr) or '?'}"


@dataclass(slots=True)
class EdgeStats:
    src: str
    dst: str
    flows: int = 0
    bytes: int = 0
    mtls: int = 0
    plaintext: int = 0
    allowed: int = 0
    denied: int = 0
    failed: int = 0
    last: float = 0.0
    rate: EdgeRate | None = None
    """The edge's rates from the proxies' metrics (rule 6), if any proxy's metrics name it."""

    def add(self, flow: Flow) -> None:
        self.flows += 1
        self.bytes += flow.bytes_sent + flow.bytes_recv
        if flow.mtls:
            self.mtls += 1
        else:
            self.plaintext += 1
        if flow.verdict == "denied":
            self.denied += 1
        elif flow.verdict == "failed":
            self.failed += 1
        else:
            self.allowed += 1
        self.last = max(self.last, flow.time)


@dataclass(frozen=True, slots=True)
class Node:
    id: str
    kind: str
    """``workload``, ``service`` or ``address``."""
    name: str
    namespace: str = ""
    known: bool = True
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Graph:
    nodes: tuple[Node, ...]
    edges: tuple[EdgeStats, ...]
    window: float
    now: float


def policies_of(workload: WorkloadInfo, policies: Iterable[PolicyInfo]) -> list[str]:
    """Rule 4: ``namespace/name (ACTION)`` of each policy that applies to ``workload``."""
    named = set(workload.policy_refs)
    return [
        f"{p.ref} ({p.action})"
        for p in policies
        if p.scope == "GLOBAL" or (p.scope == "NAMESPACE" and p.namespace == workload.namespace) or p.ref in named
    ]


def _unknown(node_id: str) -> Node:
    kind, _, rest = node_id.partition(":")
    if kind == "wl":
        namespace, _, name = rest.partition("/")
        return Node(node_id, "workload", name, namespace, known=False)
    if kind == "svc":
        return Node(node_id, "service", rest, known=False)
    return Node(node_id, "address", rest, known=False)


def build_graph(
    flows: Iterable[Flow],
    inventory: Inventory,
    *,
    now: float,
    window: float = DEFAULT_WINDOW,
    rates: Iterable[EdgeRate] = (),
) -> Graph:
    """Rules 1 to 4 and 6: the nodes and the edges of the flows that ended in the last ``window`` seconds, with the
    edges' rates."""
    edges: dict[tuple[str, str], EdgeStats] = {}
    since = now - window
    for flow in flows:
        if not since <= flow.time <= now:
            continue
        key = (source_id(flow), destination_id(flow))
        stats = edges.get(key)
        if stats is None:
            stats = edges[key] = EdgeStats(*key)
        stats.add(flow)
    owners: dict[str, list[str]] = {}
    for wl in inventory.workloads:
        if wl.workload_name and wl.workload_name != wl.name:
            owners.setdefault(f"wl:{wl.namespace}/{wl.workload_name}", []).append(wl.id)
    pod_of = {owner: ids[0] for owner, ids in owners.items() if len(ids) == 1}
    for rate in rates:
        key = (pod_of.get(rate.src, rate.src), pod_of.get(rate.dst, rate.dst))
        stats = edges.get(key)
        if stats is None:
            stats = edges[key] = EdgeStats(*key)
        stats.rate = rate
    nodes: dict[str, Node] = {}
    for wl in inventory.workloads:
        details = {
            "identity": wl.identity,
            "node": wl.node,
            "waypoint": wl.waypoint,
            "protocol": wl.protocol,
            "addresses": list(wl.addresses),
            "policies": policies_of(wl, inventory.policies),
        }
        nodes[wl.id] = Node(wl.id, "workload", wl.name, wl.namespace, details=details)
    for svc in inventory.services:
        details = {"hostname": svc.hostname, "vips": list(svc.vips), "waypoint": svc.waypoint}
        nodes.setdefault(svc.id, Node(svc.id, "service", svc.name, svc.namespace, details=details))
    for src, dst in edges:
        for node_id in (src, dst):
            if node_id not in nodes:
                nodes[node_id] = _unknown(node_id)
    ordered = sorted(edges.values(), key=lambda e: (e.src, e.dst))
    return Graph(tuple(sorted(nodes.values(), key=lambda n: n.id)), tuple(ordered), window, now)


def edge_flows(
    flows: Iterable[Flow],
    src: str,
    dst: str,
    *,
    now: float,
    window: float = DEFAULT_WINDOW,
    limit: int = MAX_EDGE_FLOWS,
) -> list[Flow]:
    """Rule 5: the flows of edge (``src``, ``dst``) in the window, newest first, at most ``limit``."""
    since = now - window
    chosen = [f for f in flows if since <= f.time <= now and source_id(f) == src and destination_id(f) == dst]
    chosen.sort(key=lambda f: (f.time, f.seq), reverse=True)
    return chosen[:limit]


def graph_to_json(graph: Graph) -> dict[str, Any]:
    return {
        "now": graph.now,
        "window": graph.window,
        "nodes": [
            {
                "id": n.id,
                "kind": n.kind,
                "name": n.name,
                "namespace": n.namespace,
                "known": n.known,
                "details": dict(n.details),
            }
            for n in graph.nodes
        ],
        "edges": [
            {
                "src": e.src,
                "dst": e.dst,
                "flows": e.flows,
                "bytes": e.bytes,
                "mtls": e.mtls,
                "plaintext": e.plaintext,
                "allowed": e.allowed,
                "denied": e.denied,
                "failed": e.failed,
                "last": e.last,
                "rate": e.rate.to_json() if e.rate is not None else None,
            }
            for e in graph.edges
        ],
    }


def flows_to_json(flows: Iterable[Flow]) -> list[dict[str, Any]]:
    return [flow_to_json(f) for f in flows]


__all__ = [
    "DEFAULT_WINDOW",
    "EdgeStats",
    "FlowStore",
    "Graph",
    "Inventory",
    "Node",
    "PolicyInfo",
    "ServiceInfo",
    "TopologyError",
    "WorkloadInfo",
    "build_graph",
    "destination_id",
    "edge_flows",
    "flows_to_json",
    "graph_to_json",
    "policies_of",
    "read_inventory",
    "source_id",
]
