"""``ambit lab up --mesh``: the node agent enrols ambient pods (annotation, in-pod rules) and the node proxy listens."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from tests.e2e.lab_driver import (
    TEST_TIMEOUT,
    Lab,
    ambit,
    deployment_manifest,
    http_echo_container,
    is_ready,
    module_on_shared_lab,
    pod_manifest,
    service_manifest,
    sleeper,
    wait_until,
)

from ambit.k8s import KubeClient, kinds

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True  # tests/e2e/lab_driver.py shared_mesh_lab: one lab for the modules that share it

REDIRECTION = "ambient.istio.io/redirection"
PROBE_SNAT = "169.254.7.127"


@pytest.fixture(scope="module")
def mesh_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A 2-node lab with the mesh's node agent and node proxy on every node."""
    with module_on_shared_lab(tmp_path_factory) as up:
        yield up


def _in_netns(netns: str, *argv: str) -> str:
    done = subprocess.run(
        ["ip", "netns", "exec", netns, *argv], capture_output=True, text=True, timeout=10, check=False
    )
    assert done.returncode == 0, f"{' '.join(argv)} in {netns}: {done.stderr}"
    return done.stdout


def _annotation(pod: dict[str, Any]) -> str | None:
    value = (pod["metadata"].get("annotations") or {}).get(REDIRECTION)
    return None if value is None else str(value)


def _echo_pods(lab: Lab, namespace: str, ambient: bool) -> list[dict[str, Any]]:
    lab.namespace(namespace)
    if ambient:
        lab.kubectl("label", "namespace", namespace, "istio.io/dataplane-mode=ambient")
    lab.apply(deployment_manifest("echo", 1, http_echo_container(8080)), namespace=namespace)
    return lab.wait_pods_ready(namespace, "app=echo", 1, timeout=30)


def test_ambient_pod_is_enrolled_and_unlabelled_is_not(mesh_lab: Lab) -> None:
    lab = mesh_lab
    try:
        plain = _echo_pods(lab, "e2e-mesh-plain", ambient=False)[0]
        _echo_pods(lab, "e2e-mesh-ambient", ambient=True)

        def enrolled() -> dict[str, Any] | None:
            pods = lab.pods("e2e-mesh-ambient", "app=echo")
            return next((p for p in pods if _annotation(p) == "enabled"), None)

        pod = wait_until("the ambient pod annotated redirection: enabled", enrolled, timeout=20)
        netns = lab.pod_netns(pod)
        rules = _in_netns(netns, "nft", "list", "ruleset")
        assert "istio" in rules, rules

        def listening() -> bool:
            out = _in_netns(netns, "ss", "-ltn")
            return all(f":{port} " in out for port in (15001, 15006, 15008))

        wait_until("the node proxy listening on 15001/15006/15008 in the pod", listening, timeout=10)

        assert _annotation(lab.pod(plain["metadata"]["name"], "e2e-mesh-plain")) is None
        plain_rules = _in_netns(lab.pod_netns(plain), "nft", "list", "ruleset")
        assert "istio" not in plain_rules
        assert lab.log_tracebacks() == []
    finally:
        lab.delete_namespace("e2e-mesh-ambient")
        lab.delete_namespace("e2e-mesh-plain")


def _probe_set(ruleset: str) -> str:
    """The ``istio-inpod-probes-v4`` set as ``nft list ruleset`` prints it (empty when absent)."""
    found = re.search(r"set istio-inpod-probes-v4 \{[^}]*(\{[^}]*\}[^}]*)?\}", ruleset)
    return found.group(0) if found else ""


