"""``ambit lab restart``: a mesh component restarted through the API as on a cluster, and its rollout watched.

Theory of operation: the lab runs the mesh installed from ``deploy/`` (DaemonSets and a Deployment run by the lab's
controllers and kubelets), so a restart is what ``kubectl rollout restart`` does (:func:`rollout.restart_patch`, a
new pod template), and the wait is what ``kubectl rollout status`` does: read the workload every ``poll`` seconds,
judge it (:mod:`ambit.lab.cluster.rollout`), report each new progress line, return once it is rolled out. The node
proxies' hand-over is the DaemonSet's own: the new pod starts beside the old one on each node (maxSurge 1), the node
agent hands the node's pods to it once it is ready, and only then is the old pod deleted, draining what it relays.

Invariants: the wait is bounded by ``seconds`` (a :class:`RolloutError` naming the last progress line); a workload
that is absent (the mesh not installed) or the API server refusing the patch is a :class:`RolloutError` too, never
a traceback.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from ambit.k8s import KubeClient, KubeClientError, kinds
from ambit.k8s.errors import KubeNotFoundError
from ambit.lab.cluster.rollout import RolloutError, Workload, restart_patch, rollout_progress

Echo = Callable[[str], None]


async def restart_workload(
    client: KubeClient,
    workload: Workload,
    *,
    seconds: float,
    echo: Echo,
    poll: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> float:
    """Restart ``workload`` and wait until it is rolled out, ``seconds`` at most; the seconds it took."""
    kind = kinds.DAEMON_SETS if workload.kind == "daemonset" else kinds.DEPLOYMENTS
    started = clock()
    try:
        await client.patch(kind, workload.name, restart_patch(time.time()), workload.namespace, "strategic")
    except KubeNotFoundError:
        raise RolloutError(f"{workload} not found in {workload.namespace} (is the mesh installed?)") from None
    except KubeClientError as exc:
        raise RolloutError(f"restarting {workload}: {exc}") from None
    echo(f"{workload} restarted")
    last = ""
    while True:
        try:
            obj = await client.get(kind, workload.name, workload.namespace)
        except KubeClientError as exc:
            raise RolloutError(f"reading {workload}: {exc}") from None
        progress = rollout_progress(workload, obj)
        if progress.message != last:
            last = progress.message
            echo(last)
        elapsed = clock() - started
        if progress.done:
            return elapsed
        if elapsed > seconds:
            raise RolloutError(f"{workload} not rolled out after {seconds:g} s: {last}")
        await sleep(poll)
