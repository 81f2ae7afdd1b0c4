"""A hostile (or broken) external authorizer against the waypoint (AuthorizationPolicy CUSTOM): what its answer can
make the waypoint hold or pass on is bounded (:mod:`ambit.waypoint.ext_authz` rule 7). Every such answer is the
provider's error (403, empty, flag UAEX), never the authorizer's bytes, and the waypoint keeps serving."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.waypoint_rig import ECHO_VIP, H2C_TARGET_PORT, HttpOverTunnel, Rig, started_rig

from ambit.model.extauthz import ExtAuthzProvider, HeaderPattern, ProviderKind
from ambit.model.policy import Action, Policy, Rule, Scope
from ambit.model.routes import WaypointConfig
from ambit.waypoint.ext_authz import MAX_ANSWER_BODY, MAX_ANSWER_HEADERS
from ambit.waypoint.settings import WaypointLimits

LIMITS = WaypointLimits(max_head_bytes=8 * 1024, head_timeout=0.5, sniff_timeout=0.5, startup_wait=5.0)

ANSWERS = {
    # a 200 whose body never ends within the bound
    "endless-allow": b"HTTP/1.1 200 OK\r\nContent-Length: 104857600\r\n\r\n" + b"x" * (MAX_ANSWER_BODY * 2),
    # a denial with a body far over the bound: the client must not get it
    "huge-denial": b"HTTP/1.1 403 Forbidden\r\nContent-Length: 1048576\r\n\r\n" + b"y" * 1048576,
    # more headers than the waypoint takes
    "many-headers": b"HTTP/1.1 200 OK\r\n"
    + b"".join(b"x-h%d: v\r\n" % i for i in range(MAX_ANSWER_HEADERS + 1))
    + b"Content-Length: 0\r\n\r\n",
    # a head larger than the waypoint's head limit
    "huge-head": b"HTTP/1.1 200 OK\r\nx-big: " + b"z" * (64 * 1024) + b"\r\nContent-Length: 0\r\n\r\n",
    # not HTTP at all
    "garbage": b"\x00\x01\x02 not http\r\n\r\n",
    # a header value with a bare CR, to be forwarded upstream if the parser let it through
    "bare-cr": b"HTTP/1.1 200 OK\r\nx-up: a\rb\r\nContent-Length: 0\r\n\r\n",
}


async def _hostile(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        mode = next(
            (line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n") if line.startswith(b"x-mode:")),
            "",
        )
        writer.write(ANSWERS[mode])
        await writer.drain()
        await asyncio.sleep(0.5)
    except (ConnectionError, asyncio.IncompleteReadError, KeyError):
        pass
    finally:
        writer.close()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    server = await asyncio.start_server(_hostile, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with started_rig(tmp_path, LIMITS) as rig:
            for endpoint in rig.endpoints:
                endpoint.extra[H2C_TARGET_PORT] = port
            ext = ExtAuthzProvider(
                "hostile",
                ProviderKind.HTTP,
                "app/h2c.app.svc.cluster.local",
                80,
                timeout=5.0,
                include_request_headers=(HeaderPattern("x-mode"),),
                headers_to_upstream_on_allow=(HeaderPattern("x-up"),),
            )
            custom = Policy("ext", "app", Scope.WAYPOINT, Action.CUSTOM, (Rule(),), ext_authz=ext)
            rig.waypoint.context.routes.replace(WaypointConfig("app/waypoint", policies=(custom,)))
            yield rig
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await server.wait_closed()


async def call(rig: Rig, mode: str) -> tuple[int, bytes]:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    try:
        status, _, body = await HttpOverTunnel(stream).request("GET", "/echo", headers=[("x-mode", mode)])
        return status, body
    finally:
        await client.aclose()


@pytest.mark.parametrize("mode", sorted(ANSWERS))
async def test_a_hostile_answer_is_the_providers_error_and_the_waypoint_keeps_serving(rig: Rig, mode: str) -> None:
    assert await call(rig, mode) == (403, b"")
    assert await call(rig, mode) == (403, b"")  # the broken connection was not kept for the next check
