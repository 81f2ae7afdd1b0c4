"""The resources of one type as the xDS server serves them: :class:`XdsResource` and the immutable :class:`ResourceSet`.

Theory of operation: a :class:`ResourceSet` is one snapshot of a type's resources by name, with an alias index
(``network/IP`` → names) and a members index (a Service → its endpoint workloads) for on-demand lookups. Sets never
change: :meth:`ResourceSet.updated` makes the next one at the cost of the change (its indexes are
:class:`~ambit.xds.snapshot_map.SnapshotMap` edits). What every session would otherwise compute per client is made
once per set and kept on it: the answer to a wildcard client holding nothing (:meth:`ResourceSet.everything`), the
request and digest a reconnect holding exactly the set compares equal to, the names that changed since an older
set, and the transition from one (the last few answers, holding the older set weakly). Rule numbers cited here are
:mod:`ambit.xds.session`'s, whose sessions these answers serve.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from google.protobuf import any_pb2

from ambit.api import discovery_pb2 as dpb
from ambit.xds.opening import WireVersions, encoded_entries, set_fields, versions_digest
from ambit.xds.snapshot_map import MapEdit, SnapshotMap

__all__ = ["EMPTY", "ResourceSet", "Transition", "XdsResource"]

T = TypeVar("T")


class XdsResource:
    """One resource as served: its name, a version (a content hash), the packed body and its aliases; immutable.

    ``parents`` are the names of the resources this one is a member of (a workload: the services it is an
    endpoint of); a lookup that finds one of those returns this one too. One made by :meth:`built` keeps only the
    encoded ``Resource`` (:attr:`wire`), from which a response is assembled without building a message per client
    (:func:`ambit.xds.frames`), and decodes its body when asked: a ``Resource`` message object costs ~2.8 KB
    (upb's arena) where its bytes cost their length, and the control plane keeps one per workload."""

    __slots__ = ("_body", "_wire", "aliases", "name", "parents", "version")

    name: str
    version: str
    aliases: tuple[str, ...]
    parents: tuple[str, ...]
    _body: any_pb2.Any | None
    _wire: bytes | None

    def __init__(
        self,
        name: str,
        version: str,
        body: any_pb2.Any | None = None,
        aliases: tuple[str, ...] = (),
        parents: tuple[str, ...] = (),
        wire: bytes | None = None,
    ) -> None:
        if body is None and wire is None:
            raise ValueError("a resource needs its body or its encoding")
        set_ = object.__setattr__
        set_(self, "name", name)
        set_(self, "version", version)
        set_(self, "aliases", tuple(aliases))
        set_(self, "parents", tuple(parents))
        set_(self, "_body", body)
        set_(self, "_wire", wire)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"XdsResource is immutable: cannot set {name}")

    @classmethod
    def built(
        cls,
        name: str,
        version: str,
        body: any_pb2.Any,
        aliases: tuple[str, ...] = (),
        parents: tuple[str, ...] = (),
    ) -> XdsResource:
        """An :class:`XdsResource` with its wire form encoded now, keeping only that (one copy of the body's bytes
        per resource, no message objects: issue 22)."""
        wire = dpb.Resource(name=name, version=version, resource=body, aliases=list(aliases)).SerializeToString()
        return cls(name, version, None, aliases, parents, wire)

    @property
    def body(self) -> any_pb2.Any:
        if self._body is not None:
            return self._body
        return self.to_wire().resource

    @property
    def wire(self) -> bytes:
        """The encoded ``Resource`` (made now for one not made by :meth:`built`)."""
        if self._wire is not None:
            return self._wire
        encoded: bytes = self.to_wire().SerializeToString()
        return encoded

    def to_wire(self) -> dpb.Resource:
        if self._wire is not None:
            return dpb.Resource.FromString(self._wire)
        return dpb.Resource(name=self.name, version=self.version, resource=self._body, aliases=list(self.aliases))

    def _key(self) -> tuple[str, str, tuple[str, ...], tuple[str, ...], bytes]:
        return (self.name, self.version, self.aliases, self.parents, self.body.SerializeToString(deterministic=True))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, XdsResource):
            return NotImplemented
        if self is other:
            return True
        if self._wire is not None and other._wire is not None:  # the encoding holds all but the parents
            return self._wire == other._wire and self.parents == other.parents
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((self.name, self.version))

    def __repr__(self) -> str:
        return f"XdsResource(name={self.name!r}, version={self.version!r}, aliases={self.aliases!r})"


