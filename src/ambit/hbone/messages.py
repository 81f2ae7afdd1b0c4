"""HTTP/2 requests and responses (RFC 9113 §8) on the same engine as HBONE: what a waypoint needs for gRPC.

Theory of operation: :class:`Http2ServerConnection` accepts requests (the client's streams), and
:class:`Http2ClientConnection` sends them; both are :class:`~ambit.hbone.connection.HboneConnection` subclasses,
so framing, flow control, the stream table and the peer's budgets (rules A-C of ``budgets.py``: rapid reset,
control-frame floods, header-block size) are the engine's. What is added here is the reading of header blocks as
requests, responses and trailers, and sending trailers.

Rules:

1. A request head has ``:method``, ``:scheme``, ``:path`` and ``:authority`` (or a ``host`` header), pseudo-headers
   first and once each; ``CONNECT`` and ``:protocol`` are refused (a waypoint routes requests, it opens no further
   tunnels). Regular names are lower-case tokens, values carry no CR, LF or NUL, and no connection-specific header
   appears (``te`` only as ``trailers``), RFC 9113 §8.2. A request that breaks a rule is reset with
   PROTOCOL_ERROR (``RequestRejected``) and costs one unit of rule A's budget, so a flood of bad heads ends the
   connection.
2. A server stream beyond our MAX_CONCURRENT_STREAMS is refused (RST_STREAM REFUSED_STREAM) and also costs one
   unit of rule A: a client that ignores the limit cannot make us hold more than the limit, nor decode heads for
   free forever.
3. A second header block on a stream is the trailers: it must end the stream and hold no pseudo-header, else the
   stream is reset (PROTOCOL_ERROR). ``TrailersReceived`` then ``StreamEnded`` report it.
4. Client: a stream's DATA before its final response head is a stream error (PROTOCOL_ERROR, ``StreamReset``);
   1xx heads are dropped; a response head that breaks rule 1's field rules resets the stream.
5. Sending trailers (:meth:`send_trailers`) ends our half of the stream with a HEADERS frame after all queued
   DATA is framed: when flow control holds data back, the trailers wait with it and go out once the queue drains.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ambit.hbone import wire
from ambit.hbone.client import _split_response
from ambit.hbone.connection import HboneConnection
from ambit.hbone.errors import HboneError, HboneProtocolError
from ambit.hbone.events import (
    DataReceived,
    Event,
    Headers,
    RequestReceived,
    RequestRejected,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    StreamWritable,
    TrailersReceived,
)
from ambit.hbone.receiving import RawHeaders
from ambit.hbone.settings import HboneSettings
from ambit.hbone.state import _Stream
from ambit.model.field_names import LOWER_TOKEN, LOWER_TOKEN_BYTES

_BAD_VALUE = re.compile(rb"[\r\n\0]")
_CONNECTION_SPECIFIC = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"})
_LOCAL_CONNECTION_SPECIFIC = frozenset(name.decode() for name in _CONNECTION_SPECIFIC)
_REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":path", b":authority"})
_DEFAULTS = HboneSettings()


class _Messages(HboneConnection):
    """What both ends of HTTP/2 requests share: trailers (rules 3 and 5)."""

    def __init__(self, settings: HboneSettings = _DEFAULTS) -> None:
        super().__init__(settings)
        self._held_trailers: dict[int, list[tuple[str, str]]] = {}

    def receive_data(self, data: bytes) -> list[Event]:
        events = super().receive_data(data)
        if self._held_trailers:
            for event in events:
                if isinstance(event, StreamWritable) and event.stream_id in self._held_trailers:
                    self._send_trailers_now(event.stream_id, self._held_trailers.pop(event.stream_id))
        return events

    def is_open(self, stream_id: int) -> bool:
        """The stream is still in the table: one of its halves is open (and it was not reset)."""
        return stream_id in self._streams

    def send_trailers(self, stream_id: int, headers: Sequence[tuple[str, str]]) -> None:
        """End our half of the stream with trailer fields (rule 5); without fields, END_STREAM on empty DATA."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        if not stream.ready or stream.end_requested:
            raise HboneError(f"trailers on stream {stream_id} before its head or after its end")
        fields = _checked_fields(headers)
        if not fields:
            self.end_stream(stream_id)
        elif stream.queue:
            self._held_trailers[stream_id] = fields  # end_requested stays clear: the trailers end the stream
        else:
            self._send_trailers_now(stream_id, fields)

    def _send_trailers_now(self, stream_id: int, fields: list[tuple[str, str]]) -> None:
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        self._send_headers(stream_id, fields, end_stream=True)
        stream.end_requested = stream.local_closed = True
        self._maybe_finished(stream_id, stream)

    def _forget(self, stream_id: int) -> _Stream | None:
        self._held_trailers.pop(stream_id, None)
        return super()._forget(stream_id)

    def _drop_all(self) -> None:
        self._held_trailers.clear()
        super()._drop_all()

    def _trailer_block(
        self, stream_id: int, stream: _Stream, raw: RawHeaders, end_stream: bool, events: list[Event]
    ) -> None:
        """Rule 3: a second header block on a stream."""
        if stream.remote_closed:
            self._stream_error(stream_id, wire.STREAM_CLOSED, events)
            return
        fields = _regular_fields(raw) if end_stream else None
        if fields is None:
            self._stream_error(stream_id, wire.PROTOCOL_ERROR, events)
            return
        events.append(TrailersReceived(stream_id, fields))
        self._remote_end(stream_id, events)


