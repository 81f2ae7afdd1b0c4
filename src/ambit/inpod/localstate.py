"""Workload state from a local YAML file (ztunnel's local mode), reloaded whenever the file changes.

Theory of operation: :class:`LocalConfigWatcher` polls the file's identity (inode, size, mtime) a few times a
second — the lab replaces it atomically by rename, so a changed identity means a complete new file. A file that
does not parse is reported once (one log line naming the field) and the last good state stays in force: bad input
never empties the proxy's view of the mesh. A missing file is an empty configuration only until a first good one
was read; after that it keeps the last state too, as it does while the file cannot even be looked at (EACCES,
ENOTDIR: reported once). Only cancellation ends the watcher: an error of one poll is logged and the next one comes
as usual.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from ambit.model.localconfig import LocalConfigError, parse_local_config
from ambit.model.policy import Policy
from ambit.model.state import WorkloadState
from ambit.supervision import poll_every

log = logging.getLogger("ambit.inpod.localstate")

POLL_INTERVAL = 0.2


class LocalConfigWatcher:
    def __init__(
        self,
        path: Path,
        state: WorkloadState,
        on_change: Callable[[], None],
        on_policies: Callable[[tuple[Policy, ...]], None] | None = None,
    ) -> None:
        self.path, self._state, self._on_change = path, state, on_change
        self._on_policies = on_policies
        self._seen: tuple[int, int, int] | None = None
        self._stat_error = ""
        self.loaded = False
        """A good configuration was applied at least once."""
        self.errors = 0

    def poll(self) -> bool:
        """Apply the file if it changed since the last poll; True when the state changed."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if not self.loaded:
                self.loaded = True
                self._on_change()
            return False
        except OSError as exc:  # EACCES, ENOTDIR, ELOOP: the last good configuration stays, looked at again later
            if str(exc) != self._stat_error:  # once per new error, not five times a second
                self.errors += 1
                log.error("%s: cannot look at the file: %s (keeping the last good configuration)", self.path, exc)
            self._stat_error, self._seen = str(exc), None
            return False
        self._stat_error = ""
        identity = (st.st_ino, st.st_size, st.st_mtime_ns)
        if identity == self._seen:
            return False
        self._seen = identity
        try:
            config = parse_local_config(self.path.read_text(encoding="utf-8"))
        except (LocalConfigError, OSError, UnicodeDecodeError) as exc:
            self.errors += 1
            log.error("%s: %s (keeping the last good configuration)", self.path, exc)
            return False
        self._state.replace_all(config.workloads, config.services)
        if self._on_policies is not None:
            self._on_policies(config.policies)
        self.loaded = True
        log.info("%s: %d workloads, %d services", self.path, len(config.workloads), len(config.services))
        self._on_change()
        return True

    async def run(self) -> None:
        """Poll until cancelled; an error of one poll is logged, the next comes as usual (:mod:`ambit.supervision`)."""
        await poll_every(POLL_INTERVAL, self.poll, f"the local config watcher of {self.path}")
