"""What an Istio policy applies to: a workload ``selector``, or ``targetRef``/``targetRefs`` (spec §7.5).

Theory of operation. A policy is bound either to pods by label (``selector``) or to Gateway API style parents by
reference (``targetRefs``; the older single ``targetRef`` is the same thing), never both, and never both
``targetRef`` and ``targetRefs``. A reference names its kind by group and kind; only the kinds a waypoint or
gateway can enforce on are accepted, and only in the policy's own namespace (Istio does not support
cross-namespace references here).
"""

from __future__ import annotations

from typing import Any

from ambit.controlplane.webhook.fields import Fields

_REFERABLE = {
    ("gateway.networking.k8s.io", "Gateway"),
    ("gateway.networking.k8s.io", "GatewayClass"),
    ("", "Service"),
    ("core", "Service"),
    ("networking.istio.io", "ServiceEntry"),
}


def check_attachment(f: Fields, spec: dict[str, Any], namespace: str | None) -> None:
    """Check ``spec.selector``, ``spec.targetRef`` and ``spec.targetRefs`` and how they combine."""
    selector = f.selector(f.get(spec, "selector"), "spec.selector")
    single = f.get(spec, "targetRef")
    refs = f.objects(f.get(spec, "targetRefs"), "spec.targetRefs")
    if single is not None:
        if refs:
            f.error("spec.targetRef", "only one of targetRef or targetRefs can be set")
        refs.insert(0, ("spec.targetRef", f.mapping(single, "spec.targetRef")))
    if selector is not None and refs:
        f.error("spec.selector", "only one of selector or targetRefs can be set")
    for path, ref in refs:
        check_target_ref(f, ref, path, namespace)


def check_target_ref(f: Fields, ref: dict[str, Any], path: str, namespace: str | None) -> None:
    f.mapping(ref, path, known=("group", "kind", "name", "namespace"))
    group = f.string(ref.get("group"), f"{path}.group") or ""
    kind = f.string(ref.get("kind"), f"{path}.kind", required=True)
    f.string(ref.get("name"), f"{path}.name", required=True)
    ref_namespace = f.string(ref.get("namespace"), f"{path}.namespace")
    if kind is not None and (group, kind) not in _REFERABLE:
        f.error(
            f"{path}.kind",
            f"unsupported target {kind!r} in group {group!r}: expected a Gateway, GatewayClass, Service or "
            "ServiceEntry",
        )
    if ref_namespace is not None and namespace is not None and ref_namespace != namespace:
        f.error(f"{path}.namespace", "cross-namespace references are not supported: must be empty or the same")
