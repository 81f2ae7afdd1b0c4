"""Owner references and claiming, as apimachinery's ControllerRefManager does it (pure: returns the writes).

Rules:

1. An object has at most one *controller*: the owner reference with ``controller: true``. Only its controller
   manages it; a controller never touches an object another controller owns.
2. A controller *adopts* an orphan (no controller reference) in its namespace whose labels match its selector,
   unless either is being deleted.
3. A controller *releases* an object it owns whose labels no longer match its selector (its reference is
   removed; other owner references stay).
4. Both writes are merge patches of ``metadata.ownerReferences`` carrying the ``resourceVersion`` the decision
   was made on, so a concurrent change makes the write fail (409) instead of clobbering it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ambit.lab.controllers.selectors import labels_of
from ambit.lab.controllers.workqueue import Key

Object = dict[str, Any]


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def uid_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def is_deleting(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def controller_ref(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, dict) and ref.get("controller") is True:
            return ref
    return None


def controller_key(obj: Mapping[str, Any], kind: str) -> Key | None:
    """The key of ``obj``'s controller when it is a ``kind`` (controllers live in their dependents' namespace)."""
    ref = controller_ref(obj)
    if ref is None or ref.get("kind") != kind or not ref.get("name"):
        return None
    return (key_of(obj)[0], str(ref["name"]))


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """A controller reference to ``owner``."""
    return {
        "apiVersion": owner.get("apiVersion", ""),
        "kind": owner.get("kind", ""),
        "name": name_of(owner),
        "uid": uid_of(owner),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def is_controlled_by(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> bool:
    ref = controller_ref(obj)
    return ref is not None and ref.get("uid") == uid_of(owner)


@dataclass(slots=True)
class Claim:
    """What a controller owns after claiming, and the ownership writes to make (rules 2 and 3)."""

    owned: list[Object] = field(default_factory=list)
    adopt: list[Object] = field(default_factory=list)
    release: list[Object] = field(default_factory=list)


def claim(
    owner: Mapping[str, Any],
    candidates: Iterable[Object],
    matches: Callable[[Mapping[str, str]], bool],
    member: Callable[[Object], bool] | None = None,
) -> Claim:
    """Sort ``candidates`` (objects of the owner's namespace) into owned, to adopt and to release; ``member``, when
    given, is one more condition of being selected (kube's claim filters)."""
    result = Claim()
    for obj in candidates:
        ref = controller_ref(obj)
        selected = matches(labels_of(obj)) and (member is None or member(obj))
        if ref is not None:
            if ref.get("uid") != uid_of(owner):
                continue
            if selected or is_deleting(owner):
                result.owned.append(obj)
            else:
                result.release.append(obj)
        elif selected and not is_deleting(owner) and not is_deleting(obj):
            result.adopt.append(obj)
    return result


def adoption_patch(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    refs = [r for r in meta.get("ownerReferences") or () if isinstance(r, dict)]
    refs.append(owner_reference(owner))
    return {"metadata": {"ownerReferences": refs, "resourceVersion": meta.get("resourceVersion")}}


def release_patch(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    refs = [r for r in meta.get("ownerReferences") or () if isinstance(r, dict) and r.get("uid") != uid_of(owner)]
    return {"metadata": {"ownerReferences": refs or None, "resourceVersion": meta.get("resourceVersion")}}
