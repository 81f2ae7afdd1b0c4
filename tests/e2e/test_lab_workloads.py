"""Workloads on a real 2-node lab: pods come and go on both nodes, traffic flows between them and through Service
VIPs, and readiness decides which endpoints get traffic."""

from __future__ import annotations

import ipaddress
import re
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.lab_driver import (
    TEST_TIMEOUT,
    Lab,
    ambit,
    deployment_manifest,
    http_echo_container,
    is_ready,
    netns_names,
    pod_manifest,
    service_manifest,
    sleeper,
    wait_until,
)

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True  # tests/e2e/conftest.py lab: the shared mesh lab (these namespaces are not in the mesh)

APPS = [sys.executable, "-m", "ambit.lab.apps"]
# One line of ``ambit.lab.apps client --url``: which pod answered, on which node, and the caller's address it saw.
HTTP_OK = re.compile(r"^\S+ ok (?P<pod>\S+) node=(?P<node>\S+) saw-client=(?P<client>[\d.]+):\d+$")


def http_call(lab: Lab, pod: str, namespace: str, url: str, count: int = 1) -> list[str]:
    """``count`` HTTP calls from inside ``pod``; one line per call (``... ok <pod> node=... saw-client=...``)."""
    out = lab.exec(pod, namespace, *APPS, "client", "--url", url, "--count", str(count), "--interval", "0.02")
    return out.splitlines()


def answers(lines: list[str]) -> list[dict[str, str]]:
    """The parsed answers, or [] as soon as one call failed (callers wait until every call succeeds)."""
    found = [HTTP_OK.match(line) for line in lines]
    return [m.groupdict() for m in found if m] if all(found) else []


def cluster_ip(lab: Lab, namespace: str, service: str) -> str:
    ip = str(lab.get("service", service, "-n", namespace)["spec"]["clusterIP"])
    assert ipaddress.ip_address(ip) in ipaddress.ip_network("198.19.0.0/16")
    return ip


def slice_endpoints(lab: Lab, namespace: str, service: str) -> dict[str, dict[str, Any]]:
    """The Service's EndpointSlice endpoints by pod name: their conditions."""
    slices = lab.items("endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={service}")
    return {
        ep["targetRef"]["name"]: ep.get("conditions") or {}
        for s in slices
        for ep in s.get("endpoints") or ()
        if ep.get("targetRef")
    }


def pod_addresses(netns: str) -> str:
    return subprocess.run(["ip", "-n", netns, "-br", "addr"], capture_output=True, text=True, check=True).stdout


def test_deployment_pods_are_added_and_deleted_on_both_nodes(lab: Lab, namespace: str) -> None:
    lab.apply(deployment_manifest("spread", 4, http_echo_container()), namespace=namespace)
    pods = lab.wait_pods_ready(namespace, "app=spread", 4)
    assert {p["spec"]["nodeName"] for p in pods} == {"node-1", "node-2"}, "the scheduler spreads pods over nodes"

    lab.kubectl("scale", "deployment/spread", "--replicas=6", "-n", namespace)
    pods = lab.wait_pods_ready(namespace, "app=spread", 6)
    assert {p["spec"]["nodeName"] for p in pods} == {"node-1", "node-2"}
    namespaces = netns_names()
    for pod in pods:
        node, ip = pod["spec"]["nodeName"], pod["status"]["podIP"]
        where = lab.topology.node_named(node)
        assert where is not None and ipaddress.ip_address(ip) in ipaddress.ip_network(where.pod_cidr), (ip, node)
        assert lab.pod_netns(pod) in namespaces
        assert f"{ip}/" in pod_addresses(lab.pod_netns(pod))
        assert ip in lab.ipam_files(node), f"host-local on {node} does not hold {ip}"

    lab.kubectl("scale", "deployment/spread", "--replicas=1", "-n", namespace)
    kept = wait_until("the Deployment down to 1 pod", lambda: _pods_if(lab, namespace, "app=spread", 1), 30)
    assert kept is not None
    gone = [p for p in pods if p["metadata"]["uid"] != kept[0]["metadata"]["uid"]]
    assert {p["spec"]["nodeName"] for p in gone} == {"node-1", "node-2"}
    # The node deletes a pod from the API only after CNI DEL and removing its namespace: no waiting here.
    _assert_released(lab, gone)
    assert lab.pod_netns(kept[0]) in netns_names()
    assert kept[0]["status"]["podIP"] in lab.ipam_files(kept[0]["spec"]["nodeName"])

    lab.kubectl("delete", "deployment", "spread", "-n", namespace, "--wait=false")
    wait_until("every pod of the Deployment gone", lambda: _pods_if(lab, namespace, "app=spread", 0) == [], 30)
    _assert_released(lab, kept)


