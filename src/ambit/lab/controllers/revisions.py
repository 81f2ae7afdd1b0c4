"""A DaemonSet's or StatefulSet's ControllerRevision history, as kube's controllers keep it (pure: decisions, no
I/O; :mod:`revision_history` does the writes). The rules below say "DaemonSet"; a StatefulSet's history is kept
alike (its pods carry the revision's *name* as ``controller-revision-hash``, where a daemon pod carries the hash).

A revision holds one pod template the DaemonSet has had, in the form kube stores and ``kubectl rollout undo``
patches back: ``data = {"spec": {"template": <template>, with "$patch": "replace"}}``.

Rules:

1. A revision *matches* the DaemonSet when its ``data`` equals :func:`patch_of` the DaemonSet now.
2. The current revision is a matching one; when several match, the one with the highest revision number wins
   (the others are duplicates, to delete). With none, a new one is made: name ``<ds>-<hash>`` (the hash of the
   template and ``status.collisionCount``, :func:`rollout.template_hash`), labels the template's plus
   ``controller-revision-hash: <hash>``, the DaemonSet's annotations (``kubernetes.io/change-cause`` among
   them), a controller reference to the DaemonSet, and revision number max(old) + 1.
3. A current revision whose number is not above every old one's (a template the DaemonSet returned to, e.g. by
   ``rollout undo``) is renumbered to max(old) + 1.
4. Old revisions beyond ``revisionHistoryLimit`` (default 10) are deleted, lowest number first, skipping any
   whose hash a live pod of the DaemonSet still carries.
5. A revision without the hash label gets one, its own name (kube's choice: no hash to recompute).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambit.lab.controllers.ownership import Object, key_of, name_of, owner_reference
from ambit.lab.controllers.rollout import template_hash

HASH_LABEL = "controller-revision-hash"
DEFAULT_HISTORY_LIMIT = 10


def patch_of(ds: Mapping[str, Any]) -> dict[str, Any]:
    """What a revision of ``ds``'s current template holds (rule 1)."""
    template = copy.deepcopy((ds.get("spec") or {}).get("template") or {})
    template["$patch"] = "replace"
    return {"spec": {"template": template}}


def matches(ds: Mapping[str, Any], revision: Mapping[str, Any]) -> bool:
    return revision.get("data") == patch_of(ds)


def number_of(revision: Mapping[str, Any]) -> int:
    value = revision.get("revision")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def hash_of(revision: Mapping[str, Any]) -> str:
    return str(((revision.get("metadata") or {}).get("labels") or {}).get(HASH_LABEL) or "")


def collision_count(ds: Mapping[str, Any]) -> int:
    value = (ds.get("status") or {}).get("collisionCount")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def current_hash(ds: Mapping[str, Any]) -> str:
    return template_hash((ds.get("spec") or {}).get("template") or {}, collision_count(ds))


@dataclass(frozen=True, slots=True)
class History:
    """The DaemonSet's revisions sorted out (rules 2 and 3)."""

    current: Object | None
    """The matching revision, or None when one must be created (:func:`new_revision`)."""
    old: list[Object]
    """Revisions of other templates, lowest number first."""
    duplicates: list[Object]
    """Other matching revisions, to delete."""
    next_number: int
    """max(old) + 1: the number the current revision must carry."""


def sort_out(ds: Mapping[str, Any], revisions: Iterable[Object]) -> History:
    ordered = sorted(revisions, key=lambda r: (number_of(r), name_of(r)))
    current = [r for r in ordered if matches(ds, r)]
    old = [r for r in ordered if not matches(ds, r)]
    next_number = max((number_of(r) for r in old), default=0) + 1
    if not current:
        return History(None, old, [], next_number)
    return History(current[-1], old, current[:-1], next_number)


def new_revision(ds: Mapping[str, Any], number: int) -> Object:
    """The revision of ``ds``'s current template (rule 2)."""
    pod_hash = current_hash(ds)
    spec = ds.get("spec") or {}
    labels = dict(((spec.get("template") or {}).get("metadata") or {}).get("labels") or {})
    labels[HASH_LABEL] = pod_hash
    meta: dict[str, Any] = {
        "name": f"{name_of(ds)[:223]}-{pod_hash}",
        "namespace": key_of(ds)[0],
        "labels": labels,
        "ownerReferences": [owner_reference(ds)],
    }
    annotations = (ds.get("metadata") or {}).get("annotations")
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": meta,
        "data": patch_of(ds),
        "revision": number,
    }


def history_limit(ds: Mapping[str, Any]) -> int:
    value = (ds.get("spec") or {}).get("revisionHistoryLimit", DEFAULT_HISTORY_LIMIT)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else DEFAULT_HISTORY_LIMIT


def to_prune(ds: Mapping[str, Any], old: Sequence[Object], live_hashes: set[str]) -> list[Object]:
    """Rule 4: the old revisions to delete (``old`` lowest number first)."""
    surplus = len(old) - history_limit(ds)
    doomed: list[Object] = []
    for revision in old:
        if surplus <= 0:
            break
        if hash_of(revision) in live_hashes:
            continue
        doomed.append(revision)
        surplus -= 1
    return doomed
