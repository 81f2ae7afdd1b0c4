"""A read-only mapping whose changed copy costs the size of the change, for the control plane's resource tables.

Theory of operation. Every push hands the xDS sessions a new :class:`~ambit.xds.resource_set.ResourceSet` while the
sessions still read the previous one, so a table is never changed in place: each change made a whole copy of its
indexes (three dicts of 30,000 workloads: about 8 ms per pod change, issue 22). A :class:`SnapshotMap` splits its
keys over :data:`BUCKETS` dicts by hash; a change (:meth:`SnapshotMap.edit`, then :meth:`MapEdit.freeze`) copies the
tuple of buckets and only the buckets it writes to, and shares the others with the map it came from.

Rules:
1. A :class:`SnapshotMap` never changes after it is made: a bucket is written only by the :class:`MapEdit` that
   copied it, and the edit hands it over at :meth:`MapEdit.freeze`, after which the edit refuses further writes.
2. Lookups, iteration and equality behave as a ``dict``'s of the same items (equality through
   :class:`collections.abc.Mapping`, so a map equals a dict of the same items); iteration order is by bucket, not
   by insertion.
3. Keys are hashed with Python's ``hash`` (per process, as a dict does): a map lives in one process.
4. :meth:`SnapshotMap.differing_keys` compares two maps bucket by bucket: a bucket two maps share is skipped
   whole, so the difference between a map and one made from it by a few edits costs the buckets those edits
   copied, not the map. Values are compared by identity: a value replaced by an equal one counts as different.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

BUCKETS = 256
_MASK = BUCKETS - 1
_ABSENT: object = object()


class SnapshotMap(Mapping[K, V], Generic[K, V]):
    """An immutable mapping shared between snapshots bucket by bucket (rules 1-3)."""

    __slots__ = ("_buckets", "_size")

    def __init__(self, buckets: tuple[dict[K, V], ...], size: int) -> None:
        self._buckets = buckets
        self._size = size

    @classmethod
    def of(cls, items: Mapping[K, V]) -> SnapshotMap[K, V]:
        """A map holding ``items``."""
        buckets: list[dict[K, V]] = [{} for _ in range(BUCKETS)]
        for key, value in items.items():
            buckets[hash(key) & _MASK][key] = value
        return cls(tuple(buckets), len(items))

    def __getitem__(self, key: K) -> V:
        return self._buckets[hash(key) & _MASK][key]

    def __contains__(self, key: object) -> bool:
        return key in self._buckets[hash(key) & _MASK]

    def get(self, key: K, default: V | None = None) -> V | None:  # type: ignore[override]
        return self._buckets[hash(key) & _MASK].get(key, default)

    def __iter__(self) -> Iterator[K]:
        for bucket in self._buckets:
            yield from bucket

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"SnapshotMap({dict(self.items())!r})"

    def differing_keys(self, other: SnapshotMap[K, V]) -> set[K]:
        """The keys whose value is not the same object in both maps, or that only one of them has (rule 4)."""
        found: set[K] = set()
        for mine, theirs in zip(self._buckets, other._buckets, strict=True):
            if mine is theirs:
                continue
            found.update(key for key, value in mine.items() if theirs.get(key, _ABSENT) is not value)
            found.update(key for key in theirs if key not in mine)
        return found

    def edit(self) -> MapEdit[K, V]:
        """A change of this map: write to it, then :meth:`MapEdit.freeze` it into a new map; this one stays."""
        return MapEdit(self._buckets, self._size)


class MapEdit(Generic[K, V]):
    """The writes that make a new :class:`SnapshotMap` from another, copying each bucket at its first write."""

    __slots__ = ("_buckets", "_copied", "_frozen", "_size")

    def __init__(self, buckets: tuple[dict[K, V], ...], size: int) -> None:
        self._buckets = list(buckets)
        self._copied: set[int] = set()
        self._size = size
        self._frozen = False

    def _writable(self, key: K) -> dict[K, V]:
        if self._frozen:
            raise RuntimeError("this edit was frozen into a map already")
        index = hash(key) & _MASK
        if index not in self._copied:
            self._buckets[index] = dict(self._buckets[index])
            self._copied.add(index)
        return self._buckets[index]

    def get(self, key: K, default: V | None = None) -> V | None:
        return self._buckets[hash(key) & _MASK].get(key, default)

    def __setitem__(self, key: K, value: V) -> None:
        bucket = self._writable(key)
        if key not in bucket:
            self._size += 1
        bucket[key] = value

    def pop(self, key: K, default: V | None = None) -> V | None:
        if key not in self._buckets[hash(key) & _MASK]:
            return default
        self._size -= 1
        return self._writable(key).pop(key)

    def freeze(self) -> SnapshotMap[K, V]:
        """The new map (rule 1: this edit takes no more writes)."""
        self._frozen = True
        return SnapshotMap(tuple(self._buckets), self._size)
