"""The volume shell's file work on a real filesystem: the AtomicWriter layout, sub-path and mount-point checks."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ambit.lab.runtime.oci_spec import VolumeMount
from ambit.lab.runtime.volumes import FileData, MountPlan, VolumeError
from ambit.lab.runtime.volumes_apply import (
    current_payload,
    make_nested_mount_points,
    mount_point_dirs,
    remove_tree,
    resolve_mounts,
    write_atomically,
)


def test_the_atomic_writer_swaps_data_links_and_prunes_what_left_the_payload(tmp_path: Path) -> None:
    target = tmp_path / "cfg"
    target.mkdir()
    first = {"a": FileData(b"1", 0o644), "dir/b": FileData(b"2", 0o600)}
    assert write_atomically(target, first, 0.0)
    assert current_payload(target) == first
    assert os.readlink(target / "a") == "..data/a" and os.readlink(target / "dir") == "..data/dir"
    assert (target / "dir" / "b").read_bytes() == b"2"
    assert stat.S_IMODE((target / "dir" / "b").stat().st_mode) == 0o600
    old = os.readlink(target / "..data")
    assert old.startswith("..1970_01_01_00_00_00.")

    assert not write_atomically(target, first, 1.0)  # unchanged: not written again
    assert os.readlink(target / "..data") == old

    second = {"a": FileData(b"3", 0o644)}
    assert write_atomically(target, second, 2.0)
    assert (target / "a").read_bytes() == b"3"
    assert not (target / "dir").is_symlink() and not (target / old).exists()
    assert sorted(p.name for p in target.iterdir()) == sorted(["..data", "a", os.readlink(target / "..data")])


def test_removal_never_follows_links_out_of_the_tree(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("precious")
    tree = tmp_path / "volumes"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "link").symlink_to(outside)
    remove_tree(tree)
    assert not tree.exists() and (outside / "keep").read_text() == "precious"


def plan(root: Path, sub_path: str, *, creatable: bool = True) -> MountPlan:
    return MountPlan(VolumeMount(f"{root}/{sub_path}", "/mnt", False), str(root), sub_path, creatable)


def test_a_sub_path_that_a_link_leads_out_of_its_volume_is_refused(tmp_path: Path) -> None:
    volume = tmp_path / "scratch"
    volume.mkdir()
    (volume / "out").symlink_to(tmp_path)
    with pytest.raises(VolumeError, match="leads outside its volume"):
        resolve_mounts((plan(volume, "out"),))
    (mount,) = resolve_mounts((plan(volume, "new/dir"),))
    assert mount.source == str(volume / "new" / "dir") and (volume / "new" / "dir").is_dir()
    with pytest.raises(VolumeError, match="does not exist"):
        resolve_mounts((plan(volume, "missing", creatable=False),))


def test_mount_points_missing_from_the_root_name_their_deepest_existing_directory(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "hosts").write_text("")
    (tmp_path / "etc" / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "etc" / "run").symlink_to(tmp_path / "private")
    (tmp_path / "private").mkdir()
    private = (str(tmp_path / "private"),)
    found = mount_point_dirs(
        [str(tmp_path / "etc" / "app" / "conf"), str(tmp_path / "etc" / "hosts"), str(tmp_path / "private" / "x")],
        private,
    )
    assert len(found) == 1
    assert found[0].path == str(tmp_path / "etc") and found[0].entries == (("hosts", False),)


def test_nested_mount_points_are_directories_that_survive_updates_and_never_follow_payload_links(
    tmp_path: Path,
) -> None:
    target = tmp_path / "volume"
    target.mkdir()
    write_atomically(target, {"root-cert.pem": FileData(b"one", 0o644)}, now=1.0)
    make_nested_mount_points(target, ("crl", "a/b", "root-cert.pem/inside"))
    assert (target / "crl").is_dir() and not (target / "crl").is_symlink()
    assert (target / "a" / "b").is_dir()
    assert not (target / "..data" / "root-cert.pem").is_dir()  # a payload name is a link: left alone
    write_atomically(target, {"root-cert.pem": FileData(b"two", 0o644)}, now=2.0)
    assert (target / "crl").is_dir() and (target / "root-cert.pem").read_bytes() == b"two"
