"""L4 policy on a 2-node lab (spec §7, §11.3 TestAuthorizationL4, TestPeerAuthentication): what users of Istio's
AuthorizationPolicy and PeerAuthentication rely on, same-node and cross-node, checked with traffic and with
``ambit policy explain``.

One lab for the module. Namespace ``pol`` is ambient: servers ``srv-1`` (node 1) and ``srv-2`` (node 2), each running
tcp-echo on 9000 and 9001, client ``cli-a`` (service account ``alpha``, node 1) and ``cli-b`` (``beta``, node 2).
Namespace ``pol-x`` is ambient too, with client ``cli-x`` (node 1). Namespace ``pol-out`` is not in the mesh:
client ``plain`` (node 2) connects in plaintext. Every test removes its policies, and waits for the open baseline.
The last test replays Istio's TestK8sNetPol with a Kubernetes NetworkPolicy, which the lab's nodes enforce.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.lab_driver import (
    TEST_TIMEOUT,
    Lab,
    ambit,
    module_on_shared_lab,
    pod_manifest,
    sleeper,
    wait_until,
)

from ambit.cli.policy import load_config
from ambit.controlplane.explain import explain as explain_flow

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True  # tests/e2e/lab_driver.py shared_mesh_lab: one lab for the modules that share it

NS, NS_X, NS_OUT = "pol", "pol-x", "pol-out"
ROOT = "istio-system"
PORTS = (9000, 9001)
SERVERS = ("srv-1", "srv-2")
CLIENTS = {"cli-a": NS, "cli-b": NS, "cli-x": NS_X, "plain": NS_OUT}
ALPHA = f"cluster.local/ns/{NS}/sa/alpha"
POLICY_WAIT = 20.0

PROBE = """
import socket, sys
out = []
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=3) as s:
            s.settimeout(3)
            s.sendall(b"ping")
            out.append("ok" if s.recv(4) == b"ping" else "refused")
    except OSError:
        out.append("refused")
print(" ".join(out))
"""

HOLD = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
s.settimeout(3)
s.sendall(b"ping"); assert s.recv(4) == b"ping"
print("ready", flush=True)
deadline = time.time() + 30
while time.time() < deadline:
    try:
        s.sendall(b"x")
        if s.recv(1) != b"x":
            break
    except OSError:
        break
    time.sleep(0.05)
print("closed", time.time(), flush=True)
"""


def _server(name: str, node: str) -> dict[str, Any]:
    containers = [
        {
            "name": f"echo-{port}",
            "image": "none",
            "command": ["python3", "-m", "ambit.lab.apps", "tcp-echo", "--port", str(port)],
        }
        for port in PORTS
    ]
    containers[0]["readinessProbe"] = {"tcpSocket": {"port": PORTS[0]}, "periodSeconds": 1}
    return pod_manifest(name, containers, node=node, labels={"app": "echo"})


def _service_account(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}


