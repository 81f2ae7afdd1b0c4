"""Driving a real lab from tests: bring it up and down under the machine-wide lock, kubectl, ``ambit lab exec``.

Only one lab network can exist on the machine at a time (every lab puts ``198.18.0.1`` on its bridge and routes
the same pod ranges in the root namespace), and other developers run tests concurrently: a lab is brought up only
while holding ``ROOT_LAB_LOCK``, the same ``flock`` that ``tests/netns`` takes, and the lock is released only after
``ambit lab down`` has run. :func:`running_lab` runs ``ambit lab down`` however it is left, also when ``lab up``
failed or timed out, and then checks that nothing with the lab's prefix is left (namespaces, links, routes).

Every wait is bounded: :func:`wait_until` polls with a deadline and fails with the last value it saw.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from tests import harness

from ambit.lab.cluster.orphans import claim_lab
from ambit.lab.network.topology import NodeAddresses, Topology
from ambit.lab.runtime.processes import container_main_pid

ROOT_LAB_LOCK = harness.ROOT_LAB_LOCK
LOCK_WAIT = float(os.environ.get("AMBIT_E2E_LOCK_WAIT", "1800"))
"""Seconds to queue behind other labs (someone else's e2e modules, minutes each); the test's timeout stops meanwhile
(:func:`tests.harness.timeout_paused`)."""
LAB_UP_TIMEOUT = 90.0
LAB_INSTALL_TIMEOUT = 330.0
"""``lab up`` with the mesh also waits (up to 240 s) for the mesh's rollout."""
LAB_DOWN_TIMEOUT = 60.0
TEST_TIMEOUT = 660.0
"""pytest-timeout's limit for a test: it counts fixture set-up (a module's first test brings the lab up and installs
the mesh, within ``LAB_INSTALL_TIMEOUT``), but not the wait for the lock."""

T = TypeVar("T")

COMPONENT_APPS = {"nodeproxy": "app=ztunnel", "nodeagent": "k8s-app=istio-cni-node", "controlplane": "app=istiod"}
"""The label selector of each mesh component's pods when the mesh is installed."""


def root_lab_lock(wait: float = LOCK_WAIT) -> contextlib.AbstractContextManager[None]:
    """Hold the machine-wide lab lock (shared with tests/netns)."""
    return harness.root_lab_lock(wait)


def wait_until(what: str, probe: Callable[[], T], timeout: float, interval: float = 0.2) -> T:
    """Call ``probe`` until it returns something truthy (returned) or ``timeout`` passes (fails with the last)."""
    deadline = time.monotonic() + timeout
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:g} s: {what} (last: {last!r})")
        time.sleep(interval)


def ambit(*args: str, timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "ambit.cli", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"ambit {' '.join(args)} failed ({done.returncode}): {done.stderr}{done.stdout}")
    return done


