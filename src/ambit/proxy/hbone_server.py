"""The server end of HBONE: one accepted TCP connection on port 15008, mutual TLS, CONNECT requests (§6.5).

Theory of operation: :meth:`HboneServer.serve` owns one accepted socket from start to end. It fetches the local
pod's certificate lazily (``cert_for_local``: the listener may be up before the certificate is), runs the TLS 1.3
server handshake requiring a client certificate that chains to the mesh roots, and then judges the client: ALPN
must be ``h2`` and the certificate must carry a SPIFFE id of our trust domain (spec §5.4; which identities may do
what is authorization's business, not ours). A client that fails is dropped before any HTTP/2 byte is sent; the
failure is logged and reported through ``on_failure(reason)`` for counting.

Every ``TunnelRequested`` starts ``handler(request, responder)`` as its own task, so one slow upstream connect
never holds up the connection's other tunnels. The handler answers exactly once: ``responder.reject(status)``
(400 bad request, 401 denied, 503 upstream unreachable) or ``responder.accept()``, which sends 200 and returns the
:class:`~ambit.proxy.hbone_stream.HboneStream` to relay. A handler that returns without answering gets its
stream reset; one that raises gets a 503 (or a reset, if it had accepted). A handler that accepted and returns
None is done with the stream, which is then closed; one that returns anything else has handed the stream to
something that outlives it (a relay running on callbacks), and the stream is left alone. ``serve`` returns when
the connection is gone and every handler has finished; cancelling it aborts the connection and cancels the
handlers.

Admission (:mod:`ambit.proxy.admission`): the accept loop admitted the connection with a ticket, pending. One
deadline, ``handshake_timeout`` after ``serve`` starts, bounds the certificate fetch and the whole TLS handshake
together, so a peer that trickles its handshake a byte at a time holds its place no longer than that. The ticket
becomes established once the client is judged; the caller releases it when ``serve`` returns.

Liveness (:mod:`ambit.hbone.liveness`): once the client is judged, one timer per connection, re-armed at the
deadline it names, holds the connection to its part: the HTTP/2 preface and first SETTINGS within
``preface_timeout`` (else it is aborted: it never spoke HTTP/2), no open stream for ``idle_timeout`` (else a
graceful GOAWAY, and the close once the streams the client sent meanwhile are done: an open tunnel is never cut by
it), and a PING after ``keepalive_interval`` of silence answered within ``keepalive_timeout`` (else aborted: the
peer is gone). So a peer, with a certificate or without, cannot park a connection on its place for ever.

Draining (the proxy is going away, :class:`~ambit.proxy.drain.DrainSignal`): the connection says a graceful GOAWAY
once its client is judged; tunnels in flight go on, the client opens new ones elsewhere (a proxy that took over
the listener), and the connection closes when its last tunnel is done. A client that never ends its tunnels is the
drain deadline's business, not ours.

Handlers are bounded, against "MadeYouReset" (CVE-2025-8671, a client making us reset streams whose handlers
then run on):

1. A stream reset (by either side) or lost with the connection before its handler answered cancels the handler at
   once: nobody is waiting for the dial it is making.
2. At most ``max_concurrent_streams`` handlers run per connection, counting those whose stream is already gone
   until they have actually finished; a request beyond that is refused (RST_STREAM REFUSED_STREAM, safe to
   retry) without starting anything. The core's stream limit alone does not do it: a reset stream leaves the
   core's table before its handler has noticed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ambit.hbone.events import Headers, TunnelRequested
from ambit.hbone.liveness import Expire, LivenessSettings, LivenessTimer, SendPing
from ambit.hbone.server import HboneServerConnection
from ambit.hbone.settings import HboneSettings
from ambit.model.identity import SpiffeId
from ambit.proxy.admission import DEFAULT_HANDSHAKE_TIMEOUT, Ticket
from ambit.proxy.drain import DrainSignal
from ambit.proxy.errors import ProxyError
from ambit.proxy.hbone_session import HboneSession
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.revocation import RevocationManager, Tracked
from ambit.telemetry.metrics import Reporter
from ambit.tls.contexts import verified_chain
from ambit.tls.errors import PeerIdentityError
from ambit.tls.socket_handshake import open_tls
from ambit.tls.socket_transport import READ_AHEAD_BUFFER, Addresses, TlsTransportKind

if TYPE_CHECKING:
    from ambit.tls.workload import WorkloadCertificate

log = logging.getLogger(__name__)

_REFUSED_STREAM = 0x7  # HTTP/2 REFUSED_STREAM: not processed, the client may retry
_DEFAULT_LIVENESS = LivenessSettings()
"""The deadlines of a connection served without a listener's (frozen: one instance serves them all)."""


