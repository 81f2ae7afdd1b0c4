"""The injection templates of a Gateway's objects, as istiod reads them: the ConfigMap ``istio-sidecar-injector``
(``istio-sidecar-injector-<revision>`` for a revision) in the control plane's namespace, its ``config`` key YAML with
a ``templates:`` map of Go templates and its ``values`` key the Helm values as JSON. Pure.

Theory of operation: :func:`parse_injection_config` reads the ConfigMap once per change into an
:class:`InjectionConfig`; :func:`template_overlay` evaluates the Gateway's template (:mod:`.gotemplate`) with the
inputs istiod's deployment controller gives it (:func:`template_inputs`), reads the YAML documents it produced
and turns the fields a user customises into an :class:`~.overlay.Overlay`, which the renderer applies before the
class defaults and ``parametersRef`` overlays (istiod's order). The pod still runs Ambit's proxy: the template
chooses how the pod is scheduled and dressed, not what runs in it.

Rules:

1. The template is ``waypoint`` for class ``istio-waypoint`` and ``kube-gateway`` for class ``istio``. Without the
   ConfigMap, or without that template in it, there is no template overlay (the rendering is Ambit's alone).
   Only the template a Gateway needs is parsed: the ConfigMap may hold others (Istio's sidecar templates) that use
   functions outside the subset.
2. Taken from the rendered Deployment: its labels and annotations, its pod template's labels and annotations, the
   pod spec fields of :data:`POD_FIELDS`, and, of the container ``istio-proxy``, :data:`CONTAINER_FIELDS`. From
   the Service: labels, annotations and :data:`SERVICE_FIELDS`; from the ServiceAccount: labels and annotations.
   Everything else (the container's command, args, image, env and mounts, the volumes, the Service's ports and
   selector, the HorizontalPodAutoscaler and PodDisruptionBudget documents) stays Ambit's, so that the pod carries
   its identity, the control plane's address and Ambit's proxy whatever the template says.
3. The labels that place the objects (:func:`~ambit.controlplane.translate.gateway_pods.fixed_labels`) stay
   Ambit's; on a waypoint's pods so do ``istio.io/dataplane-mode`` and ``sidecar.istio.io/inject`` (a captured
   waypoint would steer its own traffic back into itself).
4. A config that does not parse, a template that does not parse or evaluate, or output that is not YAML
   documents of objects is a :class:`TemplateFailed` with a one-line message naming the ConfigMap and template;
   the controller reports it in the Gateway's status and leaves what was deployed as it is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

from ambit.controlplane.gateway.gotemplate import Message, Template, TemplateError, compile_template, execute
from ambit.controlplane.gateway.overlay import Overlay
from ambit.controlplane.gateway.render import (
    GATEWAY_NAME_LABEL,
    WaypointTemplateSettings,
    listener_ports,
    service_type,
)
from ambit.controlplane.gateway.revision import DEFAULT_REVISION
from ambit.controlplane.translate.gateway_pods import (
    CONTROLLER_LABEL,
    GATEWAY_CONTROLLER_LABEL,
    fixed_labels,
    infrastructure,
)
from ambit.controlplane.translate.listeners import deployed_name, is_ingress
from ambit.model import untrusted_yaml

__all__ = [
    "INJECTOR_CONFIG_MAP",
    "InjectionConfig",
    "TemplateFailed",
    "injector_name",
    "parse_injection_config",
    "template_inputs",
    "template_overlay",
]

Obj = Mapping[str, Any]

INJECTOR_CONFIG_MAP: Final = "istio-sidecar-injector"
KUBE_VERSION: Final = 130
"""``.KubeVersion`` (major*100+minor): the API the embedded server and the lab serve is 1.30's."""
POD_FIELDS: Final = (
    "terminationGracePeriodSeconds",
    "nodeSelector",
    "tolerations",
    "affinity",
    "topologySpreadConstraints",
    "securityContext",
    "imagePullSecrets",
    "priorityClassName",
    "schedulerName",
    "runtimeClassName",
    "dnsConfig",
    "dnsPolicy",
    "hostAliases",
)
"""Rule 2."""
CONTAINER_FIELDS: Final = ("resources", "securityContext", "lifecycle")
SERVICE_FIELDS: Final = (
    "type",
    "loadBalancerIP",
    "loadBalancerClass",
    "loadBalancerSourceRanges",
    "externalTrafficPolicy",
    "internalTrafficPolicy",
    "sessionAffinity",
    "ipFamilyPolicy",
)
CAPTURE_LABELS: Final = ("istio.io/dataplane-mode", "sidecar.istio.io/inject")
"""Rule 3."""
TEMPLATE_OF_INGRESS = {False: "waypoint", True: "kube-gateway"}
"""Rule 1."""


