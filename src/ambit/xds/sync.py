"""What each connected client was last sent and last answered, per type URL: the control plane's sync status
(istiod's ``/debug/syncz``), sans-IO.

Theory of operation: the xDS server keeps one :class:`ClientSync` per stream in a :class:`SyncRegistry`. The shell
calls :meth:`ClientSync.sent` after it wrote a response and :meth:`ClientSync.answered` when an ACK or NACK
retired a nonce; both only set a few fields, so the push path pays no more than that. :meth:`SyncRegistry.document`
turns the records into the JSON-ready debug document, classifying each type with :func:`classify` at the ``now``
it is given (this module never reads a clock).

Rules:

1. A stream gets a record when it opens its first resource type (a debug-only stream never does) and loses it
   when the stream ends: the registry holds exactly one record per connected proxy stream, and each record holds
   one small entry per type the client opened among those the server serves (the shell records no other type, so
   a client naming made-up types cannot grow its record).
2. What a client says about itself is bounded: its node id and version are cut to :data:`MAX_TEXT` characters and
   a NACK's message to :data:`MAX_ERROR` characters, so a record's size does not depend on the peer.
3. A type's status (:class:`SyncStatus`):
   NOT SENT: nothing of that type was sent on this stream;
   SYNCED: the last response sent was ACKed;
   ERROR: the last response sent was NACKed (the server keeps serving; the next ACKed push clears it);
   PENDING: the last response sent is not answered yet, and was sent at most ``stale_after`` seconds ago;
   STALE: the last response sent has not been answered for more than ``stale_after`` seconds.
4. Answers to a nonce other than the last one sent (an ACK of an older response arriving after a newer push) are
   remembered, but only an answer to the last nonce sent makes the type SYNCED or ERROR.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_STALE_AFTER",
    "SYNCZ_TYPE_URL",
    "ClientSync",
    "SyncRegistry",
    "SyncStatus",
    "TypeSync",
    "classify",
]

SYNCZ_TYPE_URL = "istio.io/debug/syncz"
"""The debug type a client requests over ADS to read the sync status (istiod's name for it)."""
DEFAULT_STALE_AFTER = 5.0
"""Seconds a response may stay unanswered before its type is STALE."""
MAX_TEXT = 256
MAX_ERROR = 1024


class SyncStatus(enum.Enum):
    SYNCED = "SYNCED"
    NOT_SENT = "NOT SENT"
    PENDING = "PENDING"
    STALE = "STALE"
    ERROR = "ERROR"


@dataclass(slots=True)
class TypeSync:
    """One type URL on one stream: the last response sent and the last answer received."""

    sent_nonce: str = ""
    sent_at: float = 0.0
    sent_resources: int = 0
    """Resources (upserted plus removed) carried by the last response sent."""
    answered_nonce: str = ""
    answered_at: float = 0.0
    error: str = ""
    """The NACK message, when the last answer was a NACK."""


def classify(entry: TypeSync | None, now: float, stale_after: float = DEFAULT_STALE_AFTER) -> SyncStatus:
    """The status of one type by rule 3."""
    if entry is None or not entry.sent_nonce:
        return SyncStatus.NOT_SENT
    if entry.answered_nonce == entry.sent_nonce:
        return SyncStatus.ERROR if entry.error else SyncStatus.SYNCED
    return SyncStatus.STALE if now - entry.sent_at > stale_after else SyncStatus.PENDING


@dataclass(slots=True)
class ClientSync:
    """One connected stream's record."""

    stream: int
    identity: str
    cluster: str
    connected_at: float
    node_id: str = ""
    version: str = ""
    types: dict[str, TypeSync] = field(default_factory=dict)

    def describe(self, node_id: str, version: str) -> None:
        """What the client says it is (its first request's node); kept once, cut by rule 2."""
        if node_id and not self.node_id:
            self.node_id = node_id[:MAX_TEXT]
        if version and not self.version:
            self.version = version[:MAX_TEXT]

    def opened(self, type_url: str) -> None:
        self.types.setdefault(type_url, TypeSync())

    def sent(self, type_url: str, nonce: str, resources: int, now: float) -> None:
        entry = self.types.get(type_url)
        if entry is None:
            entry = self.types[type_url] = TypeSync()
        entry.sent_nonce, entry.sent_at, entry.sent_resources = nonce, now, resources

    def answered(self, type_url: str, nonce: str, now: float, error: str = "") -> None:
        """An ACK (``error`` empty) or NACK of ``nonce``."""
        entry = self.types.get(type_url)
        if entry is None:
            return
        entry.answered_nonce, entry.answered_at, entry.error = nonce, now, error[:MAX_ERROR]

    def last_push(self) -> float:
        return max((t.sent_at for t in self.types.values() if t.sent_nonce), default=0.0)


class SyncRegistry:
    """The records of all connected streams, by stream id."""

    __slots__ = ("_records",)

    def __init__(self) -> None:
        self._records: dict[int, ClientSync] = {}

    def __len__(self) -> int:
        return len(self._records)

    def find(self, stream: int) -> ClientSync | None:
        return self._records.get(stream)

    def open(self, stream: int, identity: str, cluster: str, connected_at: float) -> ClientSync:
        """The stream's record, created on its first resource type (rule 1)."""
        record = self._records.get(stream)
        if record is None:
            record = self._records[stream] = ClientSync(stream, identity[:MAX_TEXT], cluster[:MAX_TEXT], connected_at)
        return record

    def close(self, stream: int) -> None:
        self._records.pop(stream, None)

    def document(
        self, now: float, *, control_plane: str = "", stale_after: float = DEFAULT_STALE_AFTER
    ) -> dict[str, Any]:
        """The debug document: every record with each type's status at ``now`` (JSON-ready, sorted by stream)."""
        clients = []
        for record in sorted(self._records.values(), key=lambda r: r.stream):
            types = {}
            for type_url, entry in sorted(record.types.items()):
                types[type_url] = {
                    "status": classify(entry, now, stale_after).value,
                    "sentNonce": entry.sent_nonce,
                    "sentAt": entry.sent_at if entry.sent_nonce else None,
                    "resources": entry.sent_resources,
                    "answeredNonce": entry.answered_nonce,
                    "error": entry.error,
                }
            last = record.last_push()
            clients.append(
                {
                    "stream": record.stream,
                    "node": record.node_id,
                    "identity": record.identity,
                    "cluster": record.cluster,
                    "version": record.version,
                    "connectedAt": record.connected_at,
                    "lastPushAt": last or None,
                    "types": types,
                }
            )
        return {"controlPlane": control_plane, "generatedAt": now, "staleAfter": stale_after, "clients": clients}
