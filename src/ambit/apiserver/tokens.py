"""Service-account tokens, issued and reviewed as kube-apiserver does for TokenRequest and TokenReview.

Theory of operation: a token is a compact JWS signed ES256 by the API server's signing key, with a ``kid``
header that is the base64url (unpadded) SHA-256 of the key's DER SubjectPublicKeyInfo, as kube computes it.
Its claims are those of kube's bound tokens::

    iss, sub = system:serviceaccount:<ns>:<sa>, aud (list), exp, iat, nbf, jti (random UUID),
    kubernetes.io = {namespace, serviceaccount: {name, uid}, pod: {name, uid}}   (pod only when bound)

Audiences: the API server has its own audiences (``default_audiences``, by default ``[issuer]``, like
``--api-audiences`` defaulting to ``--service-account-issuer``). A TokenRequest without audiences gets them,
and a TokenReview without audiences checks against them; otherwise the token must carry at least one of the
requested audiences and the review answers with the intersection, in the token's order.

Review rules, applied in this order (the first failure is the answer):

1. The token is an ASCII JWS whose header says ``alg: ES256``; ``none`` and every other algorithm are refused
   before any signature work.
2. The signature verifies under this issuer's key, and no other.
3. ``iss`` is this issuer; ``exp`` is in the future (no leeway); ``nbf`` and ``iat`` are no more than
   :data:`LEEWAY` seconds in the future.
4. The ``kubernetes.io`` claim is well formed and ``sub`` names the same service account.
5. The audiences intersect, as above.

Reviewing never raises on bad input: every failure is a :class:`TokenRejected` with a one-line reason. What
this module cannot check is whether the service account (and the bound pod) still exist with the uids the
token names; the caller owns the store, looks them up and asks :func:`check_bound_objects`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

from ambit.apiserver.token_binding import DEFAULT_MAX_TOKEN_EXPIRATION, MAX_EXPIRATION_SECONDS, MIN_EXPIRATION_SECONDS
from ambit.errors import AmbitError

DEFAULT_ISSUER = "https://kubernetes.default.svc.cluster.local"
LEEWAY = 60
"""Seconds a token's ``nbf`` and ``iat`` may lie in the future, for clock skew between issuers and us."""

ALGORITHM = "ES256"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
POD_NAME_KEY = "authentication.kubernetes.io/pod-name"
POD_UID_KEY = "authentication.kubernetes.io/pod-uid"
CREDENTIAL_ID_KEY = "authentication.kubernetes.io/credential-id"


class SigningKeyError(AmbitError):
    """The service-account signing key is not a PEM ECDSA P-256 private key."""


@dataclass(frozen=True, slots=True)
class BoundObject:
    """An object a token is bound to, named as in the TokenRequest's ``boundObjectRef``."""

    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """A namespaced object a reviewed token names; the caller checks it still exists with this uid."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class IssuedToken:
    token: str
    expires_at: float


@dataclass(frozen=True, slots=True)
class TokenIdentity:
    """A token that passed review: the user it authenticates, and what it is bound to."""

    service_account: ObjectRef
    pod: ObjectRef | None
    jti: str | None
    audiences: tuple[str, ...]
    expires_at: float

    @property
    def namespace(self) -> str:
        """The service account's namespace, which is also the bound pod's."""
        return self.service_account.namespace

    @property
    def username(self) -> str:
        return f"{SERVICE_ACCOUNT_PREFIX}{self.service_account.namespace}:{self.service_account.name}"

    @property
    def uid(self) -> str:
        return self.service_account.uid

    @property
    def groups(self) -> tuple[str, ...]:
        namespace = self.service_account.namespace
        return ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated")

    @property
    def extra(self) -> dict[str, list[str]]:
        """kube's user extras: the pod when bound, and the credential id whenever the token has a ``jti``."""
        extra: dict[str, list[str]] = {}
        if self.pod is not None:
            extra[POD_NAME_KEY] = [self.pod.name]
            extra[POD_UID_KEY] = [self.pod.uid]
        if self.jti is not None:
            extra[CREDENTIAL_ID_KEY] = [f"JTI={self.jti}"]
        return extra


@dataclass(frozen=True, slots=True)
class TokenRejected:
    reason: str


