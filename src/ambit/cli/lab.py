"""``ambit lab``: a multi-node cluster on this machine, its nodes and pods network namespaces."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ambit.cli.app import app
from ambit.lab.network.topology import DEFAULT_DIR, Topology

lab = typer.Typer(
    help="A cluster on this machine: nodes and pods as network namespaces. Services of type LoadBalancer get an "
    "address of 198.18.0.224/28 (status.loadBalancer.ingress), reachable from this machine (curl http://<ip>:<port>).",
    no_args_is_help=True,
)
app.add_typer(lab, name="lab")

DirOption = Annotated[Path, typer.Option("--dir", help="The lab's directory.")]


def _topology(directory: Path) -> Topology:
    topology = Topology.load(directory.resolve())
    if topology is None:
        typer.echo(f"ambit lab: no lab in {directory} (start one with `ambit lab up`)", err=True)
        raise typer.Exit(1)
    return topology


@lab.command()
def up(
    nodes: Annotated[int, typer.Option(help="How many nodes.")] = 2,
    directory: DirOption = DEFAULT_DIR,
    mesh: Annotated[
        bool,
        typer.Option(
            "--mesh/--no-mesh",
            help="Install the mesh (control plane, node agent and node proxy DaemonSets from deploy/overlays/lab, "
            "as on a cluster) once the nodes are Ready.",
        ),
    ] = True,
    install: Annotated[bool, typer.Option("--install", hidden=True, help="The default; kept for old scripts.")] = False,
    dns: Annotated[
        bool,
        typer.Option(
            "--dns/--no-dns",
            help="Install cluster DNS (kube-dns at 198.19.0.10, from deploy/lab-dns) once the nodes are Ready.",
        ),
    ] = True,
    ip_family: Annotated[
        str,
        typer.Option(
            "--ip-family",
            help="ipv4, or dual for a dual-stack lab (kind's networking.ipFamily): pods and Services also get IPv6 "
            "addresses from fd00:ab::/32.",
        ),
    ] = "ipv4",
) -> None:
    """Start a lab: API server, controllers, a node runtime per node, and the mesh (unless --no-mesh)."""
    from ambit.errors import AmbitError
    from ambit.lab.cluster.lifecycle import LabSettings, lab_up

    _require_root()
    try:
        settings = LabSettings(directory=directory, nodes=nodes, install=mesh or install, dns=dns, ip_family=ip_family)
        topology = lab_up(settings, echo=typer.echo)
    except AmbitError as exc:
        typer.echo(f"ambit lab up: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"lab {topology.lab_id} is up with {topology.nodes} nodes")
    typer.echo(f"  export KUBECONFIG={topology.kubeconfig}")
    typer.echo(f"  kubectl get nodes; ambit lab status --dir {topology.path}")
    typer.echo(f"  topology page: ambit dashboard --lab-dir {topology.path}  (then open http://127.0.0.1:20001/)")


@lab.command()
def down(
    directory: DirOption = DEFAULT_DIR,
    dead: Annotated[
        bool,
        typer.Option(
            "--dead",
            help="Instead, remove every lab on this machine that no process runs in (namespaces, links, routes and "
            "cgroups left by a killed run whose directory is gone). Do not run it while a lab is being brought up.",
        ),
    ] = False,
) -> None:
    """Remove the lab: processes, namespaces, links, routes, rules and files (also after a crash)."""
    _require_root()
    if dead:
        from ambit.commands import SubprocessRunner
        from ambit.lab.cluster.record import sweep_dead_labs

        swept = sweep_dead_labs(SubprocessRunner())
        typer.echo(f"removed {len(swept)} things of dead labs" if swept else "no dead lab on this machine")
        return
    from ambit.lab.cluster.lifecycle import lab_down

    removed = lab_down(directory)
    typer.echo(f"removed {len(removed)} things" if removed else f"no lab in {directory}")


@lab.command()
def status(directory: DirOption = DEFAULT_DIR) -> None:
    """Nodes and pods: addresses, readiness, restarts."""
    from ambit.k8s import KubeClient, KubeClientError, kinds

    topology = _topology(directory)

    async def fetch() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with KubeClient.from_kubeconfig(topology.kubeconfig) as client:
            nodes, _ = await client.list(kinds.NODES)
            pods, _ = await client.list(kinds.PODS)
        return nodes, pods

    try:
        nodes, pods = asyncio.run(fetch())
    except KubeClientError as exc:
        typer.echo(f"ambit lab status: {exc}", err=True)
        raise typer.Exit(1) from None
    console = Console(width=None if sys.stdout.isatty() else 160)
    table = Table(title=f"lab {topology.lab_id}: nodes", title_justify="left", box=None, header_style="bold")
    for column in ("NODE", "READY", "ADDRESS", "POD CIDR", "PODS"):
        table.add_column(column)
    for node in topology.all_nodes():
        obj = next((n for n in nodes if n["metadata"]["name"] == node.name), None)
        ready = _condition(obj, "Ready") if obj else "absent"
        count = sum(1 for p in pods if (p.get("spec") or {}).get("nodeName") == node.name)
        table.add_row(node.name, ready, node.address, node.pod_cidr, str(count))
    console.print(table)
    table = Table(title="pods", title_justify="left", box=None, header_style="bold")
    for column in ("NAMESPACE", "POD", "NODE", "IP", "PHASE", "READY", "RESTARTS"):
        table.add_column(column)
    for pod in pods:
        meta, spec, st = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        statuses = st.get("containerStatuses") or []
        ready = f"{sum(1 for c in statuses if c.get('ready'))}/{len(spec.get('containers') or [])}"
        restarts = str(sum(int(c.get("restartCount", 0)) for c in statuses))
        phase = "Terminating" if meta.get("deletionTimestamp") else st.get("phase", "")
        table.add_row(
            meta.get("namespace", ""),
            meta["name"],
            spec.get("nodeName", ""),
            st.get("podIP", ""),
            phase,
            ready,
            restarts,
        )
    console.print(table)


def _condition(obj: dict[str, Any], kind: str) -> str:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return "Ready" if cond.get("status") == "True" else "NotReady"
    return "Unknown"


def _pod(topology: Topology, namespace: str, name: str) -> dict[str, Any]:
    from ambit.k8s import KubeClient, KubeClientError, kinds

    async def fetch() -> dict[str, Any]:
        async with KubeClient.from_kubeconfig(topology.kubeconfig) as client:
            return await client.get(kinds.PODS, name, namespace)

    try:
        return asyncio.run(fetch())
    except KubeClientError as exc:
        typer.echo(f"ambit lab: pod {namespace}/{name}: {exc}", err=True)
        raise typer.Exit(1) from None


@lab.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec(
    ctx: typer.Context,
    pod: Annotated[str | None, typer.Argument(help="Pod name (or use --node).")] = None,
    namespace: Annotated[str, typer.Option("--namespace", "-n")] = "default",
    node: Annotated[str | None, typer.Option(help="Run in this node's namespace instead of a pod's.")] = None,
    container: Annotated[str | None, typer.Option("--container", "-c", help="Default: the pod's first.")] = None,
    directory: DirOption = DEFAULT_DIR,
) -> None:
    """Run a command in a pod's container (as kubectl exec), or in a node's network namespace: ambit lab exec POD --
    CMD..."""
    topology = _topology(directory)
    argv = list(ctx.args)
    if node is not None and pod is not None:
        argv.insert(0, pod)  # with --node, the first word after the options is the command, not a pod
        pod = None
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise typer.BadParameter("give the command after --")
    if node is not None:
        found = topology.node_named(node)
        if found is None:
            raise typer.BadParameter(f"no node {node!r} in this lab")
        netns = found.netns
    elif pod is not None:
        from ambit.lab.runtime.oci_spec import container_id

        obj = _pod(topology, namespace, pod)
        names = [str(c.get("name")) for c in (obj.get("spec") or {}).get("containers") or ()]
        name = container or (names[0] if names else "")
        if name not in names:
            raise typer.BadParameter(f"pod {namespace}/{pod} has no container {name!r}")
        cid = container_id(str(obj["metadata"]["uid"]), name)
        if not (topology.runc_root / cid / "state.json").exists():
            typer.echo(f"ambit lab exec: container {name} of pod {namespace}/{pod} is not running", err=True)
            raise typer.Exit(1)
        sys.stdout.flush()
        os.execvp("runc", ["runc", "--root", str(topology.runc_root), "exec", cid, *argv])
    else:
        raise typer.BadParameter("name a pod or --node")
    from ambit.lab.cluster.node import container_path

    sys.stdout.flush()
    os.environ["PATH"] = container_path()  # the same PATH as the pods' (python3 -m ambit.lab.apps works)
    os.execvp("ip", ["ip", "netns", "exec", netns, *argv])


@lab.command()
def logs(
    pod: Annotated[str, typer.Argument(help="Pod name.")],
    namespace: Annotated[str, typer.Option("--namespace", "-n")] = "default",
    container: Annotated[str | None, typer.Option("--container", "-c")] = None,
    directory: DirOption = DEFAULT_DIR,
) -> None:
    """Print a pod container's output."""
    topology = _topology(directory)
    obj = _pod(topology, namespace, pod)
    containers = [c.get("name", "") for c in (obj.get("spec") or {}).get("containers") or []]
    name = container or (containers[0] if containers else "")
    if name not in containers:
        raise typer.BadParameter(f"pod {pod} has no container {name!r} (it has {', '.join(containers)})")
    path = topology.pod_dir(obj["metadata"]["uid"]) / f"{name}.log"
    try:
        sys.stdout.write(path.read_text(errors="replace"))
    except FileNotFoundError:
        typer.echo(f"ambit lab logs: no output from {pod}/{name} yet", err=True)


