"""Restarting a mesh component of the lab as an operator restarts one on a cluster: ``kubectl rollout restart``,
then ``kubectl rollout status``. Pure: the patch to send and the judgement of a status; the I/O is
:mod:`ambit.lab.cluster.restart`'s.

Rules (kubectl's, ``pkg/cmd/rollout`` and ``pkg/polymorphichelpers``):

1. A restart is a strategic merge patch of the pod template's annotation ``kubectl.kubernetes.io/restartedAt`` to
   the current time (RFC 3339, UTC, seconds): a new template, so the workload's controller rolls it out under its
   own strategy (the node proxy DaemonSet: maxSurge 1, maxUnavailable 0, node by node, the new pod beside the old).
2. A DaemonSet's rollout can only be watched under the RollingUpdate strategy (OnDelete: an error, as kubectl's).
   Until ``status.observedGeneration`` reaches ``metadata.generation`` the controller has not seen the new template
   (waiting). Then it is done once ``updatedNumberScheduled`` and ``numberAvailable`` both reach
   ``desiredNumberScheduled``.
3. A Deployment likewise waits for its generation to be observed; then a Progressing condition with reason
   ProgressDeadlineExceeded is an error; it is done once ``updatedReplicas`` reaches ``spec.replicas`` (default 1),
   no old replicas remain (``replicas`` equals ``updatedReplicas``), and ``availableReplicas`` reaches
   ``updatedReplicas``.
4. Each judgement carries kubectl's progress line, so that the shell prints a line each time it changes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ambit.errors import AmbitError

RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
SYSTEM_NAMESPACE = "istio-system"
DEADLINE_EXCEEDED = ("Progressing", "ProgressDeadlineExceeded")
"""A Deployment condition's type and reason once its rollout is past ``progressDeadlineSeconds``."""


class RolloutError(AmbitError):
    """A restart that cannot be done or watched, or a rollout that failed or did not finish in time."""


@dataclass(frozen=True, slots=True)
class Workload:
    """A mesh component as ``deploy/base`` installs it."""

    kind: str
    """``daemonset`` or ``deployment`` (kubectl's resource names)."""
    name: str
    namespace: str = SYSTEM_NAMESPACE

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


COMPONENTS: Mapping[str, Workload] = {
    "nodeproxy": Workload("daemonset", "ztunnel"),
    "nodeagent": Workload("daemonset", "istio-cni-node"),
    "controlplane": Workload("deployment", "istiod"),
}
"""``ambit lab restart``'s components and the workloads that run them (deploy/base)."""


@dataclass(frozen=True, slots=True)
class RolloutProgress:
    done: bool
    message: str


def restart_patch(now: float) -> dict[str, Any]:
    """Rule 1: the patch ``kubectl rollout restart`` sends at ``now`` (seconds since the epoch)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    return {"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: stamp}}}}}


def _part(obj: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    """``obj[field]`` when it is an object, else empty: a malformed object judges as not rolled out, no crash."""
    value = obj.get(field)
    return value if isinstance(value, Mapping) else {}


def _count(status: Mapping[str, Any], field: str) -> int:
    value = status.get(field)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _observed(obj: Mapping[str, Any]) -> bool:
    return _count(_part(obj, "metadata"), "generation") <= _count(_part(obj, "status"), "observedGeneration")


def daemon_set_progress(obj: Mapping[str, Any]) -> RolloutProgress:
    """Rule 2: where the rollout of DaemonSet ``obj`` (as the API server has it) stands."""
    name = str(_part(obj, "metadata").get("name", ""))
    strategy = _part(_part(obj, "spec"), "updateStrategy").get("type", "RollingUpdate")
    if strategy != "RollingUpdate":
        raise RolloutError(
            f'rollout status is only available for RollingUpdate strategy type (daemon set "{name}": {strategy})'
        )
    if not _observed(obj):
        return RolloutProgress(False, "Waiting for daemon set spec update to be observed...")
    status = _part(obj, "status")
    desired = _count(status, "desiredNumberScheduled")
    updated = _count(status, "updatedNumberScheduled")
    available = _count(status, "numberAvailable")
    if updated < desired:
        return RolloutProgress(
            False,
            f'Waiting for daemon set "{name}" rollout to finish: {updated} out of {desired} new pods have been '
            "updated...",
        )
    if available < desired:
        return RolloutProgress(
            False,
            f'Waiting for daemon set "{name}" rollout to finish: {available} of {desired} updated pods are '
            "available...",
        )
    return RolloutProgress(True, f'daemon set "{name}" successfully rolled out')


def deployment_progress(obj: Mapping[str, Any]) -> RolloutProgress:
    """Rule 3: where the rollout of Deployment ``obj`` stands."""
    name = str(_part(obj, "metadata").get("name", ""))
    if not _observed(obj):
        return RolloutProgress(False, "Waiting for deployment spec update to be observed...")
    status = _part(obj, "status")
    conditions = status.get("conditions")
    for cond in conditions if isinstance(conditions, list) else ():
        if isinstance(cond, Mapping) and (cond.get("type"), cond.get("reason")) == DEADLINE_EXCEEDED:
            raise RolloutError(f'deployment "{name}" exceeded its progress deadline')
    wanted = _part(obj, "spec").get("replicas", 1)
    wanted = wanted if isinstance(wanted, int) and not isinstance(wanted, bool) else 1
    updated = _count(status, "updatedReplicas")
    replicas = _count(status, "replicas")
    available = _count(status, "availableReplicas")
    if updated < wanted:
        return RolloutProgress(
            False,
            f'Waiting for deployment "{name}" rollout to finish: {updated} out of {wanted} new replicas have been '
            "updated...",
        )
    if replicas > updated:
        return RolloutProgress(
            False,
            f'Waiting for deployment "{name}" rollout to finish: {replicas - updated} old replicas are pending '
            "termination...",
        )
    if available < updated:
        return RolloutProgress(
            False,
            f'Waiting for deployment "{name}" rollout to finish: {available} of {updated} updated replicas are '
            "available...",
        )
    return RolloutProgress(True, f'deployment "{name}" successfully rolled out')


def rollout_progress(workload: Workload, obj: Mapping[str, Any]) -> RolloutProgress:
    """Rules 2 and 3 by the workload's kind."""
    return daemon_set_progress(obj) if workload.kind == "daemonset" else deployment_progress(obj)
