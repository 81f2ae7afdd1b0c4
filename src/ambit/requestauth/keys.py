"""JSON Web Key Sets: parsed once (inline ``jwks``, or what the shell fetched for ``jwksUri``), each key prepared
for the algorithms it may verify.

Theory of operation: :func:`parse_jwks` reads a key set as jwt_verify_lib does: a JSON object with a ``keys`` list,
entries that are not usable public keys left out (and counted), refused when none is left. PyJWT builds each key
from its JWK; a key may verify only the algorithms of its type and curve (RSA: RS*/PS*; EC: the ES* of its curve;
``oct``: HS*; OKP Ed25519: EdDSA), only its own ``alg`` if it names one, and none when it is shorter than PyJWT's
minimum (RSA 2048 bits, HMAC the digest size). :class:`KeySets` holds the sets of every rule for one request.
Never raises on a key set.

PyJWT is imported by the first key set parsed (:func:`_pyjwt`), when a RequestAuthentication's keys arrive (inline
in the configuration, or fetched), not when a request comes: a proxy that no RequestAuthentication applies to
never loads it.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from ambit.model.requestauth import MAX_JWKS_BYTES, JwtRule, RequestAuthentication
from ambit.requestauth.reasons import (
    JWKS_FETCH_FAILED,
    JWKS_KEYS_NOT_ARRAY,
    JWKS_NO_KEYS,
    JWKS_NO_VALID_KEYS,
    JWKS_NOT_JSON,
)

if TYPE_CHECKING:
    from jwt.algorithms import Algorithm

__all__ = ["MAX_JWKS_KEYS", "JsonWebKey", "JsonWebKeySet", "JwksRejected", "KeySets", "parse_jwks"]

MAX_JWKS_KEYS = 100
"""Entries of one key set looked at; the rest are left out."""


@dataclass(frozen=True, slots=True)
class JsonWebKey:
    kty: str
    verifiers: Mapping[str, tuple[Algorithm, Any]] = field(compare=False)
    """By algorithm name: PyJWT's algorithm and this key prepared for it, for each algorithm the key may verify
    (rule 7: its type and curve, its own ``alg`` if it names one, and PyJWT's minimum key length)."""
    kid: str = ""

    def fits(self, alg: str, kid: str) -> bool:
        """Whether this key may verify a token signed with ``alg`` and naming ``kid`` (rule 7)."""
        return alg in self.verifiers and not (kid and self.kid and kid != self.kid)


@dataclass(frozen=True, slots=True)
class JsonWebKeySet:
    keys: tuple[JsonWebKey, ...]
    skipped: int = 0
    """Entries that were not usable public keys (left out, as Envoy does)."""


@dataclass(frozen=True, slots=True)
class JwksRejected:
    reason: str


def parse_jwks(text: str | bytes) -> JsonWebKeySet | JwksRejected:
    """A JSON Web Key Set, with its unusable entries left out; never raises."""
    if len(text) > MAX_JWKS_BYTES:
        return JwksRejected(f"Jwks is longer than {MAX_JWKS_BYTES} bytes")
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):
        return JwksRejected(JWKS_NOT_JSON)
    if not isinstance(document, dict) or "keys" not in document:
        return JwksRejected(JWKS_NO_KEYS)
    entries = document["keys"]
    if not isinstance(entries, list):
        return JwksRejected(JWKS_KEYS_NOT_ARRAY)
    keys: list[JsonWebKey] = []
    skipped = 0
    for entry in entries[:MAX_JWKS_KEYS]:
        key = _key(entry)
        if key is None:
            skipped += 1
        else:
            keys.append(key)
    skipped += max(0, len(entries) - MAX_JWKS_KEYS)
    if not keys:
        return JwksRejected(JWKS_NO_VALID_KEYS)
    return JsonWebKeySet(tuple(keys), skipped)


_KEY_ALGORITHMS = {
    ("RSA", ""): ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512"),
    ("EC", "P-256"): ("ES256",),
    ("EC", "P-384"): ("ES384",),
    ("EC", "P-521"): ("ES512",),
    ("oct", ""): ("HS256", "HS384", "HS512"),
    ("OKP", "Ed25519"): ("EdDSA",),
}


@cache
def _pyjwt() -> tuple[type[Any], type[Exception], dict[str, Algorithm]]:
    """PyJWT's JWK class, its error root and its algorithms by name, imported on first use."""
    import jwt
    from jwt.algorithms import get_default_algorithms
    from jwt.api_jwk import PyJWK

    return PyJWK, jwt.PyJWTError, get_default_algorithms()


def _key(entry: object) -> JsonWebKey | None:
    if not isinstance(entry, dict):
        return None
    kty, kid, alg, crv, use = (entry.get(k, "") for k in ("kty", "kid", "alg", "crv", "use"))
    if not all(isinstance(v, str) for v in (kty, kid, alg, crv, use)) or (use and use != "sig"):
        return None
    names = _KEY_ALGORITHMS.get((kty, crv if kty in ("EC", "OKP") else ""), ())
    if alg:
        names = tuple(n for n in names if n == alg)
    if not names:
        return None
    jwk, jwt_error, algorithms = _pyjwt()
    try:
        # PyJWK builds the key from the JWK; rule 7 then decides which algorithms may use it.
        key = jwk({k: v for k, v in entry.items() if k != "alg"}, algorithm=names[0]).key
    except (jwt_error, ValueError, TypeError, KeyError, OverflowError, binascii.Error):
        return None
    verifiers: dict[str, tuple[Algorithm, Any]] = {}
    for name in names:
        algorithm = algorithms[name]
        try:
            prepared = algorithm.prepare_key(key)
        except (jwt_error, ValueError, TypeError):
            continue
        if algorithm.check_key_length(prepared) is None:
            verifiers[name] = (algorithm, prepared)
    return JsonWebKey(kty=kty, verifiers=verifiers, kid=kid) if verifiers else None


@dataclass(frozen=True, slots=True)
class KeySets:
    """The keys of every rule: inline ``jwks`` parsed once, and what the shell fetched for each ``jwksUri``."""

    inline: Mapping[str, JsonWebKeySet | JwksRejected] = field(default_factory=dict)
    remote: Mapping[str, JsonWebKeySet | JwksRejected] = field(default_factory=dict)
    """By URI; a URI not (yet) here has no keys: its tokens are refused with :data:`JWKS_FETCH_FAILED`."""

    @classmethod
    def build(
        cls,
        policies: Iterable[RequestAuthentication],
        remote: Mapping[str, JsonWebKeySet | JwksRejected] | None = None,
    ) -> KeySets:
        inline: dict[str, JsonWebKeySet | JwksRejected] = {}
        for policy in policies:
            for rule in policy.rules:
                if not rule.jwks_uri and rule.jwks not in inline:
                    inline[rule.jwks] = parse_jwks(rule.jwks)
        return cls(inline, dict(remote or {}))

    def find(self, rule: JwtRule) -> JsonWebKeySet | JwksRejected:
        if rule.jwks_uri:
            return self.remote.get(rule.jwks_uri, JwksRejected(JWKS_FETCH_FAILED))
        found = self.inline.get(rule.jwks)
        return parse_jwks(rule.jwks) if found is None else found
