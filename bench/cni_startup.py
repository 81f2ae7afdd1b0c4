"""Benchmark of the ``ambit-cni`` plugin's start-up: the runtime waits on it for every pod sandbox.

``python -m bench.cni_startup [--runs 50] [--out bench/results]`` execs, ``--runs`` times each, as a container
runtime does (environment, network configuration on stdin, result on stdout), and times each exec from spawn to
exit (``subprocess.run``; the wall clock of this process):

1. ``VERSION`` of the plugin as the node agent installs it (the ``#!/bin/sh`` wrapper of
   :func:`ambit.cni.installer.render_wrapper`: ``sh`` + ``python -I -m ambit.cni.plugin``) and of the
   ``ambit-cni`` console script;
2. ``ADD`` of a pod in an excluded namespace (``kube-system``: no API call, ``prevResult`` echoed);
3. ``ADD`` of an ambient pod: the Pod and its Namespace read from a real API server (``ambit apiserver`` as a
   child process, on loopback, over TLS), then ``POST /cmdadd`` to a stub node agent on a UNIX socket (a thread
   of this process that answers 200 at once), so the figure is the plugin's own cost, not the agent's enrolment;
4. references in the same run: ``/usr/lib/cni/bridge VERSION`` (a Go CNI plugin, the node's primary) and a bare
   ``python -I -c pass``.

Each figure is the median and the p90 over the runs, with its ratio to the bridge plugin's median (or p90). A
first untimed exec of each warms the page cache. Every ADD result is checked (``prevResult`` unchanged) and the
stub agent must have seen one event per ambient ADD, so a plugin that fails fast cannot look fast.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from ambit.cni.installer import render_wrapper
from ambit.k8s import KubeClient, kinds
from bench.report import Measurement, Report, median, percentile

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
BRIDGE = Path("/usr/lib/cni/bridge")
CONSOLE_SCRIPT = Path(sys.executable).parent / "ambit-cni"
PREV_RESULT = {
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/bench"}],
    "ips": [{"interface": 0, "address": "198.18.200.7/24", "gateway": "198.18.200.1"}],
}
NOTES = [
    "Wall-clock time of one exec (spawn to exit) from this process; every exec is a cold interpreter start.",
    "The ambient ADD reads the Pod and the Namespace from `ambit apiserver` (loopback, TLS) and posts to a stub "
    "node agent that answers 200 at once: the plugin's own cost, not the agent's enrolment.",
    "Reference: `/usr/lib/cni/bridge VERSION`, the node's primary CNI plugin (Go), measured in the same run.",
]


class BenchError(Exception):
    """The benchmark cannot run here (a missing binary, a server that does not start, a wrong result)."""


# -- the stub node agent ----------------------------------------------------------------------------------------
class _AgentHandler(BaseHTTPRequestHandler):
    server: _StubAgent

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.events.append(json.loads(body))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def address_string(self) -> str:
        return "agent-socket"


class _StubAgent(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: Path) -> None:
        self.events: list[dict[str, Any]] = []
        super().__init__(str(path), _AgentHandler)


@contextmanager
def stub_agent(path: Path) -> Iterator[_StubAgent]:
    server = _StubAgent(path)
    thread = threading.Thread(target=server.serve_forever, name="stub node agent", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


# -- the API server ------------------------------------------------------------------------------------------------
@contextmanager
def apiserver(data_dir: Path) -> Iterator[Path]:
    """``ambit apiserver`` on a free loopback port until its ready line; yields its admin kubeconfig."""
    with open(data_dir.parent / "apiserver.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ambit.cli", "apiserver", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "ready" not in line:
            raise BenchError(f"ambit apiserver did not start: {line!r} (see {data_dir.parent / 'apiserver.log'})")
        yield data_dir / "kubeconfig"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


async def _create_pods(kubeconfig: Path) -> None:
    async with KubeClient.from_kubeconfig(kubeconfig) as kube:
        labels = {"istio.io/dataplane-mode": "ambient"}
        await kube.create(kinds.NAMESPACES, {"metadata": {"name": "bench", "labels": labels}})
        spec = {"nodeName": "node-1", "containers": [{"name": "c", "image": "none"}]}
        await kube.create(kinds.PODS, {"metadata": {"name": "web"}, "spec": spec}, "bench")


# -- exec and time ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Exec:
    """One way of running something the runtime would run."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    stdin: bytes = b""

    def once(self) -> tuple[float, bytes]:
        began = time.perf_counter()
        done = subprocess.run(self.argv, input=self.stdin, env=dict(self.env), capture_output=True, check=False)
        took = time.perf_counter() - began
        if done.returncode != 0:
            raise BenchError(f"{' '.join(self.argv)} failed ({done.returncode}): {done.stdout!r} {done.stderr!r}")
        return took, done.stdout


