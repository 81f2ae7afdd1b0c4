from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from json_strategies import json_objects, json_values

from ambit.apiserver.cells import format_label_selector, human_duration, parse_timestamp, since
from ambit.apiserver.errors import ApiError
from ambit.apiserver.printers import DEFAULT, PRINTERS
from ambit.apiserver.tables import to_table

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC).timestamp()


def ago(seconds: float) -> str:
    return datetime.fromtimestamp(NOW - seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def meta(name: str, created_ago: float = 300, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": "demo", "creationTimestamp": ago(created_ago), **extra}


def table(kind: str, group: str, *objects: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return to_table(kind, group, list(objects), now=NOW, list_metadata={"resourceVersion": "7"}, **kwargs)


def cells(kind: str, group: str, obj: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """The row of ``obj`` as a column-name -> cell map (kubectl's header, upper-cased, is this name)."""
    result = table(kind, group, obj, **kwargs)
    names = [c["name"] for c in result["columnDefinitions"]]
    return dict(zip(names, result["rows"][0]["cells"], strict=True))


# ---- ages ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (-5, "<invalid>"),
        (-1.5, "0s"),
        (0, "0s"),
        (5, "5s"),
        (119.9, "119s"),
        (120, "2m"),
        (200, "3m20s"),
        (599, "9m59s"),
        (600, "10m"),
        (3 * 3600 - 1, "179m"),
        (3 * 3600, "3h"),
        (4 * 3600, "4h"),
        (5 * 3600 + 7 * 60, "5h7m"),
        (8 * 3600 + 59 * 60, "8h"),
        (47 * 3600, "47h"),
        (2 * 86400, "2d"),
        (2 * 86400 + 3 * 3600, "2d3h"),
        (8 * 86400 + 5 * 3600, "8d"),
        (45 * 86400, "45d"),
        (729 * 86400, "729d"),
        (730 * 86400, "2y"),
        ((3 * 365 + 5) * 86400, "3y5d"),
        (9 * 365 * 86400 + 86400, "9y"),
    ],
)
def test_human_duration_matches_kubectl(seconds: float, shown: str) -> None:
    assert human_duration(seconds) == shown


def test_timestamps_with_fractions_and_offsets_parse() -> None:
    assert parse_timestamp("2024-05-01T12:00:00Z") == NOW
    assert parse_timestamp("2024-05-01T12:00:00.123456Z") == pytest.approx(NOW + 0.123456)
    assert parse_timestamp("2024-05-01T12:00:00.123456789Z") == pytest.approx(NOW + 0.123456)
    assert parse_timestamp("2024-05-01T14:00:00+02:00") == NOW
    assert parse_timestamp("yesterday") is None
    assert parse_timestamp(None) is None


def test_a_missing_timestamp_ages_as_unknown() -> None:
    assert since(None, NOW) == "<unknown>"
    assert since("2024-05-01T11:59:00Z", NOW) == "60s"


# ---- the Table envelope ----------------------------------------------------------------------------------


def test_table_carries_list_metadata_and_full_column_definitions() -> None:
    result = table("ConfigMap", "", {"metadata": meta("cm"), "data": {"a": "1"}})
    assert result["kind"] == "Table"
    assert result["apiVersion"] == "meta.k8s.io/v1"
    assert result["metadata"] == {"resourceVersion": "7"}
    first = result["columnDefinitions"][0]
    assert set(first) == {"name", "type", "format", "description", "priority"}
    assert first["name"] == "Name"
    assert first["format"] == "name"


def test_rows_include_partial_object_metadata_by_default() -> None:
    obj = {"metadata": meta("cm", labels={"a": "b"}), "data": {}}
    row = table("ConfigMap", "", obj)["rows"][0]
    assert row["object"] == {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj["metadata"],
    }


def test_include_object_object_and_none() -> None:
    obj = {"metadata": meta("cm"), "data": {}}
    assert table("ConfigMap", "", obj, include_object="Object")["rows"][0]["object"] == obj
    assert "object" not in table("ConfigMap", "", obj, include_object="None")["rows"][0]


def test_unknown_include_object_is_a_bad_request() -> None:
    with pytest.raises(ApiError) as caught:
        table("ConfigMap", "", {"metadata": meta("cm")}, include_object="Everything")
    assert caught.value.code == 400


def test_an_empty_list_has_columns_and_no_rows() -> None:
    result = table("Pod", "")
    assert result["rows"] == []
    assert [c["name"] for c in result["columnDefinitions"]][:5] == ["Name", "Ready", "Status", "Restarts", "Age"]


# ---- pods ------------------------------------------------------------------------------------------------


def pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": meta("web-1"),
        "spec": {"containers": [{"name": "app"}, {"name": "proxy"}], "nodeName": "node-a"},
        "status": {"phase": "Running", "podIP": "10.1.0.5", **status},
    }


def running(name: str, ready: bool = True, restarts: int = 0) -> dict[str, Any]:
    return {"name": name, "ready": ready, "restartCount": restarts, "state": {"running": {}}}


def test_running_pod_row() -> None:
    row = cells("Pod", "", pod(containerStatuses=[running("app"), running("proxy")]))
    assert row == {
        "Name": "web-1",
        "Ready": "2/2",
        "Status": "Running",
        "Restarts": "0",
        "Age": "5m",
        "IP": "10.1.0.5",
        "Node": "node-a",
        "Nominated Node": "<none>",
        "Readiness Gates": "<none>",
    }


def test_wide_pod_columns_have_priority_one() -> None:
    columns = table("Pod", "")["columnDefinitions"]
    wide = [c["name"] for c in columns if c["priority"] == 1]
    assert wide == ["IP", "Node", "Nominated Node", "Readiness Gates"]


def test_crash_looping_container_shows_through_running_phase_with_last_restart_age() -> None:
    crashed = {
        "name": "proxy",
        "ready": False,
        "restartCount": 4,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "finishedAt": ago(200)}},
    }
    row = cells("Pod", "", pod(containerStatuses=[running("app"), crashed]))
    assert (row["Ready"], row["Status"], row["Restarts"]) == ("1/2", "CrashLoopBackOff", "4 (3m20s ago)")


