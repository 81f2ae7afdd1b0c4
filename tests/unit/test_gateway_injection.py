"""The injection templates (ConfigMap ``istio-sidecar-injector``) as an overlay on Ambit's rendering: the shipped
templates change nothing, a template written with the constructs of Istio's waypoint.yaml is evaluated and its
customisations taken, what must stay Ambit's stays, and every failure is one TemplateFailed line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ambit.controlplane.gateway.injection import (
    InjectionConfig,
    TemplateFailed,
    injector_name,
    parse_injection_config,
    template_inputs,
    template_overlay,
)
from ambit.controlplane.gateway.overlay import Overlay
from ambit.controlplane.gateway.render import Rendered, WaypointTemplateSettings, render_waypoint

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "base" / "istiod" / "injector-configmap.yaml"
ANCHOR = "serviceAccountName: {{.ServiceAccount | quote}}"
GRACE_3 = ANCHOR + "\n      terminationGracePeriodSeconds: 3"
SETTINGS = WaypointTemplateSettings(xds_address="198.18.0.1:15012")
MIRROR = Path("/work/.mirror/istio+istio/repo")

# Written for these tests with the constructs Istio's waypoint.yaml uses: multi-line calls, omit/strdict/toJsonMap,
# annotation with raw strings, contains, with/else, ge on .KubeVersion, range over .Ports and the proxy metadata,
# protoToJSON, valueOrDefault over index, (.Values.pilot).env, toYaml (omitNil ...) | nindent.
ISTIO_SHAPED = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{.DeploymentName | quote}}
  namespace: {{.Namespace | quote}}
  labels:
    {{- toJsonMap
      .InfrastructureLabels
      (strdict
        "gateway.networking.k8s.io/gateway-name" .Name
        "gateway.istio.io/managed" .ControllerLabel
      ) | nindent 4 }}
  {{- if ge .KubeVersion 128 }}
  ownerReferences:
  - apiVersion: gateway.networking.k8s.io/v1
    kind: Gateway
    name: "{{.Name}}"
    uid: "{{.UID}}"
  {{- end }}
spec:
  template:
    metadata:
      annotations:
        {{- toJsonMap
          (omit .InfrastructureAnnotations "kubectl.kubernetes.io/last-applied-configuration")
          (strdict "istio.io/rev" (.Revision | default "default")) | nindent 8 }}
      labels:
        {{- toJsonMap (strdict "istio.io/dataplane-mode" "none") .InfrastructureLabels | nindent 8 }}
    spec:
      {{- if .Values.global.waypoint.nodeSelector }}
      nodeSelector:
      {{- toYaml .Values.global.waypoint.nodeSelector | nindent 8 }}
      {{- end }}
      serviceAccountName: {{.ServiceAccount | quote}}
      containers:
      - name: istio-proxy
        {{- if contains "/" (annotation .ObjectMeta `sidecar.istio.io/proxyImage` .Values.global.proxy.image) }}
        image: {{ annotation .ObjectMeta `sidecar.istio.io/proxyImage` .Values.global.proxy.image | quote }}
        {{- else }}
        image: "{{ .ProxyImage }}"
        {{- end }}
        args: [proxy, waypoint]
        env:
        - name: PROXY_CONFIG
          value: |
                 {{ protoToJSON .ProxyConfig }}
        {{- range $key, $value := .ProxyConfig.ProxyMetadata }}
        - name: {{ $key }}
          value: "{{ $value }}"
        {{- end }}
        {{- $network := valueOrDefault
              (index .InfrastructureLabels `topology.istio.io/network`) .Values.global.network }}
        {{- with $network }}
        - name: ISTIO_META_NETWORK
          value: "{{ . }}"
        {{- end }}
        {{- if .Values.global.waypoint.resources }}
        resources:
        {{- toYaml (omitNil .Values.global.waypoint.resources) | nindent 10 }}
        {{- end }}
      volumes:
      - name: istiod-ca-cert
      {{- if eq (.Values.pilot).env true }}
        projected: {}
      {{- else }}
        configMap:
          name: {{ .Values.global.trustBundleName | default "istio-ca-root-cert" }}
      {{- end }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{.DeploymentName | quote}}
spec:
  ports:
  {{- range $key, $val := .Ports }}
  - name: {{ $val.Name | quote }}
    port: {{ $val.Port }}
  {{- end }}
  {{- if and (.Spec.Addresses) (eq .ServiceType "LoadBalancer") }}
  loadBalancerIP: {{ (index .Spec.Addresses 0).Value | quote}}
  {{- end }}
  type: {{ .ServiceType | quote }}
"""

VALUES = {
    "global": {
        "proxy": {"image": "docker.io/istio/proxyv2:1.0"},
        "network": "",
        "waypoint": {"nodeSelector": {"disk": "ssd"}, "resources": {"requests": {"cpu": "100m", "memory": None}}},
    }
}


