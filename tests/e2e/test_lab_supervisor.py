"""``ambit lab up --mesh`` end to end: the mesh CA and config file, the supervisor restarting a killed node proxy
inside its node's namespace, and ``ambit lab down`` leaving no process behind.

One lab for the whole module, and one test: labs take the machine's single lab slot.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from tests.e2e.lab_driver import (
    TEST_TIMEOUT,
    daemon_pid,
    deployment_manifest,
    http_echo_container,
    lab_processes,
    running_lab,
    wait_until,
)

from ambit.model.localconfig import parse_local_config

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]


def same_netns(pid: int, netns: str) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{netns}").st_ino
    except OSError:
        return False


def test_a_killed_node_proxy_comes_back_and_lab_down_leaves_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "lab"
    with running_lab(tmp_path, mesh=True, supervised=True) as lab:
        topology = lab.topology
        assert (topology.mesh_ca_dir / "root.crt").is_file() and (topology.mesh_ca_dir / "root.key").is_file()
        node = topology.node(1)

        first = wait_until("node-1's node proxy running", lambda: daemon_pid(directory, "nodeproxy", node.name), 20)
        argv = lab_processes(directory)[first]
        assert argv[argv.index("--xds-address") + 1] == "198.18.0.1:15012"
        assert argv[argv.index("--ca-address") + 1] == "198.18.0.1:15012"
        # The node proxy's credentials: a token, and the root from the ConfigMap the control plane publishes (the
        # lab's plug-in CA root).
        assert Path(argv[argv.index("--token") + 1]).read_text().count(".") == 2
        root = Path(argv[argv.index("--root-cert") + 1]).read_text()
        assert root == (topology.mesh_ca_dir / "root.crt").read_text()
        assert same_netns(first, node.netns)

        os.kill(first, signal.SIGKILL)

        def restarted() -> int | None:
            pid = daemon_pid(directory, "nodeproxy", node.name)
            return pid if pid is not None and pid != first else None

        second = wait_until("node-1's node proxy started again", restarted, timeout=15)
        assert same_netns(second, node.netns), "the restarted node proxy runs in the node's namespace"

        # The controllers keep the mesh config file current.
        lab.namespace("e2e-meshconfig")
        lab.apply(deployment_manifest("echo", 1, http_echo_container(8080)), namespace="e2e-meshconfig")

        def in_config() -> bool:
            config = parse_local_config(topology.mesh_config_file.read_text())
            return any(w.namespace == "e2e-meshconfig" and w.canonical_name == "echo" for w in config.workloads)

        wait_until("the echo pod in mesh/workloads.yaml", in_config, timeout=30)
        lab.delete_namespace("e2e-meshconfig")
        supervisor_log = (directory / "logs" / "supervisor.log").read_text()
        assert "nodeproxy node-1" in supervisor_log and "SIGKILL" in supervisor_log, supervisor_log
        assert lab_processes(directory), "the lab's processes are running"
    assert lab_processes(directory) == {}, "ambit lab down left processes of the lab running"
