"""``ambit lab up --mesh``: the node agent enrols ambient pods (annotation, in-pod rules) and the node proxy listens."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from tests.e2e.lab_driver import (
    TEST_TIMEOUT,
    Lab,
    deployment_manifest,
    http_echo_container,
    is_ready,
    running_lab,
    wait_until,
)

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]

REDIRECTION = "ambient.istio.io/redirection"
PROBE_SNAT = "169.254.7.127"


@pytest.fixture(scope="module")
def mesh_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A 2-node lab with the mesh's node agent and node proxy on every node."""
    with running_lab(tmp_path_factory.mktemp("e2e-mesh"), mesh=True) as up:
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
