"""The state of one HBONE connection: its stream table, both flow-control windows, and the framing of what it sends.

:class:`ConnectionState` is the base of :class:`~ambit.hbone.connection.HboneConnection`: it holds every field of
a connection (made in one ``__init__``, read by name by the native DATA path, ``ambit.native._hbone_data``) and the
bookkeeping the other layers share. Above it, :mod:`ambit.hbone.budgets` counts what the peer makes us do,
:mod:`ambit.hbone.receiving` parses frames, and :mod:`ambit.hbone.connection` is the application's interface.

Sending, an unblocked stream's ``send_data`` appends a frame header and the caller's buffer (no copy); what the
windows do not allow waits in the stream's queue, and ``_send_queued`` frames it (split by memoryview, not copied)
in chunks of at most ``send_chunk`` as WINDOW_UPDATE and SETTINGS frames arrive, and a ``StreamWritable`` event
tells the shell to resume its reader. ``send_chunk`` is 256 KiB, the relay's largest socket read, so a bulk read
becomes one frame: since the receiving side streams payloads, large frames cost nothing there (with h2, 64 KiB
frames beat 1 MiB).

Inbound flow control is the caller's: windows reopen only from ``consumed()``, in batches (a WINDOW_UPDATE once half
a window is used up), so a slow application holds at most ``stream_window`` per stream and ``connection_window``
per connection.

Everything to send is appended to ``_out``, a list of byte strings that ``data_to_send`` joins once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import ClassVar

from hpack import Decoder, Encoder

from ambit.hbone import hpack_blocks, hpack_literals, wire
from ambit.hbone.events import ConnectionTerminated, Event, StreamEnded, StreamWritable
from ambit.hbone.settings import MAX_HEADER_LIST, HboneSettings, opening

ENCODER_TABLE = 4096
"""Most of the peer's HEADER_TABLE_SIZE our encoder uses (it is our memory)."""
_DEFAULTS = HboneSettings()
"""The settings of a connection made without any (made once, as a default argument would be)."""

DataSink = Callable[[bytes | memoryview], object]
"""Where an attached stream's DATA goes as it is parsed (see ``HboneConnection.attach``)."""


class _Stream:
    """Our side of one stream: the outbound queue, both windows, and which halves are closed."""

    __slots__ = (
        "end_requested",
        "local_closed",
        "pending",
        "queue",
        "ready",
        "recv_window",
        "remote_closed",
        "send_window",
        "sink",
        "unacked",
    )

    def __init__(self, send_window: int, recv_window: int) -> None:
        self.queue: deque[bytes | memoryview] | None = None  # made on the first write the windows hold back
        self.pending = 0  # bytes queued and not yet framed
        self.ready = False  # the tunnel is established: DATA may be framed
        self.end_requested = False
        self.local_closed = False
        self.remote_closed = False
        self.send_window = send_window  # what the peer lets us send on this stream
        self.recv_window = recv_window  # what we let the peer send
        self.unacked = 0  # consumed bytes not yet returned by a WINDOW_UPDATE
        self.sink: DataSink | None = None  # see ``attach``


