"""RequestAuthentication's pure core (ambit.requestauth): token locations, verification, Istio's requirement, the
header changes, and that nothing a request carries makes it raise."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import given
from hypothesis import strategies as st
from jwt.algorithms import RSAAlgorithm
from tests.unit.jwt_keys import Signer, claims, ec_signer, ed25519_signer, rsa_signer

from ambit.model.requestauth import ClaimToHeader, JwtHeader, JwtRule, RequestAuthentication
from ambit.requestauth import (
    MAX_JWKS_KEYS,
    MAX_TOKEN_BYTES,
    Authenticated,
    JwksRejected,
    KeySets,
    Rejected,
    applicable,
    authenticate,
    parse_jwks,
)
from ambit.requestauth.reasons import (
    AUDIENCE_NOT_ALLOWED,
    BAD_FORMAT,
    EXPIRED,
    JWKS_FETCH_FAILED,
    JWKS_NO_VALID_KEYS,
    NO_MATCHING_KEY,
    NOT_YET_VALID,
    UNKNOWN_ISSUER,
    UNSUPPORTED_ALG,
    VERIFICATION_FAILS,
)

NOW = 1_000_000.0
ISS = "https://issuer.example"
OTHER = "https://other.example"

RSA = rsa_signer()
EC = ec_signer()


def policy(*rules: JwtRule, services: tuple[str, ...] = ()) -> RequestAuthentication:
    return RequestAuthentication("jwt", "app", rules, services)


def run(
    policies: tuple[RequestAuthentication, ...],
    headers: tuple[tuple[str, str], ...] = (),
    target: str = "/",
    *,
    method: str = "GET",
    remote: dict[str, Any] | None = None,
    now: float = NOW,
) -> Authenticated | Rejected:
    keys = KeySets.build(policies, remote)
    return authenticate(method, target, headers, policies, keys, now)


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


RULE = JwtRule(ISS, jwks=RSA.jwks())


def test_without_policies_every_request_passes_unauthenticated() -> None:
    assert run((), bearer("garbage")) == Authenticated(None)


def test_a_request_without_a_token_passes_with_no_identity() -> None:
    assert run((policy(RULE),)) == Authenticated(None)


def test_a_valid_bearer_token_gives_the_issuer_and_subject_and_is_removed() -> None:
    token = RSA.sign(claims(ISS, aud=["a", "b"], azp="web", scope="read write"))
    outcome = run((policy(RULE),), (*bearer(token), ("x-other", "1")))
    assert isinstance(outcome, Authenticated) and outcome.identity is not None
    assert outcome.identity.principal == f"{ISS}/alice"
    assert outcome.identity.audiences == ("a", "b")
    assert outcome.identity.presenter == "web"
    assert outcome.identity.claims["scope"] == ["read", "write"]
    assert outcome.request_headers is not None and outcome.request_headers.remove == ("authorization",)


@pytest.mark.parametrize("signer", [RSA, EC, ed25519_signer()], ids=["RS256", "ES256", "EdDSA"])
def test_each_key_type_verifies_its_own_tokens(signer: Signer) -> None:
    rule = JwtRule(ISS, jwks=signer.jwks())
    outcome = run((policy(rule),), bearer(signer.sign(claims(ISS))))
    assert isinstance(outcome, Authenticated) and outcome.identity is not None


def test_an_rsa_key_without_alg_verifies_ps256_tokens() -> None:
    jwk = {k: v for k, v in RSA.jwk.items() if k != "alg"}
    rule = JwtRule(ISS, jwks=json.dumps({"keys": [jwk]}))
    outcome = run((policy(rule),), bearer(RSA.sign(claims(ISS), alg="PS256")))
    assert isinstance(outcome, Authenticated) and outcome.identity is not None


def test_an_untrusted_issuer_is_refused_with_401() -> None:
    outcome = run((policy(RULE),), bearer(RSA.sign(claims(OTHER))))
    assert outcome == Rejected(UNKNOWN_ISSUER)
    assert outcome.status == 401 and outcome.body == UNKNOWN_ISSUER.encode()


def test_a_token_signed_by_another_key_fails_verification() -> None:
    other = rsa_signer(kid=RSA.jwk["kid"])
    assert run((policy(RULE),), bearer(other.sign(claims(ISS)))) == Rejected(VERIFICATION_FAILS)


def test_a_token_naming_an_unknown_kid_has_no_key() -> None:
    assert run((policy(RULE),), bearer(RSA.sign(claims(ISS), kid="nope"))) == Rejected(NO_MATCHING_KEY)


def test_alg_none_is_refused() -> None:
    token = jwt.encode(claims(ISS), None, algorithm="none")
    assert run((policy(RULE),), bearer(token)) == Rejected(UNSUPPORTED_ALG)


def test_an_hmac_token_keyed_with_the_public_rsa_key_is_refused() -> None:
    """Algorithm confusion: HS256 keyed with the issuer's public key material must never verify."""
    public_n = base64.urlsafe_b64decode(RSA.jwk["n"] + "==")
    for secret in (public_n, json.dumps(RSA.jwk).encode(), RSA.jwks().encode()):
        header = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=").decode()
        payload = base64.urlsafe_b64encode(json.dumps(claims(ISS)).encode()).rstrip(b"=").decode()
        mac = hmac.new(secret, f"{header}.{payload}".encode(), hashlib.sha256).digest()
        token = f"{header}.{payload}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"
        assert run((policy(RULE),), bearer(token)) == Rejected(NO_MATCHING_KEY)


