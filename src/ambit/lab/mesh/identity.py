"""Each lab node proxy's credentials, as a cluster gives them to ztunnel: a pod, a bound token, the mesh root.

Theory of operation: on a real cluster ztunnel is a DaemonSet pod of service account ``istio-system/ztunnel``; the
kubelet projects it a token (audience ``istio-ca``) bound to that pod, and mounts ConfigMap ``istio-ca-root-cert``.
The control plane's node authorization depends on exactly that: the token names the pod, and the pod names the
node (spec §5.3). The lab runs its node proxies outside pods, so :func:`provision_node_proxies` makes the same
objects: per node a placeholder pod ``ztunnel-<node>`` (hostNetwork, bound to the node, running ``sleep``), a
TokenRequest bound to it written to ``nodes/<node>/run/istio-token`` (0600), and the root from the ConfigMap (which
the control plane publishes) written to ``nodes/<node>/run/root-cert.pem``. :func:`refresh_tokens` renews the
tokens well before they expire; node proxies re-read the file on every use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from ambit.errors import AmbitError
from ambit.k8s import KubeClient, kinds
from ambit.k8s.errors import KubeAlreadyExistsError, KubeNotFoundError
from ambit.lab.mesh.accounts import (
    NODE_PROXY_ACCOUNT,
    SYSTEM_NAMESPACE,
    prepare_system_namespaces,
    write_component_credentials,
)
from ambit.lab.mesh.config import write_if_changed
from ambit.lab.network.topology import Topology

log = logging.getLogger("ambit.lab.mesh.identity")

ROOT_CONFIG_MAP = "istio-ca-root-cert"
TOKEN_AUDIENCE = "istio-ca"
TOKEN_SECONDS = 2 * 3600
REFRESH_SECONDS = 1800.0
TOKEN_FILE = "istio-token"
ROOT_FILE = "root-cert.pem"


class MeshIdentityError(AmbitError):
    """A node proxy's credentials could not be made (the API server or the control plane did not answer)."""


def token_file(topology: Topology, node: str) -> Path:
    return topology.node_dir(node) / "run" / TOKEN_FILE


def root_file(topology: Topology, node: str) -> Path:
    return topology.node_dir(node) / "run" / ROOT_FILE


def _pod(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"ztunnel-{node}", "labels": {"app": "ztunnel"}},
        "spec": {
            "nodeName": node,
            "hostNetwork": True,
            "serviceAccountName": NODE_PROXY_ACCOUNT,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "ztunnel", "image": "none", "command": ["sleep", "infinity"]}],
        },
    }


async def _ensure(client: KubeClient, kind: kinds.ResourceKind, obj: dict[str, Any], namespace: str | None) -> None:
    with contextlib.suppress(KubeAlreadyExistsError):
        await client.create(kind, obj, namespace=namespace)


async def write_tokens(client: KubeClient, topology: Topology) -> None:
    """A fresh token per node, bound to that node's ztunnel pod."""
    for node in topology.all_nodes():
        pod = await client.get(kinds.PODS, f"ztunnel-{node.name}", namespace=SYSTEM_NAMESPACE)
        result = await client.create_token(
            SYSTEM_NAMESPACE, NODE_PROXY_ACCOUNT, [TOKEN_AUDIENCE], expiration_seconds=TOKEN_SECONDS, bound_pod=pod
        )
        write_if_changed(token_file(topology, node.name), str(result["status"]["token"]), mode=0o600)


async def provision_node_proxies(client: KubeClient, topology: Topology, *, root_wait: float = 60.0) -> None:
    """Pods, tokens and the root file of every node proxy; waits up to ``root_wait`` s for the root ConfigMap."""
    await prepare_system_namespaces(client)
    for node in topology.all_nodes():
        await _ensure(client, kinds.PODS, _pod(node.name), SYSTEM_NAMESPACE)
    await write_tokens(client, topology)
    root = await _wait_root(client, root_wait)
    for node in topology.all_nodes():
        write_if_changed(root_file(topology, node.name), root)
    log.info("node proxy credentials written for %d nodes", topology.nodes)


async def _wait_root(client: KubeClient, wait: float) -> str:
    try:
        async with asyncio.timeout(wait):
            while True:
                with contextlib.suppress(KubeNotFoundError):
                    cm = await client.get(kinds.CONFIG_MAPS, ROOT_CONFIG_MAP, namespace=SYSTEM_NAMESPACE)
                    root = (cm.get("data") or {}).get("root-cert.pem")
                    if root:
                        return str(root)
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise MeshIdentityError(
            f"ConfigMap {SYSTEM_NAMESPACE}/{ROOT_CONFIG_MAP} did not appear within {wait:g} s: is the control "
            "plane running? (logs/controlplane.log)"
        ) from None


async def refresh_tokens(client: KubeClient, topology: Topology, every: float = REFRESH_SECONDS) -> None:
    """Renew the node proxies' tokens, and the control plane's and node agents' (:mod:`ambit.lab.mesh.accounts`),
    every ``every`` seconds, for as long as it runs."""
    while True:
        await asyncio.sleep(every)
        try:
            await write_tokens(client, topology)
            await write_component_credentials(client, topology)
        except (AmbitError, OSError) as exc:
            log.error("cannot renew the mesh components' tokens: %s (retrying in 30 s)", exc)
            await asyncio.sleep(30)
