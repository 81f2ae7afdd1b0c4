"""Shared fixtures: an embedded API server (in-process or as a real subprocess) and a kubectl runner."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from tests.harness import ServerProcess, free_port

from ambit.apiserver.server import ApiServer, ApiServerSettings

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
async def apiserver(tmp_path: Path) -> AsyncIterator[ApiServer]:
    """An API server in this test's event loop, on a free loopback port."""
    server = ApiServer(ApiServerSettings(data_dir=tmp_path / "apiserver", port=0))
    await server.start()
    try:
        yield server
    finally:
        await server.aclose()


@pytest.fixture(scope="module")
def server_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("apiserver"), free_port())
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None:
            server.stop()
