"""Installer: the pure config transforms (expected JSON spelled out) and install/uninstall/repair on tmp dirs."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from ambit.cni.installer import (
    InstallError,
    InstallWatcher,
    find_primary_config,
    insert_plugin,
    install,
    remove_plugin,
    render_wrapper,
    uninstall,
)

OURS = {"type": "ambit-cni", "name": "ambit-cni", "agent_socket": "/run/a.sock", "ambient_enabled": True}
BRIDGE = {"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local", "subnet": "198.18.1.0/24"}}
CONFLIST = {"cniVersion": "1.0.0", "name": "lab", "plugins": [BRIDGE, {"type": "portmap"}]}


def test_insert_appends_our_entry_last_with_stable_formatting() -> None:
    text, name = insert_plugin(json.dumps(CONFLIST), "10-lab.conflist", OURS)
    assert name == "10-lab.conflist"
    assert text == (
        "{\n"
        '  "cniVersion": "1.0.0",\n'
        '  "name": "lab",\n'
        '  "plugins": [\n'
        "    {\n"
        '      "type": "bridge",\n'
        '      "bridge": "cni0",\n'
        '      "ipam": {\n'
        '        "type": "host-local",\n'
        '        "subnet": "198.18.1.0/24"\n'
        "      }\n"
        "    },\n"
        "    {\n"
        '      "type": "portmap"\n'
        "    },\n"
        "    {\n"
        '      "type": "ambit-cni",\n'
        '      "name": "ambit-cni",\n'
        '      "agent_socket": "/run/a.sock",\n'
        '      "ambient_enabled": true\n'
        "    }\n"
        "  ]\n"
        "}\n"
    )


def test_insert_is_idempotent_and_replaces_an_old_entry() -> None:
    once, _ = insert_plugin(json.dumps(CONFLIST), "10-lab.conflist", OURS)
    assert insert_plugin(once, "10-lab.conflist", OURS)[0] == once
    old_first = {**CONFLIST, "plugins": [{"type": "ambit-cni", "stale": 1}, *CONFLIST["plugins"]]}
    replaced, _ = insert_plugin(json.dumps(old_first), "10-lab.conflist", OURS)
    assert replaced == once


def test_insert_converts_a_single_plugin_conf_to_a_conflist() -> None:
    conf = {"cniVersion": "0.4.0", "name": "net", **BRIDGE}
    text, name = insert_plugin(json.dumps(conf), "10-net.conf", OURS)
    assert name == "10-net.conflist"
    assert json.loads(text) == {"cniVersion": "0.4.0", "name": "net", "plugins": [conf, OURS]}


def test_remove_drops_only_our_entries() -> None:
    with_ours, _ = insert_plugin(json.dumps(CONFLIST), "10-lab.conflist", OURS)
    text, name = remove_plugin(with_ours, "10-lab.conflist")
    assert name == "10-lab.conflist" and json.loads(text) == CONFLIST
    single = json.dumps({"cniVersion": "1.0.0", "name": "n", "type": "bridge"})
    assert remove_plugin(single, "n.conf") == (single, "n.conf")


@pytest.mark.parametrize("text", ["{", "[]", '{"plugins": {"type": "x"}}', '{"plugins": [1]}'])
def test_insert_rejects_what_is_not_a_cni_config(text: str) -> None:
    with pytest.raises(InstallError):
        insert_plugin(text, "bad.conflist", OURS)


def test_insert_requires_our_type() -> None:
    with pytest.raises(ValueError, match="type"):
        insert_plugin(json.dumps(CONFLIST), "x.conflist", {"type": "bridge"})


def test_wrapper_execs_the_plugin_module() -> None:
    assert render_wrapper(Path("/opt/my env/python")) == (
        "#!/bin/sh\nexec '/opt/my env/python' -I -m ambit.cni.plugin \"$@\"\n"
    )


@pytest.fixture
def node(tmp_path: Path) -> tuple[Path, Path, Path]:
    conf_dir, bin_dir = tmp_path / "net.d", tmp_path / "bin"
    conf_dir.mkdir()
    (conf_dir / "10-ambit-lab.conflist").write_text(json.dumps(CONFLIST))
    (conf_dir / "20-other.conf").write_text(json.dumps({"cniVersion": "1.0.0", "name": "o", "type": "bridge"}))
    (conf_dir / "README").write_text("not a config")
    exe = tmp_path / "ambit-cni-wrapper"
    exe.write_text(render_wrapper(Path("/usr/bin/python3")))
    return conf_dir, bin_dir, exe


def plugins(path: Path) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = json.loads(path.read_text())["plugins"]
    return result


def test_install_chains_into_the_first_config_and_copies_the_executable(node: tuple[Path, Path, Path]) -> None:
    conf_dir, bin_dir, exe = node
    result = install(conf_dir, bin_dir, OURS, exe)
    assert result.config == conf_dir / "10-ambit-lab.conflist" and result.removed is None and result.changed
    assert plugins(result.config)[-1] == OURS
    assert result.binary.read_bytes() == exe.read_bytes() and os.access(result.binary, os.X_OK)
    assert json.loads((conf_dir / "20-other.conf").read_text())["type"] == "bridge"
    assert sorted(p.name for p in conf_dir.iterdir()) == ["10-ambit-lab.conflist", "20-other.conf", "README"]
    assert not install(conf_dir, bin_dir, OURS, exe).changed


def test_install_converts_a_conf_and_removes_it(tmp_path: Path) -> None:
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir()
    (conf_dir / "05-net.conf").write_text(json.dumps({"cniVersion": "1.0.0", "name": "n", "type": "bridge"}))
    exe = tmp_path / "exe"
    exe.write_text("#!/bin/sh\n")
    result = install(conf_dir, tmp_path / "bin", OURS, exe)
    assert result.removed == conf_dir / "05-net.conf" and not result.removed.exists()
    assert find_primary_config(conf_dir) == conf_dir / "05-net.conflist"
    assert [p["type"] for p in plugins(result.config)] == ["bridge", "ambit-cni"]


def test_install_without_a_primary_config_fails_clearly(tmp_path: Path) -> None:
    exe = tmp_path / "exe"
    exe.write_text("x")
    with pytest.raises(InstallError, match="no CNI configuration"):
        install(tmp_path / "empty", tmp_path / "bin", OURS, exe)


def test_uninstall_restores_the_configs_and_removes_the_binary(node: tuple[Path, Path, Path]) -> None:
    conf_dir, bin_dir, exe = node
    before = json.loads((conf_dir / "10-ambit-lab.conflist").read_text())
    install(conf_dir, bin_dir, OURS, exe)
    changed = uninstall(conf_dir, bin_dir)
    assert changed == [conf_dir / "10-ambit-lab.conflist", bin_dir / "ambit-cni"]
    assert json.loads((conf_dir / "10-ambit-lab.conflist").read_text()) == before
    assert not (bin_dir / "ambit-cni").exists()
    assert uninstall(conf_dir, bin_dir) == []


def test_watcher_check_repairs_edits_and_removals(node: tuple[Path, Path, Path]) -> None:
    conf_dir, bin_dir, exe = node
    watcher = InstallWatcher(conf_dir, bin_dir, OURS, exe)
    assert watcher.check() is not None
    assert watcher.check() is None  # nothing changed: not even a read
    primary = conf_dir / "10-ambit-lab.conflist"
    primary.write_text(json.dumps(CONFLIST))  # the primary CNI rewrote its config
    assert watcher.check() is not None and plugins(primary)[-1] == OURS
    (bin_dir / "ambit-cni").unlink()
    assert watcher.check() is not None and (bin_dir / "ambit-cni").exists()
    assert watcher.repairs == 2


async def test_watcher_repairs_in_the_background(node: tuple[Path, Path, Path]) -> None:
    conf_dir, bin_dir, exe = node
    primary = conf_dir / "10-ambit-lab.conflist"
    async with InstallWatcher(conf_dir, bin_dir, OURS, exe, interval=0.01) as watcher:
        assert plugins(primary)[-1] == OURS
        primary.write_text(json.dumps(CONFLIST))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if plugins(primary)[-1] == OURS:
                break
        assert plugins(primary)[-1] == OURS and watcher.repairs == 1


async def test_watcher_outlives_a_conf_dir_replaced_by_a_file_and_repairs_once_it_is_back(
    node: tuple[Path, Path, Path],
) -> None:
    conf_dir, bin_dir, exe = node
    primary = conf_dir / "10-ambit-lab.conflist"
    async with InstallWatcher(conf_dir, bin_dir, OURS, exe, interval=0.01) as watcher:
        moved = conf_dir.with_name("conf-moved")
        conf_dir.rename(moved)
        conf_dir.write_text("not a directory")  # the scan fails with NotADirectoryError for a while
        await asyncio.sleep(0.05)
        assert watcher._task is not None and not watcher._task.done()
        conf_dir.unlink()
        moved.rename(conf_dir)
        primary.write_text(json.dumps(CONFLIST))  # meanwhile the primary CNI rewrote its config
        for _ in range(200):
            await asyncio.sleep(0.01)
            if plugins(primary)[-1] == OURS:
                break
        assert plugins(primary)[-1] == OURS
