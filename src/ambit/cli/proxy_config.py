"""``ambit proxy-config``: what one node proxy knows, read from its admin ``/config_dump`` (as ``istioctl
ztunnel-config``).

Two ways to reach the admin port (127.0.0.1:15000 inside the node proxy's own network namespace):

- ``--admin-url URL``: any admin port this machine can reach. On a cluster, forward it first, as istioctl does
  internally: ``kubectl -n istio-system port-forward pod/<ztunnel pod> 15000`` then ``--admin-url
  http://127.0.0.1:15000``.
- the lab (default): the node proxy of ``--node`` (default the lab's first node) is found in the lab's directory;
  this command runs itself again in a child inside that proxy's network namespace (``ip netns exec``, as ``ambit
  lab exec --node`` does) with ``--admin-url http://127.0.0.1:15000``, so the child fetches with the same bounds.
  The child is root: Python runs isolated (``-I``: no current directory or PYTHON* variables on its import path)
  from ``/``, so a directory the user happens to be in cannot plant code in it.

Fetching is bounded (``--timeout``, 64 MiB); the tables come from the pure :mod:`ambit.observe.proxyconfig`.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from ambit.cli.app import app
from ambit.lab.network.topology import DEFAULT_DIR, Topology
from ambit.model.dnsname import is_ip
from ambit.observe.admin_client import ADMIN_PORT, DEFAULT_TIMEOUT, fetch_config_dump
from ambit.observe.proxyconfig import (
    Filters,
    ProxyConfigError,
    Section,
    build_table,
    read_config_dump,
    render_structured,
    render_text,
    select_entries,
)

proxy_config = typer.Typer(
    help="What a node proxy knows (workloads, services, policies, certificates, connections), from its admin "
    "port's /config_dump, as `istioctl ztunnel-config` shows it. In the lab, name the node (--node); elsewhere give "
    "--admin-url (on a cluster: `kubectl -n istio-system port-forward pod/<ztunnel pod> 15000`, then --admin-url "
    "http://127.0.0.1:15000).",
    no_args_is_help=True,
)
app.add_typer(proxy_config, name="proxy-config")
app.add_typer(proxy_config, name="ztunnel-config", help="The same as proxy-config (istioctl's name).", hidden=True)
app.add_typer(proxy_config, name="zc", help="The same as proxy-config (istioctl's short name).", hidden=True)

NodeOption = Annotated[
    str | None, typer.Option("--node", help="The lab node whose node proxy to ask (default: the lab's first node).")
]
AdminUrlOption = Annotated[
    str | None,
    typer.Option(
        "--admin-url",
        help="A reachable admin port, e.g. http://127.0.0.1:15000 after `kubectl -n istio-system port-forward "
        "pod/<ztunnel pod> 15000` on a cluster. Without it, the lab's node proxy of --node is asked.",
    ),
]
OutputOption = Annotated[str, typer.Option("--output", "-o", help="table, json or yaml.")]
PodArgument = Annotated[
    str | None,
    typer.Argument(
        metavar="ZTUNNEL_POD",
        help="A node proxy pod, as istioctl names it: NAME, NAME.NAMESPACE or pod/NAME (its namespace: -n, "
        "default istio-system); the lab asks the node proxy of that pod's node.",
        show_default=False,
    ),
]
NamespaceOption = Annotated[
    str,
    typer.Option(
        "--namespace",
        "-n",
        help="With ZTUNNEL_POD: that pod's namespace (istioctl's -n). Without: only this namespace.",
    ),
]
WorkloadNamespaceOption = Annotated[
    str, typer.Option("--workload-namespace", help="Only entries of this namespace (istioctl's flag).")
]
DirOption = Annotated[Path, typer.Option("--lab-dir", help="The lab's directory.")]
TimeoutOption = Annotated[float, typer.Option("--timeout", help="Seconds for the whole fetch.", min=0.1, max=600)]

_OUTPUTS = ("table", "json", "yaml")
SYSTEM_NAMESPACE = "istio-system"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_CHILD_START = 30.0
"""Seconds a child in the lab gets beyond --timeout to start Python."""


@proxy_config.command()
def workloads(
    pod: PodArgument = None,
    namespace: NamespaceOption = "",
    workload_namespace: WorkloadNamespaceOption = "",
    address: Annotated[str, typer.Option("--address", help="Only the workload with this IP.")] = "",
    node: NodeOption = None,
    admin_url: AdminUrlOption = None,
    output: OutputOption = "table",
    lab_dir: DirOption = DEFAULT_DIR,
    timeout: TimeoutOption = DEFAULT_TIMEOUT,
) -> None:
    """Workloads the node proxy knows: NAMESPACE, POD NAME, ADDRESS, NODE, WAYPOINT, PROTOCOL."""
    if address and not is_ip(address):
        raise typer.BadParameter(f"{address!r} is not an IP address", param_hint="--address")
    where = Where.of(pod, namespace, workload_namespace, node, admin_url)
    _show([Section.WORKLOADS], Filters(namespace=where.filter, address=address), where, output, lab_dir, timeout)


@proxy_config.command()
def services(
    pod: PodArgument = None,
    namespace: NamespaceOption = "",
    workload_namespace: WorkloadNamespaceOption = "",
    node: NodeOption = None,
    admin_url: AdminUrlOption = None,
    output: OutputOption = "table",
    lab_dir: DirOption = DEFAULT_DIR,
    timeout: TimeoutOption = DEFAULT_TIMEOUT,
) -> None:
    """Services: NAMESPACE, SERVICE NAME, SERVICE VIP, WAYPOINT, ENDPOINTS (healthy/all)."""
    where = Where.of(pod, namespace, workload_namespace, node, admin_url)
    _show([Section.SERVICES], Filters(namespace=where.filter), where, output, lab_dir, timeout)


@proxy_config.command()
def policies(
    pod: PodArgument = None,
    namespace: NamespaceOption = "",
    workload_namespace: WorkloadNamespaceOption = "",
    node: NodeOption = None,
    admin_url: AdminUrlOption = None,
    output: OutputOption = "table",
    lab_dir: DirOption = DEFAULT_DIR,
    timeout: TimeoutOption = DEFAULT_TIMEOUT,
) -> None:
    """L4 authorization policies: NAMESPACE, POLICY NAME, ACTION, SCOPE."""
    where = Where.of(pod, namespace, workload_namespace, node, admin_url)
    _show([Section.POLICIES], Filters(namespace=where.filter), where, output, lab_dir, timeout)


@proxy_config.command()
def certificates(
    pod: PodArgument = None,
    namespace: NamespaceOption = "",
    node: NodeOption = None,
    admin_url: AdminUrlOption = None,
    output: OutputOption = "table",
    lab_dir: DirOption = DEFAULT_DIR,
    timeout: TimeoutOption = DEFAULT_TIMEOUT,
) -> None:
    """Workload certificates: CERTIFICATE NAME, TYPE, STATUS, VALID CERT, SERIAL NUMBER, NOT AFTER, NOT BEFORE."""
    _show([Section.CERTIFICATES], Filters(), Where.of(pod, namespace, "", node, admin_url), output, lab_dir, timeout)


@proxy_config.command()
def connections(
    pod: PodArgument = None,
    namespace: NamespaceOption = "",
    workload_namespace: WorkloadNamespaceOption = "",
    direction: Annotated[str, typer.Option("--direction", help="inbound or outbound (default: both).")] = "",
    raw: Annotated[bool, typer.Option("--raw", help="Addresses as they are, not names.")] = False,
    node: NodeOption = None,
    admin_url: AdminUrlOption = None,
    output: OutputOption = "table",
    lab_dir: DirOption = DEFAULT_DIR,
    timeout: TimeoutOption = DEFAULT_TIMEOUT,
) -> None:
    """Open connections of the node's pods: WORKLOAD, DIRECTION, LOCAL, REMOTE, AGE."""
    if direction not in ("", "inbound", "outbound"):
        raise typer.BadParameter("expected inbound or outbound", param_hint="--direction")
    where = Where.of(pod, namespace, workload_namespace, node, admin_url)
    filters = Filters(namespace=where.filter, direction=direction, raw=raw)
    _show([Section.CONNECTIONS], filters, where, output, lab_dir, timeout)


