"""The mesh installed as on a cluster (issue 16): ``ambit lab up --install`` applies ``deploy/overlays/lab``, and the
lab's own controllers and kubelets run the control plane Deployment and the node agent and node proxy DaemonSets
(no host processes). Checked: every component available on every node with its ControllerRevision; ambient pods
enrolled by the DaemonSet's CNI plugin and talking over HBONE with SPIFFE identities through the DaemonSet's node
proxies; the control plane's webhook, installed by the manifests, reached through its Service; and a
``kubectl rollout restart`` of the node proxies, node by node onto a new ControllerRevision, after which traffic
flows again.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.e2e.lab_driver import (
    Lab,
    deployment_manifest,
    http_echo_container,
    is_ready,
    pod_manifest,
    running_lab,
    service_manifest,
    sleeper,
    wait_until,
)

SYSTEM = "istio-system"
NODES = ("node-1", "node-2")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with running_lab(tmp_path_factory.mktemp("e2e-install"), mesh=True) as up:
        yield up


def _available(lab: Lab) -> dict[str, str]:
    out = {}
    for ds in lab.items("daemonsets", "-n", SYSTEM):
        status = ds.get("status") or {}
        out[f"ds/{ds['metadata']['name']}"] = (
            f"{status.get('numberAvailable', 0)}/{status.get('desiredNumberScheduled')}"
        )
    for deploy in lab.items("deployments", "-n", SYSTEM):
        status = deploy.get("status") or {}
        out[f"deploy/{deploy['metadata']['name']}"] = (
            f"{status.get('availableReplicas', 0)}/{deploy['spec']['replicas']}"
        )
    return out


def _request(lab: Lab, namespace: str, server_ip: str) -> dict[str, object]:
    code = f"import urllib.request;print(urllib.request.urlopen('http://{server_ip}:8080/',timeout=5).read().decode())"
    return dict(json.loads(lab.exec("client", namespace, "python3", "-c", code)))


def _proxy_log(lab: Lab, node: str) -> str:
    (proxy,) = [p for p in lab.pods(SYSTEM, "app=ztunnel") if p["spec"]["nodeName"] == node]
    return (lab.directory / "pods" / proxy["metadata"]["uid"] / "istio-proxy.log").read_text(errors="replace")


def test_the_mesh_runs_as_a_deployment_and_daemonsets_on_every_node(lab: Lab) -> None:
    assert _available(lab) == {"ds/istio-cni-node": "2/2", "ds/ztunnel": "2/2", "deploy/istiod": "1/1"}
    revisions = {r["metadata"]["ownerReferences"][0]["name"] for r in lab.items("controllerrevisions", "-n", SYSTEM)}
    assert revisions == {"istio-cni-node", "ztunnel"}
    nodes = {p["spec"]["nodeName"] for p in lab.pods(SYSTEM, "app=ztunnel")}
    assert nodes == {"node-1", "node-2"}
    # The installed webhook configuration now trusts the control plane, and fails closed.
    (hook,) = lab.get("validatingwebhookconfiguration", "istio-validator-ambit")["webhooks"]
    assert hook["clientConfig"].get("caBundle") and hook["failurePolicy"] == "Fail"


def test_ambient_pods_are_enrolled_and_talk_over_hbone_through_the_daemonset_proxies(lab: Lab, namespace: str) -> None:
    lab.kubectl("label", "namespace", namespace, "istio.io/dataplane-mode=ambient")
    lab.apply(
        pod_manifest("server", [http_echo_container()], node="node-2"),
        pod_manifest("client", [sleeper()], node="node-1"),
        namespace=namespace,
    )
    pods = lab.wait_pods_ready(namespace, "", 2, timeout=60)
    enrolled = {
        p["metadata"]["name"]: p["metadata"].get("annotations", {}).get("ambient.istio.io/redirection") for p in pods
    }
    assert enrolled == {"server": "enabled", "client": "enabled"}
    server_ip = lab.pod("server", namespace)["status"]["podIP"]
    assert _request(lab, namespace, server_ip)["pod"] == "server"
    identity = f"spiffe://cluster.local/ns/{namespace}/sa/default"
    wait_until(
        "the node proxies' access log of the HBONE connection",
        lambda: (
            f"src.identity={identity}" in _proxy_log(lab, "node-1")
            and 'direction="inbound"' in _proxy_log(lab, "node-2")
        ),
        timeout=10,
    )


def test_a_bad_policy_is_refused_by_the_installed_webhook_through_its_service(lab: Lab, namespace: str) -> None:
    policy = {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "bad", "namespace": namespace},
        "spec": {"rules": [{"to": [{"operation": {"ports": ["not-a-port"]}}]}]},
    }
    done = lab.kubectl("apply", "-f", "-", input=json.dumps(policy), check=False)
    assert done.returncode != 0
    assert "denied the request" in done.stderr, done.stderr


def test_a_rollout_restart_replaces_each_node_proxy_onto_a_new_revision_and_traffic_resumes(
    lab: Lab, namespace: str
) -> None:
    before = {p["metadata"]["name"] for p in lab.pods(SYSTEM, "app=ztunnel")}
    revisions = len(
        [r for r in lab.items("controllerrevisions", "-n", SYSTEM) if r["metadata"]["name"].startswith("ztunnel-")]
    )
    lab.kubectl("rollout", "restart", "daemonset/ztunnel", "-n", SYSTEM)
    lab.kubectl("rollout", "status", "daemonset/ztunnel", "-n", SYSTEM, "--timeout=180s", timeout=200)
    after = {p["metadata"]["name"] for p in lab.pods(SYSTEM, "app=ztunnel")}
    assert len(after) == 2 and not after & before
    now = [r for r in lab.items("controllerrevisions", "-n", SYSTEM) if r["metadata"]["name"].startswith("ztunnel-")]
    assert len(now) == revisions + 1
    history = lab.kubectl("rollout", "history", "daemonset/ztunnel", "-n", SYSTEM).stdout
    assert "2" in history.split()
    lab.kubectl("label", "namespace", namespace, "istio.io/dataplane-mode=ambient")
    lab.apply(
        pod_manifest("server", [http_echo_container()], node="node-2"),
        pod_manifest("client", [sleeper()], node="node-1"),
        namespace=namespace,
    )
    lab.wait_pods_ready(namespace, "", 2, timeout=60)
    server_ip = lab.pod("server", namespace)["status"]["podIP"]
    reply = wait_until("a request through the new node proxies", lambda: _try(lab, namespace, server_ip), timeout=30)
    assert reply["pod"] == "server"


def _try(lab: Lab, namespace: str, server_ip: str) -> dict[str, object] | None:
    try:
        return _request(lab, namespace, server_ip)
    except (subprocess.SubprocessError, AssertionError, ValueError):
        return None


def test_a_namespace_excluded_in_the_cni_config_never_gets_its_pods_enrolled(lab: Lab, namespace: str) -> None:
    """TestCNINeverEnrollsPodsInExcludedNamespaces and TestCNIRestartsWithMissingKubeConfig: the excluded list comes
    from the istio-cni-config ConfigMap (EXCLUDE_NAMESPACES, as istio-cni's chart writes it) after a rollout
    restart of the node agents, which also rewrite the plugin's kubeconfig that was deleted meanwhile."""
    config = lab.get("configmap", "istio-cni-config", "-n", SYSTEM)
    assert config["data"]["EXCLUDE_NAMESPACES"] == "kube-system"
    kubeconfigs = [
        lab.topology.host_paths(n).map("/var/run/istio-cni/istio-cni-kubeconfig").machine_path for n in NODES
    ]
    assert all(path.exists() for path in kubeconfigs), kubeconfigs
    patch = {"data": {"EXCLUDE_NAMESPACES": f"kube-system,{namespace}"}}
    try:
        lab.kubectl("patch", "configmap", "istio-cni-config", "-n", SYSTEM, "--type", "merge", "-p", json.dumps(patch))
        for path in kubeconfigs:
            path.unlink(missing_ok=True)
        lab.kubectl("rollout", "restart", "daemonset/istio-cni-node", "-n", SYSTEM)
        lab.kubectl("rollout", "status", "daemonset/istio-cni-node", "-n", SYSTEM, "--timeout=180s", timeout=200)
        assert all(path.exists() for path in kubeconfigs), "the restarted node agent wrote its kubeconfig again"
        lab.kubectl("label", "namespace", namespace, "istio.io/dataplane-mode=ambient")
        lab.apply(pod_manifest("excluded", [sleeper()], node="node-1"), namespace=namespace)
        (pod,) = lab.wait_pods_ready(namespace, "", 1, timeout=60)
        assert "ambient.istio.io/redirection" not in (pod["metadata"].get("annotations") or {})
    finally:
        restore = {"data": {"EXCLUDE_NAMESPACES": "kube-system"}}
        lab.kubectl(
            "patch", "configmap", "istio-cni-config", "-n", SYSTEM, "--type", "merge", "-p", json.dumps(restore)
        )
        lab.kubectl("rollout", "restart", "daemonset/istio-cni-node", "-n", SYSTEM)
        lab.kubectl("rollout", "status", "daemonset/istio-cni-node", "-n", SYSTEM, "--timeout=180s", timeout=200)


def _plugin_installed(lab: Lab, node: str) -> bool:
    """Whether ``node``'s CNI configuration chains ambit-cni and its plugin directory holds the binary."""
    paths = lab.topology.host_paths(node)
    conf = paths.map("/etc/cni/net.d").machine_path
    chained = any("ambit-cni" in f.read_text(errors="replace") for f in conf.glob("*.conflist"))
    return chained and paths.map("/opt/cni/bin/ambit-cni").machine_path.exists()


def _recreatable(obj: dict[str, object]) -> dict[str, object]:
    """An object read from the API as `kubectl create` takes it again (upstream's test re-creates the DaemonSet so)."""
    meta = dict(obj["metadata"])  # type: ignore[call-overload]
    for key in ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "deletionTimestamp"):
        meta.pop(key, None)
    annotations = dict(meta.get("annotations") or {})
    annotations.pop("deprecated.daemonset.template.generation", None)
    meta["annotations"] = annotations
    return {key: value for key, value in obj.items() if key != "status"} | {"metadata": meta}


