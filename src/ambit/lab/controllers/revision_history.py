"""Keeping an owner's ControllerRevision history on the server: the I/O half of :mod:`revisions`, shared by the
DaemonSet and StatefulSet controllers (kube's ``controller/history`` package plays this part for both).

:func:`sync_history`, for one owner (a DaemonSet or a StatefulSet) and the revisions it controls:

1. Labels each revision that has no ``controller-revision-hash`` with its own name (:mod:`revisions` rule 5).
2. Deletes duplicates of the current revision; creates the current one when missing, or renumbers it when it
   is not the newest (rules 2 and 3).
3. A create that meets ``AlreadyExists``: the existing revision is taken when it is the owner's and holds the
   same template (the cache had not shown it yet); otherwise the owner's ``status.collisionCount`` goes up by
   one (so the next name differs) and the reconcile fails with ``FailedCreate``, to be retried.
"""

from __future__ import annotations

from ambit.k8s import Informer, KubeAlreadyExistsError, KubeClient, ResourceKind, kinds
from ambit.lab.controllers import revisions
from ambit.lab.controllers.ownership import Object, is_controlled_by, key_of, name_of
from ambit.lab.controllers.reconcile import SyncError
from ambit.lab.controllers.selectors import labels_of


async def sync_history(
    client: KubeClient, cache: Informer, owner: Object, owner_kind: ResourceKind
) -> tuple[Object, list[Object]]:
    """The owner's current revision (made or renumbered as needed) and its old ones, lowest number first."""
    namespace = key_of(owner)[0]
    owned = [r for r in cache.items() if key_of(r)[0] == namespace and is_controlled_by(r, owner)]
    history = revisions.sort_out(owner, owned)
    kept = [*history.old, *([history.current] if history.current else [])]
    for revision in [r for r in kept if not revisions.hash_of(r)]:
        labels = {**labels_of(revision), revisions.HASH_LABEL: name_of(revision)}
        await client.patch(kinds.CONTROLLER_REVISIONS, name_of(revision), {"metadata": {"labels": labels}}, namespace)
    for duplicate in history.duplicates:
        await client.delete(kinds.CONTROLLER_REVISIONS, name_of(duplicate), namespace)
    current = history.current
    if current is None:
        current = await _snapshot(client, owner, owner_kind, history.next_number)
    elif revisions.number_of(current) < history.next_number:
        patch = {"revision": history.next_number}
        current = await client.patch(kinds.CONTROLLER_REVISIONS, name_of(current), patch, namespace)
    return current, history.old


async def _snapshot(client: KubeClient, owner: Object, owner_kind: ResourceKind, number: int) -> Object:
    namespace = key_of(owner)[0]
    body = revisions.new_revision(owner, number)
    try:
        return await client.create(kinds.CONTROLLER_REVISIONS, body, namespace)
    except KubeAlreadyExistsError:
        existing = await client.get(kinds.CONTROLLER_REVISIONS, body["metadata"]["name"], namespace)
        if is_controlled_by(existing, owner) and revisions.matches(owner, existing):
            return existing
        collisions = revisions.collision_count(owner) + 1
        await client.patch_status(owner_kind, name_of(owner), {"status": {"collisionCount": collisions}}, namespace)
        raise SyncError(
            "FailedCreate",
            f"controller revision {name_of(existing)} exists with another template; collisionCount now {collisions}",
        ) from None
