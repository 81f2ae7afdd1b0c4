"""The node proxy as a process: a ZDS client whose pods get the in-pod listeners, until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

from ambit.inpod.workloads import PodListenerManager
from ambit.zds.client import ZdsClient

log = logging.getLogger("ambit.inpod.daemon")


async def run_node_proxy(zds_socket: Path) -> None:
    """Connect to the node agent's ZDS socket (reconnecting) and open listeners in the pods it hands over."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    listeners = PodListenerManager()
    client = ZdsClient(zds_socket, listeners)
    await client.start()
    log.info("node proxy is running (ZDS %s)", zds_socket)
    try:
        await stop.wait()
    finally:
        await client.aclose()
        await listeners.aclose()