def gateway(name: str = "wp", cls: str = "istio-waypoint", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": "ns", "uid": "uid-1", "labels": labels},
        "spec": {"gatewayClassName": cls, "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]},
    }


def config_map(templates: dict[str, str], values: Any = None, name: str = "istio-sidecar-injector") -> dict[str, Any]:
    data = {"config": yaml.safe_dump({"policy": "enabled", "templates": templates})}
    if values is not None:
        data["values"] = json.dumps(values)
    return {"metadata": {"name": name, "namespace": "istio-system"}, "data": data}


def rendered_with(config: InjectionConfig | TemplateFailed | None, gw: dict[str, Any]) -> Rendered:
    overlay = template_overlay(gw, SETTINGS, config, system_namespace="istio-system")
    assert not isinstance(overlay, TemplateFailed), overlay
    result = render_waypoint(gw, SETTINGS, [overlay] if isinstance(overlay, Overlay) else [])
    assert isinstance(result, Rendered), result
    return result


def pod_spec(rendered: Rendered) -> dict[str, Any]:
    spec: dict[str, Any] = rendered.deployment["spec"]["template"]["spec"]
    return spec


def shipped() -> InjectionConfig:
    config = parse_injection_config(yaml.safe_load(SHIPPED.read_text()))
    assert isinstance(config, InjectionConfig)
    return config


@pytest.mark.parametrize("cls", ["istio-waypoint", "istio"])
def test_the_shipped_templates_render_exactly_what_ambit_renders_alone(cls: str) -> None:
    gw = gateway("gw", cls, team="a")
    gw["metadata"]["annotations"] = {"note": "x"}
    assert rendered_with(shipped(), gw) == render_waypoint(gw, SETTINGS)


@pytest.mark.parametrize("cls", ["istio-waypoint", "istio"])
def test_the_upstream_edit_of_the_shipped_template_sets_the_grace_period(cls: str) -> None:
    config = shipped()
    name = "waypoint" if cls == "istio-waypoint" else "kube-gateway"
    assert config.templates[name].count(ANCHOR) == 1
    edited = {**config.templates, name: config.templates[name].replace(ANCHOR, GRACE_3)}
    result = rendered_with(InjectionConfig(config.source, edited, config.values), gateway("gw", cls))
    assert pod_spec(result)["terminationGracePeriodSeconds"] == 3


def test_the_shipped_values_customise_the_waypoint_pods() -> None:
    config = shipped()
    values = json.loads(json.dumps(config.values))
    values["global"]["waypoint"].update(
        nodeSelector={"disk": "ssd"},
        tolerations=[{"key": "k", "operator": "Exists"}],
        resources={"limits": {"cpu": "2"}, "requests": {"memory": None}},
    )
    values["global"]["imagePullSecrets"] = ["regcred"]
    result = rendered_with(InjectionConfig(config.source, config.templates, values), gateway())
    spec = pod_spec(result)
    assert spec["nodeSelector"] == {"disk": "ssd"}
    assert spec["tolerations"] == [{"key": "k", "operator": "Exists"}]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["containers"][0]["resources"] == {"limits": {"cpu": "2"}}


def test_an_istio_shaped_template_is_evaluated_and_only_the_customisations_are_taken() -> None:
    gw = gateway(**{"istio.io/dataplane-mode": "ambient", "topology.istio.io/network": "net1"})
    config = parse_injection_config(config_map({"waypoint": ISTIO_SHAPED.replace(ANCHOR, GRACE_3)}, VALUES))
    assert isinstance(config, InjectionConfig)
    result = rendered_with(config, gw)
    alone = render_waypoint(gw, SETTINGS)
    assert isinstance(alone, Rendered)
    spec = pod_spec(result)
    assert spec["terminationGracePeriodSeconds"] == 3
    assert spec["nodeSelector"] == {"disk": "ssd"}
    container = spec["containers"][0]
    assert container["resources"] == {"requests": {"cpu": "100m"}}
    ours = pod_spec(alone)["containers"][0]
    for key in ("image", "command", "args", "env", "volumeMounts"):
        assert container[key] == ours[key], f"the template may not change the proxy's {key}"
    assert spec["volumes"] == pod_spec(alone)["volumes"]
    labels = result.deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["istio.io/dataplane-mode"] == "none", "a waypoint's pods are never captured"
    assert result.service["spec"]["ports"] == alone.service["spec"]["ports"]
    assert result.deployment["metadata"]["ownerReferences"] == alone.deployment["metadata"]["ownerReferences"]


def test_the_inputs_are_those_istiod_gives() -> None:
    inputs = template_inputs(gateway(), SETTINGS, VALUES, system_namespace="istio-system")
    assert inputs["Name"] == inputs["DeploymentName"] == inputs["ServiceAccount"] == "wp"
    assert inputs["ObjectMeta"]["Namespace"] == "ns"
    assert inputs["Spec"]["GatewayClassName"] == "istio-waypoint"
    assert inputs["Spec"]["Listeners"][0]["Port"] == 15008
    assert inputs["Ports"][0] == {"Name": "status-port", "Port": 15021, "Protocol": "TCP", "AppProtocol": "tcp"}
    assert inputs["ServiceType"] == "ClusterIP"
    assert inputs["ControllerLabel"] == "istio.io-mesh-controller"
    assert inputs["GatewayNameLabel"] == "gateway.networking.k8s.io/gateway-name"
    assert inputs["KubeVersion"] >= 128
    assert inputs["Values"] is VALUES
    ingress = template_inputs(gateway("in", "istio"), SETTINGS, {}, system_namespace="istio-system")
    assert (ingress["DeploymentName"], ingress["ServiceType"]) == ("in-istio", "LoadBalancer")


def test_without_the_config_map_or_the_template_nothing_is_overlaid() -> None:
    assert template_overlay(gateway(), SETTINGS, None, system_namespace="istio-system") is None
    config = parse_injection_config(config_map({"sidecar": "{{ not_a_function_we_have }}"}))
    assert template_overlay(gateway(), SETTINGS, config, system_namespace="istio-system") is None
    empty = parse_injection_config({"metadata": {"name": "istio-sidecar-injector", "namespace": "istio-system"}})
    assert template_overlay(gateway(), SETTINGS, empty, system_namespace="istio-system") is None


@pytest.mark.parametrize(
    ("templates", "values", "message"),
    [
        ({"waypoint": "{{ .Name "}, None, "template 'waypoint': template: line 1 col 1: unclosed action"),
        ({"waypoint": "{{ nosuch }}"}, None, "function 'nosuch' not defined"),
        ({"waypoint": "{{ index .Ports 9 }}"}, None, "index out of range"),
        ({"waypoint": "kind: Deployment\n  bad: [indent"}, None, "its output is not YAML objects"),
        ({"waypoint": "- a list"}, None, "a document is a list, not an object"),
        ({"waypoint": "kind: ok"}, "[1]", "key 'values': expected a JSON object"),
        ({"waypoint": "kind: ok"}, "{not json", "key 'values': not valid JSON"),
        (
            {"waypoint": "{{ range $a := .Ports }}{{ range 60000 }}{{ end }}{{ end }}"},
            None,
            "range over 60000",
        ),
    ],
)
def test_a_template_that_fails_is_one_line_naming_the_config_map(templates: Any, values: Any, message: str) -> None:
    cm = config_map(templates)
    if values is not None:
        cm["data"]["values"] = values
    config = parse_injection_config(cm)
    result = template_overlay(gateway(), SETTINGS, config, system_namespace="istio-system")
    assert isinstance(result, TemplateFailed)
    assert "istio-system/istio-sidecar-injector" in result.message
    assert message in result.message
    assert "\n" not in result.message


def test_a_config_that_is_not_yaml_fails_every_gateway() -> None:
    cm = {"metadata": {"name": "istio-sidecar-injector", "namespace": "istio-system"}, "data": {"config": "a: [b"}}
    config = parse_injection_config(cm)
    assert isinstance(config, TemplateFailed)
    assert "key 'config': not valid YAML" in config.message
    assert template_overlay(gateway(), SETTINGS, config, system_namespace="istio-system") == config


def test_the_template_cannot_rename_move_or_reown_the_objects() -> None:
    text = (
        "kind: Deployment\nmetadata: {name: other, namespace: kube-system, ownerReferences: []}\n"
        "spec: {selector: {matchLabels: {a: b}}, template: {spec: {serviceAccountName: default, hostNetwork: true}}}\n"
    )
    config = parse_injection_config(config_map({"waypoint": text}))
    assert rendered_with(config, gateway()) == render_waypoint(gateway(), SETTINGS)


def test_the_revision_names_its_own_config_map() -> None:
    assert injector_name("default") == "istio-sidecar-injector"
    assert injector_name("canary") == "istio-sidecar-injector-canary"


def _istio_file(path: str) -> str | None:
    if not MIRROR.exists():
        return None
    shown = subprocess.run(
        ["git", "-C", str(MIRROR), "show", f"HEAD:{path}"], capture_output=True, text=True, check=False
    )
    return shown.stdout if shown.returncode == 0 else None


@pytest.mark.parametrize(
    ("cls", "path"),
    [
        ("istio-waypoint", "manifests/charts/istio-control/istio-discovery/files/waypoint.yaml"),
        ("istio", "manifests/charts/istio-control/istio-discovery/files/kube-gateway.yaml"),
    ],
)
def test_istio_s_own_templates_from_the_mirror_evaluate_with_the_shipped_values(cls: str, path: str) -> None:
    text = _istio_file(path)
    if text is None:
        pytest.skip("Istio's source is not mirrored on this machine")
    config = shipped()
    name = "waypoint" if cls == "istio-waypoint" else "kube-gateway"
    istio = InjectionConfig(config.source, {name: text.replace(ANCHOR, GRACE_3)}, config.values)
    result = rendered_with(istio, gateway("gw", cls))
    alone = render_waypoint(gateway("gw", cls), SETTINGS)
    assert isinstance(alone, Rendered)
    if cls == "istio-waypoint":
        assert pod_spec(result)["terminationGracePeriodSeconds"] == 3
    assert pod_spec(result)["containers"][0]["args"] == pod_spec(alone)["containers"][0]["args"]
