"""``ambit lab node remove``: a node leaves a running lab, as an operator drains a machine and deletes it.

Theory of operation. Under the lab's exclusive lock (``<lab>/lab.lock``, shared with ``ambit lab node add``):

1. Refusals first, before anything changes: an unknown node; the lab's last node (``ambit lab down`` removes a
   lab).
2. Drain, as ``kubectl drain --ignore-daemonsets`` does: the Node is cordoned (``spec.unschedulable``), then
   every pod bound to it is evicted (``pods/eviction``, so the API server holds it to its PodDisruptionBudget),
   except DaemonSet pods (their controller would put them back while the Node exists) and pods the node runtime
   already ended. An eviction the budget refuses (429) is tried again every :data:`EVICTION_RETRY` seconds until
   the drain's time is up, as kubectl retries it; the error then names the pod and the budget's reason. With
   ``disable_eviction`` (kubectl's ``--disable-eviction``) the pods are deleted instead, budgets or not.
   A pod no controller owns would be gone for good: as kubectl, the drain refuses it unless ``force`` is given.
   The node runtime (the kubelet's role) stops each pod's containers and tears down its sandbox, so the node agent
   unenrols it and the control plane withdraws its workload; the drain waits until every such pod is gone.
3. The node runtime is stopped (SIGTERM, SIGKILL 8 s later). Pods keep running when a runtime stops, as with a
   kubelet, so what is left on the node (its DaemonSet pods: node proxy, node agent) is ended by the lab itself:
   every container of those pods is deleted from runc (``runc delete --force``) and each pod's network namespace
   and files are removed.
4. The Node object is deleted, then the pods still bound to it, at once (grace 0: kube's pod garbage collector
   deletes the pods of a Node that no longer exists).
5. The node's network goes: the routes to its pod range in the other nodes, its link on the bridge, its network
   namespace (and with it its routes and veths), its directory, its kubelet kubeconfig and token file. When the
   first node leaves, the root namespace's route to the load-balancer range moves to the new first node. ``lab.json``
   notes the index as removed; the next ``ambit lab node add`` takes it again.

A failure in rule 2 (a refused pod, a budget that does not allow the eviction, a drain that does not finish in
``drain_timeout``) leaves the node cordoned
and running, with an error that says why; uncordon with ``kubectl uncordon``. From rule 3 on, the steps are best
effort and idempotent: running the command again finishes a removal that stopped half-way.

Deviations from kube: emptyDir data is deleted without ``--delete-emptydir-data``. The node's API token
stays known to the API server until it restarts (the token file is read once), but nothing holds it any more.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ambit.commands import CommandRunner, SubprocessRunner
from ambit.k8s import KubeClient, KubeClientError, kinds
from ambit.k8s.errors import KubeApiStatusError
from ambit.lab.cluster.identities import forget_node
from ambit.lab.cluster.join import locked_lab
from ambit.lab.cluster.lifecycle import LabError, ambit_processes, terminate_processes
from ambit.lab.cluster.record import Record
from ambit.lab.network.bridge import join_routes, load_balancer_route
from ambit.lab.network.topology import NodeAddresses, Topology
from ambit.lab.runtime.oci_apply import delete_container, list_containers

DRAIN_POLL = 0.25
EVICTION_RETRY = 5.0
"""Seconds between evictions of a pod its budget refused (kubectl drain's)."""


def remove_node(
    directory: Path,
    name: str,
    *,
    force: bool = False,
    drain_timeout: float = 120.0,
    disable_eviction: bool = False,
    runner: CommandRunner | None = None,
) -> NodeAddresses:
    """Rules 1 to 5; the removed node's addresses. LabError says why a removal was refused or did not finish."""
    runner = runner or SubprocessRunner()
    with locked_lab(directory.resolve()) as topology:
        node = topology.node_named(name)
        if node is None:
            known = ", ".join(n.name for n in topology.all_nodes())
            raise LabError(f"no node {name!r} in this lab (its nodes: {known})")
        if topology.node_count <= 1:
            raise LabError(f"{name} is the lab's last node; `ambit lab down` removes the whole lab")
        asyncio.run(_drain(topology, name, force, drain_timeout, disable_eviction))
        terminate_processes(_runtime_pids(topology, name))
        left = asyncio.run(_pods_on(topology, name))
        _end_pods(topology, [uid for uid in (_uid(pod) for pod in left) if uid], runner)
        asyncio.run(_forget(topology, name, left))
        shrunk = dataclasses.replace(topology, removed=tuple(sorted({*topology.removed, node.index})))
        _remove_network(topology, shrunk, node, runner)
        forget_node(topology, name)
        shrunk.save()
    return node


# -- rule 2: drain --------------------------------------------------------------------------------------------


def drain_plan(pods: Sequence[Mapping[str, Any]], force: bool) -> tuple[list[Mapping[str, Any]], list[str]]:
    """Which pods the drain deletes, and why it refuses (pure). DaemonSet pods and ended pods stay."""
    delete: list[Mapping[str, Any]] = []
    refused: list[str] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        owners = [o for o in meta.get("ownerReferences") or () if isinstance(o, Mapping) and o.get("controller")]
        if any(o.get("kind") == "DaemonSet" for o in owners):
            continue
        if not owners and not force:
            refused.append(f"{meta.get('namespace')}/{meta.get('name')}")
            continue
        delete.append(pod)
    return delete, refused


async def _drain(topology: Topology, name: str, force: bool, drain_timeout: float, disable_eviction: bool) -> None:
    deadline = time.monotonic() + drain_timeout
    async with KubeClient.from_kubeconfig(topology.kubeconfig) as client:
        try:
            await client.patch(kinds.NODES, name, {"spec": {"unschedulable": True}})
            pods, _ = await client.list(kinds.PODS, field_selector=f"spec.nodeName={name}")
        except (KubeClientError, OSError) as exc:
            raise LabError(f"cannot cordon {name}: {exc}") from None
        delete, refused = drain_plan(pods, force)
        if refused:
            raise LabError(
                f"{name} is cordoned, not drained: no controller would recreate {', '.join(sorted(refused))} "
                "(--force deletes them anyway)"
            )
        uids = {pod["metadata"].get("uid") for pod in delete}
        if disable_eviction:
            for pod in delete:
                await _delete_pod(client, pod)
        else:
            await evict_pods(client, name, delete, deadline, drain_timeout)
        while True:
            pods, _ = await client.list(kinds.PODS, field_selector=f"spec.nodeName={name}")
            waiting = sorted(f"{_meta(p, 'namespace')}/{_meta(p, 'name')}" for p in pods if _uid(p) in uids)
            if not waiting:
                return
            if time.monotonic() > deadline:
                late = ", ".join(waiting)
                raise LabError(f"{name} is cordoned; these pods did not go in {drain_timeout:.0f} s: {late}")
            await asyncio.sleep(DRAIN_POLL)


async def _delete_pod(client: KubeClient, pod: Mapping[str, Any]) -> None:
    try:
        await client.delete(kinds.PODS, _meta(pod, "name"), _meta(pod, "namespace"))
    except KubeClientError as exc:
        if not (isinstance(exc, KubeApiStatusError) and exc.is_not_found):
            raise LabError(f"cannot delete pod {_meta(pod, 'namespace')}/{_meta(pod, 'name')}: {exc}") from None


async def evict_pods(
    client: KubeClient, name: str, pods: Sequence[Mapping[str, Any]], deadline: float, drain_timeout: float
) -> None:
    """Rule 2's evictions: each pod until its budget lets it go or the drain's time is up."""
    pending = list(pods)
    while True:
        blocked: list[tuple[str, str]] = []
        for pod in pending:
            try:
                await client.evict(_meta(pod, "name"), _meta(pod, "namespace"))
            except KubeClientError as exc:
                if isinstance(exc, KubeApiStatusError) and exc.is_not_found:
                    continue
                if isinstance(exc, KubeApiStatusError) and exc.status_code == 429:
                    why = "; ".join(str(c.get("message")) for c in exc.causes if c.get("message")) or exc.message
                    blocked.append((f"{_meta(pod, 'namespace')}/{_meta(pod, 'name')}", why))
                    continue
                raise LabError(f"cannot evict pod {_meta(pod, 'namespace')}/{_meta(pod, 'name')}: {exc}") from None
        if not blocked:
            return
        if time.monotonic() + EVICTION_RETRY > deadline:
            which = "; ".join(f"{pod} ({why})" for pod, why in blocked)
            raise LabError(
                f"{name} is cordoned, not drained: evicting these pods would violate their disruption budget "
                f"for {drain_timeout:.0f} s: {which} (--disable-eviction deletes them anyway)"
            )
        names = {pod for pod, _ in blocked}
        pending = [p for p in pending if f"{_meta(p, 'namespace')}/{_meta(p, 'name')}" in names]
        await asyncio.sleep(EVICTION_RETRY)


# -- rules 3 and 4: what is left on the node ----------------------------------------------------------------------


def _runtime_pids(topology: Topology, name: str) -> list[int]:
    """The node runtime's process, found by its command line (``ambit lab node --dir <lab> --name <node>``)."""
    wanted_dir, wanted_name = str(topology.path).encode(), name.encode()
    found = []
    for pid, args in ambit_processes():
        pairs = {(args[i - 1], arg) for i, arg in enumerate(args) if i > 0}
        if (b"--dir", wanted_dir) in pairs and (b"--name", wanted_name) in pairs and b"node" in args:
            found.append(pid)
    return found


async def _pods_on(topology: Topology, name: str) -> list[dict[str, Any]]:
    async with KubeClient.from_kubeconfig(topology.kubeconfig) as client:
        pods, _ = await client.list(kinds.PODS, field_selector=f"spec.nodeName={name}")
    return pods


def _end_pods(topology: Topology, uids: list[str], runner: CommandRunner) -> None:
    """Rule 3: every runc container of these pods, their network namespaces and files."""
    prefixes = tuple(uid.replace("-", "") + "-" for uid in uids)
    for cid in list_containers(topology.runc_root):
        if cid.startswith(prefixes):
            delete_container(topology.runc_root, cid)
    for uid in uids:
        runner.run(["ip", "netns", "delete", topology.pod_netns(uid)], check=False)
        shutil.rmtree(topology.pod_dir(uid), ignore_errors=True)
        if topology.container_bundles.is_dir():
            for bundle in topology.container_bundles.iterdir():
                if bundle.name.startswith(uid.replace("-", "") + "-"):
                    shutil.rmtree(bundle, ignore_errors=True)


async def _forget(topology: Topology, name: str, left: list[dict[str, Any]]) -> None:
    """Rule 4."""
    async with KubeClient.from_kubeconfig(topology.kubeconfig) as client:
        try:
            await client.delete(kinds.NODES, name)
        except KubeClientError as exc:
            if not (isinstance(exc, KubeApiStatusError) and exc.is_not_found):
                raise LabError(f"cannot delete Node {name}: {exc}") from None
        for pod in left:
            try:
                await client.delete(kinds.PODS, _meta(pod, "name"), _meta(pod, "namespace"), grace_period_seconds=0)
            except KubeClientError as exc:
                if not (isinstance(exc, KubeApiStatusError) and exc.is_not_found):
                    raise LabError(f"cannot delete pod {_meta(pod, 'namespace')}/{_meta(pod, 'name')}: {exc}") from None


# -- rule 5: the network --------------------------------------------------------------------------------------------


def _remove_network(topology: Topology, shrunk: Topology, node: NodeAddresses, runner: CommandRunner) -> None:
    for route in join_routes(topology, node):
        if route.namespace != node.netns:  # the node's own go with its namespace
            runner.run(route.argv("delete"), check=False)
    if load_balancer_route(topology) != (moved := load_balancer_route(shrunk)):
        # The load-balancer range was routed via the leaving node (the first one): via the new first node now.
        Record(topology.record_file).note("route", namespace=moved.namespace, dst=moved.dst, via=moved.via)
        runner.run(moved.argv("replace"), check=False)
    runner.run(["ip", "link", "delete", node.root_link], check=False)
    runner.run(["ip", "netns", "delete", node.netns], check=False)
    shutil.rmtree(topology.node_dir(node.name), ignore_errors=True)


def _meta(pod: Mapping[str, Any], key: str) -> str:
    return str((pod.get("metadata") or {}).get(key) or "")


def _uid(pod: Mapping[str, Any]) -> str:
    return _meta(pod, "uid")
