"""The benchmark's lab: a 2-node lab with the mesh, its pods, and every process the benchmark starts.

Namespace ``bench-plain`` is outside the mesh: client ``plain-cli`` on node 1, server ``plain-srv`` on node 2
(and ``plain-srv-local`` on node 1 for the same-node variant). Namespace ``bench-amb`` is ambient and holds the
same three pods (``amb-*``). The pods only sleep: the benchmark runs servers and clients in their network
namespaces itself (``ip netns exec``), so it owns every process it starts and ends each by its pid at the end.
In an enrolled pod those processes are redirected like the pod's own (the rules live in the pod's namespace).

:class:`BenchLab` holds the machine-wide lab lock from before ``ambit lab up`` until after ``ambit lab down``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ambit.errors import AmbitError
from ambit.lab.cluster.orphans import claim_lab
from ambit.lab.network.topology import Topology
from ambit.lab.runtime.processes import container_main_pid
from bench.lab import lab_lock

REPO = Path(__file__).resolve().parents[2]
PLAIN, AMBIENT = "bench-plain", "bench-amb"
LAB_UP_TIMEOUT = 120.0
PROXY_RESTART_TIMEOUT = 60.0
READINESS_PORT = 15021
SYSTEM = "istio-system"


class BenchLabError(AmbitError):
    """The lab, a pod, or a process the benchmark needs did not come up."""


def _pod(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "main", "image": "none", "command": ["sleep", "infinity"]}],
        },
    }


def ambit(*args: str, timeout: float = 60.0) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ambit.cli", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise BenchLabError(f"ambit {' '.join(args)} failed ({done.returncode}): {done.stderr}{done.stdout}")
    return done.stdout


@dataclass
class Processes:
    """Processes started in network namespaces; :meth:`stop_all` ends each by its pid (TERM, then KILL)."""

    logs: Path
    started: list[subprocess.Popen[str]] = field(default_factory=list)

    def start(self, netns: str, argv: Sequence[str], name: str, *, stdin: int | None = None) -> subprocess.Popen[str]:
        log: IO[str] = open(self.logs / f"{name}.log", "a")  # noqa: SIM115 - the child keeps it
        with log:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", netns, *argv],
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE if stdin is not None else log,
                stderr=log,
                text=True,
                cwd=REPO,
                env=dict(os.environ, PYTHONPATH=str(REPO)),
                preexec_fn=_raise_fd_limit,  # noqa: PLW1509 - only a setrlimit
            )
        self.started.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[str]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()

    def stop_all(self) -> None:
        while self.started:
            self.stop(self.started.pop())


def _raise_fd_limit() -> None:
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@dataclass
class BenchLab:
    topology: Topology
    kubecache: Path
    netns: dict[str, str] = field(default_factory=dict)
    """Pod name → its network namespace."""
    ips: dict[str, str] = field(default_factory=dict)
    proxy_flags: tuple[str, ...] = ()
    """The extra flags the node proxies were last restarted with (:meth:`restart_node_proxies`)."""
    base_args: tuple[str, ...] | None = None
    """The node proxy container's args as installed (read at the first restart)."""
    extra_args: tuple[str, ...] = ()
    """Args added to the installed ones at every restart (``--node-proxy-args``: a variant of the node proxy, such
    as ``--tls-transport=socket``, measured through every scenario, its own restarts included)."""

    def kubectl(self, *args: str, input: str | None = None) -> str:
        env = dict(os.environ, KUBECONFIG=str(self.topology.kubeconfig), KUBECACHEDIR=str(self.kubecache))
        done = subprocess.run(
            ["kubectl", *args], input=input, capture_output=True, text=True, env=env, timeout=60, check=False
        )
        if done.returncode != 0:
            raise BenchLabError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr}")
        return done.stdout

    def create_pods(self, same_node: bool) -> None:
        n1, n2 = (node.name for node in self.topology.all_nodes())
        self.kubectl("create", "namespace", PLAIN)
        self.kubectl("create", "namespace", AMBIENT)
        self.kubectl("label", "namespace", AMBIENT, "istio.io/dataplane-mode=ambient")
        for namespace, prefix in ((PLAIN, "plain"), (AMBIENT, "amb")):
            pods = [_pod(f"{prefix}-cli", n1), _pod(f"{prefix}-srv", n2)]
            if same_node:
                pods.append(_pod(f"{prefix}-srv-local", n1))
            self.kubectl("apply", "-n", namespace, "-f", "-", input="\n".join(json.dumps(p) for p in pods))
        deadline = time.monotonic() + 90
        expected = 6 if same_node else 4
        while True:
            pods = self._pods()
            ready = [p for p in pods if _ready(p) and (p.get("status") or {}).get("podIP")]
            enrolled = all(
                (p["metadata"].get("annotations") or {}).get("ambient.istio.io/redirection") == "enabled"
                for p in ready
                if p["metadata"]["namespace"] == AMBIENT
            )
            if len(ready) == expected and enrolled:
                break
            if time.monotonic() > deadline:
                raise BenchLabError(f"pods not Ready and enrolled within 90 s: {len(ready)} of {expected}")
            time.sleep(0.3)
        for pod in ready:
            name = pod["metadata"]["name"]
            self.netns[name] = self.topology.pod_netns(str(pod["metadata"]["uid"]))
            self.ips[name] = str(pod["status"]["podIP"])

    def reuse_time_wait(self) -> None:
        """``net.ipv4.tcp_tw_reuse=1`` in every pod: the connection-rate scenarios open tens of thousands of
        connections, and a client whose ports are all in TIME_WAIT measures the kernel's port search, not a mode."""
        for netns in self.netns.values():
            subprocess.run(
                ["ip", "netns", "exec", netns, "sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"], check=True, timeout=10
            )

    def _pods(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = json.loads(self.kubectl("get", "pods", "-A", "-o", "json"))["items"]
        return [p for p in items if p["metadata"]["namespace"] in (PLAIN, AMBIENT)]

    def node_proxy_pods(self) -> dict[str, dict[str, Any]]:
        """Node name → its running node proxy pod (the ztunnel DaemonSet's; a terminating one is left out)."""
        items = json.loads(self.kubectl("get", "pods", "-n", SYSTEM, "-l", "app=ztunnel", "-o", "json"))["items"]
        return {
            str(p["spec"].get("nodeName")): p
            for p in items
            if not p["metadata"].get("deletionTimestamp") and (p.get("status") or {}).get("phase") == "Running"
        }

    def node_proxy_pids_by_node(self) -> dict[str, list[int]]:
        """Node name → the pid of its node proxy: the main process of the ztunnel container."""
        found: dict[str, list[int]] = {}
        for node, pod in self.node_proxy_pods().items():
            found.setdefault(node, []).extend(_container_pids(pod))
        return found

    def control_plane_pids(self) -> list[int]:
        """The main processes of the running istiod pods' containers."""
        items = json.loads(self.kubectl("get", "pods", "-n", SYSTEM, "-l", "app=istiod", "-o", "json"))["items"]
        return sorted(
            pid for pod in items if not pod["metadata"].get("deletionTimestamp") for pid in _container_pids(pod)
        )

    def node_proxy_pids(self) -> list[int]:
        pids = sorted(pid for pids in self.node_proxy_pids_by_node().values() for pid in pids)
        if len(pids) < len(self.topology.all_nodes()):
            raise BenchLabError(f"expected a node proxy per node, found pids {pids}")
        return pids

    def restart_node_proxies(self, flags: Sequence[str], timeout: float = PROXY_RESTART_TIMEOUT) -> list[int]:
        """Restart every node proxy with ``flags`` appended (none: their defaults); the new pids once all are ready.

        As an operator would on a cluster: the ztunnel DaemonSet's container args become the installed ones plus
        ``flags`` (with a ``restartedAt`` annotation, so that the same flags twice still roll), and the rollout
        (maxSurge 1, the old proxies draining what they still relay, which the benchmark has stopped) is waited
        for with ``kubectl rollout status``; then every node runs a new proxy with exactly these flags.
        """
        if self.base_args is None:
            daemonset = json.loads(self.kubectl("get", "daemonset", "ztunnel", "-n", SYSTEM, "-o", "json"))
            self.base_args = tuple(daemonset["spec"]["template"]["spec"]["containers"][0].get("args") or ())
        old = set(self.node_proxy_pids())
        args = [*self.base_args, *self.extra_args, *flags]
        patch = [
            {"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args},
            {
                "op": "add",  # a JSON pointer: "~1" is "/"
                "path": "/spec/template/metadata/annotations/kubectl.kubernetes.io~1restartedAt",
                "value": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{time.time_ns() % 10**9:09d}Z",
            },
        ]
        self.kubectl("patch", "daemonset", "ztunnel", "-n", SYSTEM, "--type=json", "-p", json.dumps(patch))
        self.kubectl("rollout", "status", "daemonset/ztunnel", "-n", SYSTEM, f"--timeout={timeout:g}s")
        wanted, previous = tuple(flags), self.proxy_flags
        nodes = self.topology.all_nodes()
        deadline = time.monotonic() + timeout
        while True:
            by_node = self.node_proxy_pids_by_node()
            fresh = [pid for pids in by_node.values() for pid in pids if pid not in old]
            if len(fresh) == len(nodes) and len(by_node) == len(nodes):
                ready = all(_proxy_ready(self.node_proxy_address(n.name)) for n in nodes)
                if ready and all(_has_flags(_cmdline(pid), wanted, previous) for pid in fresh):
                    self.proxy_flags = wanted
                    return sorted(fresh)
            if time.monotonic() > deadline:
                raise BenchLabError(
                    f"the node proxies were not back and ready with flags {list(wanted)} within {timeout:.0f} s "
                    f"(old pids {sorted(old)}, now {by_node}); see kubectl logs -n {SYSTEM} -l app=ztunnel"
                )
            time.sleep(0.2)

    def node_proxy_address(self, node: str) -> str:
        """The pod IP of ``node``'s node proxy (its metrics on :15020, readiness on :15021)."""
        pod = self.node_proxy_pods().get(node)
        if pod is None or not (pod.get("status") or {}).get("podIP"):
            return ""
        return str(pod["status"]["podIP"])

    def metrics(self, index: int) -> str:
        import urllib.request

        url = f"http://{self.node_proxy_address(self.topology.node(index).name)}:15020/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())


def _container_pids(pod: Mapping[str, Any]) -> list[int]:
    """The main process of each running container of ``pod``."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or ()
    return [pid for status in statuses if (pid := container_main_pid(status)) is not None]


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _has_flags(args: list[str], wanted: tuple[str, ...], previous: tuple[str, ...]) -> bool:
    """The flags come last: ``wanted`` ends the command line, and no flag of ``previous`` stays."""
    if wanted:
        return args[-len(wanted) :] == list(wanted)
    return bool(args) and not set(previous) & set(args)


def _proxy_ready(address: str) -> bool:
    """The node proxy at ``address`` answers 200 on ``/healthz/ready`` (a refused connection or 500: not yet)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{address}:{READINESS_PORT}/healthz/ready", timeout=2) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def bench_lab(base: Path) -> Iterator[BenchLab]:
    """Hold the lab lock, ``ambit lab up`` (the mesh installed from deploy/) in ``base/lab``, and always ``ambit lab
    down``."""
    directory = base / "lab"
    with lab_lock():
        try:
            claim_lab(directory)  # if this benchmark is killed, the next lab lock holder takes the lab down
            ambit("lab", "up", "--dir", str(directory), "--nodes", "2", timeout=LAB_UP_TIMEOUT)
            topology = Topology.load(directory)
            if topology is None:
                raise BenchLabError("ambit lab up wrote no lab.json")
            yield BenchLab(topology, base / "kubecache")
        finally:
            if directory.exists():
                ambit("lab", "down", "--dir", str(directory), timeout=90)
