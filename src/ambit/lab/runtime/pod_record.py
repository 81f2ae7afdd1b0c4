"""``<pods_dir>/<uid>/runtime.json``: what a node runtime needs to adopt a pod after it restarted.

Theory of operation. A :class:`PodRecord` names the node, the pod, its sandbox (network namespace and addresses),
each container's process by pid and start time, and whether its init containers all completed. The pod worker
rewrites it after each change (atomically: written to a temporary file, then renamed) so that a runtime that
crashed at any point finds the sandbox and the processes it left (rule 6 of :mod:`ambit.lab.runtime.pod_worker`). A
file that cannot be read or parsed counts as absent.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

STATE_FILE = "runtime.json"


@dataclass(frozen=True, slots=True)
class SavedSandbox:
    netns: str
    netns_path: str
    ips: tuple[str, ...]


@dataclass(slots=True)
class PodRecord:
    """``runtime.json``: what rule 6 needs to adopt a pod after the runtime restarted."""

    node: str
    uid: str
    sandbox: SavedSandbox | None = None
    processes: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Container name → (pid, start ticks)."""
    initialized: bool = False
    """Every init container completed: a runtime adopting the pod never runs them again."""

    def save(self, path: Path) -> None:
        data = {
            "node": self.node,
            "uid": self.uid,
            "sandbox": dataclasses.asdict(self.sandbox) if self.sandbox else None,
            "processes": {name: list(p) for name, p in self.processes.items()},
            "initialized": self.initialized,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> PodRecord | None:
        try:
            data = json.loads(path.read_text())
            sandbox = data.get("sandbox")
            return cls(
                str(data["node"]),
                str(data["uid"]),
                SavedSandbox(str(sandbox["netns"]), str(sandbox["netns_path"]), tuple(sandbox["ips"]))
                if sandbox
                else None,
                {str(k): (int(v[0]), int(v[1])) for k, v in (data.get("processes") or {}).items()},
                data.get("initialized") is True,
            )
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            return None