@dataclass
class Mesh:
    lab: Lab
    ips: dict[str, str]

    def probe(self, client: str, targets: list[tuple[str, int]]) -> list[str]:
        args = [f"{self.ips[server]}:{port}" for server, port in targets]
        out = self.lab.exec(client, CLIENTS[client], "python3", "-c", PROBE, *args, timeout=30)
        return out.split()

    def explain(self, client: str, server: str, port: int) -> str:
        """``ambit policy explain``'s verdict for one flow, from the command itself."""
        done = ambit(
            "policy", "explain",
            "--kubeconfig", str(self.lab.topology.kubeconfig),
            "--from", f"{CLIENTS[client]}/{client}",
            "--to", f"{NS}/{server}",
            "--port", str(port),
            "-o", "json",
        )  # fmt: skip
        return "ok" if json.loads(done.stdout)["verdict"] == "ALLOW" else "refused"

    def expect(self, expected: dict[tuple[str, str, int], str], *, explain: bool = True) -> None:
        """Wait until every (client, server, port) flow has its expected outcome; then ``policy explain`` agrees."""
        by_client: dict[str, list[tuple[str, int]]] = {}
        for client, server, port in expected:
            by_client.setdefault(client, []).append((server, port))

        def observed() -> dict[tuple[str, str, int], str]:
            # The clients probe at once (each probe is a command run in its pod, mostly waiting).
            with ThreadPoolExecutor(len(by_client)) as pool:
                outcomes = dict(zip(by_client, pool.map(lambda c: self.probe(c, by_client[c]), by_client), strict=True))
            seen: dict[tuple[str, str, int], str] = {}
            for client, targets in by_client.items():
                for (server, port), outcome in zip(targets, outcomes[client], strict=True):
                    seen[(client, server, port)] = outcome
            return seen

        deadline = time.monotonic() + POLICY_WAIT
        while (seen := observed()) != expected:
            if time.monotonic() > deadline:
                wrong = {k: v for k, v in seen.items() if expected[k] != v}
                pytest.fail(f"flows that differ after {POLICY_WAIT:g} s (observed): {wrong}")
            time.sleep(0.5)
        if explain:
            # Every flow through the explain pipeline in-process (one translation of the cluster), and the first
            # through the command too: each command run costs a Python start-up, a full list and a translation.
            config = load_config(self.lab.topology.kubeconfig)
            verdicts = {
                (c, s, p): "ok" if explain_flow(config, f"{CLIENTS[c]}/{c}", f"{NS}/{s}", p).allowed else "refused"
                for c, s, p in expected
            }
            assert verdicts == expected, {k: v for k, v in verdicts.items() if v != expected[k]}
            first = next(iter(expected))
            assert self.explain(*first) == expected[first]

    def apply(self, *objects: dict[str, Any]) -> None:
        for obj in objects:
            self.lab.apply(obj, namespace=obj["metadata"].get("namespace"))

    def condition(self, name: str, namespace: str) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            policy = self.lab.get("authorizationpolicy", name, "-n", namespace)
            for cond in (policy.get("status") or {}).get("conditions") or ():
                if cond.get("type") == "ZtunnelAccepted":
                    return dict(cond)
            return None

        return wait_until(f"ZtunnelAccepted on {namespace}/{name}", found, timeout=POLICY_WAIT)


def everything(outcome: str = "ok", clients: tuple[str, ...] = tuple(CLIENTS)) -> dict[tuple[str, str, int], str]:
    return {(c, s, p): outcome for c in clients for s in SERVERS for p in PORTS}


