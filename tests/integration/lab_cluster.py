"""Plumbing for tests that run the lab's controllers against the real embedded API server: a stand-in kubelet,
nodes, polling, the controllers' test settings, the real kubectl.

The kubelet (:class:`Kubelet`) marks bound pods Running and Ready with a pod IP, and finishes the deletion of
terminating pods, as a node would; :func:`finish_pod` makes a pod's containers exit (a Job's pod succeed or fail),
and a kubelet made with ``finish="Succeeded"`` does that to every pod as soon as it runs.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from ambit.k8s import Informer, InformerSettings, KubeClient, KubeNotFoundError, kinds
from ambit.lab.controllers import ControllerSettings

NS = "default"
INFORMER = InformerSettings(watch_timeout=30, backoff_initial=0.02, backoff_max=0.2)
Obj = dict[str, Any]
T = TypeVar("T")


async def until(probe: Callable[[], Awaitable[T]], what: str, within: float = 15.0) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` (and the last value) after ``within``
    seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = await probe()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last saw {value!r}")
        await asyncio.sleep(0.02)


def settings(**overrides: Any) -> ControllerSettings:
    return ControllerSettings(informer=INFORMER, retry_initial=0.01, retry_max=0.5, **overrides)


class Kubelet:
    """Plays every node's kubelet: a bound Pending pod becomes Running (Ready when ``auto_ready``) with an IP, once,
    and terminating pods are removed.

    Like a real kubelet it starts each pod (by uid) once: the informer can still hand it the pod as Pending after
    its own status write (an older event queued behind it), and acting on that again would overwrite whatever was
    written since, e.g. a readiness the test set.
    """

    def __init__(self, kube: KubeClient, *, auto_ready: bool = True, finish: str | None = None) -> None:
        self.kube = kube
        self.auto_ready = auto_ready
        self.finish = finish
        self._ips = (f"10.1.{i // 250}.{i % 250 + 2}" for i in itertools.count())
        self._started: set[str] = set()
        self.informer = Informer(kube, kinds.PODS, settings=INFORMER, on_add=self._seen, on_update=self._changed)

    async def _changed(self, old: Obj, new: Obj) -> None:
        await self._seen(new)

    async def _seen(self, pod: Obj) -> None:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        try:
            if meta.get("deletionTimestamp"):
                await self.kube.delete(kinds.PODS, meta["name"], meta["namespace"], grace_period_seconds=0)
            elif spec.get("nodeName") and status.get("phase") == "Pending" and meta["uid"] not in self._started:
                self._started.add(meta["uid"])
                ip = next(self._ips)
                await set_pod_status(self.kube, meta["name"], ready=self.auto_ready, ip=ip, namespace=meta["namespace"])
                if self.finish is not None:
                    await finish_pod(self.kube, meta["name"], self.finish == "Succeeded", namespace=meta["namespace"])
        except KubeNotFoundError:
            pass

    async def __aenter__(self) -> Kubelet:
        self.informer.start()
        await self.informer.wait_synced()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.informer.aclose()


async def set_pod_status(
    kube: KubeClient, name: str, *, ready: bool, ip: str | None = None, phase: str = "Running", namespace: str = NS
) -> Obj:
    status: Obj = {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip is not None:
        status["podIP"] = ip
    return await kube.patch_status(kinds.PODS, name, {"status": status}, namespace, patch_type="strategic")


async def finish_pod(kube: KubeClient, name: str, succeeded: bool = True, *, namespace: str = NS) -> Obj:
    """Every container of the pod exits (0 when ``succeeded``, else 1), so the pod is Succeeded or Failed, as a
    kubelet reports a pod whose restartPolicy does not restart it."""
    pod = await kube.get(kinds.PODS, name, namespace)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    exit_code, reason = (0, "Completed") if succeeded else (1, "Error")
    statuses = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": exit_code, "reason": reason, "finishedAt": now}},
        }
        for c in (pod.get("spec") or {}).get("containers") or ()
    ]
    status: Obj = {
        "phase": "Succeeded" if succeeded else "Failed",
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": statuses,
    }
    return await kube.patch_status(kinds.PODS, name, {"status": status}, namespace)


async def add_node(
    kube: KubeClient, name: str, *, ready: bool = True, unschedulable: bool = False, **labels: str
) -> Obj:
    body: Obj = {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}}}
    if unschedulable:
        body["spec"] = {"unschedulable": True}
    await kube.create(kinds.NODES, body)
    status = {"conditions": [{"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady"}]}
    return await kube.patch_status(kinds.NODES, name, {"status": status})


async def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None, check: bool = True) -> str:
    env = dict(os.environ, KUBECONFIG=str(kubeconfig), KUBECACHEDIR=str(kubeconfig.parent / "kubecache"))
    proc = await asyncio.create_subprocess_exec(
        "kubectl",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), 60)
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {err.decode()}")
    return out.decode() + ("" if check else err.decode())
