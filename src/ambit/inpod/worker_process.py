"""One worker of a node proxy, as a process runs it (:mod:`ambit.cli.nodeproxy_worker`; :mod:`ambit.inpod.workers`).

Theory of operation: the worker reads its settings from the control socket (fd ``N``, one end of the socketpair its
node proxy made), then runs a :class:`~ambit.inpod.daemon.NodeProxy` in worker mode: its pods come from the node
proxy's private ZDS, and it opens no endpoint of its own. Every :data:`REPORT_INTERVAL` seconds it sends its metrics
snapshot up the socket when it changed, and once more when it has drained, before it exits. It stops (drains) on
SIGTERM or SIGINT, as a node proxy does (a second one cuts the drain short); when the node proxy says
:data:`~ambit.inpod.worker_channel.DRAIN` (a worker already draining goes on as it was, and its first SIGTERM after
the word is the same drain: a SIGTERM that reached both is no second ask, whichever comes first) or
:data:`~ambit.inpod.worker_channel.CUT`; and when the socket ends: its node proxy is gone (even a SIGKILL ends the
socket), and a worker never outlives it for longer than a drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket

from ambit.inpod.daemon import NodeProxy
from ambit.inpod.settings import NodeProxySettings
from ambit.inpod.worker_channel import CUT, DRAIN, ChannelError, write_report

log = logging.getLogger("ambit.inpod.worker")

REPORT_INTERVAL = 0.5
"""Seconds between metrics reports (a scrape of the node proxy sees a worker's counts this late at most)."""


async def run_worker(settings: NodeProxySettings, control: socket.socket) -> None:
    """Serve as a worker until told to stop or the node proxy is gone, then drain and report a last time."""
    proxy = NodeProxy(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, proxy.request_stop, sig.name)
    reader, writer = await asyncio.open_unix_connection(sock=control)
    last: list[bytes] = [b""]

    async def report() -> None:
        data = json.dumps(proxy.metrics.snapshot(), separators=(",", ":")).encode()
        if data != last[0]:
            await write_report(writer, data)
            last[0] = data

    async def reports() -> None:
        while True:
            await report()
            await asyncio.sleep(REPORT_INTERVAL)

    async def watch_parent() -> None:
        while words := await reader.read(64):
            for word in words:
                if word == DRAIN[0]:
                    proxy.request_drain("the node proxy drains")
                elif word == CUT[0]:
                    proxy.cut_short("the node proxy's drain was cut short")
                else:
                    log.warning("the node proxy sent %r, no word of the channel: ignored", bytes([word]))
        proxy.request_drain("the node proxy is gone")

    await proxy.start()
    tasks = [asyncio.create_task(reports(), name="worker reports"), asyncio.create_task(watch_parent())]
    try:
        await proxy.run()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await proxy.aclose()
        with contextlib.suppress(OSError, ChannelError):
            await report()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