def test_hmac_tokens_verify_only_against_an_oct_key_the_issuer_published() -> None:
    secret = b"k" * 32
    jwks = json.dumps({"keys": [{"kty": "oct", "k": base64.urlsafe_b64encode(secret).rstrip(b"=").decode()}]})
    rule = JwtRule(ISS, jwks=jwks)
    token = jwt.encode(claims(ISS), secret, algorithm="HS256")
    outcome = run((policy(rule),), bearer(token))
    assert isinstance(outcome, Authenticated) and outcome.identity is not None
    forged = jwt.encode(claims(ISS), b"x" * 32, algorithm="HS256")
    assert run((policy(rule),), bearer(forged)) == Rejected(VERIFICATION_FAILS)


def test_a_short_hmac_key_is_not_a_usable_key() -> None:
    secret = b"short"
    jwks = json.dumps({"keys": [{"kty": "oct", "k": base64.urlsafe_b64encode(secret).rstrip(b"=").decode()}]})
    header = base64.urlsafe_b64encode(b'{"alg":"HS256"}').rstrip(b"=").decode()
    payload = base64.urlsafe_b64encode(json.dumps(claims(ISS)).encode()).rstrip(b"=").decode()
    mac = hmac.new(secret, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    token = f"{header}.{payload}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"
    assert parse_jwks(jwks) == JwksRejected(JWKS_NO_VALID_KEYS)
    assert run((policy(JwtRule(ISS, jwks=jwks)),), bearer(token)) == Rejected(JWKS_NO_VALID_KEYS)


@pytest.mark.parametrize(
    ("delta", "expected"),
    [(-59, None), (-61, EXPIRED)],
    ids=["within-skew", "past-skew"],
)
def test_expiry_allows_envoys_60_second_clock_skew(delta: int, expected: str | None) -> None:
    token = RSA.sign({**claims(ISS), "exp": int(NOW) + delta})
    outcome = run((policy(RULE),), bearer(token))
    assert outcome == Rejected(expected) if expected else isinstance(outcome, Authenticated)


def test_a_token_not_yet_valid_is_refused() -> None:
    token = RSA.sign({**claims(ISS), "nbf": int(NOW) + 61})
    assert run((policy(RULE),), bearer(token)) == Rejected(NOT_YET_VALID)
    ok = RSA.sign({**claims(ISS), "nbf": int(NOW) + 59})
    assert isinstance(run((policy(RULE),), bearer(ok)), Authenticated)


def test_a_token_without_exp_does_not_expire() -> None:
    token = RSA.sign({"iss": ISS, "sub": "bob"})
    assert isinstance(run((policy(RULE),), bearer(token)), Authenticated)


@pytest.mark.parametrize(
    ("token_aud", "ok"),
    [(["svc"], True), ("https://svc/", True), ("http://svc", True), (["x", "y"], False), ([], False)],
)
def test_audiences_compare_without_scheme_and_trailing_slash(token_aud: Any, ok: bool) -> None:
    rule = JwtRule(ISS, audiences=("svc",), jwks=RSA.jwks())
    outcome = run((policy(rule),), bearer(RSA.sign(claims(ISS, aud=token_aud))))
    assert isinstance(outcome, Authenticated) if ok else outcome == Rejected(AUDIENCE_NOT_ALLOWED)


def test_from_headers_with_prefix_and_from_params_and_cookies() -> None:
    rule = JwtRule(
        ISS,
        jwks=RSA.jwks(),
        from_headers=(JwtHeader("x-jwt", "Token "),),
        from_params=("tok",),
        from_cookies=("session",),
    )
    token = RSA.sign(claims(ISS))
    for headers, target in (
        ((("x-jwt", f"Token {token}"),), "/"),
        ((), f"/p?a=1&tok={token}"),
        ((("cookie", f"a=b; session={token}"),), "/"),
    ):
        outcome = run((policy(rule),), headers, target)
        assert isinstance(outcome, Authenticated) and outcome.identity is not None, (headers, target)
    # The default locations are not read when a rule names its own.
    assert run((policy(rule),), bearer(token), f"/?access_token={token}") == Authenticated(None)


def test_the_default_query_parameter_is_access_token() -> None:
    outcome = run((policy(RULE),), (), f"/x?access_token={RSA.sign(claims(ISS))}")
    assert isinstance(outcome, Authenticated) and outcome.identity is not None
    assert outcome.request_headers is None  # Envoy does not strip a parameter


def test_a_header_without_the_prefix_holds_no_token() -> None:
    assert run((policy(RULE),), (("authorization", "Basic dXNlcjpwYXNz"),)) == Authenticated(None)


def test_forward_original_token_keeps_the_header() -> None:
    rule = JwtRule(ISS, jwks=RSA.jwks(), forward_original_token=True)
    outcome = run((policy(rule),), bearer(RSA.sign(claims(ISS))))
    assert outcome == Authenticated(outcome.identity if isinstance(outcome, Authenticated) else None, None)


def test_payload_and_claims_are_written_and_forged_copies_removed() -> None:
    rule = JwtRule(
        ISS,
        jwks=RSA.jwks(),
        output_payload_to_header="x-jwt-payload",
        output_claim_to_headers=(
            ClaimToHeader("x-sub", "sub"),
            ClaimToHeader("x-team", "org.team"),
            ClaimToHeader("x-groups", "groups"),
            ClaimToHeader("x-evil", "evil"),
            ClaimToHeader("x-name", "name"),
        ),
    )
    token = RSA.sign(claims(ISS, org={"team": "blue"}, groups=["a", "b"], evil="x\r\nset-cookie: y", name="Zoë"))
    outcome = run((policy(rule),), (*bearer(token), ("x-jwt-payload", "forged"), ("x-evil", "forged")))
    assert isinstance(outcome, Authenticated) and outcome.request_headers is not None
    written = dict(outcome.request_headers.set)
    assert written["x-jwt-payload"] == token.split(".")[1]
    assert json.loads(base64.urlsafe_b64decode(written["x-jwt-payload"] + "=="))["org"] == {"team": "blue"}
    assert written["x-sub"] == "alice" and written["x-team"] == "blue" and written["x-groups"] == "a,b"
    assert "x-evil" not in written and "x-evil" in outcome.request_headers.remove
    assert "x-name" not in written  # HTTP/1.1 headers carry ASCII
    assert "authorization" in outcome.request_headers.remove


def test_output_headers_are_removed_even_without_a_token() -> None:
    rule = JwtRule(ISS, jwks=RSA.jwks(), output_payload_to_header="x-jwt-payload")
    outcome = run((policy(rule),), (("x-jwt-payload", "forged"),))
    assert outcome == Authenticated(None, outcome.request_headers if isinstance(outcome, Authenticated) else None)
    assert isinstance(outcome, Authenticated) and outcome.request_headers is not None
    assert outcome.request_headers.remove == ("x-jwt-payload",)


def test_cors_preflight_bypasses_authentication() -> None:
    headers = (*bearer("garbage"), ("origin", "https://a"), ("access-control-request-method", "GET"))
    assert run((policy(RULE),), headers, method="OPTIONS") == Authenticated(None)
    assert run((policy(RULE),), headers, method="GET") == Rejected(BAD_FORMAT)


def test_two_issuers_each_valid_token_authenticates() -> None:
    rules = (policy(RULE), policy(JwtRule(OTHER, jwks=EC.jwks())))
    for token in (RSA.sign(claims(ISS)), EC.sign(claims(OTHER, subject="bob"))):
        outcome = run(rules, bearer(token))
        assert isinstance(outcome, Authenticated) and outcome.identity is not None


def test_a_valid_token_beside_an_invalid_one_in_a_shared_location_is_refused() -> None:
    """Every token the shared default locations hold must verify (Envoy's "all tokens must be valid")."""
    good, bad = RSA.sign(claims(ISS)), RSA.sign({**claims(ISS), "exp": int(NOW) - 3600})
    assert run((policy(RULE),), bearer(good), f"/?access_token={bad}") == Rejected(EXPIRED)


def test_a_valid_token_in_one_providers_own_location_passes_beside_a_bad_one_elsewhere() -> None:
    """Istio's outer OR: provider 1 passes on its own header even though provider 2's header holds garbage."""
    one = JwtRule(ISS, jwks=RSA.jwks(), from_headers=(JwtHeader("x-a"),))
    two = JwtRule(OTHER, jwks=EC.jwks(), from_headers=(JwtHeader("x-b"),))
    outcome = run((policy(one, two),), (("x-a", RSA.sign(claims(ISS))), ("x-b", "a.b.c")))
    assert isinstance(outcome, Authenticated) and outcome.identity is not None
    assert outcome.identity.issuer == ISS


def test_a_jwks_uri_not_fetched_yet_refuses_tokens_but_not_tokenless_requests() -> None:
    rule = JwtRule(ISS, jwks_uri="https://keys.example/jwks")
    assert run((policy(rule),), bearer(RSA.sign(claims(ISS)))) == Rejected(JWKS_FETCH_FAILED)
    assert run((policy(rule),)) == Authenticated(None)
    fetched = parse_jwks(RSA.jwks())
    outcome = run((policy(rule),), bearer(RSA.sign(claims(ISS))), remote={rule.jwks_uri: fetched})
    assert isinstance(outcome, Authenticated) and outcome.identity is not None


def test_an_oversized_token_is_refused_before_parsing() -> None:
    token = RSA.sign(claims(ISS, pad="x" * MAX_TOKEN_BYTES))
    outcome = run((policy(RULE),), bearer(token))
    assert isinstance(outcome, Rejected) and outcome.status == 401


def test_deeply_nested_claims_are_refused() -> None:
    nested: Any = "x"
    for _ in range(40):
        nested = [nested]
    outcome = run((policy(RULE),), bearer(RSA.sign(claims(ISS, deep=nested))))
    assert isinstance(outcome, Rejected)


def test_applicable_policies_by_service() -> None:
    everywhere, reviews = policy(RULE), policy(RULE, services=("app/reviews.app.svc.cluster.local",))
    assert applicable((everywhere, reviews), "app/reviews.app.svc.cluster.local") == (everywhere, reviews)
    assert applicable((everywhere, reviews), "app/ratings.app.svc.cluster.local") == (everywhere,)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("nope", "Jwks is an invalid JSON"),
        ("[]", "Jwks does not have [keys] field"),
        ('{"keys": {}}', "[keys] in Jwks is not an array"),
        ('{"keys": [{"kty": "RSA", "n": "x"}]}', "Jwks doesn't have any valid public key"),
        ('{"keys": [{"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA"}]}', "Jwks doesn't have any valid public key"),
    ],
)
def test_bad_key_sets_are_rejected_with_their_reason(text: str, reason: str) -> None:
    assert parse_jwks(text) == JwksRejected(reason)


