"""What a stopping node agent leaves on its node: the CNI plugin stays for an upgrade, and goes with the mesh.

Theory of operation (istio-cni's rule on SIGTERM). A node agent that stops because its pod is being replaced (a
rolling update, a restart, the node rebooting) leaves the ``ambit-cni`` plugin installed: pods created meanwhile
fail their ADD and are retried until the new agent serves them, so no ambient pod ever starts outside the mesh.
A node agent that stops because the mesh is being removed takes the plugin out (its conflist entry and binary), so
new pods start normally, un-enrolled, instead of waiting forever for an agent that will not come back. Pods already
enrolled keep their redirection and their node proxy either way.

The agent tells the two apart by its DaemonSet (:func:`owner_state`, read once the stop signal came):

1. The DaemonSet exists and is not being deleted: an upgrade or a reboot; the plugin stays.
2. The DaemonSet is gone (404) or has a ``deletionTimestamp``: the mesh is going; the plugin is removed.
3. The agent's credentials are refused (401: its service account or token is gone) or its permission to read the
   DaemonSet was taken (403: its RBAC removed, as an uninstall does): the mesh is going; the plugin is removed.
   (istio-cni removes it on 401 only; Ambit's uninstall takes the RBAC first, so 403 means the same here.)
4. Anything else (the API server unreachable, a 5xx), after ``attempts`` tries ``pause`` seconds apart: the plugin
   stays. Here Ambit fails closed where istio-cni, with a chained CNI configuration, removes the plugin: an API
   outage during an agent restart must not let new ambient pods start outside the mesh.

An agent that does not know its DaemonSet (a lab host process) keeps its configured behaviour: the plugin stays
unless ``--uninstall`` was given.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable

from ambit.k8s import KubeClient, kinds
from ambit.k8s.errors import KubeClientError, KubeForbiddenError, KubeNotFoundError, KubeUnauthorizedError

log = logging.getLogger("ambit.cni.shutdown")


class OwnerState(enum.Enum):
    """What the stopping agent found of its DaemonSet."""

    PRESENT = "present"
    DELETING = "being deleted"
    GONE = "not found"
    REVOKED = "not readable by the agent any more"
    UNKNOWN = "unknown"


def plugin_stays(state: OwnerState) -> bool:
    """Rules 1-4: whether the stopping agent leaves the plugin installed."""
    return state in (OwnerState.PRESENT, OwnerState.UNKNOWN)


async def owner_state(
    client: KubeClient,
    namespace: str,
    name: str,
    *,
    attempts: int = 3,
    pause: float = 1.0,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> OwnerState:
    """Read the DaemonSet ``namespace/name`` (rules 1-4); never raises but for cancellation."""
    for attempt in range(attempts):
        try:
            daemonset = await client.get(kinds.DAEMON_SETS, name, namespace)
        except KubeNotFoundError:
            return OwnerState.GONE
        except (KubeUnauthorizedError, KubeForbiddenError):
            return OwnerState.REVOKED
        except (KubeClientError, OSError) as exc:
            log.info("reading DaemonSet %s/%s failed (%s)", namespace, name, exc)
            if attempt + 1 < attempts:
                await sleep(pause)
            continue
        meta = daemonset.get("metadata") if isinstance(daemonset, dict) else None
        if isinstance(meta, dict) and meta.get("deletionTimestamp"):
            return OwnerState.DELETING
        return OwnerState.PRESENT
    return OwnerState.UNKNOWN