class TokenIssuer:
    """Signs and reviews one API server's service-account tokens.

    ``default_audiences`` are the API server's own audiences (kube's ``--api-audiences``); they default to
    ``[issuer]`` and must not be empty. ``max_expiration_seconds`` caps TokenRequests (default 48 h).
    """

    def __init__(
        self,
        signing_key_pem: bytes,
        issuer: str = DEFAULT_ISSUER,
        *,
        default_audiences: Sequence[str] | None = None,
        max_expiration_seconds: int = DEFAULT_MAX_TOKEN_EXPIRATION,
    ) -> None:
        self.issuer = issuer
        self.max_expiration_seconds = max_expiration_seconds
        """The longest lifetime a TokenRequest is granted (kube's ``--service-account-max-token-expiration``);
        0 sets no cap. :meth:`issue` itself signs what it is told: the cap is the TokenRequest's rule."""
        self.default_audiences: tuple[str, ...] = (issuer,) if default_audiences is None else tuple(default_audiences)
        if not self.default_audiences:
            raise ValueError("default_audiences must not be empty")
        self._private_key = _load_signing_key(signing_key_pem)
        self._public_key = self._private_key.public_key()
        der = self._public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        self.key_id = base64.urlsafe_b64encode(hashlib.sha256(der).digest()).rstrip(b"=").decode()
        self._jws = jwt.PyJWS(algorithms=[ALGORITHM])

    def jwks(self) -> dict[str, Any]:
        """The JSON Web Key Set kube serves at ``/openid/v1/jwks``."""
        jwk = dict(ECAlgorithm.to_jwk(self._public_key, as_dict=True))
        jwk.update({"use": "sig", "kid": self.key_id, "alg": ALGORITHM})
        return {"keys": [jwk]}

    def issue(
        self,
        *,
        namespace: str,
        service_account: str,
        service_account_uid: str,
        audiences: Sequence[str],
        now: float,
        expiration_seconds: int,
        bound_pod: BoundObject | None = None,
    ) -> IssuedToken:
        """A token for the service account; ``expiration_seconds`` is clamped to [600, 2**32] (TokenRequest refuses
        values outside, and caps them at :attr:`max_expiration_seconds`, before asking)."""
        lifetime = min(max(expiration_seconds, MIN_EXPIRATION_SECONDS), MAX_EXPIRATION_SECONDS)
        issued_at = int(now)
        expires_at = issued_at + lifetime
        private: dict[str, Any] = {
            "namespace": namespace,
            "serviceaccount": {"name": service_account, "uid": service_account_uid},
        }
        if bound_pod is not None:
            private["pod"] = {"name": bound_pod.name, "uid": bound_pod.uid}
        claims = {
            "aud": list(audiences) if audiences else list(self.default_audiences),
            "exp": expires_at,
            "iat": issued_at,
            "iss": self.issuer,
            "jti": str(uuid.uuid4()),
            "kubernetes.io": private,
            "nbf": issued_at,
            "sub": f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{service_account}",
        }
        payload = json.dumps(claims, separators=(",", ":")).encode()
        # kube's header is exactly {"alg", "kid"}: a None "typ" makes PyJWT leave its default out.
        token = self._jws.encode(
            payload, self._private_key, algorithm=ALGORITHM, headers={"kid": self.key_id, "typ": None}
        )
        return IssuedToken(token=token, expires_at=float(expires_at))

    def review(self, token: str, *, audiences: Sequence[str], now: float) -> TokenIdentity | TokenRejected:
        """Verify ``token`` as a TokenReview with ``spec.audiences = audiences`` would; never raises."""
        claims = self._verified_claims(token)
        if isinstance(claims, TokenRejected):
            return claims
        if claims.get("iss") != self.issuer:
            return TokenRejected(f"token issuer {_quote(claims.get('iss'))} is not {_quote(self.issuer)}")
        times = _times(claims, now)
        if isinstance(times, TokenRejected):
            return times
        subject = _subject(claims)
        if isinstance(subject, TokenRejected):
            return subject
        service_account, pod, jti = subject
        token_audiences = _audiences(claims.get("aud"))
        if token_audiences is None:
            return TokenRejected("token has a malformed aud claim")
        wanted = tuple(audiences) if audiences else self.default_audiences
        matched = tuple(aud for aud in token_audiences if aud in wanted)
        if not matched:
            return TokenRejected(
                f"token audiences {_go_list(token_audiences)} is invalid for the target audiences {_go_list(wanted)}"
            )
        return TokenIdentity(
            service_account=service_account,
            pod=pod,
            jti=jti,
            audiences=matched,
            expires_at=times,
        )

    def _verified_claims(self, token: str) -> dict[str, Any] | TokenRejected:
        if not isinstance(token, str) or not token.isascii():
            return TokenRejected("token is not a JWT")
        try:
            header = self._jws.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            return TokenRejected(f"token is not a JWT: {exc}")
        if header.get("alg") != ALGORITHM:
            return TokenRejected(f"token algorithm {_quote(header.get('alg'))} is not allowed; only ES256 is")
        try:
            payload = self._jws.decode_complete(token, self._public_key, algorithms=[ALGORITHM])["payload"]
        except jwt.InvalidSignatureError:
            return TokenRejected("invalid signature")
        except jwt.PyJWTError as exc:
            return TokenRejected(f"token is not a JWT: {exc}")
        try:
            claims = json.loads(payload)
        except (ValueError, RecursionError):
            return TokenRejected("token payload is not JSON")
        if not isinstance(claims, dict):
            return TokenRejected("token payload is not a JSON object")
        return claims


