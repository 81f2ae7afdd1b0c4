"""The node agent's side of ZDS (spec §3.3): one :class:`AgentSession` per connection, an :class:`AgentHub` over them.

Rules (the session):

1. The node proxy speaks first. The only acceptable first datagram is ``ZdsHello{V1}``, within 5 s of connecting.
2. After the hello the agent sends the snapshot: ``Add`` (with the netns fd) for each pod with a known netns,
   ``Keep`` for each pod without one, then ``SnapshotSent``.
3. One request in flight at a time. Each waits for exactly one ``Ack``, for at most 5 s; only then goes the next.
   Add/Del submitted meanwhile are queued; a Del drops a queued Add of the same pod (its fd may be closed by now).
4. An Ack with an error is a nack: reported, and the connection stays up.
5. Anything else is a :class:`ProtocolError` blamed on the peer: an Ack with nothing in flight, a second hello,
   any fd, garbage, an oversized or truncated datagram. The session reports it and closes; fds that came are closed.
6. A passed deadline reports :class:`TimedOut` and closes. A closed session ignores everything.

7. ``SuccessorReady`` (Ambit's extension) goes only to a session whose hello set ``successor_notice``; it is a
   request like the others (queued, one Ack).

Rules (the hub): new pods go to the most recently connected session only; deletes go to all sessions; a new
session's snapshot is the hub's pod cache at connect time. The hub borrows netns fds: its caller owns them.
Successors (:meth:`AgentHub.tell_successors`, called after every input): a session that asked for notices hears
``SuccessorReady{ready}`` each time the answer to "is a session connected after it live (its snapshot acked)?"
changes from what it was last told (at first: no). So the node proxy being replaced learns that its successor
holds every pod (and gets every new one), and the successor learns nothing.

A fan-out hub (``fan_out=True``: a node proxy's hub for its own worker processes, :mod:`ambit.inpod.workers`) is
the same but for two rules: new pods go to every open session (each worker serves every pod), and the successor
answer is the one the hub was last given (:meth:`AgentHub.set_successor`: the node proxy's own, from its agent)
rather than one about later sessions (workers are peers, none succeeds another).

Transitions are the table below, keyed by (state, input); a pair missing from the table is a protocol error.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

from ambit.zds.commands import CloseConnection, CloseFds, Output, SendMessage
from ambit.zds.errors import ProtocolError
from ambit.zds.events import HelloReceived, ProtocolViolated, RequestAcked, RequestNacked, SnapshotCompleted, TimedOut
from ambit.zds.protocol import (
    AddRequest,
    Datagram,
    DelRequest,
    KeepRequest,
    Request,
    SnapshotSentRequest,
    SuccessorReadyRequest,
    WorkloadInfo,
    decode_hello,
    decode_response,
    encode_request,
)

REQUEST_TIMEOUT = 5.0
"""Seconds to wait for the hello, and for each Ack (spec §3.3: 5 s read and write deadline per message)."""


class AgentState(enum.Enum):
    AWAITING_HELLO = "awaiting hello"
    SENDING_SNAPSHOT = "sending snapshot"
    LIVE = "live"
    CLOSED = "closed"


class _Input(enum.Enum):
    HELLO = "hello"
    ACK = "ack"
    SNAPSHOT_ACK = "ack of SnapshotSent"
    UNSOLICITED_ACK = "ack with no request in flight"


_TRANSITIONS: dict[tuple[AgentState, _Input], AgentState] = {
    (AgentState.AWAITING_HELLO, _Input.HELLO): AgentState.SENDING_SNAPSHOT,
    (AgentState.SENDING_SNAPSHOT, _Input.ACK): AgentState.SENDING_SNAPSHOT,
    (AgentState.SENDING_SNAPSHOT, _Input.SNAPSHOT_ACK): AgentState.LIVE,
    (AgentState.LIVE, _Input.ACK): AgentState.LIVE,
}


@dataclass(frozen=True, slots=True)
class PodEntry:
    """A pod the agent knows; ``netns_fd`` is None while its netns is unknown (it is then sent as Keep)."""

    uid: str
    info: WorkloadInfo
    netns_fd: int | None


def _kind(request: Request) -> str:
    match request:
        case AddRequest():
            return "add"
        case KeepRequest():
            return "keep"
        case DelRequest():
            return "del"
        case SnapshotSentRequest():
            return "snapshot_sent"
        case SuccessorReadyRequest():
            return "successor_ready"


def _uid(request: Request) -> str:
    return "" if isinstance(request, SnapshotSentRequest | SuccessorReadyRequest) else request.uid


class AgentSession:
    """The agent's end of one ZDS connection. Feed it datagrams, submissions and the time; act on what it returns."""

    def __init__(self, snapshot: list[PodEntry], now: float) -> None:
        self.state = AgentState.AWAITING_HELLO
        self.deadline: float | None = now + REQUEST_TIMEOUT
        self._queue: deque[Request] = deque()
        for pod in snapshot:
            if pod.netns_fd is None:
                self._queue.append(KeepRequest(pod.uid))
            else:
                self._queue.append(AddRequest(pod.uid, pod.info, pod.netns_fd))
        self._queue.append(SnapshotSentRequest())
        self._in_flight: Request | None = None
        self.notices = False
        """Whether the proxy's hello asked for ``SuccessorReady`` (rule 7)."""
        self.told_successor = False
        """What it was last told (queued counts as told)."""

    @property
    def closed(self) -> bool:
        return self.state is AgentState.CLOSED

    def datagram_received(self, datagram: Datagram, now: float) -> list[Output]:
        if self.closed:
            return [CloseFds(datagram.fds)] if datagram.fds else []
        out: list[Output] = []
        try:
            if self.state is AgentState.AWAITING_HELLO:
                self.notices = decode_hello(datagram)
                self._step(_Input.HELLO)
                out.append(HelloReceived())
            else:
                error = decode_response(datagram)
                out.extend(self._acked(error))
        except ProtocolError as exc:
            return [*self._close_fds(datagram), *self._fail(exc)]
        out.extend(self._send_next(now))
        return out

    def submit_add(self, pod: PodEntry, now: float) -> list[Output]:
        if self.closed or pod.netns_fd is None:
            return []
        request = AddRequest(pod.uid, pod.info, pod.netns_fd)
        encode_request(request)  # an oversized pod is the caller's error: raise now, not mid-protocol
        self._queue.append(request)
        return self._send_next(now)

    def submit_del(self, uid: str, now: float) -> list[Output]:
        if self.closed:
            return []
        self._queue = deque(r for r in self._queue if not (isinstance(r, AddRequest) and r.uid == uid))
        self._queue.append(DelRequest(uid))
        return self._send_next(now)

    def submit_successor(self, ready: bool, now: float) -> list[Output]:
        """Rule 7: tell the proxy whether a later one holds every pod (only if it asked, and it changed)."""
        if self.closed or not self.notices or ready == self.told_successor:
            return []
        self.told_successor = ready
        self._queue.append(SuccessorReadyRequest(ready))
        return self._send_next(now)

    def timer_fired(self, now: float) -> list[Output]:
        if self.closed or self.deadline is None or now < self.deadline:
            return []
        waiting_for = "hello" if self.state is AgentState.AWAITING_HELLO else f"ack of {self._describe()}"
        self._close()
        return [TimedOut(waiting_for), CloseConnection(f"timed out waiting for {waiting_for}")]

    def connection_lost(self) -> None:
        self._close()

    def _step(self, event: _Input) -> None:
        target = _TRANSITIONS.get((self.state, event))
        if target is None:
            raise ProtocolError(f"unexpected {event.value} while {self.state.value}")
        self.state = target

    def _acked(self, error: str) -> list[Output]:
        request = self._in_flight
        if request is None:
            self._step(_Input.UNSOLICITED_ACK)
            return []  # unreachable: UNSOLICITED_ACK is in no transition
        self._step(_Input.SNAPSHOT_ACK if isinstance(request, SnapshotSentRequest) else _Input.ACK)
        self._in_flight = None
        self.deadline = None
        kind, uid = _kind(request), _uid(request)
        out: list[Output] = [RequestNacked(kind, uid, error) if error else RequestAcked(kind, uid)]
        if self.state is AgentState.LIVE and kind == "snapshot_sent":
            out.append(SnapshotCompleted())
        return out

    def _send_next(self, now: float) -> list[Output]:
        if self.state is AgentState.AWAITING_HELLO or self._in_flight is not None or not self._queue:
            return []
        request = self._queue.popleft()
        data, fds = encode_request(request)
        self._in_flight = request
        self.deadline = now + REQUEST_TIMEOUT
        return [SendMessage(data, fds)]

    def _describe(self) -> str:
        request = self._in_flight
        return "nothing" if request is None else f"{_kind(request)} {_uid(request)}".rstrip()

    def _close_fds(self, datagram: Datagram) -> list[Output]:
        return [CloseFds(datagram.fds)] if datagram.fds else []

    def _fail(self, error: ProtocolError) -> list[Output]:
        self._close()
        return [ProtocolViolated(error), CloseConnection(error.reason)]

    def _close(self) -> None:
        self.state = AgentState.CLOSED
        self.deadline = None
        self._in_flight = None
        self._queue.clear()


