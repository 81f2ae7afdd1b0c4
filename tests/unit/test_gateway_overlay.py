"""Overlays on what a Gateway deploys (istiod's class defaults ConfigMap and ``parametersRef``): strategic merge
patches on the rendered objects, the optional HorizontalPodAutoscaler and PodDisruptionBudget, the identity an
overlay may not change, and hostile overlay text, which gets a clear error and never a traceback.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ambit.controlplane.gateway.ingress_status import ingress_status
from ambit.controlplane.gateway.overlay import (
    CLASS_DEFAULTS_LABEL,
    InvalidParameters,
    Overlay,
    class_defaults,
    parameters_ref,
)
from ambit.controlplane.gateway.render import Rendered, Unrenderable, WaypointTemplateSettings, render_waypoint
from ambit.controlplane.gateway.status import Deployed, gateway_status

LAB = WaypointTemplateSettings(xds_address="198.18.0.1:15012", image_pull_policy="Never")
GRACE_3 = "spec:\n  template:\n    spec:\n      terminationGracePeriodSeconds: 3\n"


def gateway(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "waypoint", "namespace": "app", "uid": "u-1", "generation": 1},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
            **spec,
        },
    }


def defaults(**data: str) -> Overlay:
    return Overlay("istio-system/waypoint-defaults", data)


def render(*overlays: Overlay) -> Rendered:
    out = render_waypoint(gateway(), LAB, overlays)
    assert isinstance(out, Rendered), out
    return out


def refused(*overlays: Overlay) -> str:
    out = render_waypoint(gateway(), LAB, overlays)
    assert isinstance(out, Unrenderable), out
    return out.message


def pod_spec(out: Rendered) -> dict[str, Any]:
    spec: dict[str, Any] = out.deployment["spec"]["template"]["spec"]
    return spec


# -- applying overlays ----------------------------------------------------------------------------------------
def test_the_default_grace_period_is_istio_s_30_and_the_class_defaults_make_it_3() -> None:
    assert pod_spec(render())["terminationGracePeriodSeconds"] == 30
    assert pod_spec(render(defaults(deployment=GRACE_3)))["terminationGracePeriodSeconds"] == 3


def test_the_parameters_ref_overlay_applies_after_the_class_defaults() -> None:
    mine = Overlay("app/mine", {"deployment": "spec: {template: {spec: {terminationGracePeriodSeconds: 7}}}"})
    assert pod_spec(render(defaults(deployment=GRACE_3), mine))["terminationGracePeriodSeconds"] == 7
    assert pod_spec(render(mine, defaults(deployment=GRACE_3)))["terminationGracePeriodSeconds"] == 3


def test_containers_merge_by_name_and_keep_what_the_overlay_does_not_name() -> None:
    overlay = """
spec:
  template:
    spec:
      containers:
      - name: istio-proxy
        resources: {limits: {memory: 256Mi}}
        env:
        - {name: LOG_LEVEL, value: debug}
      - name: sidecar
        image: busybox
