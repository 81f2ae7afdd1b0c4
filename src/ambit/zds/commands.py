"""What the ZDS sessions ask their shell to do. Commands are imperative; a shell that meets one it does not know raises.

fd ownership: an fd named in :class:`OpenPodListeners` passes to the shell (it keeps or closes it); an fd named in
:class:`CloseFds` arrived with a rejected datagram and must be closed. :class:`SendMessage` only borrows its fds.
"""

from __future__ import annotations

from dataclasses import dataclass

from ambit.zds.events import Event
from ambit.zds.protocol import WorkloadInfo


@dataclass(frozen=True, slots=True)
class SendMessage:
    """Send one datagram, with ``fds`` as SCM_RIGHTS ancillary data."""

    data: bytes
    fds: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class CloseConnection:
    reason: str


@dataclass(frozen=True, slots=True)
class CloseFds:
    fds: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OpenPodListeners:
    """Start (or restart, latest netns wins) the pod's proxy in the netns ``fd``; then report back to the session."""

    uid: str
    info: WorkloadInfo
    fd: int


@dataclass(frozen=True, slots=True)
class StopPodProxy:
    """Stop the pod's proxy now (the pod is gone or was not in the snapshot: no drain)."""

    uid: str


Command = SendMessage | CloseConnection | CloseFds | OpenPodListeners | StopPodProxy
Output = Event | Command
