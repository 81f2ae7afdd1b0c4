"""The lab's network: a bridge in the root namespace, one namespace per node, and each node's CNI configuration.

::

    root namespace                       node-i namespace (ab<id>-node-i)            pod namespace
    ab<id>-br 198.18.0.1/24 ── ab<id>-ni ═ eth0 198.18.0.<10+i>/24
                                           cni0 198.18.<i>.1/24 (CNI bridge) ══════ eth0 198.18.<i>.x/24

Routes: each node reaches every other node's pod range via that node's address; the root namespace has the same
routes on the lab bridge (so the API server can answer pods). Pods get a default route to their node's ``cni0``;
a node has no default route, so nothing leaves the lab. Forwarding is turned on only inside node namespaces, with
reverse-path filtering off there (the node forwards between ``cni0`` and ``eth0``, traffic the kernel's loose or
strict check must not drop). The root namespace forwards nothing: node-to-node traffic crosses the lab bridge at L2.

A dual-stack lab (``topology.ip_family == "dual"``) does the same for IPv6 inside the node namespaces only: each
node's ``eth0`` gets its ``fd00:ab::/64`` address (no DAD: the lab owns the subnet), the node forwards IPv6 (a
sysctl of its own namespace), accepts no router advertisements, and has a route to every other node's IPv6 pod
range via that node's IPv6 address; ``cni0`` gets the IPv6 gateway from the bridge plugin (the second host-local
range). The root namespace's ends of the lab's links (the bridge and each node's veth end) get
``disable_ipv6=1`` (a per-interface sysctl; the host's ``all``/``default`` settings are never touched): they carry
IPv6 frames at L2 between node namespaces but have no IPv6 address, route or router advertisement of their own,
so no IPv6 of the lab can reach the machine's uplink and nothing of the host's IPv6 reaches the lab.

A node added to a running lab (:func:`add_node_network`) gets the same: its namespace and veth on the bridge, its
own routes, a route to its pod range in the root namespace and in every other node (:func:`join_routes`, pure), and
its CNI files.

Every link, namespace, route and directory is noted in the lab's record before it is created, and
:func:`destroy_network` is the record's sweep, so a half-built network is removed the same way as a whole one.

Only one lab's network can be up on a machine at a time: every lab uses the same addresses (the lab bridge's
``198.18.0.1/24`` and the pod ranges routed in the root namespace). :func:`create_network` refuses to start
when those are taken instead of stealing routes from another lab.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ambit.commands import CommandRunner
from ambit.errors import AmbitError
from ambit.lab.cluster.record import Record, sweep
from ambit.lab.network.topology import (
    BRIDGE_ADDRESS,
    CNI_PLUGIN_DIR,
    LOAD_BALANCER_CIDR,
    NODE_NETWORK,
    NODE_NETWORK_V6,
    SERVICE_CIDR,
    SERVICE_CIDR_V6,
    NodeAddresses,
    Topology,
)

NETWORK_NAME = "ambit-lab"
CONFLIST_NAME = "10-ambit-lab.conflist"
CNI_BRIDGE = "cni0"
_PREFIXLEN = NODE_NETWORK.split("/")[1]
_PREFIXLEN_V6 = NODE_NETWORK_V6.split("/")[1]


class LabNetworkError(AmbitError):
    """The lab's network cannot be created (its addresses are in use by another lab)."""


@dataclass(frozen=True, slots=True)
class Route:
    """One route to add: in ``namespace`` (None: the root namespace), to ``dst`` via ``via`` ("" for a route
    straight out of ``dev``)."""

    namespace: str | None
    dst: str
    via: str
    dev: str

    def argv(self, action: str = "add") -> list[str]:
        """``ip route add`` (or ``delete``: only this very route, never another one to the same range)."""
        where = ["-n", self.namespace] if self.namespace else []
        family = ["-6"] if ":" in self.dst else []
        via = ["via", self.via] if self.via else []
        return ["ip", *family, *where, "route", action, self.dst, *via, "dev", self.dev]


