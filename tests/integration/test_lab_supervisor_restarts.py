"""The supervisor with real child processes: a killed daemon comes back, closing stops them all."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from tests.supervision import FAST, until_true

from ambit.lab.cluster.record import Record
from ambit.lab.cluster.supervisor import Daemon, Supervisor, SupervisorSettings

SLEEPER = (sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


async def test_a_killed_daemon_is_started_again_and_recorded(tmp_path: Path) -> None:
    record = Record(tmp_path / "record.jsonl")
    daemons = [Daemon("one", SLEEPER, tmp_path / "one.log"), Daemon("two", SLEEPER, tmp_path / "two.log")]
    async with Supervisor(daemons, record, FAST) as supervisor:
        one_log = tmp_path / "one.log"
        await until_true(lambda: len(supervisor.pids) == 2, "both daemons started")
        await until_true(lambda: one_log.exists() and "up" in one_log.read_text(), "daemon one running")
        first = supervisor.pids["one"]
        other = supervisor.pids["two"]
        os.kill(first, signal.SIGKILL)
        await until_true(lambda: supervisor.pids["one"] != first, "daemon one started again")
        assert alive(supervisor.pids["one"])
        await until_true(lambda: one_log.read_text().count("up") == 2, "both runs of daemon one logged")
        assert supervisor.restarts == {"one": 1, "two": 0}
        assert supervisor.pids["two"] == other
        pids = dict(supervisor.pids)
    noted = [(e["what"], e["pid"]) for e in record.entries() if e.kind == "process"]
    assert sorted(noted[:2]) == [("one", first), ("two", other)]
    assert noted[2:] == [("one", pids["one"])]
    assert not any(alive(pid) for pid in pids.values()), "closing the supervisor stops its daemons"


async def test_a_daemon_that_cannot_start_is_retried_without_taking_the_others_down(tmp_path: Path) -> None:
    missing = Daemon("missing", (str(tmp_path / "no-such-program"),), tmp_path / "missing.log")
    async with Supervisor([missing, Daemon("ok", SLEEPER, tmp_path / "ok.log")], None, FAST) as supervisor:
        await until_true(lambda: supervisor.restarts["missing"] >= 2, "two retries of the missing program")
        assert alive(supervisor.pids["ok"])
        assert "missing" not in supervisor.pids


async def test_a_daemon_that_ignores_sigterm_is_killed_on_close(tmp_path: Path) -> None:
    stubborn = (
        sys.executable,
        "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)",
    )
    log = tmp_path / "stubborn.log"
    supervisor = Supervisor([Daemon("stubborn", stubborn, log)], None, SupervisorSettings(term_grace=0.3))
    supervisor.start()
    await until_true(lambda: log.exists() and "up" in log.read_text(), "the daemon running")
    pid = supervisor.pids["stubborn"]
    await supervisor.aclose()
    assert not alive(pid)