def policy(name: str, spec: dict[str, Any], namespace: str = NS, **annotations: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy", "metadata": metadata, "spec": spec}


def peer_authentication(name: str, spec: dict[str, Any], namespace: str = NS) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


ECHO = {"matchLabels": {"app": "echo"}}


@pytest.fixture(scope="module")
def mesh_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with module_on_shared_lab(tmp_path_factory) as lab:
        n1, n2 = (node.name for node in lab.topology.all_nodes())
        for ns in (NS, NS_X):
            lab.namespace(ns)
            lab.kubectl("label", "namespace", ns, "istio.io/dataplane-mode=ambient")
        lab.namespace(NS_OUT)
        lab.apply(_service_account("alpha"), _service_account("beta"), namespace=NS)
        lab.apply(
            _server("srv-1", n1),
            _server("srv-2", n2),
            pod_manifest("cli-a", [sleeper()], node=n1, labels={"app": "cli-a"}, serviceAccountName="alpha"),
            pod_manifest("cli-b", [sleeper()], node=n2, labels={"app": "cli-b"}, serviceAccountName="beta"),
            namespace=NS,
        )
        lab.apply(pod_manifest("cli-x", [sleeper()], node=n1), namespace=NS_X)
        lab.apply(pod_manifest("plain", [sleeper()], node=n2), namespace=NS_OUT)
        lab.wait_pods_ready(NS, "", 4, timeout=90)
        lab.wait_pods_ready(NS_X, "", 1, timeout=60)
        lab.wait_pods_ready(NS_OUT, "", 1, timeout=60)
        ips = {p["metadata"]["name"]: p["status"]["podIP"] for ns in (NS, NS_X, NS_OUT) for p in lab.pods(ns)}
        mesh = Mesh(lab, ips)
        mesh.expect(everything(), explain=False)
        yield mesh
        assert lab.log_tracebacks() == []


@pytest.fixture
def mesh(mesh_lab: Mesh) -> Iterator[Mesh]:
    yield mesh_lab
    for kind in ("authorizationpolicies", "peerauthentications"):
        mesh_lab.lab.kubectl("delete", kind, "--all", "--all-namespaces", "--ignore-not-found", check=False)
    mesh_lab.expect(everything(), explain=False)


def test_allow_by_principal_lets_only_that_service_account_in(mesh: Mesh) -> None:
    mesh.apply(
        policy(
            "allow-alpha",
            {"selector": ECHO, "action": "ALLOW", "rules": [{"from": [{"source": {"principals": [ALPHA]}}]}]},
        )
    )
    expected = everything("refused")
    expected.update({("cli-a", s, p): "ok" for s in SERVERS for p in PORTS})
    mesh.expect(expected)
    cond = mesh.condition("allow-alpha", NS)
    assert (cond["status"], cond["reason"]) == ("True", "Accepted")


def test_a_namespace_deny_by_source_namespace(mesh: Mesh) -> None:
    mesh.apply(policy("deny-x", {"action": "DENY", "rules": [{"from": [{"source": {"namespaces": [NS_X]}}]}]}))
    expected = everything()
    expected.update({("cli-x", s, p): "refused" for s in SERVERS for p in PORTS})
    mesh.expect(expected)


def test_ambit_flows_shows_the_denial_with_its_policy_and_allowed_flows_with_mutual_tls(mesh: Mesh) -> None:
    """Issue 20: ``ambit flows`` reads every node proxy's flow ring; a denied connection names its policy."""
    mesh.apply(policy("deny-x-flows", {"action": "DENY", "rules": [{"from": [{"source": {"namespaces": [NS_X]}}]}]}))
    expected = everything()
    expected.update({("cli-x", s, p): "refused" for s in SERVERS for p in PORTS})
    mesh.expect(expected, explain=False)
    lab_dir = str(mesh.lab.directory)
    denied = ambit("flows", "--lab-dir", lab_dir, "--namespace", NS_X, "--verdict", "denied", "-o", "json").stdout
    flows = [json.loads(line) for line in denied.splitlines()]
    assert flows, "no denied flow from pol-x"
    assert all(f["verdict"] == "denied" and f["src_namespace"] == NS_X for f in flows)
    assert any(f"explicitly denied by: {NS}/deny-x-flows" in f.get("reason", "") for f in flows), flows[:3]
    allowed = ambit("flows", "--lab-dir", lab_dir, "--pod", "cli-a", "--verdict", "allowed", "-o", "json").stdout
    inbound = [f for f in map(json.loads, allowed.splitlines()) if f["direction"] == "inbound"]
    assert inbound and all(f["mtls"] and f["src_identity"].endswith("/sa/alpha") for f in inbound), inbound[:3]
    text = ambit("flows", "--lab-dir", lab_dir, "--pod", "cli-x", "--verdict", "denied", "--last", "3").stdout
    assert len(text.splitlines()) == 3 and all(" DENIED " in line for line in text.splitlines()), text


def test_a_root_namespace_empty_allow_denies_everything_in_the_mesh(mesh: Mesh) -> None:
    mesh.apply(policy("allow-nothing", {}, namespace=ROOT))
    mesh.expect(everything("refused"))


def test_a_deny_on_one_port_leaves_the_other_open(mesh: Mesh) -> None:
    mesh.apply(policy("deny-9001", {"action": "DENY", "rules": [{"to": [{"operation": {"ports": ["9001"]}}]}]}))
    expected = {(c, s, p): ("refused" if p == 9001 else "ok") for c in CLIENTS for s in SERVERS for p in PORTS}
    mesh.expect(expected)


def test_ip_blocks_and_not_principals(mesh: Mesh) -> None:
    mesh.apply(
        policy(
            "allow-cli-a-ip",
            {
                "selector": ECHO,
                "rules": [{"from": [{"source": {"ipBlocks": [f"{mesh.ips['cli-a']}/32", mesh.ips["plain"]]}}]}],
            },
        )
    )
    expected = everything("refused")
    expected.update({(c, s, p): "ok" for c in ("cli-a", "plain") for s in SERVERS for p in PORTS})
    mesh.expect(expected)
    mesh.lab.kubectl("delete", "authorizationpolicy", "allow-cli-a-ip", "-n", NS)
    mesh.apply(
        policy("deny-not-alpha", {"action": "DENY", "rules": [{"from": [{"source": {"notPrincipals": [ALPHA]}}]}]})
    )
    expected = everything("refused")
    expected.update({("cli-a", s, p): "ok" for s in SERVERS for p in PORTS})
    mesh.expect(expected)


def test_a_when_condition_on_source_ip(mesh: Mesh) -> None:
    mesh.apply(
        policy(
            "deny-b-ip", {"action": "DENY", "rules": [{"when": [{"key": "source.ip", "values": [mesh.ips["cli-b"]]}]}]}
        )
    )
    expected = everything()
    expected.update({("cli-b", s, p): "refused" for s in SERVERS for p in PORTS})
    mesh.expect(expected)


def test_an_allow_with_only_http_rules_denies_everything_and_its_status_says_why(mesh: Mesh) -> None:
    mesh.apply(policy("allow-get", {"selector": ECHO, "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]}))
    mesh.expect(everything("refused"))
    cond = mesh.condition("allow-get", NS)
    # accepted with a warning, as istiod words it: True, UnsupportedValue
    assert (cond["status"], cond["reason"]) == ("True", "UnsupportedValue")
    assert "ztunnel does not support HTTP attributes (found: methods)" in cond["message"]


def test_audit_is_not_enforced_and_its_status_is_false(mesh: Mesh) -> None:
    mesh.apply(policy("audit-all", {"action": "AUDIT", "rules": [{}]}))
    cond = mesh.condition("audit-all", NS)
    assert (cond["status"], cond["reason"]) == ("False", "UnsupportedValue")
    assert "AUDIT" in cond["message"]
    mesh.expect(everything())


def test_a_dry_run_deny_logs_without_refusing(mesh: Mesh) -> None:
    mesh.apply(policy("dry-deny", {"action": "DENY", "rules": [{}]}, **{"istio.io/dry-run": "true"}))
    cond = mesh.condition("dry-deny", NS)
    assert cond["status"] == "True"
    logs = mesh.lab.component_logs("nodeproxy")

    def logged() -> bool:
        mesh.probe("cli-a", [("srv-1", 9000), ("srv-2", 9000)])
        return any("would be denied: explicitly denied by: pol/dry-deny" in p.read_text(errors="replace") for p in logs)

    wait_until("a dry-run log line", logged, timeout=POLICY_WAIT, interval=0.5)
    mesh.expect(everything())


def test_strict_peer_authentication_refuses_plaintext_and_lets_mesh_traffic_through(mesh: Mesh) -> None:
    mesh.apply(peer_authentication("strict", {"mtls": {"mode": "STRICT"}}))
    expected = everything()
    expected.update({("plain", s, p): "refused" for s in SERVERS for p in PORTS})
    mesh.expect(expected)


def test_a_port_level_permissive_exception_under_strict(mesh: Mesh) -> None:
    mesh.apply(
        peer_authentication(
            "strict-but-9001",
            {"selector": ECHO, "mtls": {"mode": "STRICT"}, "portLevelMtls": {"9001": {"mode": "PERMISSIVE"}}},
        )
    )
    expected = everything()
    expected.update({("plain", s, 9000): "refused" for s in SERVERS})
    mesh.expect(expected)


def test_a_workload_strict_under_a_namespace_permissive(mesh: Mesh) -> None:
    mesh.apply(
        peer_authentication("permissive", {"mtls": {"mode": "PERMISSIVE"}}),
        peer_authentication("srv-2-strict", {"selector": {"matchLabels": {"app": "echo"}}, "mtls": {"mode": "STRICT"}}),
    )
    expected = everything()
    expected.update({("plain", s, p): "refused" for s in SERVERS for p in PORTS})
    mesh.expect(expected)


def test_root_strict_with_a_workload_port_level_permissive_and_no_mode_of_its_own(mesh: Mesh) -> None:
    """TestPeerAuthentication "global-strict-permissive-workload-ports" and "global-permissive-strict-workload-ports"
    (u:tests/integration/ambient/baseline_test.go:893-962): ``global-strict`` in the root namespace, and in the
    destination's namespace ``local-port-override`` selecting the servers with only ``portLevelMtls`` (no top-level
    mode, so the rest of the port inherits the root's STRICT). Upstream calls the port it lists from every source;
    here also the port it does not list: plaintext from outside the mesh reaches 9001 and is refused on 9000. Then
    the reverse (root PERMISSIVE, 9001 STRICT): plaintext is refused on 9001 only. Mesh clients pass throughout."""
    mesh.apply(
        peer_authentication("global-strict", {"mtls": {"mode": "STRICT"}}, ROOT),
        peer_authentication(
            "local-port-override", {"selector": ECHO, "portLevelMtls": {"9001": {"mode": "PERMISSIVE"}}}
        ),
    )
    expected = everything()
    expected.update({("plain", s, 9000): "refused" for s in SERVERS})
    mesh.expect(expected)
    mesh.lab.kubectl("delete", "peerauthentication", "global-strict", "-n", ROOT)
    mesh.apply(
        peer_authentication("global-permissive", {"mtls": {"mode": "PERMISSIVE"}}, ROOT),
        peer_authentication("local-port-override", {"selector": ECHO, "portLevelMtls": {"9001": {"mode": "STRICT"}}}),
    )
    expected = everything()
    expected.update({("plain", s, 9001): "refused" for s in SERVERS})
    mesh.expect(expected)


@pytest.mark.parametrize("server", SERVERS)
def test_a_long_lived_connection_is_closed_within_a_second_of_a_deny_that_now_matches(mesh: Mesh, server: str) -> None:
    argv = [sys.executable, "-m", "ambit.cli", "lab", "exec", "--dir", str(mesh.lab.directory), "cli-b", "-n", NS, "--"]
    holder = subprocess.Popen(
        [*argv, "python3", "-c", HOLD, mesh.ips[server], "9000"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        deny_beta = {"from": [{"source": {"principals": [f"cluster.local/ns/{NS}/sa/beta"]}}]}
        mesh.apply(policy("deny-beta", {"action": "DENY", "rules": [deny_beta]}))
        applied = time.time()
        out, _ = holder.communicate(timeout=40)
        closed = [line for line in out.splitlines() if line.startswith("closed")]
        assert closed, out
        assert float(closed[0].split()[1]) - applied < 1.0
    finally:
        holder.kill()
        holder.wait()


PAGE_WINDOW = 15
"""Seconds of flows the topology page test looks at."""


def test_the_topology_page_shows_the_labs_workloads_and_the_denied_edge_in_red(
    mesh: Mesh, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Issue 20: ``ambit dashboard`` on the lab, in a headless Chromium: the lab's workloads, a solid mutual-TLS edge
    for allowed traffic and a red one for the traffic a policy denies; a screenshot ($AMBIT_SCREENSHOT); the allowed
    edge's rate from the proxies' metrics, above zero under load and zero after."""
    from tests.integration.cdp import CHROMIUM, lab_page_check

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (make install adds it)")
    started = time.time()
    mesh.apply(policy("deny-x-page", {"action": "DENY", "rules": [{"from": [{"source": {"namespaces": [NS_X]}}]}]}))
    expected = everything()
    expected.update({("cli-x", s, p): "refused" for s in SERVERS for p in PORTS})
    mesh.expect(expected, explain=False)
    tmp = tmp_path_factory.mktemp("page")
    argv = [sys.executable, "-m", "ambit.cli", "dashboard", "--lab-dir", str(mesh.lab.directory), "--port", "0"]
    with (tmp / "dashboard.err").open("w") as err:
        child = subprocess.Popen([*argv, "--interval", "0.5"], stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        if "http://127.0.0.1:" not in line:
            child.wait(30)
            pytest.fail(f"ambit dashboard did not start: {line}{(tmp / 'dashboard.err').read_text()}")
        url = line[line.index("http://") :].split()[0]
        shot = Path(os.environ.get("AMBIT_SCREENSHOT") or tmp / "topology.png")
        denied = (f"wl:{NS_X}/cli-x", f"wl:{NS}/srv-1")
        allowed = (f"wl:{NS}/cli-a", f"wl:{NS}/srv-1")
        # An earlier test's denials of cli-a (within the default five minutes) would paint the allowed edge red:
        # the page looks at the last PAGE_WINDOW seconds (?window=), which begin after this test began, while both
        # clients keep talking to srv-1.
        time.sleep(max(0.0, started + PAGE_WINDOW - time.time()))
        stop = threading.Event()

        def talk() -> None:
            while not stop.is_set():
                for client in ("cli-a", "cli-x"):
                    mesh.probe(client, [("srv-1", 9000)])
                stop.wait(1)

        talker = threading.Thread(target=talk, daemon=True)
        talker.start()
        try:
            page = f"{url}?window={PAGE_WINDOW}"
            # The allowed edge's rate (from the node proxies' :15020) is above zero while the clients talk, and
            # falls to zero once they stop (the page's rate window is its 15 s window).
            check = lab_page_check(page, tmp / "profile", shot, allowed=allowed, denied=denied, stop_load=stop.set)
            errors = asyncio.run(check)
        finally:
            stop.set()
            talker.join(60)
        assert errors == []
    finally:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.terminate()
            child.wait(30)
        if child.stdout is not None:
            child.stdout.close()
    assert child.returncode == 0, (tmp / "dashboard.err").read_text()
    assert _following_flow_readers() == [], "ambit dashboard left its flow readers behind"


def _following_flow_readers() -> list[str]:
    """Command lines of the ``ambit flows --follow`` children a lab dashboard of this checkout starts in the nodes
    (its Python: another clone's suite may have its own)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = argv[0] == os.fsencode(sys.executable)
        if ours and b"flows" in argv and b"--follow" in argv and b"--proxy-name" in argv:
            found.append(" ".join(a.decode(errors="replace") for a in argv))
    return found


ONLY_HBONE = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"name": "only-hbone", "namespace": NS},
    "spec": {
        "podSelector": ECHO,
        "policyTypes": ["Ingress"],
        "ingress": [{"ports": [{"protocol": "TCP", "port": 15008}]}],
    },
}


def _ready_and_restarts(mesh: Mesh, server: str) -> tuple[bool, int]:
    pod = mesh.lab.pod(server, NS)
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    restarts = sum(c.get("restartCount", 0) for c in (pod.get("status") or {}).get("containerStatuses") or [])
    return ready, restarts


def test_a_network_policy_allowing_only_hbone_keeps_the_mesh_and_refuses_plaintext(mesh: Mesh) -> None:
    """Istio's TestK8sNetPol on the lab's own NetworkPolicy enforcement (issue 16): an ingress policy on the servers
    that admits only HBONE (15008). Mesh clients, same-node and cross-node, still reach both servers (their node
    proxies arrive on 15008); the uncaptured client's plaintext to the application ports is refused by the node; the
    kubelet's probes come from the node, which NetworkPolicy always admits, so the servers stay Ready. With the
    policy deleted, plaintext reaches them again."""
    before = {server: _ready_and_restarts(mesh, server) for server in SERVERS}
    mesh.apply(ONLY_HBONE)
    try:
        table = mesh.lab.kubectl("get", "netpol", "-n", NS, "--no-headers").stdout
        assert table.split()[:2] == ["only-hbone", "app=echo"], table
        expected = everything()
        expected.update({("plain", s, p): "refused" for s in SERVERS for p in PORTS})
        mesh.expect(expected, explain=False)  # policy explain models Istio's policies, not the CNI's
        time.sleep(5)  # five probe periods with the policy in force
        for server in SERVERS:
            ready, restarts = _ready_and_restarts(mesh, server)
            assert ready, f"{server} is not Ready under the only-hbone policy"
            assert restarts == before[server][1], f"{server} restarted under the only-hbone policy"
        mesh.expect(expected, explain=False)
    finally:
        mesh.lab.kubectl("delete", "networkpolicy", "only-hbone", "-n", NS, "--ignore-not-found", check=False)
    mesh.expect(everything(), explain=False)
