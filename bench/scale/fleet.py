"""The simulated node proxies as a fleet of worker processes (:mod:`bench.scale.node_proxies`), and what they saw.

Clients are spread over ``workers`` processes so that the clients' own protobuf parsing is not one event loop's
bottleneck; each worker is driven by JSON lines on its stdin and answers on its stdout. The fleet's methods ask
every worker at once and merge the answers in client order.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class FleetError(RuntimeError):
    """A worker died or answered something unexpected."""


class Worker:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        await self.proc.stdin.drain()
        line = await self.proc.stdout.readline()
        if not line:
            raise FleetError(f"a node proxy worker exited ({self.proc.returncode}) on {command.get('cmd')}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise FleetError(answer["error"])
        return answer


class Fleet:
    """``await Fleet.start(...)`` then ask; ``aclose`` ends every worker."""

    def __init__(self, workers: list[Worker], nodes: Sequence[str] = ()) -> None:
        self.workers = workers
        self.nodes = list(nodes)
        """Node names in the order every per-client answer comes in (worker by worker)."""

    @classmethod
    async def start(
        cls,
        target: str,
        root_pem: bytes,
        clients: Sequence[tuple[str, str]],
        *,
        workers: int,
        log: Path,
        server_name: str = "istiod.istio-system.svc",
        max_message: int = 0,
        demands: Mapping[str, Sequence[str]] | None = None,
    ) -> Fleet:
        """Start ``clients`` ((node, token) pairs) over ``workers`` processes; returns once all have started.
        ``demands`` (node → names) makes those clients on demand, looking the names up."""
        count = max(1, min(workers, len(clients)))
        shares = [list(clients[i::count]) for i in range(count)]
        demands = demands or {}
        started: list[Worker] = []
        with log.open("ab") as err:
            for share in shares:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "bench.scale.node_proxies",
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=err,
                    cwd=REPO,
                    limit=1 << 28,
                )
                started.append(Worker(proc))
                config = {
                    "target": target,
                    "root_pem": root_pem.decode(),
                    "server_name": server_name,
                    "max_message": max_message,
                    "clients": [
                        {"node": node, "token": token, "demand": list(demands.get(node, ()))} for node, token in share
                    ],
                }
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(json.dumps(config).encode() + b"\n")
        fleet = cls(started, [node for share in shares for node, _ in share])
        for worker in started:
            assert worker.proc.stdout is not None
            if not await worker.proc.stdout.readline():
                await fleet.aclose()
                raise FleetError(f"a node proxy worker did not start; see {log}")
        return fleet

    def cpu_seconds(self) -> float:
        """User plus system CPU time of every worker so far."""
        total = 0.0
        for worker in self.workers:
            stat = Path(f"/proc/{worker.proc.pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        return total

    def rss_bytes(self) -> int:
        """Resident memory of every worker now."""
        total = 0
        for worker in self.workers:
            for line in Path(f"/proc/{worker.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        return total

    async def _all(self, command: dict[str, Any]) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(w.ask(command) for w in self.workers)))

    async def track(self, names: Sequence[str]) -> None:
        await self._all({"cmd": "track", "names": list(names)})

    async def status(self) -> dict[str, Any]:
        answers = await self._all({"cmd": "status"})
        merged: dict[str, Any] = {k: sum(a[k] for a in answers) for k in ("clients", "synced", "connects")}
        merged["responses"] = sum(a["responses"] for a in answers)
        merged["resources"] = sum(a["resources"] for a in answers)
        merged["arrived"] = sum(a["arrived"] for a in answers)
        merged["held_min"] = min(a["held_min"] for a in answers)
        merged["held_max"] = max(a["held_max"] for a in answers)
        merged["errors"] = sorted({e for a in answers for e in a["errors"]})[:3]
        return merged

    async def syncs(self) -> list[list[tuple[float, float, int]]]:
        """Per client, per (re)connect: (connected, synced or 0, resources in the first responses)."""
        answers = await self._all({"cmd": "syncs"})
        return [[(c, s, n) for c, s, n in client] for a in answers for client in a["syncs"]]

    async def arrivals(self, names: Sequence[str]) -> dict[str, list[float | None]]:
        """Per name, every client's first arrival (None: not yet)."""
        answers = await self._all({"cmd": "arrivals", "names": list(names)})
        return {n: [t for a in answers for t in a["arrivals"][n]] for n in names}

    async def aclose(self) -> None:
        for worker in self.workers:
            proc = worker.proc
            if proc.returncode is None and proc.stdin is not None:
                try:
                    proc.stdin.write(b'{"cmd": "quit"}\n')
                    await proc.stdin.drain()
                except (BrokenPipeError, ConnectionResetError):
                    pass
        for worker in self.workers:
            try:
                await asyncio.wait_for(worker.proc.wait(), 10)
            except TimeoutError:
                worker.proc.terminate()
                await worker.proc.wait()
