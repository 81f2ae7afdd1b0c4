"""The cluster DNS server: informers keep :class:`~ambit.lab.dns.records.ClusterRecords` current, and UDP and TCP
listeners answer each query with :func:`~ambit.lab.dns.answer.respond` (a thin asyncio shell around the core).

Theory of operation:

1. Records. Informers watch Services and EndpointSlices in every namespace and the ConfigMap
   ``kube-system/lab-dns-zone``; after each change the whole :class:`ClusterRecords` is rebuilt (the lab holds
   tens of Services, so a rebuild costs less than keeping an incremental index right) and swapped in at once, so
   a query always sees one consistent snapshot. The listeners open only once every informer has listed: a
   server that answers before it knows the Services would tell clients that names do not exist.
2. UDP. Each datagram is answered in the protocol callback, synchronously: there is no queue of our own, so a
   flood is bounded by the socket's receive buffer and the kernel drops the excess. What the core drops (not a
   query) gets no reply, so the server cannot be made to talk to another DNS server in a loop.
3. TCP. Messages are length-prefixed (RFC 1035 4.2.2), several per connection, answered in order. At most
   :attr:`ClusterDnsSettings.max_connections` connections are served at once (a new one past the bound is closed
   at once); a query longer than :attr:`ClusterDnsSettings.max_query_bytes`, one the core drops, or
   :attr:`ClusterDnsSettings.idle_timeout` seconds without a complete query close the connection.
4. One client's failure never takes a listener down: it is logged at debug level and counted by reason.
5. Cache. The core's answer depends only on the records and the query's bytes after its id, so responses are kept
   in a bounded least-recently-used map keyed by (transport, those bytes), for queries up to 512 bytes, and
   emptied whenever the records are replaced; a hit is the cached response with the query's id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from ambit.k8s import KubeClient, kinds
from ambit.k8s.informer import Informer
from ambit.lab.dns.answer import Transport, respond
from ambit.lab.dns.records import CLUSTER_DOMAIN, ZONE_CONFIGMAP, ClusterRecords, build_records

log = logging.getLogger("ambit.lab.dns")
CACHED_QUERY_BYTES = 512
"""Longer queries are answered but not cached, so the cache's memory stays bounded (rule 5)."""


@dataclass(frozen=True, slots=True)
class ClusterDnsSettings:
    """Where and how the cluster DNS server listens."""

    host: str = "0.0.0.0"
    """The address both listeners bind."""
    port: int = 53
    """UDP and TCP port."""
    domain: str = CLUSTER_DOMAIN
    """The cluster domain the Services' names are under."""
    max_connections: int = 128
    """TCP connections served at once (rule 3)."""
    max_query_bytes: int = 4096
    """The longest query accepted over TCP; a longer length prefix closes the connection."""
    idle_timeout: float = 10.0
    """Seconds a TCP connection may wait for its next complete query."""
    cache_entries: int = 4096
    """Responses kept (rule 5); 0 turns the cache off."""


class RecordsWatcher:
    """Rule 1: the current records, rebuilt from the informers' caches after each change."""

    def __init__(self, client: KubeClient, domain: str = CLUSTER_DOMAIN) -> None:
        self.domain = domain
        self._records = ClusterRecords(domain=domain)
        namespace, name = ZONE_CONFIGMAP
        self._informers = [
            Informer(client, kinds.SERVICES),
            Informer(client, kinds.ENDPOINT_SLICES),
            Informer(client, kinds.CONFIG_MAPS, namespace=namespace, field_selector=f"metadata.name={name}"),
        ]
        for informer in self._informers:
            informer.add_handler(on_add=self._changed, on_update=self._changed_pair, on_delete=self._changed)
        self._reported: tuple[str, ...] = ()

    def find_records(self) -> ClusterRecords:
        return self._records

    async def start(self) -> None:
        for informer in self._informers:
            informer.start()
        for informer in self._informers:
            await informer.wait_synced()
        self._rebuild()

    async def aclose(self) -> None:
        for informer in self._informers:
            await informer.aclose()

    def _changed(self, _obj: Any) -> None:
        self._rebuild()

    def _changed_pair(self, _old: Any, _new: Any) -> None:
        self._rebuild()

    def _rebuild(self) -> None:
        services, slices, zones = (informer.items() for informer in self._informers)
        zone = zones[0].get("data") if zones else None
        records = build_records(services, slices, zone if isinstance(zone, dict) else None, domain=self.domain)
        if records.zone_errors != self._reported:
            for error in records.zone_errors:
                log.warning("%s", error)
            self._reported = records.zone_errors
        self._records = records


