"""RequestAuthentication in the waypoint process on loopback, through the real per-request path: a rejected token
is 401 before any policy is looked at, a valid one gives the request principal that AuthorizationPolicies read,
and the token is removed before the request goes on (TestL7JWT's cases, see :mod:`tests.integration.waypoint_rig`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.waypoint_rig import ECHO_VIP, HttpOverTunnel, Rig, echo_of, started_rig
from tests.unit.jwt_keys import Signer, claims, rsa_signer

from ambit.model.policy import Action, Clause, Match, Policy, Rule, Scope, StringMatch
from ambit.model.requestauth import JwtRule, RequestAuthentication
from ambit.model.routes import WaypointConfig
from ambit.waypoint.settings import WaypointLimits

LIMITS = WaypointLimits(max_head_bytes=16 * 1024, head_timeout=2.0, sniff_timeout=2.0, startup_wait=5.0)
ISSUER = "https://issuer.example"


@pytest.fixture(scope="module")
def signer() -> Signer:
    return rsa_signer()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path, LIMITS) as rig:
        yield rig


def configure(rig: Rig, signer: Signer, *, require_principal: bool, output_payload: bool = False) -> None:
    rule = JwtRule(ISSUER, jwks=signer.jwks(), output_payload_to_header="x-jwt-payload" if output_payload else "")
    policies: tuple[Policy, ...] = ()
    if require_principal:
        match = Match(request_principals=(StringMatch.presence(),))
        policies = (Policy("need-jwt", "app", Scope.WAYPOINT, Action.ALLOW, (Rule((Clause((match,)),)),)),)
    authn = (RequestAuthentication("jwt", "app", (rule,)),)
    rig.waypoint.context.routes.replace(
        WaypointConfig("app/waypoint", policies=policies, request_authentications=authn)
    )


async def get(rig: Rig, token: str | None) -> tuple[int, bytes]:
    headers = [("authorization", f"Bearer {token}")] if token is not None else []
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    try:
        status, _, body = await HttpOverTunnel(stream).request("GET", "/echo", headers=headers)
        return status, body
    finally:
        await client.aclose()


async def test_no_token_is_forbidden_where_a_principal_is_required_and_a_valid_one_passes(
    rig: Rig, signer: Signer
) -> None:
    configure(rig, signer, require_principal=True, output_payload=True)
    assert await get(rig, None) == (403, b"RBAC: access denied")
    status, body = await get(rig, signer.sign(claims(ISSUER, now=time.time())))
    assert status == 200
    echoed = echo_of(body)
    assert echoed["authorization"] == ""  # the verified token is not forwarded (forwardOriginalToken is off)
    assert echoed["jwt_payload"] != ""


async def test_a_token_no_rule_accepts_is_401_whatever_the_policies(rig: Rig, signer: Signer) -> None:
    configure(rig, signer, require_principal=False)
    now = time.time()
    untrusted = rsa_signer().sign(claims("https://elsewhere.example", now=now))
    assert await get(rig, untrusted) == (401, b"Jwt issuer is not configured")
    expired = signer.sign(claims(ISSUER, now=now - 7200))
    assert await get(rig, expired) == (401, b"Jwt is expired")
    forged = signer.sign(claims(ISSUER, now=now))[:-4] + "AAAA"
    status, _ = await get(rig, forged)
    assert status == 401
    assert (await get(rig, None))[0] == 200  # no token, no policy needing one: it passes
