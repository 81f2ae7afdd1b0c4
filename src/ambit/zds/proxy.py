"""The node proxy's side of ZDS (spec §3.3): one :class:`ProxySession` for the proxy's lifetime, across reconnects.

Rules:

1. On every connection the proxy sends ``ZdsHello{V1}`` first and resets the snapshot state (not its pod records:
   proxies keep running across reconnects until a snapshot says otherwise).
2. Before ``SnapshotSent``: ``Add`` starts the pod's proxy and enters the uid into the snapshot set; ``Keep`` enters
   the uid only; ``Del`` stops the pod's proxy and removes the uid from the snapshot set.
3. ``SnapshotSent`` reconciles: every recorded pod whose uid is not in the snapshot set is stopped and dropped. A
   second ``SnapshotSent``, or a ``Keep`` after it, is a protocol error. After it only ``Add`` and ``Del`` are valid.
4. Every request gets exactly one Ack. An Add is acked only once the shell reports its listeners opened (ok) or
   failed (nack with the error; the connection stays up and the pod stays recorded as pending). The agent sends one
   request at a time, so a request arriving while an Add is unanswered is a protocol error.
5. ``Add`` carries exactly one fd (handed to the shell in :class:`OpenPodListeners`), every other message none.
   Re-adding a uid restarts it with the latest netns: the record keeps the latest info.
6. ``SuccessorReady`` (Ambit's extension; our hello asks for it) is acked at once in either state and reported
   (:class:`SuccessorReported`): whether a later node proxy holds every pod, which lengthens our drain when we
   stop (:mod:`ambit.inpod.drain`). A lost connection forgets it (reported as not ready): a new agent connection
   says it again if it still holds.
7. A protocol error (garbage, oversized, wrong fds, missing workload_info, unexpected message for the state) is
   answered with a nack, then the connection is closed; any fds that came with the datagram are closed.

Transitions are the table below, keyed by (state, message); a pair missing from the table is a protocol error.
Readiness: :attr:`ProxySession.ready` once the snapshot is received and no pod is pending.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from ambit.zds.commands import CloseConnection, CloseFds, OpenPodListeners, Output, SendMessage, StopPodProxy
from ambit.zds.errors import Blame, ProtocolError
from ambit.zds.events import ProtocolViolated, SnapshotReconciled, SuccessorReported
from ambit.zds.protocol import (
    AddRequest,
    Datagram,
    DelRequest,
    KeepRequest,
    Request,
    SnapshotSentRequest,
    SuccessorReadyRequest,
    WorkloadInfo,
    decode_request,
    encode_hello,
    encode_response,
)


class ProxyState(enum.Enum):
    DISCONNECTED = "disconnected"
    SNAPSHOT = "receiving snapshot"
    LIVE = "live"


_TRANSITIONS: dict[tuple[ProxyState, type[Request]], ProxyState] = {
    (ProxyState.SNAPSHOT, AddRequest): ProxyState.SNAPSHOT,
    (ProxyState.SNAPSHOT, KeepRequest): ProxyState.SNAPSHOT,
    (ProxyState.SNAPSHOT, DelRequest): ProxyState.SNAPSHOT,
    (ProxyState.SNAPSHOT, SnapshotSentRequest): ProxyState.LIVE,
    (ProxyState.SNAPSHOT, SuccessorReadyRequest): ProxyState.SNAPSHOT,
    (ProxyState.LIVE, AddRequest): ProxyState.LIVE,
    (ProxyState.LIVE, DelRequest): ProxyState.LIVE,
    (ProxyState.LIVE, SuccessorReadyRequest): ProxyState.LIVE,
}


class PodState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    PENDING = "pending"  # listeners failed; the workload manager retries


@dataclass(frozen=True, slots=True)
class PodRecord:
    uid: str
    info: WorkloadInfo
    state: PodState


class ProxySession:
    """The node proxy's ZDS state: one record per pod uid, plus the state of the current connection."""

    def __init__(self) -> None:
        self.state = ProxyState.DISCONNECTED
        self._pods: dict[str, PodRecord] = {}
        self._snapshot: set[str] = set()
        self._awaiting: str | None = None  # uid of the Add whose listeners the shell is opening
        self.successor = False
        """Whether the agent last said a later node proxy holds every pod (rule 6)."""

    @property
    def pods(self) -> Mapping[str, PodRecord]:
        return MappingProxyType(self._pods)

    @property
    def ready(self) -> bool:
        return self.state is ProxyState.LIVE and all(p.state is PodState.RUNNING for p in self._pods.values())

    def connection_made(self) -> list[Output]:
        if self.state is not ProxyState.DISCONNECTED:
            raise ProtocolError(f"connection_made while {self.state.value}", Blame.LOCAL)
        self.state = ProxyState.SNAPSHOT
        self._snapshot.clear()
        self._awaiting = None
        forgotten: list[Output] = [SuccessorReported(False)] if self.successor else []
        self.successor = False
        return [*forgotten, SendMessage(encode_hello())]

    def connection_lost(self) -> None:
        self.state = ProxyState.DISCONNECTED
        self._awaiting = None

    def datagram_received(self, datagram: Datagram) -> list[Output]:
        if self.state is ProxyState.DISCONNECTED:
            return [CloseFds(datagram.fds)] if datagram.fds else []
        try:
            request = decode_request(datagram)
            if self._awaiting is not None:
                raise ProtocolError(f"request before the Add of {self._awaiting} was acked")
            target = _TRANSITIONS.get((self.state, type(request)))
            if target is None:
                raise ProtocolError(f"unexpected {type(request).__name__} while {self.state.value}")
        except ProtocolError as exc:
            return self._fail(exc, datagram.fds)
        self.state = target
        match request:
            case AddRequest(uid, info, fd):
                self._pods[uid] = PodRecord(uid, info, PodState.STARTING)
                self._snapshot.add(uid)
                self._awaiting = uid
                return [OpenPodListeners(uid, info, fd)]
            case KeepRequest(uid):
                self._snapshot.add(uid)
                return [SendMessage(encode_response())]
            case DelRequest(uid):
                self._snapshot.discard(uid)
                stop: list[Output] = [StopPodProxy(uid)] if self._pods.pop(uid, None) else []
                return [*stop, SendMessage(encode_response())]
            case SnapshotSentRequest():
                dropped = frozenset(self._pods.keys() - self._snapshot)
                for uid in dropped:
                    del self._pods[uid]
                return [*(StopPodProxy(u) for u in sorted(dropped)), SnapshotReconciled(dropped), _ack()]
            case SuccessorReadyRequest(ready):
                self.successor = ready
                return [SuccessorReported(ready), _ack()]
        raise ProtocolError(f"unhandled request {request!r}", Blame.LOCAL)  # unreachable: the table has no other

    def listeners_opened(self, uid: str) -> list[Output]:
        """The shell started the pod's proxy: record it running and ack the Add."""
        return self._listeners_done(uid, PodState.RUNNING, "")

    def listeners_failed(self, uid: str, error: str) -> list[Output]:
        """The shell could not start the pod's proxy: keep it pending and nack, the connection stays up."""
        return self._listeners_done(uid, PodState.PENDING, error or "failed to start the workload proxy")

    def _listeners_done(self, uid: str, state: PodState, error: str) -> list[Output]:
        record = self._pods.get(uid)
        if record is not None:
            self._pods[uid] = replace(record, state=state)
        if self._awaiting != uid:
            return []  # the connection that asked is gone, or a retry the agent is not waiting for
        self._awaiting = None
        return [SendMessage(encode_response(error))]

    def _fail(self, error: ProtocolError, fds: tuple[int, ...]) -> list[Output]:
        self.state = ProxyState.DISCONNECTED
        self._awaiting = None
        close: list[Output] = [CloseFds(fds)] if fds else []
        return [
            *close,
            ProtocolViolated(error),
            SendMessage(encode_response(error.reason[:200])),
            CloseConnection(error.reason),
        ]


def _ack() -> SendMessage:
    return SendMessage(encode_response())
