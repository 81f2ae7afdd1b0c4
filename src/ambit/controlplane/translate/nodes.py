"""Where workloads run: a Node's topology labels become the ``Locality`` of the pods on it (istiod's ``nodes.go``).

Rules:

1. A Node's locality is its labels ``topology.kubernetes.io/region``, ``topology.kubernetes.io/zone`` and
   ``topology.istio.io/subzone``; a Node with none of them has an unknown (empty) locality.
2. A pod takes the locality of the Node named by ``spec.nodeName``; a pod not scheduled yet, or on a Node the
   control plane cannot see, has an unknown locality (istiod logs and sends none).
3. A WorkloadEntry (and an inline ServiceEntry endpoint) says its own ``locality`` as ``region/zone/subzone``;
   missing trailing parts are empty and parts past the third are ignored (istiod's ``SplitLocalityLabel``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ambit.model.workload import Locality

__all__ = ["REGION_LABEL", "SUBZONE_LABEL", "ZONE_LABEL", "node_localities", "split_locality"]

REGION_LABEL = "topology.kubernetes.io/region"
ZONE_LABEL = "topology.kubernetes.io/zone"
SUBZONE_LABEL = "topology.istio.io/subzone"


def node_localities(nodes: Iterable[Mapping[str, Any]]) -> dict[str, Locality]:
    """Node name → its locality, for the Nodes whose locality is known (rule 1)."""
    out: dict[str, Locality] = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        locality = Locality(
            region=_label(labels, REGION_LABEL), zone=_label(labels, ZONE_LABEL), subzone=_label(labels, SUBZONE_LABEL)
        )
        if meta.get("name") and locality.known:
            out[str(meta["name"])] = locality
    return out


def split_locality(value: Any) -> Locality:
    """A ``region/zone/subzone`` string as a locality (rule 3); anything but a string is unknown."""
    if not isinstance(value, str) or not value:
        return Locality()
    parts = [*value.split("/"), "", ""]
    return Locality(parts[0], parts[1], parts[2])


def _label(labels: Mapping[str, Any], key: str) -> str:
    value = labels.get(key)
    return value if isinstance(value, str) and value.isprintable() else ""
