"""Which HTTP version the waypoint takes and speaks, on loopback with a real waypoint and real h2c backends.

- A port declared HTTP/2 (istio's ``http2`` port) takes an HTTP/1.1 client and handles it at L7 (a request id,
  per-request balancing), speaking h2c to the backend as Istio's HTTP/2 cluster does (istio
  tests/integration/ambient/baseline_test.go TestServices calls the ``http2`` port with HTTP/1.1 through a
  service-addressed waypoint and expects 200 with L7 handling).
- DestinationRule ``connectionPool.http.useClientProtocol`` speaks the client's version upstream, overriding the
  port's declaration (istio tests/integration/pilot/common routing.go useClientProtocolCases).

See :mod:`tests.integration.waypoint_rig`; the rules are put into the waypoint's config directly, as the control
plane would send them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.waypoint_rig import (
    H2C_VIP,
    WEB2_VIP,
    H2OverTunnelClient,
    HttpOverTunnel,
    Rig,
    h2c_backends,
    read_until_eof,
    started_rig,
)

from ambit.model.destination_policy import ConnectionPool, DestinationPolicy, H2Upgrade, TrafficPolicy
from ambit.model.routes import WaypointConfig
from ambit.waypoint.settings import WaypointLimits

LIMITS = WaypointLimits(head_timeout=0.5, sniff_timeout=0.5, startup_wait=5.0)
H2C = "h2c.app.svc.cluster.local"
WEB2 = "web2.app.svc.cluster.local"
CLIENT_PROTOCOL = TrafficPolicy(connection_pool=ConnectionPool(use_client_protocol=True))


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path, LIMITS) as rig:
        yield rig


def configure(rig: Rig, *rules: DestinationPolicy) -> None:
    rig.waypoint.context.routes.replace(WaypointConfig("app/waypoint", (), destination_rules=rules))


async def test_an_http11_client_on_a_port_declared_http2_is_served_at_l7_and_spoken_h2c_upstream(rig: Rig) -> None:
    async with h2c_backends(rig) as backends:
        client, stream = await rig.tunnel(f"{WEB2_VIP}:80")
        http = HttpOverTunnel(stream, host=WEB2)
        answers = [await http.request("GET", f"/n{i}") for i in range(4)]  # one keep-alive connection
        for i, (status, _, body) in enumerate(answers):
            assert status == 200, body
            assert json.loads(body)["proto"] == "HTTP/2.0" and json.loads(body)["path"] == f"/n{i}"
        assert [b.protocols for b in backends] == [["HTTP/2.0"] * 2, ["HTTP/2.0"] * 2]  # balanced per request
        seen = {rid for b in backends for rid in b.request_ids}
        assert len(seen) == 4 and "" not in seen  # L7 handling: the waypoint gave each request its id
        await client.aclose()


async def test_an_h2_client_on_the_same_port_is_still_served_as_http2(rig: Rig) -> None:
    async with h2c_backends(rig) as backends:
        client, stream = await rig.tunnel(f"{WEB2_VIP}:80")
        h2c = H2OverTunnelClient(stream, f"{WEB2}:80")
        for i in range(2):
            headers, body = await h2c.get(f"/h{i}")
            assert headers[":status"] == "200" and json.loads(body)["proto"] == "HTTP/2.0"
        assert sum(len(b.protocols) for b in backends) == 2
        await client.aclose()


@pytest.mark.parametrize("garbage", [b"\x16\x03\x01\x02\x00\x01\x00" + bytes(100), b"\r\n\r\n\xff\xff\xff\xff"])
async def test_garbage_on_a_port_declared_http2_is_refused_and_never_reaches_a_backend(
    rig: Rig, garbage: bytes
) -> None:
    async with h2c_backends(rig) as backends:
        client, stream = await rig.tunnel(f"{WEB2_VIP}:80")
        await stream.write(garbage)
        answer = await read_until_eof(stream)
        assert answer.startswith(b"HTTP/1.1 400"), answer
        assert [b.connections for b in backends] == [0, 0]
        await client.aclose()


async def test_use_client_protocol_speaks_http2_upstream_for_an_h2_client_on_an_http11_port(rig: Rig) -> None:
    """useClientProtocolCases "use client protocol with h2": the backend sees HTTP/2.0."""
    async with h2c_backends(rig, http1=True) as backends:
        configure(rig, DestinationPolicy(f"app/{H2C}", "app/use-client-protocol", CLIENT_PROTOCOL))
        client, stream = await rig.tunnel(f"{H2C_VIP}:80")
        h2c = H2OverTunnelClient(stream, f"{H2C}:80")
        for _ in range(2):
            headers, body = await h2c.get("/proto")
            assert headers[":status"] == "200" and json.loads(body)["proto"] == "HTTP/2.0"
        assert sorted(p for b in backends for p in b.protocols) == ["HTTP/2.0", "HTTP/2.0"]
        await client.aclose()


async def test_without_use_client_protocol_an_h2_client_on_an_http11_port_is_spoken_http11(rig: Rig) -> None:
    async with h2c_backends(rig, http1=True) as backends:
        client, stream = await rig.tunnel(f"{H2C_VIP}:80")
        headers, body = await H2OverTunnelClient(stream, f"{H2C}:80").get("/proto")
        assert headers[":status"] == "200" and json.loads(body)["proto"] == "HTTP/1.1"
        assert [p for b in backends for p in b.protocols] == ["HTTP/1.1"]
        await client.aclose()


async def test_use_client_protocol_speaks_http11_upstream_for_an_http11_client(rig: Rig) -> None:
    """useClientProtocolCases "use client protocol with h1" on an HTTP/1.1 port, and on a port declared HTTP/2
    (the rule overrides the declaration, as Envoy's use_downstream_protocol_config does), also with an
    h2UpgradePolicy that would otherwise upgrade."""
    async with h2c_backends(rig, http1=True) as backends:
        both = TrafficPolicy(connection_pool=ConnectionPool(use_client_protocol=True, h2_upgrade=H2Upgrade.UPGRADE))
        configure(
            rig,
            DestinationPolicy(f"app/{H2C}", "app/use-client-protocol", both),
            DestinationPolicy(f"app/{WEB2}", "app/use-client-protocol-web2", CLIENT_PROTOCOL),
        )
        for vip, host in ((H2C_VIP, H2C), (WEB2_VIP, WEB2)):
            client, stream = await rig.tunnel(f"{vip}:80")
            status, _, body = await HttpOverTunnel(stream, host=host).request("GET", "/proto")
            assert status == 200 and json.loads(body)["proto"] == "HTTP/1.1", (host, body)
            await client.aclose()
        assert sorted(p for b in backends for p in b.protocols) == ["HTTP/1.1", "HTTP/1.1"]
