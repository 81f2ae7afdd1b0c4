"""Finding a running pod's network namespace from the host's ``/proc``, as istio-cni does for pods that were
running before the agent started (their CNI ADD is long past, so no event names the namespace).

Rules:
1. A process belongs to pod ``uid`` when a line of its ``/proc/<pid>/cgroup`` names the uid: as kube's cgroupfs
   driver writes it (``pod<uid>``), as the systemd driver does (dashes as underscores), or as the lab's runtime
   does (``<uid without dashes>-<container>``). Matching is on the whole uid, never a prefix.
2. The namespace is that process's ``/proc/<pid>/ns/net``. A process in the node's own namespace (that of pid 1,
   or the agent's own, which runs on the host network) is never an answer: rules for a pod must never be applied
   to the node. Pid 1's may be unreadable (a sandboxed machine); with neither known, nothing is an answer.
3. Processes come and go during the scan; one that vanishes is skipped. The first match, by ascending pid, wins.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_HEX = frozenset("0123456789abcdef")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def cgroup_names_pod(cgroup_text: str, uid: str) -> bool:
    """Rule 1 (pure)."""
    if not _UUID.match(uid):
        return False
    forms = {uid.lower(), uid.lower().replace("-", "_"), uid.lower().replace("-", "")}
    for line in cgroup_text.lower().splitlines():
        for part in line.split(":", 2)[-1].split("/"):
            for form in forms:
                index = part.find(form)
                while index >= 0:
                    if _whole(part, index, len(form)):
                        return True
                    index = part.find(form, index + 1)
    return False


def _whole(part: str, index: int, length: int) -> bool:
    """The match at ``index`` is not a piece of a longer hex run (``pod<uid>`` counts as whole)."""
    end = index + length
    before_ok = index == 0 or part[index - 3 : index] == "pod" or part[index - 1] not in _HEX
    return before_ok and (end == len(part) or part[end] not in _HEX)


def find_pod_netns(proc: Path, uid: str, own_netns: Path = Path("/proc/self/ns/net")) -> str | None:
    """Rules 2 and 3: the netns path of a process of pod ``uid`` under ``proc`` (the host's /proc), or None."""
    excluded = _node_namespaces(proc, own_netns)
    if not excluded:
        return None
    try:
        pids = sorted(int(name) for name in os.listdir(proc) if name.isdigit())
    except OSError:
        return None
    for pid in pids:
        base = proc / str(pid)
        try:
            text = (base / "cgroup").read_text(errors="replace")
            if not cgroup_names_pod(text, uid):
                continue
            ns = base / "ns" / "net"
            found = os.stat(ns)
        except OSError:
            continue
        if (found.st_dev, found.st_ino) not in excluded:
            return str(ns)
    return None


def _node_namespaces(proc: Path, own: Path) -> set[tuple[int, int]]:
    """The namespaces that are the node's, never a pod's (rule 2): pid 1's and the agent's own (it runs on the
    host network). Either may be unreadable (a sandbox may hide pid 1's); at least one must be known."""
    found: set[tuple[int, int]] = set()
    for path in (proc / "1" / "ns" / "net", own):
        try:
            st = os.stat(path)
        except OSError:
            continue
        found.add((st.st_dev, st.st_ino))
    return found
