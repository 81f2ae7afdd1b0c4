"""Stand-ins for a lab node's kubelet API tests (:mod:`ambit.lab.runtime.kubelet_server`): the node's pods as a
table the test writes, a node that runs no commands, and a short directory for the kubelet sockets."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class FakePods:
    """The pods the fake node runs, by (namespace, name); the test sets their status."""

    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    def find_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.pods.get((namespace, name))


class NoExec:
    """A node that runs no command (port-forward tests)."""

    async def start(
        self, pod_uid: str, container: str, argv: Sequence[str], *, stdin: bool, merge_stderr: bool
    ) -> asyncio.subprocess.Process:
        raise OSError("no exec here")


@contextmanager
def short_directory(prefix: str) -> Iterator[Path]:
    """A new directory under /tmp, removed afterwards: a unix socket's path holds 107 bytes, pytest's tmp_path is
    longer."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
