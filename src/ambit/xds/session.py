"""The server's side of one client's delta ADS stream (spec §4.2), sans-IO: requests in, responses out.

Theory of operation: a :class:`ServerSession` keeps, per type URL, what the client subscribed to and which version
of each resource it holds. :meth:`ServerSession.receive` takes one ``DeltaDiscoveryRequest`` and the current
:class:`ResourceSet` of that type and returns what to send; :meth:`ServerSession.push` takes the current set and
the names that changed (``None`` = compare everything) and returns the incremental responses. The shell owns the
stream, the clock and the debounce; this class never blocks and never reads a clock.

Rules:

1. The first request of a type opens it. ``initial_resource_versions`` says what the client already holds (a
   reconnect); an empty subscribe list (with no unsubscribe) means wildcard, as legacy Envoy clients expect.
2. Later requests change the subscription: ``*`` in subscribe turns wildcard on, ``*`` in unsubscribe turns it off
   (ztunnel's on-demand mode sends both at once: "subscribe to nothing"). Other names are resource names or
   ``network/IP`` aliases; unsubscribing a name forgets that the client holds it.
3. A client *wants* a resource when it is wildcard, or subscribed to the resource's name, one of its aliases, or
   one of its parents (a workload that becomes an endpoint of a Service the client looked up is pushed to it, as
   the endpoints the lookup carried are).
4. A response carries each wanted resource whose version differs from what the client holds, and in
   ``removed_resources`` each name the client holds that no longer exists, plus each explicitly subscribed name
   that resolves to nothing (so an on-demand lookup gets an answer). Unchanged resources are never resent.
5. Opening a type, or subscribing to names, always gets a response, even an empty one: the client learns it is
   in sync. Pushes and ACKs get one only when there is something to say.
6. ACK = a request with ``response_nonce``; NACK = the same with ``error_detail``. Both retire the nonce. A NACK
   changes nothing else: the server keeps serving, and the NACKed versions are not resent until they change (as
   istiod). A nonce we never sent, or already retired, is stale and only reported.
7. Nonces are ``<session prefix>-<counter>``, so they are unique per stream and deterministic under test.
8. A lookup (subscribing to a name) answers as istiod's ambient index does (:meth:`ResourceSet.lookup`): a
   resource name gives that resource, a ``network/IP`` alias the resources holding that address, and a resource
   that has members (a Service: the workloads that are its endpoints) comes with all of them. The client is then
   subscribed to every resource the answer carried, so later changes to them are pushed (istiod merges what it
   sent into the client's resource names).
9. A wildcard client that holds nothing (a new node proxy, or one whose opening request was too large to carry
   its versions) is sent every resource in name order, as rule 4 gives: the set makes that answer once
   (:meth:`ResourceSet.everything`) and every such client's delta carries the same tuple, so the shell can encode
   it once for all of them (:mod:`ambit.xds.frames`).
10. A client holds at most :data:`MAX_NAMES` subscribed names per type: names beyond that are answered as absent
    (in ``removed_resources``) and not remembered, so a client asking for ever new addresses costs bounded memory.
11. What a client holds is kept as :class:`HeldVersions`: a :class:`ResourceSet` it holds whole (each resource at
    that set's version) plus a dict of the names where it differs. A wildcard client in sync holds its last set
    and nothing of its own, so a thousand clients of 100,000 workloads share one table instead of keeping a dict of
    100,000 names each (~3.7 MiB a client, issue 22). After a push leaves more than :data:`REBASE_AFTER`
    differences, a wildcard client's held versions are rebased on the set it was just pushed: the same content,
    with the differences recomputed from the names that changed between the two sets
    (:meth:`ResourceSet.changed_since`, computed once per pair of sets for every client and costing the
    :class:`~ambit.xds.snapshot_map.SnapshotMap` buckets the changes copied).
12. A wildcard client opening with ``initial_resource_versions`` (a reconnect, e.g. after a control-plane restart)
    is compared with the set as a whole: when it names exactly the set's versions (the usual restart: nothing
    changed meanwhile) it holds the set. A request read by the server's shell comes as a
    :class:`~ambit.xds.opening.Reconnect`, its held versions still encoded: they are compared with the set by
    their order-free digest against the set's own (:meth:`ResourceSet.holds_entries`, :mod:`ambit.xds.opening`),
    one hash per entry and no parse of the map; a request given as a message is compared whole with one request
    made per set (:meth:`ResourceSet.holds_exactly`, protobuf's message equality, in C). Otherwise it is held on
    the set as its differences from it (:meth:`HeldVersions.against`: one walk of the names it sent, keeping the
    set's own strings), and the answer carries those differences only. Either way no client keeps a dict of every
    name it sent, and what it holds afterwards is the set itself. The set's request and digest are made once per
    set a reconnect of the same size meets: a restart during churn, where sets follow each other and the clients
    hold an older one, pays them per set for nothing (and then the walk).
13. A push to a wildcard client that holds a set exactly (no differences of its own: the usual case, since every
    push and rule 11 leave it so) carries rule 4 over every name, which is the same for every client holding that
    set: :meth:`ResourceSet.transition_from` makes it once per pair of sets (from the names that changed between
    them, :meth:`ResourceSet.changed_since`) and every such client's delta carries the same tuples, so a push
    costs a client no lookup per changed name (issue 22: at 1,000 clients and 100 pod changes a second, the
    per-name lookups were a third of the control plane's CPU). It also sends what changed in the set but was not
    yet named to this stream; the later notice of those names then finds the client in sync.
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from google.protobuf import any_pb2

from ambit.api import discovery_pb2 as dpb
from ambit.xds.opening import Reconnect, WireVersions, encoded_entries, set_fields, versions_digest
from ambit.xds.snapshot_map import MapEdit, SnapshotMap

__all__ = [
    "AUTHORIZATION_TYPE_URL",
    "Delta",
    "HeldVersions",
    "RequestKind",
    "ResourceSet",
    "ServerSession",
    "SessionOutput",
    "XdsResource",
]

AUTHORIZATION_TYPE_URL = "type.googleapis.com/istio.security.Authorization"
SERVICE_NAME = "envoy.service.discovery.v3.AggregatedDiscoveryService"
"""The gRPC service of delta ADS; with :data:`METHOD`, the one stream both ends speak."""
METHOD = "DeltaAggregatedResources"
WILDCARD = "*"
MAX_NAMES = 100_000
"""Subscribed names at most per client and type (rule 10)."""
REBASE_AFTER = 256
"""Differences a wildcard client's held versions keep from their base set before they are rebased (rule 11)."""
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
        what an opening request of a client holding exactly this set compares equal to (rule 12)."""
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
        """Whether encoded held versions are exactly this set's (rule 12), by their digest: no name is parsed."""
        return len(versions) == len(self.by_name) and versions.digest() == self.versions_digest()

    def holds_exactly(self, request: dpb.DeltaDiscoveryRequest) -> bool:
        """Whether ``request``'s ``initial_resource_versions`` are exactly this set's (rule 12). The request is
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
        question (rule 11), so the last few answers are kept."""
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
        """What a wildcard client holding exactly ``older`` is sent to hold exactly this set (rule 4 over every
        name: rule 13): made once per pair of sets and shared by every client that holds the same set."""
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
        is sent (rule 9), made once per set instead of once per client."""
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
        """What an on-demand lookup of ``name`` answers with (rule 8): :meth:`resolve`, plus the members of each
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
_IN_SYNC = Transition((), (), ())
_SINCE_KEPT = 4


