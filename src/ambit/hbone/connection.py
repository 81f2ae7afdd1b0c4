"""The shared core of both HBONE ends: h2's state machine plus our send queues and the event translation.

Theory of operation. ``receive_data`` feeds bytes to h2 and turns h2's events into :mod:`ambit.hbone.events`; the
subclasses (``client.py``, ``server.py``) interpret the HEADERS of their side. Outbound data never goes to h2 until
the windows allow it: ``send_data`` appends to a per-stream queue, and ``_flush`` frames as much as the peer's
stream and connection windows and the frame size permit, in chunks of at most ``send_chunk`` (64 KiB frames beat
1 MiB ones in Python). Streams with data left over wait in ``_blocked``; when a later ``receive_data`` drains one
(WINDOW_UPDATE or SETTINGS arrived), a ``StreamWritable`` event tells the shell to resume its reader.

Inbound flow control is the caller's: h2 reopens our windows only from ``consumed()``, in batches (a WINDOW_UPDATE
once half a window is used up), so a slow application holds at most 4 MiB per stream and 16 MiB per connection.

Invariants:
1. ``_streams`` holds exactly the streams the application knows and that are not finished; a stream leaves it
   when both halves are closed, on any reset, on a refused or rejected tunnel, and all at once on termination.
2. After ``ConnectionTerminated`` or ``close()`` the connection keeps no stream state and ignores input; the
   GOAWAY it queued is still returned by ``data_to_send()``.
3. Nothing the peer sends makes ``receive_data`` raise: h2 errors become GOAWAY + ``ConnectionTerminated``.
4. Calls on streams that are already gone (a reset can race the application) are no-ops.
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass
from typing import ClassVar

import h2.events
from h2.config import H2Configuration
from h2.connection import ConnectionState, H2Connection
from h2.errors import ErrorCodes
from h2.exceptions import H2Error, ProtocolError
from h2.settings import SettingCodes, Settings

from ambit.hbone import framing
from ambit.hbone.errors import HboneError
from ambit.hbone.events import ConnectionTerminated, DataReceived, Event, StreamEnded, StreamReset, StreamWritable

_DEFAULT_WINDOW = 65535
_MAX_HEADER_LIST = 64 * 1024


@dataclass(frozen=True, slots=True)
class HboneSettings:
    """HTTP/2 parameters of one HBONE connection (spec §1.3, §6.2)."""

    #: Receive window of each stream (SETTINGS_INITIAL_WINDOW_SIZE).
    stream_window: int = 4 * 1024 * 1024
    #: Receive window of the whole connection (raised by a WINDOW_UPDATE on stream 0 at start).
    connection_window: int = 16 * 1024 * 1024
    #: Largest frame we accept (SETTINGS_MAX_FRAME_SIZE).
    max_frame_size: int = 1024 * 1024
    #: Largest DATA frame we send (also capped by the peer's SETTINGS_MAX_FRAME_SIZE).
    send_chunk: int = 64 * 1024
    #: Streams per connection, both what we allow the peer and what we open ourselves.
    max_concurrent_streams: int = 100


class _Stream:
    """Our side of one tunnel: the outbound queue and which halves are closed."""

    __slots__ = ("end_requested", "local_closed", "pending", "queue", "ready", "remote_closed")

    def __init__(self) -> None:
        self.queue: deque[bytes | memoryview] = deque()
        self.pending = 0  # bytes queued and not yet framed
        self.ready = False  # the tunnel is established: DATA may be framed
        self.end_requested = False
        self.local_closed = False
        self.remote_closed = False


class HboneConnection:
    """Behaviour shared by :class:`HboneClientConnection` and :class:`HboneServerConnection`."""

    _client_side: ClassVar[bool]
    #: The DATA fast paths of ``framing``; the microbenchmark and a pair test turn them off to compare with h2.
    _quiet: ClassVar[bool] = True

    def __init__(self, settings: HboneSettings = HboneSettings()) -> None:
        if not settings.send_chunk > 0 or settings.connection_window > 2**31 - 1:
            raise HboneError(f"invalid HBONE settings: {settings}")
        self._settings = settings
        config = H2Configuration(
            client_side=self._client_side,
            header_encoding=None,
            # The server validates requests itself, so that a bad CONNECT is a 400 and not a dead connection.
            validate_inbound_headers=self._client_side,
        )
        self._h2 = framing.QuietH2Connection(config) if self._quiet else H2Connection(config)
        values = {
            SettingCodes.INITIAL_WINDOW_SIZE: settings.stream_window,
            SettingCodes.MAX_FRAME_SIZE: settings.max_frame_size,
            SettingCodes.MAX_CONCURRENT_STREAMS: settings.max_concurrent_streams,
            SettingCodes.MAX_HEADER_LIST_SIZE: _MAX_HEADER_LIST,
        }
        if self._client_side:
            values[SettingCodes.ENABLE_PUSH] = 0
        try:
            self._h2.local_settings = Settings(client=self._client_side, initial_values=values)
        except H2Error as e:
            raise HboneError(f"invalid HBONE settings: {e}") from e
        # h2 derives this from the settings at construction time, before ours replaced them.
        self._h2.max_inbound_frame_size = settings.max_frame_size
        self._h2.initiate_connection()
        if settings.connection_window > _DEFAULT_WINDOW:
            self._h2.increment_flow_control_window(settings.connection_window - _DEFAULT_WINDOW)
        self._streams: dict[int, _Stream] = {}
        self._blocked: dict[int, None] = {}  # ordered set: streams with data waiting for a window
        self._closed = False

    # --- the byte interface ---------------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes from the peer; return what happened. Never raises for anything the peer sent."""
        if self._closed:
            return []
        try:
            h2_events = self._h2.receive_data(data)
        except ProtocolError as e:
            return self._terminate(int(e.error_code), f"peer broke HTTP/2: {type(e).__name__}: {e}")
        except (H2Error, ValueError, KeyError, IndexError, UnicodeError) as e:
            # h2/hpack/hyperframe letting a malformed input escape as a foreign exception: still the peer's fault.
            return self._terminate(ErrorCodes.PROTOCOL_ERROR, f"peer sent malformed HTTP/2: {e!r}")
        events: list[Event] = []
        for event in h2_events:
            self._dispatch(event, events)
            if self._closed:
                return events
        if self._blocked:
            self._flush_blocked(events)
        return events

    def data_to_send(self) -> bytes:
        """Bytes to write to the peer, ``b""`` when there are none."""
        return self._h2.data_to_send()

    # --- stream operations ----------------------------------------------------------------------------------

    def send_data(self, stream_id: int, data: bytes | memoryview) -> None:
        """Queue ``data`` for the stream and frame what the windows allow now."""
        stream = self._streams.get(stream_id)
        if stream is None or not data:
            return
        if stream.end_requested:
            raise HboneError(f"send_data on stream {stream_id} after end_stream")
        if isinstance(data, memoryview) and not (data.readonly and isinstance(data.obj, bytes)):
            data = data.tobytes()  # the caller may reuse a writable buffer
        stream.queue.append(data)
        stream.pending += len(data)
        if stream.ready and not self._send_queued(stream_id, stream):
            self._blocked[stream_id] = None

    def pending_bytes(self, stream_id: int) -> int:
        """Bytes queued for the stream and not yet framed (0 for unknown streams)."""
        stream = self._streams.get(stream_id)
        return 0 if stream is None else stream.pending

    def end_stream(self, stream_id: int) -> None:
        """Half-close our side once the queued data has been framed."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.end_requested:
            return
        stream.end_requested = True
        if stream.ready and not self._send_queued(stream_id, stream):
            self._blocked[stream_id] = None

    def reset_stream(self, stream_id: int, error_code: int = 0x8) -> None:
        """Abort the stream both ways with RST_STREAM (CANCEL by default)."""
        if self._forget(stream_id) is None:
            return
        with contextlib.suppress(H2Error):  # h2 already considers it closed: nothing to tell the peer
            self._h2.reset_stream(stream_id, error_code)

    def consumed(self, stream_id: int, length: int) -> None:
        """The application took ``length`` flow-controlled bytes: let h2 reopen the windows (batched)."""
        if self._closed or length <= 0 or stream_id <= 0:
            return
        with contextlib.suppress(H2Error):
            self._h2.acknowledge_received_data(length, stream_id)

    def close(self, error_code: int = 0) -> None:
        """Send GOAWAY and drop every stream; nothing more is sent or received afterwards."""
        if self._closed:
            return
        with contextlib.suppress(H2Error):
            self._h2.close_connection(error_code)
        self._drop_all()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def active_streams(self) -> int:
        return len(self._streams)

    # --- internals shared with the subclasses ---------------------------------------------------------------

    def _dispatch(self, event: h2.events.Event, events: list[Event]) -> None:
        if isinstance(event, h2.events.DataReceived):
            stream_id, flow = event.stream_id or 0, event.flow_controlled_length or 0
            stream = self._streams.get(stream_id)
            if stream is None or stream.remote_closed:
                self.consumed(stream_id, flow)  # nobody will read it: give the window back at once
            elif event.data:
                events.append(DataReceived(stream_id, event.data, flow))
            elif flow:
                self.consumed(stream_id, flow)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self._streams.get(event.stream_id or 0)
            if stream is not None and not stream.remote_closed:
                stream.remote_closed = True
                events.append(StreamEnded(event.stream_id or 0))
                self._maybe_finished(event.stream_id or 0, stream)
        elif isinstance(event, h2.events.StreamReset):
            if self._forget(event.stream_id or 0) is not None:
                events.append(StreamReset(event.stream_id or 0, int(event.error_code or 0), event.remote_reset))
        elif isinstance(event, h2.events.ConnectionTerminated):
            reason = (event.additional_data or b"").decode("utf-8", "replace") or "GOAWAY received"
            events.append(ConnectionTerminated(int(event.error_code or 0), event.last_stream_id, reason))
            self._drop_all()
        else:
            self._dispatch_headers(event, events)

    def _dispatch_headers(self, event: h2.events.Event, events: list[Event]) -> None:
        """Subclasses interpret requests or responses; other h2 events need no action."""

    def _send_queued(self, stream_id: int, stream: _Stream) -> bool:
        """Frame queued data within the windows; True when the queue is empty (and END_STREAM sent if asked)."""
        h2c = self._h2
        queue = stream.queue
        max_frame = min(self._settings.send_chunk, h2c.max_outbound_frame_size)
        while queue:
            room = min(h2c.local_flow_control_window(stream_id), max_frame)
            if room <= 0:
                return False
            chunk = queue.popleft()
            if len(chunk) > room:
                queue.appendleft(chunk[room:])
                chunk = chunk[:room]
            elif len(chunk) < room and queue and len(queue[0]) < room - len(chunk):
                parts = [chunk]  # coalesce small writes into one frame instead of one frame each
                size = len(chunk)
                while queue and size + len(queue[0]) <= room:
                    part = queue.popleft()
                    parts.append(part)
                    size += len(part)
                chunk = b"".join(parts)
            stream.pending -= len(chunk)
            last = stream.end_requested and not queue
            h2c.send_data(stream_id, chunk, end_stream=last)
            if last:
                stream.local_closed = True
        if stream.end_requested and not stream.local_closed:
            h2c.end_stream(stream_id)
            stream.local_closed = True
        if stream.local_closed:
            self._maybe_finished(stream_id, stream)
        return True

    def _flush_blocked(self, events: list[Event]) -> None:
        for stream_id in list(self._blocked):
            stream = self._streams.get(stream_id)
            if stream is None or not stream.ready:
                continue
            try:
                drained = self._send_queued(stream_id, stream)
            except H2Error:
                # h2 closed the stream under us; report it rather than let receive_data raise.
                self._forget(stream_id)
                events.append(StreamReset(stream_id, ErrorCodes.INTERNAL_ERROR, remote=False))
                continue
            if drained:
                self._blocked.pop(stream_id, None)
                events.append(StreamWritable(stream_id))

    def _maybe_finished(self, stream_id: int, stream: _Stream) -> None:
        if stream.local_closed and stream.remote_closed:
            self._forget(stream_id)

    def _forget(self, stream_id: int) -> _Stream | None:
        self._blocked.pop(stream_id, None)
        return self._streams.pop(stream_id, None)

    def _drop_all(self) -> None:
        self._closed = True
        self._streams.clear()
        self._blocked.clear()

    def _terminate(self, error_code: int, reason: str) -> list[Event]:
        if self._h2.state_machine.state != ConnectionState.CLOSED:
            with contextlib.suppress(H2Error):
                self._h2.close_connection(error_code)
        self._drop_all()
        return [ConnectionTerminated(error_code, None, reason)]
