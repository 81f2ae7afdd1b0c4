"""A node proxy's xDS client in on-demand mode (``XDS_ON_DEMAND``) against the real server over grpc.aio on
loopback TLS: it holds nothing at start, each demand is answered (found, or known absent), what it asked for keeps
being pushed, a control-plane restart resubscribes, and a demand with no server fails in bounded time."""

from __future__ import annotations

import time
from dataclasses import replace

from tests.integration.test_xds_grpc import (
    DB,
    FAST,
    SERVER_NAME,
    SVC,
    WEB1,
    WEB2,
    Pki,
    _pod,
    _resources,
    _start_server,
    _until,
    pki,
)

from ambit.model.state import WorkloadState
from ambit.model.workload import PortMapping, Workload
from ambit.xds.client import XdsClient
from ambit.xds.table import AddressTable

__all__ = ["pki"]  # the fixture, shared with test_xds_grpc


def _endpoint(pod: Workload) -> Workload:
    return replace(pod, services={SVC.key: (PortMapping(80, 8080),)})


E1, E2 = _endpoint(WEB1), _endpoint(WEB2)


def _on_demand_client(pki: Pki, port: int, state: WorkloadState) -> XdsClient:
    return XdsClient(
        f"127.0.0.1:{port}",
        state,
        lambda: None,
        root_cert_file=pki.root_file,
        token_file=pki.token_file,
        cluster_id="Kubernetes",
        node_id="node-a",
        server_name=SERVER_NAME,
        backoff=FAST,
        on_demand=True,
    )


async def test_an_on_demand_client_gets_what_it_asks_for_and_keeps_getting_its_changes(pki: Pki) -> None:
    table = AddressTable(_resources(E1, E2, DB, SVC))
    server = await _start_server(pki, table)
    state = WorkloadState()
    client = _on_demand_client(pki, server.port, state)
    await client.start()
    try:
        await _until(lambda: client.synced)
        assert state.workloads() == [] and state.services() == []

        started = time.monotonic()
        assert await client.demand(["/198.18.210.1"], 5.0)  # the Service's VIP: it and its endpoints
        took = time.monotonic() - started
        assert {w.uid for w in state.workloads()} == {E1.uid, E2.uid} and state.services() == [SVC]
        assert await client.demand(["/198.18.99.99"], 5.0)  # nothing there: answered all the same
        assert await client.demand(["/198.18.210.1"], 0.0)  # asked before: answered at once
        print(f"\non-demand lookup over loopback TLS: {took * 1000:.1f} ms")

        e3 = _endpoint(_pod("web-3", "198.18.200.4"))
        table.replace(_resources(E1, E2, e3, replace(DB, node="node-b"), SVC))
        await _until(lambda: state.find_workload(e3.uid) == e3)  # a new endpoint of what was asked
        assert state.find_workload(DB.uid) is None  # never asked for

        await server.aclose(grace=0)
        assert not await client.demand(["/198.18.200.3"], 0.3)  # no server: bounded, False
        restarted_table = AddressTable(_resources(E1, e3, DB, SVC))
        restarted = await _start_server(pki, restarted_table, port=server.port)
        try:
            await _until(lambda: state.find_workload(E2.uid) is None)  # the restart's difference
            await _until(lambda: state.find_workload(DB.uid) is not None)  # the demand made while it was down
            moved = replace(e3, node="node-z")
            restarted_table.replace(_resources(E1, moved, DB, SVC))
            await _until(lambda: state.find_workload(e3.uid) == moved)
        finally:
            await restarted.aclose(grace=1.0)
    finally:
        await client.aclose()
        await server.aclose(grace=0)
