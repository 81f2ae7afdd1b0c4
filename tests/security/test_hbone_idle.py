"""Established HBONE connections that do not do their part are closed (issue 14: no parked connections).

Once TLS is done a connection holds its listener's place until someone closes it. An attacker with a mesh
certificate (a compromised workload) could otherwise park connections up to the listener's caps: ones that never
send the HTTP/2 preface, ones that send the preface and SETTINGS and then nothing, ones that stop reading. Each
listener holds them to the deadlines of :mod:`ambit.hbone.liveness` (made small here through the listener's
settings): the preface deadline, the idle timeout for a connection with no open stream (a graceful GOAWAY), and a
PING keepalive. Replayed over real sockets and mutual TLS on loopback against the three listeners that share
:class:`~ambit.proxy.hbone_server.HboneServer` (a pod's 15008, the self-proxy's 15008, a waypoint's 15008), and,
for the other side of it, a tunnel relaying data (and one left quiet) is never cut by the idle timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest
from tests.security.listener_flood import dial_from, loopback_addresses
from tests.security.listener_rigs import LIMITS, LISTENERS, TD, Target, pod_listener
from tests.supervision import until_true

from ambit.hbone import wire
from ambit.hbone.liveness import LivenessSettings
from ambit.inpod.eventloop import run
from ambit.model.identity import SpiffeId
from ambit.proxy.admission import ListenerLimits
from ambit.proxy.hbone_client import HboneClient
from ambit.proxy.hbone_session import GOAWAY_GRACE

pytestmark = pytest.mark.timeout(60)

PREFACE_TIMEOUT = 0.5
IDLE_TIMEOUT = 0.6
SLACK = 1.5
"""Seconds a close may come after its deadline on a loaded 2-core machine (milliseconds unloaded)."""
SILENT = 8
"""Connections the attacker parks at once."""


def limits(**liveness: float) -> ListenerLimits:
    return dataclasses.replace(LIMITS, liveness=LivenessSettings(**liveness))


@contextlib.asynccontextmanager
async def tls_connection(
    target: Target, source: str
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """An attacker's connection: mutual TLS with a valid mesh certificate, ALPN h2, and nothing sent after it."""
    sock = await dial_from(source, target.addr)
    reader, writer = await asyncio.open_connection(
        sock=sock, ssl=target.client_cert.client_context(), server_hostname=""
    )
    try:
        yield reader, writer
    finally:
        writer.transport.abort()


async def read_until_closed(reader: asyncio.StreamReader, give_up: float) -> tuple[float, bytes]:
    """Read what the server sends until it closes the connection: when that was (``time.monotonic``), and the
    bytes."""
    got = b""
    async with asyncio.timeout(give_up):
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await reader.read(65536):
                got += chunk
    return time.monotonic(), got


async def park(
    stack: contextlib.AsyncExitStack, target: Target, sources: list[str]
) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]]:
    """An attacker's connection from each of ``sources``, with when its TLS handshake was done."""
    parked = []
    for source in sources:
        reader, writer = await stack.enter_async_context(tls_connection(target, source))
        parked.append((reader, writer, time.monotonic()))
    return parked