def node_routes(topology: Topology, node: NodeAddresses) -> list[Route]:
    """The routes that are ``node``'s own: in it, to every other node's pod range and to the Service range; in the
    root namespace, to its pod range."""
    others = [other for other in topology.all_nodes() if other.index != node.index]
    routes = [
        *(Route(node.netns, other.pod_cidr, other.address, "eth0") for other in others),
        Route(None, node.pod_cidr, node.address, topology.bridge),
        # The node's own connections to Service VIPs are routed before its output hook DNATs them: they need a
        # route. The Service rules reject every VIP they do not serve, so nothing leaves through it.
        Route(node.netns, SERVICE_CIDR, "", "eth0"),
    ]
    if topology.dual_stack:
        # IPv6 only between node namespaces: no root-namespace route (its link ends have no IPv6).
        routes += [Route(node.netns, other.pod_cidr6, other.address6, "eth0") for other in others]
        routes.append(Route(node.netns, SERVICE_CIDR_V6, "", "eth0"))
    return routes


def load_balancer_route(topology: Topology) -> Route:
    """The root namespace's route to the load-balancer range: via the first node (MetalLB's layer-2 mode would
    answer ARP from one node; a route does the same without an agent). Every node's Service rules DNAT those
    addresses, so the first one serves them all."""
    return Route(None, LOAD_BALANCER_CIDR, topology.all_nodes()[0].address, topology.bridge)


def join_routes(topology: Topology, node: NodeAddresses) -> list[Route]:
    """The routes that join ``node`` to a lab whose other nodes are up: its own, and in every other node a route to
    its pod range."""
    others = [other for other in topology.all_nodes() if other.index != node.index]
    joins = [Route(o.netns, node.pod_cidr, node.address, "eth0") for o in others]
    if topology.dual_stack:
        joins += [Route(o.netns, node.pod_cidr6, node.address6, "eth0") for o in others]
    return [*node_routes(topology, node), *joins]


def create_network(topology: Topology, record: Record, runner: CommandRunner) -> None:
    """Build the whole network of ``topology`` (bridge, nodes, routes, CNI files); raises on the first failure."""
    _refuse_if_taken(topology, runner)
    _create_bridge(topology, record, runner)
    nodes = topology.all_nodes()
    for node in nodes:
        _create_node(topology, node, record, runner)
    for node in nodes:
        for route in node_routes(topology, node):
            _add_route(record, runner, route)
    if nodes:
        _add_route(record, runner, load_balancer_route(topology))
    for node in nodes:
        write_node_cni_files(topology, node, record)


def add_node_network(topology: Topology, node: NodeAddresses, record: Record, runner: CommandRunner) -> None:
    """Join ``node`` (already in ``topology``) to the running lab's network: namespace, veth on the bridge, the
    routes of :func:`join_routes`, CNI files. Refuses when its namespace, link or pod range is already in use."""
    _refuse_node_if_taken(topology, node, runner)
    _create_node(topology, node, record, runner)
    for route in join_routes(topology, node):
        _add_route(record, runner, route)
    write_node_cni_files(topology, node, record)


def destroy_network(topology: Topology, record: Record, runner: CommandRunner) -> list[str]:
    """Remove everything the lab created (see :func:`ambit.lab.cluster.record.sweep`); return what was removed."""
    return sweep(topology, record, runner)


def node_exec_argv(topology: Topology, node: str, argv: list[str]) -> list[str]:
    """``argv`` run inside node ``node``'s namespace."""
    found = topology.node_named(node)
    if found is None:
        raise ValueError(f"no node {node!r} in lab {topology.lab_id}")
    return ["ip", "netns", "exec", found.netns, *argv]


# -- links and namespaces -------------------------------------------------------------------------------------


