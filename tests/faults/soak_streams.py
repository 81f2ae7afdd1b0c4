"""The rollout soak's client, run in a client pod's network namespace: ``python -m tests.faults.soak_streams``.

Per target (``NAME=HOST:PORT``, an echo server) it keeps:

- ``--streams`` **long-lived streams**, opened at the start and kept until the client is stopped. Each sends a
  byte sequence of its own continuously (``--stream-rate`` bytes per second, in chunks) while a reader takes the
  echo back and checks every byte against the sequence at its offset (:class:`Sequence`), so a lost, reordered,
  duplicated or corrupted byte shows as a mismatch at a known offset. The sender stays at most :data:`WINDOW` bytes
  ahead of the echo. On stop a stream sends no more, waits for the echo of everything it sent, shuts down its
  sending side and reads the server's EOF: ``ended`` (sent, received and verified all equal). Anything else is the
  stream's failure: ``reset``, ``eof`` (the echo ended early), ``mismatch`` (data differs), ``stalled`` (no echo
  progress for ``--stall`` seconds while bytes were outstanding), ``refused``/``timeout``/``error`` at connect.
  A failed stream is not reopened: the soak counts streams, and every one must last the whole run.
- **new short connections** at ``--rate`` per second (:func:`tests.faults.load.new_connections`: one payload,
  its echo compared, close), each one record.

Records are JSON lines on ``--out`` (flushed as written): the short connections' as :mod:`tests.faults.load`
writes them (``kind`` ``new``), ``stream-up`` when a stream's first echo came back, ``progress`` every
:data:`PROGRESS_INTERVAL` seconds (bytes per stream so far), and one ``stream`` record per stream at its end with
``sent``, ``received``, ``verified``, ``outcome`` and ``detail``. Every payload starts with ``--marker``.

SIGTERM or SIGINT stops the client (see above); it exits 0 once every record is written.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any

from tests.faults.load import Recorder, Target, bounded, classify, new_connections

BLOCK = 64
"""Bytes of each numbered block of a stream's sequence."""
CHUNK = 1024
WINDOW = 256 * 1024
"""Bytes a stream's sender may be ahead of the echo it verified."""
PROGRESS_INTERVAL = 5.0
END_TIMEOUT = 30.0
"""Seconds a stopping stream waits for the echo of what it sent and for the server's EOF."""


class Mismatch(Exception):
    """The echo differs from the sequence at ``offset``."""

    def __init__(self, offset: int, detail: str) -> None:
        super().__init__(f"at byte {offset}: {detail}")
        self.offset = offset


@dataclass
class Sequence:
    """A stream's byte sequence (pure): block ``i`` is ``"<marker> <stream> <i>"`` padded to :data:`BLOCK` bytes
    and ended by a newline, so every offset has exactly one expected byte and no two blocks are equal."""

    marker: str
    stream: str
    _cache: dict[int, bytes] = field(default_factory=dict)

    def block(self, index: int) -> bytes:
        found = self._cache.get(index)
        if found is None:
            head = f"{self.marker} {self.stream} {index:012d} ".encode()
            found = head[: BLOCK - 1].ljust(BLOCK - 1, b".") + b"\n"
            self._cache = {index: found}  # the reader and the writer each walk forwards: one block is enough
        return found

    def bytes_at(self, offset: int, size: int) -> bytes:
        out = bytearray()
        while len(out) < size:
            index, within = divmod(offset + len(out), BLOCK)
            out += self.block(index)[within : within + size - len(out)]
        return bytes(out)

    def check(self, offset: int, data: bytes) -> None:
        """Raise :class:`Mismatch` unless ``data`` is the sequence from ``offset`` on."""
        expected = self.bytes_at(offset, len(data))
        if data != expected:
            at = next(i for i, (a, b) in enumerate(zip(data, expected, strict=True)) if a != b)
            raise Mismatch(offset + at, f"got {data[at : at + 16]!r}, expected {expected[at : at + 16]!r}")


@dataclass
class StreamState:
    name: str
    target: Target
    start: float = 0.0
    sent: int = 0
    received: int = 0
    verified: int = 0
    outcome: str = ""
    detail: str = ""
    up: bool = False

    def counts(self) -> dict[str, Any]:
        return {"stream": self.name, "sent": self.sent, "received": self.received, "verified": self.verified}