@proxy_config.command("all")
def all_(
    pod: PodArgument = None,
    namespace: NamespaceOption = "",
    node: NodeOption = None,
    admin_url: AdminUrlOption = None,
    output: OutputOption = "table",
    lab_dir: DirOption = DEFAULT_DIR,
    timeout: TimeoutOption = DEFAULT_TIMEOUT,
) -> None:
    """Every table (workloads, services, policies, certificates, connections); -o json|yaml prints the whole dump."""
    _show(list(Section), Filters(), Where.of(pod, namespace, "", node, admin_url), output, lab_dir, timeout)


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"ambit proxy-config: {message}", err=True)
    return typer.Exit(code)


@dataclass(frozen=True, slots=True)
class Where:
    """Which node proxy to ask (a pod, a lab node or an admin URL), and the namespace filter."""

    pod: str | None
    pod_namespace: str
    node: str | None
    admin_url: str | None
    filter: str

    @classmethod
    def of(
        cls, pod: str | None, namespace: str, workload_namespace: str, node: str | None, admin_url: str | None
    ) -> Where:
        """istioctl's reading: with a pod, ``-n`` is the pod's namespace and ``--workload-namespace`` the filter;
        without one, ``-n`` filters too (as this command always did)."""
        if pod is None:
            return cls(None, "", node, admin_url, workload_namespace or namespace)
        name, pod_namespace = parse_pod(pod, namespace)
        if node is not None or admin_url is not None:
            raise typer.BadParameter("give a node proxy pod, --node or --admin-url, only one", param_hint="ZTUNNEL_POD")
        return cls(name, pod_namespace, None, None, workload_namespace)


