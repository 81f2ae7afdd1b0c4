"""The outbound HBONE connection pool (spec §6.2): many CONNECT tunnels share few mutual-TLS HTTP/2 connections.

Theory of operation: connections are grouped by :class:`PoolKey` {source identity, expected destination
identities, source IP, destination address}; a tunnel may only ride a connection whose key matches exactly, so a
stream never travels under another workload's certificate or to a peer verified against other names.
:meth:`ConnectionPool.open_tunnel` picks a live connection of the key with a free stream slot; failing that it
joins an in-flight dial of that key that still has room for it; failing that it starts a new dial. So a burst of
openers for a cold key makes one connection, and only the 101st concurrent opener makes a second one.

The bookkeeping is synchronous (STYLE.md rule 6): choosing a connection, counting the openers waiting on a dial
and dropping dead or idle connections happen without awaiting, so no other task can see a half-updated pool. The
I/O (the dial, the CONNECT exchange, closing) is done by the caller's task or handed to the connection.

Invariants:

- A :class:`PooledConnection` claims its stream slot before its ``open_tunnel`` first suspends, so between the
  pool choosing a connection and the stream counting against it no other opener can take the same slot.
- At most ``max_streams`` openers wait on one dial; the dial's result is shared by all of them (failure too: a
  dead destination fails a burst once, not a hundred times).
- A connection that turns out dead while opening (:class:`ConnectionLostError`) is dropped and the open retried
  once on a connection chosen afresh; so is a dial whose new connection is going away before its first tunnel
  (its server accepted it as it began to drain: the dial fails with :class:`ConnectionLostError`, or returns a
  connection that is not ``available``). Once, not until one works: a server that only ever goes away fails the
  open after the second dial instead of being dialed in a loop. Likewise an acquire whose awaited dials twice gave a
  connection that was closed by the time it came for it (:data:`_DIALS_GONE`) fails rather than dialing on. Any
  other failure (a refused tunnel, a failed dial) goes to the caller.
- A connection with no streams for ``idle_timeout`` is closed by :meth:`ConnectionPool.reap_idle`, which the
  owner calls periodically; dead connections are forgotten there too. Idleness is the connection's own
  ``idle_since``, so the pool's ``clock`` must be the clock the connections were made with.
- A closed connection is never handed out: the one chosen is asked ``available`` (which is false once it is
  closed). The pool does not ask every connection of a key whether it is closed on each acquire; it forgets one
  when the connection says it is gone (``when_closed``), when an acquire meets it with a free slot but closed, or
  at the next :meth:`ConnectionPool.reap_idle`, whichever comes first.

Zero idle timeout (ztunnel's ``POOL_UNUSED_RELEASE_TIMEOUT=0``): a connection whose last stream ended is closed at
once, never reused, so with ``max_streams=1`` every tunnel makes its own mutual-TLS handshake (what the benchmark's
cold-handshake scenario measures). Each dialed connection tells the pool when its last stream ended
(``when_idle``), and the pool then closes it unless a new stream took it meanwhile. Two back-stops keep the rule
should that call not come: :meth:`ConnectionPool._acquire` never hands out a connection that has carried a stream
and is idle now (it closes it instead), and :meth:`ConnectionPool.reap_idle` closes every idle connection. A
freshly dialed connection is idle too (no stream yet) but has carried none, so its waiters can still take it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ambit.hbone.headers import hostport
from ambit.hbone.settings import MAX_CONCURRENT_STREAMS
from ambit.model.identity import SpiffeId
from ambit.proxy.errors import ProxyError
from ambit.proxy.hbone_session import ConnectionLostError
from ambit.proxy.hbone_stream import HboneStream


class PoolClosedError(ProxyError):
    """The pool was closed; no more tunnels can be opened through it."""


class PoolSettingsError(ProxyError):
    """A pool limit out of range (local misuse: ``max_streams`` below 1 or a negative ``idle_timeout``)."""


class PooledConnection(Protocol):
    """What the pool needs of a connection (:class:`~ambit.proxy.hbone_client.HboneClient` is one)."""

    @property
    def available(self) -> bool: ...  # alive and can take another stream now
    @property
    def closed(self) -> bool: ...  # dead or closing: never again usable
    @property
    def active_streams(self) -> int: ...
    @property
    def idle_since(self) -> float | None: ...  # clock time the last stream ended; None while streams are open
    async def open_tunnel(self, authority: str, headers: Sequence[tuple[str, str]]) -> HboneStream: ...
    def close(self) -> None: ...  # start a graceful close (GOAWAY) without waiting
    async def aclose(self) -> None: ...
    def when_idle(self, callback: Callable[[], None]) -> None: ...  # call each time its last stream ended
    def when_closed(self, callback: Callable[[], None]) -> None: ...  # call once, soon after it is gone


@dataclass(frozen=True, slots=True)
class PoolKey:
    """Which tunnels may share a connection (ztunnel's ``WorkloadKey``)."""

    source: SpiffeId
    destination: frozenset[SpiffeId]
    source_ip: str
    destination_addr: tuple[str, int]

    def __str__(self) -> str:
        names = ",".join(sorted(str(identity) for identity in self.destination))
        return f"{self.source}@{self.source_ip} -> [{names}]@{hostport(*self.destination_addr)}"


@dataclass(slots=True)
class _Dial:
    """A connection being made for a key, and how many openers are waiting for it."""

    future: asyncio.Future[PooledConnection]
    waiters: int = 0


@dataclass(slots=True)
class _Bucket:
    connections: list[PooledConnection] = field(default_factory=list)
    dials: list[_Dial] = field(default_factory=list)
    used: set[PooledConnection] = field(default_factory=set)
    """Connections of ``connections`` the pool has handed out for a stream (zero idle timeout only)."""
    dial_name: str = ""
    """The name of this key's dial tasks, made at its first dial (a key's text is several Python calls)."""

    def keep(self, connections: list[PooledConnection]) -> None:
        self.connections = connections
        if self.used:
            self.used.intersection_update(connections)


_DIALS_GONE = 2
"""An acquire gives up once this many of the connections it waited for were closed before it could use them: a peer
that takes each connection and drops it at once is not dialed in a loop."""


class ConnectionPool:
    """Outbound HBONE connections keyed by :class:`PoolKey`; see the module docstring."""

    def __init__(
        self,
        *,
        idle_timeout: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        max_streams: int = MAX_CONCURRENT_STREAMS,
    ) -> None:
        if max_streams < 1:
            raise PoolSettingsError(f"max_streams must be at least 1, not {max_streams}")
        if not idle_timeout >= 0:  # also refuses NaN
            raise PoolSettingsError(f"idle_timeout must be 0 seconds or more, not {idle_timeout}")
        self._idle_timeout = idle_timeout
        self._clock = clock
        self._max_streams = max_streams
        self._buckets: dict[PoolKey, _Bucket] = {}
        self._dial_tasks: set[asyncio.Task[PooledConnection]] = set()
        self._closed = False

    async def open_tunnel(
        self,
        key: PoolKey,
        authority: str,
        headers: Sequence[tuple[str, str]],
        dial: Callable[[], Awaitable[PooledConnection]],
    ) -> HboneStream:
        """A CONNECT tunnel to ``authority`` over a connection of ``key``; ``dial`` makes a new one if needed."""
        retried = False
        while True:
            try:
                connection = await self._acquire(key, dial)
            except ConnectionLostError:  # the dialed connection was going away before its first tunnel
                if retried:
                    raise
                retried = True
                continue
            try:
                return await connection.open_tunnel(authority, headers)
            except ConnectionLostError:
                self._forget(key, connection)
                if retried:
                    raise
                retried = True

    @property
    def max_streams(self) -> int:
        return self._max_streams

    @property
    def idle_timeout(self) -> float:
        return self._idle_timeout

    def reap_idle(self) -> int:
        """Close connections idle past the timeout and forget dead ones; return how many were closed."""
        now = self._clock()
        reaped = 0
        for key, bucket in list(self._buckets.items()):
            keep: list[PooledConnection] = []
            for connection in bucket.connections:
                idle_since = connection.idle_since
                if connection.closed:
                    continue
                if idle_since is not None and now - idle_since >= self._idle_timeout:
                    connection.close()
                    reaped += 1
                    continue
                keep.append(connection)
            bucket.keep(keep)
            if not keep and not bucket.dials:
                del self._buckets[key]
        return reaped

    def stats(self) -> dict[str, Any]:
        """Per key: live connections, their open streams and dials in flight (for config_dump)."""
        keys = []
        for key, bucket in self._buckets.items():
            live = [c for c in bucket.connections if not c.closed]
            keys.append(
                {
                    "key": str(key),
                    "source": str(key.source),
                    "destination": sorted(str(identity) for identity in key.destination),
                    "source_ip": key.source_ip,
                    "destination_addr": hostport(*key.destination_addr),
                    "connections": len(live),
                    "streams": sum(c.active_streams for c in live),
                    "dialing": len(bucket.dials),
                }
            )
        return {
            "connections": sum(k["connections"] for k in keys),
            "streams": sum(k["streams"] for k in keys),
            "keys": keys,
        }

    async def aclose(self) -> None:
        """Close every connection (their open tunnels are reset) and refuse further opens."""
        self._closed = True
        connections = [c for bucket in self._buckets.values() for c in bucket.connections]
        self._buckets.clear()
        for task in list(self._dial_tasks):
            task.cancel()
        for task in list(self._dial_tasks):
            with contextlib.suppress(BaseException):
                await task
        await asyncio.gather(*(c.aclose() for c in connections), return_exceptions=True)

    async def _acquire(self, key: PoolKey, dial: Callable[[], Awaitable[PooledConnection]]) -> PooledConnection:
        """A connection of ``key`` with a free slot: reused, shared from a dial in flight, or freshly dialed."""
        lost_dials = 0  # dials awaited whose connection was closed by the time we came back for it
        while True:
            if self._closed:
                raise PoolClosedError("the connection pool is closed")
            bucket = self._buckets.get(key)
            if bucket is None:  # not ``setdefault(key, _Bucket())``: that makes a bucket per call, kept or not
                bucket = self._buckets[key] = _Bucket()
            max_streams = self._max_streams
            used = bucket.used if self._idle_timeout == 0 else None
            chosen: PooledConnection | None = None
            gone: list[PooledConnection] | None = None
            for connection in bucket.connections:
                # The stream count first: it is the cheaper question, and under a cold load (one stream per
                # connection) it rules out every busy connection without asking whether it is alive.
                if connection.active_streams >= max_streams:
                    continue
                if not connection.available:
                    if connection.closed:  # it has not said so yet (or it did, and that callback waits to run)
                        (gone := gone or []).append(connection)
                    continue
                if used is not None and connection in used and connection.idle_since is not None:
                    # Zero idle timeout: one that carried a stream and is idle now is closed, never reused (the
                    # back-stop of ``when_idle``'s callback, see the module docstring).
                    connection.close()
                    (gone := gone or []).append(connection)
                    continue
                chosen = connection
                break
            if gone is not None:  # the bucket stays: it is returned from, or dialed for, below
                for connection in gone:
                    bucket.connections.remove(connection)
                    bucket.used.discard(connection)
            if chosen is not None:
                if used is not None:
                    used.add(chosen)
                return chosen
            pending = next((d for d in bucket.dials if d.waiters < self._max_streams), None)
            if pending is None:
                pending = self._start_dial(key, bucket, dial)
            pending.waiters += 1
            # Every waiter, not only the dialer, sees the dial's failure; shield so one cancelled opener
            # does not cancel the dial the others share.
            dialed = await asyncio.shield(pending.future)
            if dialed.closed:  # it died before its first tunnel (a server that refused us, or went away)
                lost_dials += 1
                if lost_dials >= _DIALS_GONE:
                    raise ConnectionLostError(
                        f"{key}: {lost_dials} new connections were gone before their first tunnel"
                    )
            # Loop: the new connection is now in the bucket, and we compete for its slots like anyone else.

    def _start_dial(self, key: PoolKey, bucket: _Bucket, dial: Callable[[], Awaitable[PooledConnection]]) -> _Dial:
        loop = asyncio.get_running_loop()
        pending = _Dial(loop.create_future())
        bucket.dials.append(pending)

        async def run() -> PooledConnection:
            return await dial()

        if not bucket.dial_name:
            bucket.dial_name = f"hbone dial {key}"
        task = loop.create_task(run(), name=bucket.dial_name)
        self._dial_tasks.add(task)

        def finished(task: asyncio.Task[PooledConnection]) -> None:
            self._dial_tasks.discard(task)
            if pending in bucket.dials:
                bucket.dials.remove(pending)
            if task.cancelled():
                pending.future.set_exception(PoolClosedError("the dial was cancelled: the pool is closing"))
            elif (error := task.exception()) is not None:
                pending.future.set_exception(error)
            else:
                connection = task.result()
                if self._closed:
                    connection.close()
                    pending.future.set_exception(PoolClosedError("the connection pool is closed"))
                elif not connection.available:  # going away already (its GOAWAY came with its SETTINGS)
                    connection.close()
                    pending.future.set_exception(ConnectionLostError(f"{key}: the new connection is going away"))
                else:
                    self._buckets.setdefault(key, bucket).connections.append(connection)
                    connection.when_closed(functools.partial(self._remove, key, connection))
                    if self._idle_timeout == 0:
                        connection.when_idle(functools.partial(self._close_if_idle, key, connection))
                    pending.future.set_result(connection)
            # Waiters retrieve it; mark it retrieved so a dial nobody waits for anymore does not warn.
            if not pending.future.cancelled():
                pending.future.exception()

        task.add_done_callback(finished)
        return pending

    def _forget(self, key: PoolKey, connection: PooledConnection) -> None:
        self._remove(key, connection)
        connection.close()

    def _remove(self, key: PoolKey, connection: PooledConnection) -> None:
        """Forget ``connection`` (a key with neither connections nor dials left goes too); it is not closed here."""
        bucket = self._buckets.get(key)
        if bucket is not None and connection in bucket.connections:
            bucket.connections.remove(connection)
            bucket.used.discard(connection)
            if not bucket.connections and not bucket.dials:
                del self._buckets[key]

    # Zero idle timeout (see the module docstring).

    def _close_if_idle(self, key: PoolKey, connection: PooledConnection) -> None:
        """Close ``connection`` if it still has no stream (one may have started since it said it was idle)."""
        if not self._closed and not connection.closed and connection.idle_since is not None:
            self._forget(key, connection)