def test_unusable_keys_are_skipped_and_counted() -> None:
    text = json.dumps({"keys": [{"kty": "nope"}, RSA.jwk, {**EC.jwk, "use": "enc"}]})
    parsed = parse_jwks(text)
    assert not isinstance(parsed, JwksRejected)
    assert len(parsed.keys) == 1 and parsed.skipped == 2


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=300)
_TOKENISH = st.lists(st.sampled_from(["eyJ", "hbGci", ".", "-", "_", "=", "%", "AA", "e30"]), max_size=40).map("".join)


@given(
    st.lists(st.tuples(st.sampled_from(["authorization", "cookie", "x-jwt", "x-jwt-payload"]), _TEXT | _TOKENISH)),
    _TEXT | _TOKENISH.map(lambda t: f"/?access_token={t}"),
    st.sampled_from(["GET", "OPTIONS", ""]),
)
def test_arbitrary_requests_never_raise(headers: list[tuple[str, str]], target: str, method: str) -> None:
    rule = JwtRule(
        ISS,
        jwks=RSA.jwks(),
        from_headers=(JwtHeader("authorization", "Bearer "), JwtHeader("x-jwt")),
        from_params=("access_token",),
        from_cookies=("session",),
        output_payload_to_header="x-jwt-payload",
    )
    outcome = run((policy(rule),), tuple(headers), target, method=method)
    assert isinstance(outcome, (Authenticated, Rejected))


