"""The node agent's keeper of the plugin's kubeconfig outlives a write that fails (a full disk, its directory
gone for a while): the plugin of the next pod needs the file, so the keeper writes it once it can."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from ambit.cni.daemon import PLUGIN_KUBECONFIG, InCluster, _keep_plugin_kubeconfig, _until_signalled
from ambit.supervision import TaskEndedError


async def until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        for _ in itertools.count():
            if predicate():
                return
            await asyncio.sleep(0.01)


async def test_a_failed_write_is_logged_and_the_kubeconfig_written_once_the_directory_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("token-1")
    (account / "ca.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\n")
    where = InCluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}, account)
    run_dir = tmp_path / "run"  # absent: writing the kubeconfig fails
    keeper = asyncio.create_task(_keep_plugin_kubeconfig(None, run_dir, where, interval=0.01, check=0.01))
    try:
        await until(lambda: "cannot write the plugin's kubeconfig" in caplog.text)
        await asyncio.sleep(0.05)
        assert not keeper.done()
        with caplog.at_level(logging.INFO, logger="ambit.cni.daemon"):
            run_dir.mkdir()
            await until((run_dir / PLUGIN_KUBECONFIG).exists)
        assert "token-1" in (run_dir / PLUGIN_KUBECONFIG).read_text()
    finally:
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)


async def test_the_agent_stops_waiting_for_a_signal_when_an_essential_task_is_lost() -> None:
    lost: asyncio.Future[TaskEndedError] = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(_until_signalled(lost))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    lost.set_result(TaskEndedError("task 'plugin kubeconfig' ended by an error: KeyError('x')"))
    with pytest.raises(TaskEndedError, match="plugin kubeconfig"):
        await asyncio.wait_for(waiting, 5)
