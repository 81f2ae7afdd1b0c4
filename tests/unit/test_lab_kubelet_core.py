"""The node runtime's pure pieces: environment, pod status, status patches, the Node object, the state file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ambit.cni.errors import InvalidConfigError, TryAgainLaterError
from ambit.lab.network.plugins import CniInvocationError
from ambit.lab.network.topology import Topology
from ambit.lab.runtime.containers import ContainerState, Exited, Phase, Started
from ambit.lab.runtime.containers_apply import ContainerConfigError
from ambit.lab.runtime.kubelet import NodeRuntimeSettings
from ambit.lab.runtime.node_status import HostInfo, node_manifest, node_status
from ambit.lab.runtime.pod_env import config_refs, container_env, expand
from ambit.lab.runtime.pod_record import PodRecord, SavedSandbox
from ambit.lab.runtime.pod_status import PodView, pod_status, sandbox_error_message, status_patch

T0 = 1_700_000_000.0
POD: dict[str, Any] = {
    "metadata": {"name": "web", "namespace": "shop", "uid": "u-1", "labels": {"app": "web"}},
    "spec": {"nodeName": "node-1", "serviceAccountName": "web-sa", "containers": [{"name": "app"}]},
}
HOST = HostInfo("mid", "bid", "6.1.0", "Debian GNU/Linux 13", "amd64", 2, 4096)


# -- environment ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("$(A)-$(B)", "1-$(B)"),
        ("$$(A)", "$(A)"),
        ("cost: $5", "cost: $5"),
        ("$(A", "$(A"),
        ("end$", "end$"),
        ("$(A)$(A)", "11"),
    ],
)
def test_expansion_replaces_defined_names_only(text: str, expanded: str) -> None:
    assert expand(text, {"A": "1"}) == expanded


def test_env_resolves_values_field_refs_and_config_references_in_order() -> None:
    container = {
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "GREETING", "value": "hello $(POD_NAME)"},
            {"name": "ME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
            {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "COLOR", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "color"}}},
            {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "pw"}}},
            {"name": "MAYBE", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "x", "optional": True}}},
        ],
    }
    assert config_refs(container) == {("configmap", "cm"), ("secret", "sec"), ("secret", "gone")}
    configs = {("configmap", "cm"): {"color": "blue"}, ("secret", "sec"): {"pw": "s3cret"}, ("secret", "gone"): None}
    env = container_env(POD, container, {"POD_NAME": "web"}, configs, ("198.18.1.5",), "198.18.0.11")
    assert env == {
        "POD_NAME": "web",
        "CM_color": "blue",
        "GREETING": "hello web",
        "ME": "web",
        "NS": "shop",
        "IP": "198.18.1.5",
        "NODE": "node-1",
        "SA": "web-sa",
        "HOST": "198.18.0.11",
        "APP": "web",
        "COLOR": "blue",
        "PASSWORD": "s3cret",
    }
    assert list(env)[:2] == ["POD_NAME", "CM_color"]


@pytest.mark.parametrize(
    ("entry", "configs", "message", "retry"),
    [
        (
            {"configMapKeyRef": {"name": "cm", "key": "k"}},
            {("configmap", "cm"): None},
            'configmap "cm" not found',
            True,
        ),
        (
            {"configMapKeyRef": {"name": "cm", "key": "k"}},
            {("configmap", "cm"): {}},
            "couldn't find key k in ConfigMap shop/cm",
            True,
        ),
        ({"secretKeyRef": {"name": "s", "key": "k"}}, {("secret", "s"): None}, 'secret "s" not found', True),
        ({"fieldRef": {"fieldPath": "spec.hostname"}}, {}, "unsupported fieldRef 'spec.hostname'", False),
        ({"resourceFieldRef": {"resource": "limits.cpu"}}, {}, "unsupported valueFrom", False),
    ],
)
def test_unresolvable_env_is_a_config_error(
    entry: dict[str, Any], configs: dict[Any, Any], message: str, retry: bool
) -> None:
    container = {"env": [{"name": "X", "valueFrom": entry}]}
    with pytest.raises(ContainerConfigError, match=message.replace("(", r"\(")) as caught:
        container_env(POD, container, {}, configs, (), "")
    assert caught.value.retry is retry


# -- pod status -------------------------------------------------------------------------------------------------
def view(*states: ContainerState, **fields: Any) -> PodView:
    base: dict[str, Any] = {
        "restart_policy": "Always",
        "containers": [(s, "img") for s in states],
        "pod_ref": "web_shop(u-1)",
        "host_ip": "198.18.0.11",
        "pod_ips": ("198.18.1.5",),
        "sandbox_ready": True,
        "sandbox_error": "",
        "start_time": "2023-11-14T22:13:20Z",
    }
    base.update(fields)
    return PodView(**base)


def running(ready: bool) -> ContainerState:
    s = ContainerState("app", "Always")
    s.apply(Started(10, T0))
    s.ready = ready
    return s


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_a_dual_stack_node_reports_both_host_addresses_primary_first() -> None:
    status = pod_status(view(running(True), host_ip6="fd00:ab::11", pod_ips=("198.18.1.5", "fd00:ab:1::5")), {}, T0)
    assert status["hostIP"] == "198.18.0.11"
    assert status["hostIPs"] == [{"ip": "198.18.0.11"}, {"ip": "fd00:ab::11"}]
    assert status["podIPs"] == [{"ip": "198.18.1.5"}, {"ip": "fd00:ab:1::5"}]


def test_a_running_ready_pod_reports_every_condition_true() -> None:
    status = pod_status(view(running(True)), {}, T0)
    assert status["phase"] == "Running"
    assert status["podIP"] == "198.18.1.5"
    assert status["podIPs"] == [{"ip": "198.18.1.5"}]
    assert status["hostIP"] == "198.18.0.11"
    assert status["hostIPs"] == [{"ip": "198.18.0.11"}]
    assert status["startTime"] == "2023-11-14T22:13:20Z"
    conds = conditions(status)
    assert [c["type"] for c in status["conditions"]] == [
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
        "PodScheduled",
    ]
    assert all(c["status"] == "True" for c in conds.values())
    assert conds["Ready"]["lastTransitionTime"] == "2023-11-14T22:13:20Z"
    assert status["containerStatuses"][0]["ready"] is True


def test_transition_times_move_only_when_a_condition_flips() -> None:
    first = pod_status(view(running(False)), {}, T0)
    same = pod_status(view(running(False)), first, T0 + 60)
    assert same == first
    flipped = conditions(pod_status(view(running(True)), first, T0 + 60))
    assert flipped["Ready"]["lastTransitionTime"] == "2023-11-14T22:14:20Z"
    assert flipped["Initialized"]["lastTransitionTime"] == "2023-11-14T22:13:20Z"


def test_an_unready_container_is_named_in_the_ready_condition() -> None:
    conds = conditions(pod_status(view(running(False)), {}, T0))
    assert conds["Ready"]["status"] == "False"
    assert conds["Ready"]["reason"] == "ContainersNotReady"
    assert conds["Ready"]["message"] == "containers with unready status: [app]"


def test_a_sandbox_failure_keeps_the_pod_pending_with_the_plugin_error() -> None:
    error = 'plugin type="bridge" failed (add): no IP addresses available'
    status = pod_status(
        view(ContainerState("app", "Always"), pod_ips=(), sandbox_ready=False, sandbox_error=error), {}, T0
    )
    assert status["phase"] == "Pending"
    assert "podIP" not in status
    conds = conditions(status)
    assert conds["PodReadyToStartContainers"] == {
        "type": "PodReadyToStartContainers",
        "status": "False",
        "lastTransitionTime": "2023-11-14T22:13:20Z",
        "reason": "FailedCreatePodSandBox",
        "message": error,
    }
    assert error in conds["ContainersReady"]["message"]
    assert status["containerStatuses"][0]["state"] == {"waiting": {"reason": "ContainerCreating"}}


def test_the_scheduler_s_condition_is_kept() -> None:
    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2020-01-01T00:00:00Z"}
    status = pod_status(view(running(True)), {"conditions": [scheduled]}, T0)
    assert conditions(status)["PodScheduled"] == scheduled


def test_a_deleted_pod_ends_failed_unless_everything_exited_zero() -> None:
    s = running(True)
    s.stopping = True
    s.apply(Exited(143, T0 + 1))
    status = pod_status(view(s, deleted=True), {}, T0)
    assert status["phase"] == "Failed"
    assert conditions(status)["Ready"]["reason"] == "PodCompleted"
    clean = running(True)
    clean.stopping = True
    clean.apply(Exited(0, T0 + 1))
    assert clean.phase is Phase.EXITED
    assert pod_status(view(clean, deleted=True), {}, T0)["phase"] == "Succeeded"


def test_a_pod_initializing_names_its_incomplete_init_containers_until_they_all_completed() -> None:
    first, second = ContainerState("first", "OnFailure"), ContainerState("second", "OnFailure")
    first.apply(Started(11, T0))
    first.apply(Exited(0, T0 + 1))
    second.apply(Started(12, T0 + 1))
    app = ContainerState("app", "Always")
    status = pod_status(view(app, init_containers=[(first, "busybox"), (second, "busybox")]), {}, T0 + 2)
    assert status["phase"] == "Pending"
    assert conditions(status)["Initialized"] == {
        "type": "Initialized",
        "status": "False",
        "lastTransitionTime": "2023-11-14T22:13:22Z",
        "reason": "ContainersNotInitialized",
        "message": "containers with incomplete status: [second]",
    }
    assert [s["name"] for s in status["initContainerStatuses"]] == ["first", "second"]
    assert status["initContainerStatuses"][0]["ready"] is True
    assert "running" in status["initContainerStatuses"][1]["state"]
    assert status["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    second.apply(Exited(0, T0 + 3))
    app.apply(Started(13, T0 + 3))
    later = pod_status(view(app, init_containers=[(first, "busybox"), (second, "busybox")]), status, T0 + 4)
    assert later["phase"] == "Running"
    assert conditions(later)["Initialized"] == {
        "type": "Initialized",
        "status": "True",
        "lastTransitionTime": "2023-11-14T22:13:24Z",
    }
    assert "initContainerStatuses" not in pod_status(view(running(True)), {}, T0)  # none: no key, as the kubelet


def test_an_initialized_pod_stays_initialized_while_its_sidecar_restarts_and_waits_for_its_readiness() -> None:
    sidecar = ContainerState("proxy", "Always")
    sidecar.apply(Started(11, T0))
    sidecar.apply(Exited(1, T0 + 1))
    app = running(True)
    status = pod_status(view(app, init_containers=[(sidecar, "proxy")], initialized=True), {}, T0 + 2)
    assert conditions(status)["Initialized"]["status"] == "True"
    assert status["phase"] == "Running"
    assert conditions(status)["Ready"]["message"] == "containers with unready status: [proxy]"
    assert status["initContainerStatuses"][0]["state"]["waiting"]["reason"] == "CrashLoopBackOff"


def test_status_patches_carry_only_changes_and_remove_dropped_keys() -> None:
    first = pod_status(view(running(True)), {}, T0)
    assert status_patch(first, first) is None
    assert status_patch({}, first) == {"status": first}
    later = dict(first, phase="Failed")
    del later["podIP"]
    patch = status_patch(first, later)
    assert patch == {"status": {"phase": "Failed", "podIP": None}}


def test_sandbox_errors_read_like_the_kubelet_s() -> None:
    err = CniInvocationError(
        TryAgainLaterError("failed to allocate", "range is full"), plugin="host-local", command="ADD"
    )
    assert sandbox_error_message(err) == 'plugin type="host-local" failed (add): failed to allocate: range is full'
    assert sandbox_error_message(CniInvocationError(InvalidConfigError("bad config"))) == "bad config"
    assert sandbox_error_message(RuntimeError("boom")) == "boom"


# -- node -------------------------------------------------------------------------------------------------------
def test_the_node_object_has_its_labels_cidr_address_and_a_ready_heartbeat(tmp_path: Path) -> None:
    settings = NodeRuntimeSettings("node-1", "198.18.0.11", "198.18.1.0/24", tmp_path, labels={"zone": "a"})
    node = node_manifest(settings)
    assert node["metadata"] == {
        "name": "node-1",
        "labels": {"zone": "a", "kubernetes.io/hostname": "node-1", "kubernetes.io/os": "linux"},
    }
    assert node["spec"] == {"podCIDR": "198.18.1.0/24", "podCIDRs": ["198.18.1.0/24"]}
    status = node_status(settings, HOST, T0 - 100, T0)
    assert {"type": "InternalIP", "address": "198.18.0.11"} in status["addresses"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    assert ready["lastHeartbeatTime"] == "2023-11-14T22:13:20Z"
    assert ready["lastTransitionTime"] == "2023-11-14T22:11:40Z"
    assert status["nodeInfo"]["operatingSystem"] == "linux"
    assert status["nodeInfo"]["architecture"] == "amd64"
    assert status["capacity"] == {"cpu": "2", "memory": "4096Ki", "pods": "110"}


def test_settings_for_a_lab_node_come_from_the_topology(tmp_path: Path) -> None:
    topo = Topology("1f2e", 2, str(tmp_path))
    s = NodeRuntimeSettings.for_lab(topo, "node-2", heartbeat_interval=1.0)
    assert (s.node_name, s.node_ip, s.pod_cidr) == ("node-2", "198.18.0.12", "198.18.2.0/24")
    assert s.pods_dir == tmp_path / "pods"
    assert (s.api_host, s.api_port, s.heartbeat_interval) == ("198.18.0.1", 6443, 1.0)
    with pytest.raises(ValueError, match="no node"):
        NodeRuntimeSettings.for_lab(topo, "node-3")


# -- state file -------------------------------------------------------------------------------------------------
def test_the_state_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "u-1" / "runtime.json"
    record = PodRecord("node-1", "u-1", SavedSandbox("ns", "/run/netns/ns", ("198.18.1.5",)), {"app": (42, 1234)})
    record.save(path)
    assert PodRecord.load(path) == record
    path.write_text("{not json")
    assert PodRecord.load(path) is None
    assert PodRecord.load(tmp_path / "missing.json") is None


def test_the_state_file_keeps_whether_the_pod_is_initialized(tmp_path: Path) -> None:
    path = tmp_path / "u-1" / "runtime.json"
    record = PodRecord("node-1", "u-1", None, {"app": (42, 1234)}, initialized=True)
    record.save(path)
    assert PodRecord.load(path) == record
    path.write_text('{"node": "node-1", "uid": "u-1", "sandbox": null, "processes": {}}')  # an older file
    loaded = PodRecord.load(path)
    assert loaded is not None and loaded.initialized is False