"""
    spec = pod_spec(render(defaults(deployment=overlay)))
    proxy, extra = spec["containers"]
    assert proxy["name"] == "istio-proxy" and proxy["command"] == ["ambit"]
    assert proxy["resources"] == {"limits": {"memory": "256Mi"}}
    env = {e["name"]: e for e in proxy["env"]}
    assert env["LOG_LEVEL"]["value"] == "debug" and env["XDS_ADDRESS"]["value"] == "198.18.0.1:15012"
    assert extra == {"name": "sidecar", "image": "busybox"}
    assert [v["name"] for v in spec["volumes"]] == ["istio-token", "istiod-ca-cert", "tmp"]


def test_service_and_service_account_overlays_apply_to_their_kind_only() -> None:
    out = render(
        defaults(
            service="metadata: {annotations: {team: payments}}\nspec: {ports: [{port: 15008, name: tunnel}]}",
            serviceAccount="metadata: {labels: {audited: 'yes'}}",
        )
    )
    assert out.service["metadata"]["annotations"]["team"] == "payments"
    ports = {p["port"]: p["name"] for p in out.service["spec"]["ports"]}
    assert ports == {15021: "status-port", 15008: "tunnel"}
    assert out.service_account["metadata"]["labels"]["audited"] == "yes"
    assert "audited" not in out.deployment["metadata"]["labels"]


def test_the_autoscaler_and_disruption_budget_are_deployed_only_when_an_overlay_names_them() -> None:
    plain = render(defaults(deployment=GRACE_3))
    assert plain.autoscaler is None and plain.disruption_budget is None
    assert [o["kind"] for o in plain.objects()] == ["ServiceAccount", "Deployment", "Service"]
    out = render(
        defaults(
            horizontalPodAutoscaler="spec: {minReplicas: 2, maxReplicas: 5}",
            podDisruptionBudget="spec: {minAvailable: 1}",
        )
    )
    assert out.autoscaler is not None and out.disruption_budget is not None
    assert out.autoscaler["spec"] == {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "waypoint"},
        "minReplicas": 2,
        "maxReplicas": 5,
    }
    assert out.disruption_budget["spec"] == {
        "selector": {"matchLabels": {"gateway.networking.k8s.io/gateway-name": "waypoint"}},
        "minAvailable": 1,
    }
    for obj in out.objects():
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        assert obj["metadata"]["labels"]["gateway.istio.io/managed"] == "istio.io-mesh-controller"
    assert [o["kind"] for o in out.objects()][3:] == ["HorizontalPodAutoscaler", "PodDisruptionBudget"]


def test_an_empty_overlay_still_names_an_optional_kind() -> None:
    assert render(defaults(podDisruptionBudget="")).disruption_budget is not None


# -- refused overlays -----------------------------------------------------------------------------------------
def test_an_unsupported_key_is_refused_naming_the_config_map_and_the_supported_keys() -> None:
    message = refused(defaults(deployment=GRACE_3, daemonSet="spec: {}"))
    assert message == (
        "ConfigMap istio-system/waypoint-defaults: unsupported key 'daemonSet' (supported: deployment, "
        "horizontalPodAutoscaler, podDisruptionBudget, service, serviceAccount)"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("spec: [", "not valid YAML"),
        ("- a\n- b\n", "must be a YAML mapping, not a list"),
        ("just text", "must be a YAML mapping, not a str"),
        ("a: &x [1]\nb: *x\n", "YAML aliases are not allowed"),
        ("spec: {template: {metadata: {annotations: {when: 2026-12-03}}}}", "a date is not a JSON value"),
        ("spec: {replicas: .inf}", "inf is not a JSON number"),
        ("spec: {1: one}", "the key 1 is not a string"),
        ("spec: {template: {spec: {containers: [{image: x}]}}}", "has no merge key 'name'"),
        ("spec: {$patch: explode}", "unknown $patch directive 'explode'"),
        ("spec: " + "[" * 100 + "]" * 100, "nested more than 64 levels deep"),
        ("spec: " + "[" * 5000 + "]" * 5000, "exceeded maximum nesting depth"),
        ("spec: !!binary aGVsbG8=", "a bytes is not a JSON value"),
        ("spec: !!python/object:os.system {}", "not valid YAML"),
    ],
)
def test_bad_overlay_text_gets_one_clear_line(text: str, expected: str) -> None:
    message = refused(defaults(deployment=text))
    assert message.startswith("ConfigMap istio-system/waypoint-defaults key 'deployment': "), message
    assert expected in message and "\n" not in message


@pytest.mark.parametrize(
    "overlay",
    [
        "metadata: {name: payments-api}",
        "metadata: {namespace: kube-system}",
        "metadata: {uid: forged}",
        "metadata: {ownerReferences: [{apiVersion: v1, kind: Namespace, name: app, uid: n-1}]}",
        "metadata: {ownerReferences: null}",
        "metadata: {finalizers: [example.com/never]}",
        "metadata: {generateName: x-}",
        "metadata: {managedFields: [{manager: me}]}",
        "metadata: null",
        "kind: DaemonSet",
        "apiVersion: apps/v1beta1",
    ],
)
def test_an_overlay_may_not_change_the_object_s_identity(overlay: str) -> None:
    """Attack: a defaults or parametersRef ConfigMap that would make the controller write another object (take
    over a Deployment of another name or namespace, detach it from its Gateway, or block its deletion)."""
    for key in ("deployment", "service", "serviceAccount"):
        message = refused(defaults(**{key: overlay}))
        assert f"changes the {key[0].upper() + key[1:]}'s identity" in message, message


def test_an_overlay_cannot_remove_the_managed_label() -> None:
    out = render(defaults(deployment="metadata: {labels: {gateway.istio.io/managed: null, extra: x}}"))
    labels = out.deployment["metadata"]["labels"]
    assert labels["gateway.istio.io/managed"] == "istio.io-mesh-controller" and labels["extra"] == "x"


def test_an_overlay_may_add_a_host_path_and_privilege_as_istio_allows() -> None:
    """Attack, decided by Istio's rules: only identity is protected, so whoever can write the class defaults
    ConfigMap in the control plane's namespace controls every waypoint's pods (README says so; the namespace's pod
    security admission still judges the pods)."""
    overlay = """
spec:
  template:
    spec:
      volumes: [{name: host, hostPath: {path: /}}]
      containers:
      - name: istio-proxy
        securityContext: {privileged: true}
        volumeMounts: [{name: host, mountPath: /host}]
