"""The lab's cluster identities: one token per node, the service proxy and the controllers, in a 0600 token file
that the API server accepts, kept across restarts."""

from __future__ import annotations

import stat
from pathlib import Path

from ambit.apiserver.token_file import StaticUser, load_token_file
from ambit.lab.cluster.identities import token_file, write_token_file
from ambit.lab.network.topology import Topology


def test_every_node_and_component_gets_its_own_token(tmp_path: Path) -> None:
    topology = Topology.new(2, tmp_path / "lab")
    path = write_token_file(topology)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    users = sorted(load_token_file(path).values(), key=lambda u: u.username)
    assert users == [
        StaticUser("system:kube-controller-manager", "", ()),
        StaticUser("system:kube-proxy", "", ()),
        StaticUser("system:node:node-1", "", ("system:nodes",)),
        StaticUser("system:node:node-2", "", ("system:nodes",)),
    ]
    tokens = set(load_token_file(path))
    assert len(tokens) == 4
    for token_path in path.parent.glob("*.token"):
        assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
        assert token_path.read_text() in tokens
    # A second call (a restarted lab step) keeps the tokens the API server already knows.
    write_token_file(topology)
    assert set(load_token_file(token_file(topology))) == tokens