def _refuse_if_taken(topology: Topology, runner: CommandRunner) -> None:
    taken: list[str] = []
    for item in _json(runner.run(["ip", "-j", "-4", "addr", "show", "to", f"{BRIDGE_ADDRESS}/32"]).stdout):
        taken.append(f"{BRIDGE_ADDRESS} is on {item.get('ifname')}")
    cidrs = {node.pod_cidr for node in topology.all_nodes()}
    for route in _json(runner.run(["ip", "-j", "-4", "route", "show"]).stdout):
        if route.get("dst") in cidrs:
            taken.append(f"{route['dst']} is routed via {route.get('dev')}")
    if taken:
        raise LabNetworkError(
            f"lab {topology.lab_id}: the lab's addresses are in use ({'; '.join(taken)}); "
            "is another lab up? (`ambit lab down --dir <its directory>` removes it; `ambit lab down --dead` removes "
            "labs no process runs in, left by a killed run)"
        )


def _refuse_node_if_taken(topology: Topology, node: NodeAddresses, runner: CommandRunner) -> None:
    taken: list[str] = []
    namespaces = runner.run(["ip", "netns", "list"], check=False).text.split()
    if node.netns in namespaces:
        taken.append(f"namespace {node.netns} exists")
    if any(link.get("ifname") == node.root_link for link in _json(runner.run(["ip", "-j", "link", "show"]).stdout)):
        taken.append(f"link {node.root_link} exists")
    for route in _json(runner.run(["ip", "-j", "-4", "route", "show"]).stdout):
        if route.get("dst") == node.pod_cidr:
            taken.append(f"{node.pod_cidr} is routed via {route.get('dev')}")
    if taken:
        raise LabNetworkError(f"lab {topology.lab_id}: cannot add {node.name}: {'; '.join(taken)}")


def _create_bridge(topology: Topology, record: Record, runner: CommandRunner) -> None:
    record.note("link", name=topology.bridge, netns=None)
    runner.run(["ip", "link", "add", topology.bridge, "type", "bridge"])
    runner.run(["ip", "addr", "add", f"{BRIDGE_ADDRESS}/{_PREFIXLEN}", "dev", topology.bridge])
    if topology.dual_stack:
        _disable_ipv6(topology.bridge, runner)
    runner.run(["ip", "link", "set", topology.bridge, "up"])


def _disable_ipv6(link: str, runner: CommandRunner) -> None:
    """No IPv6 on a root-namespace link of the lab: one interface's own sysctl (never ``all`` or ``default``)."""
    runner.run(["sysctl", "-q", "-w", f"net.ipv6.conf.{link}.disable_ipv6=1"])


def _create_node(topology: Topology, node: NodeAddresses, record: Record, runner: CommandRunner) -> None:
    record.note("netns", name=node.netns)
    runner.run(["ip", "netns", "add", node.netns])
    # Before eth0 arrives: a device takes the namespace's defaults when it is created or moved in.
    runner.run(
        [
            *node_exec_argv(topology, node.name, ["sysctl", "-q", "-w"]),
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
            # A pod calling a Service VIP sends its packet back out of cni0: redirects would make the kernel's
            # ICMP rate limit swallow the Service rules' rejects.
            "net.ipv4.conf.all.send_redirects=0",
            "net.ipv4.conf.default.send_redirects=0",
            *(_NODE_IPV6_SYSCTLS if topology.dual_stack else ()),
        ]
    )
    runner.run(["ip", "-n", node.netns, "link", "set", "lo", "up"])
    record.note("link", name=node.root_link, netns=None)
    # The node end is created inside the node's namespace with its final name: no temporary name in the root.
    runner.run(["ip", "link", "add", node.root_link, "type", "veth", "peer", "name", "eth0", "netns", node.netns])
    if topology.dual_stack:
        _disable_ipv6(node.root_link, runner)
    runner.run(["ip", "link", "set", node.root_link, "master", topology.bridge, "up"])
    runner.run(["ip", "-n", node.netns, "addr", "add", f"{node.address}/{_PREFIXLEN}", "dev", "eth0"])
    if topology.dual_stack:
        address6 = f"{node.address6}/{_PREFIXLEN_V6}"
        runner.run(["ip", "-6", "-n", node.netns, "addr", "add", address6, "dev", "eth0", "nodad"])
    runner.run(["ip", "-n", node.netns, "link", "set", "eth0", "up"])