class ConnectionState:
    """The fields of one connection and the bookkeeping every layer above shares."""

    _client_side: ClassVar[bool]
    _literal_headers: ClassVar[bool] = False
    """Header blocks index nothing (:mod:`ambit.hbone.hpack_literals`): the HBONE ends, whose CONNECT fields differ
    per tunnel; the waypoint's HTTP/2 keeps the stateful encoder, whose table pays off on repeated headers."""

    def __init__(self, settings: HboneSettings = _DEFAULTS) -> None:
        first = opening(settings, self._client_side)  # checks the settings (raises HboneError), once per value
        self._settings = settings
        self._out: list[bytes | memoryview] = []
        self.outgoing = self._out
        """What ``data_to_send`` will return, unjoined (the same list, never rebound): the shell tests it for
        emptiness instead of calling ``data_to_send`` for nothing."""
        self._buf = bytearray()  # the start of a frame that has not fully arrived
        self._hpack_encoder: Encoder | None = None  # made when first needed: see ``_encoder``
        self._decoder = Decoder(max_header_list_size=MAX_HEADER_LIST)
        self._streams: dict[int, _Stream] = {}
        self._blocked: dict[int, None] = {}  # ordered set: streams with data waiting for a window
        self._closed = False
        self._going_away = False  # we sent a graceful GOAWAY
        self._going_away_final = False  # ... and its second step: later peer streams are refused
        self._peer_going_away = False  # the peer sent one
        self._need_preface = not self._client_side
        self._peer_settings_seen = False
        self._peer_max_frame = wire.DEFAULT_MAX_FRAME
        self._peer_initial_window = wire.DEFAULT_WINDOW
        self._peer_max_streams = wire.LARGEST_WINDOW  # unlimited until the peer says otherwise
        self._send_window = wire.DEFAULT_WINDOW  # the peer's connection window for us
        self._recv_window = settings.connection_window
        self._recv_unacked = 0
        self._next_id = 1  # client: the next stream we open
        self._highest_peer = 0  # server: the highest stream the peer opened
        self._continuation: tuple[int, bool, bytearray] | None = None  # (stream, END_STREAM, block so far)
        self._continuations = 0  # CONTINUATION frames of the block in progress
        self._early_resets = 0  # rule A (ambit.hbone.budgets)
        self._empty_run = 0  # rule D: empty DATA frames in a row, and the receive window after the last of them
        self._empty_mark = -1
        self._acks_owed = 0  # rule B: ACKs in the current bucket of output
        self._acks_before = 0  # ... and in the bucket before it
        self._bucket_out = 0  # octets of output in the current bucket
        self._output_blocked = False
        self._ping: bytes | None = None  # our last PING's payload, until its ACK
        # The DATA frame whose payload is arriving (see :mod:`ambit.hbone.receiving`).
        self._data_left = 0
        self._data_stream = 0
        self._data_deliver = False
        self._data_end = False
        self._out.append(first)

    @property
    def _encoder(self) -> Encoder:
        """Our HPACK encoder, made on first need. The HBONE ends (``_literal_headers``) need it only once a peer's
        SETTINGS changes the table size (the next block must say so, RFC 7541 §4.2), which our own peers never do:
        so most of their connections never make one. Until made, it is as a fresh one would be: an empty table of
        ``ENCODER_TABLE`` octets, not resized."""
        encoder = self._hpack_encoder
        if encoder is None:
            encoder = self._hpack_encoder = Encoder()
            encoder.header_table_size = ENCODER_TABLE
        return encoder

    # --- inbound flow control -------------------------------------------------------------------------------

    def consumed(self, stream_id: int, length: int) -> None:
        """The application took ``length`` flow-controlled bytes: reopen the windows (batched)."""
        if self._closed or length <= 0:
            return
        self._recv_unacked += length  # _give_back, inline: this runs for every DATA chunk
        if self._recv_unacked >= self._settings.connection_window >> 1:
            self._give_back(0)
        stream = self._streams.get(stream_id)
        if stream is None or stream.remote_closed:
            return
        stream.unacked += length
        if stream.unacked >= self._settings.stream_window >> 1:
            self._out.append(wire.window_update(stream_id, stream.unacked))
            stream.recv_window += stream.unacked
            stream.unacked = 0

    def _give_back(self, length: int) -> None:
        self._recv_unacked += length
        if self._recv_unacked >= self._settings.connection_window >> 1:
            self._out.append(wire.window_update(0, self._recv_unacked))
            self._recv_window += self._recv_unacked
            self._recv_unacked = 0

    # --- sending --------------------------------------------------------------------------------------------

    def _send_headers(self, stream_id: int, fields: list[tuple[str, str]], *, end_stream: bool = False) -> None:
        # Literal strings, not Huffman-coded: hpack's pure-Python Huffman coder cost 26 µs per CONNECT here and 16 µs
        # more to decode on the far side, to save about 30 octets. With ``_literal_headers`` nothing is indexed, except
        # in a block that must carry a table size update (RFC 7541 §4.2), which the stateful encoder writes.
        encoder = self._hpack_encoder
        if self._literal_headers and (encoder is None or not encoder.header_table.resized):
            block = hpack_literals.encode(fields)
        else:
            block = hpack_blocks.encode(self._encoder, fields)
        self._out += wire.header_block(stream_id, block, end_stream=end_stream, max_frame=self._peer_max_frame)

    def _send_queued(self, stream_id: int, stream: _Stream) -> bool:
        """Frame queued data within the windows; True when the queue is empty (and END_STREAM sent if asked)."""
        queue = stream.queue
        out = self._out
        max_frame = min(self._settings.send_chunk, self._peer_max_frame)
        while queue:
            room = min(stream.send_window, self._send_window, max_frame)
            if room <= 0:
                return False
            chunk = queue.popleft()
            if len(chunk) > room:
                view = chunk if isinstance(chunk, memoryview) else memoryview(chunk)  # split without copying
                queue.appendleft(view[room:])
                chunk = view[:room]
            elif len(chunk) < room and queue and len(queue[0]) < room - len(chunk):
                parts = [chunk]  # coalesce small writes into one frame instead of one frame each
                size = len(chunk)
                while queue and size + len(queue[0]) <= room:
                    part = queue.popleft()
                    parts.append(part)
                    size += len(part)
                chunk = b"".join(parts)
            size = len(chunk)
            stream.pending -= size
            stream.send_window -= size
            self._send_window -= size
            last = stream.end_requested and not queue
            out += (wire.frame_header(size, wire.DATA, wire.END_STREAM if last else 0, stream_id), chunk)
            if last:
                stream.local_closed = True
        stream.queue = None
        if stream.end_requested and not stream.local_closed:
            out.append(wire.frame(wire.DATA, wire.END_STREAM, stream_id))
            stream.local_closed = True
        if stream.local_closed:
            self._maybe_finished(stream_id, stream)
        return True

    def _flush_blocked(self, events: list[Event]) -> None:
        for stream_id in list(self._blocked):
            stream = self._streams.get(stream_id)
            if stream is None:
                self._blocked.pop(stream_id, None)
                continue
            if not stream.ready:
                continue
            if self._send_queued(stream_id, stream):
                self._blocked.pop(stream_id, None)
                events.append(StreamWritable(stream_id))

    # --- stream bookkeeping ---------------------------------------------------------------------------------

    def _new_stream(self, stream_id: int) -> _Stream:
        stream = _Stream(self._peer_initial_window, self._settings.stream_window)
        self._streams[stream_id] = stream
        return stream

    def _is_idle(self, stream_id: int) -> bool:
        """Never opened by either side (HBONE streams are odd: only clients open them)."""
        if not stream_id & 1:
            return True
        return stream_id >= self._next_id if self._client_side else stream_id > self._highest_peer

    def _remote_end(self, stream_id: int, events: list[Event]) -> None:
        stream = self._streams.get(stream_id)
        if stream is not None and not stream.remote_closed:
            stream.remote_closed = True
            events.append(StreamEnded(stream_id))
            self._maybe_finished(stream_id, stream)

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
        self._buf = bytearray()
        self._continuation = None

    def _terminate(self, error_code: int, reason: str) -> list[Event]:
        self._out.append(wire.goaway(self._highest_peer, error_code, reason.encode("utf-8", "replace")[:256]))
        self._drop_all()
        return [ConnectionTerminated(error_code, None, reason)]
