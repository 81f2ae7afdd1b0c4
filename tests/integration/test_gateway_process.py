"""``ambit gateway`` as its own process, configured the way a gateway pod is (environment variables), with a local
CA and a local config file instead of a control plane: it starts, gets ready, serves its admin config dump with
the gateway's identity, and stops on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
from tests.integration.waypoint_rig import TD, free_port, mesh_config

from ambit.identity.localca import LocalCa
from ambit.model.localconfig import render_local_config


async def test_the_gateway_command_starts_gets_ready_and_stops_on_sigterm(tmp_path: Path) -> None:
    LocalCa(tmp_path / "ca", trust_domain=TD)
    config = tmp_path / "mesh.yaml"
    config.write_text(render_local_config(mesh_config()), encoding="utf-8")
    ports = {name: free_port() for name in ("admin", "stats", "readiness")}
    env = {
        **os.environ,
        "POD_NAMESPACE": "edge",
        "GATEWAY_NAME": "edge",
        "SERVICE_ACCOUNT": "edge-istio",
        "POD_NAME": "edge-istio-0",
        "INSTANCE_IP": "127.0.0.1",
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ambit.cli",
        "gateway",
        f"--local-ca={tmp_path / 'ca'}",
        f"--config={config}",
        f"--admin-port={ports['admin']}",
        f"--stats-port={ports['stats']}",
        f"--readiness-port={ports['readiness']}",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(30), aiohttp.ClientSession() as session:
            while True:  # polling another process's endpoint: there is no event to wait on
                try:
                    async with session.get(f"http://127.0.0.1:{ports['readiness']}/healthz/ready") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                assert process.returncode is None, "the gateway exited"
                await asyncio.sleep(0.1)
            async with session.get(f"http://127.0.0.1:{ports['admin']}/config_dump") as response:
                dump = await response.json()
        assert dump["config"]["identity"] == "spiffe://cluster.local/ns/edge/sa/edge-istio"
        assert dump["gateway"] == {
            "listeners": [],
            "listening": [],
            "tunnelListening": [],
            "updates": 0,
            "forwardClientCert": "SANITIZE_SET",
            "connection_refusals": {},
        }
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            _, stderr = await process.communicate()
    assert process.returncode == 0, stderr.decode()[-2000:]
