"""The waypoint's upstream side: byte streams to endpoints, and HTTP/1.1 connections kept for reuse.

Theory of operation: :meth:`Upstreams.open_stream` reaches one :class:`~ambit.waypoint.destinations.Endpoint`:

- an endpoint that speaks HBONE gets a CONNECT tunnel on a pooled mutual-TLS connection to ``<pod IP>:15008``
  (:class:`~ambit.proxy.pool.ConnectionPool`, :class:`~ambit.proxy.hbone_client.HboneClient`) with the waypoint's
  own certificate, the server verified against the endpoint workload's identity (and its Service's SANs), and
  ``:authority = <pod IP>:<target port>`` (spec §6.1, §6.3 step 7);
- an endpoint without HBONE gets plain TCP to ``<pod IP>:<target port>``; so does every endpoint while this
  proxy's own pod is captured by a node proxy (``captured``: an ingress gateway labelled
  ``istio.io/dataplane-mode: ambient``, the "sandwich"), whose node proxy then carries it over HBONE with the
  pod's identity (what Istio's gateway does with ``ISTIO_META_DISABLE_HBONE_SEND``; a tunnel of its own would be
  tunnelled again, to a port the peer's node proxy refuses); an endpoint reached through a waypoint
  (``via``) is then the Service's VIP and port, which that node proxy steers to the waypoint;
- a hostname endpoint (a ``resolution: DNS`` ServiceEntry's) is first resolved on demand by the
  :class:`~ambit.proxy.hostnames.HostnameResolver` in the IP version of the endpoint's unresolved ``ip`` (IPv4
  unless the client dialled IPv6: :func:`~ambit.waypoint.destinations.in_dialled_family`), the answer judged by
  :func:`~ambit.waypoint.destinations.judge_resolved`, then gets plain TCP to ``<resolved address>:<target port>``;
  with :attr:`~ambit.waypoint.destinations.Transport.race_first_connect`, every address of both versions that
  passes the judge is dialled at once and the first connection kept (:mod:`ambit.waypoint.racing`).
  A name that cannot be resolved is an :class:`UpstreamDnsError` (Envoy's ``DF``), one that resolves to what may
  not be dialled an :class:`UpstreamConnectError`;
- then, for an endpoint whose :class:`~ambit.waypoint.destinations.Transport` asks (a DestinationRule), a PROXY
  header and originated TLS on that stream (:mod:`ambit.waypoint.origination`), within the same connect timeout;
  a failed handshake is an :class:`UpstreamConnectError` too.

HTTP/1.1 connections (:class:`UpstreamHttp`: a stream and its :class:`~ambit.waypoint.http1.ClientSide`) are kept
after a clean exchange, per endpoint, up to ``max_idle`` each, and handed out again (:meth:`Upstreams.take_idle`),
so keep-alive works upstream as well. The bookkeeping is synchronous; a kept connection whose stream ended while
idle is dropped when next looked at. A reused connection may still turn out dead on first use (the endpoint closed
it meanwhile, the usual keep-alive race): the shell (:mod:`ambit.waypoint.forwarding`) then sends the request
again on a fresh connection, once, when it can still replay the body.

What a forwarded request needs of its upstream end, whatever the HTTP version, is an :class:`UpstreamExchange`
(one request and its response on a connection or a stream); a :data:`Connector` gives one for an endpoint:
:mod:`ambit.waypoint.http1_upstream` on kept HTTP/1.1 connections, :mod:`ambit.waypoint.http2_upstream` on
multiplexed HTTP/2 connections.

Errors: :class:`UpstreamConnectError` (the endpoint could not be reached: Envoy's ``UF`` flag), and its subclass
:class:`UpstreamDnsError` when a hostname endpoint's name did not resolve (Envoy's ``DF``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import ssl
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from ambit.errors import AmbitError
from ambit.hbone.headers import connect_headers, hostport
from ambit.identity.manager import CertificateManager
from ambit.model.destination_policy import ClientTls
from ambit.model.identity import SpiffeId
from ambit.model.workload import IPAddress, TunnelProtocol
from ambit.proxy.hbone_client import HboneClient
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.hostnames import HostnameLookupError, HostnameResolver
from ambit.proxy.pool import ConnectionPool, PoolKey
from ambit.proxy.sockets import SocketFactory, connect
from ambit.proxy.streams import ByteStream, SocketStream
from ambit.tls.socket_transport import TlsTransportKind
from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.destinations import (
    PLAIN,
    Endpoint,
    Refusal,
    Transport,
    WaypointSelf,
    judge_resolved,
)
from ambit.waypoint.errors import WaypointError
from ambit.waypoint.http1 import ClientSide, Event
from ambit.waypoint.idle import OperationBound
from ambit.waypoint.origination import TlsOriginationError, TlsStream, client_context, proxy_header
from ambit.waypoint.racing import race_connect

MAX_TLS_CONTEXTS = 256
"""SSL contexts kept for the DestinationRules' TLS settings (building one costs milliseconds)."""


