"""The client end of HBONE: opens one CONNECT stream per tunnel on odd stream ids (spec §6.1, §6.2).

A tunnel is established by a 200 response; data queued with ``send_data`` before that waits and is framed once
the 200 arrives. Any other final status refuses the tunnel: the stream is finished on our side too (END_STREAM if
the server ended it, RST_STREAM CANCEL if not) and leaves the stream table. Informational (1xx) responses and
trailers carry nothing for HBONE and are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import h2.events
from h2.errors import ErrorCodes
from h2.exceptions import H2Error

from ambit.hbone.connection import HboneConnection, _Stream
from ambit.hbone.errors import HboneError
from ambit.hbone.events import Event, Headers, TunnelEstablished, TunnelRefused
from ambit.hbone.headers import parse_authority

_FIELD_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]+")
_CONNECTION_SPECIFIC = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"})


class HboneClientConnection(HboneConnection):
    """One pooled HTTP/2 connection seen from the side that opens tunnels."""

    _client_side = True

    @property
    def can_open_tunnel(self) -> bool:
        """True while below min(our limit, the peer's MAX_CONCURRENT_STREAMS) and not closing or closed."""
        if self._closed:
            return False
        limit = min(self._settings.max_concurrent_streams, self._h2.remote_settings.max_concurrent_streams)
        return len(self._streams) < limit and self._h2.open_outbound_streams < limit

    def open_tunnel(self, authority: str, headers: Sequence[tuple[str, str]] = ()) -> int:
        """Send a plain CONNECT for ``authority`` with extra regular ``headers``; return the new stream id."""
        parse_authority(authority)
        for name, value in headers:
            if not _FIELD_NAME.fullmatch(name) or name in _CONNECTION_SPECIFIC:
                raise HboneError(f"header name {name!r} is not allowed in an HBONE CONNECT")
            if any(c in value for c in "\r\n\0"):
                raise HboneError(f"header {name!r} has a value with CR, LF or NUL")
        if not self.can_open_tunnel:
            raise HboneError("cannot open a tunnel: the connection is closed or at its stream limit")
        stream_id = self._h2.get_next_available_stream_id()
        try:
            self._h2.send_headers(stream_id, [(":method", "CONNECT"), (":authority", authority), *headers])
        except H2Error as e:
            raise HboneError(f"cannot open a tunnel: {e}") from e
        self._streams[stream_id] = _Stream()
        return stream_id

    def _dispatch_headers(self, event: h2.events.Event, events: list[Event]) -> None:
        if isinstance(event, h2.events.RequestReceived):
            # A server opened a stream: HBONE servers never do (RFC 9113 §5.1.1 makes it a connection error).
            events.extend(self._terminate(ErrorCodes.PROTOCOL_ERROR, "peer opened a stream from the server side"))
            return
        if not isinstance(event, h2.events.ResponseReceived):
            return
        stream_id = event.stream_id or 0
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        status, headers = _split_response(event.headers or [])
        if status == 200:
            stream.ready = True
            if stream.queue or stream.end_requested:
                self._blocked[stream_id] = None
            events.append(TunnelEstablished(stream_id, headers))
            return
        self._forget(stream_id)
        events.append(TunnelRefused(stream_id, status, headers))
        try:
            if event.stream_ended is not None:
                self._h2.end_stream(stream_id)
            else:
                self._h2.reset_stream(stream_id, ErrorCodes.CANCEL)
        except H2Error:
            pass


def _split_response(raw: Sequence[tuple[bytes, bytes]]) -> tuple[int, Headers]:
    """h2 has validated the response already: one numeric :status, pseudo-headers first."""
    status = 0
    headers: list[tuple[str, str]] = []
    for name, value in raw:
        if name == b":status":
            status = int(value)
        elif not name.startswith(b":"):
            headers.append((name.decode("ascii", "replace"), value.decode("utf-8", "replace")))
    return status, tuple(headers)