def condition(obj: Mapping[str, Any], kind: str) -> dict[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def is_ready(pod: Mapping[str, Any]) -> bool:
    return condition(pod, "Ready").get("status") == "True"


def container_state(status: Mapping[str, Any]) -> str:
    """``name=state(reason)`` of one entry of a pod's ``containerStatuses``."""
    state = status.get("state") or {}
    kind = next(iter(state), "?")
    reason = (state.get(kind) or {}).get("reason")
    return f"{status.get('name')}={kind}" + (f"({reason})" if reason else "")


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def lab_leftovers(prefix: str) -> list[str]:
    """Anything on the machine named with the lab's prefix: namespaces, root links, root routes on its links, the
    containers' cgroups."""
    mine = prefix + "-"
    out: list[str] = []
    for argv in (["ip", "netns", "list"], ["ip", "-br", "link"], ["ip", "route"]):
        text = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        out += [line for line in text.splitlines() if mine in line]
    out += [str(path) for path in Path("/sys/fs/cgroup").glob(f"*/ambit-{prefix}")]
    return out


def _parent_pid(pid: int) -> int | None:
    """The parent of process ``pid``, or None once it has gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


@dataclass
class Lab:
    """A lab that is up: its topology, and ways to drive it (kubectl, ``ambit lab exec``)."""

    topology: Topology
    kubecache: Path

    @property
    def directory(self) -> Path:
        return self.topology.path

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, KUBECONFIG=str(self.topology.kubeconfig), KUBECACHEDIR=str(self.kubecache))
        done = subprocess.run(
            ["kubectl", *args], input=input, capture_output=True, text=True, env=env, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr}")
        return done

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def items(self, *args: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get(*args)["items"]
        return items

    def apply(self, *objects: Mapping[str, Any], namespace: str | None = None) -> None:
        # A stream of JSON objects, not a ``kind: List``: for a List kubectl validates against /openapi/v2, which
        # the embedded API server does not serve (404, and kubectl gives up).
        ns = ["-n", namespace] if namespace else []
        self.kubectl("apply", *ns, "-f", "-", input="\n".join(json.dumps(o) for o in objects))

    def pod(self, name: str, namespace: str) -> dict[str, Any]:
        pod: dict[str, Any] = self.get("pod", name, "-n", namespace)
        return pod

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        return self.items("pods", "-n", namespace, *(["-l", selector] if selector else []))

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """core/v1 Events about the object ``name`` (series folded, as the API server converts them)."""
        return [
            e
            for e in self.items("events", "-n", namespace)
            if (e.get("involvedObject") or e.get("regarding") or {}).get("name") == name
        ]

    def wait_pods_ready(self, namespace: str, selector: str, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        seen: list[dict[str, Any]] = []

        def ready() -> list[dict[str, Any]]:
            seen[:] = [p for p in self.pods(namespace, selector) if not p["metadata"].get("deletionTimestamp")]
            return list(seen) if len(seen) == count and all(is_ready(p) for p in seen) else []

        try:
            return wait_until(f"{count} pods {selector!r} Ready in {namespace}", ready, timeout)
        except pytest.fail.Exception as failed:
            raise AssertionError(f"{failed}\n{self.describe_pods(seen, namespace)}") from None

    def describe_pods(self, pods: list[dict[str, Any]], namespace: str) -> str:
        """What a failed wait saw: each pod's node, phase, conditions, containers' states and recent Events."""
        lines = [f"{len(pods)} pods in {namespace}:"]
        for pod in pods:
            name = pod["metadata"]["name"]
            status = pod.get("status") or {}
            conds = {c.get("type"): c.get("status") for c in status.get("conditions") or ()}
            states = [container_state(c) for c in status.get("containerStatuses") or ()]
            node = (pod.get("spec") or {}).get("nodeName")
            lines.append(
                f"  {name} node={node} phase={status.get('phase')} ip={status.get('podIP')}"
                f" conditions={conds} containers={states}"
            )
            with contextlib.suppress(Exception):
                for event in self.events(namespace, name)[-5:]:
                    lines.append(f"    event {event.get('type')} {event.get('reason')}: {event.get('message')}")
        return "\n".join(lines)

    def exec(self, pod: str, namespace: str, *argv: str, timeout: float = 30.0) -> str:
        """Run ``argv`` in the pod's network namespace (``ambit lab exec``); its stdout."""
        done = ambit("lab", "exec", "--dir", str(self.directory), pod, "-n", namespace, "--", *argv, timeout=timeout)
        return done.stdout

    def pod_netns(self, pod: Mapping[str, Any]) -> str:
        return self.topology.pod_netns(str(pod["metadata"]["uid"]))

    def ipam_files(self, node: str) -> set[str]:
        """Addresses host-local holds on ``node`` (one file per address in its data directory)."""
        data = self.topology.node_dir(node) / "ipam" / "ambit-lab"
        if not data.is_dir():
            return set()
        return {p.name for p in data.iterdir() if p.name[:1].isdigit()}

    def runtime_pids(self) -> dict[str, list[int]]:
        """The node runtimes' pids, by node (``lab node --dir D --name node-i``)."""
        found: dict[str, list[int]] = {}
        for node in self.topology.all_nodes():
            pattern = f"lab node --dir {self.directory} --name {node.name}$"
            out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False).stdout
            pids = {int(pid) for pid in out.split()}
            # A child the runtime is starting (a container, a probe) carries the runtime's command line from its
            # clone until its exec: it is not a second runtime.
            found[node.name] = sorted(pid for pid in pids if _parent_pid(pid) not in pids)
        return found

    def component_logs(self, what: str) -> list[Path]:
        """The log files of mesh component ``what`` (nodeproxy, nodeagent, controlplane) on every node: the
        containers' logs of the component's pods."""
        uids = [p["metadata"]["uid"] for p in self.pods("istio-system", COMPONENT_APPS[what])]
        return [log for uid in uids for log in (self.directory / "pods" / uid).glob("*.log")]

    def component_log(self, what: str, node: str) -> str:
        """The log of ``node``'s mesh component ``what`` (nodeproxy, nodeagent) as it is now: the containers' logs
        of its current pod (a new pod starts a new log)."""
        pod = self.component_pod(COMPONENT_APPS[what], node)
        if pod is None:
            return ""
        logs = sorted((self.directory / "pods" / pod["metadata"]["uid"]).glob("*.log"))
        return "".join(log.read_text(errors="replace") for log in logs)

    @contextlib.contextmanager
    def component_stopped(self, what: str, node: str, timeout: float = 90.0) -> Iterator[None]:
        """Keep ``node``'s mesh component ``what`` (nodeagent, nodeproxy; controlplane with node ``""``) down while
        the block runs, then wait until it is back and ready. The DaemonSet is kept off the node by a node affinity
        (a rollout, as one would do on a cluster; the node proxy's process is killed once its pod is terminating, as
        it would otherwise drain the connections it relays for up to its grace period), then the affinity is
        removed; the control plane's Deployment is scaled to 0 and back to 1."""
        app = COMPONENT_APPS[what]
        if app == COMPONENT_APPS["controlplane"]:
            self.kubectl("scale", "deployment/istiod", "-n", "istio-system", "--replicas=0")
            try:
                wait_until("no istiod pod", lambda: not self.pods("istio-system", app), timeout)
                yield
            finally:
                self.kubectl("scale", "deployment/istiod", "-n", "istio-system", "--replicas=1")
            wait_until("a ready istiod pod again", lambda: self._ready_pods(app), timeout)
            return
        daemonset = "ztunnel" if app == "app=ztunnel" else "istio-cni-node"
        away = {
            "spec": {
                "template": {
                    "spec": {
                        "affinity": {
                            "nodeAffinity": {
                                "requiredDuringSchedulingIgnoredDuringExecution": {
                                    "nodeSelectorTerms": [
                                        {
                                            "matchExpressions": [
                                                {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [node]}
                                            ]
                                        }
                                    ]
                                }
                            }
                        }
                    }
                }
            }
        }
        self.kubectl("patch", "daemonset", daemonset, "-n", "istio-system", "--type=merge", "-p", json.dumps(away))
        try:
            if app == COMPONENT_APPS["nodeproxy"]:
                # Down means down: a deleted node proxy pod drains (the connections it relays run on for up to its
                # grace period less 5 s); once the pod is terminating (no container restart), its process is killed.
                wait_until(
                    f"the {app} pod on {node} terminating",
                    lambda: all(p["metadata"].get("deletionTimestamp") for p in self.pods_of(app, node)),
                    timeout,
                )
                pid = self.component_pid(what, node)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
            wait_until(f"no {app} pod on {node}", lambda: not self.pods_of(app, node), timeout)
            yield
        finally:
            back = [{"op": "remove", "path": "/spec/template/spec/affinity"}]
            self.kubectl("patch", "daemonset", daemonset, "-n", "istio-system", "--type=json", "-p", json.dumps(back))
        wait_until(f"a ready {app} pod on {node} again", lambda: self.ready_component(app, node), timeout)

    def pods_of(self, app: str, node: str) -> list[dict[str, Any]]:
        """Every istio-system pod ``app`` on ``node``, terminating ones too."""
        return [p for p in self.pods("istio-system", app) if p["spec"].get("nodeName") == node]

    def log_tracebacks(self) -> list[str]:
        """Log files of the lab's processes that show a Python traceback (a crash or an unhandled error): its own
        daemons and, when the mesh is installed, the mesh's pods."""
        logs = [*(self.directory / "logs").glob("*.log"), *(self.directory / "nodes").glob("*/runtime.log")]
        if self.installed:
            logs += [log for what in COMPONENT_APPS for log in self.component_logs(what)]
        return [f"{p}:\n{excerpt}" for p in logs if (excerpt := traceback_excerpt(p.read_text(errors="replace")))]

    # -- the mesh's components ---------------------------------------------------------------------------------
    # The mesh is installed from deploy/ as on a cluster: the node proxy is a ztunnel DaemonSet pod in its own
    # network namespace, the node agent an istio-cni-node pod on the node's network, the control plane an istiod
    # pod. A lab brought up without the mesh (``installed`` false) has none of them.

    @property
    def installed(self) -> bool:
        return self.topology.installed

    def node_addresses(self, node: str) -> NodeAddresses:
        for found in self.topology.all_nodes():
            if found.name == node:
                return found
        raise AssertionError(f"no node {node} in the lab")

    def component_pod(self, app: str, node: str) -> dict[str, Any] | None:
        """The live istio-system pod on ``node`` that label selector ``app`` picks, or None."""
        for pod in self.pods("istio-system", app):
            if pod["spec"].get("nodeName") == node and not pod["metadata"].get("deletionTimestamp"):
                return pod
        return None

    def node_proxy_netns(self, node: str) -> str:
        """The network namespace the node proxy of ``node`` runs in (its admin port is on its loopback)."""
        pod = wait_until(f"the ztunnel pod on {node}", lambda: self.component_pod("app=ztunnel", node), 60)
        return self.pod_netns(pod)

    def node_proxy_admin(self, node: str, path: str, *, check: bool = True) -> str:
        """GET ``path`` on the admin port (127.0.0.1:15000) of ``node``'s node proxy."""
        argv = ["ip", "netns", "exec", self.node_proxy_netns(node), "curl", "-s", f"http://127.0.0.1:15000{path}"]
        done = subprocess.run(
            [*argv[:5], "-f", *argv[5:]] if check else argv, capture_output=True, text=True, timeout=15, check=check
        )
        return done.stdout

    def node_proxy_address(self, node: str) -> str:
        """The address of ``node``'s node proxy (its metrics on :15020, readiness on :15021)."""
        pod = wait_until(f"a ready ztunnel pod on {node}", lambda: self.ready_component("app=ztunnel", node), 60)
        return str(pod["status"]["podIP"])

    def node_proxy_metrics(self, node: str) -> str:
        with urllib.request.urlopen(f"http://{self.node_proxy_address(node)}:15020/metrics", timeout=5) as response:
            return str(response.read().decode())

    def _ready_pods(self, selector: str) -> list[dict[str, Any]]:
        return [p for p in self.pods("istio-system", selector) if is_ready(p)]

    def ready_component(self, app: str, node: str) -> dict[str, Any] | None:
        pod = self.component_pod(app, node)
        return pod if pod is not None and is_ready(pod) else None

    def control_plane_address(self) -> str:
        """Where the control plane's CA and xDS (15012) answer: the istiod pod's address."""
        pods = wait_until(
            "a ready istiod pod", lambda: [p for p in self.pods("istio-system", "app=istiod") if is_ready(p)], 60
        )
        return f"{pods[0]['status']['podIP']}:15012"

    def control_plane_metrics(self) -> str:
        """The control plane's ``/metrics`` on its monitoring port (istiod's 15014), at the address of its xDS."""
        host = self.control_plane_address().rpartition(":")[0]
        with urllib.request.urlopen(f"http://{host}:15014/metrics", timeout=5) as response:
            return str(response.read().decode())

    def node_proxy_credentials(self, node: str) -> tuple[Path, Path]:
        """The root certificate and the istio-ca token ``node``'s node proxy authenticates to the CA with."""
        pod = wait_until(f"a ready ztunnel pod on {node}", lambda: self.ready_component("app=ztunnel", node), 60)
        volumes = self.directory / "pods" / pod["metadata"]["uid"] / "volumes"
        root = wait_until(
            "the root certificate volume", lambda: sorted(volumes.glob("*/istiod-ca-cert/root-cert.pem")), 10
        )
        token = wait_until("the token volume", lambda: sorted(volumes.glob("*/istio-token/istio-token")), 10)
        return root[0], token[0]

    def component_pid(self, what: str, node: str = "") -> int | None:
        """The pid of the mesh component ``what`` (nodeproxy, nodeagent, controlplane) of ``node``: the main
        process of the component's container (the child of the ``runc run`` whose pid the container's
        ``ambit://<pid>`` id names)."""
        app = COMPONENT_APPS[what]
        pods = [p for p in self.pods("istio-system", app) if not node or p["spec"].get("nodeName") == node]
        for pod in pods:
            for status in (pod.get("status") or {}).get("containerStatuses") or ():
                if (pid := container_main_pid(status)) is not None:
                    return pid
        return None

    def restart_component(self, what: str, node: str = "", timeout: float = 90.0) -> None:
        """Stop ``what`` (nodeproxy, nodeagent, controlplane) abruptly and wait until it is back and ready: its
        pod is deleted at once (grace period 0) and its controller (DaemonSet, Deployment) makes a new one."""
        app = COMPONENT_APPS[what]
        if app == "app=istiod":
            old_pods = {p["metadata"]["uid"] for p in self.pods("istio-system", "app=istiod")}
            self.kubectl("delete", "pod", "-n", "istio-system", "-l", "app=istiod", "--grace-period=0", "--wait=false")

            def back() -> bool:
                pods = [p for p in self.pods("istio-system", "app=istiod") if p["metadata"]["uid"] not in old_pods]
                return bool(pods) and all(is_ready(p) for p in pods)

            wait_until("a new istiod pod ready", back, timeout)
            return
        old_pod = wait_until(f"the {app} pod on {node}", lambda: self.component_pod(app, node), 30)
        self.kubectl(
            "delete", "pod", "-n", "istio-system", old_pod["metadata"]["name"], "--grace-period=0", "--wait=false"
        )

        def replaced() -> dict[str, Any] | None:
            pod = self.ready_component(app, node)
            return pod if pod is not None and pod["metadata"]["uid"] != old_pod["metadata"]["uid"] else None

        wait_until(f"a new {app} pod ready on {node}", replaced, timeout)

    def root_policies(self) -> list[str]:
        """``kind.group/name`` of every object of :data:`ROOT_POLICY_KINDS` in the root namespace."""
        found = self.items(",".join(ROOT_POLICY_KINDS), "-n", "istio-system")
        return [f"{o['kind'].lower()}.{o['apiVersion'].split('/')[0]}/{o['metadata']['name']}" for o in found]

    def wait_mesh_ready(self, timeout: float = 120.0) -> None:
        """Wait until the control plane and every node's node proxy and node agent have a ready pod."""
        nodes = [n.name for n in self.topology.all_nodes()]

        def ready() -> bool:
            if not self._ready_pods(COMPONENT_APPS["controlplane"]):
                return False
            apps = (COMPONENT_APPS["nodeproxy"], COMPONENT_APPS["nodeagent"])
            return all(self.ready_component(app, node) is not None for app in apps for node in nodes)

        wait_until("the mesh ready on every node", ready, timeout, interval=0.5)

    def namespace(self, name: str) -> None:
        self.kubectl("create", "namespace", name)

    def delete_namespace(self, name: str) -> None:
        """Delete a namespace and what it holds, without waiting (the next test does not depend on it)."""
        self.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def lab_up(directory: Path, *, mesh: bool = False, ip_family: str = "ipv4") -> Topology:
    """``ambit lab up --nodes 2`` as a subprocess: ``--no-mesh``, or with ``mesh`` the mesh installed from deploy/
    as on a cluster; ``ip_family`` "dual" for a dual-stack lab.

    The caller holds the lock and runs :func:`lab_down`.
    """
    extra = [] if mesh else ["--no-mesh"]
    seconds = LAB_INSTALL_TIMEOUT if mesh else LAB_UP_TIMEOUT
    claim_lab(directory)  # if this test process is killed, the next lab lock holder takes the lab down
    extra += ["--ip-family", ip_family] if ip_family != "ipv4" else []
    done = ambit("lab", "up", "--dir", str(directory), "--nodes", "2", *extra, timeout=seconds, check=False)
    topology = Topology.load(directory)
    if done.returncode != 0 or topology is None:
        raise AssertionError(f"ambit lab up failed ({done.returncode}): {done.stderr}{done.stdout}")
    return topology


