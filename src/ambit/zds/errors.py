"""ZDS errors: the ``ZdsError`` subtree of :class:`ambit.errors.AmbitError`::

ZdsError
└── ProtocolError   a ZDS rule was broken; ``blame`` says by whom (the peer, or our own caller)
"""

from __future__ import annotations

import enum

from ambit.errors import AmbitError


class Blame(enum.Enum):
    """Who broke the rule: the other end of the socket, or the code driving this end."""

    PEER = "peer"
    LOCAL = "local"


class ZdsError(AmbitError):
    """Base class of ZDS errors."""


class ProtocolError(ZdsError):
    """A datagram or a request broke the ZDS rules of spec §3."""

    def __init__(self, reason: str, blame: Blame = Blame.PEER) -> None:
        super().__init__(f"ZDS protocol error ({blame.value}): {reason}")
        self.reason = reason
        self.blame = blame
