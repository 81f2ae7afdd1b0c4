"""User overlays on what a Gateway deploys, as istiod applies them (its deployment controller's ``applyOverlay``):
YAML from ConfigMaps, applied as strategic merge patches onto the rendered objects. Pure.

Theory of operation: the controller finds the ConfigMaps that apply to one Gateway (:func:`class_defaults`,
:func:`parameters_ref`) and hands their ``data`` to :func:`apply_overlays` as :class:`Overlay` values, in order, with
the rendered objects (:mod:`.render`); it gets the objects to apply or an :class:`OverlayError` saying what is
wrong, in one line that names the ConfigMap and key.

Rules:

1. Two sources, applied in this order: the class defaults, the oldest ConfigMap (then by name) in the control
   plane's namespace labelled ``gateway.istio.io/defaults-for-class: <the Gateway's class>``; then the Gateway's
   ``spec.infrastructure.parametersRef``, which must name a ConfigMap (group ``""``, kind ``ConfigMap``) in the
   Gateway's namespace. Another kind, or a ConfigMap that does not exist, is :class:`InvalidParameters` with
   istiod's messages: the Gateway's ``Accepted`` goes False with reason ``InvalidParameters`` and nothing is
   applied.
2. A ConfigMap's data keys are ``deployment``, ``service``, ``serviceAccount``, ``horizontalPodAutoscaler`` and
   ``podDisruptionBudget``, each YAML for one mapping applied as a strategic merge patch (:mod:`ambit.k8s.patch`,
   Kubernetes' merge keys: containers and volumes by name, Service ports by port...) onto the rendered object of
   that kind. Any other key, YAML that is not one mapping of JSON values (aliases refused), or a patch that
   does not apply is an :class:`OverlayError`: nothing is applied for that Gateway.
3. The HorizontalPodAutoscaler and PodDisruptionBudget are rendered but deployed only when an overlay names them.
4. An overlay may not change an object's identity: ``apiVersion``, ``kind``, and in ``metadata`` its ``name``,
   ``generateName``, ``namespace``, ``uid``, ``resourceVersion``, ``generation``, ``creationTimestamp``,
   ``deletionTimestamp``, ``deletionGracePeriodSeconds``, ``ownerReferences``, ``finalizers`` and
   ``managedFields``. Everything else is the overlay author's to set, as in Istio (pod security context, volumes,
   host paths, the pod's labels): whoever can write the class defaults ConfigMap controls the pods of every
   Gateway of that class, and the namespace's pod security admission still judges the pods.
5. The label ``gateway.istio.io/managed`` is the controller's: it is set again after the overlays (istiod sets it
   at apply time), so that an overlay cannot make the controller lose track of what it deployed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import yaml

from ambit.controlplane.translate.gateway_pods import MANAGED_LABEL
from ambit.errors import AmbitError
from ambit.k8s.patch import PatchError, clone, json_equal, merge_keys_for, strategic_merge_patch
from ambit.model import untrusted_yaml

__all__ = [
    "CLASS_DEFAULTS_LABEL",
    "InvalidParameters",
    "Overlay",
    "OverlayError",
    "apply_overlays",
    "class_defaults",
    "missing_parameters",
    "parameters_ref",
]

Obj = Mapping[str, Any]

CLASS_DEFAULTS_LABEL: Final = "gateway.istio.io/defaults-for-class"
KEYS: Final = {
    "Deployment": "deployment",
    "Service": "service",
    "ServiceAccount": "serviceAccount",
    "HorizontalPodAutoscaler": "horizontalPodAutoscaler",
    "PodDisruptionBudget": "podDisruptionBudget",
}
"""Rule 2: the kind each data key overlays."""
OPTIONAL_KINDS: Final = frozenset({"HorizontalPodAutoscaler", "PodDisruptionBudget"})
"""Rule 3."""
IDENTITY: Final = (
    "name",
    "generateName",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "ownerReferences",
    "finalizers",
    "managedFields",
)
"""Rule 4: the metadata fields an overlay may not change."""
MAX_DEPTH: Final = 64
"""Nesting deeper than this is refused: no Kubernetes object needs it, and the merge recurses."""


class OverlayError(AmbitError):
    """An overlay that cannot be applied (rules 2 and 4); the message names the ConfigMap and key."""


@dataclass(frozen=True, slots=True)
class InvalidParameters:
    """Rule 1: the Gateway's ``parametersRef`` is unusable; ``message`` is its ``Accepted`` condition's."""

    message: str


@dataclass(frozen=True, slots=True)
class Overlay:
    """One ConfigMap's overlays."""

    source: str
    """``<namespace>/<name>`` of the ConfigMap, for messages."""
    data: Mapping[str, Any]
    """The ConfigMap's ``data``."""

    @classmethod
    def of(cls, config_map: Obj) -> Overlay:
        meta = config_map.get("metadata") or {}
        data = config_map.get("data")
        return cls(f"{meta.get('namespace', '')}/{meta.get('name', '')}", data if isinstance(data, Mapping) else {})


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def class_defaults(config_maps: Sequence[Obj], gateway_class: str) -> Obj | None:
    """Rule 1: the class defaults ConfigMap among ``config_maps`` (those of the control plane's namespace)."""

    def labels(cm: Obj) -> Mapping[str, Any]:
        found = _meta(cm).get("labels")
        return found if isinstance(found, Mapping) else {}

    chosen = [cm for cm in config_maps if labels(cm).get(CLASS_DEFAULTS_LABEL) == gateway_class]
    if not chosen:
        return None
    return min(chosen, key=lambda cm: (str(_meta(cm).get("creationTimestamp") or ""), str(_meta(cm).get("name"))))