def parse_pod(text: str, namespace: str) -> tuple[str, str]:
    """``NAME``, ``NAME.NAMESPACE`` or ``pod/NAME`` (istioctl's forms) → (name, namespace)."""
    name = text.removeprefix("pod/").removeprefix("pods/")
    if "/" in name:
        raise typer.BadParameter(f"{text!r}: only a pod can be named (NAME, NAME.NAMESPACE or pod/NAME)")
    if "." in name:
        name, _, namespace = name.partition(".")
    namespace = namespace or SYSTEM_NAMESPACE
    if not _DNS_LABEL.fullmatch(name) or not _DNS_LABEL.fullmatch(namespace):
        raise typer.BadParameter(f"{text!r} is not a pod name (NAME, NAME.NAMESPACE or pod/NAME)")
    return name, namespace


def _show(sections: list[Section], filters: Filters, where: Where, output: str, lab_dir: Path, timeout: float) -> None:
    if output not in _OUTPUTS:
        raise typer.BadParameter(f"expected one of {', '.join(_OUTPUTS)}", param_hint="--output")
    admin_url, node = where.admin_url, where.node
    if where.pod is not None:
        node = _node_of_pod(lab_dir, where.pod, where.pod_namespace)
    if admin_url is None:
        argv = child_argv(sections, filters, output, timeout, f"http://127.0.0.1:{ADMIN_PORT}")
        raise typer.Exit(_in_lab(node, lab_dir, timeout, argv))
    if node is not None:
        raise typer.BadParameter("give --node (a lab node) or --admin-url, not both", param_hint="--node")
    try:
        dump = read_config_dump(asyncio.run(fetch_config_dump(admin_url, within=timeout)))
        if output != "table":
            chosen: Any = dump if len(sections) > 1 else select_entries(dump, sections[0], filters)
            text = render_structured(chosen, output)
        else:
            now = time.time()
            text = render_text([build_table(dump, s, filters, now=now) for s in sections], titles=len(sections) > 1)
    except ProxyConfigError as exc:
        raise _fail(str(exc)) from None
    sys.stdout.write(text)


