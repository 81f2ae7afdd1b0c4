"""The control plane's home namespace (``istio-system``): made to exist before the root Secret is written there.

Theory of operation: on a fresh cluster the namespace may not exist yet (the mesh's manifests not applied, or the
control plane started before them). istiod, running inside that namespace, never meets this; Ambit's control plane
can run outside the cluster (the lab, a developer's machine), so :func:`ensure_namespace` decides:

1. The namespace exists: nothing to do.
2. It does not: create it (a bare Namespace, as ``kubectl create namespace`` would) and log that it did. Someone
   else creating it at the same moment is the same outcome.
3. It does not and the API server forbids us to create it (a control plane with istiod's least privilege): wait
   for it, polling every ``retry_delay`` seconds, and say so in one clear log line (repeated every
   ``log_every`` seconds while it lasts) naming the namespace and how to fix it.
4. We may not even read it (403 on the GET): go on; whatever we write there next reports its own error.
5. Any other failure of the API server is a :class:`~ambit.controlplane.ca.errors.RootCaError`: the caller's
   start-up fails as it did before, with the API server's message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ambit.controlplane.ca.errors import RootCaError
from ambit.k8s.errors import KubeAlreadyExistsError, KubeClientError, KubeForbiddenError, KubeNotFoundError
from ambit.k8s.kinds import NAMESPACES, ResourceKind

__all__ = ["NamespaceClient", "ensure_namespace"]

log = logging.getLogger(__name__)


class NamespaceClient(Protocol):
    """The two calls :func:`ensure_namespace` makes (:class:`ambit.k8s.KubeClient` has them)."""

    async def get(self, kind: ResourceKind, name: str, namespace: str | None = None) -> dict[str, Any]: ...

    async def create(self, kind: ResourceKind, obj: Any, namespace: str | None = None) -> dict[str, Any]: ...


async def ensure_namespace(
    client: NamespaceClient,
    namespace: str,
    *,
    retry_delay: float = 2.0,
    log_every: float = 60.0,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Return once ``namespace`` exists (rules 1 to 4); True when this call created it."""
    last_log: float | None = None
    while True:
        try:
            await client.get(NAMESPACES, namespace)
        except KubeForbiddenError:
            return False  # rule 4
        except KubeNotFoundError:
            pass
        except KubeClientError as exc:
            raise RootCaError(f"cannot read namespace {namespace}: {exc}") from None
        else:
            if last_log is not None:
                log.info("namespace %s exists now; going on", namespace)
            return False
        try:
            await client.create(NAMESPACES, {"metadata": {"name": namespace}})
        except KubeAlreadyExistsError:
            return False
        except KubeForbiddenError:
            now = clock()
            if last_log is None or now - last_log >= log_every:
                log.warning(
                    "namespace %s does not exist and this control plane may not create it; waiting for it "
                    "(create it with 'kubectl create namespace %s' or apply the mesh's manifests)",
                    namespace,
                    namespace,
                )
                last_log = now
            await sleep(retry_delay)
            continue
        except KubeClientError as exc:
            raise RootCaError(f"namespace {namespace} does not exist and creating it failed: {exc}") from None
        log.info("namespace %s did not exist: created it", namespace)
        return True
