from __future__ import annotations

import base64
import hashlib
import hmac
import json
import uuid
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import given
from hypothesis import strategies as st

from ambit.apiserver.tokens import (
    DEFAULT_ISSUER,
    BoundObject,
    ObjectRef,
    SigningKeyError,
    TokenIdentity,
    TokenIssuer,
    TokenRejected,
    check_bound_objects,
    token_review_status,
)

NOW = 1_700_000_000.0
SA_UID = "0f6c1d9e-6b1e-4a43-9d0e-2b0c8f1a7c11"
POD = BoundObject(name="web-0", uid="5a1b2c3d-0000-4000-8000-000000000001")


def _key_pem(curve: ec.EllipticCurve | None = None) -> bytes:
    key = ec.generate_private_key(curve or ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


KEY_PEM = _key_pem()
ISSUER = TokenIssuer(KEY_PEM)


def _issue(
    issuer: TokenIssuer = ISSUER,
    *,
    audiences: list[str] | None = None,
    expiration_seconds: int = 3600,
    bound_pod: BoundObject | None = POD,
) -> str:
    return issuer.issue(
        namespace="default",
        service_account="builder",
        service_account_uid=SA_UID,
        audiences=["https://kubernetes.default.svc.cluster.local"] if audiences is None else audiences,
        now=NOW,
        expiration_seconds=expiration_seconds,
        bound_pod=bound_pod,
    ).token


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _segment(token: str, index: int) -> dict[str, Any]:
    part = token.split(".")[index]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    return decoded


def _valid_claims() -> dict[str, Any]:
    return _segment(_issue(), 1)


def _sign(claims: Any, key_pem: bytes = KEY_PEM) -> str:
    key = serialization.load_pem_private_key(key_pem, None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return jwt.PyJWS().encode(json.dumps(claims).encode(), key, algorithm="ES256")


def _rejected(result: TokenIdentity | TokenRejected) -> str:
    assert isinstance(result, TokenRejected), result
    return result.reason


def test_a_bound_token_reviews_as_its_service_account_and_pod() -> None:
    result = ISSUER.review(_issue(), audiences=[], now=NOW + 10)
    assert isinstance(result, TokenIdentity)
    assert result.username == "system:serviceaccount:default:builder"
    assert result.uid == SA_UID
    assert result.groups == (
        "system:serviceaccounts",
        "system:serviceaccounts:default",
        "system:authenticated",
    )
    assert result.service_account == ObjectRef("default", "builder", SA_UID)
    assert result.pod == ObjectRef("default", POD.name, POD.uid)
    assert result.audiences == (DEFAULT_ISSUER,)
    assert result.expires_at == NOW + 3600
    assert result.jti is not None
    assert result.extra == {
        "authentication.kubernetes.io/pod-name": [POD.name],
        "authentication.kubernetes.io/pod-uid": [POD.uid],
        "authentication.kubernetes.io/credential-id": [f"JTI={result.jti}"],
    }


def test_token_claims_are_those_of_kube_bound_tokens() -> None:
    token = _issue()
    claims = _segment(token, 1)
    assert claims["iss"] == DEFAULT_ISSUER
    assert claims["sub"] == "system:serviceaccount:default:builder"
    assert claims["aud"] == [DEFAULT_ISSUER]
    assert claims["iat"] == claims["nbf"] == NOW
    assert claims["exp"] == NOW + 3600
    uuid.UUID(claims["jti"])
    assert claims["kubernetes.io"] == {
        "namespace": "default",
        "serviceaccount": {"name": "builder", "uid": SA_UID},
        "pod": {"name": POD.name, "uid": POD.uid},
    }
    assert _issue().split(".")[1] != token.split(".")[1], "jti must differ between tokens"


def test_header_is_es256_with_kube_style_key_id() -> None:
    der = (
        serialization.load_pem_private_key(KEY_PEM, None)
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    kid = _b64(hashlib.sha256(der).digest())
    assert _segment(_issue(), 0) == {"alg": "ES256", "kid": kid}
    assert ISSUER.key_id == kid
    [jwk] = ISSUER.jwks()["keys"]
    assert (jwk["kid"], jwk["kty"], jwk["crv"], jwk["alg"], jwk["use"]) == (kid, "EC", "P-256", "ES256", "sig")


def test_an_unbound_token_has_no_pod_but_still_a_credential_id() -> None:
    token = _issue(bound_pod=None)
    assert "pod" not in _segment(token, 1)["kubernetes.io"]
    result = ISSUER.review(token, audiences=[], now=NOW)
    assert isinstance(result, TokenIdentity)
    assert result.pod is None
    assert list(result.extra) == ["authentication.kubernetes.io/credential-id"]


@pytest.mark.parametrize(("asked", "lifetime"), [(0, 600), (599, 600), (601, 601), (2**40, 2**32)])
def test_expiration_is_clamped_to_kube_limits(asked: int, lifetime: int) -> None:
    issued = ISSUER.issue(
        namespace="ns",
        service_account="sa",
        service_account_uid="u",
        audiences=["a"],
        now=NOW,
        expiration_seconds=asked,
    )
    assert issued.expires_at == NOW + lifetime
    assert _segment(issued.token, 1)["exp"] == NOW + lifetime


def test_an_expired_token_is_rejected_without_leeway() -> None:
    token = _issue(expiration_seconds=600)
    assert isinstance(ISSUER.review(token, audiences=[], now=NOW + 599), TokenIdentity)
    assert _rejected(ISSUER.review(token, audiences=[], now=NOW + 600)) == "service account token has expired"


def test_not_before_allows_a_minute_of_clock_skew() -> None:
    token = _issue()
    assert isinstance(ISSUER.review(token, audiences=[], now=NOW - 60), TokenIdentity)
    assert _rejected(ISSUER.review(token, audiences=[], now=NOW - 61)) == ("service account token is not valid yet")


def test_a_token_for_another_audience_is_rejected_with_kubes_message() -> None:
    token = _issue(audiences=["vault"])
    assert _rejected(ISSUER.review(token, audiences=["istio-ca"], now=NOW)) == (
        'token audiences ["vault"] is invalid for the target audiences ["istio-ca"]'
    )


def test_without_requested_audiences_the_servers_own_apply() -> None:
    reason = _rejected(ISSUER.review(_issue(audiences=["vault"]), audiences=[], now=NOW))
    assert reason.endswith(f'for the target audiences ["{DEFAULT_ISSUER}"]')
    custom = TokenIssuer(KEY_PEM, default_audiences=["api", "other"])
    result = custom.review(_issue(custom, audiences=["vault", "other"]), audiences=[], now=NOW)
    assert isinstance(result, TokenIdentity)
    assert result.audiences == ("other",)


def test_a_token_requested_without_audiences_gets_the_servers_own() -> None:
    custom = TokenIssuer(KEY_PEM, default_audiences=["api"])
    assert _segment(_issue(custom, audiences=[]), 1)["aud"] == ["api"]


def test_review_answers_with_the_audience_intersection_in_token_order() -> None:
    token = _issue(audiences=["a", "b", "c"])
    result = ISSUER.review(token, audiences=["c", "x", "a"], now=NOW)
    assert isinstance(result, TokenIdentity)
    assert result.audiences == ("a", "c")


def test_a_single_string_audience_claim_is_accepted() -> None:
    claims = _valid_claims() | {"aud": DEFAULT_ISSUER}
    result = ISSUER.review(_sign(claims), audiences=[], now=NOW)
    assert isinstance(result, TokenIdentity)


def test_a_tampered_payload_fails_the_signature() -> None:
    header, _, signature = _issue().split(".")
    claims = _valid_claims()
    claims["kubernetes.io"]["namespace"] = "kube-system"
    claims["sub"] = "system:serviceaccount:kube-system:builder"
    forged = ".".join([header, _b64(json.dumps(claims).encode()), signature])
    assert _rejected(ISSUER.review(forged, audiences=[], now=NOW)) == "invalid signature"


def test_a_token_signed_by_another_key_fails_the_signature() -> None:
    impostor = TokenIssuer(_key_pem())
    assert _rejected(ISSUER.review(_issue(impostor), audiences=[], now=NOW)) == "invalid signature"


def test_alg_none_is_refused() -> None:
    header = _b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    token = f"{header}.{_b64(json.dumps(_valid_claims()).encode())}."
    assert '"none" is not allowed' in _rejected(ISSUER.review(token, audiences=[], now=NOW))


def test_hmac_keyed_with_the_public_key_is_refused() -> None:
    public_pem = (
        serialization.load_pem_private_key(KEY_PEM, None)
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    signing_input = ".".join([_b64(json.dumps({"alg": "HS256"}).encode()), _b64(json.dumps(_valid_claims()).encode())])
    mac = hmac.new(public_pem, signing_input.encode(), hashlib.sha256).digest()
    token = f"{signing_input}.{_b64(mac)}"
    assert '"HS256" is not allowed' in _rejected(ISSUER.review(token, audiences=[], now=NOW))


def test_a_token_from_another_issuer_is_rejected() -> None:
    other = TokenIssuer(KEY_PEM, issuer="https://elsewhere.example", default_audiences=[DEFAULT_ISSUER])
    reason = _rejected(ISSUER.review(_issue(other), audiences=[], now=NOW))
    assert reason == f'token issuer "https://elsewhere.example" is not "{DEFAULT_ISSUER}"'


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"sub": "system:serviceaccount:default:admin"}, "sub claim does not match"),
        ({"kubernetes.io": {"namespace": "default"}}, "does not name a service account"),
        ({"exp": True}, "no valid exp"),
        ({"exp": 1e400}, "no valid exp"),
        ({"nbf": "soon"}, "malformed nbf"),
        ({"aud": []}, "malformed aud"),
        ({"jti": 7}, "malformed jti"),
    ],
)
def test_validly_signed_but_malformed_claims_are_rejected(change: dict[str, Any], reason: str) -> None:
    assert reason in _rejected(ISSUER.review(_sign(_valid_claims() | change), audiences=[], now=NOW))


