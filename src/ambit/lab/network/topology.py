"""The lab's addresses, names and file layout (pure; no I/O).

Addresses (all from 198.18.0.0/15, never the machine's own ranges):

- lab bridge in the root namespace: ``198.18.0.1/24``; the API server listens there.
- node ``i`` (1-based, named ``node-<i>``): ``198.18.0.<10+i>/24`` on ``eth0`` inside its namespace.
- pods of node ``i``: ``198.18.<i>.0/24``, gateway ``198.18.<i>.1`` on the node's ``cni0`` bridge.
- Services: cluster IPs from ``198.19.0.0/16``; ``198.19.0.10`` is cluster DNS's (the ``kube-dns`` Service, as
  kubeadm takes the tenth address), which the API server never hands out on its own.
- dual-stack labs (``ambit lab up --ip-family dual``, kind's ``networking.ipFamily: dual``) add IPv6 from the ULA
  range ``fd00:ab::/32``: node ``i`` gets ``fd00:ab::<10+i>/64`` on ``eth0`` beside its IPv4 address, its pods
  ``fd00:ab:0:<i>::/64`` (gateway ``fd00:ab:0:<i>::1`` on ``cni0``) as a second host-local range, and Services a
  second cluster IP from ``fd00:ab:ffff::/108``. IPv6 lives only inside node and pod namespaces: the root
  namespace's ends of the lab's links have IPv6 turned off (per interface), and no IPv6 route is added there.
- LoadBalancer Services: ``198.18.0.224/28`` on the lab bridge's subnet (above every node address), assigned by
  the lab's load balancer and routed from the root namespace to the first node, whose Service rules DNAT them.

Routing: every node has a route to every other node's pod range via that node's address, and the root namespace
has the same routes (so the API server can answer pods). No namespace gets a default route towards the lab bridge,
and forwarding is turned on only inside node namespaces: nothing of the lab can reach the machine's uplink.

Names carry the lab's id (4 hex digits, random per lab) so that two labs, or a lab and a test, never collide, and
so that ``ambit lab down`` can sweep by prefix: ``ab<id>-br`` (bridge), ``ab<id>-n<i>`` (root end of node ``i``'s
veth), ``ab<id>-node-<i>`` (node namespace), ``ab<id>-p-<pod uid prefix>`` (pod namespace). Link names stay within
the kernel's 15 characters.

Files under the lab directory::

    lab.json                 the Topology (written by ``lab up``)
    record.jsonl             what was created, one JSON line per thing, appended before it is created
    apiserver/               the API server's data dir; apiserver/kubeconfig is the admin kubeconfig
    kubeconfig               the admin kubeconfig users and lab processes use
    nodes/<node>/cni/net.d/  the node's CNI configuration (10-ambit-lab.conflist)
    nodes/<node>/cni/bin/    the node's CNI plugin directory (links to the standard plugins)
    nodes/<node>/ipam/       host-local's data directory
    nodes/<node>/runtime.log the node runtime's log
    nodes/<node>/root/       the node's own filesystem for hostPath volumes (:class:`HostPathLayout`)
    pods/<uid>/serviceaccount/  token, ca.crt, namespace: bound read-only into the pod's containers at
                             /var/run/secrets/kubernetes.io/serviceaccount (AMBIT_TOKEN_FILE names the token)
    runc/                    runc's state (``--root``) for the lab's containers
    containers/<id>/         each container's OCI bundle (config.json, an empty rootfs, runc.log)
    pods/<uid>/volumes/<plugin>/<name>/  the pod's volumes (emptyDir, configMap, secret, downwardAPI, projected)
    pods/<uid>/<container>.log
    logs/                    the API server's and the controllers' logs
    mesh/workloads.yaml      with the mesh: workloads and services for the node proxies (the controllers write it)
    mesh/ca/                 with the mesh: the local CA that signs workload certificates
"""

from __future__ import annotations

import ipaddress
import json
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DEFAULT_DIR = Path("/var/lib/ambit/lab")
BRIDGE_ADDRESS = "198.18.0.1"
NODE_NETWORK = "198.18.0.0/24"
SERVICE_CIDR = "198.19.0.0/16"
CLUSTER_DNS_ADDRESS = "198.19.0.10"
"""The ``kube-system/kube-dns`` Service's cluster IP: every pod's ``nameserver`` (``deploy/lab-dns``)."""
CLUSTER_DOMAIN = "cluster.local"
NODE_NETWORK_V6 = "fd00:ab::/64"
SERVICE_CIDR_V6 = "fd00:ab:ffff::/108"
IP_FAMILIES = ("ipv4", "dual")
"""``Topology.ip_family``: IPv4 only (the default) or dual-stack (IPv4 first, as kind's ``dual``)."""
LOAD_BALANCER_CIDR = "198.18.0.224/28"
API_PORT = 6443
CNI_PLUGIN_DIR = Path("/usr/lib/cni")
MAX_NODES = 200


