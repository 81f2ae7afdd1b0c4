"""The lab's system namespaces and the mesh components' own credentials, as a cluster install gives them.

Theory of operation: on a cluster, istiod, istio-cni and ztunnel run as pods of service accounts of the same names
in ``istio-system``, with the roles of ``deploy/rbac`` and a token the kubelet projects and rotates. The lab runs
them outside pods, so it does the installer's and the kubelet's part:

1. :func:`prepare_system_namespaces` labels ``istio-system`` and ``kube-system`` with the Pod Security level
   ``privileged`` for every mode (node-level pods live there: the node proxies' placeholder pods are
   hostNetwork) and creates the three service accounts. Every other namespace keeps the API server's default
   (enforce baseline). The roles themselves come with the API server, which installs ``deploy/rbac`` at start.
2. :func:`write_component_credentials` mints, through TokenRequest, a token with an expiry for the control plane
   (``istiod``) and for the node agents (``istio-cni``), writes it to ``mesh/credentials/<account>.token`` (0600),
   and next to it a kubeconfig that names the file in ``tokenFile``. Clients re-read a token file when it is
   older than a minute or on a 401 (:class:`ambit.k8s.connection.TokenFileAuth`), so rewriting the file is
   rotation. The node proxies' token is :mod:`ambit.lab.mesh.identity`'s (bound to their pod, audience
   ``istio-ca``): they talk only to the control plane.
3. The supervisor calls (2) before it starts the daemons, and again with each refresh of the node proxies'
   tokens, long before the tokens expire.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import yaml

from ambit.k8s import KubeClient, kinds
from ambit.k8s.errors import KubeAlreadyExistsError
from ambit.lab.mesh.config import write_if_changed
from ambit.lab.network.topology import Topology

SYSTEM_NAMESPACE = "istio-system"
PRIVILEGED_NAMESPACES = (SYSTEM_NAMESPACE, "kube-system")
PRIVILEGED_LABELS = {f"pod-security.kubernetes.io/{mode}": "privileged" for mode in ("enforce", "audit", "warn")}
CONTROL_PLANE_ACCOUNT = "istiod"
NODE_AGENT_ACCOUNT = "istio-cni"
NODE_PROXY_ACCOUNT = "ztunnel"
ACCOUNTS = (CONTROL_PLANE_ACCOUNT, NODE_AGENT_ACCOUNT, NODE_PROXY_ACCOUNT)
API_CLIENT_ACCOUNTS = (CONTROL_PLANE_ACCOUNT, NODE_AGENT_ACCOUNT)
"""The accounts whose token talks to the API server (the node proxies talk only to the control plane)."""
TOKEN_SECONDS = 2 * 3600


def credentials_dir(topology: Topology) -> Path:
    return topology.path / "mesh" / "credentials"


def token_path(topology: Topology, account: str) -> Path:
    return credentials_dir(topology) / f"{account}.token"


def kubeconfig_path(topology: Topology, account: str) -> Path:
    return credentials_dir(topology) / f"{account}.kubeconfig"


async def prepare_system_namespaces(client: KubeClient) -> None:
    """Rule 1: the privileged system namespaces and the components' service accounts."""
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


def component_kubeconfig(admin_kubeconfig: Path, account: str, token_file: Path) -> dict[str, Any]:
    """The admin kubeconfig's cluster, with the account's token file as the only credential."""
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    cluster = admin["clusters"][0]
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": account, "user": {"tokenFile": str(token_file)}}],
        "contexts": [{"name": account, "context": {"cluster": cluster["name"], "user": account}}],
        "current-context": account,
        "preferences": {},
    }


async def write_component_credentials(client: KubeClient, topology: Topology) -> None:
    """Rule 2: a fresh token and a kubeconfig for each component that reads the API."""
    for account in API_CLIENT_ACCOUNTS:
        result = await client.create_token(SYSTEM_NAMESPACE, account, [], expiration_seconds=TOKEN_SECONDS)
        token = token_path(topology, account)
        write_if_changed(token, str(result["status"]["token"]), mode=0o600)
        config = component_kubeconfig(topology.kubeconfig, account, token)
        write_if_changed(kubeconfig_path(topology, account), yaml.safe_dump(config, sort_keys=False), mode=0o600)
