"""An ingress gateway's ProxyConfig ``gatewayTopology``, as Istio reads it for a gateway (pure): how many proxies in
front of it it trusts (``numTrustedProxies``) and what it does with ``x-forwarded-client-cert``
(``forwardClientCertDetails``).

Theory of operation: :func:`num_trusted_proxies` and :func:`forward_client_cert` read one ProxyConfig object (the
value of a ``proxy.istio.io/config`` annotation, or MeshConfig's ``defaultConfig``); :func:`gateway_trusted_proxies`
and :func:`gateway_forward_client_cert` give a Gateway API Gateway's setting. The control plane carries the count
to the gateway as its connection manager's ``xff_num_trusted_hops``
(:attr:`ambit.model.envoyfilter.ProxyPatches.xff_trusted_hops`), where the data plane reads the client address
with it (:mod:`ambit.waypoint.forwarded_for`), and the mode as
:attr:`ambit.model.ingress.GatewayConfig.forward_client_cert` (:mod:`ambit.waypoint.client_cert`).

Rules:

1. ``gatewayTopology.numTrustedProxies`` (or ``gateway_topology.num_trusted_proxies``) is an integer from 0 to
   :data:`~ambit.model.envoyfilter.MAX_TRUSTED_HOPS`; anything else (a string, a negative or larger number, a
   ``gatewayTopology`` that is not an object) is a :class:`ValueError` with one line naming the field.
   Absent: None (not set here).
2. A Gateway's setting, most specific first, as the annotation on the pod overrides the mesh's ``defaultConfig``
   field by field (istiod copies a Gateway's annotations, and its ``spec.infrastructure.annotations``, onto the
   gateway's pod, and merges the pod's ProxyConfig over the mesh default): the ``proxy.istio.io/config``
   annotation of ``spec.infrastructure.annotations``, then of the Gateway's metadata, then the mesh default. An
   annotation that is not YAML, holds aliases, is not an object, or fails rule 1 or 4 for the field asked for is
   ignored for it (the next source applies), so a bad annotation cannot make the gateway trust more, or forward
   more, than the mesh says.
3. An EnvoyFilter merging ``xff_num_trusted_hops`` into the gateway's connection manager is applied after, and
   wins (:mod:`ambit.controlplane.translate.envoyfilters`), as Envoy sees Istio's generated value patched.
4. ``gatewayTopology.forwardClientCertDetails`` (or ``forward_client_cert_details``) is one of Istio's names
   ``SANITIZE``, ``FORWARD_ONLY``, ``APPEND_FORWARD``, ``SANITIZE_SET``, ``ALWAYS_FORWARD_ONLY``, or their numbers
   1-5 (protobuf JSON takes either); ``UNDEFINED`` (0) and absent are None (not set here: the gateway default,
   ``SANITIZE_SET``, as istiod's ``buildGatewayConnectionManager`` starts from it); anything else is a
   :class:`ValueError` naming the field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import yaml

from ambit.model import untrusted_yaml
from ambit.model.envoyfilter import MAX_TRUSTED_HOPS
from ambit.model.ingress import ForwardClientCert

__all__ = [
    "PROXY_CONFIG_ANNOTATION",
    "forward_client_cert",
    "gateway_forward_client_cert",
    "gateway_trusted_proxies",
    "num_trusted_proxies",
]

PROXY_CONFIG_ANNOTATION = "proxy.istio.io/config"
MAX_ANNOTATION_BYTES = 64 * 1024
T = TypeVar("T")

_MODES_BY_NUMBER = {
    1: ForwardClientCert.SANITIZE,
    2: ForwardClientCert.FORWARD_ONLY,
    3: ForwardClientCert.APPEND_FORWARD,
    4: ForwardClientCert.SANITIZE_SET,
    5: ForwardClientCert.ALWAYS_FORWARD_ONLY,
}
_MODES_BY_NAME = {mode.value: mode for mode in ForwardClientCert}


def _get(obj: Mapping[str, Any], camel: str, snake: str) -> Any:
    return obj[camel] if camel in obj else obj.get(snake)


def _topology(proxy_config: Mapping[str, Any], where: str) -> Mapping[str, Any] | None:
    topology = _get(proxy_config, "gatewayTopology", "gateway_topology")
    if topology is None:
        return None
    if not isinstance(topology, Mapping):
        raise ValueError(f"{where}.gatewayTopology: expected an object")
    return topology


def num_trusted_proxies(proxy_config: Mapping[str, Any], where: str) -> int | None:
    """Rule 1 for one ProxyConfig object; ``where`` names it in the error."""
    topology = _topology(proxy_config, where)
    value = None if topology is None else _get(topology, "numTrustedProxies", "num_trusted_proxies")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TRUSTED_HOPS:
        raise ValueError(f"{where}.gatewayTopology.numTrustedProxies: expected an integer 0-{MAX_TRUSTED_HOPS}")
    return value


def forward_client_cert(proxy_config: Mapping[str, Any], where: str) -> ForwardClientCert | None:
    """Rule 4 for one ProxyConfig object; ``where`` names it in the error."""
    topology = _topology(proxy_config, where)
    value = None if topology is None else _get(topology, "forwardClientCertDetails", "forward_client_cert_details")
    if value is None or value == "UNDEFINED" or (value == 0 and not isinstance(value, bool)):
        return None
    found = None
    if isinstance(value, str):
        found = _MODES_BY_NAME.get(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        found = _MODES_BY_NUMBER.get(value)
    if found is None:
        names = ", ".join(_MODES_BY_NAME)
        raise ValueError(f"{where}.gatewayTopology.forwardClientCertDetails: expected one of {names}")
    return found


def _from_annotation(annotations: Any, where: str, read: Callable[[Mapping[str, Any], str], T | None]) -> T | None:
    text = annotations.get(PROXY_CONFIG_ANNOTATION) if isinstance(annotations, Mapping) else None
    if not isinstance(text, str) or len(text) > MAX_ANNOTATION_BYTES:
        return None
    try:
        parsed = untrusted_yaml.load(text)
    except (yaml.YAMLError, RecursionError, ValueError):
        return None
    if not isinstance(parsed, Mapping):
        return None
    try:
        return read(parsed, where)
    except ValueError:
        return None


def _gateway_setting(
    gateway: Mapping[str, Any], mesh_default: T | None, read: Callable[[Mapping[str, Any], str], T | None]
) -> T | None:
    """Rule 2 for one field."""
    spec = gateway.get("spec")
    infrastructure = spec.get("infrastructure") if isinstance(spec, Mapping) else None
    meta = gateway.get("metadata")
    for found_annotations, where in (
        (infrastructure.get("annotations") if isinstance(infrastructure, Mapping) else None, "infrastructure"),
        (meta.get("annotations") if isinstance(meta, Mapping) else None, "metadata"),
    ):
        found = _from_annotation(found_annotations, where, read)
        if found is not None:
            return found
    return mesh_default


def gateway_trusted_proxies(gateway: Mapping[str, Any], mesh_default: int | None) -> int | None:
    """Rule 2: the count for a Gateway API Gateway."""
    return _gateway_setting(gateway, mesh_default, num_trusted_proxies)


def gateway_forward_client_cert(
    gateway: Mapping[str, Any], mesh_default: ForwardClientCert | None
) -> ForwardClientCert | None:
    """Rule 2: the XFCC mode for a Gateway API Gateway (None: the gateway default)."""
    return _gateway_setting(gateway, mesh_default, forward_client_cert)
