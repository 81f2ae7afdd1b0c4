"""``ambit lab up`` and ``ambit lab down``: build the lab's network, start its processes, and remove it all.

Order of ``up``: topology (``lab.json``) → network (bridge, node namespaces, routes, CNI config) → the cluster's
own identities (:mod:`ambit.lab.cluster.identities`: nodes, service proxy, controllers) → API server on the
bridge address → istio-system and kube-system labelled Pod Security ``privileged`` (with the mesh's service
accounts) → controllers → one node runtime per node, inside the node's namespace → wait until every Node is Ready
→ cluster DNS (``deploy/lab-dns``, :mod:`ambit.lab.dns.install`), available before ``up`` returns → (unless
``--no-mesh``: the mesh, installed from ``deploy/overlays/lab`` as on a cluster, :mod:`ambit.lab.mesh.install`).
The lab runs no mesh component itself: the control plane, node agents and node proxies are the pods of a
Deployment and DaemonSets. Each process is started in its own session (it outlives ``ambit lab up``) and recorded
with its start time. ``down`` is the lab record's sweep plus a scan for lab processes by command line (a process
started just before a crash, not yet recorded, is found that way), then the lab directory. Both are safe to run
again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ambit.apiserver.tokens import DEFAULT_ISSUER
from ambit.commands import CommandRunner, SubprocessRunner, process_start_time
from ambit.errors import AmbitError
from ambit.lab.cluster.identities import token_file, write_kubeconfigs, write_token_file
from ambit.lab.cluster.record import Record, sweep
from ambit.lab.network.bridge import create_network
from ambit.lab.network.topology import API_PORT, BRIDGE_ADDRESS, NodeAddresses, Topology
from ambit.lab.runtime.node_taints import NodeTaint, render_taints
from ambit.lab.runtime.oci_apply import RuncMissingError, find_runc


class LabError(AmbitError):
    """The lab could not be brought up (or is already up)."""


@dataclass(frozen=True, slots=True)
class LabSettings:
    directory: Path
    """The lab's directory (state, logs, kubeconfig)."""
    nodes: int = 2
    """How many nodes."""
    ready_timeout: float = 60.0
    """Seconds to wait for the API server and the nodes."""
    install: bool = False
    """Install the mesh from ``deploy/overlays/lab`` once the nodes are Ready (:mod:`ambit.lab.mesh.install`)."""
    dns: bool = True
    """Install cluster DNS (``deploy/lab-dns``) once the nodes are Ready, before the mesh."""
    ip_family: str = "ipv4"
    """``ipv4`` or ``dual`` (``ambit lab up --ip-family``): a dual-stack lab's pods and Services get IPv6 too."""


def ambit_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "ambit.cli", *args]


def start_process(
    argv: list[str], log: Path, record: Record, what: str, *, pipe_stdout: bool = False
) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if pipe_stdout else out,
            stderr=out,
            start_new_session=True,
            close_fds=True,
        )
    record.note("process", pid=proc.pid, start_time=process_start_time(proc.pid) or 0, what=what)
    return proc


def lab_up(
    settings: LabSettings, runner: CommandRunner | None = None, echo: Callable[[str], None] | None = None
) -> Topology:
    runner = runner or SubprocessRunner()
    directory = settings.directory.resolve()
    try:
        find_runc()  # before anything is made: the nodes run every container through it
    except RuncMissingError as exc:
        raise LabError(str(exc)) from None
    existing = Topology.load(directory)
    if existing is not None:
        raise LabError(f"a lab is already up in {directory} (lab {existing.lab_id}); run `ambit lab down` first")
    try:
        topology = Topology.new(settings.nodes, directory, installed=settings.install, ip_family=settings.ip_family)
    except ValueError as exc:
        raise LabError(str(exc)) from None
    topology.save()
    record = Record(topology.record_file)
    try:
        create_network(topology, record, runner)
        write_token_file(topology)
        _start_apiserver(topology, record, settings.ready_timeout)
        write_kubeconfigs(topology)
        _prepare_namespaces(topology)
        start_process(
            ambit_argv("lab", "controllers", "--dir", str(directory)),
            directory / "logs" / "controllers.log",
            record,
            "controllers",
        )
        for node in topology.all_nodes():
            start_node_runtime(topology, node, record)
        wait_for_nodes(topology, settings.ready_timeout)
        if settings.dns:
            _install_dns(topology, echo or (lambda line: None))
        if settings.install:
            _install_mesh(topology, echo or (lambda line: None))
    except BaseException:
        lab_down(directory, runner)
        raise
    return topology


def start_node_runtime(
    topology: Topology, node: NodeAddresses, record: Record, taints: tuple[NodeTaint, ...] = ()
) -> subprocess.Popen[bytes]:
    """``node``'s runtime (the kubelet's role), inside its namespace; it registers its Node with ``taints``."""
    # nsenter, not `ip netns exec`: the runtime must stay in the root mount namespace, so that the pod namespaces
    # it creates (bind mounts under /run/netns) are visible to everyone.
    # The taints first: the command line ends with the node's name, as tests and operators look for it.
    taint_args = ["--register-with-taints", render_taints(taints)] if taints else []
    args = ["lab", "node", *taint_args, "--dir", str(topology.path), "--name", node.name]
    argv = ["nsenter", f"--net=/run/netns/{node.netns}", "--", *ambit_argv(*args)]
    return start_process(argv, topology.node_dir(node.name) / "runtime.log", record, f"node runtime {node.name}")


