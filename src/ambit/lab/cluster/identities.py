"""The lab's own cluster identities: each node's kubelet, the service proxy and the controllers authenticate as
themselves, not as the administrator, as kubeadm sets a cluster up.

Theory of operation:

1. Before the API server starts, :func:`write_token_file` writes ``cluster/tokens.csv`` (0600, kube's
   ``--token-auth-file`` format) with one random token per identity: ``system:node:<node>`` in ``system:nodes`` for
   each node the lab may ever have, ``node-1`` to ``node-<MAX_NODES>`` (the Node authorizer and NodeRestriction
   limit it to its own pods), ``system:kube-proxy`` (kube's ``system:node-proxier`` role) and
   ``system:kube-controller-manager`` (its bootstrap role, which in the lab also covers the scheduler that runs in
   the same process). The API server reads the file once, at start: a node added later
   (:func:`ambit.lab.cluster.nodes.add_node`) finds its token already known. Each token is drawn once and belongs to
   one identity; an existing file is kept, so that a restarted API server reads the same tokens.
2. Once the API server has written the admin kubeconfig, :func:`write_kubeconfigs` writes, next to the token
   file, one token file and one kubeconfig per identity present (0600) with the API server's CA and that identity's
   token only; :func:`provision_node` does the same for a node added later, reading its token from rule 1's file.
3. Every process of the lab uses its own kubeconfig (:func:`kubeconfig_for`); the admin kubeconfig stays for the
   user, and for the lab's set-up steps (namespaces, the mesh's accounts).

The directory is inside the lab directory, which the lab's containers never see (the sandbox masks it).
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ambit.lab.network.topology import MAX_NODES, Topology

CONTROLLERS = "system:kube-controller-manager"
KUBE_PROXY = "system:kube-proxy"
NODES_GROUP = "system:nodes"


@dataclass(frozen=True, slots=True)
class Identity:
    key: str
    """File name stem: ``node-<name>``, ``kube-proxy``, ``controllers``."""
    user: str
    groups: tuple[str, ...] = ()


def node_identity(name: str) -> Identity:
    return Identity(f"node-{name}", f"system:node:{name}", (NODES_GROUP,))


def identities(topology: Topology) -> list[Identity]:
    """The identities of the lab as it is now (its nodes, the service proxy, the controllers)."""
    nodes = [node_identity(n.name) for n in topology.all_nodes()]
    return [*nodes, Identity("kube-proxy", KUBE_PROXY), Identity("controllers", CONTROLLERS)]


def token_identities() -> list[Identity]:
    """Every identity with a token in the token file (rule 1): also the nodes the lab may add later."""
    nodes = [node_identity(f"node-{i}") for i in range(1, MAX_NODES + 1)]
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
    """Rule 1 (the present identities' tokens also written one per file, 0600, for the kubeconfigs'
    ``tokenFile``)."""
    path = token_file(topology)
    if path.exists():
        return path
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    tokens: set[str] = set()
    for identity in token_identities():
        token = secrets.token_urlsafe(32)
        while token in tokens:  # never in practice (256 bits); a token names one identity only
            token = secrets.token_urlsafe(32)
        tokens.add(token)
        writer.writerow([token, identity.user, "", ",".join(identity.groups)])
    write_if_changed(path, out.getvalue(), mode=0o600)
    for identity in identities(topology):
        _write_token(topology, identity)
    return path


def _token_of(topology: Topology, identity: Identity) -> str:
    with open(token_file(topology), newline="") as f:
        for row in csv.reader(f):
            if len(row) >= 2 and row[1] == identity.user:
                return row[0]
    raise LookupError(f"no token for {identity.user} in {token_file(topology)}")


def _write_token(topology: Topology, identity: Identity) -> None:
    write_if_changed(_token_path(topology, identity.key), _token_of(topology, identity), mode=0o600)


def _write_kubeconfig(topology: Topology, identity: Identity) -> None:
    config = component_kubeconfig(topology.kubeconfig, identity.key, _token_path(topology, identity.key))
    text = yaml.safe_dump(config, sort_keys=False)
    write_if_changed(kubeconfig_for(topology, identity.key), text, mode=0o600)


def write_kubeconfigs(topology: Topology) -> None:
    """Rule 2."""
    for identity in identities(topology):
        _write_kubeconfig(topology, identity)


def provision_node(topology: Topology, name: str) -> Path:
    """Rule 2 for node ``name`` added to a running lab: its token file and kubeconfig; the kubeconfig's path."""
    identity = node_identity(name)
    _write_token(topology, identity)
    _write_kubeconfig(topology, identity)
    return kubeconfig_for(topology, identity.key)


def forget_node(topology: Topology, name: str) -> None:
    """Remove what :func:`provision_node` wrote (the token stays in the token file: the API server knows it)."""
    key = node_identity(name).key
    for path in (kubeconfig_for(topology, key), _token_path(topology, key)):
        path.unlink(missing_ok=True)


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


def write_if_changed(path: Path, text: str, *, mode: int = 0o644) -> bool:
    """Replace ``path`` with ``text`` atomically unless it already holds exactly that; True when replaced.

    A new file gets ``mode`` from its creation on (a token is never readable by others, even briefly).
    """
    data = text.encode()
    with contextlib.suppress(OSError):
        if path.read_bytes() == data:
            return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # a leftover from a crash may have another mode
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)
    return True
