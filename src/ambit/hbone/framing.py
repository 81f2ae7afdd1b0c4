"""Fast paths for DATA frames under h2 4.4, receive and send; h2 keeps every protocol decision.

Receive. ``H2Connection._receive_frame`` evaluates ``repr(frame)`` for a trace log on *every* received frame,
before the logger (even h2's no-op ``DummyLogger``) can decline it, and hyperframe's ``DataFrame`` repr
re-serialises the body and hex-encodes all of it: with 64 KiB frames that was most of the receive time. A no-op
logger cannot help, because the string is built by the caller. :class:`QuietFrameBuffer` parses unpadded DATA
frames outside a header block into :class:`QuietDataFrame`, a ``DataFrame`` whose repr is a constant-size summary
and whose payload is copied once (bytearray → bytes) instead of twice (slice, then ``tobytes``). Padded DATA,
HEADERS/CONTINUATION sequencing and every other frame type go through h2's own ``FrameBuffer`` logic. h2
dispatches on the exact frame class, so the subclass is registered with h2's DATA handler; flow-control and
stream-state checks stay in h2.

Send. h2 serialises each frame (body join, header + body), appends it to a bytearray and copies that again in
``data_to_send``: four copies per byte. :class:`QuietH2Connection` keeps a list instead, in which an unpadded DATA
frame is its 9-byte header plus the caller's buffer (a memoryview of immutable bytes is fine), and joins the list
once in ``data_to_send``: one copy per byte.

Invariant: the bytes on the wire and the frames h2 sees are exactly those of plain h2; only the Python objects
and the number of copies differ. ``tests/unit/test_hbone_pair.py`` runs against both.
"""

from __future__ import annotations

import struct

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.exceptions import FrameTooLargeError, ProtocolError
from h2.frame_buffer import FrameBuffer
from hyperframe.frame import DataFrame, Frame

_DATA = 0x0
_END_STREAM = 0x1
_PADDED = 0x8
_HEADER = struct.Struct(">HBBBL")


class QuietDataFrame(DataFrame):
    """A DATA frame whose repr does not touch the payload."""

    def __repr__(self) -> str:
        return f"DataFrame(stream_id={self.stream_id}): <{len(self.data)} bytes>"  # no sorted(flags), no hex


class QuietFrameBuffer(FrameBuffer):
    """h2's frame buffer with a direct path for unpadded DATA frames."""

    def __next__(self) -> Frame:
        data = self._data
        if len(data) < 9:
            raise StopIteration
        length = int.from_bytes(data[0:3], "big")
        if length > self.max_frame_size:
            # Checked before waiting for the body (h2 waits), so an announced giant frame is not buffered first.
            raise FrameTooLargeError(f"Received overlong frame: length {length}, max {self.max_frame_size}")
        if data[3] != _DATA or self._headers_buffer or data[4] & _PADDED:
            return super().__next__()
        if len(data) < 9 + length:
            raise StopIteration
        stream_id = int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
        if stream_id == 0:
            raise ProtocolError("Received frame with invalid header: DATA on stream 0")
        frame = QuietDataFrame(stream_id)
        if data[4] & _END_STREAM:
            frame.flags.add("END_STREAM")
        with memoryview(data) as view:
            frame.data = view[9 : 9 + length].tobytes()
        frame.body_len = length
        del data[: 9 + length]
        return frame


class QuietH2Connection(H2Connection):
    """An ``H2Connection`` with the quiet receive buffer and a list-based outbound buffer."""

    def __init__(self, config: H2Configuration) -> None:
        super().__init__(config)
        self._out: list[bytes | memoryview] = []
        self._frame_dispatch_table[QuietDataFrame] = self._frame_dispatch_table[DataFrame]
        self.incoming_buffer = QuietFrameBuffer(server=not config.client_side)

    def _prepare_for_sending(self, frames: list[Frame]) -> None:
        out = self._out
        for frame in frames:
            if type(frame) is DataFrame and "PADDED" not in frame.flags:
                length = len(frame.data)
                flags = _END_STREAM if "END_STREAM" in frame.flags else 0
                out.append(_HEADER.pack(length >> 8, length & 0xFF, _DATA, flags, frame.stream_id))
                out.append(frame.data)
            else:
                out.append(frame.serialize())

    def data_to_send(self, amount: int | None = None) -> bytes:
        if self._data_to_send:  # initiate_connection writes the preamble there directly
            self._out.insert(0, bytes(self._data_to_send))
            self._data_to_send = bytearray()
        data = b"".join(self._out)
        self._out.clear()
        if amount is not None and len(data) > amount:
            self._out.append(data[amount:])
            data = data[:amount]
        return data

    def clear_outbound_data_buffer(self) -> None:
        super().clear_outbound_data_buffer()
        self._out.clear()
