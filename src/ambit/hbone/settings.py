"""The parameters of one HBONE connection, and the bytes every connection sends first.

:class:`HboneSettings` is made once from configuration and passed down (frozen); each connection checks it as it
starts, through :func:`opening`, which builds that connection's first output (a client's preface, our SETTINGS,
the WINDOW_UPDATE that raises the connection's receive window) once per settings value.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ambit.hbone import wire
from ambit.hbone.errors import HboneError

MAX_HEADER_LIST = 64 * 1024
"""SETTINGS_MAX_HEADER_LIST_SIZE we advertise, and the most our HPACK decoder accepts."""
MAX_CONCURRENT_STREAMS = 100
"""Streams on one HBONE connection: what we allow a peer, and what a pool opens on one before dialling another
(ztunnel's ``POOL_MAX_STREAMS_PER_CONNECTION`` default, spec §6.2)."""
OPENINGS_CACHED = 16
"""Distinct (settings, side) pairs whose opening bytes are kept (:func:`opening`)."""


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


@functools.lru_cache(maxsize=OPENINGS_CACHED)
def opening(settings: HboneSettings, client_side: bool) -> bytes:
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
        (wire.MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST),
    ]
    parts = []
    if client_side:
        parts.append(wire.PREFACE)
        values.insert(1, (wire.ENABLE_PUSH, 0))
    parts.append(wire.settings_frame(values))
    if settings.connection_window > wire.DEFAULT_WINDOW:
        parts.append(wire.window_update(0, settings.connection_window - wire.DEFAULT_WINDOW))
    return b"".join(parts)
