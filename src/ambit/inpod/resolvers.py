"""Which resolvers a pod's forwarded DNS queries go to: the nameservers of the pod's own ``/etc/resolv.conf``.

Theory of operation: the node agent hands the proxy a pod's network namespace, not its processes or files. A
process of the pod is found by its network namespace (``/proc/<pid>/ns/net`` has the same device and inode as the
namespace handle), and the pod's resolv.conf is read through that process's root (``/proc/<pid>/root``), as the
pod's own resolver sees it (kubelet's ``nameserver``/``search``/``options``, or what ``dnsPolicy`` made of them).
:class:`PodResolvers` does that on a worker thread when a query is first forwarded (the sandbox has no process yet
when the pod is added) and again once its answer is ``refresh`` seconds old.

Rules:

1. Explicit nameservers in the settings win over everything (``--dns-upstream``).
2. Else the pod's resolv.conf, read at most 64 KiB; the file is the pod's, so it is only parsed
   (:func:`~ambit.dns.resolvconf.parse_resolv_conf` never raises) and the proxy only ever sends to its nameservers
   from inside the pod's netns, which the pod could do itself.
3. Else (no process of the pod found, no readable file) the proxy's own resolv.conf, as ztunnel forwards to its
   own (read once at start, see :class:`~ambit.inpod.settings.NodeProxySettings`). A proxy in a pod without the
   host's PID namespace (the ``ztunnel`` DaemonSet) sees no pod's process, so it always forwards to its own
   resolvers, exactly as ztunnel does.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

from ambit.dns.resolvconf import ResolvConf, parse_resolv_conf
from ambit.dns.settings import Upstream

MAX_RESOLV_CONF = 64 * 1024
RETRY_AFTER_MISS = 1.0
"""Seconds before looking for the pod's process again after not finding it (a flood must not scan /proc)."""
UPSTREAM_TIMEOUT_CAP = 2.5
"""Seconds one upstream try may take at most, whatever the file says: a pod's resolver gives up after 5 s."""


def upstream_of(conf: ResolvConf) -> Upstream:
    return Upstream(conf.nameservers, timeout=min(conf.timeout, UPSTREAM_TIMEOUT_CAP), attempts=conf.attempts)


def read_resolv_conf(path: Path) -> ResolvConf | None:
    """The settings in ``path`` (at most 64 KiB of it), or None when it cannot be read."""
    try:
        with path.open("rb") as f:
            text = f.read(MAX_RESOLV_CONF)
    except OSError:
        return None
    return parse_resolv_conf(text.decode("utf-8", "replace"))


def find_pod_resolv_conf(netns: tuple[int, int], proc: Path = Path("/proc")) -> ResolvConf | None:
    """The resolv.conf of a process in the network namespace ``netns`` (device, inode), or None (rule 2)."""
    own = os.getpid()
    try:
        with os.scandir(proc) as entries:
            pids = [entry.name for entry in entries if entry.name.isdigit() and int(entry.name) != own]
    except OSError:
        return None
    for pid in pids:
        try:
            stat = os.stat(proc / pid / "ns" / "net")
        except OSError:
            continue
        if (stat.st_dev, stat.st_ino) != netns:
            continue
        conf = read_resolv_conf(proc / pid / "root" / "etc" / "resolv.conf")
        if conf is not None:
            return conf
    return None


class PodResolvers:
    """One pod's upstream resolvers (rules 1-3), looked up again every ``refresh`` seconds."""

    def __init__(
        self,
        netns: tuple[int, int],
        fallback: Upstream,
        *,
        explicit: bool = False,
        refresh: float = 30.0,
        proc: Path = Path("/proc"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._netns = netns
        self._fallback = fallback
        self._explicit = explicit
        self._refresh = refresh
        self._proc = proc
        self._clock = clock
        self._found: Upstream | None = None
        self._found_at = 0.0
        self._missed_at: float | None = None
        self._lookup: asyncio.Task[ResolvConf | None] | None = None

    async def upstream(self) -> Upstream:
        if self._explicit:
            return self._fallback
        now = self._clock()
        if self._found is not None and now - self._found_at < self._refresh:
            return self._found
        if self._missed_at is not None and now - self._missed_at < RETRY_AFTER_MISS:
            return self._found or self._fallback
        if self._lookup is None:  # one scan at a time, shared by the queries that wait for it
            self._lookup = asyncio.get_running_loop().create_task(
                asyncio.to_thread(find_pod_resolv_conf, self._netns, self._proc)
            )
        lookup = self._lookup
        try:
            conf = await asyncio.shield(lookup)
        finally:
            if lookup.done() and self._lookup is lookup:
                self._lookup = None
        if conf is None:
            self._missed_at = self._clock()
            return self._found or self._fallback
        self._found, self._found_at = upstream_of(conf), self._clock()
        return self._found