def test_deleting_the_node_agent_daemonset_takes_its_plugin_away_and_enrolled_pods_keep_the_mesh(
    lab: Lab, namespace: str
) -> None:
    """TestTrafficWithEstablishedPodsIfCNIMissing: with istio-cni-node deleted, the agents remove the plugin as they
    stop (the mesh is going, not an upgrade), pods enrolled before keep talking through the node proxies, a new
    ambient pod starts un-enrolled instead of stalling, and the DaemonSet created again from the object read enrols
    it."""
    lab.kubectl("label", "namespace", namespace, "istio.io/dataplane-mode=ambient")
    lab.apply(
        pod_manifest("server", [http_echo_container()], node="node-2"),
        pod_manifest("client", [sleeper()], node="node-1"),
        namespace=namespace,
    )
    lab.wait_pods_ready(namespace, "", 2, timeout=60)
    server_ip = lab.pod("server", namespace)["status"]["podIP"]
    assert all(_plugin_installed(lab, node) for node in NODES)
    daemonset = lab.get("daemonset", "istio-cni-node", "-n", SYSTEM)
    try:
        lab.kubectl("delete", "daemonset", "istio-cni-node", "-n", SYSTEM, "--wait=true", timeout=120)
        wait_until("the node agents gone", lambda: not lab.pods(SYSTEM, "k8s-app=istio-cni-node"), timeout=90)
        assert not any(_plugin_installed(lab, node) for node in NODES), "a stopped agent left its plugin"
        inbound = _proxy_log(lab, "node-2").count('direction="inbound"')
        assert _request(lab, namespace, server_ip)["pod"] == "server"
        wait_until(
            "the established pods' request through the node proxies",
            lambda: _proxy_log(lab, "node-2").count('direction="inbound"') > inbound,
            timeout=10,
        )
        lab.apply(pod_manifest("late", [sleeper()], node="node-1"), namespace=namespace)
        wait_until("the new pod Ready without the plugin", lambda: _ready(lab.pod("late", namespace)), timeout=60)
        assert "ambient.istio.io/redirection" not in (lab.pod("late", namespace)["metadata"].get("annotations") or {})
    finally:
        if not lab.items("daemonsets", "-n", SYSTEM, "--field-selector=metadata.name=istio-cni-node"):
            lab.kubectl("create", "-f", "-", input=json.dumps(_recreatable(daemonset)))
        lab.kubectl("rollout", "status", "daemonset/istio-cni-node", "-n", SYSTEM, "--timeout=180s", timeout=200)
    assert all(_plugin_installed(lab, node) for node in NODES)
    wait_until(
        "the pod that started without the plugin enrolled by the agents that came back",
        lambda: (
            (lab.pod("late", namespace)["metadata"].get("annotations") or {}).get("ambient.istio.io/redirection")
            == "enabled"
        ),
        timeout=60,
    )


