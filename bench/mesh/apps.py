"""The small programs the benchmark runs inside pods: ``python -m bench.mesh.apps echo|rate|hold|soak``.

- ``echo --port P``: an asyncio echo server (whatever arrives goes back), on every address of the pod.
- ``rate HOST PORT --seconds S --concurrency C``: new connections per second; each connects, sends one byte,
  reads the echo and closes. Prints ``{"connections": N, "seconds": T, "failures": F}``.
- ``hold HOST PORT --count N``: opens N connections, each carrying one byte there and back (so every proxy on the
  path has set its tunnel up), prints ``ready N`` and holds them until its stdin closes.

- ``soak HOST PORT --connections N --concurrency C --seconds S``: N connections of mixed lifetimes
  (:func:`lifetime`: most carry one echo and close, one in ten holds for a fraction of a second with a few echoes,
  one in a hundred holds for seconds with an echo a second), C at a time, for at most S seconds. Prints a line
  ``{"progress": done, "failures": F, "open": O}`` each second and a final one with ``"final": true``.

All of them raise the open-files limit to its hard maximum, as 10k held connections need more than the default.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import sys
import time


def _raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def _echo(port: int) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, None, port, backlog=4096, reuse_address=True)
    async with server:
        await server.serve_forever()


async def _one(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"x")
    await writer.drain()
    if await reader.readexactly(1) != b"x":
        raise ConnectionError("echo answered something else")
    return reader, writer


async def _rate(host: str, port: int, seconds: float, concurrency: int) -> dict[str, float]:
    done = failures = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done, failures
        while time.perf_counter() < deadline:
            try:
                _, writer = await asyncio.wait_for(_one(host, port), 5)
                writer.close()
                await writer.wait_closed()
                done += 1
            except (TimeoutError, OSError, asyncio.IncompleteReadError):
                failures += 1
                await asyncio.sleep(0.01)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"connections": done, "seconds": time.perf_counter() - started, "failures": failures}


async def _hold(host: str, port: int, count: int) -> None:
    held: list[asyncio.StreamWriter] = []
    gate = asyncio.Semaphore(64)

    async def open_one() -> None:
        async with gate:
            _, writer = await asyncio.wait_for(_one(host, port), 30)
            held.append(writer)

    await asyncio.gather(*(open_one() for _ in range(count)))
    print(f"ready {len(held)}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for writer in held:
        writer.close()


LONG_EVERY, MEDIUM_EVERY = 100, 10


def lifetime(index: int) -> tuple[int, float]:
    """Connection ``index``'s echoes and how long it stays open (seconds): deterministic, so runs compare."""
    if index % LONG_EVERY == 0:
        return 5 + index // LONG_EVERY % 16, 1.0
    if index % MEDIUM_EVERY == 0:
        return 3, 0.1 + (index // MEDIUM_EVERY % 5) / 10
    return 1, 0.0


async def _soak(host: str, port: int, connections: int, concurrency: int, seconds: float) -> dict[str, object]:
    done = failures = opened = 0
    deadline = time.perf_counter() + seconds
    claimed = iter(range(connections))

    async def carry(index: int) -> None:
        nonlocal done, failures, opened
        echoes, pause = lifetime(index)
        writer = None
        try:
            reader, writer = await asyncio.wait_for(_one(host, port), 10)
            opened += 1
            for _ in range(echoes - 1):
                await asyncio.sleep(pause)
                writer.write(b"y")
                await writer.drain()
                if await asyncio.wait_for(reader.readexactly(1), 10) != b"y":
                    raise ConnectionError("echo answered something else")
            done += 1
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ConnectionError):
            failures += 1
        finally:
            if writer is not None:
                opened -= 1
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

    async def worker() -> None:
        for index in claimed:
            if time.perf_counter() > deadline:
                return
            if lifetime(index)[1] >= 1.0:  # the long ones do not hold a worker up
                tasks.add(task := asyncio.create_task(carry(index)))
                task.add_done_callback(tasks.discard)
            else:
                await carry(index)

    async def report() -> None:
        while True:
            await asyncio.sleep(1.0)
            print(json.dumps({"progress": done, "failures": failures, "open": opened}), flush=True)

    tasks: set[asyncio.Task[None]] = set()
    reporter = asyncio.create_task(report())
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    while tasks:
        await asyncio.gather(*list(tasks))
    reporter.cancel()
    elapsed = time.perf_counter() - started
    return {"final": True, "progress": done, "failures": failures, "open": 0, "seconds": elapsed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mesh.apps")
    sub = parser.add_subparsers(dest="app", required=True)
    echo = sub.add_parser("echo")
    echo.add_argument("--port", type=int, required=True)
    rate = sub.add_parser("rate")
    hold = sub.add_parser("hold")
    soak = sub.add_parser("soak")
    for p in (rate, hold, soak):
        p.add_argument("host")
        p.add_argument("port", type=int)
    rate.add_argument("--seconds", type=float, default=2.0)
    rate.add_argument("--concurrency", type=int, default=8)
    hold.add_argument("--count", type=int, required=True)
    soak.add_argument("--connections", type=int, required=True)
    soak.add_argument("--concurrency", type=int, default=16)
    soak.add_argument("--seconds", type=float, default=600.0)
    args = parser.parse_args(argv)
    _raise_fd_limit()
    if args.app == "echo":
        asyncio.run(_echo(args.port))
    elif args.app == "rate":
        print(json.dumps(asyncio.run(_rate(args.host, args.port, args.seconds, args.concurrency))))
    elif args.app == "soak":
        result = asyncio.run(_soak(args.host, args.port, args.connections, args.concurrency, args.seconds))
        print(json.dumps(result), flush=True)
    else:
        asyncio.run(_hold(args.host, args.port, args.count))
    return 0


if __name__ == "__main__":
    sys.exit(main())
