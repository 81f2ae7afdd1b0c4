"""Durable object storage: SQLite for durability, an in-memory copy for reads, and a bounded event log.

Invariants:
- Every write is one SQLite transaction that updates ``objects`` and appends to ``log``; the row id of the log
  entry is the write's ``resourceVersion``, so versions increase strictly, also across restarts.
- Reads are served from memory (a watch cache, as kube-apiserver keeps one); memory and disk are changed together
  after the transaction commits, so an acknowledged write is on disk (WAL; a process crash loses nothing).
- No object larger than ``max_object_bytes`` encoded is stored, whichever verb, patch, default or admission made
  it: the check is on the bytes about to be written, as etcd's is. Nor one nested deeper than
  :data:`~ambit.apiserver.nesting.MAX_DEPTH` (400), which the server could then neither patch nor delete.
- ``state.db`` and its ``-wal`` and ``-shm`` files are 0600 whatever the umask (every Secret is in them).
- A write the storage cannot take (the disk is full: SQLite's ``SQLITE_FULL``; an I/O error) is rolled back and
  answered 500 ``InternalError`` naming the storage and SQLite's words, as kube-apiserver answers an etcd that
  cannot write; memory is untouched, so nothing unacknowledged is served and nothing acknowledged is lost, and the
  next write after space is freed works (the connection stays usable: SQLite rolled the transaction back).
- The log keeps the most recent ``log_capacity`` events, and no more than ``log_bytes`` of their encoded objects
  (objects of up to 1.5 MiB make a count alone no bound on memory); the newest event always stays. ``horizon`` is
  the newest version that is no longer in the log: a watch may resume from any version ``>= horizon``; older ones
  get 410 Gone. (An event also refers to the object's previous state, which is the previous event's object or a
  live one, so the log holds at most about twice ``log_bytes``.)
- An index (:meth:`Store.add_index`, e.g. the cluster IPs' holders) sees every write of its type: ``check`` before
  the transaction (it may refuse the write, which then changes nothing), ``apply`` after memory changed. Writes
  are synchronous, so no other write comes between an index's check and its apply.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import sqlite3
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec

from ambit.apiserver.errors import ApiError
from ambit.apiserver.nesting import check_depth

TypeKey = tuple[str, str]  # (group, plural)

log = logging.getLogger(__name__)

MAX_OBJECT_BYTES = 1536 * 1024
"""The largest encoded object stored: etcd's request limit as kube-apiserver runs it (1.5 MiB)."""

LOG_BYTES = 256 * 1024 * 1024
"""The default bound on the encoded objects the event log keeps in memory."""

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode

_SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    grp TEXT NOT NULL, res TEXT NOT NULL, ns TEXT NOT NULL, name TEXT NOT NULL,
    rv INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (grp, res, ns, name)
);
CREATE TABLE IF NOT EXISTS log (
    rv INTEGER PRIMARY KEY AUTOINCREMENT,
    type TEXT NOT NULL, grp TEXT NOT NULL, res TEXT NOT NULL, ns TEXT NOT NULL, name TEXT NOT NULL,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class StoreIndex(Protocol):
    """Something kept in step with one type's stored objects (see the module's invariants)."""

    def check(self, namespace: str, name: str, old: dict[str, Any] | None, new: dict[str, Any]) -> None:
        """Raise :class:`ApiError` to refuse storing ``new`` (``old``: what is stored now)."""

    def apply(self, namespace: str, name: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        """The write of ``new`` (None: a deletion) over ``old`` committed."""


@dataclass(frozen=True, slots=True)
class StoredObject:
    rv: int
    obj: dict[str, Any]
    raw: bytes  # the JSON encoding of ``obj``

    @property
    def namespace(self) -> str:
        return str(self.obj["metadata"].get("namespace", ""))

    @property
    def labels(self) -> dict[str, str]:
        labels = self.obj["metadata"].get("labels")
        return labels if isinstance(labels, dict) else {}


@dataclass(frozen=True, slots=True)
class StoreEvent:
    """One committed write, as watchers see it."""

    type: str  # ADDED, MODIFIED, DELETED
    key: TypeKey
    namespace: str
    name: str
    item: StoredObject
    old: StoredObject | None = None  # the state before, when known (the log keeps it across restarts)


class Store:
    """Objects of every type, kept in memory and in ``state.db``."""

    def __init__(
        self,
        path: Path,
        *,
        log_capacity: int = 50_000,
        log_bytes: int = LOG_BYTES,
        max_object_bytes: int = MAX_OBJECT_BYTES,
    ) -> None:
        self._path = path
        self._max_object_bytes = max_object_bytes
        self._log_capacity = log_capacity
        self._log_byte_capacity = log_bytes
        self._log_bytes = 0
        _make_private(path)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        for suffix in ("-wal", "-shm"):  # SQLite gives them the database file's mode; tighten any left by others
            _make_private(path.with_name(path.name + suffix), create=False)
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._objects: dict[TypeKey, dict[tuple[str, str], StoredObject]] = {}
        self._sorted_keys: dict[TypeKey, list[tuple[str, str]]] = {}
        self._log: deque[StoreEvent] = deque()
        self._rv = 0
        self._horizon = 0
        self._writes_since_trim = 0
        self._indexes: dict[TypeKey, list[StoreIndex]] = {}
        self._load()

    # -- start-up -------------------------------------------------------------------------------------------
    def _load(self) -> None:
        for grp, res, ns, name, rv, data in self._db.execute("SELECT grp, res, ns, name, rv, data FROM objects"):
            self._objects.setdefault((grp, res), {})[(ns, name)] = StoredObject(rv, _decode(data), bytes(data))
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'log'").fetchone()
        self._rv = int(row[0]) if row else 0
        rows = self._db.execute(
            "SELECT rv, type, grp, res, ns, name, data FROM log ORDER BY rv DESC LIMIT ?",
            (self._log_capacity,),
        ).fetchall()
        # Each event's ``old`` is the object's previous event in the log, so that a selector watch replayed after
        # a restart still sees objects leave its selection (unknown only for an object's first event in the log).
        previous: dict[tuple[TypeKey, str, str], StoredObject] = {}
        for rv, etype, grp, res, ns, name, data in reversed(rows):
            current = self._objects.get((grp, res), {}).get((ns, name))
            # The newest version of a live object is shared with the object map rather than decoded twice.
            item = current if current is not None and current.rv == rv else StoredObject(rv, _decode(data), bytes(data))
            where = ((grp, res), ns, name)
            old = previous.pop(where, None) if etype == "DELETED" else previous.get(where)
            if etype != "DELETED":
                previous[where] = item
            self._log.append(StoreEvent(etype, (grp, res), ns, name, item, old))
            self._log_bytes += len(item.raw)
        self._horizon = self._log[0].item.rv - 1 if self._log else self._rv
        self._trim_log(self._log_capacity)

    def close(self) -> None:
        self._db.close()

    # -- reads ----------------------------------------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        return self._rv

    @property
    def horizon(self) -> int:
        return self._horizon

    def get(self, key: TypeKey, namespace: str, name: str) -> StoredObject | None:
        return self._objects.get(key, {}).get((namespace, name))

    def items(
        self, key: TypeKey, namespace: str | None = None, *, after: tuple[str, str] | None = None
    ) -> list[StoredObject]:
        """Objects of one type (in one namespace, or all), ordered by namespace and name, optionally only those
        after a given (namespace, name) (the continue position of a paginated list)."""
        bucket = self._objects.get(key, {})
        keys = self._sorted_keys.get(key)
        if keys is None:
            keys = self._sorted_keys[key] = sorted(bucket)
        if namespace is None:
            start = 0 if after is None else bisect.bisect_right(keys, after)
            return [bucket[k] for k in keys[start:]]
        start = bisect.bisect_left(keys, (namespace, ""))
        if after is not None:
            start = max(start, bisect.bisect_right(keys, after))
        end = bisect.bisect_left(keys, (namespace + "\x00", ""))
        return [bucket[k] for k in keys[start:end]]

    def count(self, key: TypeKey, namespace: str | None = None) -> int:
        bucket = self._objects.get(key, {})
        if namespace is None:
            return len(bucket)
        return sum(1 for k in bucket if k[0] == namespace)

    def add_index(self, key: TypeKey, index: StoreIndex) -> None:
        """Keep ``index`` in step with the objects of ``key`` from now on; it is first told of each stored one."""
        for (namespace, name), item in self._objects.get(key, {}).items():
            index.apply(namespace, name, None, item.obj)
        self._indexes.setdefault(key, []).append(index)

    def namespaced_keys(self) -> Iterator[TypeKey]:
        yield from list(self._objects)

    def events_after(self, rv: int) -> list[StoreEvent]:
        """Events newer than ``rv``; the caller checked ``rv >= horizon``."""
        if not self._log or rv >= self._rv:
            return []
        first = self._log[0].item.rv
        start = max(0, rv + 1 - first)
        # Versions in the log are dense except for gaps left by failed transactions; find the start exactly.
        while start > 0 and self._log[start - 1].item.rv > rv:
            start -= 1
        while start < len(self._log) and self._log[start].item.rv <= rv:
            start += 1
        return [self._log[i] for i in range(start, len(self._log))]

    # -- writes ---------------------------------------------------------------------------------------------
    def put(self, etype: str, key: TypeKey, namespace: str, name: str, obj: dict[str, Any]) -> StoreEvent:
        """Write ``obj`` (ADDED or MODIFIED), giving it the next resourceVersion."""
        return self._write(etype, key, namespace, name, obj, delete=False)

    def remove(self, key: TypeKey, namespace: str, name: str, obj: dict[str, Any]) -> StoreEvent:
        """Delete the object; ``obj`` is its final state, sent to watchers with the deletion's version."""
        return self._write("DELETED", key, namespace, name, obj, delete=True)

    def _write(
        self, etype: str, key: TypeKey, namespace: str, name: str, obj: dict[str, Any], *, delete: bool
    ) -> StoreEvent:
        grp, res = key
        rv = self._rv + 1
        obj["metadata"]["resourceVersion"] = str(rv)
        if not delete:  # whichever verb, patch or admission made it; checked before the encoder recurses into it
            check_depth(obj, "the object")
        data = _encode(obj)
        if not delete and len(data) > self._max_object_bytes:
            # etcd's limit, answered as kube-apiserver answers etcd's error (500, no reason, etcd's words); a
            # deletion's final state is never refused, or an object could not be deleted.
            raise ApiError(500, "", "etcdserver: request is too large")
        indexes = self._indexes.get(key, ())
        stored = self._objects.get(key, {}).get((namespace, name))
        if not delete:
            for index in indexes:
                index.check(namespace, name, None if stored is None else stored.obj, obj)
        try:
            self._commit(etype, key, namespace, name, data, rv, delete=delete)
        except sqlite3.Error as exc:
            log.error("storage %s refused a write of %s/%s %s/%s: %s", self._path, grp, res, namespace, name, exc)
            raise storage_error(self._path, exc) from None
        self._rv = rv
        item = StoredObject(rv, obj, data)
        bucket = self._objects.setdefault(key, {})
        old = bucket.pop((namespace, name), None) if delete else bucket.get((namespace, name))
        if not delete:
            bucket[(namespace, name)] = item
        if delete != (old is None):  # the set of keys changed: keep its sorted copy in step, not sorted again
            self._resort(key, (namespace, name), added=not delete)
        for index in indexes:
            index.apply(namespace, name, None if old is None else old.obj, None if delete else obj)
        event = StoreEvent(etype, key, namespace, name, item, old)
        self._log.append(event)
        self._log_bytes += len(data)
        self._trim_log(self._log_capacity)
        self._writes_since_trim += 1
        if self._writes_since_trim >= 1000:
            self._writes_since_trim = 0
            try:  # housekeeping after the write committed: its failure must not fail the write
                self._db.execute("DELETE FROM log WHERE rv <= ?", (self._horizon,))
            except sqlite3.Error as exc:
                log.warning("storage %s: trimming the log failed (retried in 1000 writes): %s", self._path, exc)
        return event

    def _commit(
        self, etype: str, key: TypeKey, namespace: str, name: str, data: bytes, rv: int, *, delete: bool
    ) -> None:
        """One transaction: the log entry (whose row id must be ``rv``) and the object's row; rolled back whole on
        any failure, which propagates."""
        grp, res = key
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            cur = db.execute(
                "INSERT INTO log (type, grp, res, ns, name, data) VALUES (?, ?, ?, ?, ?, ?)",
                (etype, grp, res, namespace, name, data),
            )
            if cur.lastrowid != rv:  # another writer on the same file: refuse rather than corrupt versions
                raise RuntimeError(f"state.db resourceVersion skew: expected {rv}, got {cur.lastrowid}")
            if delete:
                db.execute(
                    "DELETE FROM objects WHERE grp = ? AND res = ? AND ns = ? AND name = ?",
                    (grp, res, namespace, name),
                )
            else:
                db.execute(
                    "INSERT OR REPLACE INTO objects (grp, res, ns, name, rv, data) VALUES (?, ?, ?, ?, ?, ?)",
                    (grp, res, namespace, name, rv, data),
                )
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:  # SQLite may have rolled back already (SQLITE_FULL, SQLITE_IOERR)
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise

    def _resort(self, key: TypeKey, where: tuple[str, str], *, added: bool) -> None:
        """Insert ``where`` into (or drop it from) the sorted keys of ``key``, if :meth:`items` made them: a
        bisection and one move of the list's tail, where sorting again would cost O(n log n) per create or delete
        at the next read (and every deletion reads its namespace's objects, to collect dependents)."""
        keys = self._sorted_keys.get(key)
        if keys is None:
            return
        if added:
            bisect.insort(keys, where)
            return
        i = bisect.bisect_left(keys, where)
        if i < len(keys) and keys[i] == where:
            del keys[i]

    def compact(self, keep: int) -> None:
        """Forget all but the newest ``keep`` events (tests use this to force 410 Gone)."""
        self._trim_log(keep)
        self._db.execute("DELETE FROM log WHERE rv <= ?", (self._horizon,))

    @property
    def log_bytes(self) -> int:
        """The encoded size of the objects of the events in the log."""
        return self._log_bytes

    def _trim_log(self, keep: int) -> None:
        """Drop the oldest events beyond ``keep`` or beyond the byte bound (the newest one stays)."""
        log = self._log
        while len(log) > keep or (self._log_bytes > self._log_byte_capacity and len(log) > 1):
            dropped = log.popleft().item
            self._log_bytes -= len(dropped.raw)
            self._horizon = dropped.rv


def _make_private(path: Path, *, create: bool = True) -> None:
    """Make ``path`` 0600 whatever the umask: created so (O_CREAT's mode is filtered by the umask, hence the
    fchmod), or tightened when it exists. SQLite creates ``-wal`` and ``-shm`` with the database file's mode."""
    flags = os.O_RDWR | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        if create:
            raise
        return
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def storage_error(path: Path, exc: sqlite3.Error) -> ApiError:
    """What a client hears when the storage refused a write: kube-apiserver's ``NewInternalError`` (500,
    ``InternalError``, "Internal error occurred: ..."), naming the storage file and what SQLite said (``database or
    disk is full``). The file's name only: where the server keeps its state is for its log, not for every client
    allowed to write."""
    cause = f"storage {path.name}: {exc}"
    return ApiError(500, "InternalError", f"Internal error occurred: {cause}", details={"causes": [{"message": cause}]})


def encode(obj: Any) -> bytes:
    return _encode(obj)


def decode(data: bytes | str) -> Any:
    return _decode(data)