async def one_stream(
    state: StreamState, marker: str, rate: float, limit: float, stall: float, stop: asyncio.Event, rec: Recorder
) -> None:
    seq = Sequence(marker, state.name)
    state.start = time.time()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(state.target.host, state.target.port), limit)
    except (OSError, TimeoutError) as exc:
        state.outcome, state.detail = classify(exc), f"connect: {type(exc).__name__}: {exc}"
        _record(rec, state)
        return
    progress = asyncio.Event()
    failed = asyncio.Event()

    async def send() -> None:
        period = CHUNK / rate
        next_at = time.monotonic()
        while not stop.is_set() and not failed.is_set():
            if state.sent - state.verified + CHUNK > WINDOW:
                progress.clear()
                await _first(progress.wait(), stop.wait(), failed.wait())
                continue
            writer.write(seq.bytes_at(state.sent, CHUNK))
            state.sent += CHUNK
            await asyncio.wait_for(writer.drain(), stall)
            next_at += period
            await _first(asyncio.sleep(max(0.0, next_at - time.monotonic())), stop.wait(), failed.wait())

    async def receive() -> None:
        while True:
            data = await reader.read(65536)
            if not data:
                raise asyncio.IncompleteReadError(b"", None)
            seq.check(state.received, data)
            state.received += len(data)
            state.verified = state.received
            if state.received > state.sent:
                raise Mismatch(state.sent, "more bytes echoed than were sent")
            if not state.up:
                state.up = True
                rec.record("stream-up", state.target, state.start, "ok", len(data), state.name)
            progress.set()

    async def watch_stall() -> None:
        last, since = -1, time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            if state.received != last or state.received == state.sent:
                last, since = state.received, time.monotonic()
            elif time.monotonic() - since > stall:
                raise TimeoutError(f"no echo for {stall:g} s with {state.sent - state.received} bytes outstanding")

    sender = asyncio.create_task(send(), name=f"send {state.name}")
    receiver = asyncio.create_task(receive(), name=f"receive {state.name}")
    watcher = asyncio.create_task(watch_stall(), name=f"stall {state.name}")
    try:
        pending: set[asyncio.Task[None]] = {sender, receiver, watcher}
        while not sender.done():
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if (exc := task.exception()) is not None:
                    raise exc
        # The sender stopped (the client was told to stop): the echo of everything sent, then a clean end.
        async with asyncio.timeout(END_TIMEOUT):
            while state.received < state.sent:
                for task in (receiver, watcher):
                    if task.done():
                        raise task.exception() or asyncio.IncompleteReadError(b"", None)
                progress.clear()
                await _first(progress.wait(), asyncio.sleep(0.5))
            for task in (receiver, watcher):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            writer.write_eof()
            rest = await reader.read(65536)
        if rest:
            state.outcome, state.detail = "mismatch", f"{len(rest)} unexpected bytes after the end"
        else:
            state.outcome, state.detail = "ended", "closed on its own"
    except Mismatch as exc:
        state.outcome, state.detail = "mismatch", str(exc)
    except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
        kind = "stalled" if isinstance(exc, TimeoutError) and str(exc).startswith("no echo") else classify(exc)
        state.outcome, state.detail = kind, f"{type(exc).__name__}: {exc}"
    finally:
        failed.set()
        for task in (sender, receiver, watcher):
            task.cancel()
        for task in (sender, receiver, watcher):
            with contextlib.suppress(BaseException):
                await task
        writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), limit)
    _record(rec, state)


async def _first(*waits: Any) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def _record(rec: Recorder, state: StreamState) -> None:
    line = {
        "kind": "stream",
        "target": state.target.name,
        "start": state.start,
        "end": time.time(),
        "outcome": state.outcome,
        "echoed": state.verified,
        "detail": state.detail,
        **state.counts(),
    }
    rec.out.write(json.dumps(line) + "\n")
    rec.out.flush()


async def report_progress(states: list[StreamState], stop: asyncio.Event, rec: Recorder) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), PROGRESS_INTERVAL)
        line = {"kind": "progress", "at": time.time(), "streams": [s.counts() for s in states]}
        rec.out.write(json.dumps(line) + "\n")
        rec.out.flush()


async def run(args: argparse.Namespace, out: IO[str]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if args.duration:
        loop.call_later(args.duration, stop.set)
    rec = Recorder(out)
    states = [StreamState(f"{t.name}#{i}", t) for t in args.target for i in range(args.streams)]
    tasks = [one_stream(s, args.marker, args.stream_rate, args.timeout, args.stall, stop, rec) for s in states]
    if args.rate > 0:
        tasks += [new_connections(t, args.marker, args.rate, args.timeout, stop, rec) for t in args.target]
    await asyncio.gather(report_progress(states, stop, rec), *tasks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.soak_streams", description=__doc__.split("\n")[0])
    parser.add_argument("--target", type=Target.parse, action="append", required=True, help="NAME=HOST:PORT")
    parser.add_argument("--marker", required=True, help="the token every payload starts with")
    parser.add_argument("--streams", type=int, choices=range(1, 33), default=5, help="long-lived streams per target")
    parser.add_argument("--stream-rate", type=bounded(1024, 1 << 22), default=16384.0, help="bytes/s per stream")
    parser.add_argument("--rate", type=bounded(0, 1000), default=5.0, help="new connections per second per target")
    parser.add_argument("--timeout", type=bounded(0.01, 600), default=5.0, help="seconds for each connect or echo")
    parser.add_argument("--stall", type=bounded(1, 600), default=30.0, help="seconds without echo progress: a fault")
    parser.add_argument("--duration", type=bounded(0, 86400), default=0.0, help="stop after these seconds (0: never)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    with open(args.out, "a", encoding="utf-8") as out:
        asyncio.run(run(args, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