def test_token_review_status_matches_kube_apiserver() -> None:
    result = ISSUER.review(_issue(bound_pod=None), audiences=[], now=NOW)
    assert isinstance(result, TokenIdentity)
    assert token_review_status(result) == {
        "authenticated": True,
        "user": {
            "username": "system:serviceaccount:default:builder",
            "uid": SA_UID,
            "groups": ["system:serviceaccounts", "system:serviceaccounts:default", "system:authenticated"],
            "extra": {"authentication.kubernetes.io/credential-id": [f"JTI={result.jti}"]},
        },
        "audiences": [DEFAULT_ISSUER],
    }
    assert token_review_status(TokenRejected("invalid signature")) == {
        "user": {},
        "error": "invalid signature",
    }


def test_bound_objects_must_still_exist_with_the_same_uids() -> None:
    identity = ISSUER.review(_issue(), audiences=[], now=NOW)
    assert isinstance(identity, TokenIdentity)
    assert check_bound_objects(identity, service_account_uid=SA_UID, pod_uid=POD.uid) is None
    assert check_bound_objects(identity, service_account_uid=None) == TokenRejected(
        'serviceaccounts "builder" not found'
    )
    assert check_bound_objects(identity, service_account_uid="new", pod_uid=POD.uid) == TokenRejected(
        f"service account UID (new) does not match claim ({SA_UID})"
    )
    assert check_bound_objects(identity, service_account_uid=SA_UID) == TokenRejected('pods "web-0" not found')
    assert check_bound_objects(identity, service_account_uid=SA_UID, pod_uid="new") == TokenRejected(
        f"pod UID (new) does not match claim ({POD.uid})"
    )
    assert check_bound_objects(
        identity, service_account_uid=SA_UID, pod_uid=POD.uid, pod_deleting=True
    ) == TokenRejected("token has been invalidated")


