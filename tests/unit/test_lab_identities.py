"""The lab's cluster identities: one token per node the lab may ever have, the service proxy and the controllers,
in a 0600 token file that the API server accepts, kept across restarts; a node added later gets its kubeconfig
from the token drawn at ``lab up``."""

from __future__ import annotations

import dataclasses
import stat
from pathlib import Path

import yaml

from ambit.apiserver.token_file import StaticUser, load_token_file
from ambit.lab.cluster.identities import (
    forget_node,
    kubeconfig_for,
    provision_node,
    token_file,
    write_kubeconfigs,
    write_token_file,
)
from ambit.lab.network.topology import MAX_NODES, Topology


def _admin_kubeconfig(topology: Topology) -> None:
    topology.path.mkdir(parents=True, exist_ok=True)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "lab", "cluster": {"server": topology.api_url, "certificate-authority-data": "Y2E="}}],
        "users": [{"name": "admin", "user": {"token": "admin-token"}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "admin"}}],
        "current-context": "lab",
    }
    topology.kubeconfig.write_text(yaml.safe_dump(config))


def test_every_possible_node_and_component_gets_its_own_token(tmp_path: Path) -> None:
    topology = Topology.new(2, tmp_path / "lab")
    path = write_token_file(topology)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    users = load_token_file(path)
    assert len(set(users)) == MAX_NODES + 2  # no token names two identities
    names = {u.username for u in users.values()}
    assert {"system:kube-controller-manager", "system:kube-proxy"} <= names
    assert {f"system:node:node-{i}" for i in range(1, MAX_NODES + 1)} <= names
    assert StaticUser("system:node:node-2", "", ("system:nodes",)) in users.values()
    # Token files only for the nodes the lab has (and the components), each 0600 and known to the API server.
    written = sorted(p.name for p in path.parent.glob("*.token"))
    assert written == ["controllers.token", "kube-proxy.token", "node-node-1.token", "node-node-2.token"]
    for token_path in path.parent.glob("*.token"):
        assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
        assert token_path.read_text() in users
    # A second call (a restarted lab step) keeps the tokens the API server already knows.
    tokens = set(users)
    write_token_file(topology)
    assert set(load_token_file(token_file(topology))) == tokens


def test_an_added_node_gets_the_token_the_api_server_has_known_since_start(tmp_path: Path) -> None:
    topology = Topology.new(2, tmp_path / "lab")
    users = load_token_file(write_token_file(topology))
    _admin_kubeconfig(topology)
    write_kubeconfigs(topology)
    assert not kubeconfig_for(topology, "node-node-3").exists()
    grown = dataclasses.replace(topology, nodes=3)
    path = provision_node(grown, "node-3")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    config = yaml.safe_load(path.read_text())
    token_path = Path(config["users"][0]["user"]["tokenFile"])
    assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
    assert users[token_path.read_text()].username == "system:node:node-3"
    assert config["clusters"][0]["cluster"]["server"] == topology.api_url
    forget_node(grown, "node-3")
    assert not path.exists() and not token_path.exists()
