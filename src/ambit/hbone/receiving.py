"""Frames in: the parser of the HBONE engine, turning the peer's bytes into :mod:`ambit.hbone.events` (sans-IO).

:class:`FrameReceiver` is the layer of :class:`~ambit.hbone.connection.HboneConnection` that reads. ``receive_data``
walks the frames in the bytes it is given; the subclasses (``client.py``, ``server.py``, ``messages.py``) interpret
the HEADERS of their side (``_on_headers``), and the peer's budgets (:mod:`ambit.hbone.budgets`) are charged as
frames arrive.

DATA is the hot path and is never buffered whole: once a DATA frame's 9-octet header is read, its payload is
handed on (``DataReceived``) in whatever pieces arrive, each piece counted against the windows as it comes, so a
large frame split over many TLS reads is neither copied into a reassembly buffer nor delayed until its last read.
A piece is a read-only memoryview of the ``bytes`` given to ``receive_data`` (no copy at all) unless it came out
of the reassembly buffer, which is reused, and is then copied to ``bytes``. Only the other frame types (and padded
DATA, which nobody sends) wait for their whole frame.

Rules the peer must keep, and what breaking them costs (RFC 9113 §5.4): a malformed frame, an unexpected frame type
or stream, a flow-control overrun or an HPACK failure ends the connection (GOAWAY, ``ConnectionTerminated``); a
frame that is wrong only for its stream (DATA after END_STREAM, a bad response) resets that stream
(RST_STREAM, ``StreamReset(remote=False)``). Frames for streams we have forgotten are dropped (their DATA is still
counted and given back to the connection window).

Every header block is HPACK-decoded in order, even for streams we drop, or the decoder's table would drift; and
nothing the peer sends makes ``receive_data`` raise (invariants 3 and 5 of :mod:`ambit.hbone.connection`).
"""

from __future__ import annotations

from typing import ClassVar

from hpack.exceptions import HPACKError

from ambit.hbone import hpack_blocks, wire
from ambit.hbone.budgets import MAX_CONTINUATIONS, MAX_HEADER_BLOCK, PeerBudgets
from ambit.hbone.errors import HboneProtocolError
from ambit.hbone.events import (
    ConnectionDraining,
    ConnectionTerminated,
    DataReceived,
    Event,
    PingAcknowledged,
    StreamReset,
)
from ambit.hbone.state import ENCODER_TABLE

_SETTINGS_ACK = wire.frame(wire.SETTINGS, wire.ACK, 0)
"""Shared, not built per ACK: a SETTINGS flood then costs our output list a pointer per frame."""

RawHeaders = list[tuple[bytes, bytes]]


class FrameReceiver(PeerBudgets):
    """Parsing the peer's frames, and what each does to the connection's state."""

    _graceful_goaway: ClassVar[bool] = False
    """GOAWAY(NO_ERROR) lets the streams in flight finish (see :mod:`ambit.hbone.connection`); else it ends them
    all."""

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
        if len(block) > MAX_HEADER_BLOCK:
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
                size = min(value, ENCODER_TABLE)
                # Setting a fresh encoder's own size changes nothing (its table stays empty, not resized): the
                # encoder is made only for a size that differs, or kept up to date once it exists.
                if self._hpack_encoder is not None or size != ENCODER_TABLE:
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

    def _stream_error(self, stream_id: int, code: int, events: list[Event]) -> None:
        """The peer broke a rule of one stream: reset it and tell the application."""
        self._out.append(wire.rst_stream(stream_id, code))
        if self._forget(stream_id) is not None:
            events.append(StreamReset(stream_id, code, remote=False))
        if not self._client_side:
            self._count_early_reset()  # rule A: the client made us reset


def _unpad(payload: memoryview) -> memoryview:
    """The payload of a PADDED frame without its pad length octet and padding."""
    if not payload:
        raise HboneProtocolError(wire.PROTOCOL_ERROR, "padded frame without a pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise HboneProtocolError(wire.PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]
