"""The client's side of a delta ADS stream (spec §4.2), sans-IO: responses in, state changes and replies out.

Theory of operation: a :class:`ClientSession` remembers, per type URL, the version of every resource it applied.
:meth:`ClientSession.initial_requests` opens a stream (again): one request per type, carrying what it holds in
``initial_resource_versions`` so a restarted server resends only what changed and names what was removed.
:meth:`ClientSession.apply` turns one ``DeltaDiscoveryResponse`` into a :class:`ClientUpdate`: the decoded upserts,
the removals, and the reply (ACK, or NACK when any resource failed to decode). The caller applies the update to
its state; nothing here touches a socket or a clock. The session outlives streams: a reconnect keeps it.

Rules:

1. Decoders are per type URL and raise :class:`XdsConversionError` for bad input. A resource that fails is left
   out (the client keeps whatever it had under that name) and not recorded as held, so a later server resends it;
   the rest of the response applies, and the reply is a NACK whose ``error_detail`` names every failure.
2. ``removed_resources`` forgets names (names never held are ignored, so a negative on-demand answer is harmless).
3. A response of a type the client never opened is NACKed and changes nothing.
4. :attr:`ClientSession.synced` turns true once every opened type got its first response after the latest
   (re)connect; it stays true across later reconnects (the state is kept, just stale).
5. A server reads requests up to a size (ours :data:`ambit.xds.server.MAX_REQUEST_BYTES`, 16 MiB; istiod 4 MiB):
   a type whose ``initial_resource_versions`` would make its opening request larger than ``max_initial_request``
   (:data:`MAX_INITIAL_REQUEST_BYTES`, 12 MiB: some 200,000 resources at ~60 bytes a name and version; 100,000
   workloads with their Services make ~6.5 MiB) opens without them instead of failing every reconnect. The server
   then sends the type's whole wanted state in its first response, so that response replaces what is held: a held
   name it lacks is removed.
6. On demand (ztunnel's ``XDS_ON_DEMAND``): a type opens subscribed to nothing (``*`` in subscribe and in
   unsubscribe). :meth:`ClientSession.demand` asks for resource names or ``network/IP`` aliases not asked before
   and remembers them: a reconnect subscribes to them again in its opening request, so the server keeps pushing
   their changes. A demanded name is *pending* until a response answers it: one that carries a resource of that
   name or alias, or names it in ``removed_resources`` (the server's "nothing there"), or the first response
   after a (re)connect, which carries everything subscribed. At most :data:`MAX_DEMANDED` names per type are
   remembered; beyond that a demand asks for nothing (a pod connecting to ever new addresses cannot grow the
   client, or the server, without bound), and the caller treats the name as unknown.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from google.protobuf import any_pb2

from ambit.api import discovery_pb2 as dpb
from ambit.xds.errors import XdsConversionError
from ambit.xds.session import WILDCARD

__all__ = ["ClientSession", "ClientUpdate", "Decoder"]

Decoder = Callable[[str, any_pb2.Any], object]
"""Resource name and packed body → a model value; raises :class:`XdsConversionError` on bad input."""

NACK_CODE = 3  # google.rpc.Code INVALID_ARGUMENT
MAX_DEMANDED = 65536
"""Names at most one type may have demanded (rule 6)."""
MAX_INITIAL_REQUEST_BYTES = 12 * 1024 * 1024
"""Largest opening request sent with ``initial_resource_versions`` by default (rule 5): under our server's 16 MiB
limit. (It was 768 KiB under a 1 MiB limit: past ~15,000 resources every client of a restarted control plane was
sent everything again, issue 22.)"""


@dataclass(frozen=True, slots=True)
class ClientUpdate:
    """One response's effect: what to upsert and remove, and the request to send back."""

    type_url: str
    upserts: tuple[tuple[str, object], ...]
    removals: tuple[str, ...]
    reply: dpb.DeltaDiscoveryRequest
    errors: tuple[str, ...] = ()
    answered: frozenset[str] = frozenset()
    """Demanded names this response answered (rule 6)."""

    @property
    def nacked(self) -> bool:
        return bool(self.errors)


