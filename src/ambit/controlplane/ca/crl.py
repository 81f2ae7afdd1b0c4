"""The plug-in CA's certificate revocation list: ``ca-crl.pem`` next to the CA files, replicated as ``istio-ca-crl``.

Theory of operation (istiod's ``PILOT_ENABLE_CA_CRL``): with a plug-in CA, an optional ``ca-crl.pem`` in the CA's
directory holds the CRLs (PEM) of the root and intermediates. :class:`CrlFileWatcher` looks at the file every
``interval`` seconds (its size, modification time and inode first, its bytes only when those moved) and hands each
new good content to a :class:`~ambit.controlplane.ca.publish.ConfigMapPublisher`, which keeps ConfigMap
``istio-ca-crl`` (key ``ca-crl.pem``) equal to it in every namespace; node proxies mount that map and check peer
chains against it (:mod:`ambit.tls.revocation`). :func:`judge_crl_file` (pure) decides what a look at the file means.

Rules:

1. Only a plug-in CA has a CRL (a self-signed root kept in a Secret has no file to read), as in istiod.
2. Nothing is published before the file first exists: meshes without CRLs get no ConfigMaps (istiod writes an
   empty one everywhere; a node proxy treats a missing file and an empty one alike).
3. A file whose content does not parse as CRLs is not published: the error is logged and the maps keep the last
   good content (istiod refuses such a bundle too). CRLs that name a CA of our own chain but are not signed by it
   are published as they are, with a warning: node proxies ignore them (a CRL applies only under its signer).
4. A file that goes away leaves the published CRL as it was, with a warning, as in istiod, which only reacts to a
   CRL file that exists: removing revocations takes a file without them, not a missing file.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ambit.supervision import poll_every
from ambit.tls.revocation import RevocationError, RevocationList

log = logging.getLogger(__name__)

CRL_FILE = "ca-crl.pem"
CRL_CONFIG_MAP = "istio-ca-crl"
CRL_KEY = "ca-crl.pem"
CRL_POLL_INTERVAL = 2.0
MAX_CRL_BYTES = 16 * 1024 * 1024
"""A ConfigMap holds at most 1 MiB, so anything near this is a mistake; the limit keeps a wrong path harmless."""


class CrlEvent(enum.Enum):
    UNCHANGED = "unchanged"
    PUBLISH = "publish"
    REFUSED = "refused"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class CrlVerdict:
    event: CrlEvent
    value: str = ""
    """What to publish (``PUBLISH``)."""
    message: str = ""
    """Why the file was refused or is missing, or the warnings about a published one."""


def judge_crl_file(data: bytes | None, published: str | None, anchors: Sequence[bytes] = ()) -> CrlVerdict:
    """Rules 2-4 for one look at the file: ``data`` is its content (None: no file), ``published`` what the maps
    hold (None: nothing yet), ``anchors`` the CA's own certificates (PEM) for rule 3's warnings."""
    if data is None:
        if published is None:
            return CrlVerdict(CrlEvent.UNCHANGED)
        return CrlVerdict(CrlEvent.MISSING, message="the CRL file is gone; the published CRL stays as it was")
    try:
        text = data.decode("ascii")
        table = RevocationList.parse(data, anchors=anchors)
    except UnicodeDecodeError:
        return CrlVerdict(CrlEvent.REFUSED, message="the CRL file is not PEM text (ASCII); not published")
    except RevocationError as exc:
        return CrlVerdict(CrlEvent.REFUSED, message=f"{exc}; not published")
    if text == published:
        return CrlVerdict(CrlEvent.UNCHANGED)
    return CrlVerdict(CrlEvent.PUBLISH, text, "; ".join(table.errors))


class CrlFileWatcher:
    """Looks at the CRL file and publishes each new good content through ``publish``; ``run`` until cancelled."""

    def __init__(
        self,
        path: Path,
        publish: Callable[[str], None],
        *,
        anchors: Sequence[bytes] = (),
        interval: float = CRL_POLL_INTERVAL,
    ) -> None:
        self.path = path
        self._publish = publish
        self._anchors = tuple(anchors)
        self._interval = interval
        self._seen: tuple[int, int, int, int] | None = None
        self.published: str | None = None
        self.error = ""

    def set_anchors(self, anchors: Sequence[bytes]) -> None:
        """The CA's certificates after a reload (rule 3's warnings name CRLs against these)."""
        self._anchors = tuple(anchors)

    def poll(self) -> CrlVerdict:
        """Look once; publish what is new and good (call from the event loop's thread)."""
        try:
            stat = os.stat(self.path)
            signature = (stat.st_ino, stat.st_dev, stat.st_size, stat.st_mtime_ns)
            if signature == self._seen:
                return CrlVerdict(CrlEvent.UNCHANGED)
            if stat.st_size > MAX_CRL_BYTES:
                verdict = CrlVerdict(CrlEvent.REFUSED, message=f"the CRL file is over {MAX_CRL_BYTES} bytes")
            else:
                verdict = judge_crl_file(self.path.read_bytes(), self.published, self._anchors)
        except FileNotFoundError:
            signature, verdict = None, judge_crl_file(None, self.published, self._anchors)
        except OSError as exc:
            self._seen = None
            verdict = CrlVerdict(CrlEvent.REFUSED, message=f"cannot read the CRL file: {exc}")
            self._report(verdict)
            return verdict
        if verdict.event is not CrlEvent.MISSING or self._seen is not None:
            self._report(verdict)
        self._seen = signature
        if verdict.event is CrlEvent.PUBLISH:
            self.published = verdict.value
            self._publish(verdict.value)
        return verdict

    def _report(self, verdict: CrlVerdict) -> None:
        if verdict.event is CrlEvent.PUBLISH:
            self.error = ""
            log.info("CRL %s changed: publishing it as ConfigMap %s", self.path, CRL_CONFIG_MAP)
            if verdict.message:
                log.warning("CRL %s: %s", self.path, verdict.message)
        elif verdict.event in (CrlEvent.REFUSED, CrlEvent.MISSING):
            self.error = verdict.message
            log.error("CRL %s: %s", self.path, verdict.message)

    async def run(self) -> None:
        """Poll every ``interval`` seconds until cancelled; an error of one poll (a file, or a callback that fails)
        is logged and the next poll comes as usual (:mod:`ambit.supervision`)."""
        await asyncio.sleep(self._interval)
        await poll_every(self._interval, self.poll, f"the CRL file watcher of {self.path}")
