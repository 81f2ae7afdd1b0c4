"""The xDS server (spec §4.2, §5.2): a TLS grpc.aio server carrying the delta ADS service.

Theory of operation: :class:`XdsServer` owns a TLS grpc.aio server with a :class:`~ambit.xds.service.XdsService`
on it (the CA service can share it through :attr:`XdsServer.grpc_server` before :meth:`XdsServer.start`). The
server tolerates client keepalive pings every 15 s and pings idle clients itself, as istiod does
(:mod:`ambit.xds.keepalive`). It reads requests up to :data:`MAX_REQUEST_BYTES` (a reconnect's opening names every
resource its node proxy holds), and keeps each stream's HTTP/2 receive window at its initial size
(:data:`RECEIVE_WINDOW_OPTIONS`), so that what a client sends before the service asks for it stays at the client
(:mod:`ambit.xds.opening_gate`). A new certificate (a CA rotation) is served from the next TLS handshake on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import grpc  # type: ignore[import-untyped]

from ambit.xds.admission import Admission
from ambit.xds.callers import Authenticator, DebugAccess, ReadCheck
from ambit.xds.errors import XdsError
from ambit.xds.keepalive import DEFAULT_KEEPALIVE, KeepaliveSettings
from ambit.xds.opening_gate import MAX_OPENINGS
from ambit.xds.service import XdsService
from ambit.xds.service_metrics import NO_OBSERVER, XdsObserver
from ambit.xds.sync import DEFAULT_STALE_AFTER
from ambit.xds.table import ResourceSource

__all__ = ["MAX_REQUEST_BYTES", "RECEIVE_WINDOW_OPTIONS", "XdsServer"]

log = logging.getLogger("ambit.xds.server")
MAX_REQUEST_BYTES = 16 * 1024 * 1024
"""The largest request message :class:`XdsServer` reads (gRPC's ``max_receive_message_length``; istiod 4 MiB): a
node proxy reconnecting to a restarted control plane names every resource it holds with its version in its opening
request (~60 bytes each: 100,000 workloads and 10,000 Services make ~6.5 MiB) so that nothing unchanged is sent
again. A service sharing the server bounds its own messages below this (the CA: 1 MiB)."""
RECEIVE_WINDOW_OPTIONS: Mapping[str, int] = {"grpc.http2.bdp_probe": 0}
"""gRPC options that keep what a client sends and the server has not asked for at the client: without bandwidth-
delay probing each stream's HTTP/2 receive window stays at its initial 64 KiB instead of growing to megabytes on a
fast link, so a stream waiting for admission or for an opening slot (:data:`~ambit.xds.opening_gate.MAX_OPENINGS`)
holds at most that much of its opening request in gRPC's buffers. A stream that reads is not slowed: gRPC opens the
window to the size of the message being read."""


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
        (:data:`~ambit.xds.opening_gate.MAX_OPENINGS`)."""
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