_SIGNED = RSA.sign(claims(ISS)).split(".")
_CLAIM_NAMES = st.sampled_from(["iss", "sub", "aud", "exp", "nbf", "azp", "scope"]) | st.text(max_size=5)


@given(
    st.dictionaries(
        _CLAIM_NAMES,
        st.recursive(st.none() | st.integers() | st.floats() | st.text(max_size=8), st.lists, max_leaves=8),
    )
)
def test_arbitrary_payloads_never_raise(payload: dict[str, Any]) -> None:
    body = base64.urlsafe_b64encode(json.dumps({"iss": ISS, **payload}).encode()).rstrip(b"=").decode()
    token = _SIGNED
    outcome = run((policy(RULE),), bearer(f"{token[0]}.{body}.{token[2]}"))
    assert isinstance(outcome, (Authenticated, Rejected))


@given(st.binary(max_size=400) | _TEXT)
def test_arbitrary_key_sets_never_raise(text: bytes | str) -> None:
    parse_jwks(text)


def test_a_short_rsa_key_is_not_a_usable_key() -> None:
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    jwk = dict(RSAAlgorithm.to_jwk(weak.public_key(), as_dict=True))
    assert parse_jwks(json.dumps({"keys": [jwk]})) == JwksRejected(JWKS_NO_VALID_KEYS)


