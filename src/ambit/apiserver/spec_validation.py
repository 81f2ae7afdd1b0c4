"""Per-kind checks of an object's body (``spec``, ``data``...), called by ``validation.validate_object``.

Theory of operation: each ``validate_*`` function takes the whole object and returns its causes;
``validation.SPEC_RULES`` says which kinds each one checks. Each rule reads the object defensively: a field of
the wrong type is one cause and the rule moves on, so one request reports every problem at once, as
kube-apiserver does. Defaults the server has not filled in yet are assumed (a Service without ``type`` is
ClusterIP, a port without ``protocol`` is TCP).

Rules kept (a deliberate subset of kube-apiserver's):

- Pod and pod templates: at least one container; container names are unique DNS labels; images are given;
  container ports are 1-65535 with a supported protocol; env names are well formed; tolerations and node
  affinity as :mod:`placement_validation` says; a ``seccompProfile`` (pod or container) has a known type and a
  ``localhostProfile`` exactly when it is ``Localhost``, relative and without ``..``; ``hostUsers: false`` is
  forbidden with ``hostNetwork``, ``hostPID`` or ``hostIPC`` (kube's field paths, ``HostPID`` capitalised).
- Deployment, ReplicaSet, DaemonSet, StatefulSet: a non-empty selector that matches the template's labels,
  ``restartPolicy: Always``, a pod template that passes the pod rules, no negative replicas.
- Service: a supported type; ports 1-65535, supported protocols, names unique and required when several;
  nodePort only where the type allows it; ExternalName services name a DNS host.
- ConfigMap and Secret: keys like ``[-._a-zA-Z0-9]+``; Secret ``data`` values are base64; typed Secrets
  carry their required keys; at most 1 MiB of data.
- EndpointSlice: a supported address type, addresses on every endpoint.

CustomResourceDefinitions have their own module, ``crd_validation``.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Mapping
from typing import Any

from ambit.apiserver.names import (
    Cause,
    at,
    dns1123_label,
    dns1123_subdomain,
    duplicate,
    forbidden,
    invalid,
    label_value,
    qualified_name,
    required,
    too_long,
    unsupported,
    validate_labels,
)
from ambit.apiserver.placement_validation import validate_affinity, validate_tolerations
from ambit.apiserver.shapes import as_object, is_int, object_items
from ambit.model.dnsname import is_ip
from ambit.model.labels import selector_from_spec

SpecRule = Callable[[Mapping[str, Any]], list[Cause]]

DATA_MAX_BYTES = 1024 * 1024
PROTOCOLS = ("SCTP", "TCP", "UDP")
_PORT_RANGE = "must be between 1 and 65535, inclusive"
_CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_IANA_SERVICE_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")


def _port(value: Any, path: str, *, optional: bool = False) -> list[Cause]:
    if value is None and optional:
        return []
    if value is None:
        return [required(path)]
    if not is_int(value) or not 1 <= value <= 65535:
        return [invalid(path, value, _PORT_RANGE)]
    return []


def _protocol(port: Mapping[str, Any], path: str) -> list[Cause]:
    protocol = port.get("protocol")
    if protocol is None or protocol in PROTOCOLS:
        return []
    return [unsupported(at(path, "protocol"), protocol, PROTOCOLS)]


def iana_service_name(value: str) -> list[str]:
    """The IANA service-name rule of a named port (kube's IsValidPortName): each broken part as a message."""
    found = []
    if len(value) > 15:
        found.append("must be no more than 15 characters")
    if not _IANA_SERVICE_NAME.fullmatch(value):
        found.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if "--" in value:
        found.append("must not contain consecutive hyphens")
    if not re.search("[a-z]", value):
        found.append("must contain at least one letter (a-z)")
    return found


def _label_rule(check: Callable[[str], list[str]], value: Any, path: str) -> list[Cause]:
    if not isinstance(value, str):
        return [invalid(path, value, "must be a string")]
    return [invalid(path, value, msg) for msg in check(value)]


# ---- pods ------------------------------------------------------------------------------------------------


def validate_pod_spec(spec: Any, path: str) -> list[Cause]:
    causes: list[Cause] = []
    if spec is None:
        return [required(path)]
    spec = as_object(spec, path, causes)
    if causes:
        return causes
    names: set[str] = set()
    containers = spec.get("containers")
    if containers is None or containers == []:
        causes.append(required(at(path, "containers")))
    for kind in ("initContainers", "containers"):
        for item_path, container in object_items(spec.get(kind), at(path, kind), causes):
            causes.extend(_container(container, item_path, names, init=kind == "initContainers"))
    policy = spec.get("restartPolicy")
    if policy is not None and policy not in ("Always", "OnFailure", "Never"):
        causes.append(unsupported(at(path, "restartPolicy"), policy, ("Always", "Never", "OnFailure")))
    volume_names: set[str] = set()
    for item_path, volume in object_items(spec.get("volumes"), at(path, "volumes"), causes):
        name = volume.get("name")
        causes.extend(_label_rule(dns1123_label, name, at(item_path, "name")))
        if isinstance(name, str) and name in volume_names:
            causes.append(duplicate(at(item_path, "name"), name))
        volume_names.add(name if isinstance(name, str) else "")
    causes.extend(validate_labels(spec.get("nodeSelector"), at(path, "nodeSelector")))
    causes.extend(validate_tolerations(spec.get("tolerations"), at(path, "tolerations")))
    causes.extend(validate_affinity(spec.get("affinity"), at(path, "affinity")))
    for key in ("priority",):
        if spec.get(key) is not None and not is_int(spec.get(key)):
            causes.append(invalid(at(path, key), spec.get(key), "must be an integer"))
    account = spec.get("serviceAccountName")
    if account not in (None, ""):
        causes.extend(_label_rule(dns1123_subdomain, account, at(path, "serviceAccountName")))
    context = spec.get("securityContext")
    if isinstance(context, Mapping):
        causes.extend(
            _seccomp_profile(context.get("seccompProfile"), at(at(path, "securityContext"), "seccompProfile"))
        )
    if spec.get("hostUsers") is False:
        for key, shown in (("hostNetwork", "hostNetwork"), ("hostPID", "HostPID"), ("hostIPC", "HostIPC")):
            if spec.get(key) is True:
                causes.append(forbidden(at(path, shown), "when `pod.Spec.HostUsers` is false"))
    return causes


SECCOMP_TYPES = ("Localhost", "RuntimeDefault", "Unconfined")


def _seccomp_profile(profile: Any, path: str) -> list[Cause]:
    if profile is None:
        return []
    if not isinstance(profile, Mapping):
        return [invalid(path, profile, "must be an object")]
    kind, local = profile.get("type"), profile.get("localhostProfile")
    causes: list[Cause] = []
    if kind in (None, ""):
        causes.append(required(at(path, "type"), "type is required when seccompProfile is set"))
    elif kind not in SECCOMP_TYPES:
        causes.append(unsupported(at(path, "type"), kind, SECCOMP_TYPES))
    if kind != "Localhost":
        if local is not None:
            causes.append(
                invalid(at(path, "localhostProfile"), local, "can only be set when seccomp type is Localhost")
            )
        return causes
    if local is None:
        return [*causes, required(at(path, "localhostProfile"), "must be set when seccomp type is Localhost")]
    if not isinstance(local, str):
        return [*causes, invalid(at(path, "localhostProfile"), local, "must be a string")]
    if local.startswith("/"):
        causes.append(invalid(at(path, "localhostProfile"), local, "must be a relative path"))
    if ".." in local.split("/"):
        causes.append(invalid(at(path, "localhostProfile"), local, "must not contain '..'"))
    return causes


def _container(container: Mapping[str, Any], path: str, names: set[str], *, init: bool) -> list[Cause]:
    causes: list[Cause] = []
    name = container.get("name")
    if name in (None, ""):
        causes.append(required(at(path, "name")))
    else:
        causes.extend(_label_rule(dns1123_label, name, at(path, "name")))
        if isinstance(name, str) and name in names:
            causes.append(duplicate(at(path, "name"), name))
        names.add(str(name))
    image = container.get("image")
    if image in (None, ""):
        causes.append(required(at(path, "image")))
    elif not isinstance(image, str) or image != image.strip():
        causes.append(invalid(at(path, "image"), image, "must be a string without surrounding whitespace"))
    for key in ("command", "args"):
        value = container.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            causes.append(invalid(at(path, key), value, "must be a list of strings"))
    port_names: set[str] = set()
    for port_path, port in object_items(container.get("ports"), at(path, "ports"), causes):
        causes.extend(_port(port.get("containerPort"), at(port_path, "containerPort")))
        causes.extend(_protocol(port, port_path))
        host_port = port.get("hostPort")
        if host_port not in (None, 0):
            causes.extend(_port(host_port, at(port_path, "hostPort")))
        port_name = port.get("name")
        if port_name not in (None, ""):
            causes.extend(_label_rule(iana_service_name, port_name, at(port_path, "name")))
            if isinstance(port_name, str) and port_name in port_names:
                causes.append(duplicate(at(port_path, "name"), port_name))
            port_names.add(str(port_name))
    for env_path, env in object_items(container.get("env"), at(path, "env"), causes):
        env_name = env.get("name")
        if env_name in (None, ""):
            causes.append(required(at(env_path, "name")))
        elif not isinstance(env_name, str) or not _ENV_NAME.fullmatch(env_name):
            causes.append(
                invalid(
                    at(env_path, "name"),
                    env_name,
                    "a valid environment variable name must consist of alphabetic characters, digits, '_', "
                    "'-', or '.', and must not start with a digit",
                )
            )
        if env.get("value") is not None and not isinstance(env.get("value"), str):
            causes.append(invalid(at(env_path, "value"), env.get("value"), "must be a string"))
    context = container.get("securityContext")
    if isinstance(context, Mapping):
        causes.extend(
            _seccomp_profile(context.get("seccompProfile"), at(at(path, "securityContext"), "seccompProfile"))
        )
    policy = container.get("restartPolicy")
    if policy is not None and not (init and policy == "Always"):
        allowed = "may only be 'Always', and only for init containers (sidecars)"
        causes.append(forbidden(at(path, "restartPolicy"), allowed))
    return causes


def validate_pod(obj: Mapping[str, Any]) -> list[Cause]:
    return validate_pod_spec(obj.get("spec"), "spec")


# ---- workloads -------------------------------------------------------------------------------------------


def validate_label_selector(selector: Any, path: str) -> list[Cause]:
    causes: list[Cause] = []
    selector = as_object(selector, path, causes)
    causes.extend(validate_labels(selector.get("matchLabels"), at(path, "matchLabels")))
    operators = ("DoesNotExist", "Exists", "In", "NotIn")
    for expr_path, expr in object_items(selector.get("matchExpressions"), at(path, "matchExpressions"), causes):
        key = expr.get("key")
        causes.extend(_label_rule(qualified_name, key, at(expr_path, "key")))
        op = expr.get("operator")
        if op not in operators:
            causes.append(unsupported(at(expr_path, "operator"), op, operators))
        values = expr.get("values")
        if values is not None and not (isinstance(values, list) and all(isinstance(v, str) for v in values)):
            causes.append(invalid(at(expr_path, "values"), values, "must be a list of strings"))
        elif op in ("In", "NotIn") and not values:
            causes.append(required(at(expr_path, "values"), "must be specified when `operator` is 'In' or 'NotIn'"))
        elif op in ("Exists", "DoesNotExist") and values:
            causes.append(
                forbidden(at(expr_path, "values"), "may not be specified when `operator` is 'Exists' or 'DoesNotExist'")
            )
        for i, value in enumerate(values if isinstance(values, list) else []):
            if isinstance(value, str):
                causes.extend(invalid(at(at(expr_path, "values"), i), value, m) for m in label_value(value))
    return causes


def validate_workload(obj: Mapping[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    spec = obj.get("spec")
    if spec is None:
        return [required("spec")]
    spec = as_object(spec, "spec", causes)
    replicas = spec.get("replicas")
    if replicas is not None and (not is_int(replicas) or replicas < 0):
        causes.append(invalid("spec.replicas", replicas, "must be greater than or equal to 0"))
    selector = spec.get("selector")
    if selector is None:
        causes.append(required("spec.selector"))
    causes.extend(validate_pod_template(spec, "spec", ("Always",)))
    return causes


def validate_pod_template(spec: Mapping[str, Any], path: str, restart_policies: tuple[str, ...]) -> list[Cause]:
    """A workload spec's ``selector`` (when given: not empty, well formed, matching the template's labels) and
    ``template`` (required; a pod template whose ``restartPolicy`` is one of ``restart_policies``)."""
    causes: list[Cause] = []
    selector = spec.get("selector")
    selector_path = at(path, "selector")
    if selector is None:
        pass
    elif not isinstance(selector, Mapping) or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        causes.append(invalid(selector_path, selector, "empty selector is invalid for this resource"))
    else:
        causes.extend(validate_label_selector(selector, selector_path))
    template = spec.get("template")
    if template is None:
        return [*causes, required(at(path, "template"))]
    template = as_object(template, at(path, "template"), causes)
    meta = as_object(template.get("metadata"), at(path, "template.metadata"), causes)
    labels = meta.get("labels")
    labels_path = at(path, "template.metadata.labels")
    causes.extend(validate_labels(labels, labels_path))
    # As Kubernetes: a malformed selector has its own causes above, and is not matched against the labels.
    well_formed = selector_from_spec(selector)
    if (
        well_formed is not None
        and isinstance(labels if labels is not None else {}, Mapping)
        and not well_formed.matches(labels or {})
    ):
        causes.append(invalid(labels_path, labels, "`selector` does not match template `labels`"))
    pod_spec = template.get("spec")
    pod_path = at(path, "template.spec")
    causes.extend(validate_pod_spec(pod_spec, pod_path))
    if isinstance(pod_spec, Mapping) and pod_spec.get("restartPolicy") not in (None, *restart_policies):
        causes.append(unsupported(at(pod_path, "restartPolicy"), pod_spec.get("restartPolicy"), restart_policies))
    return causes


# ---- services --------------------------------------------------------------------------------------------

SERVICE_TYPES = ("ClusterIP", "ExternalName", "LoadBalancer", "NodePort")


def validate_service(obj: Mapping[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    spec = as_object(obj.get("spec"), "spec", causes)
    kind = spec.get("type", "ClusterIP")
    if kind not in SERVICE_TYPES:
        causes.append(unsupported("spec.type", kind, SERVICE_TYPES))
    cluster_ip = spec.get("clusterIP")
    if cluster_ip not in (None, "", "None") and not is_ip(cluster_ip):
        causes.append(invalid("spec.clusterIP", cluster_ip, "must be empty, 'None', or a valid IP address"))
    if kind == "ExternalName":
        external = spec.get("externalName")
        if external in (None, ""):
            causes.append(required("spec.externalName"))
        else:
            host = external.removesuffix(".") if isinstance(external, str) else external
            causes.extend(_label_rule(dns1123_subdomain, host, "spec.externalName"))
        if cluster_ip not in (None, ""):
            causes.append(forbidden("spec.clusterIP", "may not be set for ExternalName services"))
    ports = spec.get("ports")
    headless = cluster_ip == "None"
    if (ports is None or ports == []) and kind != "ExternalName" and not headless:
        causes.append(required("spec.ports"))
    items = object_items(ports, "spec.ports", causes)
    names: set[str] = set()
    pairs: set[tuple[Any, Any]] = set()
    for path, port in items:
        causes.extend(_port(port.get("port"), at(path, "port")))
        causes.extend(_protocol(port, path))
        name = port.get("name")
        if name in (None, ""):
            if len(items) > 1:
                causes.append(required(at(path, "name")))
        else:
            causes.extend(_label_rule(dns1123_label, name, at(path, "name")))
            if isinstance(name, str) and name in names:
                causes.append(duplicate(at(path, "name"), name))
            names.add(str(name))
        target = port.get("targetPort")
        if isinstance(target, str):
            causes.extend(invalid(at(path, "targetPort"), target, m) for m in iana_service_name(target))
        elif target is not None:
            causes.extend(_port(target, at(path, "targetPort")))
        node_port = port.get("nodePort")
        if node_port not in (None, 0):
            if kind in ("ClusterIP", "ExternalName"):
                causes.append(forbidden(at(path, "nodePort"), f"may not be used when `type` is '{kind}'"))
            else:
                causes.extend(_port(node_port, at(path, "nodePort")))
        pair = (port.get("port"), port.get("protocol", "TCP"))
        if is_int(pair[0]) and isinstance(pair[1], str):
            if pair in pairs:
                causes.append(duplicate(path, {"port": pair[0], "protocol": pair[1]}))
            pairs.add(pair)
    causes.extend(validate_labels(spec.get("selector"), "spec.selector"))
    external_ips = spec.get("externalIPs")
    if external_ips is not None:
        if not isinstance(external_ips, list):
            causes.append(invalid("spec.externalIPs", external_ips, "must be a list of IP addresses"))
        else:
            for i, ip in enumerate(external_ips):
                if not is_ip(ip):
                    causes.append(invalid(at("spec.externalIPs", i), ip, "must be a valid IP address"))
    affinity = spec.get("sessionAffinity")
    if affinity not in (None, "None", "ClientIP"):
        causes.append(unsupported("spec.sessionAffinity", affinity, ("ClientIP", "None")))
    return causes


# ---- config maps and secrets -----------------------------------------------------------------------------


def config_key(value: str) -> list[str]:
    """Problems with ``value`` as a ConfigMap or Secret key (it becomes a file name in a volume)."""
    found = []
    if len(value) > 253:
        found.append("must be no more than 253 characters")
    if not _CONFIG_KEY.fullmatch(value):
        found.append(
            "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  "
            "or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
        )
    if value in (".", ".."):
        found.append(f"must not be '{value}'")
    elif value.startswith(".."):
        found.append("must not start with '..'")
    return found


def _keyed_data(data: Any, path: str, decode: bool, causes: list[Cause]) -> dict[str, int]:
    """Check a ``data``-style map; returns each good key's size in bytes (decoded when ``decode``)."""
    sizes: dict[str, int] = {}
    if data is None:
        return sizes
    if not isinstance(data, Mapping):
        causes.append(invalid(path, data, "must be a map of string keys to string values"))
        return sizes
    for key, value in data.items():
        if not isinstance(key, str):
            causes.append(invalid(path, key, "keys must be strings"))
            continue
        causes.extend(invalid(path, key, msg) for msg in config_key(key))
        if not isinstance(value, str):
            causes.append(invalid(at(path, key), value, "must be a string"))
        elif decode:
            try:
                sizes[key] = len(base64.b64decode(value, validate=True))
            except (binascii.Error, ValueError):
                causes.append(invalid(at(path, key), "<value omitted>", "must be base64-encoded bytes"))
        else:
            sizes[key] = len(value.encode("utf-8", errors="surrogatepass"))
    return sizes


def validate_config_map(obj: Mapping[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    data = _keyed_data(obj.get("data"), "data", False, causes)
    binary = _keyed_data(obj.get("binaryData"), "binaryData", True, causes)
    for key in sorted(data.keys() & binary.keys()):
        causes.append(duplicate(at("binaryData", key), key))
    if sum(data.values()) + sum(binary.values()) > DATA_MAX_BYTES:
        causes.append(too_long("data", DATA_MAX_BYTES))
    if obj.get("immutable") is not None and not isinstance(obj.get("immutable"), bool):
        causes.append(invalid("immutable", obj.get("immutable"), "must be a boolean"))
    return causes


# The keys each typed Secret must carry, in data or stringData.
_SECRET_REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "kubernetes.io/tls": ("tls.crt", "tls.key"),
    "kubernetes.io/dockerconfigjson": (".dockerconfigjson",),
    "kubernetes.io/dockercfg": (".dockercfg",),
    "kubernetes.io/ssh-auth": ("ssh-privatekey",),
}


def validate_secret(obj: Mapping[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    data = _keyed_data(obj.get("data"), "data", True, causes)
    string_data = _keyed_data(obj.get("stringData"), "stringData", False, causes)
    if sum(data.values()) + sum(string_data.values()) > DATA_MAX_BYTES:
        causes.append(too_long("data", DATA_MAX_BYTES))
    kind = obj.get("type", "Opaque")
    if not isinstance(kind, str):
        causes.append(invalid("type", kind, "must be a string"))
        return causes
    for key in _SECRET_REQUIRED_KEYS.get(kind, ()):
        if key not in data and key not in string_data:
            causes.append(required(at("data", key)))
    if kind == "kubernetes.io/service-account-token":
        meta = obj.get("metadata")
        annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
        if not isinstance(annotations, Mapping) or not annotations.get("kubernetes.io/service-account.name"):
            causes.append(required("metadata.annotations[kubernetes.io/service-account.name]"))
    return causes


# ---- endpoint slices -------------------------------------------------------------------------------------

ADDRESS_TYPES = ("FQDN", "IPv4", "IPv6")


def validate_endpoint_slice(obj: Mapping[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    address_type = obj.get("addressType")
    if address_type is None:
        causes.append(required("addressType"))
    elif address_type not in ADDRESS_TYPES:
        causes.append(unsupported("addressType", address_type, ADDRESS_TYPES))
    for path, endpoint in object_items(obj.get("endpoints"), "endpoints", causes):
        addresses = endpoint.get("addresses")
        if not isinstance(addresses, list) or not addresses:
            causes.append(required(at(path, "addresses"), "must contain at least 1 address"))
        elif len(addresses) > 100 or not all(isinstance(a, str) for a in addresses):
            causes.append(invalid(at(path, "addresses"), addresses, "must be 1 to 100 address strings"))
    for path, port in object_items(obj.get("ports"), "ports", causes):
        causes.extend(_port(port.get("port"), at(path, "port"), optional=True))
        causes.extend(_protocol(port, path))
        name = port.get("name")
        if name not in (None, ""):
            causes.extend(_label_rule(dns1123_label, name, at(path, "name")))
    return causes
