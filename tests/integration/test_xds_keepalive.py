"""Keepalive on the control-plane connection (issue 24): an idle ADS stream pinged every 30 s by a client on another
HTTP/2 implementation (h2) survives for minutes, and the node proxy's xDS client notices a control plane that went
silent (a TCP relay that stops forwarding) within its stated bound and reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import ssl
import struct
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest
from tests.integration.tcp_relay import Relay

from ambit.api import discovery_pb2 as dpb
from ambit.controlplane.addresses import addresses
from ambit.model.localconfig import LocalConfig
from ambit.model.state import WorkloadState
from ambit.model.workload import Workload
from ambit.tls.certs import issue_server_cert, new_ca
from ambit.xds.callers import Caller
from ambit.xds.client import Backoff, XdsClient
from ambit.xds.convert import ADDRESS_TYPE_URL
from ambit.xds.keepalive import DEFAULT_KEEPALIVE, KeepaliveSettings
from ambit.xds.server import XdsServer
from ambit.xds.session import METHOD, SERVICE_NAME
from ambit.xds.table import AddressTable

SERVER_NAME = "istiod.istio-system.svc"
TOKEN = "node-a-token"


def _pod(name: str, ip: str) -> Workload:
    return Workload(
        uid=f"Kubernetes//Pod/shop/{name}", name=name, namespace="shop", addresses=(ipaddress.ip_address(ip),)
    )


def _table(*workloads: Workload) -> dict[str, tuple[str, object]]:
    return addresses(LocalConfig(workloads, ()))  # type: ignore[return-value]


def _authenticate(metadata: object) -> Caller | None:
    values = dict(metadata)  # type: ignore[call-overload]
    if values.get("authorization") == f"Bearer {TOKEN}":
        return Caller("system:serviceaccount:istio-system:ztunnel", values.get("clusterid", ""))
    return None


@dataclass
class Pki:
    root_file: Path
    cert_pem: bytes
    key_pem: bytes
    token_file: Path


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    now = time.time()
    ca = new_ca("test mesh root", now=now)
    server = issue_server_cert(ca, common_name="istiod", dns_names=[SERVER_NAME], ip_addresses=[], now=now)
    (tmp_path / "root.pem").write_bytes(ca.cert_pem)
    (tmp_path / "token").write_text(TOKEN)
    return Pki(tmp_path / "root.pem", server.cert_pem + ca.cert_pem, server.key_pem, tmp_path / "token")


@pytest.fixture
async def server(pki: Pki) -> AsyncIterator[tuple[AddressTable, XdsServer]]:
    table = AddressTable(_table(_pod("web-1", "198.18.200.1")))  # type: ignore[arg-type]
    xds = XdsServer(table, _authenticate, cert_chain_pem=pki.cert_pem, key_pem=pki.key_pem, host="127.0.0.1", port=0)
    await xds.start()
    yield table, xds
    await xds.aclose(grace=1.0)


# An ADS client on h2 (not gRPC's HTTP/2): TLS with ALPN h2, gRPC length-prefixed messages on one stream.


def _grpc_message(message: dpb.DeltaDiscoveryRequest) -> bytes:
    body = message.SerializeToString()
    return struct.pack(">?I", False, len(body)) + body


@dataclass
class H2AdsClient:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    conn: h2.connection.H2Connection
    stream_id: int = 1
    buffer: bytes = b""
    inbox: bytes = b""
    responses: list[dpb.DeltaDiscoveryResponse] = field(default_factory=list)
    pings_acked: int = 0
    pings_received: int = 0
    terminated: h2.events.ConnectionTerminated | None = None
    stream_ended: bool = False

    async def flush(self) -> None:
        self.writer.write(self.conn.data_to_send())
        await self.writer.drain()

    async def send(self, request: dpb.DeltaDiscoveryRequest) -> None:
        self.conn.send_data(self.stream_id, _grpc_message(request))
        await self.flush()

    async def ping(self) -> None:
        self.conn.ping(struct.pack(">Q", time.monotonic_ns() & (2**64 - 1)))
        await self.flush()

    async def pump(self, until: Callable[[], bool], seconds: float) -> None:
        """Read frames, answering what h2 answers itself (PING ACKs, WINDOW_UPDATEs), until ``until()`` holds."""
        async with asyncio.timeout(seconds):
            while not until():
                data = await self.reader.read(65536)
                if not data:
                    raise AssertionError("the server closed the connection")
                self.inbox += data
                # One frame at a time, so that a GOAWAY is seen even when frames h2 refuses after it follow.
                while len(self.inbox) >= 9 and len(self.inbox) >= 9 + int.from_bytes(self.inbox[:3], "big"):
                    size = 9 + int.from_bytes(self.inbox[:3], "big")
                    frame, self.inbox = self.inbox[:size], self.inbox[size:]
                    if self.terminated is not None:
                        continue  # after GOAWAY: only trailers and the like, nothing to answer
                    for event in self.conn.receive_data(frame):
                        self._on(event)
                await self.flush()

    def _on(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.DataReceived):
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            self.buffer += event.data
            while len(self.buffer) >= 5:
                _, length = struct.unpack(">?I", self.buffer[:5])
                if len(self.buffer) < 5 + length:
                    break
                self.responses.append(dpb.DeltaDiscoveryResponse.FromString(self.buffer[5 : 5 + length]))
                self.buffer = self.buffer[5 + length :]
        elif isinstance(event, h2.events.PingAckReceived):
            self.pings_acked += 1
        elif isinstance(event, h2.events.PingReceived):
            self.pings_received += 1
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.terminated = event
        elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
            self.stream_ended = True


async def _open_h2_ads(pki: Pki, port: int) -> H2AdsClient:
    context = ssl.create_default_context(cafile=str(pki.root_file))
    context.set_alpn_protocols(["h2"])
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname=SERVER_NAME)
    assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    conn.send_headers(
        1,
        [
            (":method", "POST"),
            (":scheme", "https"),
            (":path", f"/{SERVICE_NAME}/{METHOD}"),
            (":authority", SERVER_NAME),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("authorization", f"Bearer {TOKEN}"),
            ("clusterid", "Kubernetes"),
        ],
    )
    client = H2AdsClient(reader, writer, conn)
    await client.flush()
    return client


PING_EVERY = 30.0
PINGS = 7
"""Pings at 0, 30, ..., 180 s: three minutes of an idle stream."""


@pytest.mark.slow
@pytest.mark.timeout(230)
async def test_an_idle_ads_stream_pinged_every_30s_by_an_h2_client_survives_minutes_without_goaway(
    pki: Pki, server: tuple[AddressTable, XdsServer]
) -> None:
    """gRPC's default enforcement answers such a client with GOAWAY ENHANCE_YOUR_CALM ("too_many_pings") about two
    minutes in; istiod's tolerance of a ping every 15 s keeps the stream."""
    table, xds = server
    client = await _open_h2_ads(pki, xds.port)
    try:
        await client.send(dpb.DeltaDiscoveryRequest(type_url=ADDRESS_TYPE_URL, node=dpb.Node(id="h2-node")))
        await client.pump(lambda: bool(client.responses), seconds=10.0)
        first = client.responses[0]
        assert first.type_url == ADDRESS_TYPE_URL and [r.name for r in first.resources] == [
            "Kubernetes//Pod/shop/web-1"
        ]
        await client.send(dpb.DeltaDiscoveryRequest(type_url=ADDRESS_TYPE_URL, response_nonce=first.nonce))
        started = time.monotonic()
        for sent in range(1, PINGS + 1):
            await client.ping()
            await client.pump(lambda n=sent: client.pings_acked >= n, seconds=10.0)  # type: ignore[misc]
            if sent == PINGS:
                break
            # Idle until the next ping, still reading: a GOAWAY would show up here.
            with contextlib.suppress(TimeoutError):
                await client.pump(lambda: client.terminated is not None or client.stream_ended, seconds=PING_EVERY)
            assert client.terminated is None, f"server sent GOAWAY {client.terminated} after {sent} pings"
            assert not client.stream_ended, "the ADS stream was ended by the server"
        assert time.monotonic() - started >= 180.0
        assert client.pings_acked == PINGS and client.terminated is None
        # Still the same live stream: a change is pushed on it.
        table.replace(_table(_pod("web-1", "198.18.200.1"), _pod("web-2", "198.18.200.2")))  # type: ignore[arg-type]
        await client.pump(lambda: len(client.responses) >= 2, seconds=10.0)
        assert [r.name for r in client.responses[1].resources] == ["Kubernetes//Pod/shop/web-2"]
        assert xds.service.stats.streams == 1 and xds.service.stats.stream_errors == 0
    finally:
        client.writer.transport.abort()  # no TLS close_notify dance: the server would keep us waiting


