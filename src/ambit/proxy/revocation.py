"""Peer certificate revocation in the node proxy: the CRL file (``CRL_PATH``), the check at each HBONE handshake,
and the teardown of established HBONE connections whose peer a new CRL revokes (ztunnel's CRL support).

Theory of operation: one :class:`RevocationManager` per proxy holds the current
:class:`~ambit.tls.revocation.RevocationList`. HBONE connections, inbound and outbound, call :meth:`admit` with
the peer's verified chain once the handshake and the identity check have passed; a revoked chain is refused there.
An admitted connection stays tracked (with its chain and a way to abort it) until it releases its
:class:`Tracked`. :meth:`poll` looks at the file; when a new table replaces the old one every tracked connection is
judged again, and those now revoked are aborted.

Rules:

1. No path: no checks at all. A path whose file does not exist: no checks until it appears (an optional ConfigMap
   volume is filled once the control plane creates the map). An empty file: no revocations.
2. A file that does not parse, cannot be read, or disappears after a good load leaves the last good table in force;
   the error is logged and shown in ``/config_dump`` (an unreadable file never turns checks off).
3. A revoked chain is refused at the handshake (:class:`PeerRevokedError`), and a tracked connection whose chain a
   new table revokes is aborted: both count ``istio_crl_policy_rejections_total{reporter}`` (``destination``
   inbound, ``source`` outbound). A chain that cannot be read while CRLs are loaded is refused too.
4. A connection admitted without its chain (the TLS library does not expose it) is counted in
   ``istio_crl_untracked_connections_total{reporter}``: it could be checked neither now nor later.
5. Tracking is independent of whether CRLs are loaded: a connection made before the first CRL arrives is judged
   when it does.

The manager is synchronous bookkeeping on the event loop's thread; only :meth:`run` awaits (the poll interval).
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ambit.proxy.errors import ProxyError
from ambit.supervision import poll_every
from ambit.telemetry.metrics import ProxyMetrics, Reporter

if TYPE_CHECKING:
    from ambit.tls.revocation import Revocation, RevocationList

log = logging.getLogger(__name__)

CRL_PATH_ENV = "CRL_PATH"
CRL_POLL_INTERVAL = 2.0
MAX_CRL_BYTES = 16 * 1024 * 1024
MAX_SHARED_CERTIFICATES = 4096


class PeerRevokedError(ProxyError):
    """The peer's certificate chain is revoked by the CRL in force (or cannot be checked against it)."""


@dataclass(slots=True)
class _Connection:
    chain: tuple[bytes, ...]
    reporter: Reporter
    peer: str
    on_revoked: Callable[[str], None]


class Tracked:
    """An admitted connection's place in the manager; :meth:`release` when the connection is over."""

    __slots__ = ("_id", "_manager")

    def __init__(self, manager: RevocationManager | None, ident: int) -> None:
        self._manager, self._id = manager, ident

    def release(self) -> None:
        if self._manager is not None:
            self._manager._connections.pop(self._id, None)
            self._manager = None


