"""RequestAuthentication in the waypoint process on loopback, through the real per-request path: a rejected token
is 401 before any policy is looked at, a valid one gives the request principal that AuthorizationPolicies read,
and the token is removed before the request goes on (TestL7JWT's cases, see :mod:`tests.integration.waypoint_rig`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from tests.integration.test_waypoint_virtualservice import install
from tests.integration.waypoint_rig import ECHO_VIP, HttpOverTunnel, Rig, echo_of, started_rig
from tests.unit.jwt_keys import Signer, claims, rsa_signer

from ambit.model.policy import Action, Clause, Match, Policy, Rule, Scope, StringMatch
from ambit.model.requestauth import ClaimToHeader, JwtRule, RequestAuthentication
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


# -- Routing on JWT claims (upstream tests/integration/pilot/common/routing.go jwtClaimRoute) -------------------------
# The VirtualService of every case: one rule, matching the case's headers / withoutHeaders, to the Service echo; a
# request no rule takes is 404. The token: upstream's TokenIssuer1WithNestedClaims1 (sub-1, nested.key1 valueA).
def claim_route(headers: dict[str, dict[str, str]], without: dict[str, dict[str, str]] | None = None) -> str:
    match: dict[str, object] = {"uri": {"prefix": "/"}, "headers": headers}
    if without:
        match["withoutHeaders"] = without
    return yaml.safe_dump(
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "VirtualService",
            "metadata": {"name": "default", "namespace": "app"},
            "spec": {"hosts": ["echo"], "http": [{"match": [match], "route": [{"destination": {"host": "echo"}}]}]},
        }
    )


NESTED = {
    "nested": {"key1": "valueA", "nested-2": {"key1": "valueB"}},
    "list": ["valueC", 3],
    "test-issuer-1@istio.io/simple": "valueC",  # upstream's TokenIssuer1WithCollisionResistantName claims
    "test-issuer-1@istio.io/nested": {"key1": "valueC"},
}
SUB_REGEX = r"(\W|^)(sub-1|sub-2)(\W|$)"
KEY1_REGEX = r"(\W|^)value[AB](\W|$)"
NOT_MATCHED_REGEX = r"(\W|^)value\s{0,3}not{0,1}\s{0,3}matched(\W|$)"
CLAIM_CASES = [
    # name, headers, withoutHeaders, expected status with the token
    ("matched with nested claims", {"@request.auth.claims.nested.key1": {"exact": "valueA"}}, None, 200),
    ("matched with single claim", {"@request.auth.claims.sub": {"prefix": "sub"}}, None, 200),
    (
        "matched multiple claims with regex",
        {"@request.auth.claims.sub": {"regex": SUB_REGEX}, "@request.auth.claims.nested.key1": {"regex": KEY1_REGEX}},
        None,
        200,
    ),
    ("matched without claim", {}, {"@request.auth.claims.nested.key1": {"exact": "value-not-matched"}}, 200),
    ("unmatched without claim", {}, {"@request.auth.claims.nested.key1": {"exact": "valueA"}}, 404),
    (
        "matched both with and without claims with regex",
        {"@request.auth.claims.sub": {"prefix": "sub"}},
        {"@request.auth.claims.nested.key1": {"regex": NOT_MATCHED_REGEX}},
        200,
    ),
    (
        "unmatched multiple claims",
        {
            "@request.auth.claims.nested.key1": {"exact": "valueA"},
            "@request.auth.claims.sub": {"prefix": "value-not-matched"},
        },
        None,
        404,
    ),
    ("unmatched token", {"@request.auth.claims.sub": {"exact": "value-not-matched"}}, None, 404),
    ("usage2: matched with nested claims", {"@request.auth.claims[nested][key1]": {"exact": "valueA"}}, None, 200),
    ("usage2: deeper nesting", {"@request.auth.claims[nested][nested-2][key1]": {"exact": "valueB"}}, None, 200),
    ("usage2: unmatched token", {"@request.auth.claims[sub]": {"exact": "value-not-matched"}}, None, 404),
    (
        "usage2: matched with simple collision-resistant claim name",
        {"@request.auth.claims[test-issuer-1@istio.io/simple]": {"exact": "valueC"}},
        None,
        200,
    ),
    (
        "usage2: matched with nested collision-resistant claim name",
        {"@request.auth.claims[test-issuer-1@istio.io/nested][key1]": {"exact": "valueC"}},
        None,
        200,
    ),
    (
        "usage2: unmatched with nested collision-resistant claim name",
        {"@request.auth.claims[test-issuer-1@istio.io/nested][key1]": {"exact": "value-not-matched"}},
        None,
        404,
    ),
    ("a list claim holding the value", {"@request.auth.claims.list": {"exact": "valueC"}}, None, 200),
    ("a number is not a string", {"@request.auth.claims.list": {"exact": "3"}}, None, 404),
]


@pytest.mark.parametrize(("name", "headers", "without", "expected"), CLAIM_CASES, ids=[c[0] for c in CLAIM_CASES])
async def test_upstream_jwt_claim_route_cases_at_the_waypoint(
    rig: Rig,
    signer: Signer,
    name: str,
    headers: dict[str, dict[str, str]],
    without: dict[str, dict[str, str]] | None,
    expected: int,
) -> None:
    install(rig, claim_route(headers, without))
    rule = JwtRule(ISSUER, jwks=signer.jwks(), output_claim_to_headers=(ClaimToHeader("x-jwt-iss", "iss"),))
    config = rig.waypoint.context.routes.current
    rig.waypoint.context.routes.replace(
        dataclasses.replace(config, request_authentications=(RequestAuthentication("jwt", "app", (rule,)),))
    )
    token = signer.sign(claims(ISSUER, "sub-1", now=time.time(), **NESTED))
    status, body = await get(rig, token)
    assert status == expected, body
    if status == 200:
        assert echo_of(body)["headers"]["x-jwt-iss"] == ISSUER  # type: ignore[index]


async def test_claim_routes_are_not_held_without_a_token_by_a_header_of_the_same_name_or_an_invalid_token(
    rig: Rig, signer: Signer
) -> None:
    install(rig, claim_route({"@request.auth.claims.nested.key1": {"exact": "valueA"}}))
    rule = JwtRule(ISSUER, jwks=signer.jwks())
    config = rig.waypoint.context.routes.current
    rig.waypoint.context.routes.replace(
        dataclasses.replace(config, request_authentications=(RequestAuthentication("jwt", "app", (rule,)),))
    )
    assert (await get(rig, None))[0] == 404  # "unmatched with no token"
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    same_header = [("request.auth.claims.nested.key1", "valueA")]  # upstream's (h11 refuses a name with "@")
    status, _, _ = await HttpOverTunnel(stream).request("GET", "/echo", headers=same_header)
    assert status == 404  # "unmatched with no token but same header"
    await client.aclose()
    expired = signer.sign(claims(ISSUER, "sub-1", now=time.time() - 7200, **NESTED))
    assert (await get(rig, expired))[0] == 401  # "unmatched with invalid token"
    assert (await get(rig, signer.sign(claims(ISSUER, "sub-1", now=time.time(), **NESTED))))[0] == 200


async def test_claim_routes_without_a_request_authentication_never_match(rig: Rig, signer: Signer) -> None:
    install(rig, claim_route({"@request.auth.claims.nested.key1": {"exact": "valueA"}}))
    token = signer.sign(claims(ISSUER, "sub-1", now=time.time(), **NESTED))
    assert (await get(rig, token))[0] == 404  # "unmatched with no request authentication"


async def test_upstream_claim_to_header_output_is_what_a_header_match_sees_not_the_client_s_copy(
    rig: Rig, signer: Signer
) -> None:
    # "matched with nested claim using claim to header" and "unmatched with wrong claim and added header".
    install(rig, claim_route({"x-jwt-nested-key": {"exact": "valueB"}}))
    rule = JwtRule(
        ISSUER,
        jwks=signer.jwks(),
        output_claim_to_headers=(
            ClaimToHeader("x-jwt-nested-key", "nested.nested-2.key1"),
            ClaimToHeader("x-jwt-wrong-header", "wrong_claim"),
        ),
    )
    config = rig.waypoint.context.routes.current
    rig.waypoint.context.routes.replace(
        dataclasses.replace(config, request_authentications=(RequestAuthentication("jwt", "app", (rule,)),))
    )
    token = signer.sign(claims(ISSUER, "sub-1", now=time.time(), **NESTED))
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    forged = [("authorization", f"Bearer {token}"), ("x-jwt-nested-key", "value_to_be_replaced")]
    assert (await http.request("GET", "/echo", headers=forged))[0] == 200
    assert (await http.request("GET", "/echo", headers=[("x-jwt-nested-key", "valueB")]))[0] == 404  # no token
    await client.aclose()
    install(rig, claim_route({"x-jwt-wrong-header": {"exact": "header_to_be_deleted"}}))
    rig.waypoint.context.routes.replace(
        dataclasses.replace(
            rig.waypoint.context.routes.current,
            request_authentications=(RequestAuthentication("jwt", "app", (rule,)),),
        )
    )
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    added = [("authorization", f"Bearer {token}"), ("x-jwt-wrong-header", "header_to_be_deleted")]
    assert (await HttpOverTunnel(stream).request("GET", "/echo", headers=added))[0] == 404
    await client.aclose()
