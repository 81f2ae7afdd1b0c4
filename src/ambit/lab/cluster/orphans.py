"""Labs whose owner died: a test or benchmark that brings a lab up and means to take it down itself claims it; if
it is killed first (a ``timeout`` wrapper, SIGKILL, a lost terminal), the next one that takes the machine's lab lock
takes the orphan down.

Why: only one lab can be up on a machine (the labs share 198.18.0.1 and the pod ranges). A killed test releases
the machine's lab lock with its death, but its lab's daemons (API server, node runtimes, the mesh's pods) run on,
so :func:`ambit.lab.cluster.record.sweep_dead_labs` (labs no process runs in) does not see it, and every lab after
it refuses to start with "the lab's addresses are in use" until someone runs ``ambit lab down`` by hand.

Rules:

1. :func:`claim_lab` writes ``<lab>/owner.json``: this process's pid and start time (so a reused pid is not taken
   for the owner). Labs brought up with ``ambit lab up`` by hand (the demo, a user's lab) carry no claim and are
   never swept here.
2. :func:`sweep_orphaned_labs` finds the labs that have daemons running (their ``--dir``), reads each one's claim,
   and brings down those whose owner is no longer running. Call it with the machine's lab lock held: a lab whose
   owner is alive and holds the lock cannot be half up then, and one whose owner died cannot be in use.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable
from pathlib import Path

from ambit.commands import process_start_time
from ambit.lab.cluster.lifecycle import ambit_processes, lab_down

OWNER_FILE = "owner.json"


def claim_lab(directory: Path) -> None:
    """Rule 1, before ``ambit lab up`` runs in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    (directory / OWNER_FILE).write_text(json.dumps({"pid": pid, "start": process_start_time(pid)}) + "\n")


def owner_alive(directory: Path) -> bool | None:
    """Whether the lab's claimed owner still runs; None when the lab carries no (readable) claim."""
    try:
        claim = json.loads((directory / OWNER_FILE).read_text())
        pid, start = int(claim["pid"]), claim["start"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return start is not None and process_start_time(pid) == start


def running_lab_dirs() -> set[Path]:
    """The directories of the labs whose node runtimes or controllers run on this machine."""
    found = set()
    for _, args in ambit_processes():
        if b"lab" not in args:
            continue
        for flag, value in itertools.pairwise(args):
            if flag == b"--dir" and value:
                found.add(Path(os.fsdecode(value)))
    return found


def sweep_orphaned_labs(among: Iterable[Path] | None = None) -> list[str]:
    """Rule 2; the labs brought down. ``among`` limits the sweep to those lab directories (tests)."""
    removed = []
    candidates = running_lab_dirs()
    if among is not None:
        candidates &= set(among)
    for directory in sorted(candidates):
        if owner_alive(directory) is False:
            lab_down(directory)
            removed.append(f"lab {directory}, whose owner died")
    return removed
