"""Shared fixtures: an embedded API server (in-process or as a real subprocess) and a kubectl runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

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


@dataclass
class ServerProcess:
    """``ambit apiserver`` run as a subprocess, as users run it."""

    data_dir: Path
    port: int
    proc: subprocess.Popen[str] | None = None

    @property
    def kubeconfig(self) -> Path:
        return self.data_dir / "kubeconfig"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ambit.cli",
                "apiserver",
                "--data-dir",
                str(self.data_dir),
                "--listen",
                f"127.0.0.1:{self.port}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "ready" not in line:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            raise RuntimeError(f"apiserver did not start: {line!r} {err[-2000:]}")

    def stop(self, *, kill: bool = False) -> int:
        assert self.proc is not None
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            code = self.proc.wait(timeout=15)
        finally:
            self.proc = None
        return code

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 30) -> str:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), KUBECACHEDIR=str(self.data_dir / "kubecache"))
        done = subprocess.run(["kubectl", *args], check=False, input=input, capture_output=True, text=True, env=env, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr}")
        return done.stdout if check else done.stdout + done.stderr

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("apiserver"), free_port())
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None:
            server.stop()


def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)
