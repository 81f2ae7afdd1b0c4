"""Following the plug-in CA's files while the control plane runs: a changed, good set replaces the signing CA.

Theory of operation (istiod's cacerts watch): :class:`PluginCaWatcher` looks at the four files
(:class:`~ambit.controlplane.ca.rotation.CaFiles`) every ``interval`` seconds, first at their identities (inode,
device, size, modification time, following symbolic links, and the target of a kubelet-style ``..data`` link),
and reads them only when those moved. :func:`~ambit.controlplane.ca.rotation.judge_ca_files` decides; a new CA
goes to ``on_reload`` (the control plane swaps the signer and publishes the trust bundle), a refusal to
``on_refused`` (the control plane logs it and records a Warning Event), and the CA in use stays.

Rules:

1. A change is judged only once the files' identities have held still across two looks (one ``interval``), so a
   set written one file at a time is judged once, whole, not file by file (istiod waits 100 ms after an event).
2. A read is trusted only if the identities did not move while it ran: a Secret volume swapped (``..data``
   renamed) between reading ``ca-cert.pem`` and ``ca-key.pem`` gives parts of two sets, and is read again at the
   next look instead of being judged.
3. Each distinct set is judged once: a refused set is reported once, not at every look, and the watcher goes on
   looking (the next good set is taken).
4. The files going away is a refusal like any other (rule 1 of the decision): the CA in use stays.

The bound: a set written at time t is signing by t + 2 ``interval`` (plus a read), on top of whatever delay the
files' source has (a kubelet updates a Secret volume within its sync period, about a minute).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ambit.controlplane.ca.rootca import RootCa
from ambit.controlplane.ca.rotation import (
    CA_CERT_FILE,
    CA_KEY_FILE,
    CERT_CHAIN_FILE,
    ROOT_CERT_FILE,
    CaEvent,
    CaFiles,
    CaVerdict,
    Refusal,
    judge_ca_files,
)
from ambit.supervision import poll_every

log = logging.getLogger(__name__)

CA_POLL_INTERVAL = 2.0
DATA_LINK = "..data"
MAX_CA_FILE_BYTES = 1024 * 1024
"""A Secret holds at most 1 MiB; a larger file is a wrong path, refused before it is read."""

Signature = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class CaPaths:
    """Where the plug-in CA's files are; ``chain`` and ``root`` are optional files."""

    cert: Path
    key: Path
    chain: Path | None = None
    root: Path | None = None

    @classmethod
    def in_directory(cls, directory: Path) -> CaPaths:
        """Istio's ``cacerts`` layout."""
        return cls(
            directory / CA_CERT_FILE, directory / CA_KEY_FILE, directory / CERT_CHAIN_FILE, directory / ROOT_CERT_FILE
        )

    def all(self) -> tuple[Path | None, ...]:
        return (self.cert, self.key, self.chain, self.root)


@dataclass(slots=True)
class ReloadCounters:
    """What the watcher did, by outcome (``reloads``) and by refusal reason (``refusals``)."""

    reloads: int = 0
    refusals: dict[str, int] = field(default_factory=dict)
    torn_reads: int = 0


class PluginCaWatcher:
    """Looks at the plug-in CA's files and hands each new good CA to ``on_reload``; ``run`` until cancelled."""

    def __init__(
        self,
        paths: CaPaths,
        current: RootCa,
        *,
        on_reload: Callable[[RootCa, str], None],
        on_refused: Callable[[Refusal, str], None],
        interval: float = CA_POLL_INTERVAL,
        clock: Callable[[], float] = time.time,
        read: Callable[[Path], bytes] = Path.read_bytes,
    ) -> None:
        self.paths = paths
        self.current = current
        self._on_reload = on_reload
        self._on_refused = on_refused
        self._interval = interval
        self._clock = clock
        self._read = read
        self._judged: Signature | None = None
        self._pending: Signature | None = None
        self.counters = ReloadCounters()
        self.error = ""
        """The last refusal's message, until a set is taken."""

    def poll(self) -> CaVerdict | None:
        """Look once (rules 1-3); the verdict when a set was judged, else None."""
        signature = self._signature()
        if signature == self._judged:
            self._pending = None
            return None
        if signature != self._pending:
            self._pending = signature  # rule 1: wait for the files to hold still
            return None
        files = self._read_files()
        if files is None or self._signature() != signature:
            self.counters.torn_reads += 1  # rule 2: read again at the next look
            self._pending = None
            return None
        self._judged, self._pending = signature, None
        verdict = judge_ca_files(self.current, files, self._clock(), where=str(self.paths.cert.parent))
        if verdict.event is CaEvent.RELOAD and verdict.ca is not None:
            self.current = verdict.ca
            self.counters.reloads += 1
            self.error = ""
            log.info("plug-in CA %s changed: signing with the new CA (%s)", self.paths.cert.parent, verdict.message)
            self._on_reload(verdict.ca, verdict.message)
        elif verdict.event is CaEvent.REFUSED and verdict.refusal is not None:
            label = verdict.refusal.value
            self.counters.refusals[label] = self.counters.refusals.get(label, 0) + 1
            self.error = verdict.message
            log.error("plug-in CA refused (%s): %s; the CA in use keeps signing", label, verdict.message)
            self._on_refused(verdict.refusal, verdict.message)
        return verdict

    async def run(self) -> None:
        """Poll every ``interval`` seconds until cancelled; an error of one poll (a file, or a callback that fails)
        is logged and the next poll comes as usual (:mod:`ambit.supervision`)."""
        await asyncio.sleep(self._interval)
        await poll_every(self._interval, self.poll, f"the plug-in CA watcher of {self.paths.cert.parent}")

    def _signature(self) -> Signature:
        parts: list[object] = []
        for path in self.paths.all():
            if path is None:
                continue
            try:
                stat = os.stat(path)
            except OSError as exc:
                parts.append(type(exc).__name__)
                continue
            parts.append((stat.st_ino, stat.st_dev, stat.st_size, stat.st_mtime_ns))
        try:
            parts.append(os.readlink(self.paths.cert.parent / DATA_LINK))
        except OSError:
            parts.append(None)
        return tuple(parts)

    def _read_files(self) -> CaFiles | None:
        """The files' bytes (None for an absent one); None when one could not be read whole."""
        values: list[bytes | None] = []
        for path in self.paths.all():
            if path is None:
                values.append(None)
                continue
            try:
                if os.stat(path).st_size > MAX_CA_FILE_BYTES:
                    values.append(b"\0")  # judged malformed, never read into memory
                    continue
                values.append(self._read(path))
            except FileNotFoundError:
                values.append(None)
            except OSError as exc:
                log.warning("cannot read the plug-in CA file %s: %s; trying again", path, exc)
                return None
        return CaFiles(cert=values[0], key=values[1], chain=values[2], root=values[3])
