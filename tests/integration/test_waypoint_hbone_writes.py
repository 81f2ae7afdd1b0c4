"""How often the waypoint flushes its HBONE connections per request: one write per direction, no empty flushes
(see :mod:`ambit.proxy.hbone_stream`: a read owes a WINDOW_UPDATE only once per half window)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from tests.integration.waypoint_rig import CLIENT_IP, ECHO_VIP, HttpOverTunnel, Rig, started_rig

from ambit.proxy.hbone_session import HboneSession
from ambit.tls.socket_transport import TlsTransportKind
from ambit.waypoint.settings import WaypointLimits

LIMITS = WaypointLimits(max_head_bytes=8 * 1024, head_timeout=0.5, sniff_timeout=0.5, startup_wait=5.0)
REQUESTS = 20


@pytest.fixture
async def rig(tmp_path: Path, tls_transport: TlsTransportKind) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path, LIMITS, tls_transport) as rig:
        yield rig


class FlushCounter:
    """Counts :meth:`HboneSession.flush` calls on the waypoint's own connections (not the rig's client at
    ``CLIENT_IP`` nor its endpoints), and those that had bytes to write."""

    def __init__(self, rig_ips: frozenset[str]) -> None:
        self.rig_ips = rig_ips
        self.calls = 0
        self.writes = 0

    def wrap(self, flush: Callable[[HboneSession], None]) -> Callable[[HboneSession], None]:
        def counted(session: HboneSession) -> None:
            transport = session.transport
            sockname = transport.get_extra_info("sockname") if transport is not None else None
            if sockname is not None and sockname[0] not in self.rig_ips:
                self.calls += 1
                self.writes += bool(session.core.outgoing) and not session.held
            flush(session)

        return counted


async def test_a_keep_alive_request_costs_the_waypoint_one_hbone_flush_per_direction(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    for _ in range(3):  # the upstream connections are open and kept, the windows settled
        assert (await http.request("GET", "/echo"))[0] == 200
    counter = FlushCounter(frozenset({CLIENT_IP, *(endpoint.ip for endpoint in rig.endpoints)}))
    monkeypatch.setattr(HboneSession, "flush", counter.wrap(HboneSession.flush))
    for _ in range(REQUESTS):
        assert (await http.request("GET", "/echo"))[0] == 200
    # per request: the request to the endpoint, the response to the client; reads flush nothing
    assert counter.writes <= 2 * REQUESTS
    assert counter.calls <= 2 * REQUESTS + 2
    await client.aclose()
