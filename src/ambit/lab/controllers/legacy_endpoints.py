"""The Endpoints controller: a core/v1 ``Endpoints`` object per Service with a selector, for kubectl users.

The object has the Service's name and labels; its ``subsets`` group the addresses by port list, ready ones in
``addresses`` and the others in ``notReadyAddresses`` (:func:`endpoints.endpoints_subsets`; terminating pods are
left out). It is written (create, or a PUT carrying the cached ``resourceVersion``) only when labels or subsets
differ, so a stale cache makes the write fail with 409 and the Service is looked at again.

When a Service is deleted its Endpoints object is deleted with it. Endpoints of a Service without a selector
are left alone: they are the user's (as with kube's endpoints controller, which never touches them). An
Endpoints object is watched so that one deleted or edited by hand is put back.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

from ambit.k8s import KubeAlreadyExistsError, KubeNotFoundError
from ambit.lab.controllers.endpoints import endpoints_subsets
from ambit.lab.controllers.ownership import Object, is_deleting, key_of
from ambit.lab.controllers.selectors import labels_of, service_selector
from ambit.lab.controllers.service_pods import ServicePodsController
from ambit.lab.controllers.settings import ENDPOINTS
from ambit.lab.controllers.slicing import HEADLESS
from ambit.lab.controllers.workqueue import Key

ALREADY_EXISTS_RECHECK = 0.2
"""Seconds before looking again at a Service whose Endpoints object exists but is not in the cache yet."""


class EndpointsController(ServicePodsController):
    name = "endpoints-controller"
    failure_reason = "FailedToUpdateEndpoint"

    def setup(self) -> None:
        super().setup()
        self.informers.endpoints.add_handler(
            on_update=lambda old, new: self._endpoints_changed(new), on_delete=self._endpoints_changed
        )

    def _endpoints_changed(self, endpoints: Object) -> None:
        service = self.find(key_of(endpoints))
        if service is not None and service_selector(service) is not None:
            self.queue.add(key_of(endpoints))

    async def reconcile(self, key: Key) -> float | None:
        namespace, name = key
        current = self.informers.endpoints.find(name, namespace)
        service = self.find(key)
        if service is None:  # queued by the Service's deletion: delete even what the cache has not shown yet
            with contextlib.suppress(KubeNotFoundError):
                await self.client.delete(ENDPOINTS, name, namespace)
            return None
        if is_deleting(service) or service_selector(service) is None:
            return None
        labels = {k: v for k, v in labels_of(service).items() if k != HEADLESS}
        if (service.get("spec") or {}).get("clusterIP") == "None":
            labels[HEADLESS] = ""
        subsets = endpoints_subsets(service, self.find_pods(service))
        if current is None:
            body: dict[str, Any] = {"metadata": {"name": name, "namespace": namespace, "labels": labels}}
            if subsets:
                body["subsets"] = subsets
            try:
                await self.client.create(ENDPOINTS, body, namespace)
            except KubeAlreadyExistsError:
                return ALREADY_EXISTS_RECHECK
            return None
        if labels_of(current) == labels and (current.get("subsets") or []) == subsets:
            return None
        body = {"metadata": copy.deepcopy(current.get("metadata") or {})}
        body["metadata"]["labels"] = labels
        if subsets:
            body["subsets"] = subsets
        await self.client.replace(ENDPOINTS, body, namespace)
        return None
