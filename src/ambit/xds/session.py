"""The server's side of one client's delta ADS stream (spec §4.2), sans-IO: requests in, responses out.

Theory of operation: a :class:`ServerSession` keeps, per type URL, what the client subscribed to and which version
of each resource it holds. :meth:`ServerSession.receive` takes one ``DeltaDiscoveryRequest`` and the current
:class:`ResourceSet` of that type and returns what to send; :meth:`ServerSession.push` takes the current set and
the names that changed (``None`` = compare everything) and returns the incremental responses. The shell owns the
stream, the clock and the debounce; this class never blocks and never reads a clock. The sets it compares against are
:mod:`ambit.xds.resource_set`'s; what a client holds is a :class:`~ambit.xds.held_versions.HeldVersions`.

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
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from ambit.api import discovery_pb2 as dpb
from ambit.xds.held_versions import HeldVersions
from ambit.xds.opening import Reconnect, WireVersions
from ambit.xds.resource_set import ResourceSet, Transition, XdsResource

__all__ = [
    "AUTHORIZATION_TYPE_URL",
    "METHOD",
    "SERVICE_NAME",
    "Delta",
    "RequestKind",
    "ServerSession",
    "SessionOutput",
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
_IN_SYNC = Transition((), (), ())


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
