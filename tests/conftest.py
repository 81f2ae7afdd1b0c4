"""Shared fixtures: an embedded API server (in-process or as a real subprocess) and a kubectl runner."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from tests import harness
from tests.harness import ServerProcess, free_port

from ambit.apiserver.server import ApiServer, ApiServerSettings

REPO = Path(__file__).resolve().parents[1]

# Property tests judge correctness, never speed: no per-example deadline and no "too slow" health check, which a
# loaded machine trips at random. In CI the examples are derived from each test's name, so a run is repeatable.
settings.register_profile(
    "ambit",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=os.environ.get("CI") == "true",
)
settings.load_profile("ambit")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> object:
    """Keep the running test where :func:`tests.harness.timeout_paused` finds it."""
    harness.running_test.append(item)
    try:
        return (yield)
    finally:
        harness.running_test.remove(item)


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