def test_terminated_container_without_reason_shows_exit_code_or_signal() -> None:
    exited = {"name": "app", "state": {"terminated": {"exitCode": 3}}}
    assert cells("Pod", "", pod(containerStatuses=[exited]))["Status"] == "ExitCode:3"
    killed = {"name": "app", "state": {"terminated": {"exitCode": 137, "signal": 9}}}
    assert cells("Pod", "", pod(containerStatuses=[killed]))["Status"] == "Signal:9"


def test_init_containers_name_the_status_until_they_finish() -> None:
    obj = pod(
        phase="Pending",
        initContainerStatuses=[
            {"name": "setup", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
            {"name": "migrate", "state": {"running": {}}},
        ],
    )
    obj["spec"]["initContainers"] = [{"name": "setup"}, {"name": "migrate"}]
    assert cells("Pod", "", obj)["Status"] == "Init:1/2"
    obj["status"]["initContainerStatuses"][1]["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    assert cells("Pod", "", obj)["Status"] == "Init:CrashLoopBackOff"
    obj["status"]["initContainerStatuses"][1]["state"] = {"terminated": {"exitCode": 2}}
    assert cells("Pod", "", obj)["Status"] == "Init:ExitCode:2"


def test_started_sidecar_counts_as_a_ready_container() -> None:
    obj = pod(
        initContainerStatuses=[{"name": "mesh", "started": True, "ready": True, "state": {"running": {}}}],
        containerStatuses=[running("app"), running("proxy")],
    )
    obj["spec"]["initContainers"] = [{"name": "mesh", "restartPolicy": "Always"}]
    assert cells("Pod", "", obj)["Ready"] == "3/3"


def test_completed_container_beside_a_running_one_is_running_or_not_ready() -> None:
    done = {"name": "app", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
    ready = {"type": "Ready", "status": "True"}
    obj = pod(containerStatuses=[done, running("proxy")], conditions=[ready])
    assert cells("Pod", "", obj)["Status"] == "Running"
    obj["status"]["conditions"] = []
    assert cells("Pod", "", obj)["Status"] == "NotReady"


def test_pod_being_deleted_is_terminating() -> None:
    obj = pod(containerStatuses=[running("app")])
    obj["metadata"]["deletionTimestamp"] = ago(1)
    assert cells("Pod", "", obj)["Status"] == "Terminating"
    obj["status"]["phase"] = "Succeeded"
    assert cells("Pod", "", obj)["Status"] == "Succeeded"


def test_pending_pod_without_statuses() -> None:
    obj = {"metadata": meta("p"), "spec": {"containers": [{"name": "a"}]}, "status": {"phase": "Pending"}}
    row = cells("Pod", "", obj)
    assert (row["Ready"], row["Status"], row["IP"], row["Node"]) == ("0/1", "Pending", "<none>", "<none>")


def test_readiness_gates_count_true_conditions() -> None:
    obj = pod(conditions=[{"type": "example.com/lb", "status": "True"}])
    obj["spec"]["readinessGates"] = [{"conditionType": "example.com/lb"}, {"conditionType": "example.com/dns"}]
    assert cells("Pod", "", obj)["Readiness Gates"] == "1/2"


def test_finished_pods_carry_a_completed_row_condition() -> None:
    obj = pod(phase="Succeeded")
    row = table("Pod", "", obj)["rows"][0]
    assert row["conditions"][0]["type"] == "Completed"
    assert row["conditions"][0]["reason"] == "Succeeded"
    assert "conditions" not in table("Pod", "", pod())["rows"][0]


# ---- services --------------------------------------------------------------------------------------------


def service(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": meta("web"), "spec": spec, "status": status or {}}


def test_cluster_ip_service_row() -> None:
    spec = {
        "type": "ClusterIP",
        "clusterIP": "10.96.0.10",
        "ports": [{"port": 80, "protocol": "TCP"}, {"port": 443}],
        "selector": {"tier": "web", "app": "shop"},
    }
    row = cells("Service", "", service(spec))
    assert row == {
        "Name": "web",
        "Type": "ClusterIP",
        "Cluster-IP": "10.96.0.10",
        "External-IP": "<none>",
        "Port(s)": "80/TCP,443/TCP",
        "Age": "5m",
        "Selector": "app=shop,tier=web",
    }


def test_node_port_and_load_balancer_services() -> None:
    spec = {"type": "NodePort", "clusterIP": "10.96.0.11", "ports": [{"port": 80, "nodePort": 30080}]}
    assert cells("Service", "", service(spec))["Port(s)"] == "80:30080/TCP"
    spec = {"type": "LoadBalancer", "clusterIP": "10.96.0.12", "ports": [{"port": 53, "protocol": "UDP"}]}
    assert cells("Service", "", service(spec))["External-IP"] == "<pending>"
    status = {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}, {"hostname": "lb.example.com"}]}}
    assert cells("Service", "", service(spec, status))["External-IP"] == "203.0.113.7,lb.example.com"


def test_external_name_and_headless_services() -> None:
    row = cells("Service", "", service({"type": "ExternalName", "externalName": "db.example.com"}))
    assert (row["Cluster-IP"], row["External-IP"], row["Port(s)"], row["Selector"]) == (
        "<none>",
        "db.example.com",
        "<none>",
        "<none>",
    )
    assert cells("Service", "", service({"clusterIP": "None", "ports": [{"port": 80}]}))["Cluster-IP"] == "None"


# ---- other core kinds ------------------------------------------------------------------------------------


def test_namespace_configmap_secret_serviceaccount_rows() -> None:
    assert table("Namespace", "", {"metadata": meta("demo"), "status": {"phase": "Active"}})["rows"][0]["cells"] == [
        "demo",
        "Active",
        "5m",
    ]
    cm = {"metadata": meta("cm"), "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}}
    assert cells("ConfigMap", "", cm)["Data"] == 3
    secret = {"metadata": meta("tls"), "type": "kubernetes.io/tls", "data": {"tls.crt": "", "tls.key": ""}}
    assert cells("Secret", "", secret) == {"Name": "tls", "Type": "kubernetes.io/tls", "Data": 2, "Age": "5m"}
    assert cells("Secret", "", {"metadata": meta("s")})["Type"] == "Opaque"
    sa = {"metadata": meta("default"), "secrets": [{"name": "x"}]}
    assert cells("ServiceAccount", "", sa) == {"Name": "default", "Secrets": 1, "Age": "5m"}


def test_node_rows() -> None:
    node = {
        "metadata": meta(
            "node-a",
            labels={"node-role.kubernetes.io/control-plane": "", "node-role.kubernetes.io/worker": ""},
        ),
        "spec": {"unschedulable": True},
        "status": {
            "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}],
            "addresses": [{"type": "Hostname", "address": "a"}, {"type": "InternalIP", "address": "10.0.0.2"}],
            "nodeInfo": {"kubeletVersion": "v1.32.0", "osImage": "Debian GNU/Linux 12"},
        },
    }
    row = cells("Node", "", node)
    assert row["Status"] == "Ready,SchedulingDisabled"
    assert row["Roles"] == "control-plane,worker"
    assert row["Version"] == "v1.32.0"
    assert row["Internal-IP"] == "10.0.0.2"
    assert row["External-IP"] == "<none>"
    assert row["Kernel-Version"] == "<unknown>"
    node["status"]["conditions"][1]["status"] = "Unknown"
    assert cells("Node", "", node)["Status"] == "NotReady,SchedulingDisabled"
    assert cells("Node", "", {"metadata": meta("bare")})["Status"] == "Unknown"


def test_core_event_row() -> None:
    event = {
        "metadata": meta("web-1.17a"),
        "type": "Warning",
        "reason": "BackOff",
        "message": "Back-off restarting failed container\n",
        "involvedObject": {"kind": "Pod", "name": "web-1", "fieldPath": "spec.containers{app}"},
        "source": {"component": "kubelet", "host": "node-a"},
        "firstTimestamp": ago(600),
        "lastTimestamp": ago(30),
        "count": 7,
    }
    row = cells("Event", "", event)
    assert [row[c] for c in ("Last Seen", "Type", "Reason", "Object", "Message")] == [
        "30s",
        "Warning",
        "BackOff",
        "pod/web-1",
        "Back-off restarting failed container",
    ]
    assert (row["Subobject"], row["Source"], row["First Seen"], row["Count"]) == (
        "spec.containers{app}",
        "kubelet, node-a",
        "10m",
        7,
    )
    default_columns = [c["name"] for c in table("Event", "")["columnDefinitions"] if c["priority"] == 0]
    assert default_columns == ["Last Seen", "Type", "Reason", "Object", "Message"]


def test_events_k8s_io_event_row_reads_regarding_and_note() -> None:
    event = {
        "metadata": meta("web-1.17b"),
        "type": "Normal",
        "reason": "Scheduled",
        "note": "Successfully assigned demo/web-1 to node-a",
        "regarding": {"kind": "Pod", "name": "web-1"},
        "reportingController": "default-scheduler",
        "eventTime": "2024-05-01T11:59:20.000000Z",
    }
    row = cells("Event", "events.k8s.io", event)
    assert [row[c] for c in ("Last Seen", "Object", "Message", "Source", "Count")] == [
        "40s",
        "pod/web-1",
        "Successfully assigned demo/web-1 to node-a",
        "default-scheduler",
        1,
    ]
    event["series"] = {"count": 3, "lastObservedTime": "2024-05-01T11:59:55.000000Z"}
    row = cells("Event", "events.k8s.io", event)
    assert (row["Last Seen"], row["Count"]) == ("5s", 3)


def test_endpoints_list_pairs_and_abbreviate_after_three() -> None:
    ep = {
        "metadata": meta("web"),
        "subsets": [
            {"addresses": [{"ip": "10.1.0.1"}, {"ip": "10.1.0.2"}], "ports": [{"port": 80}, {"port": 443}]},
        ],
    }
    assert cells("Endpoints", "", ep)["Endpoints"] == "10.1.0.1:80,10.1.0.1:443,10.1.0.2:80 + 1 more..."
    assert cells("Endpoints", "", {"metadata": meta("none")})["Endpoints"] == "<none>"


def test_endpoint_slice_row() -> None:
    eps = {
        "metadata": meta("web-abc12"),
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.1.0.1"]}, {"addresses": ["10.1.0.2"]}],
    }
    assert table("EndpointSlice", "discovery.k8s.io", eps)["rows"][0]["cells"] == [
        "web-abc12",
        "IPv4",
        "8080",
        "10.1.0.1,10.1.0.2",
        "5m",
    ]
    assert cells("EndpointSlice", "discovery.k8s.io", {"metadata": meta("e")})["Ports"] == "<unset>"


def test_lease_row() -> None:
    lease = {"metadata": meta("ztunnel"), "spec": {"holderIdentity": "node-a_1234"}}
    assert table("Lease", "coordination.k8s.io", lease)["rows"][0]["cells"] == ["ztunnel", "node-a_1234", "5m"]


# ---- apps ------------------------------------------------------------------------------------------------

TEMPLATE = {"spec": {"containers": [{"name": "app", "image": "python:3.12"}, {"name": "log", "image": "busybox"}]}}


def test_deployment_row() -> None:
    d = {
        "metadata": meta("web"),
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": TEMPLATE},
        "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2},
    }
    assert table("Deployment", "apps", d)["rows"][0]["cells"] == [
        "web",
        "2/3",
        3,
        2,
        "5m",
        "app,log",
        "python:3.12,busybox",
        "app=web",
    ]


def test_replica_set_and_daemon_set_rows() -> None:
    rs = {
        "metadata": meta("web-5d8f"),
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": TEMPLATE},
        "status": {"replicas": 2, "readyReplicas": 1},
    }
    row = cells("ReplicaSet", "apps", rs)
    assert (row["Desired"], row["Current"], row["Ready"], row["Containers"]) == (2, 2, 1, "app,log")
    ds = {
        "metadata": meta("ztunnel"),
        "spec": {
            "selector": {"matchLabels": {"app": "ztunnel"}},
            "template": {"spec": {"nodeSelector": {"kubernetes.io/os": "linux"}, "containers": []}},
        },
        "status": {"desiredNumberScheduled": 3, "numberReady": 3, "currentNumberScheduled": 3},
    }
    row = cells("DaemonSet", "apps", ds)
    assert (row["Desired"], row["Ready"], row["Up-to-date"], row["Node Selector"]) == (
        3,
        3,
        0,
        "kubernetes.io/os=linux",
    )


def test_label_selector_formatting() -> None:
    selector = {
        "matchLabels": {"app": "web"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["b", "a"]},
            {"key": "legacy", "operator": "DoesNotExist"},
            {"key": "env", "operator": "Exists"},
            {"key": "zone", "operator": "NotIn", "values": ["x"]},
        ],
    }
    assert format_label_selector(selector) == "app=web,env,!legacy,tier in (a,b),zone notin (x)"
    assert format_label_selector({}) == "<none>"
    assert format_label_selector(None) == "<none>"


# ---- defaults and custom resources -----------------------------------------------------------------------


def test_kinds_without_printer_show_name_and_created_at() -> None:
    crd = {"metadata": {"name": "gateways.gateway.networking.k8s.io", "creationTimestamp": "2024-05-01T10:00:00Z"}}
    result = table("CustomResourceDefinition", "apiextensions.k8s.io", crd)
    assert [c["name"] for c in result["columnDefinitions"]] == ["Name", "Created At"]
    assert result["columnDefinitions"][1]["type"] == "date"
    assert result["rows"][0]["cells"] == ["gateways.gateway.networking.k8s.io", "2024-05-01T10:00:00Z"]
    unknown = table("FlowSchema", "flowcontrol.apiserver.k8s.io", {"metadata": {"name": "x"}})
    assert unknown["rows"][0]["cells"] == ["x", "0001-01-01T00:00:00Z"]


def test_controller_revisions_priority_classes_and_budgets_print_kubes_columns() -> None:
    meta = {"creationTimestamp": "2024-05-01T10:00:00Z"}
    ref = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u", "controller": True}
    rev = {"metadata": {"name": "agent-7d9f", "ownerReferences": [ref], **meta}, "revision": 3, "data": {}}
    result = table("ControllerRevision", "apps", rev)
    assert [c["name"] for c in result["columnDefinitions"]] == ["Name", "Controller", "Revision", "Age"]
    assert result["rows"][0]["cells"][:3] == ["agent-7d9f", "daemonset.apps/agent", 3]
    pc = {"metadata": {"name": "high", **meta}, "value": 1000, "globalDefault": True}
    result = table("PriorityClass", "scheduling.k8s.io", pc)
    names = [c["name"] for c in result["columnDefinitions"]]
    assert names == ["Name", "Value", "Global-Default", "Age", "PreemptionPolicy"]
    cells = result["rows"][0]["cells"]
    assert (cells[:3], cells[4]) == (["high", 1000, True], "PreemptLowerPriority")
    pdb = {"metadata": {"name": "web", **meta}, "spec": {"minAvailable": "50%"}, "status": {"disruptionsAllowed": 1}}
    result = table("PodDisruptionBudget", "policy", pdb)
    names = [c["name"] for c in result["columnDefinitions"]]
    assert names == ["Name", "Min Available", "Max Unavailable", "Allowed Disruptions", "Age"]
    assert result["rows"][0]["cells"][:4] == ["web", "50%", "N/A", 1]


SERVICE_ENTRY_COLUMNS = [
    {"name": "Hosts", "type": "string", "jsonPath": ".spec.hosts"},
    {"name": "Location", "type": "string", "jsonPath": ".spec.location"},
    {"name": "Resolution", "type": "string", "jsonPath": ".spec.resolution", "priority": 1},
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Ports", "type": "integer", "jsonPath": ".spec.ports[0].number"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def test_custom_resource_columns_come_from_the_crd() -> None:
    entry = {
        "metadata": meta("external-api"),
        "spec": {
            "hosts": ["api.example.com", "b.example.com"],
            "location": "MESH_EXTERNAL",
            "ports": [{"number": 443}],
        },
        "status": {"conditions": [{"type": "Synced", "status": "False"}, {"type": "Ready", "status": "True"}]},
    }
    result = table("ServiceEntry", "networking.istio.io", entry, printer_columns=SERVICE_ENTRY_COLUMNS)
    columns = result["columnDefinitions"]
    assert [c["name"] for c in columns] == ["Name", "Hosts", "Location", "Resolution", "Ready", "Ports", "Age"]
    assert columns[3]["priority"] == 1
    assert columns[1]["description"].endswith(".spec.hosts")
    assert result["rows"][0]["cells"] == [
        "external-api",
        '["api.example.com","b.example.com"]',
        "MESH_EXTERNAL",
        None,
        "True",
        443,
        "5m",
    ]


def test_custom_resource_without_columns_gets_name_and_age() -> None:
    result = table("Gateway", "gateway.networking.k8s.io", {"metadata": meta("gw")}, printer_columns=[])
    assert [c["name"] for c in result["columnDefinitions"]] == ["Name", "Age"]
    assert result["rows"][0]["cells"] == ["gw", "5m"]


def test_custom_resource_cells_follow_the_column_type() -> None:
    columns = [
        {"name": "Count", "type": "integer", "jsonPath": ".spec.n"},
        {"name": "Ratio", "type": "number", "jsonPath": ".spec.n"},
        {"name": "On", "type": "boolean", "jsonPath": ".spec.on"},
        {"name": "Text", "type": "string", "jsonPath": ".spec.n"},
        {"name": "When", "type": "date", "jsonPath": ".spec.when"},
        {"name": "Broken", "type": "string", "jsonPath": ".spec..deep"},
    ]
    obj = {"metadata": meta("x"), "spec": {"n": 3.0, "on": "yes", "when": "soon"}}
    row = table("Thing", "example.com", obj, printer_columns=columns)["rows"][0]["cells"]
    assert row == ["x", 3, 3.0, None, "3", "<invalid>", None]


# ---- invariants ------------------------------------------------------------------------------------------

ALL_PRINTERS = sorted(PRINTERS)


@pytest.mark.parametrize(("group", "kind"), ALL_PRINTERS)
def test_every_printer_fills_every_column_of_an_empty_object(group: str, kind: str) -> None:
    result = table(kind, group, {})
    assert len(result["rows"][0]["cells"]) == len(result["columnDefinitions"])
    names = [c["name"] for c in result["columnDefinitions"]]
    assert len(set(names)) == len(names)


@settings(max_examples=300, deadline=None)
@given(
    key=st.sampled_from([*ALL_PRINTERS, ("example.com", "Unknown")]),
    obj=json_objects(),
)
def test_printers_never_raise_on_arbitrary_json(key: tuple[str, str], obj: dict[str, Any]) -> None:
    group, kind = key
    result = table(kind, group, obj, include_object="Object")
    printer = PRINTERS.get(key, DEFAULT)
    assert len(result["rows"][0]["cells"]) == len(printer.columns)


@settings(max_examples=200, deadline=None)
@given(
    obj=json_objects(),
    columns=st.lists(st.dictionaries(st.sampled_from(["name", "type", "jsonPath", "priority"]), json_values(8))),
)
def test_custom_resource_printing_never_raises(obj: dict[str, Any], columns: list[dict[str, Any]]) -> None:
    result = table("Thing", "example.com", obj, printer_columns=columns)
    assert len(result["rows"][0]["cells"]) == len(result["columnDefinitions"])
