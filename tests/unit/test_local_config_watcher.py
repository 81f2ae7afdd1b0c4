"""The node proxy's local config watcher outlives a file it cannot even look at (EACCES, ENOTDIR): the last good
configuration stays, the error is logged once, and the file is read once it can be again."""

from __future__ import annotations

import asyncio
import itertools
import logging
from pathlib import Path

import pytest

from ambit.inpod.localstate import LocalConfigWatcher
from ambit.model.state import WorkloadState


async def test_a_path_that_cannot_be_looked_at_keeps_the_last_state_and_is_read_once_it_can(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    changes: list[int] = []
    blocker = tmp_path / "config"
    blocker.write_text("a file where the config's directory should be")
    watcher = LocalConfigWatcher(blocker / "mesh.yaml", WorkloadState(), lambda: changes.append(1))
    with caplog.at_level(logging.ERROR, logger="ambit.inpod.localstate"):
        assert watcher.poll() is False  # NotADirectoryError: no raise
        assert watcher.poll() is False
        task = asyncio.create_task(watcher.run())
        await asyncio.sleep(0.05)
        assert not task.done()
    assert watcher.errors == 1 and not watcher.loaded
    assert len([r for r in caplog.records if "cannot look at the file" in r.getMessage()]) == 1
    try:
        blocker.unlink()
        blocker.mkdir()
        (blocker / "mesh.yaml").write_text("workloads: []\n")
        async with asyncio.timeout(5):
            for _ in itertools.count():
                if watcher.loaded:
                    break
                await asyncio.sleep(0.01)
        assert changes == [1]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
