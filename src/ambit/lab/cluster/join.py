"""``ambit lab node add``: a node joins a running lab, as a machine joins a cluster.

Theory of operation. The new node is ``node-<n+1>``, or the lowest ``node-<i>`` a removed node left free
(:mod:`ambit.lab.cluster.leave`); under an exclusive lock on ``<lab>/lab.lock`` (two adds never
pick the same number):

1. ``lab.json`` gets the grown topology first (written atomically), so that the node runtime finds its node and
   ``ambit lab down`` sweeps its pod range even if the add stops half-way.
2. Its network (:func:`ambit.lab.network.bridge.add_node_network`): namespace, veth on the bridge, its routes and
   the routes to it in the root namespace and in every other node, its CNI files; all noted in the lab's record.
3. Its kubelet identity (:func:`ambit.lab.cluster.identities.provision_node`): the API server has known the node's
   token since it started (tokens for every possible node are drawn at ``lab up``); its token file and kubeconfig
   (0600) are written now.
4. Its node runtime, noted in the record, registering its Node with the taints given; by default, when the lab
   installed the mesh, ``cni.istio.io/not-ready=true:NoSchedule`` (kubelet's ``--register-with-taints``, as a
   node pool of an Istio cluster is set up), which the control plane removes once the node agent runs there.
5. Wait until the Node is Ready.

When a step fails, what the add made is removed again (the runtime, its namespace, link and routes, its files) and
``lab.json`` goes back to the old topology; the error says what failed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from ambit.commands import CommandError, CommandRunner, SubprocessRunner
from ambit.lab.cluster.identities import forget_node, provision_node
from ambit.lab.cluster.lifecycle import LabError, start_node_runtime, wait_for_nodes
from ambit.lab.cluster.record import Record
from ambit.lab.network.bridge import LabNetworkError, add_node_network, join_routes
from ambit.lab.network.topology import MAX_NODES, NodeAddresses, Topology
from ambit.lab.runtime.node_taints import CNI_NOT_READY, NodeTaint, parse_taint


def default_taints(topology: Topology) -> tuple[NodeTaint, ...]:
    """Rule 4's default: the CNI readiness taint when the lab installed the mesh, else none."""
    return (parse_taint(CNI_NOT_READY),) if topology.installed else ()


@contextlib.contextmanager
def locked_lab(directory: Path) -> Iterator[Topology]:
    """The lab in ``directory`` (already resolved), read again under its exclusive lock; LabError when there is
    none (the lock file is not created for a directory that holds no lab)."""
    if Topology.load(directory) is None:
        raise LabError(f"no lab in {directory} (start one with `ambit lab up`)")
    fd = os.open(directory / "lab.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        topology = Topology.load(directory)
        if topology is None:
            raise LabError(f"no lab in {directory} (it went down meanwhile)")
        yield topology
    finally:
        os.close(fd)


def add_node(
    directory: Path,
    taints: tuple[NodeTaint, ...] | None = None,
    runner: CommandRunner | None = None,
    ready_timeout: float = 60.0,
) -> NodeAddresses:
    """Rules 1 to 5; ``taints`` None means the default (rule 4). The new node's addresses."""
    runner = runner or SubprocessRunner()
    with locked_lab(directory.resolve()) as topology:
        if topology.removed:  # the lowest index a removed node left free
            index = topology.removed[0]
            grown = dataclasses.replace(topology, removed=topology.removed[1:])
        elif topology.nodes >= MAX_NODES:
            raise LabError(f"the lab has {topology.nodes} nodes, the most a lab can have")
        else:
            index = topology.nodes + 1
            grown = dataclasses.replace(topology, nodes=index)
        node = grown.node(index)
        chosen = default_taints(topology) if taints is None else taints
        record = Record(grown.record_file)
        grown.save()
        runtime_pid: int | None = None
        try:
            add_node_network(grown, node, record, runner)
            provision_node(grown, node.name)
            runtime_pid = start_node_runtime(grown, node, record, chosen).pid
            wait_for_nodes(grown, ready_timeout, {node.name})
        except (LabError, LabNetworkError, CommandError, OSError) as exc:
            _undo(topology, grown, node, runner, runtime_pid)
            raise LabError(f"adding {node.name} failed: {exc}") from None
        except BaseException:
            _undo(topology, grown, node, runner, runtime_pid)
            raise
    return node


def _undo(old: Topology, grown: Topology, node: NodeAddresses, runner: CommandRunner, runtime_pid: int | None) -> None:
    """Remove what :func:`add_node` made for ``node``: its runtime, Node object, routes, link, namespace and files
    (best effort; containers a runtime started before it was stopped stay for ``ambit lab down``)."""
    if runtime_pid is not None:
        _stop(runtime_pid)
        _delete_node_object(old, node.name)
    for route in join_routes(grown, node):
        if route.namespace != node.netns:  # the node's own go with its namespace
            runner.run(route.argv("delete"), check=False)
    runner.run(["ip", "link", "delete", node.root_link], check=False)
    runner.run(["ip", "netns", "delete", node.netns], check=False)
    shutil.rmtree(grown.node_dir(node.name), ignore_errors=True)
    forget_node(grown, node.name)
    old.save()


def _stop(pid: int, grace: float = 8.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; reaps the child."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _delete_node_object(topology: Topology, name: str) -> None:
    """The Node the stopped runtime may have registered (else the DaemonSets would keep a pod for it)."""
    import asyncio

    from ambit.k8s import KubeClient, KubeClientError, kinds

    async def delete() -> None:
        async with KubeClient.from_kubeconfig(topology.kubeconfig) as client:
            await client.delete(kinds.NODES, name)

    with contextlib.suppress(KubeClientError, OSError):
        asyncio.run(delete())
