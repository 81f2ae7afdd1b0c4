"""The fault suite's instruments: the steady load run from pods' namespaces, and a packet capture on the nodes.

- :class:`LoadRun` starts :mod:`tests.faults.load` inside each client pod's network namespace and reads its records
  back (JSON lines, readable while it runs).
- :class:`PlaintextCapture` runs ``tcpdump -i any`` in each node's network namespace (every link the node has: its
  uplink to the lab bridge and the host side of each pod's veth) for the length of a fault, and counts how often a
  marker appears in the captured bytes. The load's payloads all begin with the run's marker, so any count above
  zero is application data that crossed a node link in clear. A positive control (:meth:`PlaintextCapture.control`)
  sends a different marker in clear from each node itself, so that "no marker seen" is known to mean something.

Both are real processes stopped with SIGTERM/SIGINT and waited for; nothing is left running.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
STOP_TIMEOUT = 20.0


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT)


class LoadRun:
    """One load process per client pod: ``clients`` maps a client's name to its netns and targets
    (``NAME=HOST:PORT``); target names are prefixed with the client's name in the records (``cli-1>srv-2``).
    ``rate`` 0 runs streams only; ``stream_lifetime`` (seconds, 0: until stopped) is each stream's own length."""

    def __init__(
        self,
        directory: Path,
        marker: str,
        clients: dict[str, tuple[str, list[str]]],
        rate: float,
        stream_lifetime: float = 0.0,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.files: list[Path] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        for client, (netns, targets) in clients.items():
            out = directory / f"load-{client}.jsonl"
            out.unlink(missing_ok=True)
            argv = ["ip", "netns", "exec", netns, sys.executable, "-m", "tests.faults.load"]
            argv += ["--marker", marker, "--rate", str(rate), "--stream-lifetime", str(stream_lifetime)]
            argv += ["--out", str(out)]
            for target in targets:
                argv += ["--target", f"{client}>{target}"]
            log = open(directory / f"load-{client}.log", "ab")  # noqa: SIM115 - closed in stop()
            self.procs.append(subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=log, stdin=subprocess.DEVNULL))
            log.close()
            self.files.append(out)

    def records(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for path in self.files:
            if path.is_file():
                for line in path.read_text().splitlines():
                    with contextlib.suppress(ValueError):
                        found.append(json.loads(line))
        return found

    def running(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self) -> list[dict[str, Any]]:
        for proc in self.procs:
            _stop(proc)
        codes = [p.returncode for p in self.procs]
        assert codes == [0] * len(codes), f"a load process failed: {codes}"
        return self.records()


class PlaintextCapture:
    """``tcpdump -i any`` in each of ``netns`` into ``directory``."""

    def __init__(self, directory: Path, netns: Sequence[str]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.netns = list(netns)
        self.files = [directory / f"{ns}.pcap" for ns in netns]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.errors = [directory / f"{ns}.tcpdump.log" for ns in netns]
        for ns, pcap, err in zip(netns, self.files, self.errors, strict=True):
            argv = ["ip", "netns", "exec", ns, "tcpdump", "-i", "any", "-s", "0", "-U", "-n", "-Z", "root"]
            with open(err, "wb") as log:
                self.procs.append(subprocess.Popen([*argv, "-w", str(pcap)], stdout=log, stderr=log))
        deadline = time.monotonic() + 15
        for err, proc in zip(self.errors, self.procs, strict=True):
            while b"listening on" not in err.read_bytes():
                assert proc.poll() is None, f"tcpdump failed: {err.read_text()}"
                assert time.monotonic() < deadline, f"tcpdump did not start: {err.read_text()}"
                time.sleep(0.05)

    def stop(self) -> None:
        for proc in self.procs:
            _stop(proc, signal.SIGINT)

    def count(self, marker: bytes) -> int:
        return sum(path.read_bytes().count(marker) for path in self.files if path.is_file())

    def control(self, marker: str, targets: Sequence[tuple[str, int]], wait: float = 15.0) -> int:
        """The positive control: from each captured namespace (in order), send ``marker`` in clear to its
        ``(host, port)`` and wait until that namespace's capture file holds it. Packets reach the file in the order
        they were captured, so once the control is in, everything the load sent before it is in too (tcpdump stops
        on SIGINT without writing what it has not processed yet). Returns how many files show the control."""
        seen = 0
        for ns, path, (host, port) in zip(self.netns, self.files, targets, strict=True):
            code = (
                "import socket\n"
                f"s=socket.create_connection(({host!r},{port}),timeout=5)\n"
                f"s.sendall({marker!r}.encode()+b'\\n')\n"
                "s.settimeout(5)\n"
                "try: s.recv(100)\n"
                "except OSError: pass\n"
                "s.close()\n"
            )
            subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code], check=True, timeout=20)
            deadline = time.monotonic() + wait
            while marker.encode() not in path.read_bytes() and time.monotonic() < deadline:
                time.sleep(0.1)
            seen += marker.encode() in path.read_bytes()
        return seen