class HeldVersions:
    """What one client holds of one type, name → version (rule 11): every resource of a base set at that set's
    version, except where ``_differs`` says otherwise (a version of its own, or None: not held)."""

    __slots__ = ("_base", "_differs", "_size")

    def __init__(self, versions: Mapping[str, str] | None = None) -> None:
        self._base = EMPTY
        self._differs: dict[str, str | None] = dict(versions or {})
        self._size = len(self._differs)

    @classmethod
    def against(cls, current: ResourceSet, versions: Mapping[str, str]) -> HeldVersions:
        """``versions`` held on ``current`` as the base set (rule 12): only the names whose version differs from
        it are kept, each as the set's own string where the set has the name, so that a reconnect naming a
        slightly older set costs its differences, not a dict of every name."""
        held = cls()
        differs: dict[str, str | None] = {}
        by_name = current.by_name
        unknown = 0
        for name, version in versions.items():
            resource = by_name.get(name)
            if resource is None:
                differs[name] = version
                unknown += 1
            elif resource.version != version:
                differs[resource.name] = version
        if len(versions) - unknown < len(by_name):  # some of the set's resources are not held
            differs.update((name, None) for name in by_name if name not in versions)
        held._base, held._differs, held._size = current, differs, len(versions)
        return held

    def differing(self) -> Iterable[tuple[str, str | None]]:
        """The names that differ from the base set, each with the version held (None: not held)."""
        return self._differs.items()

    @property
    def base(self) -> ResourceSet:
        return self._base

    @property
    def differences(self) -> int:
        """How many names differ from the base set (what this client costs on its own)."""
        return len(self._differs)

    def get(self, name: str) -> str | None:
        if name in self._differs:
            return self._differs[name]
        resource = self._base.by_name.get(name)
        return resource.version if resource is not None else None

    def __contains__(self, name: str) -> bool:
        return self.get(name) is not None

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def set(self, name: str, version: str) -> None:
        if self.get(name) is None:
            self._size += 1
        resource = self._base.by_name.get(name)
        if resource is not None and resource.version == version:
            self._differs.pop(name, None)
        else:
            self._differs[name] = version

    def discard(self, name: str) -> bool:
        """Forget ``name``; whether it was held."""
        if self.get(name) is None:
            return False
        self._size -= 1
        if name in self._base.by_name:
            self._differs[name] = None
        else:
            del self._differs[name]
        return True

    def names(self) -> Iterator[str]:
        differs = self._differs
        yield from (name for name in self._base.by_name if name not in differs)
        yield from (name for name, version in differs.items() if version is not None)

    def as_dict(self) -> Mapping[str, str]:
        """Name → version as one mapping (the differences themselves when there is no base: not to be changed)."""
        if not self._base.by_name:
            return self._differs  # type: ignore[return-value]  # no base: nothing is None
        return {name: version for name in self.names() if (version := self.get(name)) is not None}

    def adopt(self, current: ResourceSet) -> None:
        """Hold exactly ``current``: each of its resources at its version, nothing else."""
        self._base, self._differs, self._size = current, {}, len(current.by_name)

    def rebase(self, current: ResourceSet) -> None:
        """The same content on ``current`` as the base set: only the names that differ from it are kept."""
        differs: dict[str, str | None] = {}
        by_name = current.by_name
        for name in {*self._differs, *current.changed_since(self._base)}:
            mine = self.get(name)
            resource = by_name.get(name)
            if mine != (resource.version if resource is not None else None):
                differs[name] = mine
        self._base, self._differs = current, differs


