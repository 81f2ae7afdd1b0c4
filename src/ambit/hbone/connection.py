"""The shared core of both HBONE ends: our own HTTP/2 engine for the subset HBONE uses (RFC 9113), sans-IO.

Theory of operation. ``receive_data`` walks the frames in the bytes it is given and turns them into
:mod:`ambit.hbone.events`; the subclasses (``client.py``, ``server.py``) interpret the HEADERS of their side
(``_on_headers``). Everything to send is appended to a list of byte strings that ``data_to_send`` joins once.

:class:`HboneConnection` is built in layers, one module each, each layer a base class of the next (methods are
inherited, not wrapped: a frame costs no extra call): :mod:`ambit.hbone.state` (the fields, the stream table, flow
control and the framing of what we send), :mod:`ambit.hbone.budgets` (what a flood may cost the peer, rules A to
D), :mod:`ambit.hbone.receiving` (the frame parser) and this module, the application's interface: streams, pings,
GOAWAY, output. Its parameters are :class:`~ambit.hbone.settings.HboneSettings`.

Why not h2: HBONE needs one request shape (CONNECT), DATA both ways, flow control and resets, and h2's general
state machines cost more than that needs. ``bench/hbone_micro.py`` (in-memory pairs, no TLS): a 1-byte round trip
takes 21 µs of Python through h2 4.4 and 6 µs through this engine; an idle tunnel holds about 1,000 bytes of heap in
h2 and 330 here. HPACK's state is the ``hpack`` package's (h2's own codec: its encoder's and decoder's tables), the
blocks are coded against it by :mod:`ambit.hbone.hpack_blocks` and :mod:`ambit.hbone.hpack_literals`; h2 itself
remains the independent peer of the interoperability tests.

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

from collections import deque

from ambit.hbone import wire
from ambit.hbone.budgets import ACK_WINDOW
from ambit.hbone.errors import HboneError
from ambit.hbone.receiving import FrameReceiver
from ambit.hbone.settings import HboneSettings
from ambit.hbone.state import DataSink

_pack_header = wire.HEADER.pack
"""``wire.frame_header`` without its call, for DATA sent straight through (the hot path)."""


class HboneConnection(FrameReceiver):
    """Behaviour shared by :class:`HboneClientConnection` and :class:`HboneServerConnection`."""

    # --- the byte interface ---------------------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """Bytes to write to the peer, ``b""`` when there are none."""
        out = self._out
        if not out:
            return b""
        data = b"".join(out)
        out.clear()
        self._bucket_out += len(data)
        if self._bucket_out >= ACK_WINDOW:  # rule B's buckets
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
            if self._bucket_out >= ACK_WINDOW:
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

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def settings(self) -> HboneSettings:
        return self._settings

    @property
    def active_streams(self) -> int:
        return len(self._streams)