class ClientSession:
    """What one client holds, across reconnects. Pure and synchronous."""

    __slots__ = (
        "_decoders",
        "_demanded",
        "_first_seen",
        "_held",
        "_max_initial_request",
        "_named",
        "_node",
        "_on_demand",
        "_pending",
        "_resync",
        "synced",
    )

    def __init__(
        self,
        decoders: Mapping[str, Decoder],
        *,
        node: dpb.Node | None = None,
        on_demand: bool = False,
        named: Mapping[str, Sequence[str]] | None = None,
        max_initial_request: int = MAX_INITIAL_REQUEST_BYTES,
    ) -> None:
        self._decoders = dict(decoders)
        self._max_initial_request = max_initial_request
        self._named = {type_url: tuple(names) for type_url, names in (named or {}).items()}
        """Types subscribed by resource name instead of by wildcard (a waypoint's own configuration)."""
        self._node = node if node is not None else dpb.Node()
        self._on_demand = on_demand
        self._held: dict[str, dict[str, str]] = {type_url: {} for type_url in self._decoders}
        self._first_seen: set[str] = set()
        self._resync: set[str] = set()
        """Types opened without what they hold (rule 5): their first response is the whole state."""
        self._demanded: dict[str, set[str]] = {}
        """Names asked for on demand, per type (rule 6): subscribed again on every reconnect."""
        self._pending: dict[str, set[str]] = {}
        """Demanded names not answered yet, per type."""
        self.synced = False

    @property
    def on_demand(self) -> bool:
        return self._on_demand

    def pending(self, type_url: str) -> frozenset[str]:
        """The demanded names of ``type_url`` no response has answered yet (rule 6)."""
        return frozenset(self._pending.get(type_url, ()))

    @property
    def resyncing(self) -> tuple[str, ...]:
        """The types opened without what they hold (rule 5) whose first response has not come yet."""
        return tuple(sorted(self._resync))

    def held(self, type_url: str) -> Mapping[str, str]:
        return dict(self._held.get(type_url, {}))

    def initial_requests(self) -> list[dpb.DeltaDiscoveryRequest]:
        """The requests that open a stream: wildcard (or on-demand "nothing"), with what we hold."""
        self._first_seen.clear()
        self._resync.clear()
        requests = []
        for type_url, held in self._held.items():
            request = dpb.DeltaDiscoveryRequest(node=self._node, type_url=type_url, initial_resource_versions=held)
            if request.ByteSize() > self._max_initial_request:
                request.ClearField("initial_resource_versions")
                self._resync.add(type_url)
            if type_url in self._named:
                request.resource_names_subscribe.extend(self._named[type_url])
            elif self._on_demand:
                request.resource_names_subscribe.append(WILDCARD)
                request.resource_names_unsubscribe.append(WILDCARD)
                request.resource_names_subscribe.extend(sorted(self._demanded.get(type_url, ())))
            requests.append(request)
        return requests

    def subscribe(self, type_url: str, names: Sequence[str]) -> dpb.DeltaDiscoveryRequest:
        """An on-demand lookup: subscribe to resource names or ``network/IP`` aliases."""
        return dpb.DeltaDiscoveryRequest(type_url=type_url, resource_names_subscribe=list(names))

    def demand(self, type_url: str, names: Sequence[str]) -> dpb.DeltaDiscoveryRequest | None:
        """Rule 6: the request asking for the ``names`` not demanded before (pending from now on), or None when
        there are none, the type is not on demand, or the bound is reached."""
        if not self._on_demand or type_url not in self._held or type_url in self._named:
            return None
        demanded = self._demanded.setdefault(type_url, set())
        new = [name for name in dict.fromkeys(names) if name and name not in demanded]
        new = new[: max(0, MAX_DEMANDED - len(demanded))]
        if not new:
            return None
        demanded.update(new)
        self._pending.setdefault(type_url, set()).update(new)
        return self.subscribe(type_url, new)

    def apply(self, response: dpb.DeltaDiscoveryResponse) -> ClientUpdate:
        """Decode one response; record what was applied; build the ACK or NACK."""
        type_url = response.type_url
        reply = dpb.DeltaDiscoveryRequest(type_url=type_url, response_nonce=response.nonce)
        decode = self._decoders.get(type_url)
        held = self._held.get(type_url)
        if decode is None or held is None:
            error = f"type {type_url!r} was not subscribed"
            reply.error_detail.code, reply.error_detail.message = NACK_CODE, error
            return ClientUpdate(type_url, (), (), reply, (error,))
        upserts: list[tuple[str, object]] = []
        errors: list[str] = []
        for resource in response.resources:
            try:
                if not resource.name:
                    raise XdsConversionError("", "name", "required")
                if not resource.HasField("resource"):
                    raise XdsConversionError(resource.name, "resource", "missing (no body)")
                value = decode(resource.name, resource.resource)
            except XdsConversionError as exc:
                errors.append(str(exc))
                continue
            held[resource.name] = resource.version
            upserts.append((resource.name, value))
        removals = []
        for name in response.removed_resources:
            if held.pop(name, None) is not None:
                removals.append(name)
        if type_url in self._resync:  # rule 5: the first response after opening without versions is everything
            self._resync.discard(type_url)
            sent = {resource.name for resource in response.resources}
            for name in [name for name in held if name not in sent]:
                del held[name]
                removals.append(name)
        if errors:
            reply.error_detail.code = NACK_CODE
            reply.error_detail.message = "; ".join(errors)
        answered = self._answer(type_url, response)
        self._first_seen.add(type_url)
        if self._first_seen >= set(self._held):
            self.synced = True
        return ClientUpdate(type_url, tuple(upserts), tuple(removals), reply, tuple(errors), answered)

    def _answer(self, type_url: str, response: dpb.DeltaDiscoveryResponse) -> frozenset[str]:
        """Rule 6: the pending names ``response`` answers, no longer pending."""
        pending = self._pending.get(type_url)
        if not pending:
            return frozenset()
        if type_url not in self._first_seen:  # the opening answer carries everything subscribed
            answered = frozenset(pending)
        else:
            mentioned = set(response.removed_resources)
            for resource in response.resources:
                mentioned.add(resource.name)
                mentioned.update(resource.aliases)
            answered = frozenset(pending & mentioned)
        pending -= answered
        return answered
