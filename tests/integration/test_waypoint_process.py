"""``ambit waypoint proxy`` as its own process, configured the way a waypoint pod is (environment variables), with
a local CA and a local config file instead of a control plane."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import pytest
from tests.integration.waypoint_rig import (
    CLIENT_ID,
    CLIENT_IP,
    TD,
    WAYPOINT_ID,
    free_port,
    mesh_config,
    shared_free_port,
)

from ambit.hbone.headers import hostport
from ambit.identity.localca import LocalCa
from ambit.model.localconfig import render_local_config
from ambit.proxy.hbone_client import HboneClient, TunnelRefusedError


async def test_the_waypoint_command_starts_gets_ready_refuses_its_own_ports_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    ca = LocalCa(tmp_path / "ca", trust_domain=TD)  # made first: the process signs with the same root
    config = tmp_path / "mesh.yaml"
    config.write_text(render_local_config(mesh_config()), encoding="utf-8")
    ports = {name: free_port() for name in ("admin", "stats", "readiness")}
    ports["hbone"] = shared_free_port(("127.0.0.1", "::1"))  # served on both of the pod's addresses
    env = {
        **os.environ,
        "POD_NAMESPACE": "app",
        "GATEWAY_NAME": "waypoint",
        "SERVICE_ACCOUNT": "waypoint",
        "POD_NAME": "waypoint-0",
        "INSTANCE_IP": "127.0.0.1",
        "INSTANCE_IPS": "127.0.0.1,::1",  # a dual-stack pod: HBONE served on its IPv6 address too
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ambit.cli",
        "waypoint",
        "proxy",
        f"--local-ca={tmp_path / 'ca'}",
        f"--config={config}",
        f"--hbone-port={ports['hbone']}",
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
                if process.returncode is not None:
                    assert process.stderr is not None
                    said = (await process.stderr.read()).decode(errors="replace")[-2000:]
                    pytest.fail(f"the waypoint exited with {process.returncode}: {said}")
                await asyncio.sleep(0.1)
        cert = await ca.fetch_certificate(CLIENT_ID)
        loop = asyncio.get_running_loop()
        for family, source, waypoint in ((socket.AF_INET, CLIENT_IP, "127.0.0.1"), (socket.AF_INET6, "::1", "::1")):
            sock = socket.socket(family)
            sock.setblocking(False)
            sock.bind((source, 0))
            await loop.sock_connect(sock, (waypoint, ports["hbone"]))
            client = await HboneClient.connect(sock, cert, frozenset({WAYPOINT_ID}), trust_domain=TD)
            with pytest.raises(TunnelRefusedError) as caught:  # its own port, at either of its own addresses
                await client.open_tunnel(hostport(waypoint, ports["admin"]), [])
            assert caught.value.status == 400
            await client.aclose()
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            _, stderr = await process.communicate()
    assert process.returncode == 0, stderr.decode()[-2000:]
    assert b"refused CONNECT" in stderr
