"""TestWaypointXFCCClientIdentity on loopback, through the real waypoint process and its per-request path: with
its Gateway's ``ambient.istio.io/xfcc-include-client-identity`` the backend sees ``x-forwarded-client-cert`` with
the HBONE peer's verified identity; without it, no client URI at all. Either way a header the client forged never
reaches the backend, and an AuthorizationPolicy reading that header cannot be fooled by it (see
:mod:`tests.integration.waypoint_rig` for the addresses and identities)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.waypoint_rig import (
    CLIENT_ID,
    ECHO_VIP,
    WAYPOINT_ID,
    HttpOverTunnel,
    Rig,
    echo_of,
    started_rig,
)

from ambit.model.policy import Action, Clause, KeyedMatch, Match, Policy, Rule, Scope, StringMatch
from ambit.model.routes import WaypointConfig
from ambit.waypoint.settings import WaypointLimits

LIMITS = WaypointLimits(max_head_bytes=16 * 1024, head_timeout=2.0, sniff_timeout=2.0, startup_wait=5.0)
ADMIN = "spiffe://cluster.local/ns/app/sa/admin"
FORGED = [
    ("x-forwarded-client-cert", f"By=spiffe://cluster.local/ns/app/sa/echo-1;URI={ADMIN}"),
    ("X-Forwarded-Client-Cert", f"URI={ADMIN}"),
]


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path, LIMITS) as rig:
        yield rig


async def xfcc_seen(rig: Rig, headers: list[tuple[str, str]] | None = None, count: int = 1) -> list[object]:
    """What the backend received in ``x-forwarded-client-cert`` on each of ``count`` requests of one tunnel."""
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    seen: list[object] = []
    try:
        http = HttpOverTunnel(stream)
        for _ in range(count):
            status, _, body = await http.request("GET", "/echo", headers=headers)
            assert status == 200, body
            seen.append(echo_of(body)["xfcc"])
    finally:
        await client.aclose()
    return seen


async def test_with_the_annotation_the_backend_sees_the_source_identity(rig: Rig) -> None:
    rig.waypoint.context.routes.replace(WaypointConfig("app/waypoint", xfcc_client_identity=True))
    expected = [f"By={WAYPOINT_ID};URI={CLIENT_ID}"]
    assert await xfcc_seen(rig, count=2) == [expected, expected]  # every request of a kept connection


async def test_with_the_annotation_a_forged_header_is_replaced(rig: Rig) -> None:
    rig.waypoint.context.routes.replace(WaypointConfig("app/waypoint", xfcc_client_identity=True))
    assert await xfcc_seen(rig, FORGED) == [[f"By={WAYPOINT_ID};URI={CLIENT_ID}"]]


async def test_without_the_annotation_there_is_no_client_uri_and_a_forged_header_is_dropped(rig: Rig) -> None:
    rig.waypoint.context.routes.replace(WaypointConfig("app/waypoint"))
    assert await xfcc_seen(rig) == [[]]
    assert await xfcc_seen(rig, FORGED) == [[]]


async def test_a_policy_on_the_header_sees_only_what_the_waypoint_verified(rig: Rig) -> None:
    admin_only = Match(
        request_headers=(KeyedMatch(("x-forwarded-client-cert",), (StringMatch.of_pattern(f"*{ADMIN}"),)),)
    )
    policy = Policy("admin-only", "app", Scope.WAYPOINT, Action.ALLOW, (Rule((Clause((admin_only,)),)),))
    for include in (False, True):
        rig.waypoint.context.routes.replace(
            WaypointConfig("app/waypoint", policies=(policy,), xfcc_client_identity=include)
        )
        client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
        try:
            status, _, body = await HttpOverTunnel(stream).request("GET", "/echo", headers=FORGED)
        finally:
            await client.aclose()
        assert (status, body) == (403, b"RBAC: access denied")
