"""The write side of a TLS transport that writes on the socket itself: what is waiting, and when to say stop.

Theory of operation: :class:`WriteBacklog` is the bookkeeping of :mod:`ambit.tls.socket_transport`'s writes, with
no socket and no clock. The shell offers :meth:`WriteBacklog.next_chunk` to OpenSSL (``SSL_write``), reports what it
took (:meth:`WriteBacklog.sent`; a chunk it refused stays offered, and a write it refused before anything was
buffered is handed over with :meth:`WriteBacklog.refused`), and acts on the verdicts: ``append`` answers
whether the protocol must now be paused, ``sent`` whether it may now resume.

Rules:

1. A chunk OpenSSL refused (``SSL_ERROR_WANT_WRITE`` / ``WANT_READ``) is offered again, the very same chunk and
   nothing before it: OpenSSL has already sent some of its records and counts on the retry carrying the rest
   (Python sets ``SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER``, so the same bytes at another address are fine, but not
   other bytes or fewer).
2. Bytes leave in the order they were appended. A chunk is one appended buffer as it is when that buffer is large,
   else the small buffers next to each other joined up to ``chunk_size`` (one ``SSL_write``, fewer records).
3. Flow control is asyncio's contract: once the buffered size goes above ``high`` the protocol is paused, once;
   it is resumed, once, when the size comes down to ``low`` or below. ``0 <= low <= high``.
4. The buffered size counts what is held outside this bookkeeper too: the ciphertext a native record layer
   (:mod:`ambit.tls.native_transport`) encrypted and the socket has not taken yet (:meth:`WriteBacklog.hold`).
   Those bytes are ahead of every chunk here: they were encrypted before it.
"""

from __future__ import annotations

from collections import deque

DEFAULT_HIGH = 64 * 1024
CHUNK_SIZE = 256 * 1024
"""The largest join of small buffers offered to OpenSSL in one write (16 records of 16 KiB)."""


class WriteBacklog:
    """Bytes accepted by the transport and not yet taken by OpenSSL (see the module docstring)."""

    __slots__ = ("_chunk_size", "_offered", "_paused", "_queue", "held", "high", "low", "size")

    def __init__(self, high: int = DEFAULT_HIGH, low: int | None = None, chunk_size: int = CHUNK_SIZE) -> None:
        self._queue: deque[bytes] = deque()
        self._offered: bytes | None = None  # refused by OpenSSL: offered again first (rule 1)
        self._paused = False
        self._chunk_size = chunk_size
        self.size = 0
        """Bytes buffered, the refused chunk and the bytes held outside included."""
        self.held = 0
        """Bytes held outside (rule 4)."""
        self.high = DEFAULT_HIGH
        self.low = DEFAULT_HIGH // 4
        self.set_limits(high, low)

    def set_limits(self, high: int | None = None, low: int | None = None) -> bool:
        """asyncio's ``set_write_buffer_limits``; True when the protocol must be paused now."""
        if high is None:
            high = DEFAULT_HIGH if low is None else 4 * low
        if low is None:
            low = high // 4
        if not 0 <= low <= high:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self.high, self.low = high, low
        return self._check_pause()

    def __bool__(self) -> bool:
        return self.size > 0

    @property
    def paused(self) -> bool:
        """The protocol was told to pause and not yet to resume."""
        return self._paused

    def append(self, data: bytes) -> bool:
        """Buffer ``data`` behind what is waiting; True when the protocol must be paused now (rule 3)."""
        if data:
            self._queue.append(data)
            self.size += len(data)
        return self._check_pause()

    def refused(self, data: bytes) -> bool:
        """OpenSSL refused ``data``, written straight to it with nothing buffered: it is the chunk offered next, as
        it is (rule 1). True when the protocol must be paused now."""
        if self.size - self.held:
            raise ValueError("a refused write with bytes already buffered")
        if data:
            self._offered = data
            self.size += len(data)
        return self._check_pause()

    @property
    def plain(self) -> int:
        """Bytes buffered here, not counting those held outside."""
        return self.size - self.held

    def hold(self, held: int) -> bool:
        """``held`` bytes are now held outside (rule 4); True when the protocol must be paused now."""
        if held < 0:
            raise ValueError(f"{held} bytes held")
        self.size += held - self.held
        self.held = held
        return self._check_pause()

    def released(self) -> bool:
        """True when the protocol may resume now (rule 3): after :meth:`hold` brought the size down."""
        if self._paused and self.size <= self.low:
            self._paused = False
            return True
        return False

    def next_chunk(self) -> bytes | None:
        """What to offer OpenSSL now (rules 1 and 2); None when nothing is waiting."""
        if self._offered is not None:
            return self._offered
        queue = self._queue
        if not queue:
            return None
        first = queue.popleft()
        if len(first) >= self._chunk_size // 4 or not queue:
            self._offered = first
            return first
        parts, total = [first], len(first)
        while queue and total + len(queue[0]) <= self._chunk_size:
            part = queue.popleft()
            parts.append(part)
            total += len(part)
        self._offered = b"".join(parts)
        return self._offered

    def sent(self, count: int, held: int | None = None) -> bool:
        """OpenSSL took ``count`` bytes of the chunk offered (and ``held`` bytes are now held outside, when given);
        True when the protocol may resume now (rule 3)."""
        offered = self._offered
        if offered is None or not 0 < count <= len(offered):
            raise ValueError(f"sent {count} bytes of a chunk of {0 if offered is None else len(offered)}")
        if held is not None and held < 0:
            raise ValueError(f"{held} bytes held")
        self._offered = offered[count:] if count < len(offered) else None
        self.size -= count
        if held is not None:
            self.size += held - self.held
            self.held = held
        return self.released()

    def clear(self) -> None:
        """Forget everything (the connection is gone); the protocol is not resumed."""
        self._queue.clear()
        self._offered = None
        self.size = self.held = 0

    def _check_pause(self) -> bool:
        if not self._paused and self.size > self.high:
            self._paused = True
            return True
        return False