def check_bound_objects(
    identity: TokenIdentity,
    *,
    service_account_uid: str | None,
    pod_uid: str | None = None,
    pod_deleting: bool = False,
) -> TokenRejected | None:
    """Whether the objects a reviewed token names still stand, given what the caller found in its store.

    Pass the uid of the service account found under ``identity.service_account`` (``None`` when there is
    none) and, for a pod-bound token, the uid of the pod found under ``identity.pod`` and whether it is
    being deleted. Messages are kube-apiserver's.
    """
    sa = identity.service_account
    if service_account_uid is None:
        return TokenRejected(f'serviceaccounts "{sa.name}" not found')
    if service_account_uid != sa.uid:
        return TokenRejected(f"service account UID ({service_account_uid}) does not match claim ({sa.uid})")
    if identity.pod is None:
        return None
    if pod_uid is None:
        return TokenRejected(f'pods "{identity.pod.name}" not found')
    if pod_uid != identity.pod.uid:
        return TokenRejected(f"pod UID ({pod_uid}) does not match claim ({identity.pod.uid})")
    if pod_deleting:
        return TokenRejected("token has been invalidated")
    return None


def token_review_status(result: TokenIdentity | TokenRejected) -> dict[str, Any]:
    """The ``status`` of an authentication.k8s.io/v1 TokenReview, with kube's omitempty fields left out."""
    if isinstance(result, TokenRejected):
        return {"user": {}, "error": result.reason}
    user: dict[str, Any] = {"username": result.username, "uid": result.uid, "groups": list(result.groups)}
    if result.extra:
        user["extra"] = result.extra
    status: dict[str, Any] = {"authenticated": True, "user": user}
    if result.audiences:
        status["audiences"] = list(result.audiences)
    return status


def _load_signing_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise SigningKeyError(f"service-account signing key is not a PEM private key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise SigningKeyError("service-account signing key is not an ECDSA P-256 key")
    return key


def _times(claims: Mapping[str, Any], now: float) -> float | TokenRejected:
    """``exp``, once ``exp``, ``nbf`` and ``iat`` are checked against ``now``."""
    exp = _number(claims.get("exp"))
    if exp is None:
        return TokenRejected("token has no valid exp claim")
    if now >= exp:
        return TokenRejected("service account token has expired")
    for name, message in (
        ("nbf", "service account token is not valid yet"),
        ("iat", "service account token is issued in the future"),
    ):
        if claims.get(name) is None:
            continue
        when = _number(claims[name])
        if when is None:
            return TokenRejected(f"token has a malformed {name} claim")
        if now + LEEWAY < when:
            return TokenRejected(message)
    return exp


def _subject(claims: Mapping[str, Any]) -> tuple[ObjectRef, ObjectRef | None, str | None] | TokenRejected:
    """The service account, the bound pod and the jti, from a consistent ``sub`` and ``kubernetes.io``."""
    private = claims.get("kubernetes.io")
    if not isinstance(private, dict):
        return TokenRejected("token has no kubernetes.io claim")
    namespace = private.get("namespace")
    sa = _name_and_uid(private.get("serviceaccount"))
    if not isinstance(namespace, str) or not namespace or sa is None:
        return TokenRejected("token's kubernetes.io claim does not name a service account")
    if claims.get("sub") != f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{sa[0]}":
        return TokenRejected("token's sub claim does not match its kubernetes.io claim")
    pod: ObjectRef | None = None
    if private.get("pod") is not None:
        bound = _name_and_uid(private["pod"])
        if bound is None:
            return TokenRejected("token's kubernetes.io claim has a malformed pod")
        pod = ObjectRef(namespace, *bound)
    jti = claims.get("jti")
    if jti is not None and not isinstance(jti, str):
        return TokenRejected("token has a malformed jti claim")
    return ObjectRef(namespace, *sa), pod, jti or None


def _name_and_uid(value: object) -> tuple[str, str] | None:
    if not isinstance(value, dict):
        return None
    name, uid = value.get("name"), value.get("uid")
    if not isinstance(name, str) or not isinstance(uid, str) or not name or not uid:
        return None
    return name, uid


def _audiences(value: object) -> tuple[str, ...] | None:
    """RFC 7519 allows ``aud`` to be one string or a list of strings."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value and all(isinstance(aud, str) for aud in value):
        return tuple(value)
    return None


def _number(value: object) -> float | None:
    """A finite JSON number (NumericDate), or None; ``true`` is not 1 and 1e400 is not a time."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _quote(value: object) -> str:
    """A claim or header value for a message: short, and safe whatever the sender put there."""
    if isinstance(value, str):
        return json.dumps(value if len(value) <= 100 else value[:100] + "...")
    return "null" if value is None else f"<{type(value).__name__}>"


def _go_list(values: Sequence[str]) -> str:
    """A list of strings as Go's ``%q`` prints it, which kube's messages use: ``["a" "b"]``."""
    return "[" + " ".join(json.dumps(value) for value in values) + "]"
