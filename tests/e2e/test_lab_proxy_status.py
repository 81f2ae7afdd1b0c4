"""``ambit proxy-status`` on the lab (issue 20): with only the lab's admin kubeconfig it finds the istiod pod, mints
its debug token and shows every node proxy SYNCED; a node proxy that is frozen (SIGSTOP: its connection stays up but
nothing answers) turns STALE after the next push, and SYNCED again once it runs.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from tests.e2e.lab_driver import TEST_TIMEOUT, Lab, ambit, module_on_shared_lab, service_manifest, wait_until

from ambit import ISTIO_VERSION

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True  # tests/e2e/lab_driver.py shared_mesh_lab: one lab for the modules that share it

ADDRESS = "type.googleapis.com/istio.workload.Address"
AUTHORIZATION = "type.googleapis.com/istio.security.Authorization"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with module_on_shared_lab(tmp_path_factory) as up:
        yield up
        assert up.log_tracebacks() == []


def statuses(lab: Lab) -> dict[str, dict[str, str]]:
    """Node id → type URL → status, from ``ambit proxy-status -o json``."""
    done = ambit("proxy-status", "--kubeconfig", str(lab.topology.kubeconfig), "-o", "json")
    documents: list[dict[str, Any]] = json.loads(done.stdout)
    return {
        client["node"]: {url: entry["status"] for url, entry in client["types"].items()}
        for document in documents
        for client in document["clients"]
    }


def synced(lab: Lab, node: str) -> bool:
    status = statuses(lab).get(node, {})
    return status.get(ADDRESS) == status.get(AUTHORIZATION) == "SYNCED"


def test_every_node_proxy_is_synced_and_a_frozen_one_turns_stale(lab: Lab) -> None:
    nodes = [node.name for node in lab.topology.all_nodes()]
    wait_until("every node proxy SYNCED", lambda: all(synced(lab, node) for node in nodes), timeout=60)
    table = ambit("proxy-status", "--kubeconfig", str(lab.topology.kubeconfig)).stdout
    print("\n" + table)
    assert table.splitlines()[0].split()[:6] == ["NAME", "CLUSTER", "ISTIOD", "VERSION", "ADDRESSES", "AUTHORIZATION"]
    versions = {row.split()[3] for row in table.splitlines()[1:]}
    assert versions == {ISTIO_VERSION}  # each proxy's ISTIO_VERSION: the Istio release Ambit implements

    frozen = nodes[-1]
    pid = wait_until(f"the node proxy of {frozen}", lambda: lab.component_pid("nodeproxy", frozen), timeout=30)
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        lab.apply(service_manifest("proxy-status-push", {"app": "nobody"}, 80, 8080), namespace="default")
        wait_until(
            f"{frozen} STALE", lambda: statuses(lab).get(frozen, {}).get(ADDRESS) == "STALE", timeout=60, interval=1
        )
        stale = time.monotonic() - start
        assert all(synced(lab, node) for node in nodes if node != frozen)
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(f"{frozen} SYNCED again", lambda: synced(lab, frozen), timeout=60)
    print(f"{frozen} STALE {stale:.1f} s after the push that it could not ACK (stale after 5 s)")
    lab.kubectl("delete", "service", "proxy-status-push", "-n", "default", "--wait=false")