def test_signing_key_must_be_p256() -> None:
    with pytest.raises(SigningKeyError, match="not a PEM private key"):
        TokenIssuer(b"not a key")
    with pytest.raises(SigningKeyError, match="P-256"):
        TokenIssuer(_key_pem(ec.SECP384R1()))
    rsa_pem = rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(SigningKeyError, match="P-256"):
        TokenIssuer(rsa_pem)


@given(st.text())
def test_review_of_arbitrary_text_is_always_rejected(text: str) -> None:
    assert isinstance(ISSUER.review(text, audiences=[], now=NOW), TokenRejected)


segments = st.one_of(
    st.binary().map(_b64),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    ).map(lambda value: _b64(json.dumps(value).encode())),
    st.text(alphabet="abcAB-_=.+/ \x00\ud800"),
)


@given(st.lists(segments, min_size=1, max_size=4))
def test_review_of_jwt_shaped_garbage_is_always_rejected(parts: list[str]) -> None:
    assert isinstance(ISSUER.review(".".join(parts), audiences=[], now=NOW), TokenRejected)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@given(
    st.dictionaries(
        st.sampled_from(["iss", "sub", "aud", "exp", "nbf", "iat", "jti", "kubernetes.io", "other"]),
        json_values,
    ),
    st.booleans(),
)
def test_review_of_validly_signed_arbitrary_claims_never_raises(changes: dict[str, Any], keep: bool) -> None:
    claims: Any = (_valid_claims() | changes) if keep else changes
    result = ISSUER.review(_sign(claims), audiences=[], now=NOW)
    assert isinstance(result, TokenIdentity | TokenRejected)
