"""The shared core of both HBONE ends: our own HTTP/2 engine for the subset HBONE uses (RFC 9113), sans-IO.

Theory of operation. ``receive_data`` walks the frames in the bytes it is given and turns them into
:mod:`ambit.hbone.events`; the subclasses (``client.py``, ``server.py``) interpret the HEADERS of their side
(``_on_headers``). Everything to send is appended to a list of byte strings that ``data_to_send`` joins once.

Why not h2: HBONE needs one request shape (CONNECT), DATA both ways, flow control and resets, and h2's general
state machines cost more than that needs. ``bench/hbone_micro.py`` (in-memory pairs, no TLS): a 1-byte round trip
takes 21 µs of Python through h2 4.4 and 6 µs through this engine; an idle tunnel holds about 1,000 bytes of heap in
h2 and 330 here. HPACK's state is the ``hpack`` package's (h2's own codec: its encoder's and decoder's tables), the
blocks are coded against it by :mod:`ambit.hbone.hpack_blocks` and :mod:`ambit.hbone.hpack_literals`; h2 itself
remains the independent peer of the interoperability tests.

DATA is the hot path and is never buffered whole: once a DATA frame's 9-octet header is read, its payload is
handed on (``DataReceived``) in whatever pieces arrive, each piece counted against the windows as it comes, so a
large frame split over many TLS reads is neither copied into a reassembly buffer nor delayed until its last read.
A piece is a read-only memoryview of the ``bytes`` given to ``receive_data`` (no copy at all) unless it came out
of the reassembly buffer, which is reused, and is then copied to ``bytes``. Only the other frame types (and padded
DATA, which nobody sends) wait for their whole frame.

Sending, an unblocked stream's ``send_data`` appends a frame header and the caller's buffer (no copy); what the
windows do not allow waits in the stream's queue, and ``_send_queued`` frames it (split by memoryview, not copied)
in chunks of at most ``send_chunk`` as WINDOW_UPDATE and SETTINGS frames arrive, and a ``StreamWritable`` event
tells the shell to resume its reader. ``send_chunk`` is 256 KiB, the relay's largest socket read, so a bulk read
becomes one frame: since the receiving side streams payloads, large frames cost nothing there (with h2, 64 KiB
frames beat 1 MiB).

Inbound flow control is the caller's: windows reopen only from ``consumed()``, in batches (a WINDOW_UPDATE once half
a window is used up), so a slow application holds at most ``stream_window`` per stream and ``connection_window``
per connection.

The relay's path (a reader that takes every chunk as it comes, a writer whose chunks usually fit the windows) has
two calls of its own, each the same as the general calls it stands for, so a relayed chunk costs one call into the
core each way and no event:

1. ``attach(stream_id, sink)``: the stream's DATA goes to ``sink`` while ``receive_data`` parses it, counted as
   consumed just before, instead of a ``DataReceived`` for a later ``consumed()``. The sink sees its stream's
   payload in wire order, before the caller sees any event of the same ``receive_data``. A sink that must stop
   taking chunks calls ``detach`` (from inside itself if need be): the following pieces are events again, not
   consumed, so the windows close behind a slow reader exactly as they do behind one that reads events. A sink may
   call back into the connection; parsing stops if it closed it.
2. ``send_data_now(stream_id, data)`` is ``send_data`` then ``data_to_send``: the bytes to write and the stream's
   bytes still queued. ``outgoing`` is the unjoined output, for a shell that flushes only when there is some.

Rules the peer must keep, and what breaking them costs (RFC 9113 §5.4): a malformed frame, an unexpected frame type
or stream, a flow-control overrun or an HPACK failure ends the connection (GOAWAY, ``ConnectionTerminated``); a
frame that is wrong only for its stream (DATA after END_STREAM, a bad response) resets that stream
(RST_STREAM, ``StreamReset(remote=False)``). Frames for streams we have forgotten are dropped (their DATA is still
counted and given back to the connection window).

Rules for the peer's budgets (what a flood costs it), all ending the connection with GOAWAY ENHANCE_YOUR_CALM:

A. Resets. Every stream that ends in a reset before we answered it, whoever reset it (the client's RST_STREAM,
   "rapid reset", CVE-2023-44487; or ours, provoked by a frame the client knew to be invalid, "MadeYouReset",
   CVE-2025-8671), and every stream we reset for a protocol error, costs one unit of the same budget; each answer
   we give pays one back. Past ``MAX_EARLY_RESETS`` units outstanding the connection ends.
B. Control responses. PING and SETTINGS each oblige us to send an ACK. The shell tells the core when its writes
   back up (``output_blocked``) and when they drain again (``output_drained``). When they back up, the bytes
   waiting are our latest output; if more than ``MAX_QUEUED_CONTROL`` ACKs are among our last
   ``_ACK_WINDOW``-``2 * _ACK_WINDOW`` octets of output (counted in two buckets, per ``data_to_send``, not per
   frame), or that many more are owed while blocked, the connection ends. A peer that reads what we send can
   ping as it likes, and old pings do not count against a later bulk transfer. The memory itself is bounded by
   the shell, which stops reading while its writes are paused; this rule makes a peer that floods us without
   reading lose the connection instead of just stalling it.
C. Header blocks. A block is at most ``_MAX_HEADER_BLOCK`` octets and ``MAX_CONTINUATIONS`` CONTINUATION frames
   (empty CONTINUATION frames cost the byte cap nothing).
D. Empty DATA. A DATA frame that carries no data and does not end its stream (padding only, or nothing) asks us to
   parse a frame for nothing ("zero-length headers and data frames", CVE-2019-9518). More than
   ``MAX_EMPTY_DATA`` of them in a row, with no flow-controlled octet received between them, end the connection.
   "Between them" is read off the connection's receive window (``_empty_mark``), which every DATA octet moves,
   whoever parsed it (this engine or the native DATA path, which hands every empty frame to this engine).

Liveness: ``ping(payload)`` sends a PING, and its ACK is reported as ``PingAcknowledged`` (only the last PING
sent is awaited; other ACKs are dropped, RFC 9113 §6.7); ``peer_ready`` says the peer's preface and first SETTINGS
have arrived. Deadlines are the shell's (:mod:`ambit.hbone.liveness`): the core keeps no clock.

Graceful shutdown (RFC 9113 §6.8), on the HBONE ends only (``_graceful_goaway``; the waypoint's HTTP/2 keeps the
strict reading below), in two steps as the RFC advises: ``go_away()`` sends GOAWAY(NO_ERROR) with the largest stream
id, which tells the peer to open nothing more while streams it sent before hearing it are still served; after a
round trip's grace, ``finish_going_away()`` sends GOAWAY naming the highest stream the peer opened, and a peer stream
opened after that is refused (RST_STREAM REFUSED_STREAM: never processed, safe to retry elsewhere). Streams up to it
go on to their end. Receiving such a GOAWAY reports ``ConnectionDraining``: our streams above its last id are reset
REFUSED_STREAM (the peer says it never saw them), the others go on, and no new stream may be opened. A GOAWAY with
an error code ends the connection at once (``ConnectionTerminated``). Timing the second step, and closing a drained
connection once its last stream ended, are the shell's business.

Invariants:
1. ``_streams`` holds exactly the streams the application knows and that are not finished; a stream leaves it
   when both halves are closed, on any reset, on a refused or rejected tunnel, and all at once on termination.
2. After ``ConnectionTerminated`` or ``close()`` the connection keeps no stream state and ignores input; the
   GOAWAY it queued is still returned by ``data_to_send()``.
3. Nothing the peer sends makes ``receive_data`` raise.
4. Calls on streams that are already gone (a reset can race the application) are no-ops.
5. Every header block is HPACK-decoded in order, even for streams we drop, or the decoder's table would drift.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from hpack import Decoder, Encoder
from hpack.exceptions import HPACKError

from ambit.hbone import hpack_blocks, hpack_literals, wire
from ambit.hbone.errors import HboneError, HboneProtocolError
from ambit.hbone.events import (
    ConnectionDraining,
    ConnectionTerminated,
    DataReceived,
    Event,
    PingAcknowledged,
    StreamEnded,
    StreamReset,
    StreamWritable,
)

_MAX_HEADER_LIST = 64 * 1024
_MAX_HEADER_BLOCK = 2 * _MAX_HEADER_LIST
"""Compressed header block (HEADERS + CONTINUATION) we buffer before calling the peer abusive."""
MAX_CONCURRENT_STREAMS = 100
"""Streams on one HBONE connection: what we allow a peer, and what a pool opens on one before dialling another
(ztunnel's ``POOL_MAX_STREAMS_PER_CONNECTION`` default, spec §6.2)."""
MAX_EARLY_RESETS = 100
"""Resets of unanswered streams (by either side) and protocol-error resets, beyond those paid back by answers,
before GOAWAY ENHANCE_YOUR_CALM (rule A)."""
MAX_QUEUED_CONTROL = 10_000
"""PING and SETTINGS ACKs owed while our output is backed up before GOAWAY ENHANCE_YOUR_CALM (rule B; the figure is
Go's ``maxQueuedControlFrames``)."""
_ACK_WINDOW = 256 * 1024
"""Octets of output per bucket of rule B: the shell's transport buffer size at which writes pause."""
MAX_CONTINUATIONS = 32
MAX_EMPTY_DATA = 10
"""Empty DATA frames without END_STREAM in a row before GOAWAY ENHANCE_YOUR_CALM (rule D; Envoy allows 1, we allow
a few for stacks that flush empty frames)."""
"""CONTINUATION frames in one header block (rule C): a 128 KiB block in the smallest frames HTTP/2 allows needs 8."""
_OPENINGS_CACHED = 16
"""Distinct (settings, side) pairs whose opening bytes are kept (:func:`_opening`)."""
_SETTINGS_ACK = wire.frame(wire.SETTINGS, wire.ACK, 0)
"""Shared, not built per ACK: a SETTINGS flood then costs our output list a pointer per frame."""
_ENCODER_TABLE = 4096
"""Most of the peer's HEADER_TABLE_SIZE our encoder uses (it is our memory)."""
_pack_header = wire.HEADER.pack
"""``wire.frame_header`` without its call, for DATA sent straight through (the hot path)."""

RawHeaders = list[tuple[bytes, bytes]]
DataSink = Callable[[bytes | memoryview], object]
"""Where an attached stream's DATA goes as it is parsed (see ``HboneConnection.attach``)."""


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
    send_chunk: int = 256 * 1024
    #: Streams per connection, both what we allow the peer and what we open ourselves.
    max_concurrent_streams: int = MAX_CONCURRENT_STREAMS

    def check(self) -> None:
        """Raise :class:`HboneError` unless every value is one HTTP/2 allows."""
        problems = []
        if not 0 < self.stream_window <= wire.LARGEST_WINDOW:
            problems.append("stream_window")
        if not wire.DEFAULT_WINDOW <= self.connection_window <= wire.LARGEST_WINDOW:
            problems.append("connection_window")
        if not wire.DEFAULT_MAX_FRAME <= self.max_frame_size <= wire.LARGEST_FRAME:
            problems.append("max_frame_size")
        if self.send_chunk <= 0:
            problems.append("send_chunk")
        if self.max_concurrent_streams < 0:
            problems.append("max_concurrent_streams")
        if problems:
            raise HboneError(f"invalid HBONE settings ({', '.join(problems)}): {self}")


@functools.lru_cache(maxsize=_OPENINGS_CACHED)
def _opening(settings: HboneSettings, client_side: bool) -> bytes:
    """What a connection with ``settings`` sends first: the client's preface, our SETTINGS, and the WINDOW_UPDATE
    that raises the connection's receive window; after :meth:`HboneSettings.check` (an invalid value raises, and
    nothing is cached for it).

    A pure function of the (frozen) settings and the side, built once per value rather than per connection: a
    process has a handful of settings values, all from its own configuration (none from a peer), and the cache is
    bounded all the same."""
    settings.check()
    values = [
        (wire.HEADER_TABLE_SIZE, 4096),
        (wire.MAX_CONCURRENT_STREAMS, settings.max_concurrent_streams),
        (wire.INITIAL_WINDOW_SIZE, settings.stream_window),
        (wire.MAX_FRAME_SIZE, settings.max_frame_size),
        (wire.MAX_HEADER_LIST_SIZE, _MAX_HEADER_LIST),
    ]
    parts = []
    if client_side:
        parts.append(wire.PREFACE)
        values.insert(1, (wire.ENABLE_PUSH, 0))
    parts.append(wire.settings_frame(values))
    if settings.connection_window > wire.DEFAULT_WINDOW:
        parts.append(wire.window_update(0, settings.connection_window - wire.DEFAULT_WINDOW))
    return b"".join(parts)


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


class HboneConnection:
    """Behaviour shared by :class:`HboneClientConnection` and :class:`HboneServerConnection`."""

    _client_side: ClassVar[bool]
    _ack_window: ClassVar[int] = _ACK_WINDOW
    """Rule B's bucket, for the native DATA path (``ambit.native._hbone_data``), which keeps its count too."""
    _graceful_goaway: ClassVar[bool] = False
    _literal_headers: ClassVar[bool] = False
    """Header blocks index nothing (:mod:`ambit.hbone.hpack_literals`): the HBONE ends, whose CONNECT fields differ
    per tunnel; the waypoint's HTTP/2 keeps the stateful encoder, whose table pays off on repeated headers."""
    """GOAWAY(NO_ERROR) lets the streams in flight finish (see the module docstring); else it ends them all."""

    def __init__(self, settings: HboneSettings = HboneSettings()) -> None:
        opening = _opening(settings, self._client_side)  # checks the settings (raises HboneError), once per value
        self._settings = settings
        self._out: list[bytes | memoryview] = []
        self.outgoing = self._out
        """What ``data_to_send`` will return, unjoined (the same list, never rebound): the shell tests it for
        emptiness instead of calling ``data_to_send`` for nothing."""
        self._buf = bytearray()  # the start of a frame that has not fully arrived
        self._hpack_encoder: Encoder | None = None  # made when first needed: see ``_encoder``
        self._decoder = Decoder(max_header_list_size=_MAX_HEADER_LIST)
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
        self._early_resets = 0  # see _count_early_reset
        self._empty_run = 0  # rule D: empty DATA frames in a row, and the receive window after the last of them
        self._empty_mark = -1
        self._acks_owed = 0  # rule B: ACKs in the current bucket of output
        self._acks_before = 0  # ... and in the bucket before it
        self._bucket_out = 0  # octets of output in the current bucket
        self._output_blocked = False
        self._ping: bytes | None = None  # our last PING's payload, until its ACK
        # The DATA frame whose payload is arriving (see the module docstring).
        self._data_left = 0
        self._data_stream = 0
        self._data_deliver = False
        self._data_end = False
        self._out.append(opening)

    @property
    def _encoder(self) -> Encoder:
        """Our HPACK encoder, made on first need. The HBONE ends (``_literal_headers``) need it only once a peer's
        SETTINGS changes the table size (the next block must say so, RFC 7541 §4.2), which our own peers never do:
        so most of their connections never make one. Until made, it is as a fresh one would be: an empty table of
        ``_ENCODER_TABLE`` octets, not resized."""
        encoder = self._hpack_encoder
        if encoder is None:
            encoder = self._hpack_encoder = Encoder()
            encoder.header_table_size = _ENCODER_TABLE
        return encoder

    # --- the byte interface ---------------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes from the peer; return what happened. Never raises for anything the peer sent.

        DATA for an attached stream (``attach``) is not among the events: it went to the stream's sink during this
        call, in wire order, before any event of the call is seen by the caller.
        """
        if self._closed or not data:
            return []
        events: list[Event] = []
        buf: bytes | bytearray
        if self._buf:
            self._buf += data
            buf = self._buf
        else:
            buf = data
        pos = 0
        try:
            with memoryview(buf) as view:
                size = len(view)
                if self._need_preface:
                    pos = self._preface(view)
                while pos < size and not self._need_preface:
                    left = self._data_left
                    if left:
                        take = min(left, size - pos)
                        self._data_left = left - take
                        if buf is data:
                            self._data_piece(view[pos : pos + take], take, take == left, events)
                        else:  # no slice of the reassembly buffer may outlive this loop: it is resized below
                            self._data_piece(bytes(view[pos : pos + take]), take, take == left, events)
                        pos += take
                        if self._closed:  # a sink closed the connection
                            return events
                        continue
                    if size - pos < 9:
                        break
                    high, low, frame_type, flags, stream_id = wire.HEADER.unpack_from(view, pos)
                    length = (high << 8) | low
                    if length > self._settings.max_frame_size:
                        raise HboneProtocolError(wire.FRAME_SIZE_ERROR, f"frame of {length} octets is over our limit")
                    stream_id &= wire.STREAM_ID_MASK
                    if (
                        frame_type == wire.DATA
                        and not flags & wire.PADDED
                        and self._continuation is None
                        and self._peer_settings_seen
                    ):
                        pos += 9
                        end = pos + length
                        stream = self._streams.get(stream_id)
                        if (  # the whole frame is here for a stream in good standing: the common case, inline
                            buf is data
                            and 0 < length <= size - pos
                            and stream is not None
                            and not stream.remote_closed
                            and (stream.ready or not self._client_side)
                            and length <= stream.recv_window
                            and length <= self._recv_window
                        ):
                            self._recv_window -= length
                            stream.recv_window -= length
                            sink = stream.sink
                            if sink is None:
                                events.append(DataReceived(stream_id, view[pos:end], length))
                            else:  # consumed() at once, inline, then straight to the sink
                                unacked = self._recv_unacked + length
                                self._recv_unacked = unacked
                                if unacked >= self._settings.connection_window >> 1:
                                    self._give_back(0)
                                unacked = stream.unacked + length
                                if unacked >= self._settings.stream_window >> 1:
                                    self._out.append(wire.window_update(stream_id, unacked))
                                    stream.recv_window += unacked
                                    unacked = 0
                                stream.unacked = unacked
                                sink(view[pos:end])
                                if self._closed:
                                    return events
                            pos = end
                            if flags & wire.END_STREAM:
                                self._remote_end(stream_id, events)
                            continue
                        self._data_begin(stream_id, flags, length, events)
                        if not length:
                            self._data_piece(b"", 0, True, events)
                            if not flags & wire.END_STREAM:
                                self._count_empty_data(self._recv_window)
                        continue
                    end = pos + 9 + length
                    if end > size:
                        break
                    self._frame(frame_type, flags, stream_id, view[pos + 9 : end], events)
                    pos = end
                    if self._closed:
                        return events
        except HboneProtocolError as e:
            if not self._closed:
                events += self._terminate(e.error_code, e.reason)
            return events
        # Keep the unparsed tail (the view is released now, so the buffer may shrink).
        if buf is self._buf:
            del self._buf[:pos]
        elif pos < len(buf):
            self._buf = bytearray(buf[pos:])
        if self._blocked:
            self._flush_blocked(events)
        return events

    def data_to_send(self) -> bytes:
        """Bytes to write to the peer, ``b""`` when there are none."""
        out = self._out
        if not out:
            return b""
        data = b"".join(out)
        out.clear()
        self._bucket_out += len(data)
        if self._bucket_out >= _ACK_WINDOW:  # rule B's buckets
            self._acks_before, self._acks_owed, self._bucket_out = self._acks_owed, 0, 0
        return data

    # --- stream operations ----------------------------------------------------------------------------------

    def send_data(self, stream_id: int, data: bytes | memoryview) -> int:
        """Queue ``data`` for the stream and frame what the windows allow now; return the stream's bytes still
        queued and not framed (``pending_bytes``), which a writer bounds."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return 0
        if not data:
            return stream.pending
        if stream.end_requested:
            raise HboneError(f"send_data on stream {stream_id} after end_stream")
        if isinstance(data, memoryview) and not (data.readonly and isinstance(data.obj, bytes)):
            data = data.tobytes()  # the caller may reuse a writable buffer
        size = len(data)
        if (
            stream.ready
            and stream.queue is None
            and size <= stream.send_window
            and size <= self._send_window
            and size <= self._settings.send_chunk
            and size <= self._peer_max_frame
        ):
            self._out += (_pack_header(size >> 8, size & 0xFF, wire.DATA, 0, stream_id), data)
            stream.send_window -= size
            self._send_window -= size
            return 0
        if stream.queue is None:
            stream.queue = deque()
        stream.queue.append(data)
        stream.pending += size
        if stream.ready and not self._send_queued(stream_id, stream):
            self._blocked[stream_id] = None
        return stream.pending

    def send_data_now(self, stream_id: int, data: bytes | memoryview) -> tuple[bytes, int]:
        """``send_data`` then ``data_to_send``, in one call: the bytes to write now (``b""`` if none) and the
        stream's bytes still queued, not framed (what ``send_data`` returns)."""
        stream = self._streams.get(stream_id)
        size = len(data)
        if (  # nothing else to send and the windows allow the frame: the relay's common case, inline
            stream is not None
            and not self._out
            and 0 < size <= stream.send_window
            and stream.ready
            and stream.queue is None
            and not stream.end_requested
            and size <= self._send_window
            and size <= self._settings.send_chunk
            and size <= self._peer_max_frame
        ):
            stream.send_window -= size
            self._send_window -= size
            self._bucket_out += size + 9  # data_to_send's rule B accounting, inline
            if self._bucket_out >= _ACK_WINDOW:
                self._acks_before, self._acks_owed, self._bucket_out = self._acks_owed, 0, 0
            return _pack_header(size >> 8, size & 0xFF, wire.DATA, 0, stream_id) + data, 0  # copies, as join does
        pending = self.send_data(stream_id, data)
        return self.data_to_send(), pending

    def attach(self, stream_id: int, sink: DataSink) -> None:
        """Hand the stream's DATA to ``sink`` while ``receive_data`` parses it, instead of reporting
        ``DataReceived``; it counts as consumed (``consumed``) just before ``sink`` is called.

        For a reader that takes every chunk as it comes (the relay): no event per chunk, no ``consumed`` call. A
        reader that must stop taking chunks calls ``detach`` (it may do so from inside ``sink``): from the next
        piece on, DATA is reported as events again, unconsumed, and the windows close behind it as for any reader.
        ``sink`` may call back into this connection (send, reset, close); parsing stops if it closes it. A no-op for
        a stream that is gone.
        """
        stream = self._streams.get(stream_id)
        if stream is not None:
            stream.sink = sink

    def detach(self, stream_id: int) -> None:
        """Report the stream's DATA as ``DataReceived`` events again (see ``attach``); a no-op if not attached."""
        stream = self._streams.get(stream_id)
        if stream is not None:
            stream.sink = None

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

    def reset_stream(self, stream_id: int, error_code: int = wire.CANCEL) -> None:
        """Abort the stream both ways with RST_STREAM (CANCEL by default)."""
        if self._forget(stream_id) is not None:
            self._out.append(wire.rst_stream(stream_id, error_code))

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

    def ping(self, payload: bytes) -> None:
        """Send a PING with ``payload`` (8 octets); the peer's ACK is reported as ``PingAcknowledged``. Only the
        last PING sent is awaited: the ACK of an earlier one is dropped, as an unsolicited ACK is."""
        if len(payload) != 8:
            raise HboneError(f"a PING payload is 8 octets, not {len(payload)}")
        if self._closed:
            return
        self._ping = payload
        self._out.append(wire.frame(wire.PING, 0, 0, payload))

    @property
    def peer_ready(self) -> bool:
        """The peer has started HTTP/2: its preface (a client's) and its first SETTINGS frame arrived."""
        return self._peer_settings_seen

    def close(self, error_code: int = wire.NO_ERROR) -> None:
        """Send GOAWAY and drop every stream; nothing more is sent or received afterwards."""
        if self._closed:
            return
        self._out.append(wire.goaway(self._highest_peer, error_code))
        self._drop_all()

    def go_away(self, reason: str = "") -> None:
        """Graceful GOAWAY, first step: the peer opens nothing more; what it sent meanwhile is still served."""
        if self._closed or self._going_away:
            return
        self._going_away = True
        self._out.append(wire.goaway(wire.STREAM_ID_MASK, wire.NO_ERROR, reason.encode("utf-8", "replace")[:256]))

    def finish_going_away(self) -> None:
        """Graceful GOAWAY, second step: name the last peer stream served; later ones are refused."""
        if self._closed or not self._going_away or self._going_away_final:
            return
        self._going_away_final = True
        self._out.append(wire.goaway(self._highest_peer, wire.NO_ERROR))

    @property
    def draining(self) -> bool:
        """A graceful GOAWAY was sent or received: no new stream will be opened on this connection."""
        return self._going_away or self._peer_going_away

    @property
    def drained_when_idle(self) -> bool:
        """Once no stream is left the connection has nothing more to do: the peer is going away, or we finished
        going away."""
        return self._peer_going_away or self._going_away_final

    def output_blocked(self) -> list[Event]:
        """The shell's writes backed up (the peer is not reading): enforce rule B from now on."""
        self._output_blocked = True
        if self._acks_before + self._acks_owed > MAX_QUEUED_CONTROL and not self._closed:
            return self._terminate(
                wire.ENHANCE_YOUR_CALM, "too many control frames queued for a peer that does not read"
            )
        return []

    def output_drained(self) -> None:
        """The shell's writes drained: the ACKs owed so far reached the peer."""
        self._output_blocked = False
        self._acks_owed = self._acks_before = self._bucket_out = 0

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def settings(self) -> HboneSettings:
        return self._settings

    @property
    def active_streams(self) -> int:
        return len(self._streams)

    # --- receiving ------------------------------------------------------------------------------------------

    def _preface(self, view: memoryview) -> int:
        expected = wire.PREFACE
        got = bytes(view[: len(expected)])
        if not expected.startswith(got):
            raise HboneProtocolError(wire.PROTOCOL_ERROR, "the client did not start with the HTTP/2 preface")
        if len(got) < len(expected):
            return 0
        self._need_preface = False
        return len(expected)

    def _data_begin(self, stream_id: int, flags: int, length: int, events: list[Event]) -> None:
        """A DATA frame of ``length`` flow-controlled octets starts: check it and decide where its payload goes."""
        if stream_id == 0:
            raise HboneProtocolError(wire.PROTOCOL_ERROR, "DATA on stream 0")
        if length > self._recv_window:
            raise HboneProtocolError(wire.FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self._recv_window -= length
        deliver = False
        stream = self._streams.get(stream_id)
        if stream is None:
            if self._is_idle(stream_id):
                raise HboneProtocolError(wire.PROTOCOL_ERROR, f"DATA on stream {stream_id}, which was never opened")
        elif stream.remote_closed:
            self._stream_error(stream_id, wire.STREAM_CLOSED, events)
        elif self._client_side and not stream.ready:
            self._stream_error(stream_id, wire.PROTOCOL_ERROR, events)  # DATA before the response
        elif length > stream.recv_window:
            raise HboneProtocolError(wire.FLOW_CONTROL_ERROR, f"DATA beyond the window of stream {stream_id}")
        else:
            stream.recv_window -= length
            deliver = True
        self._data_stream = stream_id
        self._data_deliver = deliver
        self._data_end = bool(flags & wire.END_STREAM)
        self._data_left = length

    def _data_piece(self, data: bytes | memoryview, flow: int, last: bool, events: list[Event]) -> None:
        stream_id = self._data_stream
        if self._data_deliver and stream_id in self._streams:
            sink = self._streams[stream_id].sink if data else None
            if sink is not None:
                self.consumed(stream_id, flow)
                sink(data)
            elif data:
                events.append(DataReceived(stream_id, data, flow))
            elif flow:
                self.consumed(stream_id, flow)
            if last and self._data_end:
                self._remote_end(stream_id, events)
        elif flow:
            self._give_back(flow)

    def _frame(self, frame_type: int, flags: int, stream_id: int, payload: memoryview, events: list[Event]) -> None:
        if self._continuation is not None:
            self._header_continuation(frame_type, flags, stream_id, payload, events)
        elif not self._peer_settings_seen and frame_type != wire.SETTINGS:
            raise HboneProtocolError(wire.PROTOCOL_ERROR, "the peer's first frame was not SETTINGS")
        elif frame_type == wire.DATA:
            self._padded_data(flags, stream_id, payload, events)
        elif frame_type == wire.HEADERS:
            self._headers(flags, stream_id, payload, events)
        elif frame_type == wire.SETTINGS:
            self._settings_frame(flags, stream_id, payload)
        elif frame_type == wire.WINDOW_UPDATE:
            self._window_update(stream_id, payload, events)
        elif frame_type == wire.RST_STREAM:
            if stream_id == 0 or len(payload) != 4:
                raise HboneProtocolError(wire.PROTOCOL_ERROR, "malformed RST_STREAM")
            if self._is_idle(stream_id):
                raise HboneProtocolError(wire.PROTOCOL_ERROR, f"RST_STREAM on stream {stream_id}, never opened")
            stream = self._forget(stream_id)
            if stream is not None:
                events.append(StreamReset(stream_id, wire.u32(payload), remote=True))
                if not stream.ready and not self._client_side:
                    self._count_early_reset()
        elif frame_type == wire.PING:
            if stream_id != 0 or len(payload) != 8:
                raise HboneProtocolError(wire.PROTOCOL_ERROR, "malformed PING")
            if not flags & wire.ACK:
                self._owe_ack()
                self._out.append(wire.frame(wire.PING, wire.ACK, 0, bytes(payload)))
            elif self._ping is not None and payload == self._ping:
                events.append(PingAcknowledged(self._ping))
                self._ping = None
        elif frame_type == wire.GOAWAY:
            if stream_id != 0 or len(payload) < 8:
                raise HboneProtocolError(wire.PROTOCOL_ERROR, "malformed GOAWAY")
            last, code, debug = wire.parse_goaway(payload)
            reason = debug.decode("utf-8", "replace") or "GOAWAY received"
            if code == wire.NO_ERROR and self._graceful_goaway:
                self._peer_drains(last, reason, events)
            else:
                events.append(ConnectionTerminated(code, last, reason))
                self._drop_all()
        elif frame_type == wire.PRIORITY:
            if stream_id == 0 or len(payload) != 5:
                raise HboneProtocolError(wire.PROTOCOL_ERROR, "malformed PRIORITY")
        elif frame_type == wire.PUSH_PROMISE:
            raise HboneProtocolError(wire.PROTOCOL_ERROR, "PUSH_PROMISE (push is disabled)")
        elif frame_type == wire.CONTINUATION:
            raise HboneProtocolError(wire.PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        # Unknown frame types are ignored (§5.5).

    def _peer_drains(self, last: int, reason: str, events: list[Event]) -> None:
        """A graceful GOAWAY: our streams above ``last`` were never processed; the rest go on."""
        self._peer_going_away = True
        if self._client_side:  # only clients open HBONE streams
            for stream_id in [sid for sid in self._streams if sid > last]:
                self._forget(stream_id)
                events.append(StreamReset(stream_id, wire.REFUSED_STREAM, remote=True))
        events.append(ConnectionDraining(last, reason))

    def _padded_data(self, flags: int, stream_id: int, payload: memoryview, events: list[Event]) -> None:
        length = len(payload)
        body = _unpad(payload) if flags & wire.PADDED else payload
        before = self._recv_window
        self._data_begin(stream_id, flags, length, events)
        self._data_left = 0
        self._data_piece(bytes(body), length, True, events)
        if not body and not flags & wire.END_STREAM:
            self._count_empty_data(before)

    def _count_empty_data(self, before: int) -> None:
        """Rule D: a DATA frame with nothing in it that does not end its stream; ``before`` is the connection's
        receive window as the frame began (a padded frame's own padding moves it)."""
        self._empty_run = self._empty_run + 1 if before == self._empty_mark else 1
        self._empty_mark = self._recv_window
        if self._empty_run > MAX_EMPTY_DATA:
            raise HboneProtocolError(wire.ENHANCE_YOUR_CALM, "too many empty DATA frames in a row")

    def _headers(self, flags: int, stream_id: int, payload: memoryview, events: list[Event]) -> None:
        if stream_id == 0:
            raise HboneProtocolError(wire.PROTOCOL_ERROR, "HEADERS on stream 0")
        body = _unpad(payload) if flags & wire.PADDED else payload
        if flags & wire.PRIORITY_FLAG:
            if len(body) < 5:
                raise HboneProtocolError(wire.PROTOCOL_ERROR, "HEADERS too short for its priority")
            body = body[5:]
        end_stream = bool(flags & wire.END_STREAM)
        if flags & wire.END_HEADERS:
            self._header_block(stream_id, bytes(body), end_stream, events)
        else:
            self._continuation = (stream_id, end_stream, bytearray(body))
            self._continuations = 0

    def _header_continuation(
        self, frame_type: int, flags: int, stream_id: int, payload: memoryview, events: list[Event]
    ) -> None:
        assert self._continuation is not None
        expected, end_stream, block = self._continuation
        if frame_type != wire.CONTINUATION or stream_id != expected:
            raise HboneProtocolError(wire.PROTOCOL_ERROR, "a header block was interrupted by another frame")
        block += payload
        if len(block) > _MAX_HEADER_BLOCK:
            raise HboneProtocolError(wire.ENHANCE_YOUR_CALM, "header block too large")
        self._continuations += 1
        if self._continuations > MAX_CONTINUATIONS:
            raise HboneProtocolError(wire.ENHANCE_YOUR_CALM, "too many CONTINUATION frames in one header block")
        if flags & wire.END_HEADERS:
            self._continuation = None
            self._header_block(stream_id, bytes(block), end_stream, events)

    def _header_block(self, stream_id: int, block: bytes, end_stream: bool, events: list[Event]) -> None:
        try:
            headers = hpack_blocks.decode(self._decoder, block)
        except (HPACKError, ValueError, IndexError, KeyError, UnicodeError) as e:
            raise HboneProtocolError(wire.COMPRESSION_ERROR, f"bad header block: {e!r}") from None
        self._on_headers(stream_id, headers, end_stream, events)

    def _on_headers(self, stream_id: int, headers: RawHeaders, end_stream: bool, events: list[Event]) -> None:
        """The subclass's reading of a complete, decoded header block."""
        raise NotImplementedError

    def _trailers(self, stream_id: int, end_stream: bool, events: list[Event]) -> None:
        """HEADERS after the first block of a stream: allowed only as the end of it; the fields carry nothing."""
        if end_stream:
            self._remote_end(stream_id, events)
        else:
            self._stream_error(stream_id, wire.PROTOCOL_ERROR, events)

    def _settings_frame(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id != 0:
            raise HboneProtocolError(wire.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & wire.ACK:
            if payload:
                raise HboneProtocolError(wire.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise HboneProtocolError(wire.FRAME_SIZE_ERROR, "SETTINGS payload is not a multiple of 6 octets")
        for key, value in wire.parse_settings(bytes(payload)):
            if key == wire.HEADER_TABLE_SIZE:
                size = min(value, _ENCODER_TABLE)
                # Setting a fresh encoder's own size changes nothing (its table stays empty, not resized): the
                # encoder is made only for a size that differs, or kept up to date once it exists.
                if self._hpack_encoder is not None or size != _ENCODER_TABLE:
                    self._encoder.header_table_size = size
            elif key == wire.ENABLE_PUSH:
                if value > 1 or (value == 1 and self._client_side):
                    raise HboneProtocolError(wire.PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value}")
            elif key == wire.MAX_CONCURRENT_STREAMS:
                self._peer_max_streams = value
            elif key == wire.INITIAL_WINDOW_SIZE:
                if value > wire.LARGEST_WINDOW:
                    raise HboneProtocolError(wire.FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE {value}")
                delta, self._peer_initial_window = value - self._peer_initial_window, value
                for stream in self._streams.values():
                    stream.send_window += delta
                    if stream.send_window > wire.LARGEST_WINDOW:
                        raise HboneProtocolError(wire.FLOW_CONTROL_ERROR, "a stream window overflowed")
            elif key == wire.MAX_FRAME_SIZE:
                if not wire.DEFAULT_MAX_FRAME <= value <= wire.LARGEST_FRAME:
                    raise HboneProtocolError(wire.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value}")
                self._peer_max_frame = value
            elif key == wire.ENABLE_CONNECT_PROTOCOL and value > 1:
                raise HboneProtocolError(wire.PROTOCOL_ERROR, f"SETTINGS_ENABLE_CONNECT_PROTOCOL {value}")
        self._peer_settings_seen = True
        self._owe_ack()
        self._out.append(_SETTINGS_ACK)

    def _window_update(self, stream_id: int, payload: memoryview, events: list[Event]) -> None:
        if len(payload) != 4:
            raise HboneProtocolError(wire.FRAME_SIZE_ERROR, "WINDOW_UPDATE is not 4 octets")
        increment = wire.u32(payload) & wire.STREAM_ID_MASK
        if stream_id == 0:
            if increment == 0:
                raise HboneProtocolError(wire.PROTOCOL_ERROR, "WINDOW_UPDATE of 0 on the connection")
            self._send_window += increment
            if self._send_window > wire.LARGEST_WINDOW:
                raise HboneProtocolError(wire.FLOW_CONTROL_ERROR, "the connection window overflowed")
            return
        if self._is_idle(stream_id):
            raise HboneProtocolError(wire.PROTOCOL_ERROR, f"WINDOW_UPDATE on stream {stream_id}, never opened")
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        stream.send_window += increment
        if increment == 0:
            self._stream_error(stream_id, wire.PROTOCOL_ERROR, events)
        elif stream.send_window > wire.LARGEST_WINDOW:
            self._stream_error(stream_id, wire.FLOW_CONTROL_ERROR, events)
        elif stream.queue and stream.ready:
            self._blocked[stream_id] = None

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

    def _count_early_reset(self) -> None:
        """A stream reset before we answered it, or for a protocol error: it set the application to work for nothing.

        The "rapid reset" attack (CVE-2023-44487) is a stream of client resets, "MadeYouReset" (CVE-2025-8671) one of
        invalid frames that make us reset (rule A). Every answer we give pays one back, so a client that sometimes
        gives up on a slow tunnel is never at risk; one that gets more than ``MAX_EARLY_RESETS`` streams reset
        beyond what it let us answer loses the connection.
        """
        self._early_resets += 1
        if self._early_resets > MAX_EARLY_RESETS:
            raise HboneProtocolError(wire.ENHANCE_YOUR_CALM, "too many streams reset before they were answered")

    def _owe_ack(self) -> None:
        self._acks_owed += 1
        if self._output_blocked and self._acks_before + self._acks_owed > MAX_QUEUED_CONTROL:
            raise HboneProtocolError(
                wire.ENHANCE_YOUR_CALM, "too many control frames queued for a peer that does not read"
            )

    def _give_back(self, length: int) -> None:
        self._recv_unacked += length
        if self._recv_unacked >= self._settings.connection_window >> 1:
            self._out.append(wire.window_update(0, self._recv_unacked))
            self._recv_window += self._recv_unacked
            self._recv_unacked = 0

    def _remote_end(self, stream_id: int, events: list[Event]) -> None:
        stream = self._streams.get(stream_id)
        if stream is not None and not stream.remote_closed:
            stream.remote_closed = True
            events.append(StreamEnded(stream_id))
            self._maybe_finished(stream_id, stream)

    def _stream_error(self, stream_id: int, code: int, events: list[Event]) -> None:
        """The peer broke a rule of one stream: reset it and tell the application."""
        self._out.append(wire.rst_stream(stream_id, code))
        if self._forget(stream_id) is not None:
            events.append(StreamReset(stream_id, code, remote=False))
        if not self._client_side:
            self._count_early_reset()  # rule A: the client made us reset

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


def _unpad(payload: memoryview) -> memoryview:
    """The payload of a PADDED frame without its pad length octet and padding."""
    if not payload:
        raise HboneProtocolError(wire.PROTOCOL_ERROR, "padded frame without a pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise HboneProtocolError(wire.PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]
