"""The waypoint deployment controller's loop outlives a pass that fails by a defect (a Gateway whose fields the
controller chokes on): the pass is retried after ``retry`` like one with a failed write; before, the defect ended
the controller's task and no Gateway was reconciled again until the control plane restarted."""

from __future__ import annotations

import asyncio
import time
from typing import cast

import pytest

from ambit.controlplane.gateway.controller import GatewayController, GatewayControllerSettings
from ambit.k8s import KubeClient


async def test_a_pass_ended_by_a_defect_is_retried_and_the_controller_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = cast(KubeClient, object())  # the passes are stand-ins: the client is never used
    controller = GatewayController(client, GatewayControllerSettings(debounce=0.001, retry=0.01), clock=time.time)
    passes: list[int] = []
    second = asyncio.Event()

    async def reconcile_once() -> bool:
        passes.append(len(passes) + 1)
        if len(passes) == 1:
            raise KeyError("spec.listeners")
        second.set()
        return True

    monkeypatch.setattr(controller, "reconcile_once", reconcile_once)
    controller._dirty.set()
    task = asyncio.create_task(controller._run())
    try:
        await asyncio.wait_for(second.wait(), 5)
        assert passes == [1, 2] and not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
