"""The supervisor reads a daemon's extra flags at each start: the bench restarts node proxies with other settings."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from tests.supervision import FAST, until_true

from ambit.lab.cluster.supervisor import NODEPROXY_FLAGS_FILE, Daemon, Supervisor, mesh_daemons, read_flags
from ambit.lab.network.topology import Topology

# Prints its arguments (one run per line), then sleeps until killed.
ECHO_ARGS = (sys.executable, "-c", "import sys, time; print('args', sys.argv[1:], flush=True); time.sleep(60)")


def runs(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("args")] if log.exists() else []


async def test_a_restarted_daemon_gets_the_flags_the_file_holds_at_that_start(tmp_path: Path) -> None:
    flags, log = tmp_path / "flags", tmp_path / "daemon.log"
    async with Supervisor([Daemon("proxy", (*ECHO_ARGS, "--base"), log, flags)], None, FAST) as supervisor:
        await until_true(lambda: len(runs(log)) == 1, "the first run")
        assert runs(log)[0] == "args ['--base']", "no file: no extra flags"

        flags.write_text("--pool-max-streams=1\n\n# a comment\n  --pool-idle-timeout=0  \n")
        first = supervisor.pids["proxy"]
        os.kill(first, signal.SIGTERM)
        await until_true(lambda: len(runs(log)) == 2, "the run with flags")
        assert runs(log)[1] == "args ['--base', '--pool-max-streams=1', '--pool-idle-timeout=0']"

        flags.unlink()
        os.kill(supervisor.pids["proxy"], signal.SIGTERM)
        await until_true(lambda: len(runs(log)) == 3, "the run without flags again")
        assert runs(log)[2] == "args ['--base']"
        assert supervisor.restarts == {"proxy": 2}


def test_flags_are_one_a_line_without_blanks_or_comments(tmp_path: Path) -> None:
    path = tmp_path / "flags"
    assert read_flags(path) == ()
    path.write_text("  --a=1\n\n#--b\n--c\n")
    assert read_flags(path) == ("--a=1", "--c")
    path.write_bytes(b"\xff\xfe--bad")
    assert read_flags(path) == ()  # unreadable: logged and ignored


def test_only_node_proxies_read_the_labs_nodeproxy_flags_file(tmp_path: Path) -> None:
    topology = Topology.new(2, tmp_path, mesh=True)
    daemons = mesh_daemons(topology)
    flagged = {d.what: d.flags_file for d in daemons}
    expected = tmp_path / "mesh" / NODEPROXY_FLAGS_FILE
    assert {what for what, path in flagged.items() if path == expected} == {
        f"nodeproxy {n.name}" for n in topology.all_nodes()
    }
    assert all(path is None for what, path in flagged.items() if what.startswith("nodeagent"))
    (tmp_path / "mesh").mkdir()
    expected.write_text("--pool-max-streams=1\n")
    proxy = next(d for d in daemons if d.what.startswith("nodeproxy"))
    assert proxy.command() == (*proxy.argv, "--pool-max-streams=1")
    agent = next(d for d in daemons if d.what.startswith("nodeagent"))
    assert agent.command() == agent.argv
