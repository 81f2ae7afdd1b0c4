"""A StatefulSet's PersistentVolumeClaims (pure): one per claim template and member, kept across the member's
pods, and owned as ``persistentVolumeClaimRetentionPolicy`` says.

Rules (kube's StatefulSet controller):

1. Member ``<set>-<ordinal>`` uses, for each ``volumeClaimTemplates`` entry ``<t>``, the claim
   ``<t>-<set>-<ordinal>`` in the set's namespace: its pods get a ``persistentVolumeClaim`` volume named ``<t>``
   (replacing a template volume of that name), and a recreated pod finds the same claim (and its data).
2. A missing claim is made from its template before the member's pod (:func:`claims_for`): the template's labels
   with the set's ``selector.matchLabels`` over them, the template's annotations and spec. An existing claim is
   never changed, except for rule 3.
3. Owner references (:func:`retention_refs`), from ``whenDeleted``/``whenScaled`` and whether the member is being
   scaled away (its ordinal is outside the wanted range): Retain/Retain none; Delete/Retain the set; Retain/Delete
   the pod while it is being scaled away, else none; Delete/Delete the pod while being scaled away, else the
   set. A claim owned by its set goes with the set; one owned by its pod goes with the pod (the API server's
   garbage collector follows the references). The references are not controller references.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from ambit.lab.controllers.ownership import Object, key_of, name_of, uid_of

RETAIN = "Retain"
DELETE = "Delete"


def claim_name(template: str, set_name: str, ordinal: int) -> str:
    """Rule 1."""
    return f"{template}-{set_name}-{ordinal}"


def _templates(sts: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = sts.get("spec") if isinstance(sts.get("spec"), Mapping) else {}
    claims = spec.get("volumeClaimTemplates") if isinstance(spec, Mapping) else None
    out = []
    for claim in claims if isinstance(claims, list) else []:
        meta = claim.get("metadata") if isinstance(claim, Mapping) else None
        if isinstance(meta, Mapping) and isinstance(meta.get("name"), str) and meta["name"]:
            out.append(claim)
    return out


def pod_volumes(sts: Mapping[str, Any], ordinal: int) -> list[dict[str, Any]]:
    """Rule 1: the member's claim volumes."""
    return [
        {
            "name": t["metadata"]["name"],
            "persistentVolumeClaim": {"claimName": claim_name(t["metadata"]["name"], name_of(sts), ordinal)},
        }
        for t in _templates(sts)
    ]


def _ref(owner: Mapping[str, Any], api_version: str, kind: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name_of(owner), "uid": uid_of(owner)}


def retention_refs(sts: Mapping[str, Any], pod: Mapping[str, Any] | None, scaled_away: bool) -> list[dict[str, Any]]:
    """Rule 3: the owner references a member's claim carries (``pod``: the member's pod, if it has one)."""
    spec = sts.get("spec") if isinstance(sts.get("spec"), Mapping) else {}
    policy = spec.get("persistentVolumeClaimRetentionPolicy") if isinstance(spec, Mapping) else None
    policy = policy if isinstance(policy, Mapping) else {}
    when_deleted = policy.get("whenDeleted", RETAIN)
    when_scaled = policy.get("whenScaled", RETAIN)
    pod_owns = when_scaled == DELETE and scaled_away and pod is not None
    set_owns = when_deleted == DELETE and not (when_scaled == DELETE and scaled_away)
    refs = []
    if set_owns:
        refs.append(_ref(sts, "apps/v1", "StatefulSet"))
    if pod_owns and pod is not None:
        refs.append(_ref(pod, "v1", "Pod"))
    return refs


def claims_for(sts: Mapping[str, Any], ordinal: int, pod: Mapping[str, Any] | None) -> list[Object]:
    """Rule 2: the member's claims as they are made."""
    namespace = key_of(sts)[0]
    spec = sts.get("spec") if isinstance(sts.get("spec"), Mapping) else {}
    selector = spec.get("selector") if isinstance(spec, Mapping) else None
    match = selector.get("matchLabels") if isinstance(selector, Mapping) else None
    out: list[Object] = []
    for template in _templates(sts):
        meta = template["metadata"]
        labels = dict(meta.get("labels") or {}) if isinstance(meta.get("labels"), Mapping) else {}
        labels.update(match if isinstance(match, Mapping) else {})
        body: Object = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": claim_name(meta["name"], name_of(sts), ordinal),
                "namespace": namespace,
                "labels": labels,
            },
            "spec": copy.deepcopy(dict(template.get("spec") or {}))
            if isinstance(template.get("spec"), Mapping)
            else {},
        }
        if isinstance(meta.get("annotations"), Mapping) and meta["annotations"]:
            body["metadata"]["annotations"] = dict(meta["annotations"])
        refs = retention_refs(sts, pod, scaled_away=False)
        if refs:
            body["metadata"]["ownerReferences"] = refs
        out.append(body)
    return out


def refs_update(
    claim: Mapping[str, Any], sts: Mapping[str, Any], pod: Mapping[str, Any] | None, scaled_away: bool
) -> list[dict[str, Any]] | None:
    """Rule 3 for an existing claim: its new ``ownerReferences`` (others' kept), or None when they are right."""
    meta = claim.get("metadata") if isinstance(claim.get("metadata"), Mapping) else {}
    current = [r for r in (meta.get("ownerReferences") or []) if isinstance(r, Mapping)] if meta else []
    ours = {uid_of(sts)} | ({uid_of(pod)} if pod is not None else set())
    others = [dict(r) for r in current if r.get("uid") not in ours]
    wanted = others + retention_refs(sts, pod, scaled_away)
    key = lambda r: (str(r.get("uid")), str(r.get("kind")))  # noqa: E731
    if sorted(map(key, wanted)) == sorted(map(key, current)):
        return None
    return wanted
