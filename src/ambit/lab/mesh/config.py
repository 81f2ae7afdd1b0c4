"""The lab's mesh config file: the Workload API's workloads and services, kept current for the node proxies.

A node proxy started without ``--xds-address`` reads its workloads and services from ``<lab>/mesh/workloads.yaml``
(``ambit nodeproxy --config``, whose default in a lab is that file). :class:`MeshConfigWriter` keeps the file in
step with the cluster, in the controllers process.

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

import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from ambit.controlplane.view import ClusterView, ClusterViewError, ClusterViewSettings
from ambit.errors import AmbitError
from ambit.k8s import KubeClient
from ambit.model.localconfig import LocalConfig, render_local_config

log = logging.getLogger("ambit.lab.mesh.config")


class MeshConfigError(AmbitError):
    """The mesh config writer could not start (the API server did not answer in time)."""


@dataclass(frozen=True, slots=True)
class MeshConfigSettings:
    path: Path
    """The file to keep current (``<lab>/mesh/workloads.yaml``)."""
    view: ClusterViewSettings = field(default_factory=ClusterViewSettings)
    """How the cluster is watched and translated (debounce, cluster id, trust domain, DNS domain, timeouts)."""


class MeshConfigWriter:
    """Writes the mesh config file whenever the translation of the cluster changes (a :class:`ClusterView` user)."""

    def __init__(self, client: KubeClient, settings: MeshConfigSettings) -> None:
        self.settings = settings
        self.writes = 0
        """How many times the file was replaced (for tests)."""
        self._view = ClusterView(client, settings.view, self._write)

    async def start(self) -> None:
        """Start the informers, wait until each has listed, write once, then follow changes."""
        try:
            await self._view.start()
        except ClusterViewError as exc:
            raise MeshConfigError(str(exc).replace("cluster view", "mesh config writer")) from None

    def render(self) -> str:
        """The file's content for the current caches."""
        return render_local_config(self._view.translate())

    def _write(self, config: LocalConfig) -> None:
        if write_if_changed(self.settings.path, render_local_config(config)):
            self.writes += 1
            log.info("wrote %s", self.settings.path)

    def write_now(self) -> bool:
        """Render and, if the content differs from the file's, replace the file; True when it was replaced."""
        writes = self.writes
        self._write(self._view.translate())
        return self.writes != writes

    async def aclose(self) -> None:
        await self._view.aclose()

    async def __aenter__(self) -> MeshConfigWriter:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def write_if_changed(path: Path, text: str, *, mode: int = 0o644) -> bool:
    """Replace ``path`` with ``text`` atomically unless it already holds exactly that; True when replaced.

    A new file gets ``mode`` from its creation on (a token is never readable by others, even briefly).
    """
    data = text.encode()
    with contextlib.suppress(OSError):
        if path.read_bytes() == data:
            return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # a leftover from a crash may have another mode
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)
    return True
