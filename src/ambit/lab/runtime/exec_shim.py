"""The parent of a command run on a terminal: ``python -m ambit.lab.runtime.exec_shim PIDFILE GRACE RUNC-ARGV...``.

Theory of operation. runc hands a terminal's master end over a console socket only when it detaches
(``runc exec --detach``): it then exits once the command has started, and the command, orphaned, would be
reparented to the machine's init, taking its exit status with it. This small process stands where containerd's
shim stands: it makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``), runs runc, and, runc gone, waits for
the command, which the kernel has reparented to it, so that its own exit status is the command's. The kubelet
(:class:`ambit.lab.runtime.kubelet_server.RuncExec`) runs it as a plain child and reads its exit status as it reads
``runc exec``'s without a terminal.

Rules:
1. runc failing (its exit status is not 0) is this process's exit status; runc's messages went to the inherited
   stderr.
2. After runc, the command's pid is read from PIDFILE (runc's ``--pid-file``); children are reaped until that one
   is, and its status is ours: its exit code, or 128 + the signal that ended it, as a shell reports it.
3. SIGTERM, SIGINT and SIGHUP are passed on to the command (held until its pid is known); after a SIGTERM the
   command gets GRACE seconds, then SIGKILL (the kubelet's own SIGKILL would end only this process).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from types import FrameType

PR_SET_CHILD_SUBREAPER = 36


class _Forwarder:
    """Rule 3's state: the command's pid once known, and the signals that came before it."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.pid = 0
        self.pending: list[int] = []

    def received(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGALRM:
            self._send(signal.SIGKILL)
            return
        if signum == signal.SIGTERM:
            signal.setitimer(signal.ITIMER_REAL, self.grace)
        if self.pid:
            self._send(signum)
        else:
            self.pending.append(signum)

    def known(self, pid: int) -> None:
        self.pid = pid
        for signum in self.pending:
            self._send(signum)
        self.pending.clear()

    def _send(self, signum: int) -> None:
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)


def exit_code(status: int) -> int:
    """Rule 2: a wait status as a shell's exit code."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def main(argv: Sequence[str]) -> int:
    if len(argv) < 3:
        print("usage: exec_shim PIDFILE GRACE RUNC-ARGV...", file=sys.stderr)
        return 2
    pid_file, grace, runc = argv[0], float(argv[1]), list(argv[2:])
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"exec_shim: prctl: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return 125
    forwarder = _Forwarder(grace)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM):
        signal.signal(signum, forwarder.received)
    code = subprocess.call(runc, stdin=subprocess.DEVNULL)
    if code != 0:
        return code
    try:
        with open(pid_file) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError) as exc:
        print(f"exec_shim: the command's pid is unknown: {exc}", file=sys.stderr)
        return 125
    forwarder.known(pid)
    while True:
        try:
            found, status = os.waitpid(-1, 0)
        except ChildProcessError:  # reaped already, or never ours: nothing tells its status
            print(f"exec_shim: process {pid} is not a child of this shim", file=sys.stderr)
            return 125
        if found == pid:
            return exit_code(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
