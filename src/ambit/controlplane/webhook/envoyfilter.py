"""Shallow validation of ``networking.istio.io`` EnvoyFilter, as istiod's webhook judges one.

Theory of operation. An EnvoyFilter is admitted with a warning that it exposes implementation details (istiod
warns on every one). Its ``configPatches`` are judged one by one, each problem naming the patch
(``spec.configPatches[i]``), with istiod's rules:

1. A patch is an object with an ``applyTo`` and a ``patch`` with an ``operation``; every operation but ``REMOVE``
   carries a ``value`` (an object). The enum fields hold Istio's names.
2. ``match.proxy.proxyVersion`` is a regular expression that compiles with RE2's syntax
   (:func:`ambit.model.envoyfilter.version_pattern_problem`); one longer than
   :data:`~ambit.model.envoyfilter.MAX_VERSION_PATTERN` characters is admitted with a warning, not compiled (it
   matches no proxy).
3. A patch of a ``WAYPOINT`` context is not judged further (istiod skips it too).

What a patch's value means is not judged here: the control plane's translation
(:mod:`ambit.controlplane.translate.envoyfilters`) honours what it can and logs the rest, as istiod applies what
Envoy accepts. Bounded: at most :data:`MAX_PATCHES` patches are looked at.
"""

from __future__ import annotations

from typing import Any

from ambit.controlplane.webhook.fields import Fields
from ambit.model.envoyfilter import MAX_VERSION_PATTERN, version_pattern_problem

APPLY_TO = (
    "INVALID",
    "LISTENER",
    "FILTER_CHAIN",
    "NETWORK_FILTER",
    "HTTP_FILTER",
    "ROUTE_CONFIGURATION",
    "VIRTUAL_HOST",
    "HTTP_ROUTE",
    "CLUSTER",
    "EXTENSION_CONFIG",
    "BOOTSTRAP",
    "LISTENER_FILTER",
)
OPERATIONS = (
    "INVALID",
    "MERGE",
    "ADD",
    "REMOVE",
    "INSERT_BEFORE",
    "INSERT_AFTER",
    "INSERT_FIRST",
    "REPLACE",
)
CONTEXTS = ("ANY", "SIDECAR_INBOUND", "SIDECAR_OUTBOUND", "GATEWAY", "WAYPOINT")
MAX_PATCHES = 1024
EXPOSES_DETAILS = (
    "EnvoyFilter exposes internal implementation details that may change at any time. "
    "Prefer other APIs if possible, and exercise extreme caution, especially around upgrades."
)


def validate_envoy_filter(obj: dict[str, Any]) -> Fields:
    f = Fields()
    spec = f.mapping(
        obj.get("spec"),
        "spec",
        known=("workloadSelector", "configPatches", "priority", "targetRefs", "targetRef"),
    )
    f.warn("spec", EXPOSES_DETAILS)
    f.selector(f.get(spec, "workloadSelector"), "spec.workloadSelector", labels_name="labels")
    f.integer(f.get(spec, "priority"), "spec.priority", low=-(2**31), high=2**31 - 1)
    patches = f.sequence(f.get(spec, "configPatches"), "spec.configPatches", limit=MAX_PATCHES)
    for i, patch in enumerate(patches[:MAX_PATCHES]):
        _patch(f, patch, f"spec.configPatches[{i}]")
    return f


def _patch(f: Fields, raw: Any, path: str) -> None:
    """Rules 1-3 for one patch."""
    if raw is None:
        f.error(path, "Envoy filter: null config patch")
        return
    patch_spec = f.mapping(raw, path, known=("applyTo", "match", "patch"))
    match = f.mapping(f.get(patch_spec, "match"), f"{path}.match")
    if f.enum(f.get(match, "context"), f"{path}.match.context", CONTEXTS) == "WAYPOINT":
        return
    apply_to = f.enum(f.get(patch_spec, "applyTo"), f"{path}.applyTo", APPLY_TO)
    if apply_to in (None, "INVALID"):
        f.error(f"{path}.applyTo", "Envoy filter: missing applyTo")
        return
    patch = f.mapping(f.get(patch_spec, "patch"), f"{path}.patch")
    if not patch:
        f.error(f"{path}.patch", "Envoy filter: missing patch")
        return
    operation = f.enum(f.get(patch, "operation"), f"{path}.patch.operation", OPERATIONS)
    if operation in (None, "INVALID"):
        f.error(f"{path}.patch.operation", "Envoy filter: missing patch operation")
        return
    if operation != "REMOVE" and not isinstance(f.get(patch, "value"), dict):
        f.error(f"{path}.patch.value", "Envoy filter: missing patch value for non-remove operation")
        return
    proxy = f.mapping(f.get(match, "proxy"), f"{path}.match.proxy")
    version = f.string(f.get(proxy, "proxyVersion"), f"{path}.match.proxy.proxyVersion")
    if version is None:
        return
    if len(version) > MAX_VERSION_PATTERN:
        f.warn(
            f"{path}.match.proxy.proxyVersion",
            f"Envoy filter: proxyVersion match exceeds {MAX_VERSION_PATTERN} characters and will be ignored",
        )
    elif problem := version_pattern_problem(version):
        f.error(f"{path}.match.proxy.proxyVersion", f"Envoy filter: {problem}")
