"""The lab's own cluster identities: each node's kubelet, the service proxy and the controllers authenticate as
themselves, not as the administrator, as kubeadm sets a cluster up.

Theory of operation:

1. Before the API server starts, :func:`write_token_file` writes ``cluster/tokens.csv`` (0600, kube's
   ``--token-auth-file`` format) with one random token per identity: ``system:node:<node>`` in ``system:nodes`` for
   each node (the Node authorizer and NodeRestriction limit it to its own pods), ``system:kube-proxy`` (kube's
   ``system:node-proxier`` role) and ``system:kube-controller-manager`` (its bootstrap role, which in the lab also
   covers the scheduler that runs in the same process). An existing file is kept, so that a restarted API server
   reads the same tokens.
2. Once the API server has written the admin kubeconfig, :func:`write_kubeconfigs` writes, next to the token
   file, one kubeconfig per identity (0600) with the API server's CA and that identity's token only.
3. Every process of the lab uses its own kubeconfig (:func:`kubeconfig_for`); the admin kubeconfig stays for the
   user, and for the lab's set-up steps (namespaces, the mesh's accounts).

The directory is inside the lab directory, which the lab's containers never see (the sandbox masks it).
"""

from __future__ import annotations

import csv
import io
import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml

from ambit.lab.mesh.accounts import component_kubeconfig
from ambit.lab.mesh.config import write_if_changed
from ambit.lab.network.topology import Topology

CONTROLLERS = "system:kube-controller-manager"
KUBE_PROXY = "system:kube-proxy"
NODES_GROUP = "system:nodes"


@dataclass(frozen=True, slots=True)
class Identity:
    key: str
    """File name stem: ``node-<name>``, ``kube-proxy``, ``controllers``."""
    user: str
    groups: tuple[str, ...] = ()


def identities(topology: Topology) -> list[Identity]:
    nodes = [Identity(f"node-{n.name}", f"system:node:{n.name}", (NODES_GROUP,)) for n in topology.all_nodes()]
    return [*nodes, Identity("kube-proxy", KUBE_PROXY), Identity("controllers", CONTROLLERS)]


def cluster_dir(topology: Topology) -> Path:
    return topology.path / "cluster"


def token_file(topology: Topology) -> Path:
    return cluster_dir(topology) / "tokens.csv"


def kubeconfig_for(topology: Topology, key: str) -> Path:
    return cluster_dir(topology) / f"{key}.kubeconfig"


def _token_path(topology: Topology, key: str) -> Path:
    return cluster_dir(topology) / f"{key}.token"


def write_token_file(topology: Topology) -> Path:
    """Rule 1 (tokens also written one per file, 0600, for the kubeconfigs' ``tokenFile``)."""
    path = token_file(topology)
    if path.exists():
        return path
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for identity in identities(topology):
        token = secrets.token_urlsafe(32)
        writer.writerow([token, identity.user, "", ",".join(identity.groups)])
        write_if_changed(_token_path(topology, identity.key), token, mode=0o600)
    write_if_changed(path, out.getvalue(), mode=0o600)
    return path


def write_kubeconfigs(topology: Topology) -> None:
    """Rule 2."""
    for identity in identities(topology):
        config = component_kubeconfig(topology.kubeconfig, identity.key, _token_path(topology, identity.key))
        text = yaml.safe_dump(config, sort_keys=False)
        write_if_changed(kubeconfig_for(topology, identity.key), text, mode=0o600)
