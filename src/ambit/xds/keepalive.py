"""HTTP/2 keepalive on the control-plane connection (:15012: xDS and CA), as istiod and ztunnel set it.

Theory of operation: a long-lived ADS stream can sit idle for hours. Two things must then hold:

1. **The server tolerates the client's pings.** ztunnel sends an HTTP/2 PING every 30 s on an idle connection.
   gRPC's default server enforcement allows one ping without data every 5 minutes and, after two strikes,
   answers early pings with GOAWAY ``ENHANCE_YOUR_CALM`` ("too_many_pings"), which would make every ztunnel
   reconnect and resync every couple of minutes. istiod allows one every ``keepalive time / 2`` = 15 s; so do we
   (:meth:`KeepaliveSettings.server_options`), also when no call is open (a CA channel between certificate
   requests).
2. **Both ends find a silently dead peer.** A control plane whose packets are dropped (a partition, a node gone
   without a FIN) looks like an idle stream forever. Each end pings after ``time`` seconds without reading
   anything and closes the connection when the PING ACK does not arrive within ``timeout`` seconds. A dead peer
   is therefore noticed at most ``time + timeout`` seconds (40 s with the defaults) after the last frame it sent
   (:attr:`KeepaliveSettings.detection_bound`); the xDS client then reconnects with its back-off.

gRPC core needs three more settings for that to hold: it stops a client's pings after two without data unless
``max_pings_without_data`` is 0; it spaces pings by at least ``min_time_between_pings``; and it waits for the ACK
``ping_timeout``, not only ``keepalive_timeout`` (without it a silent peer went unnoticed for far longer than the
bound). Both are set from ``time`` and ``timeout``. The node proxy's own xDS and CA clients do not use grpcio:
:mod:`ambit.xds.grpc_channel` applies ``time`` and ``timeout`` itself (a PING after ``time`` seconds of silence,
the connection dropped when its ACK is ``timeout`` late), with the same bound; :meth:`client_options` is for
grpcio clients.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_KEEPALIVE", "GrpcOptions", "KeepaliveSettings"]

GrpcOptions = tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class KeepaliveSettings:
    """Keepalive of one end of the control-plane connection (istiod's and ztunnel's defaults)."""

    time: float = 30.0
    """Seconds without activity before a PING is sent."""
    timeout: float = 10.0
    """Seconds to wait for the PING ACK before the connection is considered dead and closed."""
    min_peer_ping_interval: float = 15.0
    """(Server) the shortest interval between a client's pings without data that is tolerated."""

    @property
    def detection_bound(self) -> float:
        """At most this many seconds pass between a peer's last frame and this end closing the connection."""
        return self.time + self.timeout

    def server_options(self) -> GrpcOptions:
        """Channel options for a ``grpc.aio.server``: tolerate pings every ``min_peer_ping_interval``, ping idle
        clients every ``time``."""
        return (
            ("grpc.keepalive_time_ms", _ms(self.time)),
            ("grpc.keepalive_timeout_ms", _ms(self.timeout)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", _ms(self.min_peer_ping_interval)),
            ("grpc.http2.max_ping_strikes", 2),
            ("grpc.http2.ping_timeout_ms", _ms(self.timeout)),
        )

    def client_options(self) -> GrpcOptions:
        """Channel options for a client channel: ping every ``time`` when idle, give up after ``timeout``."""
        return (
            ("grpc.keepalive_time_ms", _ms(self.time)),
            ("grpc.keepalive_timeout_ms", _ms(self.timeout)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.http2.min_time_between_pings_ms", _ms(self.time)),
            ("grpc.http2.ping_timeout_ms", _ms(self.timeout)),
        )


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


DEFAULT_KEEPALIVE = KeepaliveSettings()
