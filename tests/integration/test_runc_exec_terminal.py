"""``RuncExec.start_tty`` with its shim and console socket, against a stand-in for ``runc exec --tty --detach``
that does what runc does there: makes a terminal, starts the command on it, sends the master end over the console
socket with SCM_RIGHTS, writes the pid file and exits without waiting for the command."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ambit.lab.runtime.kubelet_server import RuncExec, TerminalProcess
from ambit.lab.runtime.terminal import TerminalError

FAKE_RUNC = """\
import fcntl, os, socket, sys, termios
args = sys.argv[1:]
if os.environ.get("FAKE_RUNC_FAIL"):
    print("exec failed: unable to start container process: no such container", file=sys.stderr)
    sys.exit(1)
console = args[args.index("--console-socket") + 1]
pid_file = args[args.index("--pid-file") + 1]
argv = args[args.index("--pid-file") + 3:]
master, slave = os.openpty()
pid = os.fork()
if pid == 0:
    os.setsid()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    for fd in (0, 1, 2):
        os.dup2(slave, fd)
    os.execvp(argv[0], argv)
os.close(slave)
with open(pid_file, "w") as f:
    f.write(str(pid))
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
    s.connect(console)
    socket.send_fds(s, [b"/dev/pts/0"], [master])
os._exit(0)
"""


@pytest.fixture
def fake_runc(tmp_path: Path) -> Path:
    path = tmp_path / "runc"
    path.write_text(f"#!{sys.executable}\n{FAKE_RUNC}")
    path.chmod(0o755)
    return path


@pytest.fixture
def scratch_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: a unix socket's path holds 107 bytes
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def leftovers(directory: Path) -> list[str]:
    return os.listdir(directory)


@pytest.fixture
async def started() -> AsyncIterator[list[TerminalProcess]]:
    held: list[TerminalProcess] = []
    yield held
    for t in held:
        if t.proc.returncode is None:
            t.proc.kill()
            await t.proc.wait()
        t.close()


async def read_to_end(t: TerminalProcess) -> bytes:
    out = b""
    while chunk := await asyncio.wait_for(t.terminal.read(), 20):
        out += chunk
    return out


async def test_a_command_on_a_terminal_keeps_its_exit_status_through_the_shim(
    fake_runc: Path, tmp_path: Path, scratch_dir: Path, started: list[TerminalProcess]
) -> None:
    runner = RuncExec(tmp_path / "state", runc=str(fake_runc), scratch_dir=scratch_dir)
    t = await runner.start_tty("uid-1", "main", ["sh", "-c", "[ -t 1 ] && echo on-a-tty; exit 7"])
    started.append(t)
    assert t.scratch is not None and t.scratch.stat().st_mode & 0o777 == 0o700
    assert await read_to_end(t) == b"on-a-tty\r\n"
    assert await asyncio.wait_for(t.proc.wait(), 20) == 7
    t.close()
    assert leftovers(scratch_dir) == []


async def test_a_terminated_shim_passes_sigterm_to_the_command(
    fake_runc: Path, tmp_path: Path, scratch_dir: Path, started: list[TerminalProcess]
) -> None:
    runner = RuncExec(tmp_path / "state", runc=str(fake_runc), scratch_dir=scratch_dir)
    t = await runner.start_tty("uid-1", "main", ["sh", "-c", "echo ready; exec sleep 30"])
    started.append(t)
    assert await asyncio.wait_for(t.terminal.read(), 20) == b"ready\r\n"
    await asyncio.sleep(0.3)  # the shim has read the pid file
    t.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(t.proc.wait(), 20) == 128 + signal.SIGTERM


async def test_a_runtime_that_fails_before_handing_a_terminal_over_is_reported_with_its_message(
    fake_runc: Path, tmp_path: Path, scratch_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_RUNC_FAIL", "1")
    runner = RuncExec(tmp_path / "state", runc=str(fake_runc), scratch_dir=scratch_dir)
    with pytest.raises(TerminalError, match="no such container"):
        await runner.start_tty("uid-1", "main", ["true"])
    assert leftovers(scratch_dir) == []