def _in_lab(node: str | None, lab_dir: Path, timeout: float, argv: list[str]) -> int:
    """Run this command again inside the node proxy's network namespace, asking 127.0.0.1:15000; its exit code."""
    topology = Topology.load(lab_dir.resolve())
    if topology is None:
        raise _fail(
            f"no lab in {lab_dir}: give --lab-dir, or --admin-url for any reachable admin port (on a cluster: "
            "`kubectl -n istio-system port-forward pod/<ztunnel pod> 15000`, then --admin-url http://127.0.0.1:15000)"
        )
    name = node or topology.node(1).name
    if topology.node_named(name) is None:
        known = ", ".join(n.name for n in topology.all_nodes())
        raise typer.BadParameter(f"no node {name!r} in this lab (it has {known})", param_hint="--node")
    if os.geteuid() != 0:
        raise _fail("entering a lab node proxy's network namespace needs root (or use --admin-url)")
    netns = node_proxy_netns(topology, name)
    if not Path("/run/netns", netns).exists():
        raise _fail(f"the node proxy of {name} has no network namespace {netns} (is it running?)")
    try:
        done = subprocess.run(
            ["ip", "netns", "exec", netns, sys.executable, "-I", "-m", "ambit.cli", *argv],
            check=False,
            cwd="/",
            timeout=timeout + _CHILD_START,
        )
    except subprocess.TimeoutExpired:
        raise _fail(f"the fetch inside {netns} did not finish within {timeout + _CHILD_START:g} s") from None
    except OSError as exc:
        raise _fail(f"cannot run ip netns exec: {exc.strerror or exc}") from None
    return done.returncode


def _node_of_pod(lab_dir: Path, name: str, namespace: str) -> str:
    """The lab node the node proxy pod ``namespace/name`` runs on."""
    topology = Topology.load(lab_dir.resolve())
    if topology is None:
        raise _fail(f"no lab in {lab_dir}: give --lab-dir, or --admin-url for a reachable admin port")
    from ambit.k8s import KubeClient, KubeClientError, KubeNotFoundError, kinds

    async def get() -> dict[str, Any]:
        async with KubeClient.from_kubeconfig(topology.kubeconfig) as client:
            return await client.get(kinds.PODS, name, namespace)

    try:
        pod = asyncio.run(get())
    except KubeNotFoundError:
        raise _fail(f"no pod {namespace}/{name}") from None
    except KubeClientError as exc:
        raise _fail(f"cannot read pod {namespace}/{name}: {exc}") from None
    labels = (pod.get("metadata") or {}).get("labels") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    if labels.get("app") != "ztunnel" or not isinstance(node, str) or not node:
        raise _fail(f"pod {namespace}/{name} is not a scheduled node proxy (app=ztunnel)")
    return node


def child_argv(sections: list[Section], filters: Filters, output: str, timeout: float, admin_url: str) -> list[str]:
    """The arguments of this same command for the child in the lab, asking ``admin_url`` instead of a lab node."""
    argv = ["proxy-config", sections[0].value if len(sections) == 1 else "all"]
    for flag, value in (("--namespace", filters.namespace), ("--address", filters.address)):
        if value:
            argv += [flag, value]
    if filters.direction:
        argv += ["--direction", filters.direction]
    if filters.raw:
        argv.append("--raw")
    return [*argv, "--output", output, "--timeout", repr(timeout), "--admin-url", admin_url]


def node_proxy_netns(topology: Topology, node: str) -> str:
    """The network namespace of the node proxy on ``node``: its ztunnel pod's."""
    from ambit.k8s import KubeClient, KubeClientError, kinds

    async def pods() -> list[dict[str, Any]]:
        async with KubeClient.from_kubeconfig(topology.kubeconfig) as client:
            items, _ = await client.list(kinds.PODS, "istio-system", label_selector="app=ztunnel")
            return items

    try:
        items = asyncio.run(pods())
    except KubeClientError as exc:
        raise _fail(f"cannot list the node proxies: {exc}") from None
    live = [
        pod
        for pod in items
        if (pod.get("spec") or {}).get("nodeName") == node and not (pod.get("metadata") or {}).get("deletionTimestamp")
    ]
    if not live:
        raise _fail(f"no node proxy (ztunnel pod) on {node}")
    live.sort(key=lambda pod: (pod.get("status") or {}).get("phase") != "Running")
    return topology.pod_netns(str(live[0]["metadata"]["uid"]))
