"""Waypoint deployment on the lab (issue 17): ``ambit waypoint apply`` makes a Gateway, the control plane (the lab's
installed istiod) deploys it, the lab's controllers and kubelet run the waypoint pod, whose network reaches the
control plane at the address the Deployment names; deleting the Gateway removes everything.

The pod becomes ready (it runs ``ambit waypoint proxy``) and the Gateway Programmed, with its hostname address.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from tests.e2e.lab_driver import TEST_TIMEOUT, Lab, ambit, condition, module_on_shared_lab, wait_until

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True  # tests/e2e/lab_driver.py shared_mesh_lab: one lab for the modules that share it

NS = "wp-deploy"
SELECTOR = "gateway.networking.k8s.io/gateway-name=waypoint"
CONNECT = """
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
with socket.create_connection((host, int(port)), timeout=3):
    print("connected")
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with module_on_shared_lab(tmp_path_factory) as up:
        up.namespace(NS)
        yield up
        assert up.log_tracebacks() == []


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    (container,) = pod["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_apply_deploys_a_waypoint_pod_that_reaches_the_control_plane_and_delete_removes_it(lab: Lab) -> None:
    kubeconfig = str(lab.topology.kubeconfig)
    done = ambit("waypoint", "apply", "-n", NS, "--kubeconfig", kubeconfig)
    assert done.stdout.strip() == f"✅ waypoint {NS}/waypoint applied"

    def running_pod() -> dict[str, Any] | None:
        pods = [p for p in lab.pods(NS, SELECTOR) if (p.get("status") or {}).get("podIP")]
        return pods[0] if pods else None

    pod = wait_until("the waypoint pod has an address", running_pod, timeout=90)
    assert pod["spec"]["serviceAccountName"] == "waypoint"
    assert pod["metadata"]["labels"]["istio.io/dataplane-mode"] == "none"
    address = env_of(pod)["XDS_ADDRESS"]
    # istiod's fixed cluster IP (deploy/overlays/lab).
    assert address == "198.19.255.12:15012"
    # In the pod's network namespace (the sandbox stays while the container restarts): the address the
    # Deployment names reaches the control plane.
    argv = ["ip", "netns", "exec", lab.pod_netns(pod), sys.executable, "-c", CONNECT, address]
    tries: list[subprocess.CompletedProcess[str]] = []

    def connected() -> bool:
        tries.append(subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False))
        return tries[-1].stdout.strip() == "connected"

    try:
        wait_until("the waypoint pod's network reaches the control plane", connected, timeout=30, interval=1.0)
    except pytest.fail.Exception:
        last = tries[-1]
        raise AssertionError(f"{argv}: exit {last.returncode}, out {last.stdout!r}, err {last.stderr!r}") from None

    if importlib.util.find_spec("ambit.cli.waypoint_proxy") is not None:

        def programmed() -> dict[str, Any] | None:
            gateway: dict[str, Any] = lab.get("gateway", "waypoint", "-n", NS)
            return gateway if condition(gateway, "Programmed").get("status") == "True" else None

        gateway = wait_until("the Gateway is Programmed", programmed, timeout=120)
        host = f"waypoint.{NS}.svc.cluster.local"
        ip = lab.get("service", "waypoint", "-n", NS)["spec"]["clusterIP"]
        # as istiod reports them for the waypoint class: the Service's cluster IP, then its hostname
        wanted = [{"type": "IPAddress", "value": ip}, {"type": "Hostname", "value": host}]
        assert gateway["status"]["addresses"] == wanted
        listed = ambit("waypoint", "list", "-n", NS, "--kubeconfig", kubeconfig).stdout.splitlines()
        assert listed[1].split() == ["waypoint", "default", "service", "True"]

    done = ambit("waypoint", "delete", "waypoint", "-n", NS, "--kubeconfig", kubeconfig)
    assert done.stdout.strip() == f"waypoint {NS}/waypoint deleted"
    for kind in ("deployments", "services", "serviceaccounts"):
        wait_until(
            f"the waypoint's {kind} are gone",
            lambda kind=kind: not [o for o in lab.items(kind, "-n", NS) if o["metadata"]["name"] == "waypoint"],
            timeout=30,
        )
    wait_until("the waypoint pod is gone", lambda: not lab.pods(NS, SELECTOR), timeout=60)


