"""The node's tree made ready for a view of its root (:mod:`ambit.lab.runtime.node_view_apply`), on real files:
mount points and links made inside the tree, never through a link a pod planted."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from ambit.lab.network.topology import HostPathLayout
from ambit.lab.runtime.node_view_apply import prepare_node_view, system_entries


def test_the_machines_system_dirs_are_read_as_links_or_directories(tmp_path: Path) -> None:
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "bin").symlink_to("usr/bin")
    (tmp_path / "lib").mkdir()
    assert system_entries(str(tmp_path)) == {"/usr": None, "/bin": "usr/bin", "/lib": None}


def test_preparing_makes_the_mount_points_and_the_system_links_in_the_tree(tmp_path: Path) -> None:
    layout = HostPathLayout(tmp_path, "node-1")
    view = prepare_node_view(layout)
    root = layout.root
    for bind in view.binds:
        assert (root / bind.node_path.lstrip("/")).is_dir(), bind
    for link in view.links:
        assert os.readlink(root / link.node_path.lstrip("/")) == link.target
    assert {"/etc/cni/net.d", "/opt/cni/bin", "/var/run/netns", "/usr"} <= {b.node_path for b in view.binds}
    again = prepare_node_view(layout)  # idempotent: a second pod of the node finds it made
    assert again == view


def test_a_link_a_pod_planted_in_the_tree_is_not_followed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    layout = HostPathLayout(tmp_path / "lab", "node-1")
    outside = tmp_path / "machine-etc"
    outside.mkdir()
    layout.root.mkdir(parents=True)
    (layout.root / "etc").symlink_to(outside)  # a pod with the tree writable made /etc lead out
    (layout.root / "opt").write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="ambit.lab.node_view"):
        view = prepare_node_view(layout)
    assert list(outside.iterdir()) == []  # nothing was made through the link
    shown = {b.node_path for b in view.binds}
    assert "/etc/cni/net.d" not in shown and "/opt/cni/bin" not in shown
    assert "/var/run/netns" in shown
    assert any("/etc/cni/net.d is not shown" in r.getMessage() for r in caplog.records)


def test_a_tree_that_has_its_own_bin_keeps_it(tmp_path: Path) -> None:
    layout = HostPathLayout(tmp_path, "node-1")
    (layout.root / "bin").mkdir(parents=True)
    view = prepare_node_view(layout)
    assert (layout.root / "bin").is_dir() and not (layout.root / "bin").is_symlink()
    assert view.root == str(layout.root)
