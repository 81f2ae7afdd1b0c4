"""The server end of HBONE: accepts plain CONNECT requests (RFC 9113 §8.5, spec §6.1) and never opens streams.

Requests are validated here so that a bad request costs one stream, not the pooled connection:

1. Pseudo-headers come first, once each, and are exactly ``:method`` and ``:authority`` (no ``:scheme``,
   ``:path`` or ``:protocol``: that would be a regular request or an extended CONNECT).
2. ``:method`` is ``CONNECT``; ``:authority`` parses with :func:`parse_authority`.
3. Regular header names are lowercase tokens, values have no CR/LF/NUL and are UTF-8, and no connection-specific
   header appears (RFC 9113 §8.2.2).

A request that breaks a rule is answered ``400`` with END_STREAM, followed by RST_STREAM(NO_ERROR) if the client
has not finished sending, and reported as ``TunnelRejected``; the stream never enters the stream table. A valid
request is ``TunnelRequested``; the application answers with :meth:`HboneServerConnection.respond`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ambit.hbone import wire
from ambit.hbone.connection import HboneConnection
from ambit.hbone.errors import AuthorityError, HboneError, HboneProtocolError
from ambit.hbone.events import Event, StreamEnded, TunnelRejected, TunnelRequested
from ambit.hbone.headers import parse_authority
from ambit.hbone.receiving import RawHeaders
from ambit.model.field_names import LOWER_TOKEN_BYTES

_BAD_VALUE = re.compile(rb"[\r\n\0]")
_CONNECTION_SPECIFIC = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"})


class HboneServerConnection(HboneConnection):
    """One HTTP/2 connection seen from the side that accepts tunnels."""

    _client_side = False
    _graceful_goaway = True
    _literal_headers = True

    def respond(self, stream_id: int, status: int, headers: Sequence[tuple[str, str]] = ()) -> None:
        """Answer a ``TunnelRequested``: 200 opens the tunnel for data, any other status ends the stream."""
        if not 200 <= status <= 599:
            raise HboneError(f"respond needs a final status (200-599), got {status}")
        stream = self._streams.get(stream_id)
        if stream is None:
            return  # reset by the client, or the connection closed, before we answered
        if stream.ready:
            raise HboneError(f"stream {stream_id} was already answered")
        fields = [(":status", str(status)), *headers]
        if self._early_resets:
            self._early_resets -= 1
        if status != 200:
            self._forget(stream_id)
            self._answer_and_finish(stream_id, fields, stream.remote_closed)
            return
        self._send_headers(stream_id, fields)
        stream.ready = True
        if (stream.queue or stream.end_requested) and not self._send_queued(stream_id, stream):
            self._blocked[stream_id] = None

    def _on_headers(self, stream_id: int, headers: RawHeaders, end_stream: bool, events: list[Event]) -> None:
        if stream_id in self._streams:
            self._trailers(stream_id, end_stream, events)
            return
        if not stream_id & 1:
            raise HboneProtocolError(wire.PROTOCOL_ERROR, f"a client opened even stream {stream_id}")
        if stream_id <= self._highest_peer:
            self._out.append(wire.rst_stream(stream_id, wire.STREAM_CLOSED))  # trailers of a stream we finished
            self._count_early_reset()
            return
        self._highest_peer = stream_id
        if self._going_away_final or len(self._streams) >= self._settings.max_concurrent_streams:
            self._out.append(wire.rst_stream(stream_id, wire.REFUSED_STREAM))
            return
        verdict = _check_connect(headers)
        if isinstance(verdict, str):
            self._answer_and_finish(stream_id, [(":status", "400")], end_stream)
            events.append(TunnelRejected(stream_id, 400, verdict))
            return
        authority, fields = verdict
        stream = self._new_stream(stream_id)
        events.append(TunnelRequested(stream_id, authority, fields))
        if end_stream:
            stream.remote_closed = True
            events.append(StreamEnded(stream_id))

    def _answer_and_finish(self, stream_id: int, fields: list[tuple[str, str]], remote_closed: bool) -> None:
        self._send_headers(stream_id, fields, end_stream=True)
        if not remote_closed:
            self._out.append(wire.rst_stream(stream_id, wire.NO_ERROR))


def _check_connect(raw: Sequence[tuple[bytes, bytes]]) -> tuple[str, tuple[tuple[str, str], ...]] | str:
    """Return (authority, regular headers) for a valid plain CONNECT, or the reason it is not one."""
    pseudo: dict[bytes, bytes] = {}
    regular: list[tuple[str, str]] = []
    for name, value in raw:
        if name.startswith(b":"):
            if regular:
                return "pseudo-header after a regular header"
            if name not in (b":method", b":authority"):
                return f"{name.decode('ascii', 'replace')} is not allowed in a plain CONNECT"
            if name in pseudo:
                return f"duplicate {name.decode()}"
            pseudo[name] = value
            continue
        if not LOWER_TOKEN_BYTES.fullmatch(name):
            return f"invalid header name {name!r}"
        if name in _CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):
            return f"connection-specific header {name.decode()}"
        if _BAD_VALUE.search(value):
            return f"header {name.decode()} has CR, LF or NUL in its value"
        try:
            regular.append((name.decode("ascii"), value.decode("utf-8")))
        except UnicodeDecodeError:
            return f"header {name.decode()} is not UTF-8"
    method = pseudo.get(b":method")
    if method != b"CONNECT":
        return "missing :method" if method is None else f"method {method.decode('ascii', 'replace')} is not CONNECT"
    raw_authority = pseudo.get(b":authority")
    if raw_authority is None:
        return "missing :authority"
    try:
        authority = raw_authority.decode("ascii")
        parse_authority(authority)
    except (UnicodeDecodeError, AuthorityError) as e:
        return f"bad :authority: {e}"
    return authority, tuple(regular)