node_app = typer.Typer(help="The lab's nodes: add one to a running lab, or remove one.")
lab.add_typer(node_app, name="node")


@node_app.callback(invoke_without_command=True)
def node(
    ctx: typer.Context,
    name: Annotated[
        str | None, typer.Option(help="Run this node's runtime (as `ambit lab up` does).", hidden=True)
    ] = None,
    register_with_taints: Annotated[
        str, typer.Option(help="Taints the runtime registers its Node with: key=value:Effect,...", hidden=True)
    ] = "",
    directory: DirOption = DEFAULT_DIR,
) -> None:
    """The lab's nodes (`ambit lab node add`); with --name, run one node's runtime (started by `ambit lab up`
    inside the node's namespace)."""
    if ctx.invoked_subcommand is not None:
        return
    if name is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(2)
    from ambit.lab.cluster.node import run_node
    from ambit.lab.runtime.node_taints import TaintSpecError, parse_taints

    topology = _topology(directory)
    if topology.node_named(name) is None:
        raise typer.BadParameter(f"no node {name!r} in this lab")
    try:
        taints = parse_taints([register_with_taints]) if register_with_taints else ()
    except TaintSpecError as exc:
        raise typer.BadParameter(str(exc), param_hint="--register-with-taints") from None
    asyncio.run(run_node(topology, name, taints))


