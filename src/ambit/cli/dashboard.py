"""``ambit dashboard``: the topology page — who talks to whom, mTLS or plaintext, allowed or denied.

It serves one page and a read-only JSON API (:mod:`ambit.observe.dashboard`) on 127.0.0.1:20001 by default
(``--address``/``--port``), from the proxies' flows and config dumps:

- ``--admin-url URL`` (repeatable): admin ports this machine reaches, polled directly (on a cluster, after
  ``kubectl -n istio-system port-forward pod/<ztunnel pod> 15000``);
- the lab (default): a child ``ambit flows --follow --output json`` streams the flows of every node proxy and
  waypoint, and every ``--inventory-every`` seconds a child per node reads its node proxy's ``config_dump`` from
  inside the node's network namespace (as ``ambit proxy-config`` does; root). The lab's kubeconfig gives the policy
  view (``--kubeconfig`` elsewhere): ``ambit policy explain``'s verdict for a chosen pair, computed in this process.

The edges' rates come from the proxies' Istio metrics on their stats port (15020), scraped every ``--interval``
seconds (:mod:`ambit.observe.scraper`): each ``--metrics-url``, or in the lab every node proxy and every waypoint
and gateway pod (their addresses, listed from the API server each time).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ambit.cli.app import app
from ambit.lab.network.topology import DEFAULT_DIR, Topology
from ambit.observe.admin_client import ADMIN_PORT
from ambit.observe.dashboard import AdminSource, DashboardApp, DashboardState, Explainer, serve
from ambit.observe.proxyconfig import ProxyConfigError
from ambit.observe.scraper import MetricsScraper, fixed_targets
from ambit.telemetry.flows import FlowError, read_flow
from ambit.telemetry.topology import TopologyError, read_inventory

STATS_PORT = 15020
"""Where node proxies and waypoints serve their Prometheus metrics (spec §8.2)."""
GATEWAY_LABEL = "gateway.networking.k8s.io/gateway-name"
DEFAULT_PORT = 20001
"""Kiali's port: the page an operator of a mesh expects there."""
MAX_LINE = 64 * 1024
MAX_DUMP = 32 * 1024 * 1024


def _fail(message: str) -> typer.Exit:
    typer.echo(f"ambit dashboard: {message}", err=True)
    return typer.Exit(1)


def make_explainer(kubeconfig: Path | None) -> Explainer:
    """``ambit policy explain`` in this process: the cluster's objects read afresh for each question."""

    async def explainer(source: str, destination: str, port: int) -> dict[str, Any]:
        from ambit.cli.policy import load_config
        from ambit.controlplane.explain import explain
        from ambit.k8s import KubeClientError

        try:
            config = await asyncio.to_thread(load_config, kubeconfig)
        except KubeClientError as exc:
            raise ValueError(f"cannot read the API server: {exc}") from None
        return explain(config, source, destination, port).to_json()

    return explainer


@app.command()
def dashboard(
    admin_url: Annotated[
        list[str] | None,
        typer.Option("--admin-url", help="A reachable proxy admin port to read instead of the lab (repeatable)."),
    ] = None,
    metrics_url: Annotated[
        list[str] | None,
        typer.Option("--metrics-url", help="A proxy's Prometheus /metrics to read edge rates from (repeatable)."),
    ] = None,
    address: Annotated[str, typer.Option("--address", help="Address to serve on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to serve on (0: any free one).")] = (
        DEFAULT_PORT
    ),
    kubeconfig: Annotated[
        Path | None, typer.Option("--kubeconfig", help="For the policy view (default: the lab's, if any).")
    ] = None,
    lab_dir: Annotated[Path, typer.Option("--lab-dir", help="The lab's directory.")] = DEFAULT_DIR,
    interval: Annotated[float, typer.Option("--interval", min=0.2, max=60, help="Seconds between polls.")] = 1.0,
    inventory_every: Annotated[
        float, typer.Option("--inventory-every", min=1, max=600, help="Seconds between config dump reads (lab).")
    ] = 10.0,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, max=600, help="Seconds for each fetch.")] = 10.0,
) -> None:
    """Serve the topology page: workloads, services and the traffic between them, with verdicts."""
    state = DashboardState()
    tasks: list[Any] = []
    if admin_url or metrics_url:
        try:
            sources = [AdminSource(url, url, interval=interval, within=timeout) for url in admin_url or []]
        except ProxyConfigError as exc:
            raise typer.BadParameter(str(exc), param_hint="--admin-url") from None
        tasks = [source.run for source in sources]
        for url in metrics_url or []:
            if not url.startswith(("http://", "https://")):
                raise typer.BadParameter(f"{url!r} is not an http(s) URL", param_hint="--metrics-url")
        if metrics_url:
            targets = fixed_targets([(url, url) for url in metrics_url])
            tasks.append(MetricsScraper(targets, interval=interval, within=timeout).run)
    else:
        topology = Topology.load(lab_dir.resolve())
        if topology is None:
            raise _fail(f"no lab in {lab_dir}: give --lab-dir, or --admin-url for any reachable admin port")
        if os.geteuid() != 0:
            raise _fail("reading a lab's node proxies needs root (or use --admin-url)")
        kubeconfig = kubeconfig or topology.kubeconfig
        tasks = [
            lambda s: _lab_flows(s, lab_dir.resolve(), interval, timeout),
            lambda s: _lab_inventory(s, topology, inventory_every, timeout),
            MetricsScraper(lambda: _lab_metrics_targets(topology), interval=interval, within=timeout).run,
        ]
    explainer = make_explainer(kubeconfig) if kubeconfig else None
    try:
        asyncio.run(_serve(state, DashboardApp(state, explainer=explainer), address, port, tasks))
    except OSError as exc:
        raise _fail(f"cannot serve on {address}:{port}: {exc.strerror or exc}") from None
    except KeyboardInterrupt:
        pass


