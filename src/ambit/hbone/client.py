"""The client end of HBONE: opens one CONNECT stream per tunnel on odd stream ids (spec §6.1, §6.2).

A tunnel is established by a 200 response; data queued with ``send_data`` before that waits and is framed once
the 200 arrives. Any other final status refuses the tunnel: the stream is finished on our side too (END_STREAM if
the server ended it, RST_STREAM CANCEL if not) and leaves the stream table. Informational (1xx) responses and
trailers carry nothing for HBONE and are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ambit.hbone import wire
from ambit.hbone.connection import HboneConnection
from ambit.hbone.errors import HboneError, HboneProtocolError
from ambit.hbone.events import Event, Headers, TunnelEstablished, TunnelRefused
from ambit.hbone.headers import parse_authority
from ambit.hbone.receiving import RawHeaders
from ambit.model.field_names import LOWER_TOKEN, LOWER_TOKEN_BYTES

_BAD_VALUE = re.compile(rb"[\r\n\0]")
_CONNECTION_SPECIFIC = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"})
_RAW_CONNECTION_SPECIFIC = frozenset(name.encode() for name in _CONNECTION_SPECIFIC)


class HboneClientConnection(HboneConnection):
    """One pooled HTTP/2 connection seen from the side that opens tunnels."""

    _client_side = True
    _graceful_goaway = True
    _literal_headers = True

    @property
    def can_open_tunnel(self) -> bool:
        """True while below min(our limit, the peer's MAX_CONCURRENT_STREAMS) and not draining, closing or closed."""
        if self._closed or self.draining or self._next_id > wire.STREAM_ID_MASK:
            return False
        return len(self._streams) < min(self._settings.max_concurrent_streams, self._peer_max_streams)

    def open_tunnel(self, authority: str, headers: Sequence[tuple[str, str]] = ()) -> int:
        """Send a plain CONNECT for ``authority`` with extra regular ``headers``; return the new stream id."""
        parse_authority(authority)
        for name, value in headers:
            if not LOWER_TOKEN.fullmatch(name) or name in _CONNECTION_SPECIFIC:
                raise HboneError(f"header name {name!r} is not allowed in an HBONE CONNECT")
            if "\r" in value or "\n" in value or "\0" in value:
                raise HboneError(f"header {name!r} has a value with CR, LF or NUL")
        if not self.can_open_tunnel:
            raise HboneError("cannot open a tunnel: the connection is closed, draining or at its stream limit")
        stream_id = self._next_id
        self._next_id += 2
        self._send_headers(stream_id, [(":method", "CONNECT"), (":authority", authority), *headers])
        self._new_stream(stream_id)
        return stream_id

    def _on_headers(self, stream_id: int, headers: RawHeaders, end_stream: bool, events: list[Event]) -> None:
        if self._is_idle(stream_id):
            # A server opened a stream: HBONE servers never do (RFC 9113 §5.1.1 makes it a connection error).
            raise HboneProtocolError(wire.PROTOCOL_ERROR, f"HEADERS on stream {stream_id}, which we never opened")
        stream = self._streams.get(stream_id)
        if stream is None:
            return  # a stream we already finished or reset
        if stream.ready:
            self._trailers(stream_id, end_stream, events)
            return
        response = _split_response(headers)
        if response is None:
            self._stream_error(stream_id, wire.PROTOCOL_ERROR, events)
            return
        status, fields = response
        if status < 200:  # informational: the final answer is still to come
            if end_stream:
                self._stream_error(stream_id, wire.PROTOCOL_ERROR, events)
            return
        if status == 200:
            stream.ready = True
            if stream.queue or stream.end_requested:
                self._blocked[stream_id] = None
            events.append(TunnelEstablished(stream_id, fields))
            if end_stream:
                self._remote_end(stream_id, events)
            return
        self._forget(stream_id)
        events.append(TunnelRefused(stream_id, status, fields))
        if end_stream:
            self._out.append(wire.frame(wire.DATA, wire.END_STREAM, stream_id))
        else:
            self._out.append(wire.rst_stream(stream_id, wire.CANCEL))


def _split_response(raw: RawHeaders) -> tuple[int, Headers] | None:
    """(status, regular headers) of a well-formed response header block (RFC 9113 §8.3.2), else None."""
    status: int | None = None
    headers: list[tuple[str, str]] = []
    for name, value in raw:
        if name.startswith(b":"):
            if name != b":status" or status is not None or headers:
                return None
            if len(value) != 3 or not value.isdigit() or value == b"101":
                return None
            status = int(value)
            continue
        if not LOWER_TOKEN_BYTES.fullmatch(name) or name in _RAW_CONNECTION_SPECIFIC or _BAD_VALUE.search(value):
            return None
        headers.append((name.decode("ascii"), value.decode("utf-8", "replace")))
    if status is None or status < 100:
        return None
    return status, tuple(headers)