class Http2ServerConnection(_Messages):
    """The end that accepts HTTP/2 requests (h2c with prior knowledge inside a tunnel, for a waypoint)."""

    _client_side = False

    def respond(
        self, stream_id: int, status: int, headers: Sequence[tuple[str, str]] = (), *, end_stream: bool = False
    ) -> None:
        """Send the response head (a final status, 200-599); with ``end_stream``, the whole response."""
        if not 200 <= status <= 599:
            raise HboneError(f"respond needs a final status (200-599), got {status}")
        stream = self._streams.get(stream_id)
        if stream is None:
            return  # reset by the client, or the connection closed, before we answered
        if stream.ready:
            raise HboneError(f"stream {stream_id} was already answered")
        if self._early_resets:
            self._early_resets -= 1
        self._send_headers(stream_id, [(":status", str(status)), *_checked_fields(headers)], end_stream=end_stream)
        stream.ready = True
        if end_stream:
            stream.end_requested = stream.local_closed = True
            self._maybe_finished(stream_id, stream)

    def _on_headers(self, stream_id: int, headers: RawHeaders, end_stream: bool, events: list[Event]) -> None:
        stream = self._streams.get(stream_id)
        if stream is not None:
            self._trailer_block(stream_id, stream, headers, end_stream, events)
            return
        if not stream_id & 1:
            raise HboneProtocolError(wire.PROTOCOL_ERROR, f"a client opened even stream {stream_id}")
        if stream_id <= self._highest_peer:
            self._out.append(wire.rst_stream(stream_id, wire.STREAM_CLOSED))  # HEADERS on a stream we finished
            self._count_early_reset()
            return
        self._highest_peer = stream_id
        if len(self._streams) >= self._settings.max_concurrent_streams:  # rule 2
            self._out.append(wire.rst_stream(stream_id, wire.REFUSED_STREAM))
            self._count_early_reset()
            return
        verdict = _check_request(headers)
        if isinstance(verdict, str):  # rule 1
            self._out.append(wire.rst_stream(stream_id, wire.PROTOCOL_ERROR))
            events.append(RequestRejected(stream_id, verdict))
            self._count_early_reset()
            return
        stream = self._new_stream(stream_id)
        events.append(RequestReceived(stream_id, *verdict))
        if end_stream:
            stream.remote_closed = True
            events.append(StreamEnded(stream_id))