def _stalled_by_the_plugin(lab: Lab, namespace: str) -> bool:
    """Upstream's WaitForStalledPodOrFail: a pod whose container waits in ContainerCreating (or PodInitializing)
    with an Event saying "Failed to create pod sandbox"."""
    for pod in lab.pods(namespace):
        for state in (pod.get("status") or {}).get("containerStatuses") or ():
            waiting = (state.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in ("ContainerCreating", "PodInitializing"):
                name = pod["metadata"]["name"]
                messages = [str(e.get("message") or e.get("note") or "") for e in lab.events(namespace, name)]
                if any("Failed to create pod sandbox" in m for m in messages):
                    return True
    return False


def test_cni_upgrade_agents_parked_then_the_daemonset_recreated_and_traffic_resumes(lab: Lab, namespace: str) -> None:
    """TestTrafficWithCNIUpgrade (u:tests/integration/ambient/cniupgrade/main_test.go:177-241, with
    u:tests/integration/ambient/util.go's helpers), replayed with upstream's own mechanics: the DaemonSet read, its
    pods parked by a strategic-merge ``nodeSelector`` no node matches (the agents stop while their DaemonSet
    exists, so the plugin stays, as istio-cni's ShouldStopCleanup decides); a ``rollout restart`` of the
    application then stalls its new pod in ContainerCreating with a "Failed to create pod sandbox" Event; the
    DaemonSet deleted and created again from the object read (spec, name, labels, annotations only, as
    DeployCNIDaemonset does); every agent Ready, the rollout completes and traffic flows over HBONE again."""
    lab.kubectl("label", "namespace", namespace, "istio.io/dataplane-mode=ambient")
    server = deployment_manifest("server", 1, http_echo_container())
    server["spec"]["template"]["spec"]["nodeName"] = "node-2"
    lab.apply(server, pod_manifest("client", [sleeper()], node="node-1"), namespace=namespace)
    lab.apply(service_manifest("server", {"app": "server"}, 8080, 8080), namespace=namespace)
    lab.wait_pods_ready(namespace, "", 2, timeout=60)
    assert _request(lab, namespace, "server")["pod"].startswith("server-")
    daemonset = lab.get("daemonset", "istio-cni-node", "-n", SYSTEM)
    park = {"spec": {"template": {"spec": {"nodeSelector": {"non-existing": "true"}}}}}
    try:
        lab.kubectl("patch", "daemonset", "istio-cni-node", "-n", SYSTEM, "-p", json.dumps(park))
        wait_until("no node agent pod left", lambda: not lab.pods(SYSTEM, "k8s-app=istio-cni-node"), timeout=80)
        assert all(_plugin_installed(lab, node) for node in NODES), "an agent parked while its DaemonSet exists"
        lab.kubectl("rollout", "restart", "deployment/server", "-n", namespace)
        wait_until("the restarted pod stalled by the plugin", lambda: _stalled_by_the_plugin(lab, namespace), 80)
        lab.kubectl("delete", "daemonset", "istio-cni-node", "-n", SYSTEM, "--wait=true", timeout=120)
        assert all(_plugin_installed(lab, node) for node in NODES), "no agent ran to take the plugin away"
    finally:
        if not lab.items("daemonsets", "-n", SYSTEM, "--field-selector=metadata.name=istio-cni-node"):
            meta = daemonset["metadata"]
            again = {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "labels": meta.get("labels") or {},
                    "annotations": {
                        k: v
                        for k, v in (meta.get("annotations") or {}).items()
                        if k != "deprecated.daemonset.template.generation"
                    },
                },
                "spec": daemonset["spec"],
            }
            lab.kubectl("create", "-f", "-", input=json.dumps(again))
        else:
            unpark = {"spec": {"template": {"spec": {"nodeSelector": None}}}}
            lab.kubectl("patch", "daemonset", "istio-cni-node", "-n", SYSTEM, "-p", json.dumps(unpark))
        wait_until("every node agent Ready", lambda: _agents(lab) == (len(NODES), len(NODES)), timeout=300)
    lab.kubectl("rollout", "status", "deployment/server", "-n", namespace, "--timeout=120s", timeout=140)
    (pod,) = [
        p for p in lab.pods(namespace, "app=server") if is_ready(p) and not p["metadata"].get("deletionTimestamp")
    ]
    assert (pod["metadata"].get("annotations") or {}).get("ambient.istio.io/redirection") == "enabled"
    answer = wait_until("the client reaches the restarted server", lambda: _try(lab, namespace, "server"), 30)
    assert answer["pod"] == pod["metadata"]["name"], answer


