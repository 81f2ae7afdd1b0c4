"""The delta ADS servicer (spec §4.2, §5.2): each stream a :class:`~ambit.xds.session.ServerSession` between a reader
and a pusher.

Theory of operation: :class:`XdsService` implements ``envoy.service.discovery.v3.AggregatedDiscoveryService/
DeltaAggregatedResources``. Each new stream first passes :attr:`XdsService.admission`
(:mod:`ambit.xds.admission`: a bound on streams held and istiod's rate limit of new ones; a refused stream ends
with ``RESOURCE_EXHAUSTED`` and a ``grpc-retry-pushback-ms`` trailer before it costs an authentication), then
authenticates its caller (:mod:`ambit.xds.callers`; None → ``UNAUTHENTICATED`` before any resource is sent). An
admitted stream reads its opening request only with one of the :attr:`XdsService.openings` slots and gives the slot
back as soon as the session has decided the request (:mod:`ambit.xds.opening_gate`). Requests are parsed by
:func:`~ambit.xds.opening.parse_request`: a reconnect's held versions stay encoded entries, which the session
compares with the set by their digest (session rule 12) without building a map of them. Then two loops share one
session:

- the reader feeds each request to the session and writes the response it returns;
- the pusher sleeps until a :class:`~ambit.xds.table.ResourceSource` (one per type: Addresses, and Authorizations
  when given) reports changed names, waits until changes have been quiet for ``debounce`` seconds (at most
  ``max_debounce`` after the first; :mod:`ambit.xds.push_changes`), then writes the session's incremental response
  for each type that changed (only changed and removed resources).

A lock makes "ask the session, then write" atomic, so responses leave in the order the session built them and a
nonce is never ACKed before it was written. Responses of served types are written as
:class:`~ambit.xds.frames.Frame` bytes from the service's one :class:`~ambit.xds.frames.FrameCache`: every stream
sent the same resources of the same snapshot (each wildcard answer to a client holding nothing, each push round's
change to the wildcard clients) shares one encoding, and the gRPC serializer passes the bytes through; a type a
client names that is not served is answered as a message and never becomes a cache key. A response larger than a
node proxy accepts is counted (:attr:`~ambit.xds.service_metrics.XdsStats.oversized`) and logged once, not split
(:mod:`ambit.xds.frames`). Large responses (a wildcard answer) are written a few at a time across all streams
(:mod:`ambit.xds.send_budget`), so a thousand node proxies opening at once do not each hold a copy in gRPC's buffers
at the same moment. A stream's failure ends that stream only; it is logged and counted. A pusher that fails (a
write or a defect encoding a push) ends its stream too, at once (a failed write is one line, as the client's leaving
is; a defect is logged with its traceback): a stream left open without its pusher would never be pushed to again,
and its client, still connected, would keep a stale view; ended, the client connects again and gets a full snapshot.

A service built without an Authorization source serves that type as an empty set, so clients that open it still see
themselves in sync. More types can be served from ``sources`` (type URL → source); a type with a ``readers`` check
is served per caller (:class:`~ambit.xds.callers.CallerView`).

Sync status (:mod:`ambit.xds.sync`): each stream that opens a resource type has a record in :attr:`XdsService.sync`
of what it was last sent and last answered per type, updated where responses are written and ACKs read, and
dropped when the stream ends. A request of the debug type ``istio.io/debug/syncz`` is not a subscription: it is
answered by :attr:`XdsService.syncz` (:mod:`ambit.xds.syncz_answers`) to a caller allowed it, asked once per stream.
A debug-only stream holds no record; it is answered one request at a time, each write awaited before the next
request is read.

Metrics: what the injected observer is told is listed in :mod:`ambit.xds.service_metrics`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import grpc  # type: ignore[import-untyped]

from ambit.api import discovery_pb2 as dpb
from ambit.xds.admission import Admission, Refuse
from ambit.xds.callers import Authenticator, Caller, CallerView, DebugAccess, Metadata, ReadCheck
from ambit.xds.convert import ADDRESS_TYPE_URL
from ambit.xds.frames import LARGEST_CLIENT_MESSAGE, Frame, FrameCache
from ambit.xds.opening import Reconnect, parse_request
from ambit.xds.opening_gate import MAX_OPENINGS, OPENING_READ_TIMEOUT, OpeningGate
from ambit.xds.push_changes import Changes, StreamWriteError, write_response
from ambit.xds.resource_set import EMPTY, ResourceSet
from ambit.xds.send_budget import DEFAULT_SEND_BUDGET, SendBudget, SendBudgetSettings
from ambit.xds.server_trim import MALLOC_TRIM, TrimPolicy
from ambit.xds.service_metrics import NO_OBSERVER, XdsObserver, XdsStats
from ambit.xds.session import AUTHORIZATION_TYPE_URL, METHOD, SERVICE_NAME, Delta, RequestKind, ServerSession
from ambit.xds.sync import DEFAULT_STALE_AFTER, SYNCZ_TYPE_URL, ClientSync, SyncRegistry
from ambit.xds.syncz_answers import SynczAnswers
from ambit.xds.table import ResourceSource

__all__ = ["PUSHBACK_KEY", "XdsService"]

log = logging.getLogger("ambit.xds.server")  # one logger for the whole xDS server, whichever module logs
PUSHBACK_KEY = "grpc-retry-pushback-ms"
"""The trailer a refused stream's retry hint travels in (gRPC's server pushback)."""


class XdsService:
    """The servicer. ``add_to(server)`` registers it on a grpc.aio server."""

    def __init__(
        self,
        source: ResourceSource,
        authenticate: Authenticator,
        *,
        debounce: float = 0.1,
        max_debounce: float = 1.0,
        authorizations: ResourceSource | None = None,
        sources: Mapping[str, ResourceSource] | None = None,
        readers: Mapping[str, ReadCheck] | None = None,
        debug_access: DebugAccess | None = None,
        control_plane: str = "",
        stale_after: float = DEFAULT_STALE_AFTER,
        clock: Callable[[], float] = time.time,
        observer: XdsObserver = NO_OBSERVER,
        timer: Callable[[], float] = time.monotonic,
        frames: FrameCache | None = None,
        send_budget: SendBudgetSettings = DEFAULT_SEND_BUDGET,
        admission: Admission | None = None,
        draw: Callable[[], float] = random.random,
        openings: int = MAX_OPENINGS,
        trim: TrimPolicy | None = None,
        malloc_trim: Callable[[], int] | None = MALLOC_TRIM,
    ) -> None:
        """``clock`` stamps the sync status; ``timer`` (monotonic) measures what ``observer`` is told and times
        admission; ``frames`` holds the response bodies shared between streams (a bounded one of its own by
        default); ``send_budget`` limits the large responses written at once across streams; ``draw`` spreads
        admission's retry hints; ``openings`` bounds the opening requests read at once (:data:`MAX_OPENINGS`); after a
        burst of them ``trim`` decides when ``malloc_trim`` (glibc's; None: never) gives free memory back
        (:mod:`ambit.xds.server_trim`)."""
        self.frames = frames if frames is not None else FrameCache()
        self.send_budget = SendBudget(send_budget)
        self.admission = admission if admission is not None else Admission()
        self._draw = draw
        self.stats = XdsStats()
        self.openings = OpeningGate(
            openings, trim if trim is not None else TrimPolicy(), malloc_trim, timer, self.stats
        )
        self._sources: dict[str, ResourceSource] = {ADDRESS_TYPE_URL: source}
        if authorizations is not None:
            self._sources[AUTHORIZATION_TYPE_URL] = authorizations
        self._sources.update(sources or {})
        self._readers = dict(readers or {})
        self._authenticate = authenticate
        self._debounce, self._max_debounce = debounce, max_debounce
        self._ids = itertools.count(1)
        self.clients: dict[int, Caller] = {}
        """Connected, authenticated streams by stream id."""
        self.sync = SyncRegistry()
        self.syncz = SynczAnswers(
            self.sync,
            self.stats,
            clock,
            debug_access=debug_access,
            control_plane=control_plane,
            stale_after=stale_after,
        )
        self._clock = clock
        self._observer, self._timer = observer, timer
        self.change_started: float | None = None
        """When (by ``timer``) the change now being applied to the sources began, if the owner knows: a push
        round's convergence time is measured from it (istiod measures from the first event of a push)."""

    def add_to(self, server: Any) -> None:
        handler = grpc.stream_stream_rpc_method_handler(
            self._stream,
            request_deserializer=parse_request,
            response_serializer=self._serialize,
        )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, {METHOD: handler}),))

    def _serialize(self, response: Frame | dpb.DeltaDiscoveryResponse) -> bytes:
        # gRPC serializes each response once, on the loop, inside ``write``: its size costs nothing more here. A
        # frame is already bytes (its body shared with other streams); only debug and unserved types are messages.
        data: bytes = response.data() if isinstance(response, Frame) else response.SerializeToString()
        if len(data) > LARGEST_CLIENT_MESSAGE:
            self.stats.oversized += 1
            if self.stats.oversized == 1:  # once: the next ones are counted (a wildcard answer goes to every client)
                log.warning(
                    "xds: a %s response of %d bytes is over what node proxies accept", response.type_url, len(data)
                )
        if response.type_url in self._sources:  # a type the client named is never a label value: only served ones
            self._observer.config_sent(response.type_url, len(data))
        return data

    async def _caller(self, metadata: Metadata) -> Caller | None:
        try:
            result = self._authenticate(metadata)
            if inspect.isawaitable(result):
                result = await result
        except Exception:  # an authenticator bug must not leak details to the peer
            log.exception("xds: authenticate failed")
            return None
        return result if isinstance(result, Caller) else None

    async def _stream(self, request_iterator: Any, context: Any) -> None:
        decision = self.admission.arrive(self._timer(), self._draw())  # before authentication (admission rule 3)
        if isinstance(decision, Refuse):
            self.stats.refused += 1
            await self.openings.let_land(context)
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"xds: {decision.reason}, retry later",
                trailing_metadata=((PUSHBACK_KEY, decision.pushback_ms),),
            )
            return
        try:
            if decision.wait:
                await asyncio.sleep(decision.wait)
            await self._admitted(request_iterator, context)
        finally:
            self.admission.leave()

    async def _admitted(self, request_iterator: Any, context: Any) -> None:
        caller = await self._caller(tuple(context.invocation_metadata() or ()))
        if caller is None:
            self.stats.unauthenticated += 1
            await self.openings.let_land(context)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "xds: a valid bearer token is required")
            return
        stream_id = next(self._ids)
        connected_at = self._clock()
        self.stats.streams += 1
        self.clients[stream_id] = caller
        session = ServerSession(prefix=f"s{stream_id}")
        visible = {
            t: CallerView(self._sources[t], check, caller) for t, check in self._readers.items() if t in self._sources
        }
        lock = asyncio.Lock()
        changes = Changes(self._sources, self._change_began)
        listeners = {type_url: changes.listener(type_url) for type_url in self._sources}
        for type_url, listener in listeners.items():
            self._sources[type_url].add_listener(listener)
        pusher = asyncio.create_task(
            self._push_loop(session, context, lock, changes, visible, stream_id), name=f"xds push {caller}"
        )
        handler = asyncio.current_task()
        pusher.add_done_callback(functools.partial(self._pusher_done, handler, stream_id))
        version: list[str] = []  # the proxy version it was counted under, once its first request came
        try:
            await self._read_loop(session, context, lock, caller, visible, stream_id, connected_at, version)
        except asyncio.CancelledError:
            if handler is None or not _failed(pusher):
                raise
            handler.uncancel()  # our own cancel (_pusher_done): return, and gRPC ends the stream for the client
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            self.stats.stream_errors += 1
            self._observer.stream_failed()
            log.info("xds stream %d (%s) ended: %s", stream_id, caller.name, exc)
        finally:
            if version:
                self._observer.client_disconnected(version[0])
            # Forget the stream before the only await here: gRPC cancels this handler when the client goes away,
            # and a cancellation landing in the await below would skip whatever came after it.
            for type_url, listener in listeners.items():
                self._sources[type_url].remove_listener(listener)
            del self.clients[stream_id]
            self.sync.close(stream_id)
            pusher.cancel()
            await asyncio.gather(pusher, return_exceptions=True)

    def _pusher_done(self, handler: asyncio.Task[Any] | None, stream_id: int, pusher: asyncio.Task[None]) -> None:
        """A stream whose pusher failed would stay open and never be pushed to again (a stale proxy): end it, and
        the client connects again and is sent a full snapshot."""
        if pusher.cancelled() or (exc := pusher.exception()) is None:
            return
        self.stats.stream_errors += 1
        self._observer.stream_failed()
        if isinstance(exc, StreamWriteError):  # the client left while a push was on its way: one line, as a read
            log.info("xds stream %d: a push could not be written (%s), ending the stream", stream_id, exc)
        else:
            log.error("xds stream %d: pushing failed, ending the stream: %r", stream_id, exc, exc_info=exc)
        if handler is not None:
            handler.cancel()  # interrupts the reader's wait; the handler then returns (see _admitted)

    def _change_began(self) -> float:
        started = self.change_started
        return started if started is not None else self._timer()

    def _resources(self, type_url: str, visible: Mapping[str, CallerView]) -> ResourceSet:
        source: ResourceSource | CallerView | None = visible.get(type_url) or self._sources.get(type_url)
        return source.current if source is not None else EMPTY

    async def _read_loop(
        self,
        session: ServerSession,
        context: Any,
        lock: asyncio.Lock,
        caller: Caller,
        visible: Mapping[str, CallerView],
        stream_id: int,
        connected_at: float,
        version: list[str],
    ) -> None:
        debug_allowed: list[bool] = []
        slot: asyncio.Semaphore | None = await self.openings.enter()  # _read_one owns it, and gives it back
        while await self._read_one(
            session, context, lock, caller, visible, stream_id, connected_at, version, debug_allowed, slot
        ):
            slot = None

    async def _read_one(
        self,
        session: ServerSession,
        context: Any,
        lock: asyncio.Lock,
        caller: Caller,
        visible: Mapping[str, CallerView],
        stream_id: int,
        connected_at: float,
        version: list[str],
        debug_allowed: list[bool],
        slot: asyncio.Semaphore | None,
    ) -> bool:
        """Read one request and answer it; False at the end of the stream. ``slot`` (an opening's) is given back
        as soon as the request is decided: the request (up to :data:`~ambit.xds.server.MAX_REQUEST_BYTES`, several
        times that once parsed) is not kept past that, and the answer is written without the slot, so that a slow
        reader never holds up other openings."""
        try:
            if slot is None:
                request = await context.read()
            else:  # a client that takes its time over its opening request must not keep the slot from the others
                try:
                    async with asyncio.timeout(OPENING_READ_TIMEOUT):
                        request = await context.read()
                except TimeoutError:
                    await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "xds: the opening request took too long")
            if request is grpc.aio.EOF:
                return False
            if slot is not None and isinstance(request, Reconnect):
                self.openings.read(len(request.versions.data))
            observer, timer = self._observer, self._timer
            fields = request.request if isinstance(request, Reconnect) else request  # all but the held versions
            if not version:
                version.append(_node_version(fields.node) if fields.HasField("node") else "")
                observer.client_connected(version[0])
            if fields.type_url == SYNCZ_TYPE_URL:
                nonce = fields.response_nonce
                del request, fields
                self.openings.give_back(slot)
                slot = None
                if not debug_allowed:
                    debug_allowed.append(await self.syncz.may_read(caller))
                await self.syncz.answer(nonce, context, caller, debug_allowed[0])
                return True
            record = self.sync.open(stream_id, caller.name, caller.cluster_id, connected_at)
            if fields.HasField("node"):
                record.describe(fields.node.id, _node_version(fields.node))
            type_url, nonce = fields.type_url, fields.response_nonce
            served = type_url in self._sources  # only served types get an entry: the record stays small
            async with lock:  # the session's answer and its write are one step (the pusher takes the same lock)
                started = timer()
                current = self._resources(type_url, visible)
                output = session.receive(request, current)
                del request, fields
                self.openings.give_back(slot)
                slot = None
                for delta in output.deltas:
                    if served:
                        await self._write(context, self.frames.frame(current, delta))
                        _record_sent(record, delta, self._clock())
                        observer.response_written(delta.type_url, timer() - started)
                    else:  # a type URL the client made up never becomes a cache key (a client could grow it)
                        await self._write(context, delta.message())
        finally:
            self.openings.give_back(slot)
        if served:
            record.opened(type_url)
        if output.kind is RequestKind.ACK:
            self.stats.acks += 1
            if served:
                record.answered(type_url, nonce, self._clock())
        elif output.kind is RequestKind.NACK:
            self.stats.nacks += 1
            if served:
                observer.rejected(type_url)
                record.answered(type_url, nonce, self._clock(), output.error or "NACK")
            log.warning("xds: %s NACKed %s: %s", caller.name, nonce, output.error)
        elif output.kind is RequestKind.STALE and served:
            observer.nonce_expired(type_url)
        return True

    async def _push_loop(
        self,
        session: ServerSession,
        context: Any,
        lock: asyncio.Lock,
        changes: Changes,
        visible: Mapping[str, CallerView],
        stream_id: int,
    ) -> None:
        pending = changes.names
        observer, timer = self._observer, self._timer
        while True:
            since = await changes.settled(self._debounce, self._max_debounce)
            pushed: dict[str, int] = {}
            wrote = False
            for type_url, names in pending.items():
                if not names:
                    continue
                changed = frozenset(names)
                names.clear()
                pushed[type_url] = len(changed)
                async with lock:
                    started = timer()
                    current = self._resources(type_url, visible)
                    output = session.push(type_url, current, changed)
                    record = self.sync.find(stream_id)
                    for delta in output.deltas:
                        await self._write(context, self.frames.frame(current, delta))
                        self.stats.pushes += 1
                        wrote = True
                        observer.response_written(type_url, timer() - started)
                        if record is not None:
                            _record_sent(record, delta, self._clock())
            if pushed:
                observer.push_round(pushed, timer() - since if wrote and since is not None else None)

    async def _write(self, context: Any, response: Frame | dpb.DeltaDiscoveryResponse) -> None:
        started = self._timer()  # the write's time includes its wait for a slot of the send budget
        size = len(response) if isinstance(response, Frame) else 0
        await self.send_budget.write(size, write_response(context, response))
        self._observer.write_took(self._timer() - started)


def _failed(task: asyncio.Task[None]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is not None


def _record_sent(record: ClientSync, delta: Delta, now: float) -> None:
    record.sent(delta.type_url, delta.nonce, len(delta.resources) + len(delta.removed), now)


def _node_version(node: dpb.Node) -> str:
    """The proxy's version as Istio proxies state it (``ISTIO_VERSION`` metadata), else its build version."""
    field = node.metadata.fields.get("ISTIO_VERSION") if node.HasField("metadata") else None
    if field is not None and field.WhichOneof("kind") == "string_value":
        return str(field.string_value)
    return str(node.build_version)
