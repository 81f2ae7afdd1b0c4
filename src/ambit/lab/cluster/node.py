"""The lab's long-running processes, as ``ambit lab up`` starts them: one node (runtime, Service rules,
NetworkPolicy rules) and the controllers. Each runs until SIGTERM or SIGINT and then closes cleanly; pods keep
running when a node runtime stops (as containers outlive a kubelet), and ``ambit lab down`` removes them. A node
runs its containers through runc (:mod:`ambit.lab.runtime.oci_apply`), with the lab's directory, the checkout's
git metadata and the machine's own secrets masked (:func:`runc_settings`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import stat
import sys
from pathlib import Path

from ambit.commands import SubprocessRunner
from ambit.k8s import KubeClient
from ambit.lab.cluster.identities import kubeconfig_for
from ambit.lab.cluster.record import Record
from ambit.lab.network.policies_apply import PolicyAgent, node_sources
from ambit.lab.network.services_apply import ServiceProxy, bridge_netfilter_enabled, node_ipv6
from ambit.lab.network.topology import LOAD_BALANCER_CIDR, SERVICE_CIDR, Topology
from ambit.lab.runtime.kubelet import NodeRuntime, NodeRuntimeSettings
from ambit.lab.runtime.kubelet_server import KubeletServer, RuncExec
from ambit.lab.runtime.node_taints import NodeTaint
from ambit.lab.runtime.oci_apply import RuncRuntime, RuncSettings
from ambit.lab.runtime.oci_spec import PRIVATE_DIRS
from ambit.lab.runtime.port_forward import NetnsDialer
from ambit.lab.runtime.sandbox import PodSandboxes

log = logging.getLogger("ambit.lab")

_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def container_path() -> str:
    """Pods' PATH: this project's interpreter first (``python3 -m ambit.lab.apps`` works), then the system's."""
    return f"{Path(sys.executable).parent}:{_SYSTEM_PATH}"


def container_pythonpath() -> str:
    """Pods' PYTHONPATH: the directory this process imported Ambit from. A pod's interpreter is this one, but its
    installed Ambit may be another checkout's (an editable install shared by git worktrees); the lab's pods must
    run the lab's code. :func:`interpreter_dirs` keeps the directory visible in containers."""
    import ambit

    return str(Path(ambit.__file__).resolve().parent.parent)


HOST_SECRETS = ("/etc/shadow", "/etc/gshadow", "/etc/ssh")
"""The machine's own secrets, hidden from containers besides the lab's (a container may run as root)."""


def checkout_state() -> list[Path]:
    """This checkout's git metadata (a worktree's ``.git`` file and the repository it points to), when running
    from a checkout."""
    root = Path(__file__).resolve().parents[4]
    git = root / ".git"
    if not (root / "pyproject.toml").is_file() or not git.exists():
        return []
    found = [git]
    if git.is_file():
        text = git.read_text(errors="replace").strip()
        if text.startswith("gitdir:"):
            gitdir = (root / text.removeprefix("gitdir:").strip()).resolve()
            found.append(gitdir.parent.parent if gitdir.parent.name == "worktrees" else gitdir)
    return found


def interpreter_dirs() -> list[Path]:
    """Where this Python and Ambit's code live (the pods run ``python3 -m ambit.lab.apps``)."""
    import ambit

    dirs = {
        Path(sys.base_prefix).resolve(),
        Path(sys.prefix).resolve(),
        Path(sys.executable).resolve().parent.parent,
        Path(ambit.__file__).resolve().parent.parent,
    }
    return sorted(dirs)


def closed_ancestors(path: Path) -> list[Path]:
    """The directories above ``path`` that other users cannot enter (no ``o+x``: ``/root``, a ``mktemp -d``
    directory, a home directory made 0700), outermost first."""
    closed: list[Path] = []
    for directory in reversed(path.parents):
        try:
            if directory != Path("/") and not directory.stat().st_mode & stat.S_IXOTH:
                closed.append(directory)
        except OSError:
            continue
    return closed


