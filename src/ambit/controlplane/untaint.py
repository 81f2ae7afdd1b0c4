"""The node untaint controller (istiod's, spec §1.2): a node's ``cni.istio.io/not-ready`` taint goes once the node
agent on it is ready.

Why: a node that joins the cluster registers with the taint (kubelet ``--register-with-taints``, or the node pool's
configuration), so that no ambient pod is scheduled there before the node agent has installed the CNI plugin: a pod
started earlier would run without the in-pod redirection. The node agent's DaemonSet tolerates every NoSchedule
taint, starts, and once its readiness probe passes the control plane removes the taint.

Rules (pure part, :func:`untaint_plan`):

1. A node agent pod counts when it is in the node agent's namespace, carries its label selector
   (``k8s-app=istio-cni-node``), is bound to a node, is not being deleted and has the condition Ready=True.
2. A node is untainted when it carries a taint with key ``cni.istio.io/not-ready`` (any effect, any value) and a
   counted node agent pod runs on it; every taint with that key goes, every other taint stays, in order.
3. Nothing else about the node changes.

The shell (:class:`NodeUntainter`) keeps two informers (the node agent's pods in its namespace, by the selector; the
Nodes), reconciles on every change and every ``resync`` seconds, and removes the taints with a JSON patch that first
``test``s the taint list it read: a node changed meanwhile gets 422 and is tried again at the next pass, so a
concurrent writer's taint is never lost. A forbidden patch (the control plane's RBAC lacks ``patch nodes``) is logged
once per node; the controller keeps watching.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.k8s import Informer, KubeClient, KubeClientError, KubeForbiddenError, kinds

log = logging.getLogger(__name__)

NOT_READY_TAINT = "cni.istio.io/not-ready"
NODE_AGENT_SELECTOR = "k8s-app=istio-cni-node"
DEFAULT_RESYNC = 30.0


@dataclass(frozen=True, slots=True)
class Untaint:
    node: str
    taints: tuple[Any, ...]
    """The node's taints as read (the patch tests them)."""
    keep: tuple[Any, ...]
    """The taints that stay."""


def _part(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``obj[key]`` when it is an object, else empty: a field of the wrong type counts as absent."""
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = _part(pod, "status").get("conditions")
    for condition in conditions if isinstance(conditions, list) else ():
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def ready_agent_nodes(pods: Iterable[Mapping[str, Any]]) -> set[str]:
    """Nodes that run a ready node agent pod (rule 1); the pods are already filtered by namespace and selector."""
    found: set[str] = set()
    for pod in pods:
        node = _part(pod, "spec").get("nodeName")
        if isinstance(node, str) and node and not _part(pod, "metadata").get("deletionTimestamp") and _ready(pod):
            found.add(node)
    return found


def untaint_plan(nodes: Iterable[Mapping[str, Any]], agent_pods: Iterable[Mapping[str, Any]]) -> list[Untaint]:
    """The nodes to untaint now (rules 2 and 3), by name."""
    ready = ready_agent_nodes(agent_pods)
    plan: list[Untaint] = []
    for node in nodes:
        name = _part(node, "metadata").get("name")
        taints = _part(node, "spec").get("taints")
        if not isinstance(name, str) or name not in ready or not isinstance(taints, list):
            continue
        keep = tuple(t for t in taints if not (isinstance(t, Mapping) and t.get("key") == NOT_READY_TAINT))
        if len(keep) != len(taints):
            plan.append(Untaint(name, tuple(taints), keep))
    return sorted(plan, key=lambda u: u.node)


def untaint_patch(untaint: Untaint) -> list[dict[str, Any]]:
    """A JSON patch that removes the taints only if the list is still the one read."""
    replace: dict[str, Any] = (
        {"op": "replace", "path": "/spec/taints", "value": list(untaint.keep)}
        if untaint.keep
        else {"op": "remove", "path": "/spec/taints"}
    )
    return [{"op": "test", "path": "/spec/taints", "value": list(untaint.taints)}, replace]


class NodeUntainter:
    """Watches the node agent's pods and the Nodes; removes the not-ready taint (see the module docstring)."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str = "istio-system",
        selector: str = NODE_AGENT_SELECTOR,
        resync: float = DEFAULT_RESYNC,
    ) -> None:
        self.client = client
        self.resync = resync
        self.untainted = 0
        self._dirty = asyncio.Event()
        mark = self._mark
        self._pods = Informer(
            client,
            kinds.PODS,
            namespace=namespace,
            label_selector=selector,
            on_add=mark,
            on_update=lambda _old, _new: mark(_new),
            on_delete=mark,
        )
        self._nodes = Informer(client, kinds.NODES, on_add=mark, on_update=self._node_updated, on_delete=None)
        self._forbidden: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []

    def _mark(self, _obj: Any = None) -> None:
        self._dirty.set()

    def _node_updated(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        # Nodes' status changes all the time (heartbeats); only the taints matter here.
        if _part(old, "spec").get("taints") != _part(new, "spec").get("taints"):
            self._dirty.set()

    async def start(self) -> None:
        self._pods.start()
        self._nodes.start()
        self._tasks = [asyncio.create_task(self._loop(), name="untaint controller")]

    async def _loop(self) -> None:
        await self._pods.wait_synced()
        await self._nodes.wait_synced()
        while True:
            self._dirty.clear()
            await self.reconcile()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), timeout=self.resync)

    async def reconcile(self) -> int:
        """One pass: untaint what the caches say is ready; the number of nodes untainted."""
        done = 0
        for untaint in untaint_plan(self._nodes.items(), self._pods.items()):
            try:
                await self.client.patch(kinds.NODES, untaint.node, untaint_patch(untaint), patch_type="json")
            except KubeForbiddenError as exc:
                if untaint.node not in self._forbidden:
                    self._forbidden.add(untaint.node)
                    log.warning("cannot remove taint %s from node %s: %s", NOT_READY_TAINT, untaint.node, exc)
                continue
            except KubeClientError as exc:  # 422 (changed meanwhile), 404 (gone), or the API server away: next pass
                log.info("removing taint %s from node %s: %s; trying again", NOT_READY_TAINT, untaint.node, exc)
                self._dirty.set()
                continue
            done += 1
            self.untainted += 1
            log.info("node %s: its node agent is ready, taint %s removed", untaint.node, NOT_READY_TAINT)
        return done

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._pods.aclose()
        await self._nodes.aclose()
