"""The lab's system namespaces, as a cluster's installer prepares them before the mesh is applied.

Theory of operation: on a cluster, istiod, istio-cni and ztunnel run as pods of service accounts of the same names
in ``istio-system``, with the roles of ``deploy/rbac``. :func:`prepare_system_namespaces` labels ``istio-system``
and ``kube-system`` with the Pod Security level ``privileged`` for every mode (node-level pods live there: the node
agents are hostNetwork and privileged) and creates the three service accounts, before ``deploy/overlays/lab`` is
applied (:mod:`ambit.lab.mesh.install`). Every other namespace keeps the API server's default (enforce baseline).
The roles themselves come with the API server, which installs ``deploy/rbac`` at start.
"""

from __future__ import annotations

import contextlib

from ambit.k8s import KubeClient, kinds
from ambit.k8s.errors import KubeAlreadyExistsError

SYSTEM_NAMESPACE = "istio-system"
PRIVILEGED_NAMESPACES = (SYSTEM_NAMESPACE, "kube-system")
PRIVILEGED_LABELS = {f"pod-security.kubernetes.io/{mode}": "privileged" for mode in ("enforce", "audit", "warn")}
CONTROL_PLANE_ACCOUNT = "istiod"
NODE_AGENT_ACCOUNT = "istio-cni"
NODE_PROXY_ACCOUNT = "ztunnel"
ACCOUNTS = (CONTROL_PLANE_ACCOUNT, NODE_AGENT_ACCOUNT, NODE_PROXY_ACCOUNT)


async def prepare_system_namespaces(client: KubeClient) -> None:
    """The privileged system namespaces and the components' service accounts."""
    for name in PRIVILEGED_NAMESPACES:
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": PRIVILEGED_LABELS}}
        try:
            await client.create(kinds.NAMESPACES, namespace)
        except KubeAlreadyExistsError:
            await client.patch(kinds.NAMESPACES, name, {"metadata": {"labels": PRIVILEGED_LABELS}})
    for account in ACCOUNTS:
        body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}}
        with contextlib.suppress(KubeAlreadyExistsError):
            await client.create(kinds.SERVICE_ACCOUNTS, body, namespace=SYSTEM_NAMESPACE)