_NODE_IPV6_SYSCTLS = (
    # Inside the node's own namespace only (the sysctl runs under `ip netns exec`): forwarding between cni0 and
    # eth0, no router advertisements (a forwarding node would otherwise ignore them anyway; said explicitly), no
    # redirects (as for IPv4).
    "net.ipv6.conf.all.disable_ipv6=0",
    "net.ipv6.conf.default.disable_ipv6=0",
    "net.ipv6.conf.all.forwarding=1",
    "net.ipv6.conf.default.forwarding=1",
    "net.ipv6.conf.all.accept_ra=0",
    "net.ipv6.conf.default.accept_ra=0",
    "net.ipv6.conf.all.accept_redirects=0",
    "net.ipv6.conf.default.accept_redirects=0",
    # The lab owns its subnets: no duplicate address detection, so cni0's gateway address (made later by the
    # bridge plugin, with these defaults) is usable at once instead of tentative for a second or two.
    "net.ipv6.conf.all.accept_dad=0",
    "net.ipv6.conf.default.accept_dad=0",
)


def _add_route(record: Record, runner: CommandRunner, route: Route) -> None:
    record.note("route", namespace=route.namespace, dst=route.dst, via=route.via)
    runner.run(route.argv())


# -- CNI files ------------------------------------------------------------------------------------------------


def node_conflist(topology: Topology, node: NodeAddresses) -> dict[str, Any]:
    """The node's CNI network: the standard bridge plugin (host-local IPAM on the node's range), then loopback.

    ``loopback`` chained after ``bridge`` receives bridge's result as ``prevResult`` and passes it on unchanged
    (checked with plugins 1.1.1), so one conflist gives the pod both ``eth0`` and a ``lo`` that is up.
    """
    ranges = [[{"subnet": node.pod_cidr, "gateway": node.pod_gateway}]]
    routes = [{"dst": "0.0.0.0/0", "gw": node.pod_gateway}]
    if node.pod_cidr6:
        # A second range: host-local gives the pod one address from each, IPv4 first (kind's dual-stack
        # kindnet does the same); the bridge plugin puts both gateways on cni0.
        ranges.append([{"subnet": node.pod_cidr6, "gateway": node.pod_gateway6}])
        routes.append({"dst": "::/0", "gw": node.pod_gateway6})
    return {
        "cniVersion": "1.0.0",
        "name": NETWORK_NAME,
        "plugins": [
            {
                "type": "bridge",
                "bridge": CNI_BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": ranges,
                    "routes": routes,
                    "dataDir": str(topology.node_dir(node.name) / "ipam"),
                },
            },
            {"type": "loopback"},
        ],
    }


def write_node_cni_files(topology: Topology, node: NodeAddresses, record: Record) -> None:
    """``nodes/<node>/cni/bin`` (links to every standard plugin) and ``cni/net.d/10-ambit-lab.conflist``."""
    node_dir = topology.node_dir(node.name)
    record.note("dir", path=str(node_dir))
    bin_dir, conf_dir = topology.cni_bin_dir(node.name), topology.cni_conf_dir(node.name)
    for directory in (bin_dir, conf_dir, node_dir / "ipam"):
        directory.mkdir(parents=True, exist_ok=True)
    for plugin in sorted(CNI_PLUGIN_DIR.iterdir()):
        link = bin_dir / plugin.name
        if not link.is_symlink():
            link.symlink_to(plugin)
    _write_atomically(conf_dir / CONFLIST_NAME, json.dumps(node_conflist(topology, node), indent=2) + "\n")


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _json(data: bytes) -> list[dict[str, Any]]:
    try:
        parsed = json.loads(data or b"[]")
    except ValueError:
        return []
    return [item for item in parsed if isinstance(item, dict)] if isinstance(parsed, list) else []
