"""What a Gateway deploys: its ServiceAccount, Deployment and Service, as istiod's waypoint and gateway templates
render them (spec §1.1, §1.4, §1.5), with Ambit's waypoint or gateway command in the pod.

Theory of operation: :func:`render_waypoint` takes one Gateway (the API dict) and the
:class:`WaypointTemplateSettings` and returns either a :class:`Rendered` (the three objects, as plain dicts ready
to send) or an :class:`Unrenderable` naming what is wrong with the Gateway. Pure: no I/O, no clock; equal inputs
give equal outputs.

Rules:

1. Gateways of class ``istio-waypoint`` (a waypoint) and ``istio`` (an ingress gateway) are rendered; the caller
   filters, and any other class renders as a waypoint.
2. The three objects live in the Gateway's namespace, named after it: a waypoint's objects carry the Gateway's
   name, an ingress gateway's ``<name>-istio`` (istiod's ``<name>-<class>``). That name must be a DNS-1035 label
   (at most 63 characters, a lower-case letter first), because it names a Service; any other name is
   :class:`Unrenderable`. So is a Gateway without a uid (nothing could own the objects).
3. Every object carries an owner reference to the Gateway (``controller: true``), so that deleting the Gateway
   deletes them (the API server's garbage collector), and the labels ``gateway.networking.k8s.io/gateway-name``,
   ``gateway.networking.k8s.io/gateway-class-name`` and ``gateway.istio.io/managed`` (``istio.io-mesh-controller``
   for a waypoint, ``istio.io-gateway-controller`` for an ingress gateway: the mark that lets the controller
   update an object that already exists, :mod:`.apply`). An ingress gateway's pods also carry
   ``istio.io/gateway-name`` (Istio's older selector label). The labels are computed in
   :mod:`ambit.controlplane.translate.gateway_pods`, which the policy translation reads too (a policy's
   ``selector`` sees exactly these pod labels).
4. Infrastructure labels and annotations are those of ``spec.infrastructure`` when it has them, else the
   Gateway's own (istiod copies them); keys under ``gateway.networking.k8s.io/`` and istiod's own control
   annotations are dropped, non-string values are ignored. The fixed labels of rule 3 win over copied ones. On a
   waypoint's pods, ``istio.io/dataplane-mode: none`` and ``sidecar.istio.io/inject: "false"`` win too (istiod lets
   a copied label override them; a waypoint captured by the node proxy would steer its own traffic back into
   itself); on an ingress gateway's they are defaults a copied label overrides, as in istiod's template (a
   Gateway labelled ``istio.io/dataplane-mode: ambient`` gets captured pods: a "sandwich").
5. The Service has port ``status-port`` 15021 (appProtocol ``tcp``) and one port per distinct listener port
   (the standard waypoint: ``mesh`` 15008, appProtocol ``hbone``); a listener whose port is not an integer in
   1-65535 adds none. Its selector, like the Deployment's, is the gateway-name label. A waypoint's Service is a
   ``ClusterIP``; an ingress gateway's a ``LoadBalancer`` (reached from outside the cluster). The Gateway's
   annotation ``networking.istio.io/service-type`` (``ClusterIP``, ``NodePort`` or ``LoadBalancer``) sets the
   type of either, as istiod's deployment controller reads it; any other value is :class:`Unrenderable`. A
   ``LoadBalancer`` asks for the Gateway's static address as its ``loadBalancerIP`` when the Gateway has exactly
   one, of type ``IPAddress`` (any other address makes a manual deployment, which is not rendered:
   :mod:`.static_addresses` rule 1), as istiod's templates do.
6. The Deployment never sets ``replicas`` (the API server defaults 1; whatever a user or autoscaler sets later
   stays). Its pod runs container ``istio-proxy``: ``ambit waypoint proxy`` (``ambit gateway`` for an ingress
   gateway, told its Gateway's name in ``GATEWAY_NAME``) with the control plane's address, the
   projected token (audience ``istio-ca``) and the ``istio-ca-root-cert`` ConfigMap mounted as the node proxy
   mounts them, no API credentials (``automountServiceAccountToken: false``), readiness on ``:15021
   /healthz/ready``, the restricted pod security profile (non-root 1337, no capabilities, read-only root), and
   istiod's ``terminationGracePeriodSeconds: 30``. An ingress gateway's pod also sets the sysctl
   ``net.ipv4.ip_unprivileged_port_start: "0"``, as istiod's ``kube-gateway`` template does, so that it can
   listen on a port below 1024 (port 80) without a capability.
7. Overlays (the injection template's, :mod:`.injection`; then, :mod:`.overlay`, the class defaults ConfigMap and
   the ``parametersRef`` one, in the order given) are applied last, as strategic merge patches; they may also
   deploy a HorizontalPodAutoscaler (``maxReplicas: 1``, scaling the Deployment) and a PodDisruptionBudget
   (selecting the pods by the gateway-name label), which are rendered with the same metadata but deployed only
   when an overlay names them. An overlay that cannot be applied makes the
   Gateway :class:`Unrenderable` with the overlay's message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.gateway.overlay import Overlay, OverlayError, apply_overlays
from ambit.controlplane.gateway.revision import DEFAULT_REVISION, REVISION_LABEL
from ambit.controlplane.translate.gateway_pods import (
    CONTROLLER_LABEL,
    GATEWAY_CLASS_LABEL,
    GATEWAY_CONTROLLER,
    GATEWAY_CONTROLLER_LABEL,
    GATEWAY_NAME_LABEL,
    MANAGED_LABEL,
    MESH_CONTROLLER,
    fixed_labels,
    infrastructure,
    pod_labels,
)
from ambit.controlplane.translate.listeners import INGRESS_CLASS, deployed_name, is_ingress

__all__ = [
    "CONTROLLER_LABEL",
    "GATEWAY_CLASS_LABEL",
    "GATEWAY_CONTROLLER",
    "GATEWAY_CONTROLLER_LABEL",
    "GATEWAY_NAME_LABEL",
    "INGRESS_CLASS",
    "MANAGED_LABEL",
    "MESH_CONTROLLER",
    "Rendered",
    "Unrenderable",
    "WaypointTemplateSettings",
    "deployed_name",
    "is_ingress",
    "listener_ports",
    "render_waypoint",
    "service_hostname",
    "service_type",
]

Obj = Mapping[str, Any]

GATEWAY_API_VERSION = "gateway.networking.k8s.io/v1"
STATUS_PORT = 15021
METRICS_PORT = 15020
PROXY_UID = 1337
ROOT_CERT_PATH = "/var/run/secrets/istio/root-cert.pem"
TOKEN_PATH = "/var/run/secrets/tokens/istio-token"

_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_PORT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True, slots=True)
class WaypointTemplateSettings:
    """What the control plane puts into every waypoint Deployment."""

    xds_address: str = "istiod.istio-system.svc:15012"
    """HOST:PORT the waypoint pods dial for xDS and the CA (the control plane's ``--waypoint-xds-address``)."""
    image: str = "ambit"
    image_pull_policy: str | None = None
    """``Never`` in the lab (its containers run commands, not images); None leaves the cluster's default."""
    cluster_id: str = "Kubernetes"
    trust_domain: str = "cluster.local"
    domain: str = "cluster.local"
    """The cluster's DNS domain: the waypoint Service's hostname is ``<name>.<namespace>.svc.<domain>``."""
    revision: str = DEFAULT_REVISION
    """The control plane's revision: its pods' ``istio.io/rev``; the controller leaves Gateways of another revision
    (label ``istio.io/rev`` on the Gateway or its namespace) alone."""
    http10: bool = False
    """The control plane's ``PILOT_HTTP10``: its pods get ``PILOT_HTTP10=true`` and serve HTTP/1.0 (istiod turns on
    ``accept_http_10`` in every proxy's listeners instead; a pod deployed by hand needs the variable itself)."""


@dataclass(frozen=True, slots=True)
class Rendered:
    """The objects one waypoint Gateway deploys, in the order they are applied."""

    service_account: dict[str, Any]
    deployment: dict[str, Any]
    service: dict[str, Any]
    autoscaler: dict[str, Any] | None = None
    """The HorizontalPodAutoscaler, deployed only when an overlay names it (rule 7)."""
    disruption_budget: dict[str, Any] | None = None
    """The PodDisruptionBudget, likewise."""

    def objects(self) -> tuple[dict[str, Any], ...]:
        optional = (self.autoscaler, self.disruption_budget)
        return (self.service_account, self.deployment, self.service, *(o for o in optional if o is not None))


@dataclass(frozen=True, slots=True)
class Unrenderable:
    """The Gateway cannot be deployed; ``message`` says why, for its status."""

    message: str


def service_hostname(name: str, namespace: str, domain: str) -> str:
    return f"{name}.{namespace}.svc.{domain}"


def listener_ports(gateway: Obj, extra: Sequence[Obj] = ()) -> list[dict[str, Any]]:
    """Rule 5: the Service's ports; ``extra`` are the listeners of the ListenerSets the Gateway admits, whose
    ports the Service opens too, after the Gateway's own (as istiod's deployment controller does)."""
    ports: list[dict[str, Any]] = [
        {"name": "status-port", "port": STATUS_PORT, "protocol": "TCP", "appProtocol": "tcp"}
    ]
    used_names, used_ports = {"status-port"}, {STATUS_PORT}
    spec = gateway.get("spec") or {}
    listeners = spec.get("listeners") if isinstance(spec, Mapping) else None
    for listener in [*(listeners if isinstance(listeners, list) else ()), *extra]:
        if not isinstance(listener, Mapping):
            continue
        port, protocol = listener.get("port"), listener.get("protocol")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535 or port in used_ports:
            continue
        protocol = protocol.lower() if isinstance(protocol, str) and protocol.isascii() else "tcp"
        name = listener.get("name")
        if not isinstance(name, str) or not _PORT_NAME.fullmatch(name) or name in used_names:
            name = f"port-{port}"
        used_names.add(name)
        used_ports.add(port)
        ports.append({"name": name, "port": port, "protocol": "TCP", "appProtocol": protocol or "tcp"})
    return ports


def _field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _container(
    name: str, gateway_name: str, namespace: str, settings: WaypointTemplateSettings, ingress: bool
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "istio-proxy",
        "image": settings.image,
        "command": ["ambit"],
        "args": [
            *(["gateway"] if ingress else ["waypoint", "proxy"]),
            "--xds-address=$(XDS_ADDRESS)",
            "--ca-address=$(CA_ADDRESS)",
            f"--root-cert={ROOT_CERT_PATH}",
            f"--token={TOKEN_PATH}",
            "--cluster-id=$(CLUSTER_ID)",
        ],
        "env": [
            {"name": "XDS_ADDRESS", "value": settings.xds_address},
            {"name": "CA_ADDRESS", "value": settings.xds_address},
            {"name": "CLUSTER_ID", "value": settings.cluster_id},
            {"name": "TRUST_DOMAIN", "value": settings.trust_domain},
            {"name": "GATEWAY_NAME", "value": gateway_name},
            _field("POD_NAME", "metadata.name"),
            _field("POD_NAMESPACE", "metadata.namespace"),
            _field("INSTANCE_IP", "status.podIP"),
            _field("INSTANCE_IPS", "status.podIPs"),
            _field("SERVICE_ACCOUNT", "spec.serviceAccountName"),
            _field("NODE_NAME", "spec.nodeName"),
            _field("HOST_IP", "status.hostIP"),
            {"name": "ISTIO_META_CLUSTER_ID", "value": settings.cluster_id},
            {"name": "ISTIO_META_WORKLOAD_NAME", "value": name},
            {
                "name": "ISTIO_META_OWNER",
                "value": f"kubernetes://apis/apps/v1/namespaces/{namespace}/deployments/{name}",
            },
            {"name": "ISTIO_META_MESH_ID", "value": settings.trust_domain},
            # HBONE on the socket TLS transport with its records and DATA frames in C where they load, as the node
            # proxy runs it (the waypoint's loopback bench: 2-4 % less CPU per saturated request, the same at 1,000/s).
            {"name": "HBONE_TLS_TRANSPORT", "value": "socket"},
            {"name": "AMBIT_NATIVE_DATA", "value": "1"},
            *([{"name": "PILOT_HTTP10", "value": "true"}] if settings.http10 else []),
        ],
        "ports": [
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
            {"name": "status-port", "containerPort": STATUS_PORT, "protocol": "TCP"},
        ],
        "startupProbe": {
            "httpGet": {"path": "/healthz/ready", "port": STATUS_PORT, "scheme": "HTTP"},
            "initialDelaySeconds": 1,
            "periodSeconds": 1,
            "failureThreshold": 30,
            "timeoutSeconds": 1,
        },
        "readinessProbe": {
            "httpGet": {"path": "/healthz/ready", "port": STATUS_PORT, "scheme": "HTTP"},
            "periodSeconds": 15,
            "failureThreshold": 4,
            "timeoutSeconds": 1,
        },
        "securityContext": {
            "privileged": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": PROXY_UID,
            "runAsGroup": PROXY_UID,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "istio-token", "mountPath": "/var/run/secrets/tokens"},
            {"name": "istiod-ca-cert", "mountPath": "/var/run/secrets/istio"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    if settings.image_pull_policy is not None:
        container["imagePullPolicy"] = settings.image_pull_policy
    return container


SERVICE_TYPE_ANNOTATION = "networking.istio.io/service-type"
UNPRIVILEGED_PORTS_SYSCTL = "net.ipv4.ip_unprivileged_port_start"
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")


def _annotation(gateway: Obj, key: str) -> object:
    meta = gateway.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return annotations.get(key) if isinstance(annotations, Mapping) else None


def service_type(gateway: Obj, ingress: bool) -> str | None:
    """Rule 5: the generated Service's type; None for an annotation that names no type."""
    value = _annotation(gateway, SERVICE_TYPE_ANNOTATION)
    if value is None:
        return "LoadBalancer" if ingress else "ClusterIP"
    return value if isinstance(value, str) and value in SERVICE_TYPES else None


def _static_ip(gateway: Obj) -> str | None:
    """Rule 5: the value of the Gateway's one address of type ``IPAddress`` (the CRD's default type), if any."""
    spec = gateway.get("spec")
    addresses = spec.get("addresses") if isinstance(spec, Mapping) else None
    if not isinstance(addresses, list) or len(addresses) != 1 or not isinstance(addresses[0], Mapping):
        return None
    value = addresses[0].get("value")
    return value if addresses[0].get("type") in (None, "IPAddress") and isinstance(value, str) and value else None


def render_waypoint(
    gateway: Obj,
    settings: WaypointTemplateSettings,
    overlays: Sequence[Overlay] = (),
    extra_listeners: Sequence[Obj] = (),
) -> Rendered | Unrenderable:
    """The ServiceAccount, Deployment and Service of one waypoint or ingress Gateway, with ``overlays`` applied
    (rules 1-7)."""
    meta = gateway.get("metadata") or {}
    gateway_name, namespace, uid = meta.get("name"), meta.get("namespace"), meta.get("uid")
    ingress = is_ingress(gateway)
    name = deployed_name(gateway) if isinstance(gateway_name, str) else gateway_name
    if not isinstance(name, str) or not isinstance(gateway_name, str) or not _DNS1035_LABEL.fullmatch(name):
        shown = name[:80] if isinstance(name, str) else repr(name)
        return Unrenderable(
            f"the name {shown!r} cannot name the {'gateway' if ingress else 'waypoint'}'s Service: it must be a "
            "DNS-1035 label (at most 63 characters: lower-case letters, digits and '-', starting with a letter)"
        )
    if not isinstance(namespace, str) or not namespace or not isinstance(uid, str) or not uid:
        return Unrenderable("the Gateway has no namespace or uid")
    owner = {
        "apiVersion": GATEWAY_API_VERSION,
        "kind": "Gateway",
        "name": gateway_name,
        "uid": uid,
        "controller": True,
    }
    type_of_service = service_type(gateway, ingress)
    if type_of_service is None:
        return Unrenderable(
            f"the annotation {SERVICE_TYPE_ANNOTATION} must be one of {', '.join(SERVICE_TYPES)}, not "
            f"{str(_annotation(gateway, SERVICE_TYPE_ANNOTATION))[:40]!r}"
        )
    labels = {**infrastructure(gateway, "labels"), **fixed_labels(gateway)}
    annotations = infrastructure(gateway, "annotations")

    def metadata(extra_annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
        merged = {**(extra_annotations or {}), **annotations}
        if merged:  # an empty map is not stored: rendering one would look like a difference on every pass
            out["annotations"] = merged
        out["ownerReferences"] = [dict(owner)]
        return out

    selector = {GATEWAY_NAME_LABEL: gateway_name}
    labels_of_pods = pod_labels(gateway)
    pod_annotations = {
        **annotations,
        REVISION_LABEL: settings.revision or DEFAULT_REVISION,
        "prometheus.io/path": "/stats/prometheus",
        "prometheus.io/port": str(METRICS_PORT),
        "prometheus.io/scrape": "true",
    }
    service_account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata()}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(),
        "spec": {
            "selector": {"matchLabels": dict(selector)},
            "template": {
                "metadata": {"labels": labels_of_pods, "annotations": pod_annotations},
                "spec": {
                    "serviceAccountName": name,
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 30,
                    **(
                        {"securityContext": {"sysctls": [{"name": UNPRIVILEGED_PORTS_SYSCTL, "value": "0"}]}}
                        if ingress
                        else {}
                    ),
                    "containers": [_container(name, gateway_name, namespace, settings, ingress)],
                    "volumes": [
                        {
                            "name": "istio-token",
                            "projected": {
                                "sources": [
                                    {
                                        "serviceAccountToken": {
                                            "audience": "istio-ca",
                                            "expirationSeconds": 43200,
                                            "path": "istio-token",
                                        }
                                    }
                                ]
                            },
                        },
                        {"name": "istiod-ca-cert", "configMap": {"name": "istio-ca-root-cert"}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }
    service_spec: dict[str, Any] = {
        "type": type_of_service,
        "ipFamilyPolicy": "PreferDualStack",
        "ports": listener_ports(gateway, extra_listeners),
        "selector": dict(selector),
    }
    if type_of_service == "LoadBalancer" and (ip := _static_ip(gateway)):
        service_spec["loadBalancerIP"] = ip
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata({"networking.istio.io/traffic-distribution": "PreferClose"}),
        "spec": service_spec,
    }
    autoscaler = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(),
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}, "maxReplicas": 1},
    }
    disruption_budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(),
        "spec": {"selector": {"matchLabels": dict(selector)}},
    }
    try:
        objects = apply_overlays((service_account, deployment, service, autoscaler, disruption_budget), overlays)
    except OverlayError as exc:
        return Unrenderable(str(exc))
    by_kind = {obj["kind"]: obj for obj in objects}
    return Rendered(
        by_kind["ServiceAccount"],
        by_kind["Deployment"],
        by_kind["Service"],
        by_kind.get("HorizontalPodAutoscaler"),
        by_kind.get("PodDisruptionBudget"),
    )
