"""What a pod worker needs of its node runtime: :class:`PodHost`.

The node runtime (:class:`ambit.lab.runtime.kubelet.NodeRuntime`) is the one implementation; a pod worker
(:mod:`ambit.lab.runtime.pod_worker`) and the parts it delegates to (:mod:`ambit.lab.runtime.pod_token`,
:mod:`ambit.lab.runtime.pod_launch`) see the runtime only through this protocol: its settings, the API client, the
sandbox manager, the container runtime, the clock and sleep, Events, the pod's directory and its user-namespace ids.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ambit.k8s import KubeClient
    from ambit.lab.runtime.containers_apply import ContainerRuntime, EventType
    from ambit.lab.runtime.kubelet import NodeRuntimeSettings, SandboxManager
    from ambit.lab.runtime.node_status import HostInfo
    from ambit.lab.runtime.processes import ProcessHandle
    from ambit.lab.runtime.userns import IdRange


class PodHost(Protocol):
    """What a pod worker uses of its node runtime (:class:`ambit.lab.runtime.kubelet.NodeRuntime` is the one)."""

    @property
    def settings(self) -> NodeRuntimeSettings: ...
    @property
    def client(self) -> KubeClient: ...
    @property
    def sandboxes(self) -> SandboxManager: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def sleep(self) -> Callable[[float], Awaitable[None]]: ...
    @property
    def containers(self) -> ContainerRuntime: ...
    @property
    def host(self) -> HostInfo: ...

    def event(self, regarding: Mapping[str, Any], type: EventType, reason: str, note: str) -> None:
        """Record a Kubernetes Event about ``regarding``."""
        ...

    def pod_dir(self, uid: str) -> Path:
        """The directory of the pod's files."""
        ...

    def user_namespace(self, uid: str) -> IdRange:
        """The pod's user namespace ids (``hostUsers: false``); raises :class:`UsernsError`."""
        ...

    def release_user_namespace(self, uid: str) -> None:
        """The pod is gone: its ids may go to another pod."""
        ...

    async def note_process(self, handle: ProcessHandle, what: str) -> None:
        """Note a started process in the lab's record (best effort)."""
        ...