def lab_down(directory: Path, prefix: str | None, keep_logs: Path | None = None) -> None:
    """``ambit lab down`` (after keeping the lab's logs), then check that nothing of the lab is left."""
    if keep_logs is not None and directory.is_dir():
        keep_logs.mkdir(parents=True, exist_ok=True)
        logs = (directory / "logs").glob("*.log"), (directory / "nodes").glob("*/*.log")
        for log in [*logs[0], *logs[1], *(directory / "pods").glob("*/*.log")]:
            with contextlib.suppress(OSError):
                shutil.copy(log, keep_logs / f"{log.parent.name}-{log.name}")
    done = ambit("lab", "down", "--dir", str(directory), timeout=LAB_DOWN_TIMEOUT, check=False)
    assert done.returncode == 0, f"ambit lab down failed ({done.returncode}): {done.stderr}"
    if prefix is not None:
        assert lab_leftovers(prefix) == [], f"lab {prefix} left things behind"
    assert not directory.exists(), f"ambit lab down left {directory}"


@contextlib.contextmanager
def running_lab(base: Path, *, mesh: bool = False, ip_family: str = "ipv4") -> Iterator[Lab]:
    """Hold the lock, bring a 2-node lab up in ``base/lab``, and always bring it down (logs kept in ``base``)."""
    directory = base / "lab"
    with root_lab_lock():
        prefix: str | None = None
        try:
            topology = lab_up(directory, mesh=mesh, ip_family=ip_family)
            prefix = topology.prefix
            yield Lab(topology, base / "kubecache")
        finally:
            if prefix is None and (found := Topology.load(directory)) is not None:
                prefix = found.prefix
            lab_down(directory, prefix, keep_logs=base / "lab-logs")