@dataclass(frozen=True, slots=True)
class InboundRequest:
    """One CONNECT request on an HBONE connection, with who sent it and where it arrived."""

    stream_id: int
    authority: str
    headers: Headers
    peer_identity: SpiffeId
    peer_addr: tuple[str, int]
    local_addr: tuple[str, int]


class TunnelResponder:
    """Answers one :class:`InboundRequest`, exactly once."""

    def __init__(self, session: HboneSession, core: HboneServerConnection, stream: HboneStream) -> None:
        self._session = session
        self._core = core
        self._stream = stream
        self.status: int | None = None  # the status sent, once answered

    def accept(self, headers: Sequence[tuple[str, str]] = ()) -> HboneStream:
        """Answer 200 and return the tunnel for the relay."""
        self._answer(200, headers)
        return self._stream

    def reject(self, status: int, headers: Sequence[tuple[str, str]] = ()) -> None:
        """Answer with an error status (400, 401, 503, ...); the stream ends there."""
        if status == 200:
            raise ProxyError("reject needs an error status, not 200")
        self._answer(status, headers)
        self._stream._fail(f"tunnel rejected with status {status}")
        self._session.check_done(self._stream)

    def _answer(self, status: int, headers: Sequence[tuple[str, str]]) -> None:
        if self.status is not None:
            raise ProxyError(f"stream {self._stream.stream_id} was already answered with {self.status}")
        self.status = status
        self._core.respond(self._stream.stream_id, status, list(headers))
        self._session.flush()


Handler = Callable[[InboundRequest, TunnelResponder], Awaitable[object]]
"""Answers one tunnel request; returns None when done with the stream, else whatever now owns it."""