def _agents(lab: Lab) -> tuple[int, int]:
    status = lab.get("daemonset", "istio-cni-node", "-n", SYSTEM).get("status") or {}
    return int(status.get("numberReady") or 0), int(status.get("desiredNumberScheduled") or 0)


def _cni_net_dir_patch(path: str) -> str:
    """Upstream's strategic-merge patch of the agents' ``cni-net-dir`` hostPath volume (merged by name)."""
    volume = {"name": "cni-net-dir", "hostPath": {"path": path, "type": ""}}
    return json.dumps({"spec": {"template": {"spec": {"volumes": [volume]}}}})


def test_a_node_agent_misconfigured_then_fixed_heals_on_restart(lab: Lab, namespace: str) -> None:
    """TestCNIMisconfigHealsOnRestart (u:tests/integration/ambient/cni/main_test.go:327-413), replayed as upstream
    drives it: the DaemonSet's ``cni-net-dir`` volume patched to ``/etc/cni/nope.d`` (strategic merge, as
    ``kubectl patch`` does by default), then ``kubectl delete pods -l k8s-app=istio-cni-node`` once a second until
    no agent is Ready (an agent whose CNI directory holds no primary network config never becomes Ready); the path
    patched back, the pods deleted once, and every agent Ready again within upstream's 80 s. Beyond upstream: a pod
    started after the heal is enrolled, so Ready means working."""
    wait_until("every node agent Ready first", lambda: _agents(lab)[0] == _agents(lab)[1] == len(NODES), timeout=80)
    restart = ("delete", "pods", "-l", "k8s-app=istio-cni-node", "-n", SYSTEM, "--wait=false")
    try:
        lab.kubectl("patch", "daemonset", "istio-cni-node", "-n", SYSTEM, "-p", _cni_net_dir_patch("/etc/cni/nope.d"))
        (volume,) = [
            v
            for v in lab.get("daemonset", "istio-cni-node", "-n", SYSTEM)["spec"]["template"]["spec"]["volumes"]
            if v["name"] == "cni-net-dir"
        ]
        assert volume["hostPath"]["path"] == "/etc/cni/nope.d", volume

        def broken() -> bool:
            lab.kubectl(*restart)
            time.sleep(1)
            return _agents(lab)[0] == 0

        wait_until("no node agent Ready with the bad path", broken, timeout=80, interval=1)
    finally:
        lab.kubectl("patch", "daemonset", "istio-cni-node", "-n", SYSTEM, "-p", _cni_net_dir_patch("/etc/cni/net.d"))
        time.sleep(1)
        lab.kubectl(*restart)
        wait_until(
            "every node agent Ready again after one restart",
            lambda: _agents(lab) == (len(NODES), len(NODES)),
            timeout=80,
            interval=1,
        )
    assert all(_plugin_installed(lab, node) for node in NODES)
    lab.kubectl("label", "namespace", namespace, "istio.io/dataplane-mode=ambient")
    lab.apply(pod_manifest("healed", [sleeper()], node="node-2"), namespace=namespace)
    (pod,) = lab.wait_pods_ready(namespace, "", 1, timeout=60)
    assert (pod["metadata"].get("annotations") or {}).get("ambient.istio.io/redirection") == "enabled"


