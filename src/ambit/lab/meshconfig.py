"""The lab's mesh config file: the Workload API's workloads and services, kept current for the node proxies.

Until the control plane serves xDS, each node proxy reads ``<lab>/mesh/workloads.yaml`` (``ambit nodeproxy
--config``). :class:`MeshConfigWriter` keeps that file in step with the cluster, in the controllers process.

Theory of operation: four informers (Pods, Services, EndpointSlices, Namespaces) fill their caches; every change
only marks the config dirty. One task waits for the mark, lets ``debounce`` seconds pass so that a burst of changes
(a Deployment scaling up, a namespace being deleted) becomes one write, clears the mark, translates the caches
(:func:`ambit.controlplane.translate.translate`) and renders them.

Invariants:

- Nothing is written before every informer has listed once: a partial cache would tell the proxies that
  workloads are gone.
- The file is replaced atomically (a temporary file in the same directory, fsync, rename), so a reader sees the
  old content or the new, never a torn one; and only when the rendering differs from what the file holds, so an
  unchanged cluster never touches it (readers may watch its mtime).
- A change that arrives while a write is under way marks the config dirty again and causes another write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from ambit.controlplane.translate import translate
from ambit.errors import AmbitError
from ambit.k8s import Informer, InformerSettings, KubeClient, kinds
from ambit.model.localconfig import render_local_config

log = logging.getLogger("ambit.lab.meshconfig")


class MeshConfigError(AmbitError):
    """The mesh config writer could not start (the API server did not answer in time)."""


@dataclass(frozen=True, slots=True)
class MeshConfigSettings:
    path: Path
    """The file to keep current (``<lab>/mesh/workloads.yaml``)."""
    debounce: float = 0.1
    """Seconds to let changes gather before writing."""
    cluster_id: str = "Kubernetes"
    trust_domain: str = "cluster.local"
    domain: str = "cluster.local"
    """The cluster's DNS domain (Service hostnames are ``<name>.<ns>.svc.<domain>``)."""
    sync_timeout: float = 60.0
    """Seconds to wait for the informers' first lists before giving up."""
    informer: InformerSettings | None = None


class MeshConfigWriter:
    """Writes the mesh config file whenever the translation of the cluster changes."""

    def __init__(self, client: KubeClient, settings: MeshConfigSettings) -> None:
        self.settings = settings
        self.writes = 0
        """How many times the file was replaced (for tests)."""
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

    async def start(self) -> None:
        """Start the informers, wait until each has listed, write once, then follow changes."""
        if self._task is not None:
            return
        for informer in self._informers.values():
            informer.start()
        try:
            async with asyncio.timeout(self.settings.sync_timeout):
                for informer in self._informers.values():
                    await informer.wait_synced()
            self._dirty.clear()
            self.write_now()
        except TimeoutError:
            await self.aclose()
            raise MeshConfigError(
                f"the mesh config writer's caches did not sync within {self.settings.sync_timeout:g} s"
            ) from None
        except BaseException:
            await self.aclose()
            raise
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"mesh config {self.settings.path}")

    async def _run(self) -> None:
        while True:
            await self._dirty.wait()
            await asyncio.sleep(self.settings.debounce)
            self._dirty.clear()
            try:
                self.write_now()
            except OSError as exc:
                log.error("cannot write %s: %s", self.settings.path, exc)
                self._dirty.set()  # try again after the next debounce
                await asyncio.sleep(1.0)

    def render(self) -> str:
        """The file's content for the current caches."""
        s, inf = self.settings, self._informers
        config = translate(
            inf["pods"].items(),
            inf["services"].items(),
            inf["endpointslices"].items(),
            inf["namespaces"].items(),
            cluster_id=s.cluster_id,
            trust_domain=s.trust_domain,
            domain=s.domain,
        )
        return render_local_config(config)

    def write_now(self) -> bool:
        """Render and, if the content differs from the file's, replace the file; True when it was replaced."""
        text = self.render()
        if write_if_changed(self.settings.path, text):
            self.writes += 1
            log.info("wrote %s", self.settings.path)
            return True
        return False

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for informer in self._informers.values():
            await informer.aclose()

    async def __aenter__(self) -> MeshConfigWriter:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def write_if_changed(path: Path, text: str) -> bool:
    """Replace ``path`` with ``text`` atomically unless it already holds exactly that; True when replaced."""
    data = text.encode()
    with contextlib.suppress(OSError):
        if path.read_bytes() == data:
            return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)
    return True