class RequestKind(enum.Enum):
    """What a request turned out to be."""

    OPENED = "opened"  # the first request of a type
    SUBSCRIPTION = "subscription"  # a change of subscription without a nonce
    ACK = "ack"
    NACK = "nack"
    STALE = "stale"  # an ACK or NACK of a nonce that is not in flight


@dataclass(frozen=True, slots=True)
class Delta:
    """One response as the session decided it (rule 4): the resources to send and the names to remove, under a
    nonce. :meth:`message` is the ``DeltaDiscoveryResponse``; the shell may instead send an encoding shared with
    other clients (:class:`ambit.xds.frames.FrameCache`), which parses to the same message."""

    type_url: str
    nonce: str
    resources: tuple[XdsResource, ...] = ()
    removed: tuple[str, ...] = ()

    def message(self) -> dpb.DeltaDiscoveryResponse:
        return dpb.DeltaDiscoveryResponse(
            type_url=self.type_url,
            nonce=self.nonce,
            resources=[r.to_wire() for r in self.resources],
            removed_resources=self.removed,
        )


@dataclass(frozen=True, slots=True)
class SessionOutput:
    """What the shell does after :meth:`ServerSession.receive`: send ``deltas`` (or ``responses``, the same as
    messages); log or count the rest."""

    kind: RequestKind
    deltas: tuple[Delta, ...] = ()
    error: str = ""
    """The NACK's message."""

    @property
    def responses(self) -> tuple[dpb.DeltaDiscoveryResponse, ...]:
        return tuple(delta.message() for delta in self.deltas)


@dataclass(slots=True)
class _TypeState:
    wildcard: bool = False
    names: set[str] = field(default_factory=set)
    held: HeldVersions = field(default_factory=HeldVersions)  # resource name → version the client holds
    in_flight: dict[str, tuple[str, ...]] = field(default_factory=dict)  # nonce → names it carried

    def wants(self, resource: XdsResource) -> bool:
        names = self.names
        return (
            self.wildcard
            or resource.name in names
            or any(a in names for a in resource.aliases)
            or any(p in names for p in resource.parents)
        )