async def _serve(state: DashboardState, web_app: DashboardApp, address: str, port: int, tasks: list[Any]) -> None:
    runner, bound = await serve(web_app, address, port)
    shown = f"[{address}]" if ":" in address else address
    typer.echo(f"ambit dashboard: serving the topology page on http://{shown}:{bound}/ (Ctrl-C to stop)")
    if web_app.hosts is None:
        typer.echo("ambit dashboard: warning: every address of this machine serves it, to anyone who reaches it")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):  # also where a shell started it in the background (SIGINT ignored)
        loop.add_signal_handler(signum, stop.set)
    running = [asyncio.create_task(task(state), name=f"dashboard source {i}") for i, task in enumerate(tasks)]
    try:
        await stop.wait()  # a source that ends (a lab child exited) leaves what it saw served
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await runner.cleanup()


async def _lab_flows(state: DashboardState, lab_dir: Path, interval: float, within: float) -> None:
    """The lab's flows, streamed by a child ``ambit flows --follow`` (``lab_dir`` absolute)."""
    argv = [sys.executable, "-I", "-m", "ambit.cli", "flows", "--follow", "--output", "json"]
    argv += ["--lab-dir", str(lab_dir), "--interval", repr(interval), "--timeout", repr(within)]
    status = state.status("lab flows")
    # Its own process group: it runs a child per proxy (inside the nodes' namespaces), all ended with it.
    child = await asyncio.create_subprocess_exec(
        *argv, cwd="/", stdout=asyncio.subprocess.PIPE, limit=MAX_LINE, start_new_session=True
    )
    assert child.stdout is not None
    try:
        while True:
            try:
                line = await child.stdout.readline()
            except ValueError:
                status.error = f"a line longer than {MAX_LINE} bytes"
                break
            if not line:
                status.error = f"ambit flows exited ({await child.wait()})"
                break
            try:
                state.add_flows("lab flows", [read_flow(json.loads(line))])
            except (FlowError, ValueError, RecursionError) as exc:
                status.error = f"not a flow: {exc}"[:500]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        await child.wait()


async def _lab_inventory(state: DashboardState, topology: Topology, every: float, within: float) -> None:
    """Each node proxy's workloads, services and policies, from its ``config_dump`` read inside its node."""
    from ambit.cli.proxy_config import node_proxy_netns

    while True:
        for node in topology.all_nodes():
            name = f"node proxy {node.name}"
            status = state.status(name)
            try:
                netns = await asyncio.to_thread(node_proxy_netns, topology, node.name)
                argv = ["ip", "netns", "exec", netns, sys.executable, "-I", "-m", "ambit.cli", "proxy-config", "all"]
                argv += [
                    "--admin-url",
                    f"http://127.0.0.1:{ADMIN_PORT}",
                    "--output",
                    "json",
                    "--timeout",
                    repr(within),
                ]
                body = await _run_bounded(argv, within + 20)
                state.inventories[name] = read_inventory(json.loads(body))
                status.error, status.last_ok = "", state.clock()
            except (OSError, ValueError, RecursionError, TopologyError, typer.Exit) as exc:
                status.error = (str(exc) or type(exc).__name__)[:500]
        await asyncio.sleep(every)


async def _lab_metrics_targets(topology: Topology) -> list[tuple[str, str]]:
    """The metrics URL of each node proxy (a ztunnel pod) and each running waypoint or gateway pod of the lab."""
    from ambit.k8s import KubeClient, KubeClientError, kinds

    found = []
    try:
        async with KubeClient.from_kubeconfig(topology.kubeconfig) as client:
            pods, _ = await client.list(kinds.PODS, None, label_selector=GATEWAY_LABEL)
            if topology.installed:
                ztunnels, _ = await client.list(kinds.PODS, "istio-system", label_selector="app=ztunnel")
                pods += ztunnels
    except KubeClientError as exc:
        raise ValueError(f"cannot list the proxies' pods: {exc}") from None
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        ip = status.get("podIP")
        if status.get("phase") == "Running" and isinstance(ip, str) and ip and not meta.get("deletionTimestamp"):
            shown = f"[{ip}]" if ":" in ip else ip
            found.append((f"{meta.get('namespace')}/{meta.get('name')}", f"http://{shown}:{STATS_PORT}/metrics"))
    return sorted(found)


async def _run_bounded(argv: list[str], within: float) -> bytes:
    """The child's standard output (at most :data:`MAX_DUMP` bytes) if it exits 0 within ``within`` seconds."""
    child = await asyncio.create_subprocess_exec(
        *argv, cwd="/", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert child.stdout is not None and child.stderr is not None
    stdout, stderr = child.stdout, child.stderr

    async def drain(stream: asyncio.StreamReader, most: int) -> bytes:
        kept = bytearray()
        while chunk := await stream.read(65536):
            kept += chunk[: most + 1 - len(kept)]
        return bytes(kept)

    try:
        async with asyncio.timeout(within):
            body, error = await asyncio.gather(drain(stdout, MAX_DUMP), drain(stderr, 4096))
            code = await child.wait()
    except TimeoutError:
        raise ValueError(f"no config dump within {within:g} s") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()
    if len(body) > MAX_DUMP:
        raise ValueError(f"a config dump over {MAX_DUMP} bytes")
    if code != 0:
        raise ValueError(error.decode("utf-8", "replace").strip()[-300:] or f"proxy-config exited {code}")
    return body