def _pods_if(lab: Lab, namespace: str, selector: str, count: int) -> list[dict[str, Any]] | None:
    """The pods when exactly ``count`` exist (counting terminating ones), else None."""
    pods = lab.pods(namespace, selector)
    return pods if len(pods) == count else None


def _assert_released(lab: Lab, pods: list[dict[str, Any]]) -> None:
    namespaces = netns_names()
    for pod in pods:
        name, node, ip = pod["metadata"]["name"], pod["spec"]["nodeName"], pod["status"]["podIP"]
        assert lab.pod_netns(pod) not in namespaces, f"{name}'s namespace is left"
        assert ip not in lab.ipam_files(node), f"{name}'s address {ip} is still held on {node}"
        # The node forgets the pod (its state and token; container logs stay until lab down) right after that.
        state = [lab.topology.pod_dir(pod["metadata"]["uid"]) / f for f in ("runtime.json", "token")]
        wait_until(f"{name}'s state and token removed", partial(_none_exist, state), 5, 0.05)


def _none_exist(paths: list[Path]) -> bool:
    return not any(p.exists() for p in paths)


def test_pods_reach_each_other_across_nodes_and_through_cluster_ips(lab: Lab, namespace: str) -> None:
    tcp_echo: dict[str, Any] = {
        "name": "echo",
        "image": "none",
        "command": ["python3", "-m", "ambit.lab.apps", "tcp-echo"],
    }
    banner: dict[str, Any] = {
        "name": "banner",
        "image": "none",
        "command": ["python3", "-m", "ambit.lab.apps", "server-first"],
    }
    for container, port in ((tcp_echo, 7000), (banner, 2525)):
        container["command"] += ["--port", str(port)]
        container["readinessProbe"] = {"tcpSocket": {"port": port}, "periodSeconds": 1}
    lab.apply(
        pod_manifest("echo-1", [http_echo_container()], node="node-1", labels={"app": "echo"}),
        pod_manifest("echo-2", [http_echo_container()], node="node-2", labels={"app": "echo"}),
        pod_manifest("tcp-echo", [tcp_echo], node="node-2"),
        pod_manifest("banner", [banner], node="node-2"),
        pod_manifest("client", [sleeper()], node="node-1"),
        service_manifest("echo", {"app": "echo"}, 80, 8080),
        service_manifest("tcp-echo", {"app": "tcp-echo"}, 7000, 7000),
        service_manifest("banner", {"app": "banner"}, 25, 2525),
        namespace=namespace,
    )
    pods = {p["metadata"]["name"]: p for p in lab.wait_pods_ready(namespace, "", 5)}
    client_ip, echo_2_ip = pods["client"]["status"]["podIP"], pods["echo-2"]["status"]["podIP"]

    # Pod to pod across nodes: the echo on node-2 sees the client's own pod address (nothing is NATed).
    (answer,) = answers(http_call(lab, "client", namespace, f"http://{echo_2_ip}:8080/direct"))
    assert answer == {"pod": "echo-2", "node": "node-2", "client": client_ip}

    # A pod's container calling across nodes too (the lab's PATH gives it the project's python3).
    echo_1_ip = pods["echo-1"]["status"]["podIP"]
    caller = ["python3", "-m", "ambit.lab.apps", "client", "--interval", "0.3", "--url", f"http://{echo_1_ip}:8080/"]
    caller_pod = pod_manifest("caller", [{"name": "c", "image": "none", "command": caller}], node="node-2")
    lab.apply(caller_pod, namespace=namespace)
    caller_ip = lab.wait_pods_ready(namespace, "app=caller", 1)[0]["status"]["podIP"]
    wanted = f"ok echo-1 node=node-1 saw-client={caller_ip}:"

    def caller_log() -> bool:
        done = ambit("lab", "logs", "--dir", str(lab.directory), "caller", "-n", namespace, check=False)
        return wanted in done.stdout

    wait_until("the caller pod's calls to answer", caller_log, 15)

    # Pod to ClusterIP: both endpoints answer. The one on the other node sees the client's address; so does the one
    # on the client's own node when the node's bridge passes frames to netfilter (br_netfilter, as on Kubernetes
    # nodes), else it sees the node's bridge address (the lab then SNATs same-node DNAT, ambit.lab.network.services).
    vip = cluster_ip(lab, namespace, "echo")
    seen = wait_until(
        "calls to the echo VIP to succeed",
        lambda: answers(http_call(lab, "client", namespace, f"http://{vip}/vip", count=24)),
        15,
    )
    assert {a["pod"] for a in seen} == {"echo-1", "echo-2"}, "the VIP should spread calls over both endpoints"
    node = lab.topology.node(1)
    setting = ["ip", "netns", "exec", node.netns, "cat", "/proc/sys/net/bridge/bridge-nf-call-iptables"]
    bridged = subprocess.run(setting, capture_output=True, text=True, check=False).stdout.strip() == "1"
    for a in seen:
        assert a["client"] == (client_ip if a["node"] == "node-2" or bridged else node.pod_gateway), a

    # TCP echo and a server-first protocol through their VIPs, to pods on the other node.
    tcp_vip, banner_vip = cluster_ip(lab, namespace, "tcp-echo"), cluster_ip(lab, namespace, "banner")
    echo_line = wait_until("TCP echo through its VIP", lambda: tcp_call(lab, namespace, f"{tcp_vip}:7000"), 15)
    assert echo_line.endswith("ok echo='ping'")
    banner_line = wait_until(
        "the server-first banner through its VIP",
        lambda: tcp_call(lab, namespace, f"{banner_vip}:25", "--server-first"),
        15,
    )
    assert banner_line.endswith("ok banner='HELLO from banner'")


