"""What an HBONE connection reports from ``receive_data``: past-tense facts, in the order they happened.

Stream lifecycle as seen through events (client view on the left, server view on the right)::

    open_tunnel()  ──CONNECT──▶  TunnelRequested          (or TunnelRejected: the core answered 400 itself)
    TunnelEstablished ◀──200──  respond(200)              (or TunnelRefused ◀── respond(401/503/...))
    DataReceived ◀────DATA────▶ DataReceived              every one must be matched by consumed(flow_length)
    StreamEnded ◀──END_STREAM──▶ StreamEnded               the peer half-closed; we may still send
    StreamReset ◀────RST──────▶ StreamReset               the stream is gone both ways
    StreamWritable                                        queued outbound data was all framed after a window grew
    PingAcknowledged              ping(payload)           the peer answered our PING (liveness, either side)
    ConnectionDraining            go_away()               graceful GOAWAY: streams in flight go on, none may be opened
    ConnectionTerminated                                  GOAWAY with an error, or a protocol error: no stream survives
"""

from __future__ import annotations

from dataclasses import dataclass

Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class TunnelRequested:
    """Server: a valid plain CONNECT arrived; answer with ``respond(stream_id, status)``."""

    stream_id: int
    authority: str
    headers: Headers


@dataclass(frozen=True, slots=True)
class TunnelRejected:
    """Server: a request that is not a valid plain CONNECT; the core already answered ``status`` and ended it."""

    stream_id: int
    status: int
    reason: str


@dataclass(frozen=True, slots=True)
class TunnelEstablished:
    """Client: the server answered 200; data may flow both ways."""

    stream_id: int
    headers: Headers


@dataclass(frozen=True, slots=True)
class TunnelRefused:
    """Client: the server answered with a status other than 200; the stream is done."""

    stream_id: int
    status: int
    headers: Headers


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """Server of HTTP/2 requests (:mod:`ambit.hbone.messages`): a valid request head arrived; answer with
    ``respond``. ``StreamEnded`` follows at once for a request without a body."""

    stream_id: int
    method: str
    scheme: str
    authority: str
    path: str
    headers: Headers


@dataclass(frozen=True, slots=True)
class RequestRejected:
    """Server of HTTP/2 requests: a malformed request head; the core reset the stream (PROTOCOL_ERROR)."""

    stream_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class ResponseReceived:
    """Client of HTTP/2 requests: the final response head arrived (1xx heads are dropped)."""

    stream_id: int
    status: int
    headers: Headers


@dataclass(frozen=True, slots=True)
class TrailersReceived:
    """Either side of HTTP/2 requests: the trailer fields that end a message; ``StreamEnded`` follows."""

    stream_id: int
    headers: Headers


@dataclass(frozen=True, slots=True)
class DataReceived:
    """Bytes for a stream. The caller must later call ``consumed(stream_id, flow_length)`` to reopen windows.

    ``data`` may be a read-only memoryview of the received bytes (never of a buffer that is reused).
    """

    stream_id: int
    data: bytes | memoryview
    flow_length: int


@dataclass(frozen=True, slots=True)
class StreamEnded:
    """The peer half-closed the stream (END_STREAM)."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class StreamReset:
    """The stream was reset, by the peer (``remote``) or by this end because of a stream error."""

    stream_id: int
    error_code: int
    remote: bool


@dataclass(frozen=True, slots=True)
class StreamWritable:
    """All data queued for the stream has been framed; a paused reader may resume."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class ConnectionDraining:
    """A graceful GOAWAY (NO_ERROR) received: streams up to ``last_stream_id`` go on to their end; no new stream
    may be opened on the connection (ours above that id were never processed: each got a ``StreamReset``
    REFUSED_STREAM, safe to retry elsewhere)."""

    last_stream_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class PingAcknowledged:
    """The peer answered a PING this end sent with ``ping(payload)`` (unsolicited acknowledgements are dropped)."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class ConnectionTerminated:
    """GOAWAY received, or the peer broke a rule and we sent GOAWAY; no stream survives."""

    error_code: int
    last_stream_id: int | None
    reason: str


Event = (
    ConnectionDraining
    | TunnelRequested
    | TunnelRejected
    | TunnelEstablished
    | TunnelRefused
    | RequestReceived
    | RequestRejected
    | ResponseReceived
    | TrailersReceived
    | DataReceived
    | StreamEnded
    | StreamReset
    | StreamWritable
    | PingAcknowledged
    | ConnectionTerminated
)
