"""``ambit flows``: the connections (and waypoint requests) the proxies saw, with their verdicts, like Hubble's
``observe``.

Each node proxy and waypoint keeps its last flows in a bounded ring (:mod:`ambit.telemetry.flows`) served on its
admin port as ``GET /flows?after=N``. This command reads them:

- ``--admin-url URL`` (repeatable): any admin port this machine reaches (on a cluster, after ``kubectl -n
  istio-system port-forward pod/<ztunnel pod> 15000``; a waypoint's pod the same way).
- the lab (default): the node proxy of every node (or of each ``--node``) and every running waypoint and gateway
  pod (label ``gateway.networking.k8s.io/gateway-name``) on those nodes: their requests, with answers and routes.
  As ``ambit proxy-config`` does, a child of this command runs in each proxy's network namespace (root, isolated
  Python, from ``/``) with ``--admin-url http://127.0.0.1:15000 --output json`` and writes one JSON flow per line;
  this process reads the children's lines (each ≤ 64 KiB and parsed with the same bounds as a page), filters,
  merges and prints them. A proxy's flows are tagged with its node's name, or ``<namespace>/<pod>``.

Without ``--follow`` the flows the proxies hold now are printed, oldest first, at most ``--last`` of them; with it,
new flows are printed as they come (polled every ``--interval`` seconds) until interrupted or ``--for`` seconds
passed. A proxy's answer that is not a flow page is reported on stderr and that proxy is left out; a reader that
fell behind is told how many flows it missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import typer

from ambit.cli.app import app
from ambit.httpfetch import HttpFetchError, fetch_body
from ambit.lab.network.topology import DEFAULT_DIR, Topology
from ambit.observe.admin_client import ADMIN_PORT, config_dump_url
from ambit.observe.proxyconfig import ProxyConfigError
from ambit.telemetry.flows import (
    MAX_PAGE,
    MAX_PAGE_BYTES,
    Flow,
    FlowError,
    FlowFilter,
    flow_to_json,
    read_flow,
    read_page,
    render_line,
)

GATEWAY_LABEL = "gateway.networking.k8s.io/gateway-name"
MAX_LINE = 64 * 1024
"""Longest JSON line a lab child may write (a flow is well under 8 KiB)."""
_OUTPUTS = ("text", "json")


def flows_url(admin_url: str, after: int) -> str:
    """The ``/flows`` URL under an admin URL (checked as ``proxy-config`` checks it)."""
    base = config_dump_url(admin_url).removesuffix("/config_dump")
    return f"{base}/flows?after={after}&limit={MAX_PAGE}"


async def poll(
    admin_url: str, proxy: str, *, follow: bool, interval: float, deadline: float | None, within: float
) -> AsyncIterator[Flow]:
    """The flows of one proxy: what it holds now, then (``follow``) each new one until ``deadline``."""
    after = 0
    async with aiohttp.ClientSession(trust_env=False) as session:
        while True:
            body = await fetch_body(session, flows_url(admin_url, after), within=within, max_bytes=MAX_PAGE_BYTES)
            page = read_page(body, proxy)
            if page.dropped:
                typer.echo(
                    f"ambit flows: {proxy or admin_url}: {page.dropped} flows were dropped before read", err=True
                )
            for flow in page.flows:
                yield flow
            after = page.next
            if len(page.flows) == MAX_PAGE:
                continue  # more waiting
            if not follow or (deadline is not None and time.monotonic() >= deadline):
                return
            await asyncio.sleep(interval)


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"ambit flows: {message}", err=True)
    return typer.Exit(code)


@app.command()
def flows(
    node: Annotated[
        list[str] | None, typer.Option("--node", help="A lab node whose node proxy to read (repeatable; default all).")
    ] = None,
    admin_url: Annotated[
        list[str] | None,
        typer.Option("--admin-url", help="A reachable admin port to read instead of the lab (repeatable)."),
    ] = None,
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="Only flows from or to this namespace.")] = "",
    pod: Annotated[str, typer.Option("--pod", help="Only flows from or to this pod (workload name).")] = "",
    verdict: Annotated[str, typer.Option("--verdict", help="Only allowed, denied or failed flows.")] = "",
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new flows.")] = False,
    last: Annotated[int, typer.Option("--last", help="Without --follow: at most this many, the newest.", min=1)] = 100,
    for_seconds: Annotated[
        float | None, typer.Option("--for", help="With --follow: stop after this many seconds.", min=0.1)
    ] = None,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between polls.", min=0.1, max=60)] = 0.5,
    output: Annotated[str, typer.Option("--output", "-o", help="text, or json (one flow per line).")] = "text",
    proxy_name: Annotated[str, typer.Option("--proxy-name", hidden=True)] = "",
    lab_dir: Annotated[Path, typer.Option("--lab-dir", help="The lab's directory.")] = DEFAULT_DIR,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds for each fetch.", min=0.1, max=600)] = 10.0,
) -> None:
    """The connections and requests the proxies saw: who to whom, mTLS or plaintext, allowed or denied (by which
    policy), bytes and duration."""
    if output not in _OUTPUTS:
        raise typer.BadParameter(f"expected one of {', '.join(_OUTPUTS)}", param_hint="--output")
    try:
        wanted = FlowFilter(namespace=namespace, pod=pod, verdict=verdict)
    except FlowError as exc:
        raise typer.BadParameter(str(exc), param_hint="--verdict") from None
    deadline = time.monotonic() + for_seconds if for_seconds is not None else None
    if admin_url:
        if node:
            raise typer.BadParameter("give --node (lab nodes) or --admin-url, not both", param_hint="--node")
        sources = [(url, proxy_name or url) for url in admin_url]
        code = asyncio.run(_from_admin(sources, wanted, follow, last, interval, deadline, output, timeout))
    else:
        commands = _lab_commands(node or [], lab_dir, follow, interval, for_seconds, timeout)
        code = asyncio.run(_from_lab(commands, wanted, follow, last, output))
    raise typer.Exit(code)


def _emit(flow: Flow, output: str) -> None:
    line = json.dumps(flow_to_json(flow)) if output == "json" else render_line(flow)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _from_admin(
    sources: list[tuple[str, str]],
    wanted: FlowFilter,
    follow: bool,
    last: int,
    interval: float,
    deadline: float | None,
    output: str,
    within: float,
) -> int:
    failures = 0
    held: list[Flow] = []

    async def one(url: str, proxy: str) -> None:
        nonlocal failures
        try:
            async for flow in poll(url, proxy, follow=follow, interval=interval, deadline=deadline, within=within):
                if not wanted(flow):
                    continue
                if follow:
                    _emit(flow, output)
                else:
                    held.append(flow)
        except (HttpFetchError, FlowError, ProxyConfigError) as exc:
            typer.echo(f"ambit flows: {proxy}: {exc}", err=True)
            failures += 1

    await asyncio.gather(*(one(url, proxy) for url, proxy in sources))
    if not follow:
        for flow in sorted(held, key=lambda f: (f.time, f.proxy, f.seq))[-last:]:
            _emit(flow, output)
    return 1 if failures == len(sources) else 0


def _lab_commands(
    nodes: list[str], lab_dir: Path, follow: bool, interval: float, for_seconds: float | None, within: float
) -> list[tuple[str, list[str]]]:
    """Each chosen node proxy, and each waypoint or gateway pod on the chosen nodes, with the command that reads its
    flows from inside its network namespace."""
    from ambit.cli.proxy_config import node_proxy_netns

    topology = Topology.load(lab_dir.resolve())
    if topology is None:
        raise _fail(f"no lab in {lab_dir}: give --lab-dir, or --admin-url for any reachable admin port")
    known = [n.name for n in topology.all_nodes()]
    for name in nodes:
        if name not in known:
            raise typer.BadParameter(f"no node {name!r} in this lab (it has {', '.join(known)})", param_hint="--node")
    if os.geteuid() != 0:
        raise _fail("entering a lab node proxy's network namespace needs root (or use --admin-url)")

    def child(proxy: str, netns: str) -> tuple[str, list[str]]:
        argv = ["flows", "--admin-url", f"http://127.0.0.1:{ADMIN_PORT}", "--proxy-name", proxy, "--output", "json"]
        argv += ["--interval", repr(interval), "--timeout", repr(within), "--last", str(10 * MAX_PAGE)]
        if follow:
            argv.append("--follow")
            if for_seconds is not None:
                argv += ["--for", repr(for_seconds)]
        return proxy, ["ip", "netns", "exec", netns, sys.executable, "-I", "-m", "ambit.cli", *argv]

    chosen = nodes or known
    commands = [child(name, node_proxy_netns(topology, name)) for name in chosen]
    commands += [child(proxy, netns) for proxy, netns in _gateway_pods(topology, set(chosen))]
    return commands


def _gateway_pods(topology: Topology, nodes: set[str]) -> list[tuple[str, str]]:
    """``(namespace/pod, network namespace)`` of each running waypoint or gateway pod on ``nodes``."""
    from ambit.k8s import KubeClient, KubeClientError, kinds

    async def pods() -> list[dict[str, Any]]:
        async with KubeClient.from_kubeconfig(topology.kubeconfig) as client:
            items, _ = await client.list(kinds.PODS, None, label_selector=GATEWAY_LABEL)
            return items

    try:
        items = asyncio.run(pods())
    except KubeClientError as exc:
        typer.echo(f"ambit flows: cannot list the waypoints and gateways, left out: {exc}", err=True)
        return []
    found = []
    for pod in items:
        meta, spec, status = (pod.get(k) or {} for k in ("metadata", "spec", "status"))
        if spec.get("nodeName") in nodes and status.get("phase") == "Running" and not meta.get("deletionTimestamp"):
            found.append((f"{meta.get('namespace')}/{meta.get('name')}", topology.pod_netns(str(meta.get("uid")))))
    return sorted(found)


async def _from_lab(
    commands: list[tuple[str, list[str]]], wanted: FlowFilter, follow: bool, last: int, output: str
) -> int:
    children = []
    for name, command in commands:
        child = await asyncio.create_subprocess_exec(*command, cwd="/", stdout=asyncio.subprocess.PIPE, limit=MAX_LINE)
        children.append((name, child))
    held: list[Flow] = []

    async def read(name: str, child: asyncio.subprocess.Process) -> int:
        assert child.stdout is not None
        while True:
            try:
                line = await child.stdout.readline()
            except ValueError:  # a line over MAX_LINE
                typer.echo(f"ambit flows: {name}: a line longer than {MAX_LINE} bytes; left out", err=True)
                child.kill()
                break
            if not line:
                break
            try:
                flow = read_flow(json.loads(line), name)
            except (FlowError, ValueError, RecursionError) as exc:
                typer.echo(f"ambit flows: {name}: not a flow: {exc}", err=True)
                continue
            if not wanted(flow):
                continue
            if follow:
                _emit(flow, output)
            else:
                held.append(flow)
        return await child.wait()

    try:
        codes = await asyncio.gather(*(read(name, child) for name, child in children))
    finally:
        for _, child in children:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
    if not follow:
        for flow in sorted(held, key=lambda f: (f.time, f.proxy, f.seq))[-last:]:
            _emit(flow, output)
    return 1 if all(codes) else 0
