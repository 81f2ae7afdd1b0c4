"""Authorization in the waypoint process on loopback: per request over HBONE (403 ``RBAC: access denied``), per
connection for TCP, with the policies a WaypointConfig carries (see :mod:`tests.integration.waypoint_rig`)."""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.waypoint_rig import (
    CLIENT_IP,
    ECHO_VIP,
    RAW_VIP,
    TD,
    HttpOverTunnel,
    Rig,
    http_get,
    read_until_eof,
    started_rig,
)

from ambit.model.identity import SpiffeId
from ambit.model.policy import Action, Clause, KeyedMatch, Match, Policy, Rule, Scope, StringMatch
from ambit.model.routes import WaypointConfig
from ambit.proxy.hbone_client import TunnelRefusedError
from ambit.waypoint.settings import WaypointLimits

LIMITS = WaypointLimits(max_head_bytes=8 * 1024, head_timeout=0.5, sniff_timeout=0.5, startup_wait=5.0)
ECHO_KEY = "app/echo.app.svc.cluster.local"


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path, LIMITS) as rig:
        yield rig


def policy(
    name: str, action: Action, *matches: Match, scope: Scope = Scope.WAYPOINT, services: tuple[str, ...] = ()
) -> Policy:
    return Policy(name, "app", scope, action, (Rule(tuple(Clause((m,)) for m in matches)),), services=services)


def configure(rig: Rig, *policies: Policy) -> None:
    rig.waypoint.context.routes.replace(WaypointConfig("app/waypoint", policies=policies))


async def status_of(
    rig: Rig, method: str, path: str, headers: list[tuple[str, str]] | None = None
) -> tuple[int, bytes]:
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    try:
        status, _, body = await HttpOverTunnel(stream).request(method, path, headers=headers)
        return status, body
    finally:
        await client.aclose()


async def test_the_l7_table_of_allow_deny_paths_methods_and_headers(rig: Rig) -> None:
    configure(
        rig,
        policy("allow-echo", Action.ALLOW, Match(paths=(StringMatch.prefix("/echo"),))),
        policy("deny-post", Action.DENY, Match(methods=("POST",))),
        policy(
            "deny-header",
            Action.DENY,
            Match(request_headers=(KeyedMatch(("x-env",), (StringMatch.exact("dev"),)),)),
        ),
    )
    assert (await status_of(rig, "GET", "/echo"))[0] == 200
    assert await status_of(rig, "GET", "/other") == (403, b"RBAC: access denied")
    assert (await status_of(rig, "POST", "/echo"))[0] == 403  # an explicit DENY beats the ALLOW
    assert (await status_of(rig, "GET", "/echo", [("x-env", "dev")]))[0] == 403
    assert (await status_of(rig, "GET", "/echo", [("x-env", "prod")]))[0] == 200
    # dot segments and encoded unreserved characters do not get around the path rules
    assert (await status_of(rig, "GET", "/echo/../other"))[0] == 403
    assert (await status_of(rig, "GET", "/%65cho"))[0] == 200
    assert (await status_of(rig, "GET", "/x/..%2F..%2Fecho"))[0] == 403


async def test_path_templates_allow_and_deny_at_a_real_waypoint(rig: Rig) -> None:
    configure(
        rig,
        policy("allow-items", Action.ALLOW, Match(path_templates=("/echo/{*}/items/{**}",))),
        policy("deny-admin", Action.DENY, Match(path_templates=("/echo/{*}/items/admin/{**}",))),
    )

    async def denied(path: str) -> bool:
        return await status_of(rig, "GET", path) == (403, b"RBAC: access denied")

    assert not await denied("/echo/v1/items/")
    assert not await denied("/echo/v1/items/42?colour=red"), "the query is not matched"
    assert not await denied("/echo/v1/x/../items/1"), "matched after normalization"
    assert await denied("/echo/v1/items/admin/users")
    assert await denied("/echo/v1/v2/items/42"), "{*} is one segment"
    assert await denied("/echo/v1/items")


async def test_identity_rules_use_the_tunnel_peer(rig: Rig) -> None:
    configure(
        rig, policy("only-client", Action.ALLOW, Match(principals=(StringMatch.exact(f"{TD}/ns/app/sa/client"),)))
    )
    assert (await status_of(rig, "GET", "/echo"))[0] == 200
    rig.client_cert = await rig.ca.fetch_certificate(SpiffeId(TD, "app", "intruder"))
    assert (await status_of(rig, "GET", "/echo"))[0] == 403


async def test_a_service_policy_applies_to_its_service_only(rig: Rig) -> None:
    configure(
        rig,
        policy(
            "deny-other",
            Action.DENY,
            Match(paths=(StringMatch.presence(),)),
            scope=Scope.SERVICE,
            services=("app/nothing.app.svc.cluster.local",),
        ),
    )
    assert (await status_of(rig, "GET", "/echo"))[0] == 200
    configure(
        rig,
        policy(
            "deny-echo", Action.DENY, Match(paths=(StringMatch.presence(),)), scope=Scope.SERVICE, services=(ECHO_KEY,)
        ),
    )
    assert (await status_of(rig, "GET", "/echo"))[0] == 403
    status, text = await http_get(f"http://127.0.0.1:{rig.settings.admin_port}/config_dump")
    assert status == 200 and '"app/deny-echo"' in text and '"SERVICE"' in text


async def test_denials_are_logged_with_the_policy_and_no_flag(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    """Envoy's HTTP RBAC filter sets no response flag (the RBAC flag is its network filter's): the matched policy
    is in the response code details."""
    caplog.set_level("INFO", logger="access")
    configure(rig, policy("deny-all", Action.DENY, Match(paths=(StringMatch.presence(),))))
    assert (await status_of(rig, "GET", "/echo"))[0] == 403
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("request ")]
    assert any(
        "response_code=403" in line and "response_flags=-" in line and "policy[app/deny-all]" in line for line in lines
    ), lines


async def test_tcp_through_the_waypoint_is_checked_once_per_connection(rig: Rig) -> None:
    client = await rig.client()
    # An ALLOW whose only rule is L7 never matches TCP: the connection is refused.
    configure(rig, policy("allow-get", Action.ALLOW, Match(methods=("GET",))))
    with pytest.raises(TunnelRefusedError):
        stream = await client.open_tunnel(f"{RAW_VIP}:80", [])
        await stream.write(b"GET /echo HTTP/1.0\r\n\r\n")
        await read_until_eof(stream)
    # A DENY ignores its L7 fields at TCP: denied too.
    configure(rig, policy("deny-post", Action.DENY, Match(methods=("POST",))))
    with pytest.raises(TunnelRefusedError):
        await client.open_tunnel(f"{RAW_VIP}:80", [])
    # No policy: relayed.
    configure(rig)
    stream = await client.open_tunnel(f"{RAW_VIP}:80", [])
    await stream.write(b"GET /echo HTTP/1.0\r\n\r\n")
    assert b'"endpoint"' in await read_until_eof(stream)
    await client.aclose()


async def test_a_client_cannot_choose_its_remote_ip_with_x_forwarded_for(rig: Rig) -> None:
    configure(rig, policy("deny-client", Action.DENY, Match(remote_ips=(ipaddress.ip_network(f"{CLIENT_IP}/32"),))))
    assert (await status_of(rig, "GET", "/echo"))[0] == 403
    spoofed = [("x-forwarded-for", "203.0.113.9"), ("forwarded", "for=203.0.113.9")]
    assert (await status_of(rig, "GET", "/echo", spoofed))[0] == 403