@dataclass(frozen=True, slots=True)
class TemplateFailed:
    """Rule 4: why the Gateway's template could not be used."""

    message: str


@dataclass(slots=True)
class InjectionConfig:
    """The ConfigMap, parsed: its raw templates, its values, and the templates compiled so far (rule 1)."""

    source: str
    templates: Mapping[str, str]
    values: Mapping[str, Any]
    compiled: dict[str, Template | TemplateFailed] = field(default_factory=dict)

    def template(self, name: str) -> Template | TemplateFailed | None:
        text = self.templates.get(name)
        if text is None:
            return None
        if name not in self.compiled:
            try:
                self.compiled[name] = compile_template(text)
            except TemplateError as exc:
                self.compiled[name] = TemplateFailed(f"ConfigMap {self.source} template {name!r}: {exc}")
        return self.compiled[name]


def injector_name(revision: str) -> str:
    """The ConfigMap's name for the control plane's revision."""
    return INJECTOR_CONFIG_MAP if revision in ("", DEFAULT_REVISION) else f"{INJECTOR_CONFIG_MAP}-{revision}"


def parse_injection_config(config_map: Obj) -> InjectionConfig | TemplateFailed:
    """The ConfigMap's templates and values (rule 4 on a ``config`` or ``values`` that does not parse)."""
    meta = config_map.get("metadata") or {}
    source = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    data = config_map.get("data")
    data = data if isinstance(data, Mapping) else {}
    config_text, values_text = data.get("config"), data.get("values")
    try:
        config = untrusted_yaml.load(config_text) if isinstance(config_text, str) else None
    except (yaml.YAMLError, RecursionError) as exc:
        return TemplateFailed(f"ConfigMap {source} key 'config': not valid YAML: {' '.join(str(exc).split())[:200]}")
    templates = config.get("templates") if isinstance(config, Mapping) else None
    if templates is not None and not isinstance(templates, Mapping):
        return TemplateFailed(f"ConfigMap {source} key 'config': templates must be a map of template texts")
    try:
        values = json.loads(values_text) if isinstance(values_text, str) and values_text.strip() else {}
    except (ValueError, RecursionError) as exc:
        return TemplateFailed(f"ConfigMap {source} key 'values': not valid JSON: {exc}")
    if not isinstance(values, Mapping):
        return TemplateFailed(f"ConfigMap {source} key 'values': expected a JSON object")
    texts = {str(key): text for key, text in (templates or {}).items() if isinstance(text, str)}
    return InjectionConfig(source, texts, values)


