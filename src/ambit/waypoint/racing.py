"""Racing TCP connects to every address of a name (``istio.io/connect-strategy: RACE_FIRST_TCP_CONNECT``).

Theory of operation: a ServiceEntry whose endpoints are names may have addresses that are not all reachable (a
dual-stack name on a single-stack path, a dead replica still in DNS). With the racing strategy the waypoint dials
every address its hostname endpoint resolves to at the same time and keeps the first connection that succeeds, as
Istio's waypoint does for such entries.

Rules:

1. At most :data:`MAX_RACE` addresses are dialled, in the order given (IPv4 first); the others are ignored.
2. The first connect to succeed wins; every other attempt is cancelled, and a connection that also succeeded
   meanwhile is closed, so nothing leaks.
3. When every attempt fails, :class:`RaceLostError` says each address's reason; the caller's timeout bounds the
   whole race (each attempt is bounded by ``timeout`` too).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Sequence

from ambit.model.workload import IPAddress
from ambit.proxy.errors import ProxyError
from ambit.proxy.sockets import SocketFactory, connect

MAX_RACE = 8
"""The most addresses one race dials (rule 1)."""


class RaceLostError(ProxyError):
    """No address of the race could be connected to (rule 3)."""


async def race_connect(
    factory: SocketFactory,
    addresses: Sequence[IPAddress],
    port: int,
    *,
    timeout: float,  # noqa: ASYNC109
) -> tuple[socket.socket, IPAddress]:
    """The first connection to succeed among ``addresses`` at ``port``, and the address it went to (rules 1-3)."""
    chosen = list(dict.fromkeys(addresses))[:MAX_RACE]
    if not chosen:
        raise RaceLostError("no address to connect to")
    attempts = {
        asyncio.create_task(connect(factory, (str(ip), port), timeout=timeout), name=f"race {ip}:{port}"): ip
        for ip in chosen
    }
    pending = set(attempts)
    failures: list[str] = []
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                exc = task.exception()
                if exc is None:
                    winner = (task.result(), attempts[task])
                    _close_others(done - {task})
                    return winner
                failures.append(f"{attempts[task]}: {exc}")
        raise RaceLostError("every address failed: " + "; ".join(failures))
    finally:
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                sock = await task
                sock.close()


def _close_others(done: set[asyncio.Task[socket.socket]]) -> None:
    """Close the connections that finished in the same step as the winner (rule 2)."""
    for task in done:
        if task.exception() is None:
            task.result().close()
