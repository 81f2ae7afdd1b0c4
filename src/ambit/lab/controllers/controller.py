"""What every controller shell here has in common: the I/O seams, the work queue, the cache of the kind it
reconciles, and the writes that owners of other objects repeat (kube's ``controller_utils`` and ``PodControl``).

A controller is a :class:`Controller` subclass that names its ``objects`` (the informer whose keys it
reconciles), builds its own state and adds its informer handlers in ``setup()`` (handlers only queue keys; they
first run when the manager starts the informers, after every controller is built) and implements ``reconcile(key)``; the
:class:`~ambit.lab.controllers.reconcile.ReconcileLoop` runs it. Rules:

1. Level-triggered: a reconcile reads everything it needs from the shared caches at the time it runs, so that
   queueing a key is always safe (a key queued twice coalesces, a key queued for a reason that has passed costs
   one idle reconcile) and a resync (``all_keys``: by default every cached object) converges whatever a
   handler missed.
2. One queue per controller, with the retry back-off of the settings; keys are ``(namespace, name)``.
3. :meth:`Controller.claim` is kube's ``ClaimObjects``: the owner adopts the matching orphans of its namespace
   and releases what it controls but no longer selects, before it counts what it owns.
4. :class:`PodOwner` adds expectations (:mod:`expectations`) and deleting pods with them: every issued delete is
   expected before it is sent and struck off when it fails, so a failed delete never blocks the owner until the
   expectations time out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ambit.k8s import EventRecorder, Informer, KubeClient, KubeClientError, KubeNotFoundError, ResourceKind, kinds
from ambit.lab.controllers.expectations import Expectations
from ambit.lab.controllers.ownership import (
    Object,
    adoption_patch,
    claim,
    controller_key,
    is_deleting,
    key_of,
    name_of,
    release_patch,
)
from ambit.lab.controllers.reconcile import SyncError
from ambit.lab.controllers.selectors import labels_of
from ambit.lab.controllers.settings import ControllerSettings, Informers
from ambit.lab.controllers.workqueue import Key, WorkQueue
from ambit.model.labels import selector_matches


class Controller:
    """The shell of one controller (rules 1-3 in the module docstring); subclasses set ``name`` and override
    :meth:`setup`, :attr:`objects` and ``reconcile``."""

    name: str
    """The controller's name, as kube-controller-manager calls it (``replicaset-controller``)."""
    failure_reason: str = "FailedSync"
    """The Warning Event reason for failures that are not a SyncError."""

    def __init__(
        self,
        client: KubeClient,
        informers: Informers,
        recorder: EventRecorder,
        settings: ControllerSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.informers = informers
        self.recorder = recorder
        self.settings = settings
        self.clock = clock
        self.queue = WorkQueue(self.name, initial=settings.retry_initial, maximum=settings.retry_max)
        self.setup()

    def setup(self) -> None:
        """Build this controller's own state and add its informer handlers (called once, by ``__init__``)."""
        raise NotImplementedError

    @property
    def objects(self) -> Informer:
        """The cache of the kind whose keys this controller reconciles."""
        raise NotImplementedError

    def find(self, key: Key) -> Object | None:
        return self.objects.find(key[1], key[0])

    def all_keys(self) -> list[Key]:
        """What a resync queues: every cached object of :attr:`objects` (narrowed by controllers that reconcile
        only some of them)."""
        return [key_of(obj) for obj in self.objects.items()]

    def enqueue(self, obj: Object) -> None:
        self.queue.add(key_of(obj))

    def watch_objects(self, *, on_delete: Callable[[Object], None] | None = None) -> None:
        """Queue each object of :attr:`objects` that is added or updated, and on deletion call ``on_delete``
        (default: queue it too)."""
        self.objects.add_handler(
            on_add=self.enqueue,
            on_update=lambda old, new: self.enqueue(new),
            on_delete=self.enqueue if on_delete is None else on_delete,
        )

    def enqueue_selecting(self, obj: Object) -> None:
        """Queue the objects of :attr:`objects` in ``obj``'s namespace whose ``spec.selector`` selects it (an
        orphan changed: whoever may adopt it looks again)."""
        namespace, labels = key_of(obj)[0], labels_of(obj)
        for owner in self.objects.items():
            if key_of(owner)[0] == namespace and selector_matches((owner.get("spec") or {}).get("selector"), labels):
                self.queue.add(key_of(owner))

    async def claim(
        self, owner: Object, kind: ResourceKind, cache: Informer, member: Callable[[Object], bool] | None = None
    ) -> list[Object]:
        """Rule 3: the objects of ``cache`` (of ``kind``) that ``owner`` controls once it has adopted and
        released; adopted ones as the server returned them. ``member``, when given, must also hold for an object
        to be claimed (kube's claim filters: a StatefulSet claims only pods named as its members)."""
        namespace = key_of(owner)[0]
        selector = (owner.get("spec") or {}).get("selector")
        candidates = [obj for obj in cache.items() if key_of(obj)[0] == namespace]
        claimed = claim(
            owner,
            candidates,
            lambda labels: selector_matches(selector, labels),
            member,
        )
        for obj in claimed.release:
            await self.client.patch(kind, name_of(obj), release_patch(obj, owner), namespace)
        owned = list(claimed.owned)
        for obj in claimed.adopt:
            owned.append(await self.client.patch(kind, name_of(obj), adoption_patch(obj, owner), namespace))
        return owned


class PodOwner(Controller):
    """A controller whose objects own pods directly (ReplicaSet, DaemonSet): rule 4, and the pod handlers that
    queue a pod's owner (or, for an orphan whose labels or owner changed, whoever may adopt it)."""

    owner_kind: str
    """The kind of :attr:`objects`, as pods' controller references name it."""

    def setup(self) -> None:
        self.expectations = Expectations(self.settings.expectations_timeout)
        self.informers.pods.add_handler(
            on_add=self._pod_added, on_update=self._pod_updated, on_delete=self._pod_deleted
        )

    def _pod_added(self, pod: Object) -> None:
        if is_deleting(pod):
            self._pod_deleted(pod)
            return
        owner = controller_key(pod, self.owner_kind)
        if owner is None:
            self.enqueue_selecting(pod)
            return
        self.expectations.creation_observed(owner)
        self.queue.add(owner)

    def _pod_updated(self, old: Object, new: Object) -> None:
        if is_deleting(new) and not is_deleting(old):
            self._pod_deleted(new)
        old_owner, new_owner = controller_key(old, self.owner_kind), controller_key(new, self.owner_kind)
        if old_owner is not None and old_owner != new_owner:
            self.queue.add(old_owner)
        if new_owner is not None:
            self.queue.add(new_owner)
        elif labels_of(old) != labels_of(new) or old_owner is not None:
            self.enqueue_selecting(new)

    def _pod_deleted(self, pod: Object) -> None:
        owner = controller_key(pod, self.owner_kind)
        if owner is not None:
            self.expectations.deletion_observed(owner, key_of(pod))
            self.queue.add(owner)

    def deleted_note(self, owner: Object, pod: Object) -> str:
        """The note of the ``SuccessfulDelete`` Event (each kube controller words it its own way)."""
        return f"Deleted pod: {name_of(pod)}"

    async def delete_pods(self, key: Key, owner: Object, victims: list[Object]) -> None:
        """Delete ``victims`` at once (a pod already gone counts as deleted), a Normal Event ``SuccessfulDelete``
        for each; the first other failure raises a SyncError ``FailedDelete`` once all were tried."""
        if not victims:
            return
        self.expectations.expect_deletions(key, [key_of(p) for p in victims])
        results = await asyncio.gather(
            *(self.client.delete(kinds.PODS, name_of(p), key[0]) for p in victims), return_exceptions=True
        )
        failure: BaseException | None = None
        for pod, result in zip(victims, results, strict=True):
            if isinstance(result, BaseException):
                self.expectations.deletion_observed(key, key_of(pod))
                if not isinstance(result, KubeNotFoundError):
                    failure = failure or result
            else:
                self.recorder.record(owner, "Normal", "SuccessfulDelete", self.deleted_note(owner, pod), "Delete")
        if failure is not None:
            if not isinstance(failure, KubeClientError):
                raise failure
            raise SyncError("FailedDelete", f"Error deleting: {failure}") from failure
