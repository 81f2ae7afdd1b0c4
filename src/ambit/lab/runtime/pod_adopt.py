"""Adoption (rule 6 of :mod:`ambit.lab.runtime.pod_worker`): a pod worker takes over what a previous node runtime
left running.

Theory of operation. ``<pods_dir>/<uid>/runtime.json`` (:mod:`ambit.lab.runtime.pod_record`) names each container's
process by pid and start time. When a worker starts for a pod that has that record, :func:`adopt` matches each
container against it and against the status the API last reported:

- a recorded process that still runs (the same pid and start time) is adopted: its supervisor watches it instead
  of starting a new one;
- a recorded process that is gone while the API says the container runs exited while the runtime was away: its
  exit code is known only when this very process had started it, and a Warning ``Failed`` Event says so;
- a container the API reports terminated stays exited;
- once the record says the init containers all completed, those not found running count as completed;
- any other process in the pod's network namespace is a stray and is killed.

:func:`stop_unsupervised` stops the recorded processes that were never adopted (the pod was deleted first).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from typing import TYPE_CHECKING

from ambit.lab.runtime.containers import Exited, Phase, is_sidecar
from ambit.lab.runtime.processes import ProcessHandle, find_process, pids_in_netns, reap, stop_process

if TYPE_CHECKING:
    from ambit.lab.runtime.pod_worker import PodWorker

log = logging.getLogger("ambit.lab.runtime.kubelet")


def adopt(worker: PodWorker) -> dict[str, ProcessHandle]:
    """Rule 6: the processes of a previous runtime that still run, by container name; containers that
    exited for good before it went away stay exited."""
    saved = worker.saved
    adopted: dict[str, ProcessHandle] = {}
    for sup in worker.all_supervisors if saved is not None else ():
        reported = worker.reported.get(sup.name) or {}
        state = reported.get("state") or {}
        entry = saved.processes.get(sup.name) if saved is not None else None
        handle = find_process(*entry) if entry is not None else None
        if entry is not None and handle is not None:
            sup.state.restore(reported, entry[0])
            adopted[sup.name] = handle
            log.info("pod %s/%s: adopted %s (pid %d)", worker.namespace, worker.name, sup.name, entry[0])
        elif entry is not None and "running" in state:
            sup.state.restore(reported, entry[0])
            code = reap(entry[0])  # known only when this very process had started it
            sup.state.apply(Exited(code, worker.runtime.clock()))
            shown = "unknown" if code is None else str(code)
            note = f"Container {sup.name} exited while the node runtime was away (exit code {shown})"
            worker.event("Warning", "Failed", note)
        elif isinstance(state.get("terminated"), dict):
            sup.state.resume_exited(reported)
        if sup.name not in adopted:
            worker.record.processes.pop(sup.name, None)
    for sup in worker.init_supervisors if worker.record.initialized else ():
        if sup.state.phase is not Phase.EXITED and not is_sidecar(sup.state):
            sup.state.assume_completed()
    if worker.sandbox is not None and worker.sandbox.netns_path:
        known: set[int] = set()
        for sup in worker.all_supervisors:
            if sup.name in adopted:
                known |= worker.runtime.containers.members(sup.container_id, adopted[sup.name])
        for pid in pids_in_netns(worker.sandbox.netns_path):
            if pid not in known:
                log.warning("pod %s/%s: killing stray pid %d in its namespace", worker.namespace, worker.name, pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    worker.save()
    return adopted


async def stop_unsupervised(worker: PodWorker, grace: float) -> None:
    """Processes of a previous runtime that were never adopted (deletion came first)."""
    entries = set(worker.record.processes.values())
    if worker.saved is not None:
        entries |= set(worker.saved.processes.values())
    for pid, ticks in entries:
        handle = find_process(pid, ticks)
        if handle is not None:
            await stop_process(handle, grace)
    await worker.runtime.containers.remove_pod(worker.uid)
