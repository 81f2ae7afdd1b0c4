"""The real control plane serves its sync status: ``ambit proxy-status`` with only a kubeconfig and the xDS address
(it mints the debug token and reads the mesh root from the ``istio-ca-root-cert`` ConfigMap) shows a connected node
proxy SYNCED on both ambient types, and the node proxy's own token may not read the status.

A real API server (subprocess) and the real control plane (tests/integration/controlplane_rig.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import pytest
from tests.harness import ServerProcess
from tests.integration.controlplane_rig import SERVER_NAME, account_token, delta_stream

from ambit.api import discovery_pb2 as dpb
from ambit.controlplane.process import ControlPlane
from ambit.k8s import KubeClient, kinds
from ambit.xds.convert import ADDRESS_TYPE_URL
from ambit.xds.session import AUTHORIZATION_TYPE_URL
from ambit.xds.sync_client import SyncReadError, fetch_sync_document


@pytest.fixture
def plane_options() -> dict[str, Any]:
    return {"instance": "istiod-syncz-test"}


async def _run_cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ambit.cli",
        "proxy-status",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_proxy_status_shows_a_connected_node_proxy_synced_and_the_proxys_token_may_not_read_it(
    kube: KubeClient, plane: ControlPlane, server_process: ServerProcess
) -> None:
    assert plane.root is not None and plane.server is not None
    address = f"127.0.0.1:{plane.server.port}"
    token = await account_token(kube, "istio-system", "ztunnel")
    node = dpb.Node(id="ztunnel~198.18.16.2~ztunnel-abcde.istio-system~istio-system.svc.cluster.local")
    requests = [dpb.DeltaDiscoveryRequest(type_url=t, node=node) for t in (ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL)]
    async with delta_stream(plane, token, requests):
        with pytest.raises(SyncReadError, match="may not read"):
            await fetch_sync_document(address, root_pem=plane.root.root_pem, token=token, server_name=SERVER_NAME)
        rows: list[list[str]] = []
        async with asyncio.timeout(30):
            while True:
                code, out, err = await _run_cli(
                    "--kubeconfig", str(server_process.kubeconfig), "--xds-address", address
                )
                assert code == 0, err
                rows = [line.split() for line in out.splitlines()]
                if len(rows) > 1 and rows[1][4] == rows[1][6] == "SYNCED":
                    break
                await asyncio.sleep(0.2)
        print("\n" + out)
        assert rows[0][:6] == ["NAME", "CLUSTER", "ISTIOD", "VERSION", "ADDRESSES", "AUTHORIZATION"]
        assert rows[1][:4] == ["ztunnel-abcde.istio-system", "Kubernetes", "istiod-syncz-test", "-"]
        code, out, err = await _run_cli(
            "--kubeconfig", str(server_process.kubeconfig), "--xds-address", address, "-o", "json"
        )
        assert code == 0, err
        documents: list[dict[str, Any]] = json.loads(out)
        (client,) = documents[0]["clients"]
        assert client["identity"] == "system:serviceaccount:istio-system:ztunnel"
        assert {t["status"] for t in client["types"].values()} == {"SYNCED"}


async def test_proxy_status_says_in_one_line_why_it_cannot_read(
    kube: KubeClient, plane: ControlPlane, server_process: ServerProcess
) -> None:
    assert plane.server is not None
    address = f"127.0.0.1:{plane.server.port}"
    kubeconfig = str(server_process.kubeconfig)
    code, _, err = await _run_cli("--kubeconfig", kubeconfig, "--xds-address", address, "--service-account", "x")
    assert code == 1 and err.strip() == "ambit proxy-status: --service-account 'x' is not <namespace>/<name>"
    code, _, err = await _run_cli(
        "--kubeconfig", kubeconfig, "--xds-address", address, "--service-account", "istio-system/ztunnel"
    )
    assert code == 1 and "may not read the sync status" in err and "Traceback" not in err
    code, _, err = await _run_cli("--kubeconfig", kubeconfig, "--xds-address", address, "-o", "yaml")
    assert code == 2 and "table or json" in err


async def test_without_an_address_proxy_status_finds_the_running_control_plane_pods(
    kube: KubeClient, plane: ControlPlane, server_process: ServerProcess
) -> None:
    assert plane.server is not None
    pod = {
        "metadata": {"name": "istiod-5f7d8-abcde", "labels": {"app": "istiod"}},
        "spec": {"containers": [{"name": "discovery", "image": "ambit"}]},
    }
    await kube.create(kinds.PODS, pod, "istio-system")
    try:
        kubeconfig = str(server_process.kubeconfig)
        code, _, err = await _run_cli("--kubeconfig", kubeconfig, "--xds-port", str(plane.server.port))
        assert code == 1 and "no running control plane pod (app=istiod) in istio-system" in err
        status = {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}
        await kube.patch_status(kinds.PODS, "istiod-5f7d8-abcde", {"status": status}, "istio-system")
        code, out, err = await _run_cli("--kubeconfig", kubeconfig, "--xds-port", str(plane.server.port), "-o", "json")
        assert code == 0, err
        assert [d["controlPlane"] for d in json.loads(out)] == ["istiod-syncz-test"]
    finally:
        await kube.delete(kinds.PODS, "istiod-5f7d8-abcde", "istio-system")
