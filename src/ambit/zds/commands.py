"""What the ZDS sessions ask their shell to do. Commands are imperative; a shell that meets one it does not know raises.

fd ownership: an fd named in :class:`OpenPodListeners` passes to the shell (it keeps or closes it); an fd named in
:class:`CloseFds` arrived with a rejected datagram and must be closed. :class:`SendMessage` only borrows its fds.
"""

from __future__ import annotations

from msgspec import Struct

from ambit.zds.events import Event
from ambit.zds.protocol import WorkloadInfo


class SendMessage(Struct, frozen=True):
    """Send one datagram, with ``fds`` as SCM_RIGHTS ancillary data."""

    data: bytes
    fds: tuple[int, ...] = ()


class CloseConnection(Struct, frozen=True):
    reason: str


class CloseFds(Struct, frozen=True):
    fds: tuple[int, ...]


class OpenPodListeners(Struct, frozen=True):
    """Start (or restart, latest netns wins) the pod's proxy in the netns ``fd``; then report back to the session."""

    uid: str
    info: WorkloadInfo
    fd: int


class StopPodProxy(Struct, frozen=True):
    """Stop the pod's proxy now (the pod is gone or was not in the snapshot: no drain)."""

    uid: str


Command = SendMessage | CloseConnection | CloseFds | OpenPodListeners | StopPodProxy
Output = Event | Command
