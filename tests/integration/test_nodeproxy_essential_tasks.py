"""The node proxy process without a task it is useless without (its ZDS client's: no pod could start on its node
again) stops and exits non-zero, so that the kubelet starts it again, instead of running on half-alive."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from tests.proxyconfig_rig import loopback_node_proxy_settings

from ambit.inpod.daemon import run_node_proxy
from ambit.supervision import TaskEndedError
from ambit.zds.client import ZdsClient

pytestmark = pytest.mark.timeout(30)


async def test_a_zds_client_task_ended_by_a_defect_stops_the_node_proxy_with_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken_connect(self: ZdsClient) -> None:
        await asyncio.sleep(0.01)
        raise RuntimeError("a defect outside the connection's own handling")

    monkeypatch.setattr(ZdsClient, "_connect", broken_connect)
    settings = loopback_node_proxy_settings(tmp_path, "workloads: []\nservices: []\n")
    with (
        caplog.at_level(logging.ERROR, logger="ambit.supervision"),
        pytest.raises(TaskEndedError, match=r"zds client .* ended by an error: RuntimeError"),
    ):
        await asyncio.wait_for(run_node_proxy(settings), 20)
    assert any("zds client" in r.getMessage() and r.exc_info for r in caplog.records)  # logged at once, traceback