def tcp_call(lab: Lab, namespace: str, target: str, *options: str) -> str:
    """One ``client --tcp`` call from the pod ``client``: its line when it succeeded, else ''."""
    line = lab.exec("client", namespace, *APPS, "client", "--tcp", target, *options, "--count", "1").strip()
    return line if " ok " in line else ""


def test_readiness_gates_endpoints_and_traffic(lab: Lab, namespace: str) -> None:
    # never-ready serves on 8080 but is probed on 9999, where nothing listens.
    never = pod_manifest("never-ready", [http_echo_container(ready_port=9999)], labels={"app": "gated"})
    lab.apply(
        never,
        service_manifest("gated", {"app": "gated"}, 80, 8080),
        pod_manifest("client", [sleeper()]),
        namespace=namespace,
    )
    lab.wait_pods_ready(namespace, "app=client", 1)
    wait_until(
        "never-ready in the slice, not ready",
        lambda: slice_endpoints(lab, namespace, "gated").get("never-ready", {}).get("ready") is False,
        15,
    )
    pod = lab.pod("never-ready", namespace)
    assert pod["status"]["phase"] == "Running" and not is_ready(pod)
    vip = cluster_ip(lab, namespace, "gated")
    url = f"http://{vip}/"
    refused = wait_until(
        "calls to a VIP without ready endpoints to be refused",
        lambda: [line for line in http_call(lab, "client", namespace, url) if "Connection refused" in line],
        10,
    )
    assert refused, "traffic must not reach a pod that is not ready"

    # late-ready starts listening (and passes its probe) only after a delay.
    late = pod_manifest("late-ready", [http_echo_container(delay=4)], labels={"app": "gated"})
    lab.apply(late, namespace=namespace)
    states: list[Any] = []

    def late_is_ready() -> bool:
        endpoints = slice_endpoints(lab, namespace, "gated")
        states.append(endpoints.get("late-ready", {}).get("ready"))
        return bool(states[-1])

    wait_until("late-ready to become ready in the slice", late_is_ready, 20)
    assert False in states, f"late-ready should have been in the slice as not ready first: {states}"
    assert slice_endpoints(lab, namespace, "gated")["never-ready"].get("ready") is False
    assert is_ready(lab.pod("late-ready", namespace))

    seen = wait_until("calls to the VIP to succeed", lambda: answers(http_call(lab, "client", namespace, url, 10)), 15)
    assert {a["pod"] for a in seen} == {"late-ready"}
