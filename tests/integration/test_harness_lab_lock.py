"""The harness's lab lock: a test queued behind another holder is not timed out for the wait.

The lock file is this test's own (``ROOT_LAB_LOCK`` patched to a temporary path), held by a child process for
longer than the test's whole timeout.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests import harness

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


@pytest.mark.timeout(2)
def test_waiting_for_the_lab_lock_does_not_count_against_the_test_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "lab.lock"
    monkeypatch.setattr(harness, "ROOT_LAB_LOCK", lock)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock), "4"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        began = time.monotonic()
        with harness.root_lab_lock(wait=60):
            waited = time.monotonic() - began
        assert holder.wait(timeout=1) == 0  # the lock came when the holder let go, not before
        assert waited > 2  # longer than the timeout, which stopped meanwhile
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()


def test_a_lab_lock_held_for_longer_than_the_wait_fails_the_test_with_a_clear_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "lab.lock"
    monkeypatch.setattr(harness, "ROOT_LAB_LOCK", lock)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock), "60"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(pytest.fail.Exception, match=r"another lab held .* for 0 s"), harness.root_lab_lock(0.2):
            pass
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
