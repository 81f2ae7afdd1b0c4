"""``x-request-id`` values for requests that arrive without one: random (version 4) UUIDs in their text form.

Theory of operation: a request id only has to be unique, but it is also what a log search or a trace joins on, so
it is as unguessable as :func:`uuid.uuid4`'s: 122 bits from :func:`os.urandom`. ``uuid4()`` asks the kernel for
16 bytes per id (one ``getrandom`` system call) and builds a :class:`uuid.UUID` only to print it; a waypoint makes
one per request. :class:`RequestIds` asks for :data:`BATCH` ids' worth of bytes at once and prints each id
straight from its 16 bytes. Rules:

1. An id is ``uuid.UUID(bytes=b, version=4)`` printed, for 16 fresh bytes ``b`` from ``os.urandom``: 32 lower-case
   hex digits in 8-4-4-4-12 groups, version digit ``4``, variant digit one of ``89ab`` (RFC 9562 §5.4).
2. No byte is used twice: each id takes the next 16 bytes of the batch, a new batch is read when one is used up.
3. A forked child starts with an empty batch (``os.register_at_fork``), so parent and child never share ids.
"""

from __future__ import annotations

import os
import weakref

__all__ = ["BATCH", "RequestIds"]

BATCH = 256
"""Ids per ``os.urandom`` call: 4 KiB of randomness, one system call per 256 requests."""

_VARIANT = "89ab89ab89ab89ab"
"""The variant digit for the high nibble of byte 8: ``10xx`` (RFC 9562 §4.1), indexed by the random nibble."""
_INSTANCES: weakref.WeakSet[RequestIds] = weakref.WeakSet()


class RequestIds:
    """A source of request ids (see the module rules)."""

    __slots__ = ("__weakref__", "_batch", "_used")

    def __init__(self) -> None:
        self._batch = ""
        self._used = 0
        _INSTANCES.add(self)

    def next(self) -> str:
        """A fresh random UUID in text form (rules 1 and 2)."""
        at = self._used
        if at >= len(self._batch):
            self._batch = os.urandom(16 * BATCH).hex()
            at = 0
        self._used = at + 32
        h = self._batch[at : at + 32]
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[int(h[16], 16)]}{h[17:20]}-{h[20:]}"

    def _forget(self) -> None:
        self._batch, self._used = "", 0


def _after_fork() -> None:  # rule 3
    for ids in list(_INSTANCES):
        ids._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
