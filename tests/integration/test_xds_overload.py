"""Graceful overload of the xDS server over real grpc.aio on loopback TLS (issue 22): a stream beyond the server's
bound is refused at once with RESOURCE_EXHAUSTED and a retry hint, before it costs an authentication; the node
proxy's client waits the hint out instead of hammering; the stream already served keeps getting pushes; the
refused client gets in once there is room."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc  # type: ignore[import-untyped]
from tests.integration.test_xds_grpc import (
    DB,
    SERVER_NAME,
    SVC,
    TOKEN,
    WEB1,
    Pki,
    _authenticate,
    _client,
    _resources,
    _until,
    pki,
)

from ambit.api import discovery_pb2 as dpb
from ambit.xds.admission import Admission
from ambit.xds.callers import Caller
from ambit.xds.server import XdsServer
from ambit.xds.table import AddressTable

__all__ = ["pki"]  # the fixture, shared with test_xds_grpc


async def test_a_client_beyond_the_bound_is_refused_with_a_hint_and_the_served_one_stays_healthy(pki: Pki) -> None:
    authentications: list[object] = []

    def counting(metadata: object) -> Caller | None:
        authentications.append(metadata)
        return _authenticate(metadata)

    table = AddressTable(_resources(WEB1, SVC))
    server = XdsServer(
        table,
        counting,
        cert_chain_pem=pki.cert_pem,
        key_pem=pki.key_pem,
        host="127.0.0.1",
        port=0,
        admission=Admission(rate=50, max_streams=1, full_hint=1.0),
    )
    await server.start()
    first, second = _client(pki, server.port), _client(pki, server.port)
    try:
        await first.client.start()
        await _until(lambda: first.client.synced)
        await second.client.start()
        # The server counts the refusal when the stream arrives; the client learns it once the status has come.
        await _until(lambda: server.service.stats.refused >= 1 and bool(second.client.last_error))
        assert "RESOURCE_EXHAUSTED" in second.client.last_error and "too many xDS clients" in second.client.last_error
        assert len(authentications) == 1  # the refused stream cost no authentication
        started, connects = time.monotonic(), second.client.connects
        # The hint is 1-2 s: the refused client does not come back before it (its own back-off starts at 50 ms).
        table.replace(_resources(WEB1, SVC, DB))
        await _until(lambda: first.state.find_workload(DB.uid) == DB)  # the served client still gets pushes
        while time.monotonic() - started < 0.9:
            assert second.client.connects == connects
            await asyncio.sleep(0.05)
        await first.client.aclose()
        took = await _until(lambda: second.client.synced, within=15.0)
        assert second.state.find_workload(DB.uid) == DB
        assert 1 <= server.service.stats.refused <= 1 + (took + time.monotonic() - started) / 1.0 + 1
    finally:
        await first.client.aclose()
        await second.client.aclose()
        await server.aclose(grace=0)


async def test_a_raw_grpc_client_sees_the_refusal_and_its_pushback_trailer(pki: Pki) -> None:
    server = XdsServer(
        AddressTable(_resources(WEB1)),
        _authenticate,
        cert_chain_pem=pki.cert_pem,
        key_pem=pki.key_pem,
        host="127.0.0.1",
        port=0,
        admission=Admission(rate=0.001, burst=1, max_wait=0.0),  # one stream, then the next token is far away
    )
    await server.start()
    credentials = grpc.ssl_channel_credentials(root_certificates=pki.root_file.read_bytes())
    options = [("grpc.ssl_target_name_override", SERVER_NAME)]
    try:
        async with grpc.aio.secure_channel(f"127.0.0.1:{server.port}", credentials, options) as channel:
            method = channel.stream_stream(
                "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources",
                request_serializer=dpb.DeltaDiscoveryRequest.SerializeToString,
                response_deserializer=dpb.DeltaDiscoveryResponse.FromString,
            )
            metadata = (("authorization", f"Bearer {TOKEN}"),)
            served = method(metadata=metadata)
            await served.write(dpb.DeltaDiscoveryRequest(type_url="type.googleapis.com/istio.workload.Address"))
            assert (await served.read()).resources  # the first stream took the one token
            refused = method(metadata=metadata)
            await refused.write(dpb.DeltaDiscoveryRequest(type_url="type.googleapis.com/istio.workload.Address"))
            with contextlib.suppress(grpc.aio.AioRpcError):
                await refused.read()
            assert await refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            trailers = dict(await refused.trailing_metadata())
            assert int(trailers["grpc-retry-pushback-ms"]) >= 100  # the time to the next token, spread
            assert "rate limited" in await refused.details()
            served.cancel()
    finally:
        await server.aclose(grace=0)
