"""The delta ADS server (spec §4.2, §5.2): a thin grpc.aio shell around :class:`~ambit.xds.session.ServerSession`.

Theory of operation: :class:`XdsService` implements ``envoy.service.discovery.v3.AggregatedDiscoveryService/
DeltaAggregatedResources``. Each new stream first passes :attr:`XdsService.admission`
(:mod:`ambit.xds.admission`: a bound on streams held and istiod's rate limit of new ones; a refused stream ends
with ``RESOURCE_EXHAUSTED`` and a ``grpc-retry-pushback-ms`` trailer before it costs an authentication), then
authenticates its caller from the gRPC metadata with the injected ``authenticate`` (None → ``UNAUTHENTICATED``
before any resource is sent). A node proxy reconnecting after a restart opens with every resource it holds named
(``initial_resource_versions``: ~6.5 MB at 100,000 workloads), so a thousand of them at once would hold gigabytes
if each stream's opening were read as soon as it arrived: an admitted stream reads its opening request only with
one of :data:`MAX_OPENINGS` slots, and gives the slot back as soon as the session has decided the request; until
then its client's bytes wait at the client (HTTP/2 flow control, with the receive windows kept at their initial
size: :data:`RECEIVE_WINDOW_OPTIONS`). Requests are parsed by :func:`~ambit.xds.opening.parse_request`: a
reconnect's held versions stay encoded entries, which the session compares with the set by their digest (session
rule 12) without building a map of them. Once no opening has been in flight for a quiet second after a burst of
them, glibc's ``malloc_trim`` gives the allocator's free memory back, on a worker thread
(:mod:`ambit.xds.server_trim`). Then two loops share one session:

- the reader feeds each request to the session and writes the response it returns;
- the pusher sleeps until a :class:`~ambit.xds.table.ResourceSource` (one per type: Addresses, and Authorizations
  when given) reports changed names, waits until changes have been quiet for ``debounce`` seconds (at most
  ``max_debounce`` after the first), then writes the session's incremental response for each type that changed
  (only changed and removed resources).

A lock makes "ask the session, then write" atomic, so responses leave in the order the session built them and a
nonce is never ACKed before it was written. Responses of served types are written as
:class:`~ambit.xds.frames.Frame` bytes from the service's one :class:`~ambit.xds.frames.FrameCache`: every stream
sent the same resources of the same snapshot (each wildcard answer to a client holding nothing, each push round's
change to the wildcard clients) shares one encoding, and the gRPC serializer passes the bytes through; a type a
client names that is not served is answered as a message and never becomes a cache key. A response larger than a
node proxy accepts is counted (:attr:`XdsStats.oversized`) and logged once, not split (:mod:`ambit.xds.frames`).
Large responses (a wildcard answer) are written a few at a time across all streams (:mod:`ambit.xds.send_budget`),
so a thousand node proxies opening at once do not each hold a copy in gRPC's buffers at the same moment.
A stream's failure ends that stream only; it is logged and counted. A pusher that fails (a write or a defect
encoding a push) ends its stream too, at once (a failed write is one line, as the client's leaving is; a defect is
logged with its traceback): a stream left open without its pusher would never be pushed to
again, and its client, still connected, would keep a stale view; ended, the client connects again and gets a full
snapshot.
:class:`XdsServer` owns a TLS grpc.aio server with the service on it (the CA service can share it through
:meth:`XdsServer.grpc_server` before :meth:`XdsServer.start`). The server tolerates client keepalive pings every
15 s and pings idle clients itself, as istiod does (:mod:`ambit.xds.keepalive`).

A server built without an Authorization source serves that type as an empty set, so clients that open it still see
themselves in sync. More types can be served from ``sources`` (type URL → source); a type with a ``readers`` check
is served per caller: each stream sees only the resources ``check(caller, name)`` allows (a filtered
:class:`~ambit.xds.session.ResourceSet`, rebuilt when the source's set is replaced), so a subscription to a name the
caller may not read is answered as for a resource that does not exist, and a change to it is never pushed to that
caller. Waypoint configurations are served this way: only to the waypoint's own service account.

Sync status (:mod:`ambit.xds.sync`): each stream that opens a resource type has a record in :attr:`XdsService.sync`
of what it was last sent and last answered per type, updated where responses are written and ACKs read, and
dropped when the stream ends. A request of the debug type ``istio.io/debug/syncz`` is not a subscription: the
server asks the injected ``debug_access`` whether this caller may read the status (once per stream; no
``debug_access`` means nobody may), answers with one resource ``syncz`` holding the JSON document (a
``google.protobuf.StringValue``), and ends a stream it refuses with ``PERMISSION_DENIED``. A debug-only stream
holds no record; it is answered one request at a time, each write awaited before the next request is read.

Metrics: an injected :class:`XdsObserver` (the control plane's monitoring; :data:`NO_OBSERVER` by default) is told
of each authenticated stream (connected at its first request, with the proxy version its node states, and
disconnected when it ends), of each response of a served type (the time from asking the session to the end of the
write, and the response's size), of each write's duration, of each push round (the types it pushed, and the time
from the first change to the last write, measured from :attr:`XdsService.change_started` when the owner set it, else
from when the stream heard of the change), of NACKs, of ACKs of a nonce no longer in flight, and of streams that
failed. Each call is a counter or histogram update; nothing is built per response for it. Only served types are
reported: a type URL a client makes up never becomes a label value (a client could otherwise grow the series).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc  # type: ignore[import-untyped]
from google.protobuf import any_pb2, wrappers_pb2

from ambit.api import discovery_pb2 as dpb
from ambit.xds.admission import Admission, Refuse
from ambit.xds.convert import ADDRESS_TYPE_URL
from ambit.xds.errors import XdsError
from ambit.xds.frames import LARGEST_CLIENT_MESSAGE, Frame, FrameCache
from ambit.xds.keepalive import DEFAULT_KEEPALIVE, KeepaliveSettings
from ambit.xds.opening import Reconnect, parse_request
from ambit.xds.send_budget import DEFAULT_SEND_BUDGET, SendBudget, SendBudgetSettings
from ambit.xds.server_trim import MALLOC_TRIM, TrimPolicy
from ambit.xds.session import (
    AUTHORIZATION_TYPE_URL,
    EMPTY,
    METHOD,
    SERVICE_NAME,
    Delta,
    RequestKind,
    ResourceSet,
    ServerSession,
)
from ambit.xds.sync import DEFAULT_STALE_AFTER, SYNCZ_TYPE_URL, ClientSync, SyncRegistry
from ambit.xds.table import ResourceSource

__all__ = [
    "METHOD",
    "NO_OBSERVER",
    "SERVICE_NAME",
    "Authenticator",
    "Caller",
    "CallerView",
    "DebugAccess",
    "ReadCheck",
    "XdsObserver",
    "XdsServer",
    "XdsService",
]

log = logging.getLogger("ambit.xds.server")
MAX_REQUEST_BYTES = 16 * 1024 * 1024
"""The largest request message :class:`XdsServer` reads (gRPC's ``max_receive_message_length``; istiod 4 MiB): a
node proxy reconnecting to a restarted control plane names every resource it holds with its version in its opening
request (~60 bytes each: 100,000 workloads and 10,000 Services make ~6.5 MiB) so that nothing unchanged is sent
again. A service sharing the server bounds its own messages below this (the CA: 1 MiB)."""
MAX_OPENINGS = 4
"""Admitted streams whose opening request is read and decided at once (:meth:`XdsService._read_one`). A stream
waiting for one of these slots has not asked gRPC for its first message, so its client's bytes stay at the client
(HTTP/2 flow control lets only a stream window's worth through); a reading one holds the message (up to
:data:`MAX_REQUEST_BYTES`) in gRPC's buffers, as bytes and parsed, until the session has decided it."""
OPENING_READ_TIMEOUT = 10.0
"""Seconds an admitted stream may take to send its opening request once it holds a slot (:data:`MAX_OPENINGS`); a
stream slower than that is ended (``DEADLINE_EXCEEDED``), so that a few silent clients cannot stop every other
stream from opening."""
MAX_TURNED_AWAY = 8
"""Streams about to be refused or found unauthenticated whose first request is read at once (at most
:data:`MAX_REQUEST_BYTES` each; :meth:`XdsService._let_land`)."""
RECEIVE_WINDOW_OPTIONS: Mapping[str, int] = {"grpc.http2.bdp_probe": 0}
"""gRPC options that keep what a client sends and the server has not asked for at the client: without bandwidth-
delay probing each stream's HTTP/2 receive window stays at its initial 64 KiB instead of growing to megabytes on a
fast link, so a stream waiting for admission or for an opening slot (:data:`MAX_OPENINGS`) holds at most that much
of its opening request in gRPC's buffers. A stream that reads is not slowed: gRPC opens the window to the size of
the message being read."""
PUSHBACK_KEY = "grpc-retry-pushback-ms"
"""The trailer a refused stream's retry hint travels in (gRPC's server pushback)."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is on the other end of a stream, as ``authenticate`` established it."""

    name: str
    """E.g. the service account ``system:serviceaccount:istio-system:ztunnel``."""
    cluster_id: str = ""


Metadata = Sequence[tuple[str, str | bytes]]
Authenticator = Callable[[Metadata], "Caller | Awaitable[Caller | None] | None"]
ReadCheck = Callable[[Caller, str], bool]
"""Whether a caller may read the resource of this name (a type served per caller)."""
DebugAccess = Callable[[Caller], Awaitable[bool]]
"""Whether a caller may read the control plane's debug types (the sync status)."""


class XdsObserver(Protocol):
    """What the server reports for metrics (istiod's ``pilot_xds*`` series; see the module docstring)."""

    def client_connected(self, version: str) -> None: ...
    def client_disconnected(self, version: str) -> None: ...
    def response_written(self, type_url: str, seconds: float) -> None: ...
    def write_took(self, seconds: float) -> None: ...
    def config_sent(self, type_url: str, size: int) -> None: ...
    def push_round(self, changed: Mapping[str, int], converged: float | None) -> None: ...
    def rejected(self, type_url: str) -> None: ...
    def nonce_expired(self, type_url: str) -> None: ...
    def stream_failed(self) -> None: ...


class _NoObserver:
    def client_connected(self, version: str) -> None:
        pass

    def client_disconnected(self, version: str) -> None:
        pass

    def response_written(self, type_url: str, seconds: float) -> None:
        pass

    def write_took(self, seconds: float) -> None:
        pass

    def config_sent(self, type_url: str, size: int) -> None:
        pass

    def push_round(self, changed: Mapping[str, int], converged: float | None) -> None:
        pass

    def rejected(self, type_url: str) -> None:
        pass

    def nonce_expired(self, type_url: str) -> None:
        pass

    def stream_failed(self) -> None:
        pass


NO_OBSERVER: XdsObserver = _NoObserver()


class CallerView:
    """One caller's view of a per-caller type: the source's resources the check allows, cached per source set."""

    __slots__ = ("_caller", "_check", "_seen", "_set", "_source")

    def __init__(self, source: ResourceSource, check: ReadCheck, caller: Caller) -> None:
        self._source, self._check, self._caller = source, check, caller
        self._seen: ResourceSet | None = None
        self._set = EMPTY

    @property
    def current(self) -> ResourceSet:
        current = self._source.current
        if current is not self._seen:
            self._seen = current
            self._set = ResourceSet.build(r for r in current.by_name.values() if self._check(self._caller, r.name))
        return self._set


@dataclass(slots=True)
class XdsStats:
    """Counters for tests, metrics and the admin endpoint."""

    streams: int = 0
    unauthenticated: int = 0
    acks: int = 0
    nacks: int = 0
    pushes: int = 0
    stream_errors: int = 0
    debug_answers: int = 0
    debug_refused: int = 0
    refused: int = 0
    """Streams refused by admission (overload)."""
    oversized: int = 0
    """Responses larger than a node proxy accepts (:data:`~ambit.xds.frames.LARGEST_CLIENT_MESSAGE`)."""
    trims: int = 0
    """Times the allocator's free memory was given back after a burst of openings (:mod:`ambit.xds.server_trim`)."""
    trim_seconds: float = 0.0
    """How long the last of those took (on a worker thread)."""


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
        self._turned_away = 0
        self._openings = asyncio.Semaphore(openings)
        self._in_opening = 0
        """Streams waiting for an opening slot or holding one (:meth:`_read_loop`)."""
        self._trim = trim if trim is not None else TrimPolicy()
        self._malloc_trim = malloc_trim
        self._trim_timer: asyncio.TimerHandle | None = None
        """Refused or unauthenticated streams whose first request is being let land (:func:`_first_request`)."""
        self._sources: dict[str, ResourceSource] = {ADDRESS_TYPE_URL: source}
        if authorizations is not None:
            self._sources[AUTHORIZATION_TYPE_URL] = authorizations
        self._sources.update(sources or {})
        self._readers = dict(readers or {})
        self._authenticate = authenticate
        self._debounce, self._max_debounce = debounce, max_debounce
        self._ids = itertools.count(1)
        self.stats = XdsStats()
        self.clients: dict[int, Caller] = {}
        """Connected, authenticated streams by stream id."""
        self.sync = SyncRegistry()
        self._debug_access, self._control_plane, self._stale_after = debug_access, control_plane, stale_after
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
            await self._let_land(context)
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

    async def _let_land(self, context: Any) -> None:
        """The first request of a stream about to be turned away, let land (:func:`_first_request`) for at most
        :data:`MAX_TURNED_AWAY` such streams at once: a request may be up to :data:`MAX_REQUEST_BYTES`, and a flood of
        refused or unauthenticated streams must not make the server hold that much for each (the rest are aborted
        at once; their clients may see a reset rather than the status)."""
        if self._turned_away >= MAX_TURNED_AWAY:
            return
        self._turned_away += 1
        try:
            await _first_request(context)
        finally:
            self._turned_away -= 1

    async def _admitted(self, request_iterator: Any, context: Any) -> None:
        caller = await self._caller(tuple(context.invocation_metadata() or ()))
        if caller is None:
            self.stats.unauthenticated += 1
            await self._let_land(context)
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
        changes = _Changes(self._sources, self)
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
        self._in_opening += 1
        if self._trim_timer is not None:  # an opening again: the quiet time starts over when it is decided
            self._trim_timer.cancel()
            self._trim_timer = None
        try:
            await self._openings.acquire()  # the opening request is not even read before a slot is free
        except BaseException:
            self._opening_over(None)
            raise
        slot: asyncio.Semaphore | None = self._openings  # _read_one owns it from its first line, and gives it back
        while await self._read_one(
            session, context, lock, caller, visible, stream_id, connected_at, version, debug_allowed, slot
        ):
            slot = None

    def _opening_over(self, slot: asyncio.Semaphore | None) -> None:
        """A stream's opening was decided (its ``slot`` given back) or it stopped waiting for a slot; once none has
        been in flight for a while after a burst, the allocator's free memory is given back on a worker thread
        (:mod:`ambit.xds.server_trim`)."""
        if slot is not None:
            slot.release()
        self._in_opening -= 1
        if not self._in_opening and self._malloc_trim is not None:
            loop = asyncio.get_running_loop()
            self._trim_timer = loop.call_later(self._trim.quiet, self._quiet)

    def _quiet(self) -> None:
        self._trim_timer = None
        if self._in_opening or self._malloc_trim is None or not self._trim.idle():
            return
        trim, timer = self._malloc_trim, self._timer

        def timed() -> float:
            started = timer()
            trim()
            return timer() - started

        done = asyncio.get_running_loop().run_in_executor(None, timed)
        done.add_done_callback(self._trimmed)

    def _trimmed(self, done: asyncio.Future[float]) -> None:
        self._trim.trimmed()
        if done.cancelled() or done.exception() is not None:
            log.warning("xds: giving free memory back failed: %r", None if done.cancelled() else done.exception())
            return
        self.stats.trims += 1
        self.stats.trim_seconds = done.result()
        log.debug("xds: gave free memory back after a burst of openings in %.3f s", self.stats.trim_seconds)

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
        as soon as the request is decided: the request (up to :data:`MAX_REQUEST_BYTES`, several times that once
        parsed) is not kept past that, and the answer is written without the slot, so that a slow reader never
        holds up other openings."""
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
                self._trim.read(len(request.versions.data))
            observer, timer = self._observer, self._timer
            fields = request.request if isinstance(request, Reconnect) else request  # all but the held versions
            if not version:
                version.append(_node_version(fields.node) if fields.HasField("node") else "")
                observer.client_connected(version[0])
            if fields.type_url == SYNCZ_TYPE_URL:
                nonce = fields.response_nonce
                del request, fields
                self._give_back(slot)
                slot = None
                if not debug_allowed:
                    debug_allowed.append(await self._may_debug(caller))
                await self._answer_syncz(nonce, context, caller, debug_allowed[0])
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
                self._give_back(slot)
                slot = None
                for delta in output.deltas:
                    if served:
                        await self._write(context, self.frames.frame(current, delta))
                        _record_sent(record, delta, self._clock())
                        observer.response_written(delta.type_url, timer() - started)
                    else:  # a type URL the client made up never becomes a cache key (a client could grow it)
                        await self._write(context, delta.message())
        finally:
            self._give_back(slot)
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

    def _give_back(self, slot: asyncio.Semaphore | None) -> None:
        if slot is not None:
            self._opening_over(slot)

    async def _may_debug(self, caller: Caller) -> bool:
        if self._debug_access is None:
            return False
        try:
            return await self._debug_access(caller)
        except Exception:  # a failed check refuses; the peer learns nothing more
            log.exception("xds: debug access check failed for %s", caller.name)
            return False

    async def _answer_syncz(self, nonce: str, context: Any, caller: Caller, allowed: bool) -> None:
        """One debug request: the sync document, or the end of the stream for a caller who may not read it."""
        if not allowed:
            self.stats.debug_refused += 1
            log.info("xds: refused the sync status to %s", caller.name)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "xds: this caller may not read the sync status")
        if nonce:  # an ACK of a debug answer: nothing to do
            return
        self.stats.debug_answers += 1
        document = self.sync.document(self._clock(), control_plane=self._control_plane, stale_after=self._stale_after)
        body = any_pb2.Any()
        body.Pack(wrappers_pb2.StringValue(value=json.dumps(document, separators=(",", ":"))))
        answer = f"debug-{self.stats.debug_answers}"
        resource = dpb.Resource(name="syncz", version=answer, resource=body)
        await context.write(dpb.DeltaDiscoveryResponse(type_url=SYNCZ_TYPE_URL, nonce=answer, resources=[resource]))

    async def _push_loop(
        self,
        session: ServerSession,
        context: Any,
        lock: asyncio.Lock,
        changes: _Changes,
        visible: Mapping[str, CallerView],
        stream_id: int,
    ) -> None:
        loop = asyncio.get_running_loop()
        pending, wake = changes.names, changes.wake
        observer, timer = self._observer, self._timer
        while True:
            await wake.wait()
            deadline = loop.time() + self._max_debounce
            while True:  # debounce: until quiet for `debounce`, or `max_debounce` after the first change
                wake.clear()
                quiet = min(self._debounce, deadline - loop.time())
                if quiet <= 0:
                    break
                try:
                    await asyncio.wait_for(wake.wait(), quiet)
                except TimeoutError:
                    break
            wake.clear()
            since, changes.since = changes.since, None
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
        await self.send_budget.write(len(response) if isinstance(response, Frame) else 0, _sent(context, response))
        self._observer.write_took(self._timer() - started)


class StreamWriteError(Exception):
    """A push could not be written to its stream: the client went away, or gRPC ended the call (not a defect)."""


async def _sent(context: Any, response: Frame | dpb.DeltaDiscoveryResponse) -> None:
    try:
        await context.write(response)
    except Exception as exc:  # grpc's own types (ExecuteBatchError, UsageError...) are not all public
        raise StreamWriteError(f"{type(exc).__name__}: {exc}") from exc


def _failed(task: asyncio.Task[None]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is not None


class _Changes:
    """What one stream has yet to push: the changed names per type, since when, and the event that wakes it."""

    __slots__ = ("_service", "names", "since", "wake")

    def __init__(self, type_urls: Collection[str], service: XdsService) -> None:
        self.names: dict[str, set[str]] = {type_url: set() for type_url in type_urls}
        self.since: float | None = None
        """When the oldest change not yet pushed began (see :attr:`XdsService.change_started`)."""
        self.wake = asyncio.Event()
        self._service = service

    def listener(self, type_url: str) -> Callable[[frozenset[str]], None]:
        names = self.names[type_url]

        def on_change(changed: frozenset[str]) -> None:
            names.update(changed)
            if self.since is None:
                started = self._service.change_started
                self.since = started if started is not None else self._service._timer()
            self.wake.set()

        return on_change


async def _first_request(context: Any) -> None:
    """Let the client's first request land before refusing it: aborting while it is still writing can reach it as
    a reset (INTERNAL) instead of our status. Nothing is sent either way."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(1.0):
            await context.read()  # not kept: read straight from the call, not through an iterator's frame


def _record_sent(record: ClientSync, delta: Delta, now: float) -> None:
    record.sent(delta.type_url, delta.nonce, len(delta.resources) + len(delta.removed), now)


def _node_version(node: dpb.Node) -> str:
    """The proxy's version as Istio proxies state it (``ISTIO_VERSION`` metadata), else its build version."""
    field = node.metadata.fields.get("ISTIO_VERSION") if node.HasField("metadata") else None
    if field is not None and field.WhichOneof("kind") == "string_value":
        return str(field.string_value)
    return str(node.build_version)


class XdsServer:
    """A TLS grpc.aio server carrying :class:`XdsService`; ``await start()``, then ``await aclose()``."""

    def __init__(
        self,
        source: ResourceSource,
        authenticate: Authenticator,
        *,
        cert_chain_pem: bytes,
        key_pem: bytes,
        host: str = "0.0.0.0",
        port: int = 15012,
        debounce: float = 0.1,
        grpc_options: Sequence[tuple[str, Any]] = (),
        authorizations: ResourceSource | None = None,
        keepalive: KeepaliveSettings = DEFAULT_KEEPALIVE,
        sources: Mapping[str, ResourceSource] | None = None,
        readers: Mapping[str, ReadCheck] | None = None,
        debug_access: DebugAccess | None = None,
        control_plane: str = "",
        stale_after: float = DEFAULT_STALE_AFTER,
        observer: XdsObserver = NO_OBSERVER,
        admission: Admission | None = None,
        openings: int = MAX_OPENINGS,
    ) -> None:
        """``grpc_options`` are the gRPC server's channel options; they win over the ``keepalive`` options
        (:mod:`ambit.xds.keepalive`), the request size limit (:data:`MAX_REQUEST_BYTES`) and
        :data:`RECEIVE_WINDOW_OPTIONS` where both name one; ``openings`` bounds the opening requests read at once
        (:data:`MAX_OPENINGS`)."""
        self.service = XdsService(
            source,
            authenticate,
            debounce=debounce,
            authorizations=authorizations,
            sources=sources,
            readers=readers,
            debug_access=debug_access,
            control_plane=control_plane,
            stale_after=stale_after,
            observer=observer,
            admission=admission,
            openings=openings,
        )
        self._certificate: Any = grpc.ssl_server_certificate_configuration([(key_pem, cert_chain_pem)])
        self._pending_certificate: Any = None
        self._credentials = grpc.dynamic_ssl_server_credentials(self._certificate, self._next_certificate)
        self._address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        options: dict[str, Any] = dict(keepalive.server_options())
        options["grpc.max_receive_message_length"] = MAX_REQUEST_BYTES
        options.update(RECEIVE_WINDOW_OPTIONS)
        options.update(grpc_options)
        self.grpc_server: Any = grpc.aio.server(options=list(options.items()))
        self.service.add_to(self.grpc_server)
        self.port = 0
        """The bound port, after :meth:`start` (useful with ``port=0``)."""

    def set_certificate(self, cert_chain_pem: bytes, key_pem: bytes) -> None:
        """Serve this certificate from the next TLS handshake on (a CA rotation); open connections keep theirs."""
        self._pending_certificate = grpc.ssl_server_certificate_configuration([(key_pem, cert_chain_pem)])

    def _next_certificate(self) -> Any:
        # gRPC asks before every handshake, possibly from its own thread: hand over a pending certificate once.
        pending, self._pending_certificate = self._pending_certificate, None
        return pending

    async def start(self) -> None:
        try:
            self.port = self.grpc_server.add_secure_port(self._address, self._credentials)
        except RuntimeError as exc:  # grpc's only report of a failed bind
            raise XdsError(f"xds server cannot listen on {self._address}: {exc}") from None
        await self.grpc_server.start()
        log.info("xds server listening on %s (port %d)", self._address, self.port)

    async def aclose(self, grace: float = 0.5) -> None:
        await self.grpc_server.stop(grace)

    async def __aenter__(self) -> XdsServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