class HboneServer:
    """Serves one accepted HBONE connection; see the module docstring."""

    def __init__(
        self,
        core: HboneServerConnection,
        handler: Handler,
        peer_addr: tuple[str, int],
        local_addr: tuple[str, int],
        name: str,
    ) -> None:
        self._core = core
        self._handler = handler
        self._peer_addr = peer_addr
        self._local_addr = local_addr
        # Held until the client is judged.
        self._session = HboneSession(
            core, name=name, on_request=self._start, read_pause=True, on_stream_failed=self._stream_failed
        )
        self._handlers: set[asyncio.Task[None]] = set()
        self._unanswered: dict[int, tuple[asyncio.Task[None], TunnelResponder]] = {}
        self._max_handlers = core.settings.max_concurrent_streams
        self._peer: SpiffeId | None = None
        self._timer: LivenessTimer | None = None
        self._timer_handle: asyncio.TimerHandle | None = None

    @classmethod
    async def serve(
        cls,
        sock: socket.socket,
        cert_for_local: Callable[[], Awaitable[WorkloadCertificate]],
        *,
        trust_domain: str,
        handler: Handler,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
        settings: HboneSettings | None = None,
        on_failure: Callable[[str], None] | None = None,
        revocation: RevocationManager | None = None,
        drain: DrainSignal | None = None,
        ticket: Ticket | None = None,
        liveness: LivenessSettings | None = None,
        tls_transport: TlsTransportKind = "socket",
        find_cert: Callable[[], WorkloadCertificate | None] | None = None,
        addresses: Addresses | None = None,
    ) -> None:
        """Run the connection on ``sock`` (which we own) until it is done and every handler has returned.

        ``liveness`` bounds its life after the handshake (see the module docstring; by default, the ticket's
        listener's, else :class:`~ambit.hbone.liveness.LivenessSettings`' defaults). With ``revocation``, a client
        whose chain is revoked is dropped after the handshake, and the connection is
        aborted if a later CRL revokes it (:mod:`ambit.proxy.revocation`). When ``drain`` is raised the connection
        says a graceful GOAWAY (see the module docstring). ``ticket`` (the caller's to release) is made
        established once the client is judged, within ``handshake_timeout`` of the call. ``tls_transport`` picks
        the event loop's TLS transport or TLS on the socket itself (:mod:`ambit.tls.socket_transport`).

        ``find_cert`` returns the local certificate when it is at hand without waiting (the certificate manager's
        ``find``), else None: only then is ``cert_for_local`` awaited, under the deadline. ``addresses``: ``sock``'s
        (peer, local) addresses as ``getpeername()`` and ``getsockname()`` gave them, when the caller has them."""
        peer_addr, local_addr = _addresses(sock, addresses)
        name = f"hbone server {local_addr[0]}:{local_addr[1]} <- {peer_addr[0]}:{peer_addr[1]}"

        def fail(reason: str) -> None:
            log.info("%s: dropped: %s", name, reason)
            if on_failure is not None:
                on_failure(reason)

        loop = asyncio.get_running_loop()
        deadline = loop.time() + handshake_timeout
        # The certificate at hand (every connection but a pod's first few) needs no deadline: nothing to wait for.
        cert = find_cert() if find_cert is not None else None
        if cert is None:
            try:
                async with asyncio.timeout_at(deadline):
                    cert = await cert_for_local()
            except Exception as exc:  # any failure to get a certificate just drops this one connection
                sock.close()
                fail(f"no certificate for the local workload: {str(exc) or type(exc).__name__}")
                return
        core = HboneServerConnection(settings) if settings is not None else HboneServerConnection()
        server = cls(core, handler, peer_addr, local_addr, name)
        session = server._session
        try:
            try:
                # What is left of the one deadline; the loop's SSL handshake timeout runs from the handshake's start
                # whatever the peer sends, so trickled bytes do not extend it.
                left = max(deadline - loop.time(), 0.001)
                transport: asyncio.BaseTransport
                if tls_transport == "socket":
                    transport, _ = await open_tls(
                        lambda: session,
                        sock,
                        cert.server_context(read_ahead=READ_AHEAD_BUFFER),
                        server_side=True,
                        handshake_timeout=left,
                        addresses=addresses,
                    )
                else:
                    transport, _ = await loop.connect_accepted_socket(
                        lambda: session, sock, ssl=cert.server_context(), ssl_handshake_timeout=left
                    )
            except (OSError, TimeoutError) as exc:  # ssl.SSLError and ConnectionError are OSErrors
                sock.close()
                fail(f"TLS handshake failed: {str(exc) or type(exc).__name__}")
                return
            tracked: Tracked | None = None
            try:
                server._peer = _judge_client(transport, trust_domain)
                if revocation is not None:
                    tls = transport.get_extra_info("ssl_object")
                    chain = verified_chain(tls) if isinstance(tls, (ssl.SSLObject, ssl.SSLSocket)) else None
                    tracked = revocation.admit(chain, Reporter.DESTINATION, str(server._peer), session.abort)
            except ProxyError as exc:  # PeerRevokedError among them
                transport.abort()
                fail(str(exc))
                return
            if ticket is not None:
                ticket.established()
            if liveness is None:
                liveness = ticket.liveness if ticket is not None else _DEFAULT_LIVENESS
            session.release()
            server._start_timer(liveness)
            unwatch = drain.watch(session.go_away) if drain is not None else None
            try:
                await asyncio.shield(session.lost)
                while server._handlers:
                    await asyncio.gather(*server._handlers, return_exceptions=True)
            except asyncio.CancelledError:
                session.abort()
                for task in server._handlers:
                    task.cancel()
                raise
            finally:
                if server._timer_handle is not None:
                    server._timer_handle.cancel()
                if tracked is not None:
                    tracked.release()
                if unwatch is not None:
                    unwatch()
        finally:
            # The session holds our request and stream callbacks (bound methods, so a cycle through us): let go
            # here, where the connection's life ends on every path (a failed handshake never calls
            # ``connection_lost``), the server and its session are freed by reference counting.
            session.let_go()

    # Liveness (see the module docstring).

    def _start_timer(self, settings: LivenessSettings) -> None:
        session = self._session
        timer = self._timer = LivenessTimer(settings, session.clock())
        session.on_ping_acknowledged = timer.acknowledged
        self._arm()

    def _arm(self) -> None:
        assert self._timer is not None
        delay = max(self._timer.next_at - self._session.clock(), 0.0)
        self._timer_handle = self._session.loop.call_later(delay, self._tick)

    def _tick(self) -> None:
        session, timer = self._session, self._timer
        self._timer_handle = None
        if timer is None or session.transport is None or self._core.closed:
            return
        heard, session.received = session.received, False
        action = timer.due(
            session.clock(),
            heard=heard,
            ready=self._core.peer_ready,
            idle_since=session.idle_since,
            draining=self._core.draining,
        )
        if isinstance(action, SendPing):
            self._core.ping(action.payload)
            session.flush()
        elif isinstance(action, Expire):
            log.info("%s: closing: %s", session.name, action.expiry.value)
            if action.graceful:
                session.go_away(action.expiry.value)
            else:
                self._core.close()
                session.flush()
                session.abort(f"closed locally: {action.expiry.value}")
                return
        self._arm()

    def _start(self, stream: HboneStream, event: TunnelRequested) -> None:
        assert self._peer is not None  # no HTTP/2 is read before the client is judged
        if len(self._handlers) >= self._max_handlers:  # rule 2
            self._core.reset_stream(event.stream_id, _REFUSED_STREAM)
            stream._fail("refused: too many handlers in flight on the connection")
            self._session.check_done(stream)
            return
        request = InboundRequest(
            event.stream_id, event.authority, event.headers, self._peer, self._peer_addr, self._local_addr
        )
        responder = TunnelResponder(self._session, self._core, stream)
        task = asyncio.get_running_loop().create_task(
            self._run(request, responder, stream), name=f"{self._session.name} {event.authority}"
        )
        self._handlers.add(task)
        self._unanswered[event.stream_id] = (task, responder)
        task.add_done_callback(functools.partial(self._finished, event.stream_id))

    def _finished(self, stream_id: int, task: asyncio.Task[None]) -> None:
        self._handlers.discard(task)
        entry = self._unanswered.get(stream_id)
        if entry is not None and entry[0] is task:
            del self._unanswered[stream_id]

    def _stream_failed(self, stream_id: int) -> None:
        """Rule 1: the stream is gone; a handler that has not answered yet works for nobody."""
        entry = self._unanswered.pop(stream_id, None)
        if entry is not None and entry[1].status is None:
            entry[0].cancel()

    async def _run(self, request: InboundRequest, responder: TunnelResponder, stream: HboneStream) -> None:
        try:
            owner = await self._handler(request, responder)
        except Exception:
            log.exception("%s: handler for %s failed", self._session.name, request.authority)
            if responder.status is None:
                responder.reject(503)
            stream.abort()
        except BaseException:  # cancelled: the connection is going away
            stream.abort()
            raise
        if responder.status is None:
            log.warning("%s: handler for %s did not answer", self._session.name, request.authority)
            stream.abort()
        elif responder.status == 200 and owner is None:
            await stream.aclose()


def _judge_client(transport: asyncio.BaseTransport, trust_domain: str) -> SpiffeId:
    tls = transport.get_extra_info("ssl_object")
    if not isinstance(tls, (ssl.SSLObject, ssl.SSLSocket)):
        raise ProxyError("no TLS session")
    alpn = tls.selected_alpn_protocol()
    if alpn != "h2":
        raise ProxyError(f"client did not agree to ALPN h2 (got {alpn!r})")
    from ambit.tls.spiffe import check_peer  # loaded with the first certificate

    try:
        return check_peer(tls.getpeercert(binary_form=True), trust_domain=trust_domain, expected=None)
    except PeerIdentityError as exc:
        raise ProxyError(f"client certificate refused: {exc}") from None


def _addresses(sock: socket.socket, known: Addresses | None) -> tuple[tuple[str, int], tuple[str, int]]:
    if known is not None:
        peer, local = known
    else:
        try:
            peer, local = sock.getpeername(), sock.getsockname()
        except OSError:
            return ("?", 0), ("?", 0)
    return (str(peer[0]), int(peer[1])), (str(local[0]), int(local[1]))
