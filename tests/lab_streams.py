"""The lab share in two streams that take test modules from one queue (``scripts/run_suite.sh``).

The lab share is the suite's longest line: its tests bring up labs one after the other, mostly waiting on them. Once
the rest share is done, a second pytest process (the *secondary* stream) runs beside the first (the *primary*),
in a network namespace and with a ``/run/netns`` and ``/run/lock`` of its own (a machine of its own, as far as labs
go: its labs' bridge address, pod routes, named namespaces and lab lock cannot meet the primary's). Both collect the
whole share and take its modules from a queue file, a module at a time; a module one stream took, the other
skips. The primary takes them in pytest's order (the modules on the shared mesh lab first), the secondary from the
end backwards (the modules with labs of their own first, so it seldom brings up a shared lab of its own); whichever
stream is free takes its next module, so the two meet somewhere in the middle and end within about one module of
each other.

Rules:

1. A module is taken whole (its module-scoped lab fixtures are brought up once, as in one process), under an
   exclusive ``flock`` on the queue file, which lists the taken modules one per line.
2. A stream takes the next module before running the last test of the one it runs, so pytest tears the module's
   fixtures down knowing which test comes next.
3. The modules that make or sweep dead and orphaned labs on purpose (:data:`PRIMARY_ONLY`) run in the primary
   stream only, and the secondary stream sweeps no one's labs when it takes its lab lock (``tests/harness.py``): a
   sweep sees the machine's processes, so one stream's sweep must never meet the other's labs or stand-ins.

``AMBIT_LAB_QUEUE`` names the queue file; ``AMBIT_LAB_STREAM`` is ``primary`` (the default) or ``secondary``.
Without ``AMBIT_LAB_QUEUE`` pytest runs every collected test itself.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

QUEUE_VARIABLE = "AMBIT_LAB_QUEUE"
STREAM_VARIABLE = "AMBIT_LAB_STREAM"
STREAMS = ("primary", "secondary")

PRIMARY_ONLY = frozenset(
    {
        "tests/integration/test_harness_lab_lock.py",
        "tests/integration/test_lab_orphans.py",
        "tests/netns/test_dead_lab_sweep.py",
    }
)
"""Rule 3: modules that make dead or orphaned labs (or their stand-ins), or sweep them, on purpose."""


def stream() -> str:
    value = os.environ.get(STREAM_VARIABLE, "primary")
    if value not in STREAMS:
        raise pytest.UsageError(f"{STREAM_VARIABLE} must be one of {', '.join(STREAMS)}, not {value!r}")
    return value


def is_secondary() -> bool:
    return os.environ.get(QUEUE_VARIABLE) is not None and stream() == "secondary"


def take(queue: Path, module: str) -> bool:
    """Rule 1: take ``module`` unless a stream already has; whether this stream now has it."""
    fd = os.open(queue, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        taken = set()
        with os.fdopen(os.dup(fd), "rb") as reader:
            taken = {line.decode(errors="replace") for line in reader.read().splitlines()}
        if module in taken:
            return False
        os.write(fd, module.encode() + b"\n")
        return True
    finally:
        os.close(fd)


def _groups(items: list[pytest.Item], root: Path) -> list[tuple[str, int, int]]:
    """The items' modules in order: (module, first index, index after the last); a module's items are consecutive
    (pytest and pytest-randomly keep them together)."""
    groups: list[tuple[str, int, int]] = []
    for index, item in enumerate(items):
        module = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else str(item.path)
        if groups and groups[-1][0] == module:
            groups[-1] = (module, groups[-1][1], index + 1)
        else:
            groups.append((module, index, index + 1))
    return groups


def run_from_queue(session: pytest.Session, queue: Path, root: Path) -> None:
    """Run the modules this stream takes from ``queue`` (rules 1 and 2), as pytest's own loop runs items."""
    secondary = stream() == "secondary"
    groups = _groups(session.items, root)
    if secondary:
        groups.reverse()  # from the end backwards; each module's own tests keep their order
    mine: set[str] = set()

    def next_group(position: int) -> int | None:
        for at in range(position, len(groups)):
            module = groups[at][0]
            if module in mine:
                return at
            if secondary and module in PRIMARY_ONLY:
                continue
            if take(queue, module):
                mine.add(module)
                return at
        return None

    at = next_group(0)
    while at is not None:
        _, first, end = groups[at]
        following: int | None = None
        for index in range(first, end):
            if index + 1 < end:
                nextitem: pytest.Item | None = session.items[index + 1]
            else:
                following = next_group(at + 1)
                nextitem = session.items[groups[following][1]] if following is not None else None
            item = session.items[index]
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
        at = following