def parameters_ref(gateway: Obj) -> tuple[str, str] | InvalidParameters | None:
    """Rule 1: the (namespace, name) of the ConfigMap the Gateway's ``parametersRef`` names; None without one."""
    spec = gateway.get("spec")
    infra = spec.get("infrastructure") if isinstance(spec, Mapping) else None
    ref = infra.get("parametersRef") if isinstance(infra, Mapping) else None
    if ref is None:
        return None
    ref = ref if isinstance(ref, Mapping) else {}
    group, kind, name = ref.get("group", ""), ref.get("kind", ""), ref.get("name")
    if group != "" or kind != "ConfigMap" or not isinstance(name, str) or not name:
        if group == "" and kind == "ConfigMap":
            return InvalidParameters("parametersRef names no ConfigMap")
        return InvalidParameters(f"Unsupported parametersRef group/kind {group}/{kind}, only ConfigMap is supported")
    return str(_meta(gateway).get("namespace") or ""), name


def missing_parameters(namespace: str, name: str) -> InvalidParameters:
    return InvalidParameters(f"parametersRef ConfigMap {namespace}/{name} does not exist")


def _check_json(value: Any, path: str = "", depth: int = 0) -> str | None:
    """What makes ``value`` no JSON value, or None: YAML can say more than JSON (timestamps, binary, sets,
    non-string keys, infinities)."""
    at = f"at {path}: " if path else ""
    if depth > MAX_DEPTH:
        return f"nested more than {MAX_DEPTH} levels deep"
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{at}the key {key!r} is not a string"
            if problem := _check_json(item, f"{path}.{key}" if path else key, depth + 1):
                return problem
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if problem := _check_json(item, f"{path}[{index}]", depth + 1):
                return problem
    elif isinstance(value, float) and not math.isfinite(value):
        return f"{at}{value!r} is not a JSON number"
    elif value is not None and not isinstance(value, str | int | float | bool):
        return f"{at}a {type(value).__name__} is not a JSON value (quote it to make it a string)"
    return None


def _parse(overlay: Overlay, key: str) -> dict[str, Any] | None:
    text = overlay.data[key]
    where = f"ConfigMap {overlay.source} key {key!r}:"
    if not isinstance(text, str):
        raise OverlayError(f"{where} not a string")
    try:
        doc = untrusted_yaml.load(text)
    except yaml.YAMLError as exc:
        raise OverlayError(f"{where} not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise OverlayError(f"{where} nested too deeply") from None
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise OverlayError(f"{where} must be a YAML mapping, not a {type(doc).__name__}")
    if problem := _check_json(doc):
        raise OverlayError(f"{where} {problem}")
    return doc


def _check_keys(overlays: Sequence[Overlay]) -> None:
    for overlay in overlays:
        for key in overlay.data:
            if key not in KEYS.values():
                supported = ", ".join(sorted(KEYS.values()))
                raise OverlayError(f"ConfigMap {overlay.source}: unsupported key {key!r} (supported: {supported})")


def _identity(obj: Obj) -> tuple[Any, ...]:
    meta = _meta(obj)
    return (obj.get("apiVersion"), obj.get("kind"), *(meta.get(field) for field in IDENTITY))


def _overlay_one(obj: dict[str, Any], overlays: Sequence[Overlay]) -> dict[str, Any] | None:
    kind = str(obj.get("kind"))
    key = KEYS[kind]
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    applied = False
    result = obj
    for overlay in overlays:
        if key not in overlay.data:
            continue
        applied = True
        patch = _parse(overlay, key)
        if patch is None:
            continue
        try:
            result = strategic_merge_patch(result, patch, merge_keys_for(group, kind))
        except PatchError as exc:
            raise OverlayError(f"ConfigMap {overlay.source} key {key!r}: {exc.message}") from None
        except RecursionError:
            raise OverlayError(f"ConfigMap {overlay.source} key {key!r}: nested too deeply") from None
        if not all(json_equal(a, b) for a, b in zip(_identity(obj), _identity(result), strict=True)):
            raise OverlayError(
                f"ConfigMap {overlay.source} key {key!r}: it changes the {kind}'s identity (its apiVersion, kind, "
                "name, namespace, uid, owner references or other object metadata), which an overlay may not"
            )
    if not applied and kind in OPTIONAL_KINDS:
        return None
    labels = _meta(obj).get("labels")
    if isinstance(labels, Mapping) and MANAGED_LABEL in labels:  # rule 5
        meta = result.setdefault("metadata", {})
        if not isinstance(meta.get("labels"), dict):
            meta["labels"] = {}
        meta["labels"][MANAGED_LABEL] = labels[MANAGED_LABEL]
    return result


def apply_overlays(objects: Sequence[Obj], overlays: Sequence[Overlay]) -> list[dict[str, Any]]:
    """The objects to deploy: each rendered object with the overlays applied in order (rules 2-5); the optional
    kinds only when an overlay names them. Raises :class:`OverlayError`."""
    _check_keys(overlays)
    out: list[dict[str, Any]] = []
    for obj in objects:
        result = _overlay_one(clone(dict(obj)), overlays)
        if result is not None:
            out.append(result)
    return out