@dataclass(frozen=True, slots=True)
class NodeAddresses:
    name: str  # node-1
    index: int  # 1
    address: str  # 198.18.0.11
    pod_cidr: str  # 198.18.1.0/24
    pod_gateway: str  # 198.18.1.1
    netns: str  # ab1f2e-node-1
    root_link: str  # ab1f2e-n1 (root end of the veth; the node end is eth0)
    address6: str = ""  # fd00:ab::b in a dual-stack lab, else ""
    pod_cidr6: str = ""  # fd00:ab:0:1::/64
    pod_gateway6: str = ""  # fd00:ab:0:1::1

    @property
    def pod_cidrs(self) -> tuple[str, ...]:
        """The node's pod ranges, IPv4 first (the Node's ``spec.podCIDRs``)."""
        return (self.pod_cidr, self.pod_cidr6) if self.pod_cidr6 else (self.pod_cidr,)


REAL_HOST_PATHS = ("/proc", "/sys", "/dev")
"""hostPath prefixes that are the machine's own: a node is a network namespace, not a machine."""
NETNS_HOST_PATHS = ("/var/run/netns", "/run/netns")
"""Network namespaces are machine-wide: both names are the machine's ``/run/netns``."""


class HostPathError(ValueError):
    """A hostPath that names no path of a node (relative, or with ``..``)."""


@dataclass(frozen=True, slots=True)
class HostPathMapping:
    """Where a node's host path is on this machine."""

    machine_path: Path
    base: Path
    """The machine directory the mapping is confined to: the resolved path must stay under it (a symbolic link
    that leads out of it is refused by the runtime)."""


@dataclass(frozen=True, slots=True)
class HostPathLayout:
    """A node's filesystem as hostPath volumes see it (pure: no I/O).

    Rules, the first that matches wins (``path`` is absolute and normalised; ``..`` is refused):

    1. ``/opt/cni/bin`` and ``/etc/cni/net.d`` (and below) are the node's CNI plugin and configuration dirs.
    2. ``/var/run/netns`` and ``/run/netns`` (and below) are the machine's ``/run/netns``.
    3. ``/proc``, ``/sys`` and ``/dev`` (and below) are the machine's own.
    4. Anything else is ``nodes/<node>/root/<path>``: a node's private tree, never the machine's or the lab's
       files (the lab's state, keys and tokens cannot be named).
    """

    lab_dir: Path
    node: str

    @property
    def root(self) -> Path:
        return self.lab_dir / "nodes" / self.node / "root"

    def map(self, path: str) -> HostPathMapping:
        """Rules 1 to 4; :class:`HostPathError` for a path that is not absolute or holds ``..``."""
        if not path.startswith("/"):
            raise HostPathError(f"hostPath {path!r} must be an absolute path")
        parts = [p for p in path.split("/") if p and p != "."]
        if ".." in parts:
            raise HostPathError(f"hostPath {path!r} must not contain '..'")
        clean = "/" + "/".join(parts)
        node_dir = self.lab_dir / "nodes" / self.node
        bases: list[tuple[str, Path]] = [
            ("/opt/cni/bin", node_dir / "cni" / "bin"),
            ("/etc/cni/net.d", node_dir / "cni" / "net.d"),
            *((prefix, Path("/run/netns")) for prefix in NETNS_HOST_PATHS),
            *((prefix, Path(prefix)) for prefix in REAL_HOST_PATHS),
        ]
        for prefix, base in bases:
            if clean == prefix or clean.startswith(prefix + "/"):
                rest = clean[len(prefix) :].lstrip("/")
                return HostPathMapping(base / rest if rest else base, base)
        rest = clean.lstrip("/")
        return HostPathMapping(self.root / rest if rest else self.root, self.root)


