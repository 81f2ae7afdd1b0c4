"""Ambient enrolment on a real 2-node lab with the mesh (issue 4, "Done when"; spec §1.2, §2, §3).

The module runs on the shared mesh lab (tests/e2e/lab_driver.py ``shared_mesh_lab``); each test works in namespaces
of its own and deletes them, and what it restarts (node agent, node proxy) is back before it ends. What is checked
is what a user of the mesh sees, by looking where it happens: ``nft list ruleset`` and ``ss`` inside the pod's
network namespace, the pod's ``ambient.istio.io/redirection`` annotation, Events, and a real HTTP call to an
http-echo server.

"Directly" is told apart from "through the node proxy" by the client's own address: the node proxy keeps the
client's IP but opens its own connection to the app, so only a direct connection reaches the server from the
same ``ip:port`` the client bound.

The node agent and node proxy are restarted abruptly (``Lab.restart_component``: their pod deleted with grace period
0, the DaemonSet making a new one) and kept down with ``Lab.component_stopped`` (the DaemonSet kept off the node).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.lab_driver import (
    TEST_TIMEOUT,
    Lab,
    ambit,
    http_echo_container,
    is_ready,
    pod_manifest,
    sleeper,
    wait_until,
)

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True  # tests/e2e/lab_driver.py shared_mesh_lab: one lab for the modules that share it

MODE = "istio.io/dataplane-mode"
REDIRECTION = "ambient.istio.io/redirection"
REDIRECT_TABLES = {"istio-ambient-mangle", "istio-ambient-nat"}
"""The in-pod tables always there when enrolled (the raw one only with DNS capture)."""
PROXY_PORTS = {15001, 15006, 15008}


@pytest.fixture(scope="module")
def mesh_lab(lab: Lab) -> Iterator[Lab]:
    """The shared lab (conftest's ``lab``), its CNI chained and node proxies connected on every node."""
    wait_mesh_installed(lab)
    yield lab
    assert lab.log_tracebacks() == []


def wait_mesh_installed(lab: Lab) -> None:
    """``lab up`` returns once the Nodes are Ready; the mesh daemons may still be starting. Wait until every
    node's conflist chains ambit-cni and its node proxy is connected to its node agent (else a pod created now
    would not go through the plugin)."""
    for node in lab.topology.all_nodes():
        conf_dir = lab.topology.cni_conf_dir(node.name)

        def installed(conf_dir: Path = conf_dir, node: str = node.name) -> bool:
            chained = any('"ambit-cni"' in p.read_text() for p in conf_dir.glob("*.conflist"))
            return chained and "node proxy connected" in lab.component_log("nodeagent", node)

        wait_until(f"the mesh installed on {node.name}", installed, timeout=30)


@pytest.fixture
def ambient_ns(mesh_lab: Lab, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace labelled ``istio.io/dataplane-mode=ambient``, deleted afterwards."""
    words = re.sub(r"[^a-z0-9]+", "-", request.node.name.removeprefix("test_").lower())
    name = "en-" + words[:30].strip("-")
    mesh_lab.namespace(name)
    mesh_lab.kubectl("label", "namespace", name, f"{MODE}=ambient")
    try:
        yield name
    finally:
        mesh_lab.delete_namespace(name)


# -- looking inside namespaces ------------------------------------------------------------------------------------
def in_netns(netns: str, *argv: str) -> str:
    done = subprocess.run(
        ["ip", "netns", "exec", netns, *argv], capture_output=True, text=True, timeout=10, check=False
    )
    assert done.returncode == 0, f"{' '.join(argv)} in {netns}: {done.stderr}"
    return done.stdout


def istio_tables(ruleset: str) -> set[str]:
    return set(re.findall(r"^table inet (istio-[\w-]+) \{", ruleset, re.MULTILINE))


def listening_ports(ss_output: str) -> set[int]:
    """Local ports of ``ss -ltnH`` lines (``LISTEN 0 128 0.0.0.0:15001 0.0.0.0:*``)."""
    ports: set[int] = set()
    for line in ss_output.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[3].rpartition(":")[2].isdigit():
            ports.add(int(fields[3].rpartition(":")[2]))
    return ports


def listener_pids(netns: str) -> dict[int, set[int]]:
    """Port → pids of the processes holding a listening TCP socket on it, inside ``netns``."""
    found: dict[int, set[int]] = {}
    for line in in_netns(netns, "ss", "-ltnpH").splitlines():
        fields = line.split()
        if len(fields) < 4 or not fields[3].rpartition(":")[2].isdigit():
            continue
        port = int(fields[3].rpartition(":")[2])
        found.setdefault(port, set()).update(int(p) for p in re.findall(r"pid=(\d+)", line))
    return found


def annotation(pod: dict[str, Any]) -> str | None:
    value = (pod["metadata"].get("annotations") or {}).get(REDIRECTION)
    return None if value is None else str(value)


def pod_state(lab: Lab, pod: dict[str, Any]) -> tuple[str | None, set[str], set[int]]:
    """(annotation, istio tables in its netns, listening ports in its netns) of the pod as it is now."""
    netns = lab.pod_netns(pod)
    current = lab.pod(pod["metadata"]["name"], pod["metadata"]["namespace"])
    return (
        annotation(current),
        istio_tables(in_netns(netns, "nft", "list", "ruleset")),
        listening_ports(in_netns(netns, "ss", "-ltnH")),
    )


def wait_enrolled(lab: Lab, namespace: str, name: str, timeout: float = 30) -> dict[str, Any]:
    def enrolled() -> dict[str, Any] | None:
        pod = lab.pod(name, namespace)
        if annotation(pod) != "enabled" or not pod["status"].get("podIP"):
            return None
        state = pod_state(lab, pod)
        return pod if state[1] >= REDIRECT_TABLES and state[2] >= PROXY_PORTS else None

    return wait_until(f"{namespace}/{name} enrolled (annotation, rules, listeners)", enrolled, timeout)


def wait_unenrolled(lab: Lab, pod: dict[str, Any], timeout: float = 20) -> None:
    def unenrolled() -> bool:
        value, tables, ports = pod_state(lab, pod)
        return value is None and not tables and not (ports & PROXY_PORTS)

    wait_until(f"{pod['metadata']['name']} unenrolled (no annotation, rules or listeners)", unenrolled, timeout)


# -- calls ----------------------------------------------------------------------------------------------------------
CALL = """
import http.client, json, sys
conn = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=5)
conn.connect()
local = "%s:%d" % conn.sock.getsockname()[:2]
conn.request("GET", "/enrolment", headers={"Connection": "close"})
answer = json.loads(conn.getresponse().read())
print(json.dumps({"local": local, "seen": answer["client"], "pod": answer["pod"]}))
"""


def call(lab: Lab, client: str, namespace: str, ip: str, port: int = 8080) -> dict[str, str]:
    """``client`` calls http-echo at ``ip:port``: the client's own address, what the server saw, who answered."""
    out = lab.exec(client, namespace, "python3", "-c", CALL, ip, str(port), timeout=20)
    answer: dict[str, str] = json.loads(out)
    return answer


def try_call(lab: Lab, client: str, namespace: str, ip: str) -> dict[str, str] | None:
    try:
        return call(lab, client, namespace, ip)
    except (AssertionError, ValueError, subprocess.TimeoutExpired):
        return None


def server_and_client(lab: Lab, namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """http-echo ``srv`` on node-2 and a sleeping ``cli`` on node-1, both Ready."""
    n1, n2 = (node.name for node in lab.topology.all_nodes())
    lab.apply(
        pod_manifest("srv", [http_echo_container(8080)], node=n2),
        pod_manifest("cli", [sleeper()], node=n1),
        namespace=namespace,
    )
    lab.wait_pods_ready(namespace, "", 2, timeout=60)
    return lab.pod("srv", namespace), lab.pod("cli", namespace)


# -- the tests --------------------------------------------------------------------------------------------------------
def test_a_new_ambient_pod_is_enrolled_at_cni_add_before_its_process_starts(mesh_lab: Lab, ambient_ns: str) -> None:
    lab = mesh_lab
    nft, ss = shutil.which("nft"), shutil.which("ss")
    assert nft and ss
    script = f"{nft} list ruleset; echo '--- listening'; {ss} -ltnH; echo '--- end'; exec sleep 3600"
    caps = {"capabilities": {"add": ["NET_ADMIN"]}}
    # NET_ADMIN is beyond Pod Security's baseline: the namespace admits it, as its owner would label it.
    lab.kubectl("label", "namespace", ambient_ns, "pod-security.kubernetes.io/enforce=privileged", "--overwrite")
    lab.apply(
        # Listing the pod's rules needs CAP_NET_ADMIN inside the container, as on a real cluster.
        pod_manifest(
            "early", [{"name": "main", "image": "none", "command": ["sh", "-c", script], "securityContext": caps}]
        ),
        namespace=ambient_ns,
    )

    def first_output() -> str:
        done = ambit("lab", "logs", "--dir", str(lab.directory), "early", "-n", ambient_ns, check=False)
        return done.stdout if "--- end" in done.stdout else ""

    out = wait_until("the container's first output", first_output, timeout=40)
    rules, _, rest = out.partition("--- listening")
    listening, _, _ = rest.partition("--- end")
    assert istio_tables(rules) >= REDIRECT_TABLES, rules
    assert "redirect to :15001" in rules and "redirect to :15006" in rules, rules
    assert listening_ports(listening) >= PROXY_PORTS, listening
    wait_enrolled(lab, ambient_ns, "early")


def test_unlabelling_the_namespace_unenrols_its_pods_and_traffic_goes_direct(mesh_lab: Lab, ambient_ns: str) -> None:
    lab = mesh_lab
    srv, cli = server_and_client(lab, ambient_ns)
    for pod in (srv, cli):
        wait_enrolled(lab, ambient_ns, pod["metadata"]["name"])
    srv_ip, cli_ip = str(srv["status"]["podIP"]), str(cli["status"]["podIP"])
    meshed = wait_until("cli reaches srv through the mesh", lambda: try_call(lab, "cli", ambient_ns, srv_ip), 30)
    assert meshed["pod"] == "srv" and meshed["seen"].rsplit(":", 1)[0] == cli_ip
    assert meshed["seen"] != meshed["local"], "through the node proxies the server sees the proxy's connection"

    lab.kubectl("label", "namespace", ambient_ns, f"{MODE}-")
    for pod in (srv, cli):
        wait_unenrolled(lab, pod)

    direct = call(lab, "cli", ambient_ns, srv_ip)
    assert direct["pod"] == "srv"
    assert direct["seen"] == direct["local"], direct
    assert direct["local"].rsplit(":", 1)[0] == cli_ip


def test_a_pod_labelled_none_is_unenrolled_and_reached_directly(mesh_lab: Lab, ambient_ns: str) -> None:
    lab = mesh_lab
    srv, _ = server_and_client(lab, ambient_ns)
    plain = ambient_ns + "-plain"
    lab.namespace(plain)
    try:
        lab.apply(pod_manifest("outsider", [sleeper()]), namespace=plain)
        lab.wait_pods_ready(plain, "", 1, timeout=30)
        wait_enrolled(lab, ambient_ns, "srv")
        wait_enrolled(lab, ambient_ns, "cli")
        srv_ip = str(srv["status"]["podIP"])
        inbound = wait_until("outsider reaches srv", lambda: try_call(lab, "outsider", plain, srv_ip), 30)
        assert inbound["seen"] != inbound["local"], "an enrolled server is reached through its node proxy"

        lab.kubectl("label", "pod", "srv", "-n", ambient_ns, f"{MODE}=none")
        wait_unenrolled(lab, srv)
        assert annotation(lab.pod("cli", ambient_ns)) == "enabled", "only the labelled pod leaves the mesh"

        direct = call(lab, "outsider", plain, srv_ip)
        assert direct["pod"] == "srv" and direct["seen"] == direct["local"], direct
    finally:
        lab.delete_namespace(plain)


def test_kube_system_and_host_network_pods_are_never_enrolled(mesh_lab: Lab, ambient_ns: str) -> None:
    lab = mesh_lab
    node = lab.topology.node(1)
    ambient_label = {"app": "x", MODE: "ambient"}
    lab.kubectl("label", "namespace", "kube-system", f"{MODE}=ambient", "--overwrite")
    # a hostNetwork pod is refused at the default Pod Security level (baseline): the namespace allows it, as a
    # user's namespace for node-level pods would
    lab.kubectl("label", "namespace", ambient_ns, "pod-security.kubernetes.io/enforce=privileged", "--overwrite")
    try:
        lab.apply(pod_manifest("en-system", [sleeper()], node=node.name, labels=ambient_label), namespace="kube-system")
        lab.apply(
            pod_manifest("hostnet", [sleeper()], node=node.name, labels=ambient_label, hostNetwork=True),
            pod_manifest("control", [sleeper()], node=node.name),
            namespace=ambient_ns,
        )
        lab.wait_pods_ready(ambient_ns, "", 2, timeout=40)
        lab.wait_pods_ready("kube-system", "app=x", 1, timeout=40)
        # The control pod, created with the others, enrolled: the agent has seen them all by now.
        wait_enrolled(lab, ambient_ns, "control")
        time.sleep(2)

        system = lab.pod("en-system", "kube-system")
        assert pod_state(lab, system) == (None, set(), set())
        hostnet = lab.pod("hostnet", ambient_ns)
        assert annotation(hostnet) is None
        node_rules = in_netns(node.netns, "nft", "list", "ruleset")
        assert "istio-ambient-mangle" not in istio_tables(node_rules), "no in-pod rules in the node's namespace"
        assert not listening_ports(in_netns(node.netns, "ss", "-ltnH")) & {15001, 15006}
        kinds = {e.get("reason") for e in lab.events("kube-system", "en-system") + lab.events(ambient_ns, "hostnet")}
        assert not {r for r in kinds if str(r).startswith("Ambient")}, kinds
    finally:
        lab.kubectl(
            "delete", "pod", "en-system", "-n", "kube-system", "--wait=false", "--ignore-not-found", check=False
        )
        lab.kubectl("label", "namespace", "kube-system", f"{MODE}-", check=False)


def test_a_restarted_node_agent_leaves_the_rules_as_they_are_and_pods_stay_enrolled(
    mesh_lab: Lab, ambient_ns: str
) -> None:
    lab = mesh_lab
    node = lab.topology.node(1)
    lab.apply(
        pod_manifest("a", [http_echo_container(8080)], node=node.name),
        pod_manifest("b", [http_echo_container(8080)], node=node.name),
        namespace=ambient_ns,
    )
    lab.wait_pods_ready(ambient_ns, "", 2, timeout=40)
    pods = [wait_enrolled(lab, ambient_ns, name) for name in ("a", "b")]
    before = {p["metadata"]["name"]: in_netns(lab.pod_netns(p), "nft", "list", "ruleset") for p in pods}
    # The new pod's container starts a new log.
    lab.restart_component("nodeagent", node.name)
    wait_until(
        "the new node agent running",
        lambda: lab.component_log("nodeagent", node.name).count("is running") > 0,
        timeout=30,
    )
    time.sleep(2)  # it re-applies the rules of the running pods as it lists them

    for pod in pods:
        name = pod["metadata"]["name"]
        after = in_netns(lab.pod_netns(pod), "nft", "list", "ruleset")
        assert after == before[name], f"{name}: the ruleset changed across the agent's restart"
        value, tables, ports = pod_state(lab, pod)
        assert value == "enabled" and tables >= REDIRECT_TABLES and ports >= PROXY_PORTS
    host = in_netns(node.netns, "nft", "list", "ruleset")
    assert host.count("table inet istio-ambient-nat {") == 1, host


def test_a_restarted_node_proxy_gets_every_pod_back_from_the_snapshot(mesh_lab: Lab, ambient_ns: str) -> None:
    lab = mesh_lab
    node = lab.topology.node(1)
    lab.apply(
        pod_manifest("a", [http_echo_container(8080)], node=node.name),
        pod_manifest("b", [http_echo_container(8080)], node=node.name),
        pod_manifest("c", [sleeper()], node=node.name),
        namespace=ambient_ns,
    )
    lab.wait_pods_ready(ambient_ns, "", 3, timeout=40)
    pods = [wait_enrolled(lab, ambient_ns, name) for name in ("a", "b", "c")]
    b_ip = str(pods[1]["status"]["podIP"])
    wait_until("c reaches b through the mesh", lambda: try_call(lab, "c", ambient_ns, b_ip), 30)
    proxy = lab.component_pid("nodeproxy", node.name)
    assert proxy is not None
    assert all(proxy in listener_pids(lab.pod_netns(p)).get(15001, set()) for p in pods)

    lab.restart_component("nodeproxy", node.name)
    new = lab.component_pid("nodeproxy", node.name)
    assert new is not None and new != proxy

    for pod in pods:
        netns = lab.pod_netns(pod)

        def restored(netns: str = netns) -> bool:
            held = listener_pids(netns)
            return all(held.get(port) == {new} for port in PROXY_PORTS)

        wait_until(f"{pod['metadata']['name']}'s listeners held by the new node proxy", restored, timeout=20)
        assert annotation(lab.pod(pod["metadata"]["name"], ambient_ns)) == "enabled"
    answer = wait_until("c reaches b again", lambda: try_call(lab, "c", ambient_ns, b_ip), 30)
    assert answer["pod"] == "b" and answer["seen"] != answer["local"], answer


def test_a_pod_created_while_the_node_agent_is_down_fails_its_add_and_is_enrolled_once_the_agent_is_back(
    mesh_lab: Lab, ambient_ns: str
) -> None:
    lab = mesh_lab
    node = lab.topology.node(1)
    with lab.component_stopped("nodeagent", node.name):
        lab.apply(pod_manifest("late", [sleeper()], node=node.name), namespace=ambient_ns)

        def failed_add() -> list[dict[str, Any]]:
            return [e for e in lab.events(ambient_ns, "late") if e.get("reason") == "FailedCreatePodSandBox"]

        events = wait_until("a FailedCreatePodSandBox Event on the pod", failed_add, timeout=30)
        message = str(events[0].get("message") or events[0].get("note"))
        assert "ambit-cni" in message and "node agent" in message, message
        pod = lab.pod("late", ambient_ns)
        assert pod["status"].get("phase") == "Pending" and not is_ready(pod)
        assert annotation(pod) is None
    lab.wait_pods_ready(ambient_ns, "", 1, timeout=60)
    wait_enrolled(lab, ambient_ns, "late")


def test_a_pod_whose_enrolment_fails_gets_an_event_that_says_what_to_do(mesh_lab: Lab, ambient_ns: str) -> None:
    lab = mesh_lab
    manifest = pod_manifest("bad", [sleeper()])
    manifest["metadata"]["annotations"] = {"ambient.istio.io/bypass-inbound-capture": "maybe"}
    lab.apply(manifest, namespace=ambient_ns)

    def warning() -> list[dict[str, Any]]:
        items = lab.items("events.v1.events.k8s.io", "-n", ambient_ns)
        return [
            e
            for e in items
            if (e.get("regarding") or {}).get("name") == "bad" and e.get("reason") == "AmbientRedirectionFailed"
        ]

    event = wait_until("an AmbientRedirectionFailed Event on the pod", warning, timeout=30)[0]
    assert event["type"] == "Warning"
    assert event["regarding"]["kind"] == "Pod" and event["regarding"]["namespace"] == ambient_ns
    assert event.get("reportingController") == "ambit.dev/node-agent"
    assert "ambient.istio.io/bypass-inbound-capture" in event["note"] and "Fix" in event["note"], event["note"]
    assert lab.pod("bad", ambient_ns)["status"].get("phase") == "Pending"

    lab.kubectl(
        "annotate", "pod", "bad", "-n", ambient_ns, "ambient.istio.io/bypass-inbound-capture=true", "--overwrite"
    )
    wait_enrolled(lab, ambient_ns, "bad", timeout=60)