class RevocationManager:
    """The CRL file in force, the connections it may close, and the counters; see the module docstring."""

    def __init__(
        self,
        path: Path,
        metrics: ProxyMetrics,
        *,
        anchors: Callable[[], Sequence[bytes]] = tuple,
        interval: float = CRL_POLL_INTERVAL,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self._metrics = metrics
        self._anchors = anchors
        self._interval = interval
        self._wall_clock = wall_clock
        # cryptography's x509 stack loads with the first CRL the file holds, not with the manager: the lab's and
        # the chart's node proxies have a CRL path whose file exists only once the CA publishes one (issue 23)
        self.table: RevocationList | None = None
        """The CRLs in force; None until the file first held some (no revocations)."""
        self.error = ""
        self.loaded_at: float | None = None
        self._seen: tuple[int, int, int, int] | None = None
        self._content: bytes | None = None
        self._connections: dict[int, _Connection] = {}
        self._certificates: dict[bytes, bytes] = {}
        self._ids = itertools.count()

    # --- the handshake --------------------------------------------------------------------------------------

    def admit(
        self, chain: Sequence[bytes] | None, reporter: Reporter, peer: str, on_revoked: Callable[[str], None]
    ) -> Tracked:
        """Rule 3-5 for a connection whose handshake just passed: refuse it, or track it until released."""
        if chain is None:
            self._metrics.crl_untracked(reporter)
            log.warning("peer %s: no verified chain to check for revocation; the connection is untracked", peer)
            return Tracked(None, 0)
        reason = self._judge(chain)
        if reason is not None:
            self._metrics.crl_rejected(reporter)
            raise PeerRevokedError(f"peer {peer}: {reason}")
        ident = next(self._ids)
        self._connections[ident] = _Connection(tuple(map(self._shared, chain)), reporter, peer, on_revoked)
        return Tracked(self, ident)

    def _shared(self, der: bytes) -> bytes:
        """One bytes object per distinct certificate: the connections to one peer hold its chain once, not each a
        copy of the ~2 KB the TLS library hands out per handshake."""
        known = self._certificates.get(der)
        if known is None:
            if len(self._certificates) >= MAX_SHARED_CERTIFICATES:
                self._certificates.clear()  # only sharing is lost; every connection keeps its own chain
            known = self._certificates[der] = der
        return known

    def _judge(self, chain: Sequence[bytes]) -> str | None:
        if self.table is None:
            return None
        from ambit.tls.revocation import RevocationError

        try:
            revoked: Revocation | None = self.table.find_revoked(chain)
        except RevocationError as exc:
            return str(exc)
        return None if revoked is None else str(revoked)

    @property
    def tracked(self) -> int:
        return len(self._connections)

    # --- the file -------------------------------------------------------------------------------------------

    def poll(self) -> bool:
        """Look at the file once (rules 1-2); True when a new table came into force (connections re-checked)."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            if self._content is not None and self._seen is not None:
                self._fail("the CRL file is gone; the last CRL stays in force")
            self._seen = None
            return False
        except OSError as exc:
            self._seen = None
            self._fail(f"cannot read the CRL file: {exc}")
            return False
        signature = (stat.st_ino, stat.st_dev, stat.st_size, stat.st_mtime_ns)
        if signature == self._seen:
            return False
        self._seen = signature
        if stat.st_size > MAX_CRL_BYTES:
            self._fail(f"the CRL file is over {MAX_CRL_BYTES} bytes; the last CRL stays in force")
            return False
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            self._seen = None
            self._fail(f"cannot read the CRL file: {exc}")
            return False
        if data == self._content:
            self.error = ""
            return False
        try:
            anchors = self._anchors()
        except OSError:
            anchors = ()
        from ambit.tls.revocation import RevocationError, RevocationList

        try:
            table = RevocationList.parse(data, anchors=anchors)
        except RevocationError as exc:
            self._fail(f"{exc}; the last CRL stays in force")
            return False
        self.replace(table)
        self._content = data
        return True

    def replace(self, table: RevocationList) -> int:
        """Put ``table`` in force and close the tracked connections it revokes; returns how many were closed."""
        self.table = table
        self.error = ""
        self.loaded_at = self._wall_clock()
        for message in table.errors:
            log.error("CRL %s: %s", self.path, message)
        log.info("CRL %s: %d CRL(s) in force", self.path, len(table))
        closed = 0
        for ident, conn in list(self._connections.items()):
            reason = self._judge(conn.chain)
            if reason is None:
                continue
            self._connections.pop(ident, None)
            self._metrics.crl_rejected(conn.reporter)
            log.warning("closing the HBONE connection with %s: %s", conn.peer, reason)
            conn.on_revoked(f"peer certificate revoked: {reason}")
            closed += 1
        return closed

    def _fail(self, message: str) -> None:
        if message != self.error:
            log.error("CRL %s: %s", self.path, message)
        self.error = message

    async def run(self) -> None:
        """Poll every ``interval`` seconds until cancelled; an error of one poll (a connection's ``on_revoked``, a
        CRL the parser chokes on) is logged and the next poll comes as usual (:mod:`ambit.supervision`)."""
        await asyncio.sleep(self._interval)
        await poll_every(self._interval, self.poll, f"the CRL watcher of {self.path}")

    def to_dump(self) -> dict[str, Any]:
        now = datetime.datetime.fromtimestamp(self._wall_clock(), tz=datetime.UTC)
        return {
            "path": str(self.path),
            "loaded": self.loaded_at is not None,
            "loadedAt": (
                datetime.datetime.fromtimestamp(self.loaded_at, tz=datetime.UTC).isoformat()
                if self.loaded_at is not None
                else ""
            ),
            "error": self.error,
            "ignored": [] if self.table is None else list(self.table.errors),
            "crls": [] if self.table is None else [info.to_dump(now) for info in self.table.infos],
            "trackedConnections": len(self._connections),
        }