async def test_a_client_pinging_faster_than_every_15s_is_sent_goaway_enhance_your_calm(
    pki: Pki, server: tuple[AddressTable, XdsServer]
) -> None:
    """The tolerance is bounded: anyone who can reach :15012 (pings come before authentication) and floods PINGs is
    cut off after gRPC's two strikes, as istiod does."""
    _, xds = server
    client = await _open_h2_ads(pki, xds.port)
    try:
        await client.send(dpb.DeltaDiscoveryRequest(type_url=ADDRESS_TYPE_URL))
        await client.pump(lambda: bool(client.responses), seconds=10.0)
        started = time.monotonic()
        with contextlib.suppress(AssertionError):  # the server may close the socket right after its GOAWAY
            for _ in range(20):
                await client.ping()
                with contextlib.suppress(TimeoutError):
                    await client.pump(lambda: client.terminated is not None, seconds=0.2)
                if client.terminated is not None:
                    break
        assert client.terminated is not None, "a ping flood was tolerated"
        assert client.terminated.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        assert time.monotonic() - started < 5.0
    finally:
        client.writer.transport.abort()  # no TLS close_notify dance: the server would keep us waiting


# A silently dead control plane: a TCP relay (tests.integration.tcp_relay) that stops forwarding, closing nothing.


