"""A stopping ingress gateway drains as a waypoint does, and as Envoy does for Istio's termination drain duration:
for the drain time it reports not ready and still serves new connections (they reach a pod being deleted until
every proxy has heard its endpoint is gone: a rollout of the gateway resetting them was the defect), then it
closes its listeners. Real gateway on loopback (:func:`tests.integration.ingress_rig.ingress_rig`), upstream's
TestIngress route to ``web``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
from tests.integration.ingress_rig import ingress_rig
from tests.integration.test_ingress_gateway_envoyfilter import gateway_config

from ambit.waypoint.process import serve_until_stopped

DRAIN = 1.5


async def status_of(url: str, host: str = "captured") -> int:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as client,
        client.get(url, headers={"Host": host}) as response,
    ):
        await response.read()
        return response.status


async def test_a_stopping_gateway_is_not_ready_but_serves_new_connections_until_the_drain_is_over(
    tmp_path: Path,
) -> None:
    config = gateway_config()
    port = config.listeners[0].port
    async with ingress_rig(tmp_path, config) as rig:
        ready_url = f"http://127.0.0.1:{rig.proc.settings.readiness_port}/healthz/ready"
        assert await status_of(f"http://127.0.0.1:{port}/") == 200
        assert await status_of(ready_url) == 200
        serving = asyncio.create_task(serve_until_stopped(rig.proc, DRAIN))
        started = time.monotonic()
        rig.proc.stopped.set()  # SIGTERM
        await asyncio.sleep(0.2)
        assert not serving.done()
        assert await status_of(ready_url) >= 500  # not ready: endpoints drop the pod...
        for _ in range(3):  # ...while connections already on their way are still served, each a new one
            assert await status_of(f"http://127.0.0.1:{port}/") == 200
        await asyncio.wait_for(serving, DRAIN + 10)
        assert time.monotonic() - started >= DRAIN - 0.05
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            pass  # refused: the listener is closed once the drain is over
        else:
            writer.close()
            raise AssertionError("the gateway still listens after its drain")


async def test_a_second_signal_cuts_the_drain_short(tmp_path: Path) -> None:
    async with ingress_rig(tmp_path, gateway_config()) as rig:
        serving = asyncio.create_task(serve_until_stopped(rig.proc, 60))
        rig.proc.stopped.set()
        await asyncio.sleep(0.2)
        assert not serving.done()
        rig.proc.stopped.set()  # a second SIGTERM (or /quitquitquit) ends it at once
        await asyncio.wait_for(serving, 5)