def frames(data: bytes) -> list[tuple[int, int, bytes]]:
    """(type, stream, payload) of each HTTP/2 frame in ``data`` (the server's side: no preface)."""
    found, pos = [], 0
    while pos + 9 <= len(data):
        high, low, kind, _flags, stream = wire.HEADER.unpack_from(data, pos)
        length = (high << 8) | low
        found.append((kind, stream & wire.STREAM_ID_MASK, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return found


def goaway_codes(data: bytes) -> list[int]:
    return [struct.unpack(">II", payload[:8])[1] for kind, _, payload in frames(data) if kind == wire.GOAWAY]


# --- the attacks -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(LISTENERS))
async def test_connections_that_finish_tls_and_stay_silent_are_closed_at_the_preface_deadline(
    kind: str, tmp_path: Path
) -> None:
    settings = limits(preface_timeout=PREFACE_TIMEOUT, idle_timeout=0, keepalive_interval=0)
    async with LISTENERS[kind](tmp_path, limits=settings) as target:
        client, round_trip = await target.tunnel()  # a legitimate connection with a tunnel, all along
        base = target.gate.connections
        async with contextlib.AsyncExitStack() as stack:
            parked = await park(stack, target, loopback_addresses(SILENT, third=9))
            await until_true(lambda: target.gate.pending == 0, "the server to judge the attacker's handshakes", 2.0)
            assert target.gate.connections == base + SILENT
            ends = await asyncio.gather(
                *(read_until_closed(reader, PREFACE_TIMEOUT + SLACK + 2) for reader, _, _ in parked)
            )
        for (closed_at, _), (_, _, opened) in zip(ends, parked, strict=True):
            took = closed_at - opened
            assert PREFACE_TIMEOUT - 0.1 <= took <= PREFACE_TIMEOUT + SLACK, took
        await until_true(lambda: target.gate.connections == base, "the silent connections' places back", 2.0)
        assert await round_trip(b"still here") == b"still here"
        await client.aclose()


async def test_a_connection_that_sends_the_preface_and_settings_and_nothing_else_is_closed_when_idle(
    tmp_path: Path,
) -> None:
    settings = limits(preface_timeout=PREFACE_TIMEOUT, idle_timeout=IDLE_TIMEOUT, keepalive_interval=0)
    async with pod_listener(tmp_path, limits=settings) as target:
        async with contextlib.AsyncExitStack() as stack:
            parked = await park(stack, target, loopback_addresses(SILENT, third=10))
            for _, writer, _ in parked:
                writer.write(wire.PREFACE + wire.settings_frame([]))
            ends = await asyncio.gather(
                *(read_until_closed(reader, IDLE_TIMEOUT + GOAWAY_GRACE + SLACK + 2) for reader, _, _ in parked)
            )
        for (closed_at, said), (_, _, opened) in zip(ends, parked, strict=True):
            took = closed_at - opened
            assert IDLE_TIMEOUT - 0.1 <= took <= IDLE_TIMEOUT + GOAWAY_GRACE + SLACK, took
            assert goaway_codes(said)[:1] == [wire.NO_ERROR], frames(said)  # a graceful GOAWAY first
        await until_true(lambda: target.gate.connections == 0, "the idle connections' places back", 2.0)


@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_an_http2_client_that_stops_reading_is_dropped_when_its_ping_goes_unanswered(
    loop_name: str, tmp_path: Path
) -> None:
    """The idle timeout is long here: the keepalive alone ends it (on uvloop too, which the node proxy runs on)."""
    run(lambda: unanswered_keepalive(tmp_path), loop_name)


async def unanswered_keepalive(tmp_path: Path) -> None:
    interval, timeout = 0.3, 0.5
    settings = limits(
        preface_timeout=PREFACE_TIMEOUT, idle_timeout=60, keepalive_interval=interval, keepalive_timeout=timeout
    )
    async with (
        pod_listener(tmp_path, limits=settings) as target,
        tls_connection(target, "127.0.11.1") as (_, writer),
    ):
        writer.write(wire.PREFACE + wire.settings_frame([]))
        await until_true(lambda: target.gate.connections == 1, "the connection to be established", 2.0)
        transport = cast(asyncio.Transport, writer.transport)  # uvloop's is one without the subclass
        transport.pause_reading()  # our PING's ACK will never come
        started = time.monotonic()
        await until_true(
            lambda: target.gate.connections == 0, "the unanswered keepalive to end the connection", 2 * SLACK + 2
        )
        took = time.monotonic() - started
        assert interval + timeout - 0.2 <= took <= 2 * interval + timeout + SLACK, took


async def test_an_http2_client_without_a_tunnel_is_sent_away_gracefully_when_idle(tmp_path: Path) -> None:
    """A real client (it answers PINGs): the keepalive keeps it, the idle timer sends it a GOAWAY, and it goes."""
    settings = limits(
        preface_timeout=PREFACE_TIMEOUT, idle_timeout=IDLE_TIMEOUT, keepalive_interval=0.2, keepalive_timeout=0.5
    )
    async with pod_listener(tmp_path, limits=settings) as target:
        sock = await dial_from("127.0.0.1", target.addr)
        web = SpiffeId(TD, "apps", "web")  # the rig's pod
        client = await HboneClient.connect(sock, target.client_cert, frozenset({web}), trust_domain=TD)
        try:
            started = time.monotonic()
            await until_true(
                lambda: target.gate.connections == 0, "the idle connection to be closed", IDLE_TIMEOUT + 3 * SLACK
            )
            assert time.monotonic() - started >= IDLE_TIMEOUT - 0.2
        finally:
            await client.aclose()


# --- and what must not be cut --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(LISTENERS))
async def test_a_tunnel_relaying_data_or_left_quiet_is_never_closed_by_the_idle_timer(
    kind: str, tmp_path: Path
) -> None:
    idle = 0.3
    settings = limits(preface_timeout=PREFACE_TIMEOUT, idle_timeout=idle, keepalive_interval=0.2, keepalive_timeout=0.5)
    async with LISTENERS[kind](tmp_path, limits=settings) as target:
        client, round_trip = await target.tunnel()
        loop = asyncio.get_running_loop()
        until = loop.time() + 6 * idle
        n = 0
        while loop.time() < until:  # relaying, for six idle timeouts
            payload = f"round trip {n}".encode()
            assert await round_trip(payload) == payload
            n += 1
            await asyncio.sleep(idle / 5)  # the client's pace
        await asyncio.sleep(4 * idle)  # the scenario: the tunnel open and quiet for four idle timeouts
        assert await round_trip(b"after the quiet") == b"after the quiet"
        assert target.gate.connections == 1
        await client.aclose()
