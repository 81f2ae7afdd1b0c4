"""What the ZDS sessions report: events are past-tense facts, commands (``ambit.zds.commands``) are orders.

A session method returns a list of :data:`Output`, in order; the shell acts on commands and passes events up.
"""

from __future__ import annotations

from msgspec import Struct

from ambit.zds.errors import ProtocolError


class HelloReceived(Struct, frozen=True):
    """The node proxy announced ZDS V1; the agent starts the snapshot."""


class SnapshotCompleted(Struct, frozen=True):
    """The node proxy acknowledged SnapshotSent; from now on only Add and Del are sent."""


class RequestAcked(Struct, frozen=True):
    """The node proxy acknowledged a request. ``kind`` is ``add``, ``keep``, ``del`` or ``snapshot_sent``."""

    kind: str
    uid: str


class RequestNacked(Struct, frozen=True):
    """The node proxy answered a request with an error string; the connection stays up."""

    kind: str
    uid: str
    error: str


class TimedOut(Struct, frozen=True):
    """A wait (for the hello or for an ack) passed its deadline; the connection is being closed."""

    waiting_for: str


class ProtocolViolated(Struct, frozen=True):
    """The peer (or our caller, by ``error.blame``) broke a rule; the connection is being closed."""

    error: ProtocolError


class SnapshotReconciled(Struct, frozen=True):
    """The node proxy received SnapshotSent and dropped the pods neither added nor kept in the snapshot."""

    dropped: frozenset[str]


class SuccessorReported(Struct, frozen=True):
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
