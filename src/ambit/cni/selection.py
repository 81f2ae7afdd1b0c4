"""Which pods are enrolled in ambient mode (spec §1.2, "Ambient pod selection rules").

Rules, checked in order; the first that applies decides:

1. A pod with ``spec.hostNetwork: true`` is never enrolled (it shares the node's network namespace).
2. A pod with the annotation ``sidecar.istio.io/status`` is never enrolled (it already has a sidecar).
3. A pod in an excluded namespace (default ``kube-system``) is never enrolled.
4. A pod labelled ``istio.io/dataplane-mode=ambient`` is enrolled.
5. A pod labelled ``istio.io/dataplane-mode=none`` is not enrolled, whatever its namespace says.
6. A pod whose namespace is labelled ``istio.io/dataplane-mode=ambient`` is enrolled.
7. Anything else is not enrolled.

Rules 4-6 are Istio's default enablement selectors (pod selector OR namespace selector with the pod not opted
out). The function is pure and total: objects come from an API server or a test, so any field may be missing or
of the wrong type, and a malformed object is simply "not selected" rather than an exception.

This module is imported by the CNI plugin, so it uses nothing but builtins.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DATAPLANE_MODE_LABEL = "istio.io/dataplane-mode"
DATAPLANE_MODE_AMBIENT = "ambient"
DATAPLANE_MODE_NONE = "none"
SIDECAR_STATUS_ANNOTATION = "sidecar.istio.io/status"
DEFAULT_EXCLUDED_NAMESPACES: frozenset[str] = frozenset({"kube-system"})


def split_namespaces(text: str) -> tuple[str, ...]:
    """``EXCLUDE_NAMESPACES`` as istio-cni reads it: comma-separated names, blanks around them and empty entries
    dropped, each name once, in order."""
    names = (part.strip() for part in text.split(","))
    return tuple(dict.fromkeys(name for name in names if name))


class Decision:
    """Whether a pod is enrolled, and the rule that decided (one short phrase, for logs and errors)."""

    __slots__ = ("enrolled", "reason")

    def __init__(self, enrolled: bool, reason: str) -> None:
        self.enrolled = enrolled
        self.reason = reason

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return (self.enrolled, self.reason) == (other.enrolled, other.reason)

    def __hash__(self) -> int:
        return hash((self.enrolled, self.reason))

    def __repr__(self) -> str:
        return f"Decision(enrolled={self.enrolled!r}, reason={self.reason!r})"


def is_ambient(
    pod: dict[str, Any],
    namespace: dict[str, Any],
    *,
    excluded_namespaces: frozenset[str] | set[str] = DEFAULT_EXCLUDED_NAMESPACES,
) -> Decision:
    """Apply the selection rules above to a Pod and its Namespace (API objects as dicts)."""
    pod_meta = _field(pod, "metadata")
    if _field(pod, "spec").get("hostNetwork") is True:
        return Decision(False, "pod uses the host network")
    if SIDECAR_STATUS_ANNOTATION in _field(pod_meta, "annotations"):
        return Decision(False, "pod has a sidecar")
    ns_meta = _field(namespace, "metadata")
    ns_name = pod_meta.get("namespace")
    if not isinstance(ns_name, str):
        ns_name = ns_meta.get("name")
    if isinstance(ns_name, str) and ns_name in excluded_namespaces:
        return Decision(False, f"namespace {ns_name} is excluded")
    pod_mode = _field(pod_meta, "labels").get(DATAPLANE_MODE_LABEL)
    if pod_mode == DATAPLANE_MODE_AMBIENT:
        return Decision(True, "pod is labelled ambient")
    if pod_mode == DATAPLANE_MODE_NONE:
        return Decision(False, "pod opted out with dataplane-mode=none")
    if _field(ns_meta, "labels").get(DATAPLANE_MODE_LABEL) == DATAPLANE_MODE_AMBIENT:
        return Decision(True, "namespace is labelled ambient")
    return Decision(False, "neither pod nor namespace is labelled ambient")


def _field(obj: object, name: str) -> dict[Any, Any]:
    """``obj[name]`` when both are mappings, else an empty dict: a malformed object selects nothing."""
    if isinstance(obj, dict):
        value = obj.get(name)
        if isinstance(value, dict):
            return value
    return {}