def test_an_enrolled_pod_with_an_http_readiness_probe_stays_ready(mesh_lab: Lab) -> None:
    """The node's probe SNAT (spec §2.3): the runtime's probes reach the app, not the node proxy's 15006."""
    lab = mesh_lab
    namespace = "e2e-mesh-probes"
    container = {
        **http_echo_container(8080),
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 1},
    }
    try:
        lab.namespace(namespace)
        lab.kubectl("label", "namespace", namespace, "istio.io/dataplane-mode=ambient")
        lab.apply(deployment_manifest("echo", 1, container), namespace=namespace)

        def enrolled() -> dict[str, Any] | None:
            pods = lab.pods(namespace, "app=echo")
            return next((p for p in pods if _annotation(p) == "enabled" and p["status"].get("podIP")), None)

        pod = wait_until("the ambient pod annotated redirection: enabled", enrolled, timeout=30)
        pod_ip = str(pod["status"]["podIP"])
        pod_rules = _in_netns(lab.pod_netns(pod), "nft", "list", "ruleset")
        assert f"ip saddr {PROBE_SNAT}" in pod_rules and "accept" in pod_rules, pod_rules

        node = lab.topology.node_named(str(pod["spec"]["nodeName"]))
        assert node is not None

        def in_probe_set() -> bool:
            return pod_ip in _probe_set(_in_netns(node.netns, "nft", "list", "ruleset"))

        wait_until(f"{pod_ip} in the probe set of {node.netns}", in_probe_set, timeout=10)
        host_rules = _in_netns(node.netns, "nft", "list", "ruleset")
        assert f"snat ip to {PROBE_SNAT}" in host_rules, host_rules

        # Enrolled for longer than the probe's failure threshold (3 x 1 s): Ready now is the probes passing
        # through the redirection, not a leftover from before it.
        time.sleep(4)

        def ready_and_enrolled() -> bool:
            current = lab.pod(pod["metadata"]["name"], namespace)
            return _annotation(current) == "enabled" and is_ready(current)

        wait_until("the enrolled pod Ready with redirection enabled", ready_and_enrolled, timeout=15)
        assert lab.log_tracebacks() == []
    finally:
        lab.delete_namespace(namespace)

    def gone_from_probe_set() -> bool:
        return pod_ip not in _probe_set(_in_netns(node.netns, "nft", "list", "ruleset"))

    wait_until(f"{pod_ip} out of the probe set after the pod is gone", gone_from_probe_set, timeout=20)


def test_proxy_config_shows_a_new_pod_within_a_second(mesh_lab: Lab) -> None:
    """``ambit proxy-config workloads --node N`` in the lab (issue 20): the node proxy's admin port is reached in its
    own network namespace by the CLI, and a new ambient pod is in its dump within a second of getting its IP."""
    lab = mesh_lab
    namespace = "e2e-mesh-proxyconfig"

    async def first_ip() -> tuple[str, str, float]:
        async with KubeClient.from_kubeconfig(lab.topology.kubeconfig) as client:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                items, _ = await client.list(kinds.PODS, namespace, label_selector="app=echo")
                for pod in items:
                    if ip := (pod.get("status") or {}).get("podIP"):
                        return str(ip), str(pod["spec"]["nodeName"]), time.monotonic()
                await asyncio.sleep(0.02)
        raise AssertionError("the echo pod got no IP within 120 s")

    try:
        lab.namespace(namespace)
        lab.kubectl("label", "namespace", namespace, "istio.io/dataplane-mode=ambient")
        node = lab.topology.node(1).name
        netns = lab.node_proxy_netns(node)
        lab.apply(deployment_manifest("echo", 1, http_echo_container(8080)), namespace=namespace)
        ip, pod_node, seen = asyncio.run(first_ip())

        def in_dump() -> bool:
            body = _in_netns(netns, "curl", "-sf", "--max-time", "2", "http://127.0.0.1:15000/config_dump")
            return any(ip in w.get("workloadIps", []) for w in json.loads(body)["workloads"])

        wait_until(f"{ip} in the config_dump of {node}'s node proxy", in_dump, timeout=30, interval=0.02)
        latency = time.monotonic() - seen
        print(f"proxy-config: pod {ip} in the node proxy's dump {latency * 1000:.0f} ms after its IP was seen")
        assert latency < 1.0, f"the pod took {latency:.2f} s to reach the node proxy"

        args = ("proxy-config", "workloads", "--lab-dir", str(lab.topology.path), "--node", node)
        done = ambit(*args, "--address", ip, timeout=60)
        lines = done.stdout.splitlines()
        assert lines[0].split() == ["NAMESPACE", "POD", "NAME", "ADDRESS", "NODE", "WAYPOINT", "PROTOCOL"], done.stdout
        assert len(lines) == 2 and lines[1].split()[0] == namespace and lines[1].split()[2] == ip, done.stdout
        assert lines[1].split()[5] == "HBONE", done.stdout
        shown = json.loads(ambit(*args, "-n", namespace, "-o", "json", timeout=60).stdout)
        assert [w["workloadIps"] for w in shown] == [[ip]]

        def certificate_available() -> bool:  # the pod's own node proxy holds a certificate for its identity
            args = ("proxy-config", "certificates", "--lab-dir", str(lab.topology.path), "--node", pod_node)
            rows = [line.split() for line in ambit(*args, timeout=60).stdout.splitlines()[1:]]
            identity = f"spiffe://cluster.local/ns/{namespace}/sa/default"
            return any(row[:3] == [identity, "Leaf", "Available"] and row[3] == "true" for row in rows)

        wait_until("the pod's certificate in proxy-config certificates", certificate_available, timeout=60)
    finally:
        lab.delete_namespace(namespace)