class Http2ClientConnection(_Messages):
    """The end that sends HTTP/2 requests (a waypoint to an endpoint that speaks h2c)."""

    _client_side = True

    def __init__(self, settings: HboneSettings = _DEFAULTS) -> None:
        super().__init__(settings)
        self._awaiting: set[int] = set()  # streams whose final response head has not arrived

    @property
    def can_open_stream(self) -> bool:
        """True while below min(our limit, the peer's MAX_CONCURRENT_STREAMS) and not closing or closed."""
        if self._closed or self._next_id > wire.STREAM_ID_MASK:
            return False
        return len(self._streams) < min(self._settings.max_concurrent_streams, self._peer_max_streams)

    def send_request(
        self,
        method: str,
        scheme: str,
        authority: str,
        path: str,
        headers: Sequence[tuple[str, str]] = (),
        *,
        end_stream: bool = False,
    ) -> int:
        """Send a request head; return its stream id. DATA may follow at once (``send_data``)."""
        if method == "CONNECT" or not method or not path or not scheme:
            raise HboneError(f"not a request this end sends: {method} {scheme}://{authority}{path}")
        pseudo = [(":method", method), (":scheme", scheme), (":authority", authority), (":path", path)]
        for name, value in pseudo:
            if "\r" in value or "\n" in value or "\0" in value:
                raise HboneError(f"{name} has CR, LF or NUL")
        fields = _checked_fields(headers)
        if not self.can_open_stream:
            raise HboneError("cannot open a stream: the connection is closed or at its stream limit")
        stream_id = self._next_id
        self._next_id += 2
        self._send_headers(stream_id, [*pseudo, *fields], end_stream=end_stream)
        stream = self._new_stream(stream_id)
        stream.ready = True
        stream.end_requested = stream.local_closed = end_stream
        self._awaiting.add(stream_id)
        return stream_id

    def receive_data(self, data: bytes) -> list[Event]:
        events = super().receive_data(data)
        if not self._awaiting:
            return events
        out: list[Event] = []
        for event in events:  # rule 4: DATA (or its END_STREAM) before the response head
            if isinstance(event, (DataReceived, StreamEnded)) and event.stream_id in self._awaiting:
                sid = event.stream_id
                if isinstance(event, DataReceived):
                    self.consumed(sid, event.flow_length)
                self._awaiting.discard(sid)
                self._out.append(wire.rst_stream(sid, wire.PROTOCOL_ERROR))
                if self._forget(sid) is not None or isinstance(event, StreamEnded):
                    out.append(StreamReset(sid, wire.PROTOCOL_ERROR, remote=False))
                continue
            out.append(event)
        return out

    def _forget(self, stream_id: int) -> _Stream | None:
        self._awaiting.discard(stream_id)
        return super()._forget(stream_id)

    def _drop_all(self) -> None:
        self._awaiting.clear()
        super()._drop_all()

    def _on_headers(self, stream_id: int, headers: RawHeaders, end_stream: bool, events: list[Event]) -> None:
        if self._is_idle(stream_id):
            raise HboneProtocolError(wire.PROTOCOL_ERROR, f"HEADERS on stream {stream_id}, which we never opened")
        stream = self._streams.get(stream_id)
        if stream is None:
            return  # a stream we already finished or reset
        if stream_id not in self._awaiting:
            self._trailer_block(stream_id, stream, headers, end_stream, events)
            return
        response = _split_response(headers)
        if response is None:
            self._stream_error(stream_id, wire.PROTOCOL_ERROR, events)
            return
        status, fields = response
        if status < 200:  # rule 4: informational, the final answer is still to come
            if end_stream:
                self._stream_error(stream_id, wire.PROTOCOL_ERROR, events)
            return
        self._awaiting.discard(stream_id)
        events.append(ResponseReceived(stream_id, status, fields))
        if end_stream:
            self._remote_end(stream_id, events)


def _checked_fields(headers: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Our own regular fields, checked: a value HTTP/2 cannot carry is the caller's error (HboneError)."""
    out = []
    for name, value in headers:
        if not LOWER_TOKEN.fullmatch(name) or name in _LOCAL_CONNECTION_SPECIFIC:
            raise HboneError(f"header name {name!r} cannot be sent over HTTP/2")
        if "\r" in value or "\n" in value or "\0" in value:
            raise HboneError(f"header {name!r} has a value with CR, LF or NUL")
        out.append((name, value))
    return out


def _regular_fields(raw: RawHeaders) -> Headers | None:
    """The fields of a header block that may hold no pseudo-header (trailers), or None when one breaks rule 1."""
    out = []
    for name, value in raw:
        field = _regular_field(name, value)
        if field is None:
            return None
        out.append(field)
    return tuple(out)


def _regular_field(name: bytes, value: bytes) -> tuple[str, str] | None:
    if not LOWER_TOKEN_BYTES.fullmatch(name) or name in _CONNECTION_SPECIFIC or _BAD_VALUE.search(value):
        return None
    if name == b"te" and value != b"trailers":
        return None
    return name.decode("ascii"), value.decode("latin-1")


def _check_request(raw: RawHeaders) -> tuple[str, str, str, str, Headers] | str:
    """(method, scheme, authority, path, regular headers) of a valid request head (rule 1), or why not."""
    pseudo: dict[bytes, bytes] = {}
    regular: list[tuple[str, str]] = []
    for name, value in raw:
        if name.startswith(b":"):
            if regular:
                return "pseudo-header after a regular header"
            if name not in _REQUEST_PSEUDO:
                return f"{name.decode('ascii', 'replace')} is not a request pseudo-header"
            if name in pseudo:
                return f"duplicate {name.decode()}"
            if _BAD_VALUE.search(value):
                return f"{name.decode()} has CR, LF or NUL"
            pseudo[name] = value
            continue
        field = _regular_field(name, value)
        if field is None:
            return f"header {name.decode('ascii', 'replace')[:64]!r} is not allowed or malformed"
        regular.append(field)
    method = pseudo.get(b":method")
    if method is None or method == b"CONNECT":
        return "missing :method" if method is None else "CONNECT is not routed"
    scheme, path = pseudo.get(b":scheme"), pseudo.get(b":path")
    if not scheme or not path:
        return "missing :scheme or :path"
    authority = pseudo.get(b":authority", b"").decode("latin-1")
    if not authority:
        authority = next((v for n, v in regular if n == "host"), "")
    headers = tuple((n, v) for n, v in regular if n != "host")
    return method.decode("latin-1"), scheme.decode("latin-1"), authority, path.decode("latin-1"), headers