def _shared(versions: Mapping[str, str], current: ResourceSet) -> dict[str, str]:
    """``versions`` with each name, and each version equal to the current one, replaced by the current set's own
    string: reconnecting clients then share one copy of each name and version instead of holding one each."""
    shared: dict[str, str] = {}
    for name, version in versions.items():
        known = current.by_name.get(name)
        if known is None:
            shared[name] = version
        else:
            shared[known.name] = known.version if known.version == version else version
    return shared


class ServerSession:
    """One client's delta ADS state across all type URLs. Pure and synchronous."""

    __slots__ = ("_counter", "_prefix", "_types")

    def __init__(self, prefix: str = "n") -> None:
        self._prefix = prefix
        self._counter = 0
        self._types: dict[str, _TypeState] = {}

    @property
    def type_urls(self) -> tuple[str, ...]:
        """The types the client opened."""
        return tuple(self._types)

    def held(self, type_url: str) -> Mapping[str, str]:
        """What the server believes the client holds: name → version."""
        state = self._types.get(type_url)
        return dict(state.held.as_dict()) if state else {}

    def nonces_in_flight(self, type_url: str) -> tuple[str, ...]:
        state = self._types.get(type_url)
        return tuple(state.in_flight) if state else ()

    def receive(self, request: dpb.DeltaDiscoveryRequest | Reconnect, current: ResourceSet) -> SessionOutput:
        """Handle one request of ``request.type_url``; ``current`` is that type's resources now. A
        :class:`~ambit.xds.opening.Reconnect` is the same request with its held versions still encoded."""
        wire: WireVersions | None = None
        if isinstance(request, Reconnect):
            wire = request.versions
            request = request.request
        type_url = request.type_url
        state = self._types.get(type_url)
        opened = state is None
        if state is None:
            state = self._types[type_url] = _TypeState()
            if not request.resource_names_subscribe and not request.resource_names_unsubscribe:
                state.wildcard = True
                # rule 12: compared whole with the set's versions, then replaced by the set (rule 11)
                if wire is not None and current.holds_entries(wire):
                    state.held.adopt(current)
                elif wire is not None:
                    state.held = HeldVersions.against(current, wire.parsed())
                elif request.initial_resource_versions and current.holds_exactly(request):
                    state.held.adopt(current)
                elif request.initial_resource_versions:
                    state.held = HeldVersions.against(current, request.initial_resource_versions)
            else:
                initial = wire.parsed() if wire is not None else request.initial_resource_versions
                state.held = HeldVersions(_shared(initial, current))
        kind, error = RequestKind.OPENED if opened else RequestKind.SUBSCRIPTION, ""
        if request.response_nonce and not opened:
            carried = state.in_flight.pop(request.response_nonce, None)
            if carried is None:
                kind = RequestKind.STALE
            elif request.HasField("error_detail"):
                kind, error = RequestKind.NACK, request.error_detail.message or f"code {request.error_detail.code}"
            else:
                kind = RequestKind.ACK
        subscribed: list[str] = []
        refused: list[str] = []
        for name in request.resource_names_subscribe:
            if name == WILDCARD:
                state.wildcard = True
            elif name not in state.names and len(state.names) >= MAX_NAMES:
                refused.append(name)  # rule 10
            else:
                subscribed.append(name)
                state.names.add(name)
                state.names.update(current.lookup(name))  # rule 8: follow what the answer carries
        for name in request.resource_names_unsubscribe:
            if name == WILDCARD:
                state.wildcard = False
            else:
                state.names.discard(name)
                for resolved in current.resolve(name) | {name}:
                    if not self._still_wanted(state, current, resolved):
                        state.held.discard(resolved)
        if opened:
            response = self._respond(type_url, state, current, None, always=True)
        elif subscribed or refused:
            response = self._respond(type_url, state, current, None, always=True, looked_up=subscribed, refused=refused)
        else:
            response = None
        return SessionOutput(kind, (response,) if response is not None else (), error)

    def push(self, type_url: str, current: ResourceSet, changed: Collection[str] | None = None) -> SessionOutput:
        """The response for a change of ``type_url`` (``changed`` names, or ``None`` for a full comparison)."""
        state = self._types.get(type_url)
        if state is None:
            return SessionOutput(RequestKind.SUBSCRIPTION)
        response = self._respond(type_url, state, current, changed, always=False)
        return SessionOutput(RequestKind.SUBSCRIPTION, (response,) if response is not None else ())

    @staticmethod
    def _still_wanted(state: _TypeState, current: ResourceSet, name: str) -> bool:
        resource = current.by_name.get(name)
        return resource is not None and state.wants(resource)

    def _respond(
        self,
        type_url: str,
        state: _TypeState,
        current: ResourceSet,
        changed: Collection[str] | None,
        *,
        always: bool,
        looked_up: Collection[str] = (),
        refused: Collection[str] = (),
    ) -> Delta | None:
        if changed is None and not looked_up and not refused and state.wildcard:
            if not state.held and current.by_name:
                return self._respond_everything(type_url, state, current)
            return self._respond_wildcard(type_url, state, current, always=always)
        held = state.held
        if state.wildcard and not looked_up and not refused and not held.differences:  # rule 13
            transition = current.transition_from(held.base) if held.base is not current else _IN_SYNC
            held.adopt(current)
            if not transition.sent and not transition.removed and not always:
                return None
            return self._delta(type_url, state, transition.sent, transition.removed, transition.sent_names)
        candidates: Iterable[str] = changed if changed is not None else {*current.by_name, *state.held.names()}
        if looked_up:
            candidates = {*candidates, *(n for name in looked_up for n in current.lookup(name))}
        sent: list[XdsResource] = []
        removed: list[str] = []
        for name in sorted(candidates):
            resource = current.by_name.get(name)
            if resource is None:
                if state.held.discard(name):
                    removed.append(name)
                continue
            if state.wants(resource) and state.held.get(name) != resource.version:
                state.held.set(name, resource.version)
                sent.append(resource)
        removed.extend(name for name in looked_up if not current.lookup(name) and name not in removed)
        removed.extend(name for name in refused if name not in removed)
        if state.wildcard and state.held.differences > REBASE_AFTER:
            state.held.rebase(current)  # rule 11
        if not sent and not removed and not always:
            return None
        return self._delta(type_url, state, tuple(sent), tuple(removed))

    def _delta(
        self,
        type_url: str,
        state: _TypeState,
        sent: tuple[XdsResource, ...],
        removed: tuple[str, ...],
        sent_names: tuple[str, ...] | None = None,
    ) -> Delta:
        self._counter += 1
        nonce = f"{self._prefix}-{self._counter}"
        state.in_flight[nonce] = sent_names if sent_names is not None else tuple(r.name for r in sent)
        return Delta(type_url, nonce, sent, removed)

    def _respond_wildcard(
        self, type_url: str, state: _TypeState, current: ResourceSet, *, always: bool
    ) -> Delta | None:
        """Rule 12: what rule 4 gives a wildcard client compared whole with ``current`` (it wants every resource),
        from two dicts' items; afterwards it holds ``current`` itself (rule 11)."""
        if state.held.base is current:  # only what differs from it: no comparison of every name
            by_name = current.by_name
            differing = state.held.differing()
            sent = tuple(by_name[name] for name in sorted(name for name, _ in differing if name in by_name))
            removed = tuple(sorted(name for name, version in differing if version is not None and name not in by_name))
            state.held.adopt(current)
            if not sent and not removed and not always:
                return None
            return self._delta(type_url, state, sent, removed)
        versions = current.everything().versions
        held = state.held.as_dict()
        sent = tuple(current.by_name[name] for name in sorted(name for name, _ in versions.items() - held.items()))
        removed = tuple(sorted(held.keys() - versions.keys()))
        state.held.adopt(current)
        if not sent and not removed and not always:
            return None
        return self._delta(type_url, state, sent, removed)

    def _respond_everything(self, type_url: str, state: _TypeState, current: ResourceSet) -> Delta:
        """Rule 9: the same answer as :meth:`_respond` gives a wildcard client that holds nothing, from the set's
        own :meth:`ResourceSet.everything`."""
        everything = current.everything()
        state.held.adopt(current)
        self._counter += 1
        nonce = f"{self._prefix}-{self._counter}"
        state.in_flight[nonce] = everything.names
        return Delta(type_url, nonce, everything.resources)
