"""The lab installs the mesh as a cluster would: from ``deploy/overlays/lab``, with the DaemonSets and the
Deployment run by the lab's own controllers and kubelets, not as host processes.

Theory of operation (``ambit lab up --install``, once every node is Ready):

1. The lab's mesh root (``mesh/ca``) becomes Istio's plug-in CA Secret ``istio-system/cacerts`` (``ca-cert.pem``,
   ``ca-key.pem``, ``root-cert.pem``, ``cert-chain.pem``), which the control plane's Deployment mounts.
2. The overlay is rendered with ``kubectl kustomize`` and planned by :mod:`ambit.k8s.manifests`. One thing a
   static overlay cannot say is added to the plan: the lab's nodes share one machine, so a node's ``/var/run`` is
   the node's private tree (``nodes/<node>/root``, :class:`~ambit.lab.network.topology.HostPathLayout`); the node
   agent is told where the node sees its run directory (``--host-run-dir``), since the CNI plugin it installs runs
   on the node, not in the agent's container.
3. :func:`ambit.k8s.install.run_install` applies the plan in dependency order and waits until the control plane
   is available and each DaemonSet has an available pod on every node, reporting progress lines.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ambit.identity.localca import ROOT_COMMON_NAME, ROOT_NAME
from ambit.k8s import KubeClient, kinds
from ambit.k8s.errors import KubeAlreadyExistsError
from ambit.k8s.install import render, run_install
from ambit.k8s.manifests import Manifest, parse_manifests
from ambit.lab.mesh.accounts import SYSTEM_NAMESPACE, prepare_system_namespaces
from ambit.lab.network.topology import Topology
from ambit.tls.certs import load_or_create_ca

LAB_OVERLAY = Path(__file__).resolve().parents[4] / "deploy" / "overlays" / "lab"
CACERTS = "cacerts"
NODE_AGENT = "istio-cni-node"
INSTALL_SECONDS = 240.0


def cacerts_secret(cert_pem: bytes, key_pem: bytes) -> dict[str, Any]:
    """Rule 1 (pure): Istio's plug-in CA Secret for a self-signed root that signs workload certificates itself."""
    data = {
        "ca-cert.pem": cert_pem,
        "ca-key.pem": key_pem,
        "root-cert.pem": cert_pem,
        "cert-chain.pem": cert_pem,
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": CACERTS, "namespace": SYSTEM_NAMESPACE},
        "type": "Opaque",
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def with_host_run_dir(plan: list[Manifest], topology: Topology) -> list[Manifest]:
    """Rule 2 (pure): the node agent's container is told where its node sees the run directory."""
    out: list[Manifest] = []
    for m in plan:
        if not (m.kind == kinds.DAEMON_SETS and m.name == NODE_AGENT):
            out.append(m)
            continue
        obj = copy.deepcopy(dict(m.obj))
        container = obj["spec"]["template"]["spec"]["containers"][0]
        run_dir = next(
            (e.get("value") for e in container.get("env") or () if e.get("name") == "CNI_AGENT_RUN_DIR"),
            "/var/run/istio-cni",
        )
        host = f"{topology.path}/nodes/$(NODE_NAME)/root/{str(run_dir).lstrip('/')}"
        container["args"] = [*(container.get("args") or ()), f"--host-run-dir={host}"]
        out.append(Manifest(m.kind, m.name, m.namespace, m.rank, obj))
    return out


def lab_plan(topology: Topology, overlay: Path = LAB_OVERLAY) -> list[Manifest]:
    return with_host_run_dir(parse_manifests(render(overlay)), topology)


async def install_mesh(
    client: KubeClient, topology: Topology, echo: Callable[[str], None], seconds: float = INSTALL_SECONDS
) -> None:
    """Rules 1-3."""
    await prepare_system_namespaces(client)
    root = load_or_create_ca(topology.mesh_ca_dir, ROOT_NAME, ROOT_COMMON_NAME, time.time())
    secret = cacerts_secret(root.cert_pem, root.key_pem)
    with contextlib.suppress(KubeAlreadyExistsError):  # the lab's root never changes: an existing Secret holds it
        await client.create(kinds.SECRETS, secret, namespace=SYSTEM_NAMESPACE)
    await run_install(client, lab_plan(topology), seconds, True, echo)