ROOT_POLICY_KINDS = (
    "authorizationpolicies.security.istio.io",
    "peerauthentications.security.istio.io",
    "requestauthentications.security.istio.io",
)
"""Kinds whose objects in the root namespace apply mesh-wide: a module on the shared lab must leave none behind."""
NAMESPACE_GONE_TIMEOUT = 90.0

_shared: dict[str, Any] = {}
"""The mesh lab this process keeps up across test modules: its ``lab`` and the ``stack`` that brings it down."""


def shared_mesh_lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    """A 2-node lab with the mesh installed, brought up once and kept for every module that shares it (module
    attribute ``SHARES_THE_MESH_LAB = True``; tests/conftest.py runs those modules first). It is brought down when
    this process next takes the lab lock (another module's own lab, tests/netns) or at the end of the session."""
    lab = _shared.get("lab")
    if lab is None:
        stack = contextlib.ExitStack()
        lab = stack.enter_context(running_lab(tmp_path_factory.mktemp("e2e-sh"), mesh=True))
        _shared.update(lab=lab, stack=stack)
    assert isinstance(lab, Lab)
    return lab


def release_shared_lab() -> None:
    """Bring the shared lab down if it is up (idempotent)."""
    stack = _shared.pop("stack", None)
    _shared.pop("lab", None)
    if stack is not None:
        stack.close()