@dataclass(frozen=True, slots=True)
class Topology:
    lab_id: str
    nodes: int
    directory: str
    installed: bool = False
    """The lab installed the mesh from ``deploy/overlays/lab`` (``ambit lab up --install``): its components are
    pods of DaemonSets and a Deployment, as on a cluster."""
    removed: tuple[int, ...] = ()
    """Indices up to ``nodes`` of nodes that left the lab (``ambit lab node remove``); the next add takes the
    lowest of them again."""
    ip_family: str = "ipv4"
    """``ipv4`` or ``dual`` (:data:`IP_FAMILIES`): whether nodes, pods and Services also get IPv6 addresses."""

    @classmethod
    def new(cls, nodes: int, directory: Path, *, installed: bool = False, ip_family: str = "ipv4") -> Topology:
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"a lab has 1 to {MAX_NODES} nodes, not {nodes}")
        if ip_family not in IP_FAMILIES:
            raise ValueError(f"the lab's IP family is one of {', '.join(IP_FAMILIES)}, not {ip_family!r}")
        return cls(secrets.token_hex(2), nodes, str(directory), installed, ip_family=ip_family)

    @property
    def dual_stack(self) -> bool:
        return self.ip_family == "dual"

    @property
    def service_cidrs(self) -> tuple[str, ...]:
        """The Service ranges, primary first (kube-apiserver's ``--service-cluster-ip-range``)."""
        return (SERVICE_CIDR, SERVICE_CIDR_V6) if self.dual_stack else (SERVICE_CIDR,)

    # -- names ----------------------------------------------------------------------------------------------
    @property
    def prefix(self) -> str:
        return f"ab{self.lab_id}"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    @property
    def api_url(self) -> str:
        return f"https://{BRIDGE_ADDRESS}:{API_PORT}"

    def node(self, index: int) -> NodeAddresses:
        if not 1 <= index <= self.nodes or index in self.removed:
            raise ValueError(f"no node {index} in lab {self.lab_id}")
        return NodeAddresses(
            name=f"node-{index}",
            index=index,
            address=str(ipaddress.ip_address("198.18.0.10") + index),
            pod_cidr=f"198.18.{index}.0/24",
            pod_gateway=f"198.18.{index}.1",
            netns=f"{self.prefix}-node-{index}",
            root_link=f"{self.prefix}-n{index}",
            **(self._node_v6(index) if self.dual_stack else {}),
        )

    @staticmethod
    def _node_v6(index: int) -> dict[str, str]:
        network = ipaddress.IPv6Network(NODE_NETWORK_V6)
        pods = ipaddress.IPv6Network((int(network.network_address) + (index << 64), 64))
        return {
            "address6": str(network.network_address + 10 + index),
            "pod_cidr6": str(pods),
            "pod_gateway6": str(pods.network_address + 1),
        }

    def all_nodes(self) -> list[NodeAddresses]:
        return [self.node(i) for i in range(1, self.nodes + 1) if i not in self.removed]

    @property
    def node_count(self) -> int:
        """How many nodes the lab has now."""
        return self.nodes - len(self.removed)

    def node_named(self, name: str) -> NodeAddresses | None:
        for node in self.all_nodes():
            if node.name == name:
                return node
        return None

    def pod_netns(self, pod_uid: str) -> str:
        return f"{self.prefix}-p-{pod_uid.replace('-', '')[:12]}"

    # -- files ----------------------------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return Path(self.directory)

    @property
    def kubeconfig(self) -> Path:
        return self.path / "kubeconfig"

    @property
    def record_file(self) -> Path:
        return self.path / "record.jsonl"

    def node_dir(self, node: str) -> Path:
        return self.path / "nodes" / node

    def cni_conf_dir(self, node: str) -> Path:
        return self.node_dir(node) / "cni" / "net.d"

    def cni_bin_dir(self, node: str) -> Path:
        return self.node_dir(node) / "cni" / "bin"

    def host_paths(self, node: str) -> HostPathLayout:
        """The node's filesystem for hostPath volumes."""
        return HostPathLayout(self.path, node)

    def pod_dir(self, pod_uid: str) -> Path:
        return self.path / "pods" / pod_uid

    @property
    def runc_root(self) -> Path:
        """runc's state directory (``runc --root``) for the lab's containers."""
        return self.path / "runc"

    @property
    def container_bundles(self) -> Path:
        return self.path / "containers"

    @property
    def cgroup_parent(self) -> str:
        """Every container's cgroup is ``<this>/<container id>``, in every controller."""
        return f"/ambit-{self.prefix}"

    @property
    def mesh_config_file(self) -> Path:
        return self.path / "mesh" / "workloads.yaml"

    @property
    def mesh_ca_dir(self) -> Path:
        return self.path / "mesh" / "ca"

    # -- persistence ----------------------------------------------------------------------------------------
    def save(self) -> None:
        """Write ``lab.json`` atomically (the lab's processes read it at any time)."""
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / ".lab.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(self.path / "lab.json")

    @classmethod
    def load(cls, directory: Path) -> Topology | None:
        """The lab in ``directory``, or None when there is none (or its file is unreadable)."""
        try:
            data: Any = json.loads((directory / "lab.json").read_text())
            return cls(
                str(data["lab_id"]),
                int(data["nodes"]),
                str(data["directory"]),
                bool(data.get("installed", False)),
                tuple(sorted({int(i) for i in data.get("removed", ())})),
                ip_family=_ip_family(data.get("ip_family", "ipv4")),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None


def _ip_family(value: object) -> str:
    if value not in IP_FAMILIES:
        raise ValueError(f"ip_family {value!r} is not one of {', '.join(IP_FAMILIES)}")
    return str(value)
