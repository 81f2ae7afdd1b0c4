"""A bounded steady load from one pod's network namespace, each connection recorded: ``python -m tests.faults.load``.

The fault suite runs one of these per client pod (``ip netns exec <pod netns>``), so every connection goes through
the pod's redirection rules and its node proxy, as an application's would. Per target it keeps:

- **new connections** at ``--rate`` per second: connect, send one payload (the run's marker, the target, a sequence
  number, padding to ``PAYLOAD`` bytes), read the echo back in full, compare, close;
- **one long-lived stream**: a line every ``STREAM_INTERVAL`` seconds, each echo read back and compared; when the
  stream breaks it is recorded and a new one opened after ``RECONNECT_DELAY``. With ``--stream-lifetime`` a stream
  ends on its own after that many seconds, as an application's would: the client shuts down its sending side, the
  server closes, and the client reads that EOF (``ended``); the next stream opens at once.

``--rate 0`` runs the streams only (no new connections).

Each ended connection is one JSON line on ``--out`` (flushed as it is written, so a reader sees records while the
load runs): ``kind`` (``new``, ``stream``), ``target``, ``start`` and ``end`` (wall-clock seconds), ``outcome``
(``ok``, ``ended``, ``refused``, ``reset``, ``eof``, ``timeout``, ``mismatch``, ``error``), ``echoed`` (bytes
echoed back intact) and ``detail``. A stream writes ``stream-up`` when its first echo came back, ``ok`` when the
load stopped with the stream still intact, and ``ended`` when it ran its lifetime and closed cleanly.
``mismatch`` is the only outcome where data came back different from what was sent: data lost without the
application being told. The others are failures the application sees.

SIGTERM or SIGINT stops the load: no new connection starts, the ones in flight finish (each bounded by
``--timeout``), open streams are closed and recorded, and the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

PAYLOAD = 512
STREAM_INTERVAL = 0.1
RECONNECT_DELAY = 0.2
KEPT = ("ok", "ended")
"""The outcomes of a stream that was never broken: intact when the load stopped, or closed cleanly on its own."""


@dataclass(frozen=True)
class Target:
    name: str
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Target:
        name, _, address = text.partition("=")
        host, _, port = address.rpartition(":")
        if not name or not host or not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise argparse.ArgumentTypeError(f"a target is NAME=HOST:PORT, not {text!r}")
        return cls(name, host, int(port))


class Recorder:
    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def record(self, kind: str, target: Target, start: float, outcome: str, echoed: int, detail: str = "") -> None:
        line: dict[str, Any] = {
            "kind": kind,
            "target": target.name,
            "start": start,
            "end": time.time(),
            "outcome": outcome,
            "echoed": echoed,
            "detail": detail,
        }
        self.out.write(json.dumps(line) + "\n")
        self.out.flush()


def classify(exc: BaseException) -> str:
    """The outcome an application would see for a failed connection."""
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
        return "reset"
    if isinstance(exc, asyncio.IncompleteReadError):
        return "eof"
    if isinstance(exc, TimeoutError):
        return "timeout"
    return "error"


def payload(marker: str, target: Target, seq: int, size: int) -> bytes:
    head = f"{marker} {target.name} {seq} ".encode()
    return head + b"x" * max(0, size - len(head) - 1) + b"\n"


async def one_connection(target: Target, data: bytes, limit: float) -> int:
    """Send ``data``, read its echo; the bytes echoed intact. Raises on failure, ValueError on a mismatch."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(target.host, target.port), limit)
    try:
        writer.write(data)
        await asyncio.wait_for(writer.drain(), limit)
        echo = await asyncio.wait_for(reader.readexactly(len(data)), limit)
        if echo != data:
            raise ValueError("the echo differs from what was sent")
        return len(echo)
    finally:
        writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), limit)