@node_app.command("add")
def node_add(
    taint: Annotated[
        list[str] | None,
        typer.Option(
            "--taint",
            help="A taint the new node registers with, key=value:Effect (repeatable). Default: "
            "cni.istio.io/not-ready=true:NoSchedule when the mesh is installed (removed once the node agent is "
            "ready there), none otherwise.",
        ),
    ] = None,
    no_taint: Annotated[bool, typer.Option("--no-taint", help="Register the new node without any taint.")] = False,
    directory: DirOption = DEFAULT_DIR,
) -> None:
    """Add a node to a running lab: its network, its kubelet identity and runtime; waits until it is Ready."""
    from ambit.errors import AmbitError
    from ambit.lab.cluster.join import add_node
    from ambit.lab.runtime.node_taints import TaintSpecError, parse_taints

    _require_root()
    if taint and no_taint:
        typer.echo("ambit lab node add: --taint and --no-taint contradict each other; pick one", err=True)
        raise typer.Exit(2)
    try:
        taints = () if no_taint else parse_taints(taint) if taint else None
    except TaintSpecError as exc:
        typer.echo(f"ambit lab node add: {exc}", err=True)
        raise typer.Exit(2) from None
    _topology(directory)
    try:
        node = add_node(directory, taints)
    except AmbitError as exc:
        typer.echo(f"ambit lab node add: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{node.name} joined: address {node.address}, pods {node.pod_cidr}")


@node_app.command("remove")
def node_remove(
    name: Annotated[str, typer.Argument(help="The node to remove, e.g. node-3.")],
    force: Annotated[
        bool, typer.Option("--force", help="Also delete pods no controller owns (kubectl drain's --force).")
    ] = False,
    timeout: Annotated[
        float, typer.Option(help="Seconds the drain may take before the removal stops (the node stays cordoned).")
    ] = 120.0,
    disable_eviction: Annotated[
        bool,
        typer.Option(
            "--disable-eviction",
            help="Delete the node's pods instead of evicting them, bypassing PodDisruptionBudgets (kubectl drain's).",
        ),
    ] = False,
    directory: DirOption = DEFAULT_DIR,
) -> None:
    """Remove a node from a running lab: cordon and drain it (evicting its pods, so PodDisruptionBudgets hold; a
    refused eviction is retried until --timeout; DaemonSet pods stay until the end), stop its runtime, delete its
    Node and remaining pods, remove its network."""
    from ambit.errors import AmbitError
    from ambit.lab.cluster.leave import remove_node

    _require_root()
    _topology(directory)
    try:
        node = remove_node(directory, name, force=force, drain_timeout=timeout, disable_eviction=disable_eviction)
    except AmbitError as exc:
        typer.echo(f"ambit lab node remove: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{node.name} left the lab: address {node.address} and pods {node.pod_cidr} are free")


