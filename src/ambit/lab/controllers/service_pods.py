"""What the EndpointSlice and Endpoints controllers share: a queue of Service keys fed by Service and pod changes.

A Service is queued when it changes or goes, and when a pod changes that its selector matches before or after
the change (labels may move a pod in or out). Reconciles read the Service and its pods from the caches.
"""

from __future__ import annotations

from ambit.k8s import Informer
from ambit.lab.controllers.controller import Controller
from ambit.lab.controllers.ownership import Object, key_of
from ambit.lab.controllers.selectors import labels_of, service_selector
from ambit.model.labels import map_matches


class ServicePodsController(Controller):
    name = "service-pods"

    def setup(self) -> None:
        self.watch_objects()
        self.informers.pods.add_handler(
            on_add=self._pod_changed, on_update=self._pod_updated, on_delete=self._pod_changed
        )

    @property
    def objects(self) -> Informer:
        return self.informers.services

    def find_pods(self, service: Object) -> list[Object]:
        """The pods the Service's selector matches, in its namespace (none when it has no selector)."""
        selector = service_selector(service)
        if selector is None:
            return []
        namespace = key_of(service)[0]
        return [
            p for p in self.informers.pods.items() if key_of(p)[0] == namespace and map_matches(selector, labels_of(p))
        ]

    def _pod_changed(self, pod: Object) -> None:
        self._enqueue_selecting(key_of(pod)[0], [labels_of(pod)])

    def _pod_updated(self, old: Object, new: Object) -> None:
        self._enqueue_selecting(key_of(new)[0], [labels_of(old), labels_of(new)])

    def _enqueue_selecting(self, namespace: str, label_sets: list[dict[str, str]]) -> None:
        for service in self.informers.services.items():
            if key_of(service)[0] != namespace:
                continue
            selector = service_selector(service)
            if selector is not None and any(map_matches(selector, labels) for labels in label_sets):
                self.queue.add(key_of(service))