@dataclass(frozen=True, slots=True, weakref_slot=True)
class ResourceSet:
    """The current resources of one type, by name, with the alias index for on-demand lookups."""

    by_name: Mapping[str, XdsResource]
    by_alias: Mapping[str, frozenset[str]]
    members: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Resource name → the names of the resources that list it among their ``parents``."""
    _everything: list[_Everything] = field(default_factory=list, compare=False, repr=False)
    """:meth:`everything`, made at its first call (the set never changes, so neither does it)."""
    _versions_request: list[dpb.DeltaDiscoveryRequest] = field(default_factory=list, compare=False, repr=False)
    _versions_digest: list[tuple[int, int]] = field(default_factory=list, compare=False, repr=False)
    _since: list[tuple[weakref.ref[ResourceSet], frozenset[str]]] = field(
        default_factory=list, compare=False, repr=False
    )
    """:meth:`changed_since`'s latest answers, newest last. The older set is held weakly: a strong reference would
    keep every set alive through the one after it (each holds its own predecessor), growing without bound under
    churn."""
    _transitions: list[tuple[weakref.ref[ResourceSet], Transition]] = field(
        default_factory=list, compare=False, repr=False
    )
    """:meth:`transition_from`'s latest answers, newest last (held weakly, as :attr:`_since`)."""

    def versions_request(self) -> dpb.DeltaDiscoveryRequest:
        """A request naming every resource of this set at its version and nothing else, made at its first call:
        what an opening request of a client holding exactly this set compares equal to (session rule 12)."""
        if not self._versions_request:
            request = dpb.DeltaDiscoveryRequest(initial_resource_versions=self.everything().versions)
            self._versions_request.append(request)
        return self._versions_request[0]

    def versions_digest(self) -> tuple[int, int]:
        """The digest of :meth:`versions_request`'s entries as protobuf encodes them (:mod:`ambit.xds.opening`,
        rules 2 and 3), made at its first call."""
        if not self._versions_digest:
            self._versions_digest.append(versions_digest(encoded_entries(self.versions_request())))
        return self._versions_digest[0]

    def holds_entries(self, versions: WireVersions) -> bool:
        """Whether encoded held versions are exactly this set's (session rule 12), by their digest: no name is
        parsed."""
        return len(versions) == len(self.by_name) and versions.digest() == self.versions_digest()

    def holds_exactly(self, request: dpb.DeltaDiscoveryRequest) -> bool:
        """Whether ``request``'s ``initial_resource_versions`` are exactly this set's (session rule 12). The request is
        compared whole, in C, with :meth:`versions_request` given the request's other fields for the moment: no
        copy of the names it carries is made (a copy of 110,000 costs more than the comparison)."""
        if len(request.initial_resource_versions) != len(self.by_name):
            return False
        probe = self.versions_request()
        others = [(f, v) for f, v in request.ListFields() if f.name != "initial_resource_versions"]
        try:
            set_fields(probe, others)
            return bool(request == probe)
        finally:
            for descriptor, _ in others:
                probe.ClearField(descriptor.name)

    def changed_since(self, older: ResourceSet) -> frozenset[str]:
        """The names of the resources that differ between ``older`` and this set (added, removed or replaced; a
        resource replaced by an equal one may be named too). Every client rebasing from the same set asks the same
        question (session rule 11), so the last few answers are kept."""
        for seen, names in self._since:
            if seen() is older:
                return names
        mine, theirs = self.by_name, older.by_name
        if isinstance(mine, SnapshotMap) and isinstance(theirs, SnapshotMap):
            found = frozenset(mine.differing_keys(theirs))
        else:
            found = frozenset(n for n in {*mine, *theirs} if mine.get(n) is not theirs.get(n))
        self._since.append((weakref.ref(older), found))
        del self._since[:-_SINCE_KEPT]
        return found

    def transition_from(self, older: ResourceSet) -> Transition:
        """What a wildcard client holding exactly ``older`` is sent to hold exactly this set (session rule 4 over every
        name: session rule 13): made once per pair of sets and shared by every client that holds the same set."""
        for seen, transition in self._transitions:
            if seen() is older:
                return transition
        mine, theirs = self.by_name, older.by_name
        sent: list[XdsResource] = []
        removed: list[str] = []
        for name in sorted(self.changed_since(older)):
            resource = mine.get(name)
            if resource is None:
                if name in theirs:
                    removed.append(name)
                continue
            held = theirs.get(name)
            if held is None or held.version != resource.version:
                sent.append(resource)
        transition = Transition(tuple(sent), tuple(removed), tuple(r.name for r in sent))
        self._transitions.append((weakref.ref(older), transition))
        del self._transitions[:-_SINCE_KEPT]
        return transition

    def everything(self) -> _Everything:
        """Every resource in name order, their names and name → version: what a wildcard client holding nothing
        is sent (session rule 9), made once per set instead of once per client."""
        if not self._everything:
            ordered = tuple(self.by_name[name] for name in sorted(self.by_name))
            self._everything.append(
                _Everything(ordered, tuple(r.name for r in ordered), {r.name: r.version for r in ordered})
            )
        return self._everything[0]

    @classmethod
    def build(cls, resources: Iterable[XdsResource]) -> ResourceSet:
        by_name = {r.name: r for r in resources}
        by_alias: dict[str, set[str]] = {}
        members: dict[str, set[str]] = {}
        for resource in by_name.values():
            for alias in resource.aliases:
                by_alias.setdefault(alias, set()).add(resource.name)
            for parent in resource.parents:
                members.setdefault(parent, set()).add(resource.name)
        return cls(
            SnapshotMap.of(by_name),
            SnapshotMap.of({alias: frozenset(names) for alias, names in by_alias.items()}),
            SnapshotMap.of({parent: frozenset(names) for parent, names in members.items()}),
        )

    def updated(self, upserts: Iterable[XdsResource], removed: Iterable[str]) -> ResourceSet:
        """This set with ``upserts`` put in (replacing any of the same name) and the ``removed`` names taken out;
        equal to :meth:`build` over the result, at a cost in the size of the change, not of the set (a table of
        10,000 workloads was rebuilt whole for each push: 0.14 s each, issue 22); the indexes are
        :class:`~ambit.xds.snapshot_map.SnapshotMap` edits, which copy only the buckets a change writes to.
        ``self`` is not changed."""
        by_name = _edit(self.by_name)
        by_alias = _edit(self.by_alias)
        members = _edit(self.members)

        def index(table: MapEdit[str, frozenset[str]], keys: Iterable[str], name: str, *, add: bool) -> None:
            for key in keys:
                names = table.get(key) or frozenset()
                names = names | {name} if add else names - {name}
                if names:
                    table[key] = names
                else:
                    table.pop(key, None)

        def forget(name: str) -> None:
            old = by_name.pop(name, None)
            if old is not None:
                index(by_alias, old.aliases, name, add=False)
                index(members, old.parents, name, add=False)

        for name in removed:
            forget(name)
        for resource in upserts:
            forget(resource.name)
            by_name[resource.name] = resource
            index(by_alias, resource.aliases, resource.name, add=True)
            index(members, resource.parents, resource.name, add=True)
        return ResourceSet(by_name.freeze(), by_alias.freeze(), members.freeze())

    def resolve(self, name: str) -> frozenset[str]:
        """The resource names ``name`` stands for: itself if it is a resource, else what its alias points at."""
        if name in self.by_name:
            return frozenset((name,))
        return self.by_alias.get(name, frozenset())

    def lookup(self, name: str) -> frozenset[str]:
        """What an on-demand lookup of ``name`` answers with (session rule 8): :meth:`resolve`, plus the members of each
        resource found (a Service's endpoint workloads) that exist."""
        found = self.resolve(name)
        members = {m for n in found for m in self.members.get(n, ()) if m in self.by_name}
        return found | members if members else found


@dataclass(frozen=True, slots=True)
class Transition:
    """:meth:`ResourceSet.transition_from`: the resources to send in name order, the names to remove in order, and
    the sent resources' names (what a nonce in flight records)."""

    sent: tuple[XdsResource, ...]
    removed: tuple[str, ...]
    sent_names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Everything:
    resources: tuple[XdsResource, ...]
    names: tuple[str, ...]
    versions: Mapping[str, str]
    """Never changed: a session copies it."""


def _edit(table: Mapping[str, T]) -> MapEdit[str, T]:
    """An edit of one of a set's indexes (a plain mapping, as a caller may give, is taken into a map first)."""
    found = table if isinstance(table, SnapshotMap) else SnapshotMap.of(table)
    return found.edit()


EMPTY = ResourceSet(SnapshotMap.of({}), SnapshotMap.of({}), SnapshotMap.of({}))
_SINCE_KEPT = 4
