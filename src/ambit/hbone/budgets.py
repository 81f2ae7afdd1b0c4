"""The peer's budgets: what a flood of frames may cost it before we end its connection (a layer of the engine).

:class:`PeerBudgets` sits between :class:`~ambit.hbone.state.ConnectionState` and the frame parser
(:mod:`ambit.hbone.receiving`): the parser and the HBONE ends charge these budgets as frames arrive, the shell says
when its writes back up and drain.

Rules for the peer's budgets (what a flood costs it), all ending the connection with GOAWAY ENHANCE_YOUR_CALM:

A. Resets. Every stream that ends in a reset before we answered it, whoever reset it (the client's RST_STREAM,
   "rapid reset", CVE-2023-44487; or ours, provoked by a frame the client knew to be invalid, "MadeYouReset",
   CVE-2025-8671), and every stream we reset for a protocol error, costs one unit of the same budget; each answer
   we give pays one back. Past ``MAX_EARLY_RESETS`` units outstanding the connection ends.
B. Control responses. PING and SETTINGS each oblige us to send an ACK. The shell tells the core when its writes
   back up (``output_blocked``) and when they drain again (``output_drained``). When they back up, the bytes
   waiting are our latest output; if more than ``MAX_QUEUED_CONTROL`` ACKs are among our last
   ``ACK_WINDOW``-``2 * ACK_WINDOW`` octets of output (counted in two buckets, per ``data_to_send``, not per
   frame), or that many more are owed while blocked, the connection ends. A peer that reads what we send can
   ping as it likes, and old pings do not count against a later bulk transfer. The memory itself is bounded by
   the shell, which stops reading while its writes are paused; this rule makes a peer that floods us without
   reading lose the connection instead of just stalling it.
C. Header blocks. A block is at most ``MAX_HEADER_BLOCK`` octets and ``MAX_CONTINUATIONS`` CONTINUATION frames
   (empty CONTINUATION frames cost the byte cap nothing).
D. Empty DATA. A DATA frame that carries no data and does not end its stream (padding only, or nothing) asks us to
   parse a frame for nothing ("zero-length headers and data frames", CVE-2019-9518). More than
   ``MAX_EMPTY_DATA`` of them in a row, with no flow-controlled octet received between them, end the connection.
   "Between them" is read off the connection's receive window (``_empty_mark``), which every DATA octet moves,
   whoever parsed it (the Python parser or the native DATA path, which hands every empty frame to this engine).
"""

from __future__ import annotations

from typing import ClassVar

from ambit.hbone import wire
from ambit.hbone.errors import HboneProtocolError
from ambit.hbone.events import Event
from ambit.hbone.settings import MAX_HEADER_LIST
from ambit.hbone.state import ConnectionState

MAX_EARLY_RESETS = 100
"""Resets of unanswered streams (by either side) and protocol-error resets, beyond those paid back by answers,
before GOAWAY ENHANCE_YOUR_CALM (rule A)."""
MAX_QUEUED_CONTROL = 10_000
"""PING and SETTINGS ACKs owed while our output is backed up before GOAWAY ENHANCE_YOUR_CALM (rule B; the figure is
Go's ``maxQueuedControlFrames``)."""
ACK_WINDOW = 256 * 1024
"""Octets of output per bucket of rule B: the shell's transport buffer size at which writes pause."""
MAX_HEADER_BLOCK = 2 * MAX_HEADER_LIST
"""Compressed header block (HEADERS + CONTINUATION) we buffer before calling the peer abusive (rule C)."""
MAX_CONTINUATIONS = 32
"""CONTINUATION frames in one header block (rule C): a 128 KiB block in the smallest frames HTTP/2 allows needs 8."""
MAX_EMPTY_DATA = 10
"""Empty DATA frames without END_STREAM in a row before GOAWAY ENHANCE_YOUR_CALM (rule D; Envoy allows 1, we allow
a few for stacks that flush empty frames)."""


class PeerBudgets(ConnectionState):
    """Rules A, B and D kept on a connection's fields (``_early_resets``, ``_acks_*``, ``_bucket_out``,
    ``_empty_*``); rule C is kept where header blocks are parsed."""

    _ack_window: ClassVar[int] = ACK_WINDOW
    """Rule B's bucket, for the native DATA path (``ambit.native._hbone_data``), which keeps its count too."""

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

    def _count_empty_data(self, before: int) -> None:
        """Rule D: a DATA frame with nothing in it that does not end its stream; ``before`` is the connection's
        receive window as the frame began (a padded frame's own padding moves it)."""
        self._empty_run = self._empty_run + 1 if before == self._empty_mark else 1
        self._empty_mark = self._recv_window
        if self._empty_run > MAX_EMPTY_DATA:
            raise HboneProtocolError(wire.ENHANCE_YOUR_CALM, "too many empty DATA frames in a row")

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