def cni_env(command: str, namespace: str = "bench", name: str = "web") -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "bench0123",
        "CNI_NETNS": "/var/run/netns/bench",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": str(BRIDGE.parent),
        "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}",
    }


def time_runs(what: Exec, runs: int, check: Any = None) -> list[float]:
    """Seconds of each of ``runs`` execs after one untimed warm-up; ``check(stdout)`` judges every result."""
    what.once()
    times: list[float] = []
    for _ in range(runs):
        took, out = what.once()
        if check is not None:
            check(out)
        times.append(took)
    return times


def _prev_result_unchanged(out: bytes) -> None:
    if json.loads(out) != PREV_RESULT:
        raise BenchError(f"ADD did not return prevResult unchanged: {out[:200]!r}")


def run(runs: int, out: Path | None = RESULTS, *, echo: bool = True) -> Report:
    if not BRIDGE.is_file():
        raise BenchError(f"{BRIDGE} is missing (apt-get install containernetworking-plugins)")
    report = Report("ambit-cni start-up", f"{runs} runs", notes=list(NOTES))
    with tempfile.TemporaryDirectory(prefix="cni-bench", dir="/tmp") as directory:
        base = Path(directory)
        wrapper = base / "ambit-cni"
        wrapper.write_text(render_wrapper(Path(sys.executable)))
        wrapper.chmod(0o755)
        version_stdin = json.dumps({"cniVersion": "1.0.0"}).encode()

        def config(kubeconfig: Path, agent_socket: Path) -> bytes:
            doc = {
                "cniVersion": "1.0.0",
                "name": "ambit-lab",
                "type": "ambit-cni",
                "kubeconfig": str(kubeconfig),
                "agent_socket": str(agent_socket),
                "exclude_namespaces": ["kube-system"],
                "ambient_enabled": True,
                "prevResult": PREV_RESULT,
            }
            return json.dumps(doc).encode()

        bridge = time_runs(Exec((str(BRIDGE),), cni_env("VERSION"), version_stdin), runs)
        figures: list[tuple[str, list[float]]] = [
            (
                "ambit-cni VERSION (installed wrapper)",
                time_runs(Exec((str(wrapper),), cni_env("VERSION"), version_stdin), runs),
            ),
        ]
        if CONSOLE_SCRIPT.is_file():
            console = Exec((str(CONSOLE_SCRIPT),), cni_env("VERSION"), version_stdin)
            figures.append(("ambit-cni VERSION (console script)", time_runs(console, runs)))
        agent_socket = base / "pluginevent.sock"
        data_dir = base / "apiserver"
        with apiserver(data_dir) as kubeconfig, stub_agent(agent_socket) as agent:
            asyncio.run(_create_pods(kubeconfig))
            conf = config(kubeconfig, agent_socket)
            excluded = Exec((str(wrapper),), cni_env("ADD", "kube-system", "coredns"), conf)
            figures.append(("ambit-cni ADD, excluded namespace", time_runs(excluded, runs, _prev_result_unchanged)))
            ambient = Exec((str(wrapper),), cni_env("ADD"), conf)
            figures.append(("ambit-cni ADD, ambient pod", time_runs(ambient, runs, _prev_result_unchanged)))
            if len(agent.events) != runs + 1:
                raise BenchError(f"the stub agent saw {len(agent.events)} events for {runs + 1} ambient ADDs")
        python = Exec((sys.executable, "-I", "-c", "pass"), {"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        figures.append(("bare python -I -c pass", time_runs(python, runs)))

    report.add(Measurement("bridge VERSION (Go)", "median", median(bridge) * 1000, "ms"))
    report.add(Measurement("bridge VERSION (Go)", "p90", percentile(bridge, 90) * 1000, "ms"))
    for scenario, times in figures:
        for metric, value, reference in (
            ("median", median(times), median(bridge)),
            ("p90", percentile(times, 90), percentile(bridge, 90)),
        ):
            report.add(Measurement(scenario, metric, value * 1000, "ms", reference * 1000, "bridge VERSION"))
    report.env["loadavg_end"] = os.getloadavg()[0]
    if echo:
        print(report.markdown())
    if out is not None:
        md, js = report.write(out, "cni_startup")
        if echo:
            print(f"written: {md} and {js}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cni_startup", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="timed execs of each command")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where cni_startup.md and cni_startup.json go")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs is at least 1")
    try:
        run(args.runs, args.out)
    except BenchError as exc:
        print(f"bench.cni_startup: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