def test_a_key_naming_its_alg_verifies_only_that_alg() -> None:
    rule = JwtRule(ISS, jwks=RSA.jwks(alg="RS256"))
    assert isinstance(run((policy(rule),), bearer(RSA.sign(claims(ISS)))), Authenticated)
    assert run((policy(rule),), bearer(RSA.sign(claims(ISS), alg="PS256"))) == Rejected(NO_MATCHING_KEY)


def test_an_ec_key_verifies_only_tokens_of_its_curve() -> None:
    rule = JwtRule(ISS, jwks=EC.jwks())
    _, payload, signature = EC.sign(claims(ISS)).split(".")
    header = base64.urlsafe_b64encode(b'{"alg":"ES384"}').rstrip(b"=").decode()
    assert run((policy(rule),), bearer(f"{header}.{payload}.{signature}")) == Rejected(NO_MATCHING_KEY)


def test_a_key_set_is_read_only_up_to_its_key_limit() -> None:
    junk = [{"kty": "oct"}] * MAX_JWKS_KEYS
    assert parse_jwks(json.dumps({"keys": [*junk, RSA.jwk]})) == JwksRejected(JWKS_NO_VALID_KEYS)
    parsed = parse_jwks(json.dumps({"keys": [RSA.jwk, *junk, *junk]}))
    assert not isinstance(parsed, JwksRejected) and len(parsed.keys) == 1 and parsed.skipped == 2 * MAX_JWKS_KEYS