class UpstreamConnectError(WaypointError):
    """An endpoint could not be reached (TCP, TLS, or the tunnel was refused)."""


class UpstreamDnsError(UpstreamConnectError):
    """A hostname endpoint's name did not resolve (Envoy's ``DF``, DNS resolution failed): nothing was dialled."""


EndpointKey = tuple[str, str, int, Transport]
"""(workload uid, IP, target port, transport): a connection made for one transport never serves another."""


class UpstreamExchange(Protocol):
    """The upstream end of one try of a forwarded request."""

    @property
    def reused(self) -> bool:
        """It runs on a connection that served earlier requests (which may have died while idle)."""
        ...

    @property
    def duplex(self) -> bool:
        """The response may come while the request body is still being sent (HTTP/2)."""
        ...

    async def send_request(self, head: RequestHead, *, upgrade: bool = False, body: bool = False) -> None:
        """Send the request head; ``body``: a body follows (HTTP/1.1 frames it chunked when ``head`` does not)."""
        ...

    async def send_body(self, data: bytes) -> None: ...

    async def end_request(self, trailers: Iterable[tuple[str, str]] = ()) -> None: ...

    async def next_event(self) -> Event:
        """The next response event: ``ResponseStarted`` (or ``InterimResponse``), ``BodyData``, ``MessageEnded``;
        ``Signal.CLOSED`` or an error when the endpoint went away."""
        ...

    def next_event_nowait(self) -> Event | None:
        """:meth:`next_event` when the event is already here (parsed from bytes read earlier), without waiting;
        None when it would wait. Raises what :meth:`next_event` would raise for that event."""
        ...

    def abort(self) -> None:
        """Give up on the exchange (its connection, or its stream, is reset)."""
        ...

    def finish(self, now: float) -> None:
        """The exchange ended cleanly: keep what can serve another request."""
        ...


Connector = Callable[[Endpoint, bool], Awaitable[UpstreamExchange]]
"""``connector(endpoint, fresh)``: the upstream end of a try to ``endpoint``; with ``fresh``, on a new connection
(never one kept from earlier requests)."""


@dataclass(slots=True, eq=False)
class UpstreamHttp:
    """One upstream HTTP/1.1 connection: its stream and its h11 client side."""

    key: EndpointKey
    stream: ByteStream
    http: ClientSide
    reused: bool = False
    requests: int = field(default=0)
    idle_since: float = 0.0
    reads: OperationBound = field(default_factory=OperationBound)
    """Bounds each read in time (:mod:`ambit.waypoint.idle`: one timer for the connection's many reads)."""
    writes: OperationBound = field(default_factory=OperationBound)
    _hbone: HboneStream | None = field(init=False, default=None)
    """The HBONE stream under ``stream`` (under its TLS when it has one), or None: what ``alive`` asks."""

    def __post_init__(self) -> None:
        inner = self.stream.inner if isinstance(self.stream, TlsStream) else self.stream
        self._hbone = inner if isinstance(inner, HboneStream) else None

    def discard(self) -> None:
        """Abort the connection; no timer of its reads or writes outlives it."""
        self.stream.abort()
        self.reads.close()
        self.writes.close()

    @property
    def alive(self) -> bool:
        hbone = self._hbone
        return hbone is None or not hbone.done


