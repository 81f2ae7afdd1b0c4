"""When the xDS server gives the allocator's free memory back to the system: after a burst of large openings.

Theory of operation: a control plane that restarts reads every node proxy's opening request (up to
:data:`~ambit.xds.server.MAX_REQUEST_BYTES` each; 6.7 MB at 110,000 workloads), a few at a time. gRPC's buffers and
the parsed requests are freed as soon as each is decided, but glibc's allocator keeps most of the freed memory in
its arenas for later use, so the server's resident memory after the burst stays near its peak though little of it
is live. ``malloc_trim(0)`` hands the free pages back. It walks every arena (holding each one's lock while it does,
so a thread allocating from that arena waits), so it runs on a worker thread, once per burst, not per stream.
:class:`TrimPolicy` decides when; the server's shell counts the openings and runs the trim.

Rules:

1. Each opening request read counts its size (:meth:`TrimPolicy.read`).
2. When no opening has been in flight (none reading, none waiting for a slot) for :attr:`TrimPolicy.quiet`
   seconds (the shell then calls :meth:`TrimPolicy.idle`), a trim is due if at least
   :attr:`TrimPolicy.after_bytes` were read since the last trim began; the count then starts again from zero. The
   quiet time keeps a burst whose openings arrive one by one (admission lets them in at its rate, and each is
   decided in milliseconds) from trimming between each two of them.
3. At most one trim runs at a time: while one runs, none is due (:meth:`TrimPolicy.trimmed` ends it), and what is
   read meanwhile counts towards the next.
4. Where the C library has no ``malloc_trim`` (not glibc), :func:`find_malloc_trim` finds none and nothing is
   trimmed.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["MALLOC_TRIM", "TRIM_AFTER_BYTES", "TrimPolicy", "find_malloc_trim"]

TRIM_AFTER_BYTES = 64 * 1024 * 1024
"""Opening bytes read since the last trim that make the next idle moment trim (rule 2): ten reconnects of
100,000 workloads; a handful of ordinary openings never add up to it between two bursts."""


@dataclass(slots=True)
class TrimPolicy:
    """Rules 1-3: the bytes read since the last trim, and whether a trim runs."""

    after_bytes: int = TRIM_AFTER_BYTES
    quiet: float = 1.0
    """Seconds without an opening in flight before a trim (rule 2)."""
    pending: int = 0
    """Opening bytes read since the last trim began."""
    running: bool = False

    def read(self, size: int) -> None:
        """An opening request of ``size`` bytes was read (rule 1)."""
        self.pending += size

    def idle(self) -> bool:
        """No opening has been in flight for :attr:`quiet` seconds: whether to trim now (rule 2). True starts a
        trim (rule 3)."""
        if self.running or self.pending < self.after_bytes:
            return False
        self.pending, self.running = 0, True
        return True

    def trimmed(self) -> None:
        """The trim started by :meth:`idle` ended."""
        self.running = False


def find_malloc_trim() -> Callable[[], int] | None:
    """glibc's ``malloc_trim(0)`` as a call (rule 4): 1 if memory was given back; None without glibc."""
    try:
        function = ctypes.CDLL(None).malloc_trim  # the C library the process runs on
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int

    def trim() -> int:
        return int(function(0))

    return trim


MALLOC_TRIM = find_malloc_trim()
"""This process's ``malloc_trim(0)``, found once at import (None without glibc)."""