def _ready(pod: dict[str, object]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []  # type: ignore[attr-defined]
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def test_no_mesh_daemon_runs_as_a_host_process(lab: Lab) -> None:
    procs = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert f"--lab-dir {lab.directory}" not in procs
    assert not (Path(lab.directory) / "logs" / "supervisor.log").exists()


def _node_proxy_args(lab: Lab) -> list[str]:
    (container,) = [
        c
        for c in lab.get("daemonset", "ztunnel", "-n", SYSTEM)["spec"]["template"]["spec"]["containers"]
        if "nodeproxy" in (c.get("args") or [])
    ]
    return list(container["args"])


def _set_node_proxy_args(lab: Lab, args: list[str]) -> None:
    containers = lab.get("daemonset", "ztunnel", "-n", SYSTEM)["spec"]["template"]["spec"]["containers"]
    index = next(i for i, c in enumerate(containers) if "nodeproxy" in (c.get("args") or []))
    patch = [{"op": "replace", "path": f"/spec/template/spec/containers/{index}/args", "value": args}]
    lab.kubectl("patch", "daemonset", "ztunnel", "-n", SYSTEM, "--type=json", "-p", json.dumps(patch))
    lab.kubectl("rollout", "status", "daemonset/ztunnel", "-n", SYSTEM, "--timeout=180s", timeout=200)


def test_on_demand_node_proxies_learn_only_what_their_pods_talk_to_and_traffic_flows(lab: Lab, namespace: str) -> None:
    """``--xds-on-demand`` (ztunnel's ``XDS_ON_DEMAND``, with the DNS proxy off as ztunnel requires) set on the
    DaemonSet by a JSON patch: after the rollout each node proxy holds its own pods and what they called, not the
    mesh; a call to a pod IP and one to a Service VIP across nodes go over HBONE; a pod nobody called stays unknown
    on the other node. The patch is undone at the end (another rollout)."""
    original = _node_proxy_args(lab)
    lab.kubectl("label", "namespace", namespace, "istio.io/dataplane-mode=ambient")
    lab.apply(
        pod_manifest("server", [http_echo_container()], node="node-2", labels={"app": "server"}),
        pod_manifest("bystander", [http_echo_container()], node="node-2", labels={"app": "bystander"}),
        pod_manifest("client", [sleeper()], node="node-1"),
        service_manifest("server", {"app": "server"}, 8080, 8080),
        namespace=namespace,
    )
    lab.wait_pods_ready(namespace, "", 3, timeout=60)
    try:
        _set_node_proxy_args(lab, [*original, "--xds-on-demand", "--no-dns-proxy"])
        server_ip = lab.pod("server", namespace)["status"]["podIP"]
        bystander_ip = lab.pod("bystander", namespace)["status"]["podIP"]
        vip = lab.get("service", "server", "-n", namespace)["spec"]["clusterIP"]
        reply = wait_until("a call to the pod IP on demand", lambda: _try(lab, namespace, server_ip), timeout=60)
        assert reply["pod"] == "server"
        by_vip = wait_until("a call to the Service VIP on demand", lambda: _try(lab, namespace, vip), timeout=30)
        assert by_vip["pod"] == "server"

        def known(node: str) -> set[str]:
            dump = json.loads(lab.node_proxy_admin(node, "/config_dump"))
            return {ip for w in dump["workloads"] for ip in w.get("workloadIps", [])}

        on_node_1 = known("node-1")
        assert server_ip in on_node_1, on_node_1  # asked for when the client called it
        assert bystander_ip not in on_node_1, on_node_1  # never called from node 1: never sent there
        assert bystander_ip in known("node-2")  # its own node proxy asked for it (its local pod)
        identity = f"spiffe://cluster.local/ns/{namespace}/sa/default"
        wait_until(
            "node 2's access log of the on-demand HBONE connection",
            lambda: f"src.identity={identity}" in _proxy_log(lab, "node-2"),
            timeout=10,
        )
    finally:
        _set_node_proxy_args(lab, original)
