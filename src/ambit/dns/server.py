"""One pod's DNS proxy on 15053: UDP datagrams and TCP streams in, answers out (spec §9; the asyncio shell).

Theory of operation: :class:`DnsServer` serves one pod. Each message goes through :func:`~ambit.dns.answer.
parse_query` and :func:`~ambit.dns.answer.decide` (pure) with the pod as the client; an answer from the mesh is
sent at once, from the datagram callback itself (no task), and only a query to forward becomes a task that asks
the pod's resolvers (:class:`~ambit.dns.forwarder.Forwarder`) and sends what they said.

Bounds, so a flood or garbage from a pod costs that pod's answers and nothing else:

1. At most ``max_forwards`` forwarded queries of the pod are in flight; one more is answered SERVFAIL at once
   (counted ``overload``).
2. What does not parse, or is a response, is dropped and counted (``ambit_dns_dropped_total{reason}``); it is
   never answered, so garbage cannot be reflected.
3. A UDP answer is cut to the client's size (512 bytes, or its EDNS payload size) with TC set, so the client asks
   again over TCP. Replies are dropped (``send buffer``) while the socket's send buffer holds more than
   ``max_send_buffer`` bytes.
4. At most ``max_tcp_connections`` TCP connections of the pod are served at once (more are closed at once); each
   reads its messages one after the other and is closed after ``tcp_idle`` seconds without a full message.
5. Every request the proxy takes counts in ``istio_dns_requests_total``; each forwarded one in
   ``istio_dns_upstream_requests_total`` and its time in ``istio_dns_upstream_request_duration_seconds``; a failed
   forward in ``istio_dns_upstream_failures_total`` and is answered SERVFAIL. Each request is one debug line on
   the ``dns`` logger (ztunnel's DNS access log: ``src.workload``, ``src.namespace``, ``query``, ``domain``,
   ``result``, ``endpoints``).

dnspython is not imported with this module, so a pod that asks nothing costs no DNS library. The fast path
(:mod:`ambit.dns.fastpath`) sends a mesh answer the dnspython way made for the same question again, with the new
query's id; everything else (the first query for each name among them) goes the dnspython way
(:mod:`ambit.dns.answer`, about 4 MiB), loaded in a worker thread by the first message that needs it, once per
process; the messages that arrive while it loads wait for it as forwarded queries do (rule 1 bounds them; one
beyond the bound is dropped, counted ``overload``, since SERVFAIL cannot be written before dnspython is there).

The client is the pod this server belongs to, known from the node agent (its namespace); its network and
canonical labels come from its workload once the workload state knows it. Nothing here raises out of a callback:
one bad message never takes the listener down.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import random
import socket
import struct
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, cast

from ambit.dns.errors import UpstreamError
from ambit.dns.fastpath import AnswerCache
from ambit.dns.forwarder import Forwarder, read_exactly
from ambit.dns.names import split
from ambit.dns.resolution import RDTYPE_A, DnsClient, Forward, ServiceView
from ambit.dns.settings import DnsServerSettings, Upstream
from ambit.telemetry.metrics import DnsLabels, ProxyMetrics

if TYPE_CHECKING:
    import dns.message

    from ambit.dns.answer import Answered

log = logging.getLogger("ambit.dns")
access = logging.getLogger("dns")

UDP_DEFAULT_PAYLOAD = 512

SLOW_PATH = "ambit.dns.answer"
"""The dnspython way, with dnspython: imported by the first message the fast path declines."""
_slow_path_loaded = SLOW_PATH in sys.modules
"""Whether :data:`SLOW_PATH` is imported (already by whoever imported this module, or by :func:`load_slow_path`)."""


async def load_slow_path() -> None:
    """Import :data:`SLOW_PATH` (dnspython with it) in a worker thread, once: tens of milliseconds the event loop
    goes on serving other pods and connections meanwhile."""
    global _slow_path_loaded
    if not _slow_path_loaded:
        await asyncio.to_thread(importlib.import_module, SLOW_PATH)
        _slow_path_loaded = True


class DnsServer:
    """One pod's DNS proxy; feed it with :meth:`datagram_protocol` and :meth:`serve_tcp`, stop with :meth:`aclose`."""

    def __init__(
        self,
        view: ServiceView,
        client: Callable[[], DnsClient],
        forwarder: Forwarder,
        upstream: Callable[[], Awaitable[Upstream]],
        metrics: ProxyMetrics,
        settings: DnsServerSettings | None = None,
    ) -> None:
        self._view = view
        self._client = client
        self._forwarder = forwarder
        self._upstream = upstream
        self._metrics = metrics
        self.settings = settings or DnsServerSettings()
        self._forwards: set[asyncio.Task[Any]] = set()
        self._tcp_connections = 0
        self._shuffle = random.Random().shuffle
        self._cache = AnswerCache(view, domain=split(self.settings.domain), ipv6=self.settings.ipv6)
        self._labels_made: dict[tuple[int, str, str, str], DnsLabels] = {}

    # -- the decision, shared by UDP and TCP ----------------------------------------------------------------------

    def _fast(self, wire: bytes, client: DnsClient, protocol: str) -> bytes | None:
        """A remembered answer to a simple query for a mesh name (:mod:`ambit.dns.fastpath`), or ``None`` for the
        dnspython way: for every other message, a question not answered before, an answer too long for the client,
        or while the access log is on."""
        if access.isEnabledFor(logging.DEBUG):
            return None
        found = self._cache.answer(client, wire, udp=protocol == "udp")
        if found is None:
            return None
        answer, rdtype = found
        self._metrics.dns_request(self._fast_labels(rdtype, protocol, client))
        return answer

    def _fast_labels(self, rdtype: int, protocol: str, client: DnsClient) -> DnsLabels:
        """The metric labels of a fast answer, made once per type, protocol and client labels."""
        key = (rdtype, protocol, client.canonical_name, client.canonical_revision)
        labels = self._labels_made.get(key)
        if labels is None:
            if len(self._labels_made) >= 64:  # the client's canonical labels changed often: start afresh
                self._labels_made.clear()
            qtype = "a" if rdtype == RDTYPE_A else "aaaa"
            labels = self._labels_made[key] = DnsLabels(qtype, protocol, *key[2:])
        return labels

    def _begin(
        self, wire: bytes, protocol: str, client: DnsClient
    ) -> tuple[dns.message.Message | None, Answered | Forward | None]:
        """Parse and decide: (query, what to do), or (None, None) to drop the message."""
        from ambit.dns.answer import Answered, Malformed, decide, parse_query  # loaded: see load_slow_path

        parsed = parse_query(wire)
        if isinstance(parsed, Malformed):
            self._metrics.dns_dropped(parsed.reason)
            return None, None
        if isinstance(parsed, Answered):  # FORMERR or NOTIMP: answered, never decided or forwarded
            self._metrics.dns_dropped(parsed.result)
            return None, parsed
        labels = self._labels(parsed, protocol, client)
        decision = decide(
            self._view,
            client,
            parsed,
            domain=self.settings.domain,
            ipv6=self.settings.ipv6,
            shuffle=self._shuffle,
            lookup=lambda raw, rdtype: self._cache.resolution(client, raw, rdtype),
        )
        if isinstance(decision, Answered):
            self._metrics.dns_request(labels)
            _access_log(client, parsed, decision.result, decision.endpoints)
            self._cache.remember(client, wire, decision.response, decision.endpoints)
        return parsed, decision

    @staticmethod
    def _labels(query: dns.message.Message, protocol: str, client: DnsClient) -> DnsLabels:
        import dns.rdatatype

        rdtype = dns.rdatatype.to_text(query.question[0].rdtype).lower()
        return DnsLabels(rdtype, protocol, client.canonical_name, client.canonical_revision)

    async def _forward(self, query: dns.message.Message, protocol: str) -> dns.message.Message:
        """Ask upstream (rule 5); SERVFAIL when that fails."""
        import dns.rcode

        from ambit.dns.answer import error_response

        client = self._client()
        labels = self._labels(query, protocol, client)
        self._metrics.dns_request(labels)
        started = time.monotonic()
        try:
            response = await self._forwarder.forward(query, await self._upstream())
        except UpstreamError as exc:
            self._metrics.dns_forwarded(labels, time.monotonic() - started, failed=True)
            _access_log(client, query, f"forwarding failed ({exc.reason})", 0)
            return error_response(query, dns.rcode.SERVFAIL)
        self._metrics.dns_forwarded(labels, time.monotonic() - started, failed=False)
        _access_log(client, query, "forwarded", sum(len(rrset) for rrset in response.answer))
        return response

    def _overloaded(self, query: dns.message.Message) -> dns.message.Message | None:
        if len(self._forwards) < self.settings.max_forwards:
            return None
        import dns.rcode

        from ambit.dns.answer import error_response

        self._metrics.dns_dropped("overload")
        return error_response(query, dns.rcode.SERVFAIL)

    # -- UDP -------------------------------------------------------------------------------------------------------

    def datagram_protocol(self) -> DnsDatagramProtocol:
        return DnsDatagramProtocol(self)

    def _datagram(self, transport: asyncio.DatagramTransport, wire: bytes, peer: tuple[str, int]) -> None:
        client = self._client()
        answer = self._fast(wire, client, "udp")
        if answer is not None:
            if self._send_buffer_full(transport):
                return
            transport.sendto(answer, peer)
            return
        if not _slow_path_loaded:
            if len(self._forwards) >= self.settings.max_forwards:
                self._metrics.dns_dropped("overload")
                return
            self._start(self._datagram_once_loaded(transport, wire, peer))
            return
        query, decision = self._begin(wire, "udp", client)
        if decision is None:
            return
        if not isinstance(decision, Forward):  # answered
            self._send_datagram(transport, decision.response, query, peer)
            return
        assert query is not None
        busy = self._overloaded(query)
        if busy is not None:
            self._send_datagram(transport, busy, query, peer)
            return
        self._start(self._forward_datagram(transport, query, peer))

    def _start(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``work`` (a forward, or a message waiting for the dnspython way) as a task counted by rule 1."""
        task = asyncio.get_running_loop().create_task(work)
        self._forwards.add(task)
        task.add_done_callback(self._forwards.discard)
        return task

    async def _datagram_once_loaded(
        self, transport: asyncio.DatagramTransport, wire: bytes, peer: tuple[str, int]
    ) -> None:
        """A datagram the fast path declined before the dnspython way was loaded: load it, then handle the datagram
        as if it came now (it no longer counts against rule 1 itself; its forward will)."""
        try:
            await load_slow_path()
        except Exception:  # a bug: logged here, since nobody awaits this task
            log.exception("loading the DNS proxy's dnspython way failed")
            return
        finally:
            self._done_forwarding()
        if not transport.is_closing():
            self._datagram(transport, wire, peer)

    async def _forward_datagram(
        self, transport: asyncio.DatagramTransport, query: dns.message.Message, peer: tuple[str, int]
    ) -> None:
        import dns.rcode

        from ambit.dns.answer import error_response

        try:
            response = await self._forward(query, "udp")
        except Exception:  # a bug: logged here, since nobody awaits this task
            log.exception("forwarding a DNS query failed")
            response = error_response(query, dns.rcode.SERVFAIL)
        finally:
            self._done_forwarding()
        if not transport.is_closing():
            self._send_datagram(transport, response, query, peer)

    def _send_datagram(
        self,
        transport: asyncio.DatagramTransport,
        response: dns.message.Message,
        query: dns.message.Message | None,
        peer: tuple[str, int],
    ) -> None:
        if self._send_buffer_full(transport):
            return
        limit = UDP_DEFAULT_PAYLOAD
        if query is not None and query.edns >= 0:
            limit = max(UDP_DEFAULT_PAYLOAD, min(query.payload, 65535))
        try:
            wire = response.to_wire(max_size=limit, prefer_truncation=True)
        except Exception:  # a message dnspython cannot render: a bug, never the peer's to see
            log.exception("cannot render a DNS answer")
            return
        transport.sendto(wire, peer)

    def _send_buffer_full(self, transport: asyncio.DatagramTransport) -> bool:
        # Both asyncio's and uvloop's datagram transports have it; typeshed leaves it out.
        if transport.get_write_buffer_size() > self.settings.max_send_buffer:  # type: ignore[attr-defined]
            self._metrics.dns_dropped("send buffer")
            return True
        return False

    # -- TCP -------------------------------------------------------------------------------------------------------

    async def serve_tcp(self, sock: socket.socket) -> None:
        """Serve one accepted TCP connection until it closes, idles or misbehaves (rule 4); closes ``sock``."""
        if self._tcp_connections >= self.settings.max_tcp_connections:
            self._metrics.dns_dropped("tcp overload")
            sock.close()
            return
        self._tcp_connections += 1
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    async with asyncio.timeout(self.settings.tcp_idle):
                        (length,) = struct.unpack("!H", await read_exactly(loop, sock, 2))
                        wire = await read_exactly(loop, sock, length)
                except (TimeoutError, EOFError, OSError):
                    return
                response = await self._answer_stream(wire)
                if response is None:
                    return  # garbage on a stream: the framing cannot be trusted any more
                await loop.sock_sendall(sock, struct.pack("!H", len(response)) + response)
        except OSError:
            return
        finally:
            self._tcp_connections -= 1
            with contextlib.suppress(OSError):
                sock.close()

    async def _answer_stream(self, wire: bytes) -> bytes | None:
        client = self._client()
        answer = self._fast(wire, client, "tcp")
        if answer is not None:
            return answer
        if not _slow_path_loaded:  # the connection waits for it; rule 4 bounds the connections
            await load_slow_path()
        query, decision = self._begin(wire, "tcp", client)
        if decision is None:
            return None
        if not isinstance(decision, Forward):  # answered
            return decision.response.to_wire()
        assert query is not None
        busy = self._overloaded(query)
        if busy is not None:
            return busy.to_wire()
        return (await self._start(self._forward_stream(query))).to_wire()  # type: ignore[no-any-return]

    async def _forward_stream(self, query: dns.message.Message) -> dns.message.Message:
        try:
            return await self._forward(query, "tcp")
        finally:
            self._done_forwarding()

    def _done_forwarding(self) -> None:
        """A forward leaves the in-flight set as it ends (rule 1): its done callback, which also covers a task
        cancelled before it ran, comes a loop pass later, and a burst would otherwise count the forwards that
        just finished against the new ones (measured: a fifth of 48 concurrent queries refused under 64)."""
        task = asyncio.current_task()
        if task is not None:
            self._forwards.discard(task)

    async def aclose(self) -> None:
        """Cancel the forwards in flight."""
        for task in list(self._forwards):
            task.cancel()
        await asyncio.gather(*self._forwards, return_exceptions=True)


class DnsDatagramProtocol(asyncio.DatagramProtocol):
    """The UDP listener's protocol; ``closed`` is done once the socket really is closed."""

    def __init__(self, server: DnsServer) -> None:
        self._server = server
        self._transport: asyncio.DatagramTransport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.DatagramTransport, transport)  # asyncio's is not a subclass of it

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        if self._transport is None:
            return
        try:
            self._server._datagram(self._transport, data, addr)  # type: ignore[arg-type]
        except Exception:  # one bad message never takes the listener down
            log.exception("DNS datagram from %s failed", addr)

    def error_received(self, exc: Exception) -> None:
        log.debug("DNS listener: %s", exc)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


def _access_log(client: DnsClient, query: dns.message.Message, result: str, endpoints: int) -> None:
    if not access.isEnabledFor(logging.DEBUG):
        return
    import dns.rdatatype

    question = query.question[0]
    access.debug(
        "src.workload=%s src.namespace=%s query=%s domain=%s result=%s endpoints=%d",
        client.name or "unknown",
        client.namespace or "unknown",
        dns.rdatatype.to_text(question.rdtype),
        question.name.to_text(),
        _quoted(result),
        endpoints,
    )


def _quoted(text: str) -> str:
    return f'"{text}"' if " " in text else text
