"""What the ZDS sessions report: events are past-tense facts, commands (``ambit.zds.commands``) are orders.

A session method returns a list of :data:`Output`, in order; the shell acts on commands and passes events up.
"""

from __future__ import annotations

from dataclasses import dataclass

from ambit.zds.errors import ProtocolError


@dataclass(frozen=True, slots=True)
class HelloReceived:
    """The node proxy announced ZDS V1; the agent starts the snapshot."""


@dataclass(frozen=True, slots=True)
class SnapshotCompleted:
    """The node proxy acknowledged SnapshotSent; from now on only Add and Del are sent."""


@dataclass(frozen=True, slots=True)
class RequestAcked:
    """The node proxy acknowledged a request. ``kind`` is ``add``, ``keep``, ``del`` or ``snapshot_sent``."""

    kind: str
    uid: str


@dataclass(frozen=True, slots=True)
class RequestNacked:
    """The node proxy answered a request with an error string; the connection stays up."""

    kind: str
    uid: str
    error: str


@dataclass(frozen=True, slots=True)
class TimedOut:
    """A wait (for the hello or for an ack) passed its deadline; the connection is being closed."""

    waiting_for: str


@dataclass(frozen=True, slots=True)
class ProtocolViolated:
    """The peer (or our caller, by ``error.blame``) broke a rule; the connection is being closed."""

    error: ProtocolError


@dataclass(frozen=True, slots=True)
class SnapshotReconciled:
    """The node proxy received SnapshotSent and dropped the pods neither added nor kept in the snapshot."""

    dropped: frozenset[str]


@dataclass(frozen=True, slots=True)
class SuccessorReported:
    """The node proxy heard (``SuccessorReady``) whether a later node proxy holds every pod of the node, or lost the
    connection that said so (``ready`` False: unknown again until the agent says it anew)."""

    ready: bool


Event = (
    HelloReceived
    | SnapshotCompleted
    | RequestAcked
    | RequestNacked
    | TimedOut
    | ProtocolViolated
    | SnapshotReconciled
    | SuccessorReported
)
