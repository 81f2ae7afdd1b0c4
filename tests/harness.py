"""Test harness shared by the suites: ``ambit apiserver`` as a subprocess, and polling helpers."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.server_process import free_port
from tests import lab_streams

__all__ = [
    "ServerProcess",
    "free_port",
    "own_sockets_on",
    "root_lab_lock",
    "running_test",
    "timeout_paused",
    "wait_for",
]


@dataclass
class ServerProcess:
    """``ambit apiserver`` run as a subprocess, as users run it."""

    data_dir: Path
    port: int
    proc: subprocess.Popen[str] | None = None
    extra_args: tuple[str, ...] = ()

    @property
    def kubeconfig(self) -> Path:
        return self.data_dir / "kubeconfig"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "apiserver.log", "a")  # noqa: SIM115 (closed once the child has it)
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
                *self.extra_args,
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        log.close()
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "ready" not in line:
            self.proc.kill()
            self.proc.communicate(timeout=10)
            err = (self.data_dir / "apiserver.log").read_text()
            raise RuntimeError(f"apiserver did not start: {line!r} {err[-2000:]}")

    def stop(self, *, kill: bool = False) -> int:
        assert self.proc is not None
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            self.proc.communicate(timeout=15)
            code = self.proc.returncode
        finally:
            self.proc = None
        return code

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 30) -> str:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), KUBECACHEDIR=str(self.data_dir / "kubecache"))
        done = subprocess.run(
            ["kubectl", *args], check=False, input=input, capture_output=True, text=True, env=env, timeout=timeout
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr}")
        return done.stdout if check else done.stdout + done.stderr

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))


def process_fds(pid: int) -> int:
    """How many file descriptors process ``pid`` holds (flood tests: nothing may pile up)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def process_rss(pid: int) -> int:
    """Process ``pid``'s resident memory in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def own_sockets_on(port: int) -> int:
    """How many sockets this process holds whose local TCP port is ``port`` (listening or connected)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    count = 0
    for line in Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[9] in inodes:
            count += 1
    return count


def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)


ROOT_LAB_LOCK = Path("/run/lock/ambit-lab-root.lock")
"""Only one lab network can be up on a machine (they share 198.18.0.1 and the pod routes): tests that bring one up
hold this lock, and wait for each other rather than fail."""

BEFORE_LAB_LOCK: list[Callable[[], None]] = []
"""Called before :func:`root_lab_lock` takes the lock: a lab this process keeps up across test modules
(``tests/e2e/lab_driver.py``, ``shared_mesh_lab``) is brought down first, since ``flock`` would make this process
wait for itself."""

running_test: list[Any] = []
"""The pytest item being run (kept by tests/conftest.py), whose timeout :func:`timeout_paused` stops."""


@contextlib.contextmanager
def timeout_paused() -> Iterator[None]:
    """Stop pytest-timeout's clock for the running test while the block runs, and restart it in full after.

    For waits on other people's work, not on ours: another suite's lab may hold :data:`ROOT_LAB_LOCK` for a whole
    module (minutes), and a test queued behind it must not be timed out for that.
    """
    import pytest_timeout

    item = running_test[-1] if running_test else None
    settings = pytest_timeout._get_item_settings(item) if item is not None else None
    timed = settings is not None and bool(settings.timeout) and not settings.func_only
    if timed:
        item.config.hook.pytest_timeout_cancel_timer(item=item)
    try:
        yield
    finally:
        if timed:
            item.config.hook.pytest_timeout_set_timer(item=item, settings=settings)


@contextlib.contextmanager
def root_lab_lock(wait: float) -> Iterator[None]:
    """Hold the machine-wide lab lock, waiting up to ``wait`` seconds for whoever holds it.

    The running test's timeout does not count the wait (:func:`timeout_paused`): a lab is up for at most its
    module's tests, each bounded by its own timeout, and ``flock`` is released when its holder dies, so the
    queue always moves; ``wait`` only bounds how long a run may queue behind others.
    """
    import pytest

    for before in list(BEFORE_LAB_LOCK):
        before()
    ROOT_LAB_LOCK.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(ROOT_LAB_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with timeout_paused():
                deadline = time.monotonic() + wait
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            pytest.fail(f"another lab held {ROOT_LAB_LOCK} for {wait:.0f} s")
                        time.sleep(0.1)
        if not lab_streams.is_secondary():  # tests/lab_streams.py rule 3
            _sweep_dead_labs()
        yield
    finally:
        os.close(fd)


def _sweep_dead_labs() -> None:
    """Remove the labs a killed run left behind: those whose owning test or benchmark died with its lab still running
    (:mod:`ambit.lab.cluster.orphans`), and those no process runs in any more (record.py rule 4). They hold the
    lab's addresses, and every lab after them would refuse to start. Run with :data:`ROOT_LAB_LOCK` held, so no
    lab of ours is half up."""
    from ambit.commands import SubprocessRunner
    from ambit.lab.cluster.orphans import sweep_orphaned_labs
    from ambit.lab.cluster.record import sweep_dead_labs

    if os.geteuid() != 0:
        return
    removed = sweep_orphaned_labs() + sweep_dead_labs(SubprocessRunner())
    if removed:
        print(f"removed a dead lab's leftovers: {'; '.join(removed)}", file=sys.stderr)


class PrivateTmpfs:
    """A tmpfs of ``size`` mounted at ``path`` in a mount namespace of its own (``unshare -m``, private
    propagation: the machine never sees it), held by a ``sleep`` process; ``seed``'s content is copied in first.
    Processes started with :meth:`argv` run inside it; this process reaches its files through :meth:`inside`."""

    def __init__(self, path: Path, size: str, seed: Path | None = None) -> None:
        self.path = path
        copy = f' && cp -a "{seed}/." "$0/"' if seed is not None else ""
        script = f'mount -t tmpfs -o size="$1",mode=0700 ambit-full-disk "$0"{copy} && echo mounted && exec sleep 3600'
        self.holder = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script, str(path), size],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.holder.stdout is not None
        line = self.holder.stdout.readline().strip()
        if line != "mounted":
            self.close()
            raise AssertionError(f"could not mount a tmpfs at {path}: {line!r}")

    def argv(self, *command: str) -> list[str]:
        return ["nsenter", "-t", str(self.holder.pid), "-m", "--", *command]

    def inside(self, relative: str = "") -> Path:
        """A path of the tmpfs as processes inside see it, reached from here."""
        return Path(f"/proc/{self.holder.pid}/root") / self.path.relative_to("/") / relative

    def fill(self, name: str = "filler") -> int:
        """Write zeros to a file until the kernel says ENOSPC; the bytes written."""
        written = 0
        chunk = b"\0" * 65536
        with open(self.inside(name), "wb", buffering=0) as filler:
            while True:
                try:
                    written += filler.write(chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    return written

    def free(self, name: str = "filler") -> None:
        self.inside(name).unlink()

    def close(self) -> None:
        """Kill the holder: the namespace and its tmpfs go once no process is left in them."""
        self.holder.kill()
        self.holder.communicate(timeout=15)