# Istio's requirement, written as Envoy's verifier tree, is the reference the decision is checked against.

SIGNERS = {ISS: RSA, OTHER: EC}
TOKENS = {
    "good-iss": RSA.sign(claims(ISS, now=NOW)),
    "good-other": EC.sign(claims(OTHER, subject="bob", now=NOW)),
    "expired-iss": RSA.sign({**claims(ISS, now=NOW), "exp": int(NOW) - 3600}),
    "forged-iss": rsa_signer(kid=RSA.jwk["kid"]).sign(claims(ISS, now=NOW)),
    "garbage": "a.b.c",
}
LOCATIONS = {"x-a": JwtHeader("x-a"), "x-b": JwtHeader("x-b"), "default": None}


def _rule_of(issuer: str, where: str) -> JwtRule:
    header = LOCATIONS[where]
    return JwtRule(issuer, jwks=SIGNERS[issuer].jwks(), from_headers=() if header is None else (header,))


def _reference(rules: list[tuple[str, str]], sent: dict[str, str]) -> bool:
    """Envoy's tree: any(P1..Pn, all(any(Pi, allow_missing)...)), tokens read per location."""

    def location_of(where: str) -> str:
        return "authorization" if where == "default" else where

    def valid(token: str, issuer: str) -> bool:
        return token == f"good-{'iss' if issuer == ISS else 'other'}"

    def provider(i: int) -> bool:
        issuer, where = rules[i]
        mine = [t for loc, t in sent.items() if loc == location_of(where)]
        return bool(mine) and all(valid(t, issuer) for t in mine)

    read = {location_of(where) for _, where in rules}

    def allow_missing() -> bool:
        return all(
            any(location_of(where) == loc and valid(t, issuer) for issuer, where in rules)
            for loc, t in sent.items()
            if loc in read
        )

    requirement = all(provider(i) or allow_missing() for i in range(len(rules)))
    return any(provider(i) for i in range(len(rules))) or requirement


@given(
    st.lists(st.tuples(st.sampled_from([ISS, OTHER]), st.sampled_from(sorted(LOCATIONS))), min_size=1, max_size=3),
    st.dictionaries(st.sampled_from(["x-a", "x-b", "authorization"]), st.sampled_from(sorted(TOKENS)), max_size=3),
)
def test_the_decision_is_istios_requirement(rules: list[tuple[str, str]], sent: dict[str, str]) -> None:
    policies = (policy(*(_rule_of(issuer, where) for issuer, where in rules)),)
    headers = tuple((name, f"Bearer {TOKENS[t]}" if name == "authorization" else TOKENS[t]) for name, t in sent.items())
    outcome = run(policies, headers)
    assert isinstance(outcome, Authenticated) == _reference(rules, sent)
    if isinstance(outcome, Authenticated) and outcome.identity is not None:
        assert (outcome.identity.issuer, outcome.identity.subject) in ((ISS, "alice"), (OTHER, "bob"))
