"""The retried steps around a pod's sandbox and volumes (rules 1 and 2b of :mod:`ambit.lab.runtime.pod_worker`).

Theory of operation. A pod worker decides when its sandbox is made and destroyed and when its volumes are set up;
:class:`PodSetup` carries each step out against the node runtime (:class:`~ambit.lab.runtime.pod_host.PodHost`)
and keeps trying as the kubelet does:

- creating the sandbox (CNI ADD, in the pod's own user namespace when ``hostUsers`` is false) is retried with a
  back-off (``sandbox_backoff_initial`` doubling to ``sandbox_backoff_max``) until it works; each failure is a
  Warning ``FailedCreatePodSandBox`` Event ("Failed to create pod sandbox: …") and is told to the worker, which
  shows it in the pod's status;
- destroying it is tried three times with the same back-off, each failure a Warning ``FailedKillPod``; the worker
  then forgets the sandbox whatever happened (a later destroy of the same uid retries with the CNI cache);
- setting up the volumes is retried with the back-off, each failure a Warning ``FailedMount`` with the kubelet's
  text; a volume that can never work is reported once and the step waits until the pod is deleted (rule 4 cancels
  it). While the pod runs, its volumes are refreshed every ``volume_resync_seconds``, or sooner when a projected
  token is due.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ambit.lab.network.plugins import CniInvocationError
from ambit.lab.runtime.containers_apply import EventType
from ambit.lab.runtime.pod_record import SavedSandbox
from ambit.lab.runtime.pod_status import sandbox_error_message
from ambit.lab.runtime.userns import hosts_users
from ambit.lab.runtime.volumes import VolumeError
from ambit.lab.runtime.volumes_apply import PodVolumes

if TYPE_CHECKING:
    from ambit.lab.runtime.pod_host import PodHost

log = logging.getLogger("ambit.lab.runtime.kubelet")


class PodSetup:
    """Rules 1 and 2b for one pod: its sandbox and its volumes, each step retried with the back-off."""

    def __init__(
        self,
        runtime: PodHost,
        pod: Callable[[], dict[str, Any]],
        uid: str,
        volumes: PodVolumes,
        event: Callable[[EventType, str, str], None],
    ) -> None:
        self.runtime = runtime
        self.pod = pod
        """The pod as the informer last saw it."""
        self.uid = uid
        self.volumes = volumes
        self.event = event

    async def create_sandbox(self, failed: Callable[[str], None]) -> SavedSandbox:
        """Rule 1: make the pod's sandbox, trying again after each failure (told to ``failed``) until it is made."""
        s = self.runtime.settings
        delay = s.sandbox_backoff_initial
        while True:
            pod = self.pod()
            try:
                user_ids = None if hosts_users(pod) else self.runtime.user_namespace(self.uid)
                made = await self.runtime.sandboxes.create(pod, user_ids)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                message = sandbox_error_message(exc)
                meta = pod.get("metadata") or {}
                log.warning(
                    "pod %s/%s: sandbox: %s (retrying in %gs)",
                    meta.get("namespace") or "",
                    meta.get("name") or "",
                    message,
                    delay,
                    exc_info=not isinstance(exc, CniInvocationError),
                )
                self.event("Warning", "FailedCreatePodSandBox", f"Failed to create pod sandbox: {message}")
                failed(message)
                await self.runtime.sleep(delay)
                delay = min(delay * 2, s.sandbox_backoff_max)
                continue
            return SavedSandbox(str(made.netns), str(made.netns_path), tuple(str(ip) for ip in made.ips))

    async def destroy_sandbox(self) -> None:
        """Rule 1's end: destroy the pod's sandbox, three tries at most."""
        s = self.runtime.settings
        delay = s.sandbox_backoff_initial
        for attempt in range(3):
            try:
                await self.runtime.sandboxes.destroy(self.uid)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                message = sandbox_error_message(exc)
                self.event("Warning", "FailedKillPod", f"error killing pod: failed to destroy its sandbox: {message}")
                if attempt < 2:
                    await self.runtime.sleep(delay)
                    delay = min(delay * 2, s.sandbox_backoff_max)

    async def ensure_volumes(self) -> None:
        """Rule 2b: set the pod's volumes up, trying again after a failure that may pass."""
        s = self.runtime.settings
        delay = s.sandbox_backoff_initial
        while True:
            try:
                await self.volumes.set_up()
                return
            except VolumeError as exc:
                self.event("Warning", "FailedMount", str(exc))
                if not exc.retry:
                    await asyncio.Event().wait()  # until the pod is deleted (the worker's rule 4 cancels this)
            await self.runtime.sleep(delay)
            delay = min(delay * 2, s.sandbox_backoff_max)

    async def resync_volumes(self) -> None:
        """Rule 2b while the pod runs: refresh its volumes, for ever (until cancelled)."""
        s = self.runtime.settings
        while True:
            wait = s.volume_resync_seconds
            due = self.volumes.next_refresh()
            if due is not None:
                wait = max(1.0, min(wait, due - self.runtime.clock()))
            await self.runtime.sleep(wait)
            try:
                await self.volumes.resync()
            except VolumeError as exc:
                self.event("Warning", "FailedMount", str(exc))
