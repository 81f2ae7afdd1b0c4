"""ConfigMaps the CA keeps in every namespace: ``istio-ca-root-cert`` (the root) and ``istio-ca-crl`` (the CRL).

Theory of operation: a :class:`ConfigMapPublisher` keeps ConfigMap ``name`` with the one data key ``key`` equal to
its value in every namespace, as istiod's namespace controller does. It watches Namespaces and those ConfigMaps
with two informers; any event that may leave a namespace's map missing or wrong queues that namespace, and one
worker reconciles queued namespaces from the caches: :func:`plan_config_map` (pure) says whether to create, patch
or leave it. Terminating namespaces are left alone (the API server would refuse a create). Failed writes are
retried after a delay. :meth:`ConfigMapPublisher.set_value` publishes a new value (a rotated root, a new CRL) to
every namespace.

A publisher may start without a value (the CRL before its file exists): it then writes nothing until it has one.

Invariants: only the publisher's own key is written (a patch leaves any other key alone); a map is written only
when it is missing or its value differs, so an unchanged value costs no writes however often it is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Mapping
from typing import Any

from ambit.k8s.client import KubeClient
from ambit.k8s.errors import KubeAlreadyExistsError, KubeClientError, KubeNotFoundError
from ambit.k8s.informer import Informer
from ambit.k8s.kinds import CONFIG_MAPS, NAMESPACES

log = logging.getLogger(__name__)

CONFIG_LABELS = {"istio.io/config": "true"}


class Plan(enum.Enum):
    NOTHING = "nothing"
    CREATE = "create"
    PATCH = "patch"


def config_map(name: str, namespace: str, key: str, value: str) -> dict[str, Any]:
    """ConfigMap ``name`` for ``namespace`` holding ``value`` under ``key``."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(CONFIG_LABELS)},
        "data": {key: value},
    }


def plan_config_map(
    namespace: Mapping[str, Any] | None, current: Mapping[str, Any] | None, key: str, value: str | None
) -> Plan:
    """What to do so that ``namespace`` holds ``value`` under ``key`` (``current`` is the map it holds now);
    nothing while there is no value yet."""
    if namespace is None or value is None:
        return Plan.NOTHING
    meta, status = namespace.get("metadata") or {}, namespace.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") == "Terminating":
        return Plan.NOTHING
    if current is None:
        return Plan.CREATE
    if (current.get("data") or {}).get(key) != value:
        return Plan.PATCH
    return Plan.NOTHING


class ConfigMapPublisher:
    """Keeps ConfigMap ``name`` (``key``: the value) right in every namespace; ``async with`` it (or
    ``start``/``aclose``)."""

    def __init__(self, client: KubeClient, name: str, key: str, value: str | None, *, retry_delay: float = 1.0) -> None:
        """``value`` None: publish nothing until :meth:`set_value` gives one."""
        self._client = client
        self.name = name
        self.key = key
        self._value = value
        self._retry_delay = retry_delay
        self._pending: set[str] = set()
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._retries: set[asyncio.Task[None]] = set()
        self.namespaces = Informer(client, NAMESPACES, on_add=self._namespace_seen, on_update=self._namespace_changed)
        self.config_maps = Informer(
            client,
            CONFIG_MAPS,
            field_selector={"metadata.name": name},
            on_add=self._map_seen,
            on_update=self._map_changed,
            on_delete=self._map_seen,
        )

    @property
    def value(self) -> str | None:
        return self._value

    def set_value(self, value: str) -> None:
        """Publish ``value`` to every namespace (each map that differs is patched)."""
        if value == self._value:
            return
        self._value = value
        for namespace in self.namespaces.items():
            self._queue(str(namespace["metadata"]["name"]))

    async def start(self) -> None:
        """Start watching, wait for both caches, then start reconciling."""
        self.config_maps.start()
        self.namespaces.start()
        await self.config_maps.wait_synced()
        await self.namespaces.wait_synced()
        if self._worker is None:
            self._worker = asyncio.create_task(self._run(), name=f"{self.name} publisher")

    async def aclose(self) -> None:
        tasks = [t for t in (self._worker, *self._retries) if t is not None]
        self._worker = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.namespaces.aclose()
        await self.config_maps.aclose()

    async def __aenter__(self) -> ConfigMapPublisher:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _namespace_seen(self, namespace: dict[str, Any]) -> None:
        self._queue(str(namespace["metadata"]["name"]))

    def _namespace_changed(self, _old: dict[str, Any], new: dict[str, Any]) -> None:
        self._namespace_seen(new)

    def _map_seen(self, config_map: dict[str, Any]) -> None:
        self._queue(str(config_map["metadata"].get("namespace") or ""))

    def _map_changed(self, _old: dict[str, Any], new: dict[str, Any]) -> None:
        self._map_seen(new)

    def _queue(self, namespace: str) -> None:
        if namespace:
            self._pending.add(namespace)
            self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            pending, self._pending = self._pending, set()
            for namespace in sorted(pending):
                if not await self._reconcile(namespace):
                    self._retry_later(namespace)

    async def _reconcile(self, namespace: str) -> bool:
        value = self._value
        current = self.config_maps.find(self.name, namespace)
        plan = plan_config_map(self.namespaces.find(namespace), current, self.key, value)
        if value is None or plan is Plan.NOTHING:
            return True
        try:
            if plan is Plan.CREATE:
                await self._client.create(CONFIG_MAPS, config_map(self.name, namespace, self.key, value), namespace)
            elif plan is Plan.PATCH:
                await self._client.patch(CONFIG_MAPS, self.name, {"data": {self.key: value}}, namespace)
        except KubeAlreadyExistsError:
            return False  # our cache is behind; look again once it has caught up
        except KubeNotFoundError:
            return plan is Plan.CREATE  # the namespace went away (create), or the map did (patch: retry)
        except KubeClientError as exc:
            log.warning("cannot %s %s in namespace %s: %s", plan.value, self.name, namespace, exc)
            return False
        log.info("%sed %s in namespace %s", plan.value.removesuffix("e"), self.name, namespace)
        return True

    def _retry_later(self, namespace: str) -> None:
        async def retry() -> None:
            await asyncio.sleep(self._retry_delay)
            self._queue(namespace)

        task = asyncio.create_task(retry(), name=f"{self.name} publisher retry {namespace}")
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)