harness.BEFORE_LAB_LOCK.append(release_shared_lab)


@contextlib.contextmanager
def module_on_shared_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """The shared mesh lab for one module, healthy when the module starts and handed back as it was found: the
    namespaces the module made are deleted (and waited for) and its root-namespace policies removed."""
    lab = shared_mesh_lab(tmp_path_factory)
    lab.wait_mesh_ready()
    namespaces = {n["metadata"]["name"] for n in lab.items("namespaces")}
    policies = set(lab.root_policies())
    try:
        yield lab
    finally:
        made = {n["metadata"]["name"] for n in lab.items("namespaces")} - namespaces
        for name in sorted(made):
            lab.delete_namespace(name)
        for ref in sorted(set(lab.root_policies()) - policies):
            lab.kubectl("delete", ref, "-n", "istio-system", "--ignore-not-found", check=False)
        remaining = lambda: not ({n["metadata"]["name"] for n in lab.items("namespaces")} & made)  # noqa: E731
        wait_until(f"namespaces {sorted(made)} deleted", remaining, NAMESPACE_GONE_TIMEOUT, interval=0.5)


LARGE_DNS_ANSWER = """
import json, socket, sys
import dns.flags, dns.message, dns.query
name = sys.argv[1]
if len(sys.argv) > 2:
    server = sys.argv[2]
else:
    server = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
query = dns.message.make_query(name, "A")  # no EDNS: 512 bytes over UDP
udp = dns.query.udp(query, server, timeout=5)
tcp = dns.query.tcp(query, server, timeout=5)
try:
    resolved = sorted({a[4][0] for a in socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)})
except OSError as exc:
    resolved = str(exc)
print(json.dumps({
    "udp_truncated": bool(udp.flags & dns.flags.TC),
    "tcp": sorted(rd.address for rrset in tcp.answer for rd in rrset),
    "resolver": resolved,
}))
"""
"""A pod-side script: ``NAME [SERVER]`` (SERVER defaults to the pod's first nameserver) asks for NAME's A records
without EDNS over UDP and over TCP, then through the pod's own resolver (glibc), and prints what each gave as JSON:
``udp_truncated``, ``tcp`` (sorted addresses), ``resolver`` (sorted addresses, or the resolver's error)."""


