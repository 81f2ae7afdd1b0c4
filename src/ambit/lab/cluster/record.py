"""The lab's crash-safe record of what it created, and the sweep that removes all of it.

Rule 1: a thing is noted *before* it is created (the line is written and fsync'ed first), so a crash at any point
leaves at most a note for a thing that does not exist, never a thing without a note. Processes are the exception
(their pid exists only once they run): they are noted right after the start, and the sweep also kills every process
inside the lab's namespaces, which covers one started just before a crash.

Rule 2: the sweep never trusts the record alone and never touches anything without the lab's prefix. Namespaces and
root-namespace links are found by listing the machine and keeping the names that start with ``<prefix>-``; routes
by their device; recorded processes are signalled only while their start time still matches (pid reuse); files
only inside the lab directory or with the prefix in their name.

Containers are deleted through runc first (``runc delete --force`` of every container under the lab's runc root,
which also kills their processes), then runc's state and the lab's cgroup parent (``/ambit-<prefix>``) go.

Rule 3: the sweep is idempotent and tolerant: whatever is already gone is skipped, a second sweep removes nothing.
Anything of the lab that is still there after the sweep is reported by :class:`SweepIncompleteError`.

Rule 4: a *dead* lab is one whose namespaces or root-namespace links are on the machine (names ``ab<4 hex>-…``) but
no process runs in any of its namespaces: a lab's node runtimes live in its node namespaces from the moment the lab
is up, so a lab none of whose namespaces holds a process was killed with its record gone or out of reach (a run
stopped mid-test, its temporary directory removed). :func:`sweep_dead_labs` sweeps such labs by prefix alone (rule
2's listings; no record, so no files); a lab with a process anywhere in its namespaces is alive and never touched.
A lab being brought up has its namespaces before its processes: whoever sweeps dead labs must know that no ``lab
up`` is in progress (the test harness holds the machine-wide lab lock; ``ambit lab down --dead`` is run by hand).

The record is JSON lines (``record.jsonl``), appended by several processes (``lab up``, the node runtimes): each
note is one ``write`` under an exclusive ``flock``. A torn last line (a crash mid-write) is skipped when reading
and closed with a newline by the next note, so it never swallows the next entry.

Kinds and their fields::

    netns       name
    link        name, netns (None: the root namespace)
    route       namespace (None: root), dst, via
    process     pid, start_time, what
    file, dir   path
    nft-table   netns (None: root), family, name
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ambit.commands import CommandResult, CommandRunner
from ambit.errors import AmbitError
from ambit.lab.network.topology import MAX_NODES, Topology
from ambit.lab.runtime.oci_apply import remove_lab_containers

KINDS: Mapping[str, tuple[str, ...]] = {
    "netns": ("name",),
    "link": ("name",),
    "route": ("namespace", "dst", "via"),
    "process": ("pid", "start_time", "what"),
    "file": ("path",),
    "dir": ("path",),
    "nft-table": ("netns", "family", "name"),
}

TERM_GRACE = 2.0  # seconds between SIGTERM and SIGKILL
_POLL = 0.05


class SweepIncompleteError(AmbitError):
    """Things of the lab were still there after a sweep (``removed`` says what the sweep did remove)."""

    def __init__(self, removed: list[str], left: list[str]) -> None:
        self.removed = removed
        self.left = left
        super().__init__("could not remove: " + "; ".join(left))


@dataclass(frozen=True, slots=True)
class Entry:
    kind: str
    fields: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


class Record:
    """``record.jsonl``: what the lab created, one JSON object per line, noted before creation."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def note(self, kind: str, **fields: Any) -> None:
        """Append one entry and fsync it; call this before creating the thing."""
        required = KINDS.get(kind)
        if required is None:
            raise ValueError(f"unknown record kind {kind!r} (one of {', '.join(KINDS)})")
        missing = [name for name in required if name not in fields]
        if missing:
            raise ValueError(f"a {kind!r} record needs {', '.join(missing)}")
        line = json.dumps({"kind": kind, **fields}, separators=(",", ":"), default=str).encode() + b"\n"
        created = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # close a torn line left by a crash
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            _fsync_dir(self.path.parent)

    def entries(self) -> list[Entry]:
        """Every readable entry in order; torn or foreign lines are skipped, a missing record is empty."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        out: list[Entry] = []
        for raw in data.splitlines():
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("kind"), str):
                kind = obj.pop("kind")
                out.append(Entry(kind, obj))
        return out


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- sweep ----------------------------------------------------------------------------------------------------


def sweep(topology: Topology, record: Record, runner: CommandRunner) -> list[str]:
    """Remove everything of the lab (recorded or found by prefix); return what was removed, in order."""
    return _Sweep(topology, record.entries(), runner).run()


LAB_NAME = re.compile(r"^(ab[0-9a-f]{4})-")
"""A lab's namespaces and root links: ``<prefix>-…`` with the prefix ``ab`` and the lab id's 4 hex digits."""


def dead_lab_prefixes(runner: CommandRunner) -> list[str]:
    """The prefixes of the dead labs on this machine (rule 4), sorted."""
    found: dict[str, list[str]] = {}
    for line in runner.run(["ip", "netns", "list"], check=False).text.splitlines():
        if line.strip() and (match := LAB_NAME.match(line.split()[0])):
            found.setdefault(match.group(1), []).append(line.split()[0])
    for link in _json_list(runner.run(["ip", "-j", "link", "show"], check=False)):
        if match := LAB_NAME.match(str(link.get("ifname", ""))):
            found.setdefault(match.group(1), [])
    dead = []
    for prefix, namespaces in sorted(found.items()):
        if not any(runner.run(["ip", "netns", "pids", ns], check=False).text.split() for ns in namespaces):
            dead.append(prefix)
    return dead


def sweep_dead_labs(runner: CommandRunner) -> list[str]:
    """Sweep every dead lab by its prefix (rule 4); return what was removed."""
    removed: list[str] = []
    for prefix in dead_lab_prefixes(runner):
        with tempfile.TemporaryDirectory(prefix=f"ambit-dead-{prefix}-") as nowhere:
            # No directory of its own: the sweep finds everything by prefix; every node's pod range is a candidate
            # route, removed only when its device carries the prefix.
            topology = Topology(prefix.removeprefix("ab"), MAX_NODES, nowhere)
            removed += _Sweep(topology, [], runner).run()
    return removed


class _Sweep:
    def __init__(self, topology: Topology, entries: list[Entry], runner: CommandRunner) -> None:
        self.topology = topology
        self.mine = topology.prefix + "-"
        self.entries = entries
        self.runner = runner
        self.removed: list[str] = []
        self.left: list[str] = []

    def run(self) -> list[str]:
        namespaces = self._namespaces()
        self._containers()
        self._processes(namespaces)
        self._nft_tables(namespaces)
        self._routes()
        # Root links before namespaces: deleting a veth end takes its peer at once, while a deleted namespace
        # releases its devices (and with them the root ends of their veths) later, in the kernel's own time.
        for name in self._root_links():
            self._delete(["ip", "link", "delete", name], f"link {name}")
        for name in sorted(namespaces, reverse=True):  # pods (…-p-…) before nodes (…-node-…)
            self._delete(["ip", "netns", "delete", name], f"netns {name}")
        self._files()
        self._check_gone()
        if self.left:
            raise SweepIncompleteError(self.removed, self.left)
        return self.removed

    def _sh(self, argv: list[str]) -> CommandResult:
        return self.runner.run(argv, check=False)

    def _delete(self, argv: list[str], what: str) -> bool:
        if self._sh(argv).ok:
            self.removed.append(what)
            return True
        return False  # already gone (a race) or stuck: _check_gone tells which

    # -- listings -------------------------------------------------------------------------------------------
    def _namespaces(self) -> list[str]:
        out = self._sh(["ip", "netns", "list"])
        names = [line.split()[0] for line in out.text.splitlines() if line.strip()]
        return [name for name in names if name.startswith(self.mine)]

    def _root_links(self) -> list[str]:
        links = _json_list(self._sh(["ip", "-j", "link", "show"]))
        names = [str(link.get("ifname", "")) for link in links]
        # The bridge last: veth ends are its ports.
        return sorted((n for n in names if n.startswith(self.mine)), key=lambda n: n == self.topology.bridge)

    # -- processes ------------------------------------------------------------------------------------------
    def _processes(self, namespaces: list[str]) -> None:
        targets: dict[int, tuple[int, str]] = {}
        for entry in self.entries:
            if entry.kind != "process":
                continue
            try:
                pid, start = int(entry["pid"]), int(entry["start_time"])
            except (TypeError, ValueError):
                continue
            if self.runner.process_start_time(pid) == start:
                targets[pid] = (start, str(entry.get("what", "")))
        for ns in namespaces:
            for word in self._sh(["ip", "netns", "pids", ns]).text.split():
                if word.isdigit() and int(word) not in targets:
                    found = self.runner.process_start_time(int(word))
                    if found is not None:
                        targets[int(word)] = (found, f"in {ns}")
        targets.pop(os.getpid(), None)
        if not targets:
            return
        for pid in targets:
            self.runner.kill(pid, signal.SIGTERM)
        waited = 0.0
        while waited < TERM_GRACE and any(self._same(pid, start) for pid, (start, _) in targets.items()):
            self.runner.sleep(_POLL)
            waited += _POLL
        for pid, (start, what) in targets.items():
            if self._same(pid, start):
                self.runner.kill(pid, signal.SIGKILL)
            self.removed.append(f"process {pid} ({what})" if what else f"process {pid}")

    def _containers(self) -> None:
        """Every runc container of the lab (``runc delete --force``), runc's state and the lab's cgroups."""
        removed, left = remove_lab_containers(self.topology.runc_root, self.topology.cgroup_parent)
        self.removed += removed
        self.left += left

    def _same(self, pid: int, start: int) -> bool:
        return self.runner.process_start_time(pid) == start

    # -- nftables, routes -----------------------------------------------------------------------------------
    def _nft_tables(self, namespaces: list[str]) -> None:
        for entry in self.entries:
            if entry.kind != "nft-table":
                continue
            netns, family, name = entry.get("netns"), str(entry["family"]), str(entry["name"])
            if netns:
                if netns not in namespaces:
                    continue  # went with its namespace
                prefix = ["ip", "netns", "exec", str(netns)]
            elif name.startswith(self.topology.prefix):
                prefix = []
            else:
                continue  # a root-namespace table without our prefix is never ours to delete
            if not self._sh([*prefix, "nft", "list", "table", family, name]).ok:
                continue
            where = f" in {netns}" if netns else ""
            if not self._delete([*prefix, "nft", "delete", "table", family, name], f"nft table {family} {name}{where}"):
                self.left.append(f"nft table {family} {name}{where}")

    def _routes(self) -> None:
        dsts = {node.pod_cidr for node in self.topology.all_nodes()}
        dsts |= {str(e["dst"]) for e in self.entries if e.kind == "route" and not e.get("namespace")}
        for route in _json_list(self._sh(["ip", "-j", "-4", "route", "show"])):
            dst, dev, via = route.get("dst"), str(route.get("dev", "")), route.get("gateway")
            if dst not in dsts or not dev.startswith(self.mine):
                continue
            argv = ["ip", "route", "delete", str(dst), *(["via", str(via)] if via else []), "dev", dev]
            self._delete(argv, f"route {dst}" + (f" via {via}" if via else "") + f" dev {dev}")

    # -- files ----------------------------------------------------------------------------------------------
    def _files(self) -> None:
        lab_dir = self.topology.path.resolve()
        for entry in reversed(self.entries):
            if entry.kind not in ("file", "dir"):
                continue
            path = Path(str(entry["path"]))
            inside = path.resolve() == lab_dir or lab_dir in path.resolve().parents
            if not (inside or self.topology.prefix in path.name):
                continue
            try:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                self.left.append(f"{entry.kind} {path} ({exc.strerror})")
                continue
            self.removed.append(f"{entry.kind} {path}")

    def _check_gone(self) -> None:
        self.left += [f"netns {name}" for name in self._namespaces()]
        self.left += [f"link {name}" for name in self._root_links()]


def _json_list(result: CommandResult) -> list[dict[str, Any]]:
    if not result.ok:
        return []
    try:
        data = json.loads(result.stdout or b"[]")
    except ValueError:
        return []
    return [item for item in data if isinstance(item, dict)] if isinstance(data, list) else []


__all__ = ["KINDS", "Entry", "Record", "SweepIncompleteError", "sweep"]