@lab.command(hidden=True)
def controllers(directory: DirOption = DEFAULT_DIR) -> None:
    """Run the controllers: scheduler, Deployments, EndpointSlices (started by `ambit lab up`)."""
    from ambit.lab.cluster.node import run_controllers_for

    asyncio.run(run_controllers_for(_topology(directory)))


@lab.command()
def restart(
    component: Annotated[str, typer.Argument(help="What to restart: nodeproxy, nodeagent or controlplane.")],
    node: Annotated[
        list[str] | None,
        typer.Option("--node", help="Refused: a DaemonSet rolls out over every node (see the command's help)."),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds the rollout may take before this fails.")] = 300.0,
    directory: DirOption = DEFAULT_DIR,
) -> None:
    """Restart a mesh component as on a cluster: `kubectl rollout restart` of its DaemonSet (ztunnel,
    istio-cni-node) or Deployment (istiod) in istio-system, then wait as `kubectl rollout status` does. The node
    proxies roll one node at a time, each new proxy started beside the old one and handed the node's pods once
    ready, so no connection is refused. There is no per-node restart: Kubernetes rolls a DaemonSet over every node,
    and deleting one node's pod instead leaves the node without a successor while the old proxy drains."""
    from ambit.k8s import KubeClient, KubeClientError
    from ambit.lab.cluster.restart import restart_workload
    from ambit.lab.cluster.rollout import COMPONENTS, RolloutError

    workload = COMPONENTS.get(component)
    if workload is None:
        raise typer.BadParameter(f"{component!r}: one of {', '.join(COMPONENTS)}", param_hint="COMPONENT")
    if node:
        typer.echo(
            "ambit lab restart: --node is refused: the mesh is installed, and a DaemonSet's rollout (kubectl rollout "
            "restart) replaces the pod of every node, one node at a time, each new pod beside the old one. Nothing "
            "restarts one node's pod with a successor; `kubectl delete pod` does it without one (the old proxy "
            "drains, new connections wait for the new pod). Run it without --node.",
            err=True,
        )
        raise typer.Exit(2)
    topology = _topology(directory)

    async def run() -> float:
        async with KubeClient.from_kubeconfig(topology.kubeconfig) as client:
            return await restart_workload(client, workload, seconds=timeout, echo=typer.echo)

    try:
        seconds = asyncio.run(run())
    except (RolloutError, KubeClientError) as exc:
        typer.echo(f"ambit lab restart: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{workload} rolled out in {seconds:.1f} s")


@lab.command()
def dns(
    host: Annotated[str, typer.Option("--host", help="The address to listen on (UDP and TCP).")] = "0.0.0.0",
    port: Annotated[int, typer.Option("--port", help="The port, UDP and TCP.")] = 53,
    domain: Annotated[str, typer.Option("--domain", help="The cluster domain.")] = "cluster.local",
    kubeconfig: Annotated[
        Path | None, typer.Option("--kubeconfig", help="The API server [default: $KUBECONFIG, else in-cluster].")
    ] = None,
) -> None:
    """Serve cluster DNS (kube-dns's role) from the API's Services and EndpointSlices: the lab's kube-dns pod."""
    from ambit.cli.process_logging import configure_logging
    from ambit.k8s import KubeClient, KubeClientError
    from ambit.lab.dns.server import ClusterDnsSettings, run_cluster_dns

    configure_logging()
    settings = ClusterDnsSettings(host=host, port=port, domain=domain.strip(".").lower())

    async def main() -> None:
        import signal

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        client = KubeClient.from_kubeconfig(kubeconfig) if kubeconfig else KubeClient.from_env()
        async with client:
            await run_cluster_dns(client, settings, stop)

    try:
        asyncio.run(main())
    except (KubeClientError, OSError) as exc:
        typer.echo(f"ambit lab dns: {exc}", err=True)
        raise typer.Exit(1) from None


def _require_root() -> None:
    if os.geteuid() != 0:
        typer.echo("ambit lab: needs root (it creates network namespaces)", err=True)
        raise typer.Exit(1)
