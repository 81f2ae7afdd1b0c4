"""Ambit's seam for side effects on the machine: commands, signals and process identity.

Everything Ambit runs on the machine (``ip``, ``nft``, ``iptables-restore``, CNI plugins) and every signal it sends
goes through a :class:`CommandRunner`: the lab's network and pods, the node agent's redirection (:mod:`ambit.cni`,
:mod:`ambit.redirect`). :class:`SubprocessRunner` is the real one; :class:`RecordingRunner` is the stand-in for
unit tests: it records every call and answers from a responder the test provides, so tests can check the exact
commands and play a machine's answers back without root. :class:`RewritingRunner` wraps a runner and rewrites
each command line before running it (to run it in another network namespace, for instance).

A command's environment is the runner's own environment with ``env`` laid over it (CNI plugins need ``PATH`` and
the runtime's variables as well as the ``CNI_*`` ones).

Processes are identified by (pid, start time): the start time is field 22 of ``/proc/<pid>/stat`` (clock ticks
after boot), so a recorded pid that the kernel has since given to another process is never signalled.

A low-layer module: it imports only the standard library and :mod:`ambit.errors`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ambit.errors import AmbitError


@dataclass(frozen=True, slots=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: bytes = b""
    stderr: bytes = b""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")


class CommandError(AmbitError):
    """A command exited non-zero (or could not be started, ``returncode`` 127)."""

    def __init__(self, result: CommandResult) -> None:
        self.result = result
        err = result.stderr.decode(errors="replace").strip() or result.text.strip()
        super().__init__(f"{' '.join(result.argv)} exited {result.returncode}: {err[-500:]}")


class CommandRunner(Protocol):
    """Runs commands and signals processes."""

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run ``argv`` to completion; raise :class:`CommandError` on a non-zero exit when ``check``."""
        ...

    async def run_async(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
    ) -> CommandResult:
        """As :meth:`run`, without blocking the event loop; cancelling it (``asyncio.timeout``) kills the child."""
        ...

    def process_start_time(self, pid: int) -> int | None:
        """The start time of a live process, or None when there is no such process (or only its zombie)."""
        ...

    def kill(self, pid: int, sig: int) -> bool:
        """Send ``sig`` to ``pid``; False when there is no such process."""
        ...

    def sleep(self, seconds: float) -> None: ...


def process_start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat``; None for a missing or zombie process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain anything, ")" included: split after the last.
    rest = stat[stat.rfind(b")") + 2 :].split()
    if len(rest) < 20 or rest[0] in (b"Z", b"X"):
        return None
    try:
        return int(rest[19])
    except ValueError:
        return None


class SubprocessRunner:
    """The real runner: subprocesses, ``os.kill``, ``/proc``."""

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> CommandResult:
        args = tuple(argv)
        try:
            proc = subprocess.run(
                args,
                input=stdin if stdin is not None else b"",
                capture_output=True,
                env={**os.environ, **env} if env is not None else None,
                timeout=timeout,
                check=False,
            )
            result = CommandResult(args, proc.returncode, proc.stdout, proc.stderr)
        except subprocess.TimeoutExpired:
            result = CommandResult(args, 124, b"", f"timed out after {timeout} s".encode())
        except OSError as exc:
            result = CommandResult(args, 127, b"", str(exc).encode())
        if check and not result.ok:
            raise CommandError(result)
        return result

    async def run_async(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
    ) -> CommandResult:
        args = tuple(argv)
        try:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, **env} if env is not None else None,
            )
        except OSError as exc:
            result = CommandResult(args, 127, b"", str(exc).encode())
        else:
            try:
                out, err = await proc.communicate(stdin or b"")
            except BaseException:
                # Cancelled (a caller's timeout): never leave the child behind.
                if proc.returncode is None:
                    proc.kill()
                    await asyncio.shield(proc.wait())
                raise
            result = CommandResult(args, proc.returncode or 0, out, err)
        if check and not result.ok:
            raise CommandError(result)
        return result

    def process_start_time(self, pid: int) -> int | None:
        return process_start_time(pid)

    def kill(self, pid: int, sig: int) -> bool:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class RewritingRunner:
    """Runs every command through ``inner`` after ``rewrite`` has turned its argv into the one to run."""

    def __init__(self, inner: CommandRunner, rewrite: Callable[[tuple[str, ...]], tuple[str, ...]]) -> None:
        self.inner = inner
        self.rewrite = rewrite

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> CommandResult:
        return self.inner.run(self.rewrite(tuple(argv)), stdin=stdin, env=env, check=check, timeout=timeout)

    async def run_async(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
    ) -> CommandResult:
        return await self.inner.run_async(self.rewrite(tuple(argv)), stdin=stdin, env=env, check=check)

    def process_start_time(self, pid: int) -> int | None:
        return self.inner.process_start_time(pid)

    def kill(self, pid: int, sig: int) -> bool:
        return self.inner.kill(pid, sig)

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


@dataclass(frozen=True, slots=True)
class Call:
    """One command a :class:`RecordingRunner` was asked to run."""

    argv: tuple[str, ...]
    stdin: bytes | None = None
    env: Mapping[str, str] | None = None


Responder = Callable[[Call], CommandResult | None]


@dataclass
class RecordingRunner:
    """The unit tests' runner: records calls and answers them from ``respond`` (None means success, no output).

    Processes live in ``processes`` (pid -> start time); a signal in ``lethal`` removes the process it is sent to.
    """

    respond: Responder = lambda call: None
    processes: dict[int, int] = field(default_factory=dict)
    lethal: frozenset[int] = frozenset({signal.SIGTERM, signal.SIGKILL})
    calls: list[Call] = field(default_factory=list)
    signals: list[tuple[int, int]] = field(default_factory=list)
    slept: float = 0.0

    @property
    def commands(self) -> list[str]:
        """The argv of every call so far, each joined with spaces (for compact assertions)."""
        return [" ".join(call.argv) for call in self.calls]

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> CommandResult:
        call = Call(tuple(argv), stdin, dict(env) if env is not None else None)
        self.calls.append(call)
        result = self.respond(call) or CommandResult(call.argv, 0)
        if check and not result.ok:
            raise CommandError(result)
        return result

    async def run_async(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
    ) -> CommandResult:
        return self.run(argv, stdin=stdin, env=env, check=check)

    def process_start_time(self, pid: int) -> int | None:
        return self.processes.get(pid)

    def kill(self, pid: int, sig: int) -> bool:
        if pid not in self.processes:
            return False
        self.signals.append((pid, sig))
        if sig in self.lethal:
            del self.processes[pid]
        return True

    def sleep(self, seconds: float) -> None:
        self.slept += seconds