def _kubectl_on_a_terminal(lab: Lab, *args: str, rows: int = 33, cols: int = 111) -> tuple[int, bytes]:
    """kubectl run with a terminal (rows x cols) as its stdin, stdout and stderr: its exit code and what it showed."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = dict(os.environ, KUBECONFIG=str(lab.topology.kubeconfig), KUBECACHEDIR=str(lab.kubecache))
    try:
        proc = subprocess.Popen(
            ["kubectl", *args], stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
        )
    finally:
        os.close(slave)
    shown = b""
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: kubectl and everything holding the terminal are gone
                break
            if not chunk:
                break
            shown += chunk
        return proc.wait(timeout=10), shown
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_kubectl_exec_reaches_a_service_from_a_meshed_pod_and_kubectl_logs_shows_the_server(mesh_lab: Lab) -> None:
    """``kubectl exec`` and ``kubectl logs`` through the API server to the nodes' kubelet sockets (issue 16): a
    client in an ambient namespace on one node reaches a Service whose server runs on the other; the exit code of
    the command is kubectl's; the server's output is its log."""
    lab = mesh_lab
    namespace = "e2e-mesh-kubectl-exec"
    try:
        lab.namespace(namespace)
        lab.kubectl("label", "namespace", namespace, "istio.io/dataplane-mode=ambient")
        lab.apply(
            pod_manifest("server", [http_echo_container(8080)], node=lab.topology.node(1).name),
            service_manifest("server", {"app": "server"}, 80, 8080),
            pod_manifest("client", [sleeper()], node=lab.topology.node(2).name),
            namespace=namespace,
        )
        lab.wait_pods_ready(namespace, "app in (server,client)", 2, timeout=60)

        def reached() -> str | None:
            argv = (sys.executable, "-m", "ambit.lab.apps", "client", "--url", "http://server/", "--count", "1")
            done = lab.kubectl("exec", "-n", namespace, "client", "--", *argv, check=False, timeout=60)
            return done.stdout if done.returncode == 0 and " ok " in done.stdout else None

        wait_until("kubectl exec of the meshed client reaching the Service", reached, timeout=60)
        failed = lab.kubectl("exec", "-n", namespace, "client", "--", "sh", "-c", "echo err >&2; exit 7", check=False)
        assert failed.returncode == 7 and "err" in failed.stderr, failed
        piped = lab.kubectl("exec", "-i", "-n", namespace, "client", "--", "cat", input="through stdin\n")
        assert piped.stdout == "through stdin\n"
        script = "sleep 0.5; stty size; [ -t 0 ] && echo on-a-tty; echo err >&2; exit 5"
        code, shown = _kubectl_on_a_terminal(lab, "exec", "-it", "-n", namespace, "client", "--", "sh", "-c", script)
        assert code == 5 and b"33 111" in shown and b"on-a-tty" in shown and b"err" in shown, shown

        last = lab.kubectl("logs", "-n", namespace, "server", "--tail=1").stdout
        logs = lab.kubectl("logs", "-n", namespace, "server").stdout  # after the tail: the server may log more
        assert "http-echo" in logs and "listening on :8080" in logs, logs
        assert last.count("\n") == 1 and last in logs, last
        denied = lab.kubectl("logs", "-n", namespace, "server", "--previous", check=False)
        assert denied.returncode != 0 and "previous terminated container" in denied.stderr, denied
        assert lab.log_tracebacks() == []
    finally:
        lab.delete_namespace(namespace)


@dataclass
class _Forwarding:
    port: int
    proc: subprocess.Popen[str]
    stderr: str = ""
    """kubectl's messages, once it ended."""


