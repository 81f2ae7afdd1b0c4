"""A server under test as a real child process: started until its ready line, observed through ``/proc``, ended.

The child's stdout carries exactly one ready line (``... ready at https://HOST:PORT ...``); its stderr goes to a
log file so a chatty server can never block on a full pipe. CPU time and resident memory are read from
``/proc/PID/stat`` and ``/proc/PID/status``, so they cover the server alone, not the benchmark client.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import re
import signal
import socket
import time
from collections.abc import Sequence
from pathlib import Path

_READY = re.compile(rb"ready at (https://\S+)")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class ServerStartError(RuntimeError):
    """The child exited or printed something other than its ready line."""


class ServerProcess:
    """One start of a server command; ``await start()`` returns the seconds from spawn to the ready line."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log: Path,
        cwd: Path,
        ready_timeout: float = 120.0,
        ready: re.Pattern[bytes] = _READY,
    ) -> None:
        """``ready`` matches the child's ready line; its first group, if any, becomes :attr:`url`."""
        self._argv = list(argv)
        self._ready = ready
        self._log = log
        self._cwd = cwd
        self._ready_timeout = ready_timeout
        self._proc: asyncio.subprocess.Process | None = None
        self.url = ""

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("server is not running")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self) -> float:
        with self._log.open("ab") as log:
            began = time.monotonic()
            self._proc = await asyncio.create_subprocess_exec(
                *self._argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=log, cwd=self._cwd
            )
        assert self._proc.stdout is not None
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), self._ready_timeout)
        except TimeoutError:
            await self.kill()
            raise ServerStartError(f"{self._argv[:4]} not ready after {self._ready_timeout:.0f} s") from None
        elapsed = time.monotonic() - began
        match = self._ready.search(line)
        if match is None:
            await self.kill()
            tail = self._log.read_bytes()[-2000:].decode(errors="replace")
            raise ServerStartError(f"{self._argv[:4]} printed {line!r} instead of its ready line; stderr: {tail}")
        self.url = match.group(1).decode() if match.groups() else ""
        return elapsed

    async def terminate(self, grace: float = 30.0) -> float:
        """SIGTERM and wait for the exit (SIGKILL after ``grace`` seconds); the seconds that took."""
        return await self._signal(signal.SIGTERM, grace)

    async def kill(self) -> float:
        """SIGKILL (a crash): nothing in the server runs after this."""
        return await self._signal(signal.SIGKILL, 30.0)

    async def _signal(self, sig: signal.Signals, grace: float) -> float:
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return 0.0
        began = time.monotonic()
        proc.send_signal(sig)
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        return time.monotonic() - began

    def crash(self) -> None:
        """SIGKILL now, from synchronous code (a callback in the middle of a burst); reap it with ``kill()``."""
        os.kill(self.pid, signal.SIGKILL)

    def cpu_seconds(self) -> float:
        """User plus system CPU time of the server so far."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()  # the command name may contain spaces and parentheses
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS in /proc/{self.pid}/status")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` (loopback by default) that is free now and that the kernel will not hand out meanwhile.

    The port is released before the caller binds it, so it is chosen below the ephemeral range
    (``net.ipv4.ip_local_port_range``): a port from ``bind(0)`` could be taken in between by any outgoing
    connection's automatic source port, a port below the range only by someone binding it explicitly.
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    first, last = _worker_share(10_000, max(low, 10_001))
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(first, last)
        if port in _HANDED_OUT:
            continue  # given to an earlier caller that may not have bound it yet
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            _remember(port)
            return port
    raise RuntimeError(f"no free loopback port found in {first}-{last - 1}")


_HANDED_OUT: set[int] = set()
_HANDED_OUT_ORDER: collections.deque[int] = collections.deque()
_REMEMBERED = 2048
"""Ports this process handed out lately: a caller that asks for several ports before binding any (a server's
admin, stats and readiness ports) never gets one twice."""


def _remember(port: int) -> None:
    _HANDED_OUT.add(port)
    _HANDED_OUT_ORDER.append(port)
    if len(_HANDED_OUT_ORDER) > _REMEMBERED:
        _HANDED_OUT.discard(_HANDED_OUT_ORDER.popleft())


def _worker_share(first: int, last: int) -> tuple[int, int]:
    """This process's slice of ``[first, last)``, so that test processes running at once never hand out the same
    port: ``make test``'s shares of the machine's tests (``AMBIT_TEST_SHARE``, their subprocesses inherit it) take
    the first quarter (``lab`` and ``host``, which run at once, half of it each), the rest share the other three,
    split again between its pytest-xdist workers; otherwise the whole range."""
    share = os.environ.get("AMBIT_TEST_SHARE", "")
    quarter = first + (last - first) // 4
    eighth = first + (last - first) // 8
    if share == "machine":
        return first, quarter
    if share == "lab":
        return first, eighth
    if share == "host":
        return eighth, quarter
    if share == "rest":
        first = quarter
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or not worker[2:].isdigit() or count <= 1:
        return first, last
    size = (last - first) // count
    index = int(worker[2:]) % count
    return first + index * size, first + (index + 1) * size
