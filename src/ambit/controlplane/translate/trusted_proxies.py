"""How many proxies in front of an ingress gateway it trusts: ProxyConfig ``gatewayTopology.numTrustedProxies``,
as Istio reads it for a gateway (pure).

Theory of operation: :func:`num_trusted_proxies` reads one ProxyConfig object (the value of a
``proxy.istio.io/config`` annotation, or MeshConfig's ``defaultConfig``); :func:`gateway_trusted_proxies` gives a
Gateway API Gateway's count. The control plane carries it to the gateway as its connection manager's
``xff_num_trusted_hops`` (:attr:`ambit.model.envoyfilter.ProxyPatches.xff_trusted_hops`), where the data plane
reads the client address with it (:mod:`ambit.waypoint.forwarded_for`).

Rules:

1. ``gatewayTopology.numTrustedProxies`` (or ``gateway_topology.num_trusted_proxies``) is an integer from 0 to
   :data:`~ambit.model.envoyfilter.MAX_TRUSTED_HOPS`; anything else (a string, a negative or larger number, a
   ``gatewayTopology`` that is not an object) is a :class:`ValueError` with one line naming the field.
   Absent: None (not set here).
2. A Gateway's count, most specific first, as the annotation on the pod overrides the mesh's ``defaultConfig``
   (istiod copies a Gateway's annotations, and its ``spec.infrastructure.annotations``, onto the gateway's pod):
   the ``proxy.istio.io/config`` annotation of ``spec.infrastructure.annotations``, then of the Gateway's
   metadata, then the mesh default. An annotation that is not YAML, holds aliases, is not an object, or fails
   rule 1 is ignored (the next source applies), so a bad annotation cannot make the gateway trust more than the
   mesh says.
3. An EnvoyFilter merging ``xff_num_trusted_hops`` into the gateway's connection manager is applied after, and
   wins (:mod:`ambit.controlplane.translate.envoyfilters`), as Envoy sees Istio's generated value patched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from ambit.model import untrusted_yaml
from ambit.model.envoyfilter import MAX_TRUSTED_HOPS

__all__ = ["PROXY_CONFIG_ANNOTATION", "gateway_trusted_proxies", "num_trusted_proxies"]

PROXY_CONFIG_ANNOTATION = "proxy.istio.io/config"
MAX_ANNOTATION_BYTES = 64 * 1024


def _get(obj: Mapping[str, Any], camel: str, snake: str) -> Any:
    return obj[camel] if camel in obj else obj.get(snake)


def num_trusted_proxies(proxy_config: Mapping[str, Any], where: str) -> int | None:
    """Rule 1 for one ProxyConfig object; ``where`` names it in the error."""
    topology = _get(proxy_config, "gatewayTopology", "gateway_topology")
    if topology is None:
        return None
    if not isinstance(topology, Mapping):
        raise ValueError(f"{where}.gatewayTopology: expected an object")
    value = _get(topology, "numTrustedProxies", "num_trusted_proxies")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TRUSTED_HOPS:
        raise ValueError(f"{where}.gatewayTopology.numTrustedProxies: expected an integer 0-{MAX_TRUSTED_HOPS}")
    return value


def _from_annotation(annotations: Any, where: str) -> int | None:
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
        return num_trusted_proxies(parsed, where)
    except ValueError:
        return None


def gateway_trusted_proxies(gateway: Mapping[str, Any], mesh_default: int | None) -> int | None:
    """Rule 2: the count for a Gateway API Gateway."""
    spec = gateway.get("spec")
    infrastructure = spec.get("infrastructure") if isinstance(spec, Mapping) else None
    meta = gateway.get("metadata")
    for found_annotations, where in (
        (infrastructure.get("annotations") if isinstance(infrastructure, Mapping) else None, "infrastructure"),
        (meta.get("annotations") if isinstance(meta, Mapping) else None, "metadata"),
    ):
        found = _from_annotation(found_annotations, where)
        if found is not None:
            return found
    return mesh_default
