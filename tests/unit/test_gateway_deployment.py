"""The gateway deployment controller's pure parts: what a waypoint Gateway renders to (golden), how a write is
planned against what exists, and the Gateway and GatewayClass status, with hostile input.

Golden files live in ``golden/gateway/<case>.yaml``; ``AMBIT_UPDATE_GOLDEN=1 pytest ...`` rewrites them.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.gateway.apply import LAST_APPLIED, Create, Leave, Patch, Refuse, contains, plan_apply
from ambit.controlplane.gateway.render import (
    Rendered,
    Unrenderable,
    WaypointTemplateSettings,
    render_waypoint,
)
from ambit.controlplane.gateway.status import (
    Deployed,
    attached_routes,
    class_status,
    cluster_ips,
    gateway_status,
    plan_status,
)
from ambit.k8s.patch import json_merge_patch

GOLDEN = Path(__file__).parent / "golden" / "gateway"
LAB = WaypointTemplateSettings(xds_address="198.18.0.1:15012", image_pull_policy="Never")
NOW = "2026-12-02T01:00:00Z"
LATER = "2026-12-02T02:00:00Z"


def gateway(name: str = "waypoint", namespace: str = "app", **extra: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": "0b0e5a9e-1111-2222-3333-444455556666",
            "generation": 1,
            "resourceVersion": "10",
            "labels": {"istio.io/waypoint-for": "service"},
        },
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
    }
    for key, value in extra.items():
        obj[key] = value
    return obj


def rendered(gw: dict[str, Any], template: WaypointTemplateSettings = LAB) -> Rendered:
    out = render_waypoint(gw, template)
    assert isinstance(out, Rendered), out
    return out


def golden(name: str, docs: list[dict[str, Any]]) -> None:
    path = GOLDEN / f"{name}.yaml"
    text = yaml.safe_dump_all(docs, sort_keys=True)
    if os.environ.get("AMBIT_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs (AMBIT_UPDATE_GOLDEN=1 rewrites it)"


# -- render ---------------------------------------------------------------------------------------------------
def test_a_waypoint_gateway_renders_its_service_account_deployment_and_service() -> None:
    golden("waypoint", list(rendered(gateway()).objects()))


def test_infrastructure_labels_are_copied_but_never_override_the_fixed_ones() -> None:
    gw = gateway()
    gw["spec"]["infrastructure"] = {
        "labels": {
            "team": "payments",
            "gateway.istio.io/managed": "someone-else",
            "gateway.networking.k8s.io/gateway-name": "other",
            "istio.io/dataplane-mode": "ambient",
            "sidecar.istio.io/inject": "true",
        },
        "annotations": {"note": "hello", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
    }
    golden("infrastructure", list(rendered(gw).objects()))
    out = rendered(gw)
    for obj in out.objects():
        labels = obj["metadata"]["labels"]
        assert labels["team"] == "payments"
        assert labels["gateway.istio.io/managed"] == "istio.io-mesh-controller"
        assert labels["gateway.networking.k8s.io/gateway-name"] == "waypoint"
        assert "kubectl.kubernetes.io/last-applied-configuration" not in obj["metadata"]["annotations"]
    pod_labels = out.deployment["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["istio.io/dataplane-mode"] == "none" and pod_labels["sidecar.istio.io/inject"] == "false"


def test_the_deployment_never_sets_replicas_and_holds_no_api_credentials() -> None:
    deployment = rendered(gateway()).deployment
    assert "replicas" not in deployment["spec"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_without_a_pull_policy_the_cluster_default_is_left() -> None:
    (container,) = rendered(gateway(), WaypointTemplateSettings()).deployment["spec"]["template"]["spec"]["containers"]
    assert "imagePullPolicy" not in container
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["XDS_ADDRESS"] == env["CA_ADDRESS"] == "istiod.istio-system.svc:15012"


def test_the_control_plane_s_pilot_http10_reaches_the_pods_it_deploys() -> None:
    """istiod's PILOT_HTTP10 turns on accept_http_10 in every proxy; ours is handed to the waypoint's process."""

    def env_of(template: WaypointTemplateSettings) -> dict[str, str | None]:
        (container,) = rendered(gateway(), template).deployment["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value") for e in container["env"]}

    assert "PILOT_HTTP10" not in env_of(WaypointTemplateSettings())
    assert env_of(WaypointTemplateSettings(http10=True))["PILOT_HTTP10"] == "true"


def test_service_ports_follow_the_listeners() -> None:
    gw = gateway()
    gw["spec"]["listeners"] = [
        {"name": "mesh", "port": 15008, "protocol": "HBONE"},
        {"name": "mesh", "port": 15008, "protocol": "HBONE"},
        {"name": "Bad_Name", "port": 8080, "protocol": "HTTP"},
        {"name": "x", "port": 70000, "protocol": "TCP"},
        {"name": "y", "port": True, "protocol": "TCP"},
        "not a listener",
    ]
    ports = [(p["name"], p["port"], p["appProtocol"]) for p in rendered(gw).service["spec"]["ports"]]
    assert ports == [("status-port", 15021, "tcp"), ("mesh", 15008, "hbone"), ("port-8080", 8080, "http")]


@pytest.mark.parametrize(
    "name",
    ["1waypoint", "a.b", "x" * 64, "Waypoint", "", None, 7],
    ids=["digit-first", "dotted", "too-long", "upper-case", "empty", "missing", "not-a-string"],
)
def test_a_name_that_cannot_name_a_service_is_unrenderable_with_a_clear_message(name: Any) -> None:
    gw = gateway()
    gw["metadata"]["name"] = name
    out = render_waypoint(gw, LAB)
    assert isinstance(out, Unrenderable)
    assert "DNS-1035 label" in out.message and len(out.message) < 300


def test_a_gateway_without_uid_is_unrenderable() -> None:
    gw = gateway()
    del gw["metadata"]["uid"]
    assert isinstance(render_waypoint(gw, LAB), Unrenderable)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    metadata=st.dictionaries(
        st.sampled_from(["name", "namespace", "uid", "labels", "annotations", "generation"]), json_values
    ),
    spec=json_values,
    status=json_values,
)
def test_any_gateway_renders_or_is_unrenderable_and_gets_a_status_without_raising(
    metadata: dict[str, Any], spec: Any, status: Any
) -> None:
    gw = {"metadata": metadata, "spec": spec, "status": status}
    out = render_waypoint(gw, LAB)
    assert isinstance(out, Rendered | Unrenderable)
    problem = out.message if isinstance(out, Unrenderable) else None
    for found in (Deployed(problem=problem), Deployed(service_exists=True, ready=True)):
        wanted = gateway_status(gw, found, domain="cluster.local", attached=attached_routes(gw, [gw]))
        plan_status(gw, wanted, NOW)


# -- apply ------------------------------------------------------------------------------------------------------
def stored(obj: dict[str, Any], version: str = "5") -> dict[str, Any]:
    """``obj`` as an API server returns it: defaults filled in, server fields set."""
    have = copy.deepcopy(obj)
    have["metadata"].update(resourceVersion=version, uid="u-1", creationTimestamp=NOW)
    if have["kind"] == "Deployment":
        have["spec"]["replicas"] = 1
        have["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"] = "/dev/termination-log"
    if have["kind"] == "Service":
        have["spec"]["clusterIP"] = "198.19.1.2"
        for port in have["spec"]["ports"]:
            port["targetPort"] = port["port"]
    return have


def created(want: dict[str, Any]) -> dict[str, Any]:
    plan = plan_apply(want, None)
    assert isinstance(plan, Create)
    return plan.obj


def test_a_missing_object_is_created_with_what_was_applied_in_an_annotation() -> None:
    want = rendered(gateway()).deployment
    obj = created(want)
    annotations = obj["metadata"].pop("annotations")
    record = json.loads(annotations.pop(LAST_APPLIED))
    assert annotations == want["metadata"].get("annotations", {})
    assert obj == {**want, "metadata": {k: v for k, v in want["metadata"].items() if k != "annotations"}}
    assert record == {"spec": want["spec"], "metadata": {k: want["metadata"][k] for k in ("labels", "ownerReferences")}}
    assert LAST_APPLIED not in want["metadata"].get("annotations", {})


def test_an_object_holding_everything_rendered_plus_server_defaults_is_left_alone() -> None:
    for want in rendered(gateway()).objects():
        assert plan_apply(want, stored(created(want))) == Leave()


def test_an_object_created_before_the_annotation_is_patched_once() -> None:
    want = rendered(gateway()).service
    plan = plan_apply(want, stored(want))
    assert isinstance(plan, Patch) and LAST_APPLIED in plan.patch["metadata"]["annotations"]


def test_a_field_applied_before_and_no_longer_rendered_is_removed_and_others_fields_stay() -> None:
    """A nodeSelector and a label an overlay set, then no longer sets: removed, as server-side apply removes the
    fields of its manager; a key someone else added to the same map stays."""
    overlaid = rendered(gateway()).deployment
    overlaid["metadata"]["labels"]["team"] = "payments"
    overlaid["spec"]["template"]["spec"]["nodeSelector"] = {"disk": "ssd"}
    have = stored(created(overlaid))
    have["spec"]["template"]["spec"]["nodeSelector"]["zone"] = "a"
    have["metadata"]["labels"]["theirs"] = "x"
    want = rendered(gateway()).deployment
    plan = plan_apply(want, have)
    assert isinstance(plan, Patch)
    assert plan.patch["metadata"]["labels"]["team"] is None and "theirs" not in plan.patch["metadata"]["labels"]
    assert plan.patch["spec"]["template"]["spec"]["nodeSelector"] == {"disk": None}
    assert "nodeSelector" not in want["spec"]["template"]["spec"], "the rendered object is not changed"
    after = json_merge_patch(have, plan.patch)
    assert after["spec"]["template"]["spec"]["nodeSelector"] == {"zone": "a"}
    assert after["metadata"]["labels"]["theirs"] == "x" and "team" not in after["metadata"]["labels"]
    assert plan_apply(want, after) == Leave()


@pytest.mark.parametrize("annotation", ["not json", "[1, 2]", '"text"', "{"])
def test_a_mangled_last_applied_annotation_counts_as_nothing_applied(annotation: str) -> None:
    want = rendered(gateway()).service_account
    have = stored(created(want))
    have["metadata"]["annotations"][LAST_APPLIED] = annotation
    plan = plan_apply(want, have)
    assert isinstance(plan, Patch) and json.loads(plan.patch["metadata"]["annotations"][LAST_APPLIED])


def test_a_user_s_replica_count_survives_and_a_changed_template_is_patched() -> None:
    want = rendered(gateway()).deployment
    have = stored(created(want))
    have["spec"]["replicas"] = 3
    assert plan_apply(want, have) == Leave()
    have["spec"]["template"]["spec"]["containers"][0]["args"] = ["something", "else"]
    plan = plan_apply(want, have)
    assert isinstance(plan, Patch)
    assert "replicas" not in plan.patch["spec"]
    assert plan.patch["metadata"]["resourceVersion"] == "5"
    assert plan.patch["spec"]["template"] == want["spec"]["template"]


def test_an_object_someone_else_owns_is_refused_not_overwritten() -> None:
    want = rendered(gateway()).service_account
    have = stored(want)
    del have["metadata"]["labels"]["gateway.istio.io/managed"]
    plan = plan_apply(want, have)
    assert isinstance(plan, Refuse)
    assert "not managed by the mesh controller" in plan.message


def test_contains_compares_lists_by_length_and_types_strictly() -> None:
    assert contains({"a": [1, {"b": 2, "c": 3}]}, {"a": [1, {"b": 2}]})
    assert not contains({"a": [1, 2]}, {"a": [1]})
    assert not contains({"a": 1}, {"a": True})
    assert not contains({"a": "1"}, {"a": 1})


# -- status -----------------------------------------------------------------------------------------------------
def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_before_the_service_exists_programmed_is_false_address_not_usable() -> None:
    status = gateway_status(gateway(), Deployed(), domain="cluster.local")
    assert conditions(status) == {
        "Accepted": ("True", "Accepted"),
        "Programmed": ("False", "AddressNotUsable"),
        "ResolvedRefs": ("True", "ResolvedRefs"),
    }
    assert "addresses" not in status


def test_without_a_ready_replica_programmed_is_false_address_not_assigned() -> None:
    status = gateway_status(gateway(), Deployed(service_exists=True), domain="cluster.local")
    assert conditions(status)["Programmed"] == ("False", "AddressNotAssigned")
    programmed = status["conditions"][1]
    assert programmed["message"] == (
        'Failed to assign to any requested addresses: no instances found for hostname "waypoint.app.svc.cluster.local"'
    )


def test_a_ready_waypoint_is_programmed_with_its_hostname_address_and_listener_status() -> None:
    gw = gateway()
    route = {
        "metadata": {"name": "r", "namespace": "app"},
        "spec": {"parentRefs": [{"kind": "Gateway", "name": "waypoint"}]},
    }
    status = gateway_status(
        gw, Deployed(service_exists=True, ready=True), domain="cluster.local", attached=attached_routes(gw, [route])
    )
    golden("status-ready", [status])
    assert conditions(status)["Programmed"] == ("True", "Programmed")
    assert status["addresses"] == [{"type": "Hostname", "value": "waypoint.app.svc.cluster.local"}]
    (listener,) = status["listeners"]
    assert listener["attachedRoutes"] == 1
    assert {c["type"]: c["status"] for c in listener["conditions"]} == {
        "Accepted": "True",
        "Conflicted": "False",
        "Programmed": "True",
        "ResolvedRefs": "True",
    }


def test_an_address_once_reported_stays_unless_there_is_a_problem() -> None:
    gw = gateway(status={"addresses": [{"type": "Hostname", "value": "waypoint.app.svc.cluster.local"}]})
    assert "addresses" in gateway_status(gw, Deployed(service_exists=True), domain="cluster.local")
    assert "addresses" not in gateway_status(gw, Deployed(problem="no"), domain="cluster.local")


def test_a_ready_waypoint_reports_its_cluster_ips_then_its_hostname_as_istiod_does_for_the_waypoint_class() -> None:
    # istiod's waypoint class has no address type, so it reports both: the Service's cluster IPs (every family,
    # sorted as text) and then the hostname; `kubectl get gateway` shows the first, an IP, as with Istio.
    service = {"spec": {"clusterIP": "198.19.0.40", "clusterIPs": ["fd00:10:96::28", "198.19.0.40"]}}
    found = Deployed(service_exists=True, ready=True, cluster_ips=cluster_ips(service))
    status = gateway_status(gateway(), found, domain="cluster.local")
    assert status["addresses"] == [
        {"type": "IPAddress", "value": "198.19.0.40"},
        {"type": "IPAddress", "value": "fd00:10:96::28"},
        {"type": "Hostname", "value": "waypoint.app.svc.cluster.local"},
    ]
    # scaled to zero: what was reported stays (istiod never takes an address back while the Gateway is fine)
    scaled = gateway(status={"addresses": status["addresses"]})
    kept = gateway_status(scaled, Deployed(service_exists=True, cluster_ips=found.cluster_ips), domain="cluster.local")
    assert kept["addresses"] == status["addresses"]
    assert "addresses" not in gateway_status(scaled, Deployed(problem="no"), domain="cluster.local")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"clusterIP": "198.19.0.7"}, ("198.19.0.7",)),
        ({"clusterIP": "None", "clusterIPs": ["None"]}, ()),  # headless: no address to report
        ({"clusterIPs": ["198.19.0.7", "2001:db8::7"]}, ("198.19.0.7", "2001:db8::7")),
        ({"clusterIPs": [], "clusterIP": "2001:db8::7"}, ("2001:db8::7",)),
        ({"clusterIPs": ["not an ip", 7, None, "1" * 5000]}, ()),
        ({"clusterIP": ["198.19.0.7"]}, ()),
        ({}, ()),
    ],
)
def test_cluster_ips_reads_the_service_and_ignores_what_is_not_an_address(spec: Any, expected: Any) -> None:
    assert cluster_ips({"spec": spec}) == expected
    assert cluster_ips(None) == ()
    assert cluster_ips({"spec": "junk"}) == ()


def test_a_listener_other_than_hbone_15008_is_not_accepted() -> None:
    gw = gateway()
    gw["spec"]["listeners"] = [{"name": "http", "port": 80, "protocol": "HTTP"}]
    status = gateway_status(gw, Deployed(service_exists=True, ready=True), domain="cluster.local")
    assert conditions(status)["Accepted"] == ("False", "ListenersNotValid")
    (listener,) = status["listeners"]
    assert (listener["conditions"][0]["reason"], listener["conditions"][0]["status"]) == (
        "UnsupportedProtocol",
        "False",
    )


def test_a_problem_is_programmed_false_invalid_with_its_message() -> None:
    status = gateway_status(gateway(), Deployed(problem="the name is bad"), domain="cluster.local")
    assert status["conditions"][1]["reason"] == "Invalid"
    assert status["conditions"][1]["message"] == "the name is bad"


def test_routes_attach_by_section_port_and_namespace_rules() -> None:
    gw = gateway()
    ref = {"name": "waypoint", "namespace": "app"}

    def route(ns: str, **extra: Any) -> dict[str, Any]:
        return {"metadata": {"namespace": ns}, "spec": {"parentRefs": [{**ref, **extra}]}}

    routes = [
        route("app"),
        route("app", sectionName="mesh"),
        route("app", sectionName="other"),
        route("app", port=15008),
        route("app", port=80),
        route("app", kind="Service"),
        route("elsewhere"),
        {"metadata": {"namespace": "app"}, "spec": {"parentRefs": "nonsense"}},
    ]
    assert attached_routes(gw, routes) == {"mesh": 3}
    gw["spec"]["listeners"][0]["allowedRoutes"] = {"namespaces": {"from": "All"}}
    assert attached_routes(gw, routes) == {"mesh": 4}


def test_status_is_written_once_and_transition_times_move_only_on_flips() -> None:
    gw = gateway()
    wanted = gateway_status(gw, Deployed(service_exists=True), domain="cluster.local")
    patch = plan_status(gw, wanted, NOW)
    assert patch is not None and patch["metadata"]["resourceVersion"] == "10"
    gw["status"] = patch["status"]
    assert plan_status(gw, wanted, LATER) is None
    ready = gateway_status(gw, Deployed(service_exists=True, ready=True), domain="cluster.local")
    patch = plan_status(gw, ready, LATER)
    assert patch is not None
    times = {c["type"]: c["lastTransitionTime"] for c in patch["status"]["conditions"]}
    assert times == {"Accepted": NOW, "Programmed": LATER, "ResolvedRefs": NOW}


def test_another_controller_s_conditions_are_kept() -> None:
    gw = gateway(status={"conditions": [{"type": "Example", "status": "True", "reason": "X", "message": ""}]})
    wanted = gateway_status(gw, Deployed(), domain="cluster.local")
    patch = plan_status(gw, wanted, NOW)
    assert patch is not None
    assert [c["type"] for c in patch["status"]["conditions"]] == ["Example", "Accepted", "Programmed", "ResolvedRefs"]


def test_the_gateway_class_is_accepted() -> None:
    gc = {"metadata": {"name": "istio-waypoint", "generation": 2, "resourceVersion": "3"}}
    patch = plan_status(gc, class_status(gc), NOW)
    assert patch is not None
    (condition,) = patch["status"]["conditions"]
    assert condition == {
        "type": "Accepted",
        "status": "True",
        "reason": "Accepted",
        "message": "Handled by Istio controller",
        "observedGeneration": 2,
        "lastTransitionTime": NOW,
    }
    assert "addresses" not in patch["status"]
