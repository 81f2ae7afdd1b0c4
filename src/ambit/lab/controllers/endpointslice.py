"""The EndpointSlice controller: every Service with a selector gets EndpointSlices for its pods.

A reconcile, for one Service: read the Service, its pods and its managed slices from the caches, plan the writes
(:mod:`slicing`), and make them — creates, then updates, then deletes, so the Service never goes without
endpoints in between. A Service that is gone, being deleted, of type ExternalName, or without a selector gets
its managed slices deleted (slices without our ``managed-by`` label are someone else's and are never touched).

Our own writes outrun the informer: a reconcile right after a create would not see the new slice and create
another. So, as kube's EndpointSliceTracker, :class:`SliceTracker` remembers the generation of every slice we
wrote and the slices we deleted; while the cache is behind any of them the Service's reconcile waits (the
slice's watch event queues the Service again once the cache catches up).
"""

from __future__ import annotations

import logging

from ambit.k8s import KubeNotFoundError, kinds
from ambit.lab.controllers.endpoints import pod_endpoints, service_address_types
from ambit.lab.controllers.ownership import Object, is_deleting, key_of, name_of
from ambit.lab.controllers.selectors import labels_of, service_selector
from ambit.lab.controllers.service_pods import ServicePodsController
from ambit.lab.controllers.slicing import CONTROLLER, MANAGED_BY, SERVICE_NAME, plan_family_slices
from ambit.lab.controllers.workqueue import Key

log = logging.getLogger("ambit.lab.controllers.endpointslice")

_DELETED = -1
STALE_RECHECK = 1.0
"""Seconds after which a Service whose slices the cache has not caught up with is looked at anyway."""


def _generation(obj: Object) -> int:
    value = (obj.get("metadata") or {}).get("generation", 0)
    return value if isinstance(value, int) else 0


class SliceTracker:
    """Generations of the slices we wrote (or ``_DELETED``), per Service, until the cache shows them."""

    def __init__(self) -> None:
        self._expected: dict[Key, dict[str, int]] = {}

    def wrote(self, service: Key, slice_obj: Object) -> None:
        self._expected.setdefault(service, {})[name_of(slice_obj)] = _generation(slice_obj)

    def deleted(self, service: Key, name: str) -> None:
        self._expected.setdefault(service, {})[name] = _DELETED

    def gone(self, service: Key, name: str) -> None:
        """The cache saw the slice deleted: nothing more to expect of it."""
        expected = self._expected.get(service)
        if expected is not None:
            expected.pop(name, None)

    def stale(self, service: Key, cached: list[Object]) -> bool:
        """Whether the cache is behind our writes; entries it has caught up with are dropped."""
        expected = self._expected.get(service)
        if not expected:
            return False
        seen = {name_of(s): _generation(s) for s in cached}
        for name, generation in list(expected.items()):
            caught_up = name not in seen if generation == _DELETED else seen.get(name, -1) >= generation
            if caught_up:
                del expected[name]
        if not expected:
            del self._expected[service]
            return False
        return True

    def forget(self, service: Key) -> None:
        self._expected.pop(service, None)


class EndpointSliceController(ServicePodsController):
    name = "endpointslice-controller"
    failure_reason = "FailedToUpdateEndpointSlices"

    def setup(self) -> None:
        super().setup()
        self.tracker = SliceTracker()
        self.informers.endpointslices.add_handler(
            on_add=self._slice_changed, on_update=lambda old, new: self._slice_changed(new), on_delete=self._slice_gone
        )

    def _service_of(self, slice_obj: Object) -> Key | None:
        labels = labels_of(slice_obj)
        if labels.get(MANAGED_BY) != CONTROLLER or not labels.get(SERVICE_NAME):
            return None
        return (key_of(slice_obj)[0], labels[SERVICE_NAME])

    def _slice_changed(self, slice_obj: Object) -> None:
        service = self._service_of(slice_obj)
        if service is not None:
            self.queue.add(service)

    def _slice_gone(self, slice_obj: Object) -> None:
        service = self._service_of(slice_obj)
        if service is not None:
            self.tracker.gone(service, name_of(slice_obj))
            self.queue.add(service)

    def managed_slices(self, key: Key) -> list[Object]:
        return [s for s in self.informers.endpointslices.items() if self._service_of(s) == key]

    async def reconcile(self, key: Key) -> float | None:
        namespace = key[0]
        existing = self.managed_slices(key)
        if self.tracker.stale(key, existing):
            return STALE_RECHECK
        service = self.find(key)
        if (
            service is None
            or is_deleting(service)
            or (service.get("spec") or {}).get("type") == "ExternalName"
            or service_selector(service) is None
        ):
            for current in existing:
                await self._delete(key, current)
            if service is None:
                self.tracker.forget(key)
            return None
        pods = self.find_pods(service)
        endpoints = {family: pod_endpoints(service, pods, family) for family in service_address_types(service)}
        plan = plan_family_slices(service, endpoints, existing, self.settings.max_endpoints_per_slice)
        for body in plan.create:
            created = await self.client.create(kinds.ENDPOINT_SLICES, body, namespace)
            self.tracker.wrote(key, created)
        for body in plan.update:
            updated = await self.client.replace(kinds.ENDPOINT_SLICES, body, namespace)
            self.tracker.wrote(key, updated)
        for current in plan.delete:
            await self._delete(key, current)
        if plan:
            log.debug(
                "%s/%s: %d slices created, %d updated, %d deleted",
                *key,
                len(plan.create),
                len(plan.update),
                len(plan.delete),
            )
        return None

    async def _delete(self, key: Key, current: Object) -> None:
        self.tracker.deleted(key, name_of(current))
        try:
            await self.client.delete(kinds.ENDPOINT_SLICES, name_of(current), key[0])
        except KubeNotFoundError:
            self.tracker.gone(key, name_of(current))
        except BaseException:
            self.tracker.gone(key, name_of(current))  # it may still be there: do not wait for it to go
            raise