def http_echo_container(port: int = 8080, *, ready_port: int | None = None, delay: float = 0) -> dict[str, Any]:
    """A container running ``ambit.lab.apps http-echo`` (after ``delay`` seconds) with a tcpSocket readinessProbe."""
    app = f"python3 -m ambit.lab.apps http-echo --port {port}"
    command = ["sh", "-c", f"sleep {delay:g}; exec {app}"] if delay else app.split()
    return {
        "name": "echo",
        "image": "none",
        "command": command,
        "readinessProbe": {"tcpSocket": {"port": ready_port or port}, "periodSeconds": 1},
    }


def pod_manifest(name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    labels = spec.pop("labels", {"app": name})
    node = spec.pop("node", None)
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"terminationGracePeriodSeconds": 2, "containers": containers, **spec},
    }


def sleeper(name: str = "main") -> dict[str, Any]:
    return {"name": name, "image": "none", "command": ["sleep", "3600"]}


def service_manifest(name: str, selector: Mapping[str, str], port: int, target: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": dict(selector), "ports": [{"name": "p", "port": port, "targetPort": target}]},
    }


def deployment_manifest(name: str, replicas: int, container: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"terminationGracePeriodSeconds": 2, "containers": [container]},
            },
        },
    }


def traceback_excerpt(text: str, *, before: int = 2, after: int = 40) -> str:
    """The first Python traceback in a log's ``text`` with the lines logged just before it (what failed), or "" when
    there is none: a failing check then shows what went wrong, not only which file it is in."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "Traceback (most recent call last)" in line:
            return "\n".join(lines[max(0, i - before) : i + after])
    return ""