async def new_connections(
    target: Target, marker: str, rate: float, limit: float, stop: asyncio.Event, rec: Recorder
) -> None:
    in_flight: set[asyncio.Task[None]] = set()
    seq = 0

    async def attempt(n: int) -> None:
        start = time.time()
        try:
            echoed = await one_connection(target, payload(marker, target, n, PAYLOAD), limit)
        except ValueError as exc:
            rec.record("new", target, start, "mismatch", 0, str(exc))
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            rec.record("new", target, start, classify(exc), 0, f"{type(exc).__name__}: {exc}")
        else:
            rec.record("new", target, start, "ok", echoed)

    period = 1.0 / rate
    next_at = time.monotonic()
    while not stop.is_set():
        task = asyncio.create_task(attempt(seq), name=f"load new {target.name} #{seq}")
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
        seq += 1
        next_at += period
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, next_at - time.monotonic()))
    if in_flight:
        await asyncio.gather(*in_flight)


async def long_lived(
    target: Target, marker: str, limit: float, lifetime: float, stop: asyncio.Event, rec: Recorder
) -> None:
    """Streams to ``target`` one after the other until ``stop``; each lives ``lifetime`` seconds (0: until stop)."""
    seq = 0
    while not stop.is_set():
        start = time.time()
        echoed = 0
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(target.host, target.port), limit)
        except (OSError, TimeoutError) as exc:
            rec.record("stream", target, start, classify(exc), 0, f"connect: {type(exc).__name__}: {exc}")
            await _pause(stop, RECONNECT_DELAY)
            continue
        outcome, detail = "ok", ""
        ends_at = time.monotonic() + lifetime if lifetime > 0 else float("inf")
        try:
            while not stop.is_set() and time.monotonic() < ends_at:
                line = payload(marker, target, seq, 64)
                seq += 1
                writer.write(line)
                await asyncio.wait_for(writer.drain(), limit)
                echo = await asyncio.wait_for(reader.readexactly(len(line)), limit)
                if echo != line:
                    outcome, detail = "mismatch", f"after {echoed} bytes"
                    break
                if echoed == 0:
                    rec.record("stream-up", target, start, "ok", len(echo))
                echoed += len(echo)
                await _pause(stop, STREAM_INTERVAL)
            if outcome == "ok" and not stop.is_set():
                outcome, detail = await _end(reader, writer, limit)
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            outcome, detail = classify(exc), f"{type(exc).__name__}: {exc}"
        finally:
            writer.close()
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), limit)
        rec.record("stream", target, start, outcome, echoed, detail)
        if outcome not in KEPT:
            await _pause(stop, RECONNECT_DELAY)


async def _end(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: float) -> tuple[str, str]:
    """A stream's own end: shut down the sending side and read the server's EOF (nothing more may come)."""
    writer.write_eof()
    rest = await asyncio.wait_for(reader.read(65536), limit)
    if rest:
        return "mismatch", f"{len(rest)} unexpected bytes after the end"
    return "ended", "closed on its own"


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def run(args: argparse.Namespace, out: IO[str]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if args.duration:
        loop.call_later(args.duration, stop.set)
    rec = Recorder(out)
    tasks = []
    for target in args.target:
        if args.rate > 0:
            tasks.append(new_connections(target, args.marker, args.rate, args.timeout, stop, rec))
        tasks.append(long_lived(target, args.marker, args.timeout, args.stream_lifetime, stop, rec))
    await asyncio.gather(*tasks)


def bounded(low: float, high: float) -> Callable[[str], float]:
    """An argument type: a number of seconds (or a rate) within ``[low, high]``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
        if not low <= value <= high:  # NaN fails this too
            raise argparse.ArgumentTypeError(f"expected a number from {low:g} to {high:g}, not {text!r}")
        return value

    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.load", description=__doc__.split("\n")[0])
    parser.add_argument("--target", type=Target.parse, action="append", required=True, help="NAME=HOST:PORT")
    parser.add_argument("--marker", required=True, help="the token every payload starts with")
    parser.add_argument("--rate", type=bounded(0, 1000), default=5.0, help="new connections per second per target")
    parser.add_argument("--timeout", type=bounded(0.01, 600), default=3.0, help="seconds for each step")
    parser.add_argument("--duration", type=bounded(0, 86400), default=300.0, help="stop after at most these seconds")
    parser.add_argument("--stream-lifetime", type=bounded(0, 86400), default=0.0, help="seconds (0: until stopped)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    with open(args.out, "a", encoding="utf-8") as out:
        asyncio.run(run(args, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
