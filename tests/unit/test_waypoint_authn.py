"""The waypoint's RequestAuthentication step (ambit.waypoint.authn): which policies apply to the destination, the
401 answer, and the head the shell authorizes and routes."""

from __future__ import annotations

from tests.unit.jwt_keys import claims, rsa_signer

from ambit.model.requestauth import JwtRule, RequestAuthentication
from ambit.model.routes import WaypointConfig
from ambit.requestauth import KeySets
from ambit.waypoint.authn import Authenticated, Unauthenticated, plan_authentication
from ambit.waypoint.decisions import RequestHead

NOW = 1_000_000.0
ISS = "https://issuer.example"
SIGNER = rsa_signer()
REVIEWS = "app/reviews.app.svc.cluster.local"
POLICY = RequestAuthentication(
    "jwt", "app", (JwtRule(ISS, jwks=SIGNER.jwks(), output_payload_to_header="x-jwt-payload"),), (REVIEWS,)
)
CONFIG = WaypointConfig("app/waypoint", request_authentications=(POLICY,))
KEYS = KeySets.build(CONFIG.request_authentications)


def head(*headers: tuple[str, str]) -> RequestHead:
    return RequestHead("GET", "/ratings/1?x=y", "reviews:9080", (("accept", "*/*"), *headers))


def test_a_valid_token_gives_the_identity_and_the_rewritten_head() -> None:
    token = SIGNER.sign(claims(ISS, now=NOW))
    step = plan_authentication(head(("authorization", f"Bearer {token}")), CONFIG, REVIEWS, KEYS, NOW)
    assert isinstance(step, Authenticated) and step.identity is not None
    assert step.identity.principal == f"{ISS}/alice"
    assert step.request.headers == (("accept", "*/*"), ("x-jwt-payload", token.split(".")[1]))
    assert step.request.path == "/ratings/1?x=y" and step.request.authority == "reviews:9080"


def test_an_expired_token_is_answered_401_with_envoys_reason() -> None:
    token = SIGNER.sign({**claims(ISS, now=NOW), "exp": int(NOW) - 3600})
    step = plan_authentication(head(("authorization", f"Bearer {token}")), CONFIG, REVIEWS, KEYS, NOW)
    assert isinstance(step, Unauthenticated)
    assert step.response.status == 401 and step.response.body == b"Jwt is expired"
    challenge = 'Bearer realm="http://reviews:9080/ratings/1?x=y", error="invalid_token"'
    assert ("www-authenticate", challenge) in step.response.headers  # Envoy's jwt_authn: the request's URI
    assert step.details == "jwt_authn_access_denied{Jwt_is_expired}"


def test_a_policy_for_another_service_does_not_apply() -> None:
    garbage = head(("authorization", "Bearer not-a-jwt"), ("x-jwt-payload", "forged"))
    step = plan_authentication(garbage, CONFIG, "app/ratings.app.svc.cluster.local", KEYS, NOW)
    assert step == Authenticated(garbage, None)


def test_without_policies_the_head_passes_unchanged() -> None:
    request = head(("authorization", "Bearer x"))
    assert plan_authentication(request, WaypointConfig("app/waypoint"), REVIEWS, KeySets(), NOW) == Authenticated(
        request, None
    )


def test_a_forged_output_header_is_removed_from_a_tokenless_request() -> None:
    step = plan_authentication(head(("x-jwt-payload", "forged")), CONFIG, REVIEWS, KEYS, NOW)
    assert step == Authenticated(head(), None)


def test_a_token_for_another_audience_is_answered_403_as_envoy_does() -> None:
    policy = RequestAuthentication(
        "jwt", "app", (JwtRule(ISS, jwks=SIGNER.jwks(), audiences=("ratings",)),), (REVIEWS,)
    )
    config = WaypointConfig("app/waypoint", request_authentications=(policy,))
    token = SIGNER.sign({**claims(ISS, now=NOW), "aud": "elsewhere"})
    step = plan_authentication(
        head(("authorization", f"Bearer {token}")), config, REVIEWS, KeySets.build((policy,)), NOW
    )
    assert isinstance(step, Unauthenticated)
    assert (step.response.status, step.response.body) == (403, b"Audiences in Jwt are not allowed")


def test_the_realm_keeps_256_characters_of_the_path_and_leaves_out_what_is_not_visible_ascii() -> None:
    token = SIGNER.sign({**claims(ISS, now=NOW), "exp": int(NOW) - 3600})
    bearer = ("authorization", f"Bearer {token}")
    long = RequestHead("GET", "/" + "a" * 400, "reviews", (bearer,), "https")
    step = plan_authentication(long, CONFIG, REVIEWS, KEYS, NOW)
    assert isinstance(step, Unauthenticated)
    challenge = dict(step.response.headers)["www-authenticate"]
    assert challenge == f'Bearer realm="https://reviews/{"a" * 255}", error="invalid_token"'
    odd = RequestHead("GET", "/caf\u00e9", "reviews", (bearer,))
    step = plan_authentication(odd, CONFIG, REVIEWS, KEYS, NOW)
    assert isinstance(step, Unauthenticated)
    assert dict(step.response.headers)["www-authenticate"] == 'Bearer error="invalid_token"'