def _go_names(value: Any) -> Any:
    """A Kubernetes object's JSON in Go's field names (``gatewayClassName`` → ``GatewayClassName``)."""
    if isinstance(value, Mapping):
        return {key[:1].upper() + key[1:]: _go_names(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_go_names(item) for item in value]
    return value


def template_inputs(
    gateway: Obj, settings: WaypointTemplateSettings, values: Mapping[str, Any], *, system_namespace: str
) -> dict[str, Any]:
    """What istiod's deployment controller gives the template (its ``TemplateInput`` and derived fields)."""
    meta = gateway.get("metadata") or {}
    spec = gateway.get("spec") or {}
    ingress = is_ingress(gateway)
    name = deployed_name(gateway)
    object_meta = {
        "Name": meta.get("name"),
        "Namespace": meta.get("namespace"),
        "UID": meta.get("uid"),
        "Labels": dict(meta.get("labels") or {}),
        "Annotations": dict(meta.get("annotations") or {}),
        "Generation": meta.get("generation"),
        "ResourceVersion": meta.get("resourceVersion"),
    }
    revision = "" if settings.revision == DEFAULT_REVISION else settings.revision
    proxy_config = Message(
        {"discoveryAddress": settings.xds_address, "interceptionMode": "REDIRECT", "proxyMetadata": {}}
    )
    mesh_config = Message({"trustDomain": settings.trust_domain, "rootNamespace": system_namespace})
    return {
        **object_meta,
        "ObjectMeta": object_meta,
        "TypeMeta": {"Kind": "Gateway", "APIVersion": gateway.get("apiVersion")},
        "Kind": "Gateway",
        "APIVersion": gateway.get("apiVersion"),
        "Spec": _go_names(spec),
        "Status": _go_names(gateway.get("status") or {}),
        "GatewayClass": spec.get("gatewayClassName") if isinstance(spec, Mapping) else None,
        "DeploymentName": name,
        "ServiceAccount": name,
        "Ports": [
            {
                "Name": port["name"],
                "Port": port["port"],
                "Protocol": port["protocol"],
                "AppProtocol": port["appProtocol"],
            }
            for port in listener_ports(gateway)
        ],
        "ServiceType": service_type(gateway, ingress),
        "ClusterID": settings.cluster_id,
        "KubeVersion": KUBE_VERSION,
        "Revision": revision,
        "NativeSidecars": False,
        "ProxyUID": 1337,
        "ProxyGID": 1337,
        "CompliancePolicy": "",
        "InfrastructureLabels": infrastructure(gateway, "labels"),
        "InfrastructureAnnotations": infrastructure(gateway, "annotations"),
        "GatewayNameLabel": GATEWAY_NAME_LABEL,
        "IsEastWestGateway": False,
        "ControllerLabel": GATEWAY_CONTROLLER_LABEL if ingress else CONTROLLER_LABEL,
        "ProxyImage": settings.image,
        "AgentgatewayImage": settings.image,
        "ProxyConfig": proxy_config,
        "MeshConfig": mesh_config,
        "Values": values,
    }


def _pick(source: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: source[key] for key in keys if isinstance(source, Mapping) and key in source}


def _meta_patch(obj: Obj, drop: frozenset[str] = frozenset()) -> dict[str, Any]:
    meta = obj.get("metadata")
    out: dict[str, Any] = {}
    for key in ("labels", "annotations"):
        found = meta.get(key) if isinstance(meta, Mapping) else None
        if isinstance(found, Mapping):
            kept = {k: v for k, v in found.items() if k not in drop}
            if kept:
                out[key] = kept
    return out


def _deployment_patch(doc: Obj, fixed: frozenset[str], pod_fixed: frozenset[str]) -> dict[str, Any]:
    patch: dict[str, Any] = {}
    if meta := _meta_patch(doc, fixed):
        patch["metadata"] = meta
    spec = doc.get("spec")
    template = spec.get("template") if isinstance(spec, Mapping) else None
    pod_spec = template.get("spec") if isinstance(template, Mapping) else None
    pod: dict[str, Any] = {}
    if isinstance(template, Mapping) and (pod_meta := _meta_patch(template, pod_fixed)):
        pod["metadata"] = pod_meta
    fields = _pick(pod_spec, POD_FIELDS)
    containers = pod_spec.get("containers") if isinstance(pod_spec, Mapping) else None
    for container in containers if isinstance(containers, list) else ():
        is_proxy = isinstance(container, Mapping) and container.get("name") == "istio-proxy"
        if is_proxy and (picked := _pick(container, CONTAINER_FIELDS)):
            fields["containers"] = [{"name": "istio-proxy", **picked}]
    if fields:
        pod["spec"] = fields
    if pod:
        patch["spec"] = {"template": pod}
    return patch


def _overlay_of(docs: list[Any], gateway: Obj, where: str) -> Overlay:
    fixed = frozenset(fixed_labels(gateway))
    pod_fixed = fixed if is_ingress(gateway) else fixed | frozenset(CAPTURE_LABELS)
    data: dict[str, str] = {}
    for doc in docs:
        if doc is None:
            continue
        if not isinstance(doc, Mapping):
            raise ValueError(f"a document is a {type(doc).__name__}, not an object")
        kind = doc.get("kind")
        if kind == "Deployment":
            patch = _deployment_patch(doc, fixed, pod_fixed)
        elif kind == "Service":
            patch = {**({"metadata": m} if (m := _meta_patch(doc, fixed)) else {})}
            if picked := _pick(doc.get("spec"), SERVICE_FIELDS):
                patch["spec"] = picked
        elif kind == "ServiceAccount":
            patch = {"metadata": m} if (m := _meta_patch(doc, fixed)) else {}
        else:
            continue  # rule 2: the autoscaler and disruption budget stay the overlays' to ask for
        if patch:
            data[kind[:1].lower() + kind[1:]] = json.dumps(patch)
    return Overlay(where, data)


def template_overlay(
    gateway: Obj,
    settings: WaypointTemplateSettings,
    config: InjectionConfig | TemplateFailed | None,
    *,
    system_namespace: str,
) -> Overlay | TemplateFailed | None:
    """The Gateway's template overlay (rules 1-4); None without a template."""
    if config is None or isinstance(config, TemplateFailed):
        return config
    name = TEMPLATE_OF_INGRESS[is_ingress(gateway)]
    template = config.template(name)
    if template is None or isinstance(template, TemplateFailed):
        return template
    where = f"{config.source} template {name!r}"
    try:
        text = execute(template, template_inputs(gateway, settings, config.values, system_namespace=system_namespace))
    except TemplateError as exc:
        return TemplateFailed(f"ConfigMap {where}: {exc}")
    try:
        docs = untrusted_yaml.load_all(text)
        return _overlay_of(docs, gateway, where)
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        problem = " ".join(str(exc).split())[:300] if not isinstance(exc, RecursionError) else "nested too deeply"
        return TemplateFailed(f"ConfigMap {where}: its output is not YAML objects: {problem}")