def runc_settings(topology: Topology) -> RuncSettings:
    """Rule 3 of :mod:`ambit.lab.runtime.oci_spec` for this lab: what containers must not see, and what of it they
    need after all (the interpreter, when it is installed under ``/root``, ``/tmp`` or any directory other users
    cannot enter: a container that runs as another user, istiod's 1337, could not reach it through that
    directory, so it is masked and the interpreter bound back beneath the mask)."""
    masked = [topology.path.resolve(), Path("/root"), Path("/run/netns"), *checkout_state()]
    masked += [closed for d in interpreter_dirs() for closed in closed_ancestors(d)]
    masked += [Path(p) for p in HOST_SECRETS if Path(p).exists()]
    hidden = [*masked, *(Path(p) for p in PRIVATE_DIRS)]  # a checkout or venv under /tmp is hidden too
    revealed = [d for d in interpreter_dirs() if any(d == m or m in d.parents for m in hidden)]
    return RuncSettings(
        root=topology.runc_root,
        bundles=topology.container_bundles,
        cgroup_parent=topology.cgroup_parent,
        masked=tuple(str(p) for p in masked),
        revealed=tuple(str(p) for p in revealed),
    )


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def _logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


async def run_node(topology: Topology, node_name: str, taints: tuple[NodeTaint, ...] = ()) -> None:
    """A node: the pod runtime, the Service rules and the NetworkPolicy rules, run inside the node's network
    namespace; a Node it creates carries ``taints``."""
    _logging()
    node = topology.node_named(node_name)
    if node is None:
        raise ValueError(f"no node {node_name!r} in lab {topology.lab_id}")
    runner = SubprocessRunner()
    record = Record(topology.record_file)
    settings = NodeRuntimeSettings.for_lab(
        topology,
        node_name,
        container_path=container_path(),
        container_pythonpath=container_pythonpath(),
        register_with_taints=taints,
    )
    # The kubelet's part as the node itself, the Service rules as the service proxy (kubeadm's identities).
    async with (
        KubeClient.from_kubeconfig(kubeconfig_for(topology, f"node-{node_name}")) as client,
        KubeClient.from_kubeconfig(kubeconfig_for(topology, "kube-proxy")) as proxy_client,
    ):
        sandboxes = PodSandboxes(topology, node_name, record, runner)
        runtime = NodeRuntime(client, settings, sandboxes, record, containers=RuncRuntime(runc_settings(topology)))
        # The runtime runs inside the node's namespace: nft applies to it directly (netns "").
        proxy = ServiceProxy(
            proxy_client,
            netns="",
            node_pod_cidr=node.pod_cidr,
            node_gateway=node.pod_gateway,
            service_cidr=SERVICE_CIDR,
            load_balancer_cidr=LOAD_BALANCER_CIDR,
            bridge_netfilter=bridge_netfilter_enabled(),  # read in the node's namespace: this process's
            ipv6=node_ipv6(topology, node_name),
            runner=runner,
        )
        # NetworkPolicies for this node's pods, as a CNI's policy agent (the node's identity reads them).
        policies = PolicyAgent(client, netns="", node_name=node_name, node_sources=node_sources(node), runner=runner)
        await runtime.start()
        # The kubelet API (pods/log, pods/exec, pods/portforward) for the API server, on a root-only unix socket.
        dialer = NetnsDialer(sandboxes.netns_path)
        kubelet_api = KubeletServer(runtime, RuncExec(topology.runc_root), runtime.container_log, dialer=dialer)
        try:
            await kubelet_api.serve(topology.node_dir(node_name) / "kubelet.sock")
        except OSError as exc:  # the node still runs its pods; kubectl logs/exec answer that the kubelet is unreachable
            log.error("node %s: cannot serve the kubelet API: %s", node_name, exc)
        await proxy.start()
        await policies.start()
        log.info("node %s of lab %s is running", node_name, topology.lab_id)
        try:
            await _until_signalled()
        finally:
            with contextlib.suppress(Exception):
                await policies.aclose()
            with contextlib.suppress(Exception):
                await proxy.aclose()
            with contextlib.suppress(Exception):
                await kubelet_api.aclose()
            await runtime.aclose()


async def run_controllers_for(topology: Topology) -> None:
    """The scheduler, Deployment/ReplicaSet and EndpointSlice controllers, against the lab's API server."""
    from ambit.lab.controllers.manager import ControllerManager
    from ambit.lab.controllers.settings import ControllerSettings

    _logging()
    async with (
        KubeClient.from_kubeconfig(kubeconfig_for(topology, "controllers")) as client,
        ControllerManager(
            client, ControllerSettings(load_balancer_cidr=LOAD_BALANCER_CIDR, local_path_dir=topology.path)
        ),
    ):
        log.info("controllers of lab %s are running", topology.lab_id)
        await _until_signalled()