def _install_mesh(topology: Topology, echo: Callable[[str], None]) -> None:
    import asyncio

    from ambit.k8s import KubeClient, KubeClientError
    from ambit.lab.mesh.install import install_mesh

    async def install() -> None:
        async with KubeClient.from_kubeconfig(topology.kubeconfig) as client:
            await install_mesh(client, topology, echo)

    echo("installing the mesh from deploy/overlays/lab")
    try:
        asyncio.run(install())
    except (AmbitError, KubeClientError) as exc:
        raise LabError(f"installing the mesh failed: {exc}") from None


def _install_dns(topology: Topology, echo: Callable[[str], None]) -> None:
    import asyncio

    from ambit.k8s import KubeClient, KubeClientError
    from ambit.lab.dns.install import install_cluster_dns

    async def install() -> None:
        async with KubeClient.from_kubeconfig(topology.kubeconfig) as client:
            await install_cluster_dns(client, echo)

    echo("installing cluster DNS from deploy/lab-dns")
    try:
        asyncio.run(install())
    except (AmbitError, KubeClientError) as exc:
        raise LabError(f"installing cluster DNS failed: {exc}") from None


def _prepare_namespaces(topology: Topology) -> None:
    """istio-system and kube-system at the Pod Security level privileged, the mesh's service accounts, and kind's
    default StorageClass (``standard``, rancher's local-path provisioner: :mod:`ambit.lab.controllers.local_path`)."""
    import asyncio

    from ambit.k8s import KubeClient
    from ambit.lab.controllers.provisioner import install_default_storage_class
    from ambit.lab.mesh.accounts import prepare_system_namespaces

    async def prepare() -> None:
        async with KubeClient.from_kubeconfig(topology.kubeconfig) as client:
            await prepare_system_namespaces(client)
            await install_default_storage_class(client)

    asyncio.run(prepare())


def _start_apiserver(topology: Topology, record: Record, timeout: float) -> None:
    argv = ambit_argv(
        "apiserver",
        "--data-dir",
        str(topology.path / "apiserver"),
        "--listen",
        f"{BRIDGE_ADDRESS}:{API_PORT}",
        "--kubeconfig",
        str(topology.kubeconfig),
        "--service-cidr",
        ",".join(topology.service_cidrs),
        "--token-auth-file",
        str(token_file(topology)),
        # The issuer's audience, and the one Istio's test clusters accept (their kind configuration sets the issuer
        # to it): tokens requested for kubernetes.default.svc (upstream TestAPIServer) authenticate.
        "--api-audience",
        DEFAULT_ISSUER,
        "--api-audience",
        "kubernetes.default.svc",
        # pods/log and pods/exec reach each node's kubelet socket, topology.node_dir(node) / "kubelet.sock".
        "--kubelet-socket-dir",
        str(topology.path / "nodes"),
    )
    proc = start_process(argv, topology.path / "logs" / "apiserver.log", record, "apiserver", pipe_stdout=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    import select

    line = b""
    while time.monotonic() < deadline and b"\n" not in line:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            break
        line += chunk
    proc.stdout.close()
    if b"ready" not in line:
        log = (topology.path / "logs" / "apiserver.log").read_text(errors="replace")[-2000:]
        raise LabError(f"the API server did not start: {log}")


def wait_for_nodes(topology: Topology, timeout: float, names: set[str] | None = None) -> None:
    """Until the Nodes ``names`` (default: all of the lab's) are Ready; :class:`LabError` after ``timeout``."""
    import asyncio

    from ambit.k8s import KubeClient, KubeClientError, kinds

    async def ready_nodes() -> set[str]:
        async with KubeClient.from_kubeconfig(topology.kubeconfig) as client:
            nodes, _ = await client.list(kinds.NODES)
        return {
            n["metadata"]["name"]
            for n in nodes
            if any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (n.get("status") or {}).get("conditions") or []
            )
        }

    wanted = names if names is not None else {n.name for n in topology.all_nodes()}
    deadline = time.monotonic() + timeout
    have: set[str] = set()
    while time.monotonic() < deadline:
        try:
            have = asyncio.run(ready_nodes())
        except KubeClientError:
            have = set()
        if wanted <= have:
            return
        time.sleep(0.3)
    missing = ", ".join(sorted(wanted - have))
    raise LabError(f"nodes not Ready after {timeout:.0f} s: {missing}; see {topology.path}/nodes/*/runtime.log")


def lab_down(directory: Path, runner: CommandRunner | None = None) -> list[str]:
    """Remove the lab in ``directory``: processes, namespaces, links, routes, rules, files. Idempotent."""
    runner = runner or SubprocessRunner()
    directory = directory.resolve()
    topology = Topology.load(directory)
    if topology is None:
        return []
    removed = _kill_lab_processes(directory)
    removed += sweep(topology, Record(topology.record_file), runner)
    shutil.rmtree(directory, ignore_errors=True)
    removed.append(f"directory {directory}")
    return removed


def _kill_lab_processes(directory: Path) -> list[str]:
    """The lab's own daemons (API server, controllers, node runtimes), found by their command lines."""
    wanted = {str(directory).encode(), str(directory / "apiserver").encode()}
    dir_options = {b"--dir", b"--lab-dir", b"--data-dir"}
    found: list[int] = []
    for pid, args in ambit_processes():
        if not any(arg in wanted and i > 0 and args[i - 1] in dir_options for i, arg in enumerate(args)):
            continue
        if b"apiserver" in args or (b"lab" in args and (b"node" in args or b"controllers" in args)):
            found.append(pid)
    terminate_processes(found)
    return [f"process {pid}" for pid in found]


def ambit_processes() -> Iterator[tuple[int, list[bytes]]]:
    """Each process running ``python -m ambit.cli`` on this machine, with its command line."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"ambit.cli" in args:
            yield int(entry.name), args


def terminate_processes(pids: list[int]) -> None:
    """SIGTERM to each of ``pids`` (not necessarily our children), SIGKILL to those alive 8 s later."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 8.0
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
