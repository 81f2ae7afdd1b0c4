"""The taints a node registers with (kubelet's ``--register-with-taints``), parsed from their command-line form.

Theory of operation: a node that joins a cluster may carry taints from its first moment, so that no pod lands on it
before it is fit for them (Istio's ``cni.istio.io/not-ready=true:NoSchedule`` until the node agent is ready). The
kubelet puts them on the Node it creates; it never re-adds them to a Node that already exists (whoever removed a
taint meant it). This module is the pure part: text in, :class:`NodeTaint` values out.

Rules (:func:`parse_taint`, :func:`parse_taints`):

1. One taint is ``key=value:Effect`` or ``key:Effect`` (an empty value); the effect follows the last ``:``.
2. The key is a qualified name (``[prefix/]name``, as label keys), the value a label value, the effect one of
   ``NoSchedule``, ``PreferNoSchedule``, ``NoExecute`` (kube's grammar, :mod:`ambit.apiserver.names`).
3. A list is comma-separated (the kubelet flag's form); blank items are an error, and so is a second taint with the
   same key and effect (the API server would refuse the Node).
4. Bad input raises :class:`TaintSpecError` naming the item and what was expected; nothing else is raised.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ambit.apiserver.names import label_value, qualified_name
from ambit.errors import AmbitError

TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
CNI_NOT_READY = "cni.istio.io/not-ready=true:NoSchedule"
"""The taint a node joining a cluster with the mesh installed registers with (istio-cni's readiness taint)."""


class TaintSpecError(AmbitError, ValueError):
    """A taint in its command-line form that is not one (rule 4)."""


@dataclass(frozen=True, slots=True)
class NodeTaint:
    key: str
    value: str
    effect: str

    def to_api(self) -> dict[str, Any]:
        """The Node's ``spec.taints`` item."""
        item: dict[str, Any] = {"key": self.key, "effect": self.effect}
        if self.value:
            item["value"] = self.value
        return item

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


def parse_taint(spec: str) -> NodeTaint:
    """Rules 1, 2 and 4 for one taint."""
    body, colon, effect = spec.rpartition(":")
    if not colon:
        raise TaintSpecError(f"taint {spec!r}: expected key=value:Effect or key:Effect")
    if effect not in TAINT_EFFECTS:
        raise TaintSpecError(f"taint {spec!r}: the effect must be one of {', '.join(TAINT_EFFECTS)}, not {effect!r}")
    key, _, value = body.partition("=")
    if not key:
        raise TaintSpecError(f"taint {spec!r}: the key is empty")
    problems = [f"key {msg}" for msg in qualified_name(key)] + [f"value {msg}" for msg in label_value(value)]
    if problems:
        raise TaintSpecError(f"taint {spec!r}: {problems[0]}")
    return NodeTaint(key, value, effect)


def parse_taints(specs: Iterable[str]) -> tuple[NodeTaint, ...]:
    """Rules 1 to 4 for taints given one or more per item (each item comma-separated, as the kubelet's flag)."""
    out: list[NodeTaint] = []
    seen: set[tuple[str, str]] = set()
    for text in specs:
        for item in text.split(","):
            if not item.strip():
                raise TaintSpecError(f"taints {text!r}: an empty item")
            taint = parse_taint(item.strip())
            if (taint.key, taint.effect) in seen:
                raise TaintSpecError(f"taint {item.strip()!r}: a second taint {taint.key} with effect {taint.effect}")
            seen.add((taint.key, taint.effect))
            out.append(taint)
    return tuple(out)


def render_taints(taints: Iterable[NodeTaint]) -> str:
    """The comma-separated form :func:`parse_taints` reads back."""
    return ",".join(str(t) for t in taints)