"""
    spec = pod_spec(render(defaults(deployment=overlay)))
    assert spec["volumes"][-1] == {"name": "host", "hostPath": {"path": "/"}}
    assert spec["containers"][0]["securityContext"]["privileged"] is True
    assert spec["containers"][0]["securityContext"]["runAsUser"] == 1337


@given(
    text=st.text(max_size=300), key=st.sampled_from(["deployment", "service", "serviceAccount", "podDisruptionBudget"])
)
def test_arbitrary_overlay_text_renders_or_gets_a_clear_message(text: str, key: str) -> None:
    out = render_waypoint(gateway(), LAB, (defaults(**{key: text}),))
    if isinstance(out, Unrenderable):
        assert out.message.startswith("ConfigMap istio-system/waypoint-defaults key "), out.message
        assert "\n" not in out.message
    else:
        assert out.deployment["metadata"]["name"] == "waypoint"


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=20,
)
_patchy = st.dictionaries(
    st.sampled_from(["metadata", "spec", "kind", "$patch", "$retainKeys", "template", "containers", "name"]),
    _json,
    max_size=3,
)


@given(doc=st.dictionaries(st.sampled_from(["metadata", "spec"]), _patchy | _json, max_size=2))
def test_arbitrary_overlay_documents_render_or_get_a_clear_message(doc: dict[str, Any]) -> None:
    text = yaml.safe_dump(doc)
    for key in ("deployment", "service"):
        out = render_waypoint(gateway(), LAB, (defaults(**{key: text}),))
        if isinstance(out, Unrenderable):
            assert out.message.startswith(f"ConfigMap istio-system/waypoint-defaults key '{key}': "), out.message
        else:
            assert out.deployment["metadata"]["name"] == "waypoint"
            assert out.service["metadata"]["ownerReferences"][0]["uid"] == "u-1"


# -- finding the overlays -------------------------------------------------------------------------------------
def config_map(name: str, created: str, for_class: str | None = "istio-waypoint") -> dict[str, Any]:
    labels = {CLASS_DEFAULTS_LABEL: for_class} if for_class else {}
    return {"metadata": {"name": name, "namespace": "istio-system", "creationTimestamp": created, "labels": labels}}


def test_the_oldest_class_defaults_config_map_of_the_gateway_s_class_is_used() -> None:
    items = [
        config_map("newer", "2026-12-03T07:00:00Z"),
        config_map("other-class", "2026-12-01T00:00:00Z", "istio"),
        config_map("unlabelled", "2026-12-01T00:00:00Z", None),
        config_map("b-oldest", "2026-12-02T00:00:00Z"),
        config_map("a-oldest", "2026-12-02T00:00:00Z"),
    ]
    chosen = class_defaults(items, "istio-waypoint")
    assert chosen is not None and chosen["metadata"]["name"] == "a-oldest"
    assert class_defaults(items[2:3], "istio-waypoint") is None


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        (None, None),
        ({"group": "", "kind": "ConfigMap", "name": "mine"}, ("app", "mine")),
        ({"kind": "ConfigMap", "name": "mine"}, ("app", "mine")),
        (
            {"group": "invalid.io", "kind": "InvalidParameters", "name": "x"},
            InvalidParameters(
                "Unsupported parametersRef group/kind invalid.io/InvalidParameters, only ConfigMap is supported"
            ),
        ),
        (
            {"group": "", "kind": "Secret", "name": "x"},
            InvalidParameters("Unsupported parametersRef group/kind /Secret, only ConfigMap is supported"),
        ),
        ({"group": "", "kind": "ConfigMap"}, InvalidParameters("parametersRef names no ConfigMap")),
        ("garbage", InvalidParameters("Unsupported parametersRef group/kind /, only ConfigMap is supported")),
    ],
)
def test_parameters_ref_names_a_config_map_of_the_gateway_s_namespace(ref: Any, expected: Any) -> None:
    gw = gateway(infrastructure={"parametersRef": ref}) if ref is not None else gateway()
    assert parameters_ref(gw) == expected


# -- status ---------------------------------------------------------------------------------------------------
def test_unusable_parameters_set_accepted_false_before_listener_validity_and_programmed_stays_honest() -> None:
    gw = gateway(listeners=[{"name": "bad", "port": 1, "protocol": "HTTP"}])
    message = "parametersRef ConfigMap app/params does not exist"
    status = gateway_status(
        gw, Deployed(service_exists=True, ready=True, invalid_parameters=message), domain="cluster.local"
    )
    accepted, programmed, _ = status["conditions"]
    assert (accepted["status"], accepted["reason"], accepted["message"]) == ("False", "InvalidParameters", message)
    assert (programmed["status"], programmed["reason"]) == ("True", "Programmed")
    ingress = {**gateway(), "spec": {"gatewayClassName": "istio", "listeners": []}}
    status = ingress_status(ingress, Deployed(invalid_parameters=message), [], host="h", addresses=())
    assert status["conditions"][0]["reason"] == "InvalidParameters"
