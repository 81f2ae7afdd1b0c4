"""Container processes: spawn, find, signal, wait for and reap them.

There are no images. A container is its ``command`` + ``args`` run inside the pod's network namespace as
``ip netns exec <netns> <command> <args>`` (directly when the namespace name is empty, for tests), in a session of
its own so that stopping it signals its whole process group, with stdin from ``/dev/null`` and stdout and stderr
appended to its log file. Exits are seen through a pidfd, which also works for a process adopted after the
runtime restarted (one that is no longer our child, whose exit code is then unknown). A process is named by its
pid with its start time (:class:`ProcessHandle`), so a reused pid is never mistaken for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

KILL_WAIT = 5.0
"""Seconds to wait for a process group to go after SIGKILL before giving up on it."""
_RESET_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGPIPE", "SIGXFSZ", "SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGCHLD")
    if hasattr(signal, name)
)
"""Dispositions a container starts with at their defaults (Python ignores SIGPIPE and SIGXFSZ; exec keeps that)."""


@dataclass(frozen=True, slots=True)
class ProcessHandle:
    pid: int
    start_ticks: int
    """Field 22 of ``/proc/<pid>/stat``: with the pid, it names one process even after the pid is reused."""


def _stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` from field 3 (state) on; empty when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat[stat.rfind(")") + 2 :].split()


def process_start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def find_process(pid: int, start_ticks: int) -> ProcessHandle | None:
    """The process ``pid`` if it still runs (a zombie does not) and is the one that started at ``start_ticks``."""
    fields = _stat_fields(pid)
    if len(fields) < 20 or fields[0] in ("Z", "X") or fields[19] != str(start_ticks):
        return None
    return ProcessHandle(pid, start_ticks)


def reap(pid: int) -> int | None:
    """Collect the exit code of ``pid`` if it is our child and has exited; None otherwise."""
    return _reap(pid)


def pids_in_netns(netns_path: str) -> list[int]:
    """Processes whose network namespace is ``netns_path`` (what ``ip netns pids`` prints)."""
    try:
        target = os.stat(netns_path)
    except OSError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ns = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if (ns.st_dev, ns.st_ino) == (target.st_dev, target.st_ino):
            pids.append(int(entry))
    return pids


def child_of(parent: int) -> int | None:
    """The (first) live child process of ``parent``, or None."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and fields[1] == str(parent) and fields[0] != "Z":
            return int(entry.name)
    return None


def container_main_pid(status: Mapping[str, object]) -> int | None:
    """The main process of a running container, from its ``containerStatuses`` entry: the child of the ``runc run``
    whose pid the container's ``ambit://<pid>`` id names; None when it is not running or not one of ours."""
    state = status.get("state")
    runc = str(status.get("containerID", ""))
    if not isinstance(state, Mapping) or "running" not in state or not runc.startswith("ambit://"):
        return None
    pid = runc.removeprefix("ambit://")
    return child_of(int(pid)) if pid.isdigit() else None


def container_argv(netns: str, command: Sequence[str], args: Sequence[str], working_dir: str = "") -> list[str]:
    argv = [*command, *args]
    if working_dir:
        argv = ["env", "-C", working_dir, "--", *argv]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    return argv


def spawn(argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> ProcessHandle:
    """Start ``argv`` in a new session with output appended to ``log_path``; OSError when it cannot be executed.

    The executable is looked up in the container's ``PATH`` (``env``), as ``ip netns exec`` would.
    """
    path = env.get("PATH", os.defpath)
    executable = shutil.which(argv[0], path=path) if "/" not in argv[0] else argv[0]
    if executable is None:
        raise FileNotFoundError(2, "executable file not found in $PATH", argv[0])
    if list(argv[:3]) == ["ip", "netns", "exec"] and len(argv) > 4:
        # The container's own command runs after `ip netns exec NETNS`: look it up now, as a runtime does, so a
        # missing executable is a start error (128, StartError) rather than an exit of the wrapper.
        command = argv[4]
        found = (
            shutil.which(command, path=path)
            if "/" not in command
            else (command if os.access(command, os.X_OK) else None)
        )
        if found is None:
            raise FileNotFoundError(2, "executable file not found in $PATH", command)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
    try:
        pid = os.posix_spawn(
            executable,
            list(argv),
            dict(env),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, fd, 1),
                (os.POSIX_SPAWN_DUP2, fd, 2),
            ],
            setsid=True,
            setsigmask=(),
            setsigdef=_RESET_SIGNALS,
        )
    finally:
        os.close(fd)
    return ProcessHandle(pid, process_start_ticks(pid) or 0)


def signal_group(pid: int, sig: int) -> bool:
    """Signal the process group ``pid`` leads; False when there is none left."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return False
    return True


async def wait_exit(handle: ProcessHandle) -> int | None:
    """Wait for the process to exit; its exit code (128+n for signal n), or None when it is not our child.

    What is left of its process group is killed before the exit is reaped, as a container's cgroup is.
    """
    try:
        pidfd = os.pidfd_open(handle.pid)
    except ProcessLookupError:
        return _reap(handle.pid)
    loop = asyncio.get_running_loop()
    exited = loop.create_future()

    def readable() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        await exited
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
    signal_group(handle.pid, signal.SIGKILL)
    return _reap(handle.pid)


def _reap(pid: int) -> int | None:
    try:
        reaped, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if reaped == 0:
        return None
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


async def stop_process(handle: ProcessHandle, grace: float) -> None:
    """SIGTERM a process group nobody supervises, SIGKILL it after ``grace`` seconds."""
    if not signal_group(handle.pid, signal.SIGTERM):
        return
    try:
        await asyncio.wait_for(wait_exit(handle), grace)
    except TimeoutError:
        signal_group(handle.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wait_exit(handle), KILL_WAIT)