class AgentHub:
    """The agent's pod cache and its routing over connected sessions, keyed by connection id (any hashable int)."""

    def __init__(self, *, fan_out: bool = False) -> None:
        self._pods: dict[str, PodEntry] = {}
        self._sessions: dict[int, AgentSession] = {}  # insertion order = connection order
        self.fan_out = fan_out
        self._successor = False
        """A fan-out hub's successor answer (:meth:`set_successor`)."""

    def find_session(self, conn_id: int) -> AgentSession | None:
        return self._sessions.get(conn_id)

    def connect(self, conn_id: int, now: float) -> AgentSession:
        session = AgentSession(list(self._pods.values()), now)
        self._sessions.pop(conn_id, None)
        self._sessions[conn_id] = session
        return session

    def disconnect(self, conn_id: int) -> None:
        session = self._sessions.pop(conn_id, None)
        if session is not None:
            session.connection_lost()

    def pod_added(self, pod: PodEntry, now: float) -> list[tuple[int, Output]]:
        """Cache the pod; if its netns is known, send it to the newest open session only."""
        self._pods[pod.uid] = pod
        if self.fan_out:
            if pod.netns_fd is None:
                return []
            return [(cid, out) for cid, s in self._sessions.items() for out in s.submit_add(pod, now)]
        newest = next((cid for cid, s in reversed(self._sessions.items()) if not s.closed), None)
        if newest is None or pod.netns_fd is None:
            return []
        return [(newest, out) for out in self._sessions[newest].submit_add(pod, now)]

    def pod_deleted(self, uid: str, now: float) -> list[tuple[int, Output]]:
        """Forget the pod and tell every open session."""
        self._pods.pop(uid, None)
        return [(cid, out) for cid, s in self._sessions.items() for out in s.submit_del(uid, now)]

    def timer_fired(self, now: float) -> list[tuple[int, Output]]:
        return [(cid, out) for cid, s in self._sessions.items() for out in s.timer_fired(now)]

    def tell_successors(self, now: float) -> list[tuple[int, Output]]:
        """Each open session that asked for notices, told whether a session connected after it is live (see the
        hub's rules); nothing when nothing changed, so the caller may call it after every input."""
        out: list[tuple[int, Output]] = []
        if self.fan_out:
            for cid, session in self._sessions.items():
                out += [(cid, each) for each in session.submit_successor(self._successor, now)]
            return out
        later_live = False
        for cid, session in reversed(self._sessions.items()):
            out += [(cid, each) for each in session.submit_successor(later_live, now)]
            later_live = later_live or session.state is AgentState.LIVE
        return out

    def set_successor(self, ready: bool) -> None:
        """A fan-out hub's successor answer from now on (the caller then calls :meth:`tell_successors`)."""
        self._successor = ready

    @property
    def deadline(self) -> float | None:
        deadlines = [s.deadline for s in self._sessions.values() if s.deadline is not None]
        return min(deadlines, default=None)