class _UdpProtocol(asyncio.DatagramProtocol):
    def __init__(self, server: ClusterDnsServer) -> None:
        self.server = server
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        reply = self.server.answer(data, Transport.UDP)
        if reply is not None and self.transport is not None:
            self.transport.sendto(reply, addr)

    def error_received(self, exc: Exception) -> None:
        self.server.stats["udp_error"] += 1
        log.debug("udp: %s", exc)


class ClusterDnsServer:
    """Rules 2 to 4: the UDP and TCP listeners over a records source."""

    def __init__(self, find_records: Callable[[], ClusterRecords], settings: ClusterDnsSettings) -> None:
        self.find_records = find_records
        self.settings = settings
        self.stats: Counter[str] = Counter()
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._cache: OrderedDict[tuple[Transport, bytes], bytes | None] = OrderedDict()
        self._cached_for: ClusterRecords | None = None

    def answer(self, wire: bytes, transport: Transport) -> bytes | None:
        records = self.find_records()
        if records is not self._cached_for:
            self._cache.clear()
            self._cached_for = records
        key = (transport, wire[2:])
        if key in self._cache:
            self._cache.move_to_end(key)
            cached = self._cache[key]
            reply = None if cached is None else wire[:2] + cached[2:]
        else:
            reply = respond(records, wire, transport)
            if self.settings.cache_entries > 0 and len(wire) <= CACHED_QUERY_BYTES:
                self._cache[key] = reply
                if len(self._cache) > self.settings.cache_entries:
                    self._cache.popitem(last=False)
        self.stats["answered" if reply is not None else "dropped"] += 1
        return reply

    @property
    def udp_port(self) -> int:
        assert self._udp is not None
        return int(self._udp.get_extra_info("sockname")[1])

    @property
    def tcp_port(self) -> int:
        assert self._tcp is not None
        return int(self._tcp.sockets[0].getsockname()[1])

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in self.settings.host else socket.AF_INET
        self._udp, _ = await loop.create_datagram_endpoint(
            lambda: _UdpProtocol(self), local_addr=(self.settings.host, self.settings.port), family=family
        )
        # An ephemeral UDP port (tests) is shared with TCP, as DNS clients expect one port for both.
        self._tcp = await asyncio.start_server(self._serve, self.settings.host, self.udp_port, reuse_address=True)

    async def aclose(self) -> None:
        if self._tcp is not None:
            self._tcp.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._tcp is not None:
            await self._tcp.wait_closed()
        if self._udp is not None:
            self._udp.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= self.settings.max_connections:
            self.stats["tcp_refused"] += 1
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return
        self._connections.add(task)
        try:
            await self._queries(reader, writer)
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            self.stats[f"tcp_{type(exc).__name__}"] += 1
            log.debug("tcp %s: %s", writer.get_extra_info("peername"), exc)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _queries(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                async with asyncio.timeout(self.settings.idle_timeout):
                    prefix = await reader.readexactly(2)
                    length = int.from_bytes(prefix, "big")
                    if length > self.settings.max_query_bytes:
                        self.stats["tcp_too_long"] += 1
                        return
                    wire = await reader.readexactly(length)
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise
                return  # a clean close between queries
            reply = self.answer(wire, Transport.TCP)
            if reply is None:
                return
            writer.write(len(reply).to_bytes(2, "big") + reply)
            await writer.drain()


async def run_cluster_dns(client: KubeClient, settings: ClusterDnsSettings, stop: asyncio.Event) -> None:
    """Watch the API, then serve until ``stop`` is set."""
    watcher = RecordsWatcher(client, settings.domain)
    try:
        await watcher.start()
        server = ClusterDnsServer(watcher.find_records, settings)
        await server.start()
        log.info("cluster DNS for %s listening on %s:%d (udp, tcp)", settings.domain, settings.host, settings.port)
        try:
            await stop.wait()
        finally:
            await server.aclose()
    finally:
        await watcher.aclose()