@contextlib.contextmanager
def _port_forward(lab: Lab, namespace: str, target: str, port: str) -> Iterator[_Forwarding]:
    """``kubectl port-forward TARGET :PORT`` running, with the local port kubectl reports."""
    env = dict(os.environ, KUBECONFIG=str(lab.topology.kubeconfig), KUBECACHEDIR=str(lab.kubecache))
    argv = ["kubectl", "port-forward", "-n", namespace, target, f":{port}"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    forwarding = _Forwarding(0, proc)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "Forwarding from 127.0.0.1:NNNNN -> PORT"
        found = re.match(r"Forwarding from 127\.0\.0\.1:(\d+) ->", line)
        assert found is not None, f"kubectl port-forward said {line!r}"
        forwarding.port = int(found.group(1))
        yield forwarding
    finally:
        if proc.poll() is None:
            proc.terminate()
        forwarding.stderr = proc.communicate(timeout=30)[1]


def _http_get(port: int, path: str) -> dict[str, Any]:
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # a proxy in the environment is bypassed
    with no_proxy.open(f"http://127.0.0.1:{port}{path}", timeout=30) as reply:
        assert reply.status == 200
        body: dict[str, Any] = json.loads(reply.read())
        return body


def test_kubectl_port_forward_reaches_a_meshed_pods_http_port(mesh_lab: Lab) -> None:
    """``kubectl port-forward`` through the API server to the node's kubelet socket (issues 16-18): to a pod and to
    its Service (kubectl picks the pod and the target port), each local connection an HTTP request answered by the
    pod's server; a port nothing listens on is reported in kube's words."""
    lab = mesh_lab
    namespace = "e2e-mesh-kubectl-port-forward"
    try:
        lab.namespace(namespace)
        lab.kubectl("label", "namespace", namespace, "istio.io/dataplane-mode=ambient")
        lab.apply(
            pod_manifest("server", [http_echo_container(8080)], node=lab.topology.node(2).name),
            service_manifest("server", {"app": "server"}, 80, 8080),
            namespace=namespace,
        )
        lab.wait_pods_ready(namespace, "app=server", 1, timeout=60)

        with _port_forward(lab, namespace, "pod/server", "8080") as forwarding:
            for path in ("/first", "/second"):  # two connections over one session
                answer = _http_get(forwarding.port, path)
                assert (answer["pod"], answer["path"]) == ("server", path), answer
        with _port_forward(lab, namespace, "svc/server", "80") as forwarding:
            assert _http_get(forwarding.port, "/through-the-service")["pod"] == "server"
        with _port_forward(lab, namespace, "pod/server", "9") as refused:
            with contextlib.suppress(OSError):
                _http_get(refused.port, "/nobody")
            with contextlib.suppress(subprocess.TimeoutExpired):
                refused.proc.wait(timeout=10)  # kubectl 1.32 gives up on a pod after a forward's error
        err = refused.stderr
        assert "error forwarding port 9 to pod " in err and "failed to connect to localhost:9 inside namespace" in err
        assert lab.log_tracebacks() == []
    finally:
        lab.delete_namespace(namespace)


def test_kubectl_debug_node_shows_the_nodes_root_at_host_and_acts_on_it(mesh_lab: Lab) -> None:
    """``kubectl debug node/N`` (issue 17): the pod kubectl makes (hostNetwork, hostPID, hostIPC, hostPath ``/`` at
    ``/host``) runs on N; ``chroot /host`` runs the machine's programs in N's root, which holds N's CNI
    configuration, and removing the CNI plugin's kubeconfig through it removes it from N's tree."""
    lab = mesh_lab
    namespace = "e2e-mesh-debug-node"
    node = lab.topology.node(1).name
    node_dir = lab.directory / "nodes" / node
    kubeconfig = node_dir / "root" / "var" / "run" / "istio-cni" / "istio-cni-kubeconfig"
    saved, mode = kubeconfig.read_bytes(), kubeconfig.stat().st_mode & 0o777
    try:
        lab.namespace(namespace)
        # The lab enforces Pod Security "baseline" by default; a node debugger needs the host's namespaces and a
        # hostPath of /, as on a cluster whose namespaces are not privileged.
        lab.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=privileged")

        def debug(*command: str) -> str:
            done = lab.kubectl("debug", "-n", namespace, f"node/{node}", "--image=none", "--", *command, timeout=60)
            found = re.search(rf"debugging pod (node-debugger-{node}-\w+)", done.stdout + done.stderr)
            assert found, done
            name = found.group(1)

            def finished() -> str | None:
                phase = str(lab.pod(name, namespace).get("status", {}).get("phase") or "")
                return phase if phase in ("Succeeded", "Failed") else None

            assert wait_until(f"the debugger pod {name} to finish", finished, timeout=60) == "Succeeded"
            return name

        listed = lab.kubectl("logs", "-n", namespace, debug("chroot", "/host", "ls", "/etc/cni/net.d")).stdout
        on_node = sorted(p.name for p in (node_dir / "cni" / "net.d").iterdir())
        assert sorted(listed.split()) == on_node and any(n.endswith(".conflist") for n in on_node), listed
        pod = lab.items("pods", "-n", namespace)[0]
        assert pod["spec"]["nodeName"] == node and pod["spec"]["hostNetwork"] is True
        assert pod["spec"]["volumes"][0]["hostPath"]["path"] == "/"

        # The node agent writes a missing plugin kubeconfig again within a second (cni/daemon.py), so whether the
        # file is gone is checked in the debugger pod itself, right after it removed it; then the agent's copy comes.
        gone = "/var/run/istio-cni/istio-cni-kubeconfig"
        debug("chroot", "/host", "sh", "-c", f"rm {gone} && test ! -e {gone}")
        wait_until("the node agent writes the plugin kubeconfig again", kubeconfig.exists, timeout=30)
        assert lab.log_tracebacks() == []
    finally:
        if not kubeconfig.exists():  # the shared lab's CNI plugin needs it back
            kubeconfig.write_bytes(saved)
            kubeconfig.chmod(mode)
        lab.delete_namespace(namespace)
