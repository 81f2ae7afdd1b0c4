"""The control plane's view of the cluster: informers over the objects the workload API is made from.

Theory of operation: informers over Pods, Services, EndpointSlices and Namespaces fill their caches; every change
only marks the view dirty. One task waits for the mark, lets ``debounce`` seconds pass so that a burst of changes
(a Deployment scaling up, a namespace being deleted) becomes one translation, clears the mark, translates the
caches (:func:`ambit.controlplane.translate.translate`) and hands the result to ``on_config``.

Invariants:

- Nothing is handed over before every informer has listed once: a partial cache would tell the proxies that
  workloads are gone.
- A change that arrives while ``on_config`` runs marks the view dirty again and causes another translation.
- ``on_config`` failing (``OSError``, e.g. a full disk for the file writer) is retried after the next debounce.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ambit.controlplane.translate import translate
from ambit.errors import AmbitError
from ambit.k8s import Informer, InformerSettings, KubeClient, kinds
from ambit.model.localconfig import LocalConfig

log = logging.getLogger("ambit.controlplane.view")


class ClusterViewError(AmbitError):
    """The cluster view could not start (the API server did not answer in time)."""


@dataclass(frozen=True, slots=True)
class ClusterViewSettings:
    debounce: float = 0.1
    """Seconds to let changes gather before translating."""
    cluster_id: str = "Kubernetes"
    trust_domain: str = "cluster.local"
    domain: str = "cluster.local"
    """The cluster's DNS domain (Service hostnames are ``<name>.<ns>.svc.<domain>``)."""
    sync_timeout: float = 60.0
    """Seconds to wait for the informers' first lists before giving up."""
    informer: InformerSettings | None = None


class ClusterView:
    """Calls ``on_config`` with the translated cluster after the first sync and after every burst of changes."""

    def __init__(
        self, client: KubeClient, settings: ClusterViewSettings, on_config: Callable[[LocalConfig], None]
    ) -> None:
        self.settings = settings
        self._on_config = on_config
        self._dirty = asyncio.Event()
        self._informers = {
            kind.plural: Informer(
                client,
                kind,
                on_add=self._changed,
                on_update=self._updated,
                on_delete=self._changed,
                settings=settings.informer,
            )
            for kind in (kinds.PODS, kinds.SERVICES, kinds.ENDPOINT_SLICES, kinds.NAMESPACES)
        }
        self._task: asyncio.Task[None] | None = None

    def _changed(self, obj: dict[str, Any]) -> None:
        self._dirty.set()

    def _updated(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        self._dirty.set()

    def translate(self) -> LocalConfig:
        """The workload API's content for the current caches."""
        s, inf = self.settings, self._informers
        return translate(
            inf["pods"].items(),
            inf["services"].items(),
            inf["endpointslices"].items(),
            inf["namespaces"].items(),
            cluster_id=s.cluster_id,
            trust_domain=s.trust_domain,
            domain=s.domain,
        )

    async def start(self) -> None:
        """Start the informers, wait until each has listed, hand over once, then follow changes."""
        if self._task is not None:
            return
        for informer in self._informers.values():
            informer.start()
        try:
            async with asyncio.timeout(self.settings.sync_timeout):
                for informer in self._informers.values():
                    await informer.wait_synced()
            self._dirty.clear()
            self._on_config(self.translate())
        except TimeoutError:
            await self.aclose()
            raise ClusterViewError(
                f"the cluster view's caches did not sync within {self.settings.sync_timeout:g} s"
            ) from None
        except BaseException:
            await self.aclose()
            raise
        self._task = asyncio.get_running_loop().create_task(self._run(), name="cluster view")

    async def _run(self) -> None:
        while True:
            await self._dirty.wait()
            await asyncio.sleep(self.settings.debounce)
            self._dirty.clear()
            try:
                self._on_config(self.translate())
            except OSError as exc:
                log.error("cannot apply the cluster's configuration: %s", exc)
                self._dirty.set()  # try again after the next debounce
                await asyncio.sleep(1.0)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for informer in self._informers.values():
            await informer.aclose()

    async def __aenter__(self) -> ClusterView:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