class Upstreams:
    """Opens streams to endpoints and keeps idle HTTP/1.1 connections; see the module docstring."""

    def __init__(
        self,
        *,
        pool: ConnectionPool,
        certs: CertificateManager,
        identity: SpiffeId,
        source_ip: str,
        trust_domain: str,
        sockets: SocketFactory,
        hbone_port: int = 15008,
        connect_timeout: float = 10.0,
        max_idle: int = 16,
        max_head_bytes: int = 64 * 1024,
        hostnames: HostnameResolver | None = None,
        me: WaypointSelf | None = None,
        captured: Callable[[], bool] | None = None,
        tls_transport: TlsTransportKind = "socket",
    ) -> None:
        self.pool = pool
        self.captured = captured
        """Whether this proxy's own pod is captured by a node proxy now (see the module docstring); None: never."""
        self.hostnames = hostnames
        """Resolves hostname endpoints; None: they cannot be reached."""
        self._me = me or WaypointSelf("", "")
        self._certs = certs
        self._identity = identity
        self._source_ip = source_ip
        self._trust_domain = trust_domain
        self._sockets = sockets
        self._hbone_port = hbone_port
        self._connect_timeout = connect_timeout
        self._max_idle = max_idle
        self._max_head_bytes = max_head_bytes
        self._tls_transport: TlsTransportKind = tls_transport
        self._idle: dict[EndpointKey, collections.deque[UpstreamHttp]] = {}
        self._tls_contexts: dict[tuple[ClientTls | None, bool], ssl.SSLContext] = {}

    async def open_stream(self, endpoint: Endpoint, forwarded_for: str) -> ByteStream:
        """A byte stream to ``endpoint``; :class:`UpstreamConnectError` when it cannot be reached."""
        racing: tuple[IPAddress, ...] = ()
        if endpoint.resolve_hostname and endpoint.transport.race_first_connect:
            racing = await self.fetch_all_resolved(endpoint)
            endpoint = dataclasses.replace(endpoint, ip=racing[0], resolve_hostname="")
        elif endpoint.resolve_hostname:
            endpoint = await self.fetch_resolved(endpoint)
        address = (str(endpoint.ip), endpoint.port)
        stream: ByteStream | None = None
        try:
            async with asyncio.timeout(self._connect_timeout):
                # A waypoint hop is HBONE whatever the waypoint pod's own enrolment (its pods are not captured).
                plain = endpoint.via is None and endpoint.workload.tunnel_protocol is not TunnelProtocol.HBONE
                plain = plain or (self.captured is not None and self.captured())
                if plain and len(racing) > 1:
                    sock, ip = await race_connect(self._sockets, racing, endpoint.port, timeout=self._connect_timeout)
                    endpoint = dataclasses.replace(endpoint, ip=ip)
                    stream = SocketStream(sock)
                elif plain:
                    stream = SocketStream(await connect(self._sockets, address, timeout=self._connect_timeout))
                else:
                    stream = await self._open_tunnel(endpoint, forwarded_for)
                if endpoint.transport != PLAIN:
                    return await self._originate(endpoint, stream, forwarded_for)
                return stream
        except TimeoutError:
            if stream is not None:
                stream.abort()
            raise UpstreamConnectError(f"{hostport(*address)}: connect timed out") from None
        except (AmbitError, OSError, TlsOriginationError) as exc:
            if stream is not None:
                stream.abort()
            raise UpstreamConnectError(f"{hostport(*address)}: {exc}") from None

    async def _originate(self, endpoint: Endpoint, stream: ByteStream, forwarded_for: str) -> ByteStream:
        """A DestinationRule's PROXY header, then its TLS (:mod:`ambit.waypoint.origination`)."""
        transport = endpoint.transport
        if transport.proxy_protocol is not None:
            await stream.write(
                proxy_header(transport.proxy_protocol, forwarded_for, hostport(endpoint.ip, endpoint.port))
            )
        if transport.tls is None:
            return stream
        tls = TlsStream(stream, self._client_context(transport), transport.sni)
        await tls.handshake(transport.tls.subject_alt_names)
        return tls

    def _client_context(self, transport: Transport) -> ssl.SSLContext:
        key = (transport.tls, transport.h2)
        context = self._tls_contexts.get(key)
        if context is None:
            assert transport.tls is not None
            context = client_context(transport.tls, h2=transport.h2)
            if len(self._tls_contexts) >= MAX_TLS_CONTEXTS:
                self._tls_contexts.pop(next(iter(self._tls_contexts)))
            self._tls_contexts[key] = context
        return context

    async def fetch_resolved(self, endpoint: Endpoint) -> Endpoint:
        """``endpoint`` at an address of its hostname that may be dialled, of the IP version of its unresolved ``ip``
        when the name has one; :class:`UpstreamConnectError` else."""
        name = endpoint.resolve_hostname
        if self.hostnames is None:
            raise UpstreamDnsError(f"{name}: no resolver for hostname endpoints")
        try:
            ip = await self.hostnames.fetch_address(name, endpoint.ip)
        except HostnameLookupError as exc:
            raise UpstreamDnsError(str(exc)) from None
        judged = judge_resolved(endpoint, ip, self._me)
        if isinstance(judged, Refusal):
            raise UpstreamConnectError(judged.reason)
        return judged

    async def fetch_all_resolved(self, endpoint: Endpoint) -> tuple[IPAddress, ...]:
        """Every address of ``endpoint``'s hostname that may be dialled (a racing endpoint), at least one;
        :class:`UpstreamConnectError` else."""
        name = endpoint.resolve_hostname
        if self.hostnames is None:
            raise UpstreamDnsError(f"{name}: no resolver for hostname endpoints")
        try:
            found = await self.hostnames.fetch_addresses(name)
        except HostnameLookupError as exc:
            raise UpstreamDnsError(str(exc)) from None
        usable: list[IPAddress] = []
        refusals: list[str] = []
        for ip in found:
            judged = judge_resolved(endpoint, ip, self._me)
            if isinstance(judged, Refusal):
                refusals.append(judged.reason)
            else:
                usable.append(ip)
        if not usable:
            raise UpstreamConnectError("; ".join(refusals))
        return tuple(usable)

    async def _open_tunnel(self, endpoint: Endpoint, forwarded_for: str) -> HboneStream:
        cert = await self._certs.fetch(self._identity)
        expected = endpoint.expected_identities
        hbone_addr = (str(endpoint.via or endpoint.ip), self._hbone_port)
        service = endpoint.service

        async def dial() -> HboneClient:
            sock = await connect(self._sockets, hbone_addr, timeout=self._connect_timeout)
            return await HboneClient.connect(
                sock,
                cert,
                expected,
                trust_domain=self._trust_domain,
                timeout=self._connect_timeout,
                tls_transport=self._tls_transport,
            )

        headers = connect_headers(forwarded_for=forwarded_for, host=service.hostname if service else None)
        key = PoolKey(self._identity, expected, self._source_ip, hbone_addr)
        return await self.pool.open_tunnel(key, hostport(endpoint.ip, endpoint.port), headers, dial)

    async def open_http(self, endpoint: Endpoint, forwarded_for: str) -> UpstreamHttp:
        stream = await self.open_stream(endpoint, forwarded_for)
        return UpstreamHttp(endpoint_key(endpoint), stream, ClientSide(self._max_head_bytes))

    def take_idle(self, endpoint: Endpoint) -> UpstreamHttp | None:
        """A kept connection to ``endpoint`` that still looks alive, or None."""
        idle = self._idle.get(endpoint_key(endpoint))
        while idle:
            conn = idle.pop()
            if conn.alive:
                conn.reused = True
                return conn
            conn.discard()
        return None

    def put_idle(self, conn: UpstreamHttp, now: float) -> None:
        """Keep ``conn`` for the next request to its endpoint (the exchange on it ended cleanly)."""
        idle = self._idle.setdefault(conn.key, collections.deque())
        if len(idle) >= self._max_idle or not conn.alive:
            conn.discard()
            return
        conn.idle_since = now
        idle.append(conn)

    def reap_idle(self, now: float, max_idle_seconds: float) -> int:
        """Close kept connections idle for ``max_idle_seconds`` or more (and dead ones); return how many."""
        reaped = 0
        for key, idle in list(self._idle.items()):
            keep = collections.deque(c for c in idle if c.alive and now - c.idle_since < max_idle_seconds)
            kept = {id(c) for c in keep}
            for conn in idle:
                if id(conn) not in kept:
                    conn.discard()
                    reaped += 1
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]
        return reaped

    def idle_count(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                with contextlib.suppress(Exception):
                    conn.discard()
        await self.pool.aclose()


def endpoint_key(endpoint: Endpoint) -> EndpointKey:
    return (endpoint.workload.uid, _address_text(endpoint.ip), endpoint.port, endpoint.transport)


_address_text = functools.lru_cache(maxsize=4096)(str)
"""``str`` of an endpoint's address, remembered for the last few thousand (every request takes a kept connection
by its endpoint's key)."""