async def _until(condition: Callable[[], bool], seconds: float) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > seconds:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


def test_the_default_detection_bound_is_istiods_keepalive_time_plus_timeout() -> None:
    assert DEFAULT_KEEPALIVE.detection_bound == 40.0
    options = dict(DEFAULT_KEEPALIVE.server_options())
    assert options["grpc.http2.min_ping_interval_without_data_ms"] == 15000
    assert options["grpc.keepalive_permit_without_calls"] == 1
    client = dict(DEFAULT_KEEPALIVE.client_options())
    assert client["grpc.keepalive_time_ms"] == 30000 and client["grpc.keepalive_timeout_ms"] == 10000


@pytest.mark.slow
async def test_the_xds_client_detects_a_silent_control_plane_within_its_bound_and_reconnects(pki: Pki) -> None:
    """Scaled-down keepalive (ping after 2 s idle, 1 s for the ACK) so the bound, 3 s, is quick to test."""
    table = AddressTable(_table(_pod("web-1", "198.18.200.1")))  # type: ignore[arg-type]
    settings = KeepaliveSettings(time=2.0, timeout=1.0, min_peer_ping_interval=1.0)
    # The server tolerates the faster pings too (its enforcement scaled the same way).
    fast = XdsServer(
        table,
        _authenticate,
        cert_chain_pem=pki.cert_pem,
        key_pem=pki.key_pem,
        host="127.0.0.1",
        port=0,
        keepalive=settings,
    )
    await fast.start()
    relay = Relay(fast.port)
    await relay.start()
    state = WorkloadState()
    client = XdsClient(
        f"127.0.0.1:{relay.port}",
        state,
        lambda: None,
        root_cert_file=pki.root_file,
        token_file=pki.token_file,
        cluster_id="Kubernetes",
        server_name=SERVER_NAME,
        backoff=Backoff(initial=0.05, maximum=0.3),
        keepalive=settings,
    )
    await client.start()
    try:
        await _until(lambda: client.synced and client.connected, seconds=10.0)
        assert client.connects == 1
        relay.freeze()
        frozen_at = time.monotonic()
        table.replace(_table(_pod("web-1", "198.18.200.1"), _pod("web-2", "198.18.200.2")))  # type: ignore[arg-type]
        detected = await _until(lambda: client.connects >= 2, seconds=settings.detection_bound + 10.0)
        # Slack for the back-off (at most 0.3 s) and a loaded machine.
        assert detected <= settings.detection_bound + 2.0, f"noticed after {detected:.1f}s"
        await _until(lambda: state.find_workload("Kubernetes//Pod/shop/web-2") is not None, seconds=10.0)
        assert relay.connections >= 2
        print(f"silent control plane noticed after {time.monotonic() - frozen_at:.2f}s (bound 3 s)")
    finally:
        await client.aclose()
        await relay.aclose()
        await fast.aclose(grace=0.5)
