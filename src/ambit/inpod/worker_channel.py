"""The socketpair between a node proxy and one of its workers (:mod:`ambit.inpod.workers`): frames both ways.

A frame is a 4-byte big-endian length and that many bytes, at most :data:`MAX_FRAME`. The node proxy sends one
frame first, the worker's settings (pickled: parent to child on a private socketpair, which no one else holds, so
it carries nothing the child must not trust; the child checks it is settings); then the worker sends its metrics
reports (JSON: what a child sends the parent is data, judged by :mod:`ambit.telemetry.peer_counts`). The end of the
stream between frames is the end; anywhere else, or an oversized frame, or bytes that are no JSON, a
:class:`ChannelError`.

After the settings, the node proxy's word on its drain goes down as single bytes, :data:`DRAIN` and :data:`CUT`, not
as signals: a worker may also get the SIGTERM its node proxy got (a runtime or an init system signalling the whole
process group or cgroup), and a second SIGTERM cuts a drain short, so the node proxy's own word must be one a worker
can hear twice without harm.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import socket
import struct

from ambit.errors import AmbitError
from ambit.inpod.settings import NodeProxySettings

MAX_FRAME = 64 * 1024 * 1024
"""Bytes in one frame: a report of :data:`~ambit.telemetry.peer_counts.MAX_SERIES` series fits."""
_LENGTH = struct.Struct(">I")

DRAIN = b"d"
"""The node proxy's drain began: drain too (a worker already draining goes on as it was)."""
CUT = b"c"
"""The node proxy's drain was cut short (asked again, or its bound reached): close every connection now."""


class ChannelError(AmbitError):
    """The other end sent what is no frame of this channel."""


def frame(payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME:
        raise ChannelError(f"a frame of {len(payload)} bytes is over {MAX_FRAME}")
    return _LENGTH.pack(len(payload)) + payload


async def write_settings(writer: asyncio.StreamWriter, settings: NodeProxySettings) -> None:
    writer.write(frame(pickle.dumps(settings, protocol=pickle.HIGHEST_PROTOCOL)))
    await writer.drain()


def read_settings(sock: socket.socket) -> NodeProxySettings:
    """The worker's first read (blocking, before its event loop): its settings."""
    payload = _read_exactly(sock, _length(_read_exactly(sock, _LENGTH.size)))
    try:
        settings = pickle.loads(payload)  # from the parent process, on a socketpair only it holds
    except Exception as exc:  # any unpickling failure is the same refusal
        raise ChannelError(f"the settings frame does not load: {exc}") from None
    if not isinstance(settings, NodeProxySettings):
        raise ChannelError(f"the settings frame holds a {type(settings).__name__}, not settings")
    return settings


def say(writer: asyncio.StreamWriter, word: bytes) -> None:
    """Send the worker one of the node proxy's words (a byte: buffered at once, never waits)."""
    if word not in (DRAIN, CUT):
        raise ChannelError(f"not a word of this channel: {word!r}")
    if not writer.is_closing():
        writer.write(word)


async def write_report(writer: asyncio.StreamWriter, report: bytes) -> None:
    """Send ``report`` (JSON bytes)."""
    writer.write(frame(report))
    await writer.drain()


async def read_frame(reader: asyncio.StreamReader) -> object | None:
    """The next report as parsed JSON, or None at the end of the stream."""
    try:
        head = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ChannelError("the stream ended inside a frame's length") from None
        return None
    length = _length(head)
    try:
        payload = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise ChannelError(f"the stream ended inside a frame of {length} bytes") from None
    try:
        report: object = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise ChannelError(f"a report that is no JSON: {exc}") from None
    return report


def _length(head: bytes) -> int:
    (length,) = _LENGTH.unpack(head)
    if length > MAX_FRAME:
        raise ChannelError(f"a frame of {length} bytes is over {MAX_FRAME}")
    return int(length)


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    chunks, left = [], count
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ChannelError(f"the stream ended {left} bytes short of a frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
