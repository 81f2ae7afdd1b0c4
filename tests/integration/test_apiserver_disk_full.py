"""The API server on a full disk: its state on a real, small tmpfs that the test fills (real ENOSPC from the kernel).

The tmpfs is mounted in a mount namespace of the test's own (``unshare -m``, private propagation: the machine never
sees it), held by a ``sleep`` process; the API server runs inside it (``nsenter -m``) and can be killed and started
again there, state kept. The test reaches the namespace's files through ``/proc/<holder>/root``.

What is checked is what kube-apiserver promises when its storage cannot write: a write is answered 500
``InternalError`` (a Kubernetes ``Status``) naming the storage, no acknowledged write is lost (also across a
``kill -9``), a refused one is not half there, reads go on, and writes work again once space is freed.
"""

from __future__ import annotations

import base64
import json
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from bench.server_process import free_port
from tests.harness import PrivateTmpfs

pytestmark = [pytest.mark.root, pytest.mark.timeout(180)]

TMPFS_SIZE = "24m"
"""Room for the server's bootstrap state and a few MiB of writes: small enough to fill in a moment."""
PAYLOAD = 96 * 1024
"""Bytes of data in each large ConfigMap written while filling."""
NAMESPACE = "default"


class FullDiskServer:
    """``ambit apiserver`` with ``data_dir`` on a tmpfs in a mount namespace of its own."""

    def __init__(self, base: Path) -> None:
        self.data_dir = base / "state"
        self.data_dir.mkdir()
        self.port = free_port()
        self.disk = PrivateTmpfs(self.data_dir, TMPFS_SIZE)
        self.proc: subprocess.Popen[str] | None = None
        self.log = base / "apiserver.log"
        self._context: ssl.SSLContext | None = None
        self._token = ""

    def start(self) -> None:
        argv = self.disk.argv(sys.executable, "-m", "ambit.cli", "apiserver", "--data-dir", str(self.data_dir))
        argv += ["--listen", f"127.0.0.1:{self.port}"]
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "ready" not in line:
            code = self.proc.wait(30)
            self.proc.stdout.close()
            self.proc = None
            raise AssertionError(f"the API server did not start (exit {code}): {self.log.read_text()[-2000:]}")
        config = yaml.safe_load(self.disk.inside("kubeconfig").read_text())
        ca = base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"]).decode()
        self._context = ssl.create_default_context(cadata=ca)
        self._token = config["users"][0]["user"]["token"]

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.communicate(timeout=15)
            self.proc = None

    def close(self) -> None:
        self.kill()
        self.disk.close()

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"https://127.0.0.1:{self.port}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, context=self._context, timeout=30) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def create_configmap(self, name: str, size: int) -> tuple[int, dict[str, Any]]:
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"d": "x" * size}}
        return self.request("POST", f"/api/v1/namespaces/{NAMESPACE}/configmaps", body)

    def configmaps(self) -> dict[str, int]:
        """Every ConfigMap this test wrote (not the server's own ``kube-root-ca.crt``) and the length of its data."""
        status, listed = self.request("GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps")
        assert status == 200, listed
        mine = [item for item in listed["items"] if "d" in (item.get("data") or {})]
        return {item["metadata"]["name"]: len(item["data"]["d"]) for item in mine}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FullDiskServer]:
    owned = FullDiskServer(tmp_path)
    try:
        owned.start()
        yield owned
    finally:
        owned.close()


def test_a_full_disk_fails_writes_with_a_500_naming_the_storage_loses_nothing_acknowledged_and_heals_when_freed(
    server: FullDiskServer,
) -> None:
    acknowledged: dict[str, int] = {}
    for n in range(3):
        assert server.create_configmap(f"before-{n}", 10)[0] == 201
        acknowledged[f"before-{n}"] = 10
    assert server.disk.fill() > 0
    # Writes may still land in room SQLite already had (its write-ahead log is reused once checkpointed); they
    # must fail once that is used up, well within the file system's size.
    refused: tuple[str, dict[str, Any]] | None = None
    for n in range(256):
        status, answer = server.create_configmap(f"full-{n}", PAYLOAD)
        if status == 201:
            acknowledged[f"full-{n}"] = PAYLOAD
            continue
        refused = (f"full-{n}", answer)
        assert status == 500, answer
        break
    assert refused is not None, "no write was refused on a full disk"
    name, status_body = refused
    assert status_body["kind"] == "Status" and status_body["status"] == "Failure", status_body
    assert status_body["code"] == 500 and status_body["reason"] == "InternalError", status_body
    message = status_body["message"]
    assert message.startswith("Internal error occurred: storage state.db: "), message
    assert str(server.data_dir) not in message, "a client is told where the server keeps its state"
    assert "full" in message and "Traceback" not in message, message
    # Reads go on; the refused write is not there, every acknowledged one is.
    assert server.configmaps() == acknowledged
    assert server.request("GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps/{name}")[0] == 404
    # Space freed: writes work again at once.
    server.disk.free()
    assert server.create_configmap("after", 10)[0] == 201, "a write failed after space was freed"
    acknowledged["after"] = 10
    # And nothing acknowledged was lost: kill -9 and start again on the same storage.
    server.kill()
    server.start()
    assert server.configmaps() == acknowledged


def test_a_server_started_on_a_full_disk_exits_with_one_line_naming_the_storage_and_starts_once_space_is_freed(
    server: FullDiskServer,
) -> None:
    """Its start-up writes (the built-in CRDs brought up to date) cannot land: it says so and exits, as
    kube-apiserver does when it cannot write its storage; nothing is lost, and it starts once there is room."""
    assert server.create_configmap("kept", 10)[0] == 201
    server.kill()
    server.disk.fill()
    with pytest.raises(AssertionError, match=r"did not start \(exit [1-9]"):
        server.start()
    last = server.log.read_text().strip().splitlines()[-1]
    assert last.startswith("ambit apiserver: Internal error occurred: storage ") and "full" in last, last
    assert "Traceback" not in server.log.read_text()
    server.disk.free()
    server.start()
    assert server.configmaps() == {"kept": 10}
    assert server.create_configmap("after", 10)[0] == 201