def test_the_class_defaults_config_map_rolls_the_waypoint_pods_to_a_new_grace_period(lab: Lab) -> None:
    """Upstream TestWaypointChanges: waypoint pods start with terminationGracePeriodSeconds 30; after the
    change (here the class defaults ConfigMap, upstream the injector's waypoint template) new pods get 3."""
    kubeconfig = str(lab.topology.kubeconfig)
    ambit("waypoint", "apply", "-n", NS, "--name", "graceful", "--kubeconfig", kubeconfig)
    selector = "gateway.networking.k8s.io/gateway-name=graceful"

    def pod_with_grace(want: int) -> dict[str, Any] | None:
        pods = [p for p in lab.pods(NS, selector) if p["spec"].get("terminationGracePeriodSeconds") == want]
        return pods[0] if pods else None

    defaults = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "waypoint-grace-defaults",
            "namespace": "istio-system",
            "labels": {"gateway.istio.io/defaults-for-class": "istio-waypoint"},
        },
        "data": {"deployment": "spec: {template: {spec: {terminationGracePeriodSeconds: 3}}}"},
    }
    try:
        wait_until("a waypoint pod with the default grace period 30", lambda: pod_with_grace(30), timeout=90)
        lab.apply(defaults)
        wait_until("a waypoint pod with the grace period 3", lambda: pod_with_grace(3), timeout=90)
    finally:
        lab.kubectl("delete", "configmap", "waypoint-grace-defaults", "-n", "istio-system", "--ignore-not-found")
        ambit("waypoint", "delete", "graceful", "-n", NS, "--kubeconfig", kubeconfig)
    wait_until("the graceful waypoint's pods are gone", lambda: not lab.pods(NS, selector), timeout=60)


def test_the_injector_s_waypoint_template_rolls_the_waypoint_pods_to_a_new_grace_period(lab: Lab) -> None:
    """Upstream TestWaypointChanges as upstream does it: read the installed ConfigMap istio-sidecar-injector, put
    ``terminationGracePeriodSeconds: 3`` after the waypoint template's ``serviceAccountName`` line, write it back,
    and new waypoint pods get grace 3. Then an attack: a template that would loop a billion times is refused in
    the Gateway's status and the running pod stays. The ConfigMap is restored afterwards."""
    kubeconfig = str(lab.topology.kubeconfig)
    ambit("waypoint", "apply", "-n", NS, "--name", "templated", "--kubeconfig", kubeconfig)
    selector = "gateway.networking.k8s.io/gateway-name=templated"
    anchor = "serviceAccountName: {{.ServiceAccount | quote}}"

    def pod_with_grace(want: int) -> dict[str, Any] | None:
        pods = [p for p in lab.pods(NS, selector) if p["spec"].get("terminationGracePeriodSeconds") == want]
        return pods[0] if pods else None

    def write_config(config_text: str) -> None:
        patch = json.dumps({"data": {"config": config_text}})
        lab.kubectl("patch", "configmap", "istio-sidecar-injector", "-n", "istio-system", "--type=merge", "-p", patch)

    original = lab.get("configmap", "istio-sidecar-injector", "-n", "istio-system")["data"]["config"]
    config = yaml.safe_load(original)
    assert anchor in config["templates"]["waypoint"]
    try:
        wait_until("a waypoint pod with the default grace period 30", lambda: pod_with_grace(30), timeout=90)
        edited = config["templates"]["waypoint"].replace(anchor, anchor + "\n      terminationGracePeriodSeconds: 3")
        write_config(yaml.safe_dump({**config, "templates": {**config["templates"], "waypoint": edited}}))
        wait_until("a waypoint pod with the grace period 3", lambda: pod_with_grace(3), timeout=90)

        hostile = "{{ range $a := 1000000000 }}x{{ end }}"
        write_config(yaml.safe_dump({**config, "templates": {**config["templates"], "waypoint": hostile}}))

        def refused() -> dict[str, Any] | None:
            found = condition(lab.get("gateway", "templated", "-n", NS), "Programmed")
            return found if "range over 1000000000" in found.get("message", "") else None

        wait_until("the hostile template is refused in the Gateway's status", refused, timeout=60)
        assert pod_with_grace(3) is not None, "what was deployed stays"
    finally:
        write_config(original)
        ambit("waypoint", "delete", "templated", "-n", NS, "--kubeconfig", kubeconfig)
    wait_until("the templated waypoint's pods are gone", lambda: not lab.pods(NS, selector), timeout=60)
