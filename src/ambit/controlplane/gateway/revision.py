"""Which Gateways this control plane's revision controls (istiod's revision tag watcher, ``IsMine``; pure).

Rules:

1. The Gateway's revision is its ``istio.io/rev`` label when it has one (an empty value included), else the
   ``istio.io/rev`` label of its namespace; the empty revision means ``default``.
2. A Gateway whose namespace is not known (not seen yet, or Namespaces cannot be read) is controlled: a mesh
   without revisions must not stall on a missing cache.
3. The revision is controlled when it is one of ours: our revision itself, and ``default`` when our revision is
   ``default`` (or empty). Ambit has no revision tags, so no other name is ours.

A Gateway that is not controlled gets nothing from this control plane: no Deployment, Service, ServiceAccount or
status. Objects already deployed for it stay (their owner is the Gateway) until it is deleted or it comes back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REVISION_LABEL = "istio.io/rev"
DEFAULT_REVISION = "default"


def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = (obj or {}).get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def our_revisions(revision: str) -> frozenset[str]:
    """The revision names that are ours (rule 3)."""
    if revision in ("", DEFAULT_REVISION):
        return frozenset({DEFAULT_REVISION})
    return frozenset({revision})


def gateway_revision(gateway: Mapping[str, Any], namespace: Mapping[str, Any] | None) -> str | None:
    """The Gateway's revision by rule 1; None when it has no label and its namespace is unknown (rule 2)."""
    labels = _labels(gateway)
    if REVISION_LABEL in labels:
        chosen = labels[REVISION_LABEL]
    elif namespace is None:
        return None
    else:
        chosen = _labels(namespace).get(REVISION_LABEL, "")
    return str(chosen or DEFAULT_REVISION)


def is_ours(gateway: Mapping[str, Any], namespace: Mapping[str, Any] | None, revision: str) -> bool:
    """Whether the control plane of ``revision`` controls ``gateway`` (``namespace``: its Namespace, if known)."""
    chosen = gateway_revision(gateway, namespace)
    return chosen is None or chosen in our_revisions(revision)
