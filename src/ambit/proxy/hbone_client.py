"""The client end of one pooled HBONE connection: mutual TLS to ``<pod IP>:15008``, then CONNECT tunnels (§6.1).

Theory of operation: :meth:`HboneClient.connect` takes a TCP socket the caller already connected from the source
pod's network namespace, runs the TLS 1.3 handshake over it with the source workload's certificate (ALPN ``h2``,
no SNI: ``server_hostname=""``), and only then judges the server: ALPN must be ``h2`` and its certificate must
name one of the ``expected`` identities in our trust domain (:func:`ambit.tls.spiffe.check_peer`). The HTTP/2
preface is sent after that check, and ``connect`` returns once the server's first frames arrive: under TLS 1.3
the server judges our certificate after our handshake has finished, so a server that refuses us shows up here as
a closed connection rather than later, in the middle of someone's tunnel. A server that took our certificate (its
SETTINGS arrived) but is already going away (its GOAWAY, or its close, came with them: a proxy that accepted the
connection as its drain began) fails the connect with :class:`~ambit.proxy.hbone_session.ConnectionLostError`,
which the pool retries on a fresh connection.

Each :meth:`HboneClient.open_tunnel` is one CONNECT stream; it claims its stream slot synchronously (before its
first suspension, as :class:`~ambit.proxy.pool.ConnectionPool` requires) and waits for the server's status.

Errors (all :class:`~ambit.proxy.errors.ProxyError`): :class:`HboneConnectError` for a failed connection set-up
with the access-log response flag in ``flag``; :class:`TunnelRefusedError` for a non-200 answer;
:class:`~ambit.proxy.hbone_session.ConnectionLostError` when the connection died before answering (safe to retry).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ambit.hbone.client import HboneClientConnection
from ambit.hbone.events import Headers
from ambit.hbone.headers import hostport
from ambit.hbone.settings import HboneSettings
from ambit.model.identity import SpiffeId
from ambit.proxy.errors import ProxyError, ResponseFlag
from ambit.proxy.hbone_session import ConnectionLostError, HboneSession
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.revocation import PeerRevokedError, RevocationManager
from ambit.telemetry.metrics import Reporter
from ambit.tls.contexts import verified_chain
from ambit.tls.errors import PeerIdentityError
from ambit.tls.socket_handshake import open_tls
from ambit.tls.socket_transport import READ_AHEAD_BUFFER, Addresses, TlsTransportKind

if TYPE_CHECKING:
    from ambit.tls.workload import WorkloadCertificate

log = logging.getLogger(__name__)


class HboneConnectError(ProxyError):
    """Setting up an HBONE connection failed; ``flag`` says at which step (TLS_FAILURE, ...)."""

    def __init__(self, reason: str, flag: ResponseFlag) -> None:
        super().__init__(reason)
        self.reason = reason
        self.flag = flag


class TunnelRefusedError(ProxyError):
    """The server answered the CONNECT with ``status`` (400 bad request, 401 denied by policy, 503 unreachable)."""

    def __init__(self, status: int, headers: Headers = ()) -> None:
        super().__init__(f"HBONE tunnel refused with status {status}")
        self.status = status
        self.headers = headers


class HboneClient:
    """One client HBONE connection (HTTP/2 over mutual TLS) carrying many CONNECT tunnels."""

    def __init__(self, session: HboneSession, core: HboneClientConnection, peer: SpiffeId) -> None:
        self._session = session
        self._core = core
        self._peer = peer

    @classmethod
    async def connect(
        cls,
        sock: socket.socket,
        cert: WorkloadCertificate,
        expected: frozenset[SpiffeId],
        *,
        trust_domain: str,
        timeout: float = 10.0,  # noqa: ASYNC109 - the handshake timeout, passed to the loop
        settings: HboneSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        revocation: RevocationManager | None = None,
        tls_transport: TlsTransportKind = "socket",
    ) -> HboneClient:
        """Handshake over the connected ``sock`` (which we own from now on) and check the server's identity.

        With ``revocation``, a server whose chain is revoked is refused (``TLS_FAILURE``), and the connection is
        aborted if a later CRL revokes it (:mod:`ambit.proxy.revocation`). ``tls_transport`` picks the event loop's
        TLS transport or TLS on the socket itself (:mod:`ambit.tls.socket_transport`)."""
        loop = asyncio.get_running_loop()
        addresses: Addresses | None = None  # asked once, here: the TLS transport takes them
        try:
            peer_address = sock.getpeername()
        except OSError:
            peer_name = "?"
        else:
            peer_name = hostport(*peer_address[:2])
            try:  # noqa: SIM105 - per connection: contextlib.suppress is three Python calls more
                addresses = (peer_address, sock.getsockname())
            except OSError:  # the transport asks again, and says what it finds
                pass
        core = HboneClientConnection(settings) if settings is not None else HboneClientConnection()
        session = HboneSession(core, name=f"hbone client {cert.identity} -> {peer_name}", clock=clock)
        try:
            transport: asyncio.BaseTransport
            if tls_transport == "socket":
                transport, _ = await open_tls(
                    lambda: session,
                    sock,
                    cert.client_context(read_ahead=READ_AHEAD_BUFFER),
                    server_side=False,
                    handshake_timeout=timeout,
                    addresses=addresses,
                )
            else:
                transport, _ = await loop.create_connection(
                    lambda: session,
                    sock=sock,
                    ssl=cert.client_context(),
                    server_hostname="",
                    ssl_handshake_timeout=timeout,
                )
        except (ssl.SSLError, ssl.CertificateError) as exc:
            sock.close()
            raise HboneConnectError(f"TLS handshake with {peer_name} failed: {exc}", ResponseFlag.TLS_FAILURE) from None
        except (OSError, TimeoutError) as exc:
            sock.close()
            reason = "timed out" if isinstance(exc, TimeoutError) else str(exc)
            raise HboneConnectError(
                f"TLS handshake with {peer_name} failed: {reason}", ResponseFlag.TLS_FAILURE
            ) from None
        try:
            peer = _judge_server(transport, expected, trust_domain, peer_name)
            if revocation is not None:
                _track(revocation, transport, session, peer, peer_name)
            session.release()  # the HTTP/2 preface, only now that we know whom we talk to
            if not await _heard_within(session, timeout):
                raise HboneConnectError(f"{peer_name} sent no HTTP/2 settings", ResponseFlag.CONNECT_FAILURE)
            if core.peer_ready and (core.draining or session.transport is None or session.terminated is not None):
                # It took our certificate (it spoke HTTP/2) and is going away already: a proxy that accepted us as
                # its drain began. Safe to dial again: nothing was sent on it.
                raise ConnectionLostError(f"{peer_name} is going away: it said GOAWAY before the first tunnel")
            if session.transport is None or session.terminated is not None:
                raise HboneConnectError(
                    f"{peer_name} closed the connection after the handshake (did it refuse our certificate?)",
                    ResponseFlag.TLS_FAILURE,
                )
        except BaseException:
            transport.abort()
            raise
        return cls(session, core, peer)

    @property
    def peer_identity(self) -> SpiffeId:
        return self._peer

    @property
    def available(self) -> bool:
        """Alive and able to open another stream now."""
        return not self.closed and self._core.can_open_tunnel

    @property
    def closed(self) -> bool:
        """Dead or closing: no new tunnel will ever be opened on this connection."""
        return self._session.terminated is not None or self._session.transport is None or self._core.closed

    @property
    def active_streams(self) -> int:
        return len(self._session.streams)

    @property
    def idle_since(self) -> float | None:
        """Clock time the last tunnel finished (or the connection was made); None while tunnels are open."""
        return self._session.idle_since

    def when_idle(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` each time the connection's last open tunnel has ended (from the event loop, soon).

        Never once the connection is lost: the session lets it go then (it holds the pool's callback, which holds
        us), and one handed to a lost connection is not kept."""
        if self._session.lost.done():
            return
        loop = self._session.loop

        def soon() -> None:  # not from inside the stream bookkeeping that noticed it
            loop.call_soon(callback)

        self._session.on_idle = soon

    def when_closed(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, from the event loop, when the connection is lost (soon, if it is already).

        Until then the connection holds ``callback`` (the pool's, which holds us); the lost future lets it go."""
        self._session.lost.add_done_callback(lambda _: callback())

    async def open_tunnel(self, authority: str, headers: Sequence[tuple[str, str]]) -> HboneStream:
        """CONNECT to ``authority``; the tunnel once the server answered 200, else :class:`TunnelRefusedError`."""
        if self.closed:
            raise ConnectionLostError(f"{self._session.name}: {self._session.terminated or 'connection closed'}")
        if self._core.draining:  # the peer said GOAWAY: a new connection may land on its successor
            raise ConnectionLostError(f"{self._session.name}: the peer is going away")
        stream_id = self._core.open_tunnel(authority, list(headers))
        stream = self._session.add_stream(stream_id)
        self._session.flush()
        try:
            status, response_headers = await stream.response
        except asyncio.CancelledError:
            stream.abort()
            raise
        if status != 200:
            raise TunnelRefusedError(status, response_headers)
        return stream

    def close(self) -> None:
        """Start a graceful close: GOAWAY, then close the TLS connection; open tunnels are reset."""
        self._session.close()

    async def aclose(self) -> None:
        """Close and wait until the connection is gone."""
        self._session.close()
        if not self._session.lost.done():
            try:
                async with asyncio.timeout(5.0):
                    await asyncio.shield(self._session.lost)
            except TimeoutError:
                self._session.abort()

    def __repr__(self) -> str:
        return f"<HboneClient {self._session.name} streams={self.active_streams}>"


async def _heard_within(session: HboneSession, timeout: float) -> bool:  # noqa: ASYNC109
    """Whether the peer spoke (or the connection was lost) within ``timeout`` seconds: one timer and one future, not
    ``asyncio.timeout`` around an ``Event``'s wait (Python objects and frames per connection)."""
    heard = session.heard_from_peer
    if heard.done():
        return True
    waiter: asyncio.Future[None] = session.loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    heard.add_done_callback(wake)
    timer = session.loop.call_later(timeout, wake)
    try:
        await waiter
    finally:
        timer.cancel()
        heard.remove_done_callback(wake)
    return heard.done()


def _track(
    revocation: RevocationManager,
    transport: asyncio.BaseTransport,
    session: HboneSession,
    peer: SpiffeId,
    peer_name: str,
) -> None:
    """Refuse a revoked server, else keep the connection tracked until it is lost."""
    tls = transport.get_extra_info("ssl_object")
    chain = verified_chain(tls) if isinstance(tls, (ssl.SSLObject, ssl.SSLSocket)) else None
    try:
        tracked = revocation.admit(chain, Reporter.SOURCE, str(peer), session.abort)
    except PeerRevokedError as exc:
        raise HboneConnectError(f"server {peer_name}: {exc}", ResponseFlag.TLS_FAILURE) from None
    session.lost.add_done_callback(lambda _: tracked.release())


def _judge_server(
    transport: asyncio.BaseTransport, expected: frozenset[SpiffeId], trust_domain: str, peer_name: str
) -> SpiffeId:
    tls = transport.get_extra_info("ssl_object")
    if not isinstance(tls, (ssl.SSLObject, ssl.SSLSocket)):
        raise HboneConnectError(f"no TLS session with {peer_name}", ResponseFlag.TLS_FAILURE)
    alpn = tls.selected_alpn_protocol()
    if alpn != "h2":
        raise HboneConnectError(f"{peer_name} did not agree to ALPN h2 (got {alpn!r})", ResponseFlag.TLS_FAILURE)
    from ambit.tls.spiffe import check_peer  # loaded with the first certificate

    try:
        return check_peer(tls.getpeercert(binary_form=True), trust_domain=trust_domain, expected=expected)
    except PeerIdentityError as exc:
        raise HboneConnectError(f"server {peer_name}: {exc}", ResponseFlag.IDENTITY_ERROR) from None
