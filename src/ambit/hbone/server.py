"""The server end of HBONE: accepts plain CONNECT requests (RFC 9113 §8.5, spec §6.1) and never opens streams.

Requests are validated here rather than by h2 so that a bad request costs one stream, not the pooled connection:

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

import h2.events
from h2.errors import ErrorCodes
from h2.exceptions import H2Error

from ambit.hbone.connection import HboneConnection, _Stream
from ambit.hbone.errors import AuthorityError, HboneError
from ambit.hbone.events import Event, TunnelRejected, TunnelRequested
from ambit.hbone.headers import parse_authority

_FIELD_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9a-z]+")
_BAD_VALUE = re.compile(rb"[\r\n\0]")
_CONNECTION_SPECIFIC = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"})


class HboneServerConnection(HboneConnection):
    """One HTTP/2 connection seen from the side that accepts tunnels."""

    _client_side = False

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
        if status != 200:
            self._forget(stream_id)
            self._answer_and_finish(stream_id, fields, stream.remote_closed)
            return
        try:
            self._h2.send_headers(stream_id, fields)
        except H2Error as e:
            raise HboneError(f"cannot respond on stream {stream_id}: {e}") from e
        stream.ready = True
        if (stream.queue or stream.end_requested) and not self._send_queued(stream_id, stream):
            self._blocked[stream_id] = None

    def _dispatch_headers(self, event: h2.events.Event, events: list[Event]) -> None:
        if not isinstance(event, h2.events.RequestReceived):
            return  # trailers and the rest carry nothing for HBONE
        stream_id = event.stream_id or 0
        verdict = _check_connect(event.headers or [])
        if isinstance(verdict, str):
            self._answer_and_finish(stream_id, [(":status", "400")], event.stream_ended is not None)
            events.append(TunnelRejected(stream_id, 400, verdict))
            return
        authority, headers = verdict
        self._streams[stream_id] = _Stream()
        events.append(TunnelRequested(stream_id, authority, headers))

    def _answer_and_finish(self, stream_id: int, fields: list[tuple[str, str]], remote_closed: bool) -> None:
        try:
            self._h2.send_headers(stream_id, fields, end_stream=True)
            if not remote_closed:
                self._h2.reset_stream(stream_id, ErrorCodes.NO_ERROR)
        except H2Error:
            pass


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
        if not _FIELD_NAME.fullmatch(name):
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
