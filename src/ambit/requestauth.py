"""RequestAuthentication at a waypoint or gateway: which tokens a request carries, and whether they are valid.

Theory of operation: the shell hands :func:`authenticate` the request's method, target (path and query) and
headers, the :class:`~ambit.model.requestauth.RequestAuthentication` policies that apply to its destination, the
verification keys known so far (:class:`KeySets`, built from inline ``jwks`` and from what the shell fetched for
``jwksUri``) and the time. The answer is :class:`Authenticated` (the identity, or None without a token, and the
header changes to make before forwarding) or :class:`Rejected` (401 and Envoy's ``jwt_authn`` reason for the
access log). Nothing here does I/O or reads a clock; PyJWT checks every signature.

Istio configures Envoy's ``jwt_authn`` with one provider per JWT rule and the requirement
``any(P1, ..., Pn, all(any(P1, allow_missing), ..., any(Pn, allow_missing)))``; these rules are that requirement.

Locations:

1. A rule's locations are its ``fromHeaders`` (name, prefix), ``fromParams`` and ``fromCookies``; a rule with none of
   them uses ``Authorization: Bearer <token>`` and the ``access_token`` query parameter. A location is shared by
   every rule that lists it.
2. A header location reads the header's values joined by ``,``; with a prefix, the prefix must occur in it and the
   token is the run of base64url characters and dots after it. A parameter location reads the first occurrence of
   the parameter in the query (percent-decoded); a cookie location the first cookie of that name.

Verifying one token for one rule (Envoy's order, cheap checks before signatures):

3. At most :data:`MAX_TOKEN_BYTES`; three base64url segments; the header a JSON object with a supported ``alg``
   (``none`` is not one) and a string ``kid`` if any; the payload a JSON object at most :data:`MAX_CLAIM_DEPTH`
   deep whose registered claims have their types (``iss``, ``sub``, ``azp`` strings; ``aud`` a string or strings;
   ``exp``, ``nbf``, ``iat`` numbers).
4. The token's ``iss`` is the rule's issuer and the rule lists the token's location ("Jwt issuer is not
   configured").
5. ``nbf`` no later than now + :data:`CLOCK_SKEW_SECONDS`, ``exp`` no earlier than now - that skew; a token without
   ``exp`` does not expire (Envoy's default).
6. With audiences configured, one of the token's matches one of them, compared without an ``http://`` or
   ``https://`` scheme and one trailing ``/``.
7. A key of the rule's key set verifies the signature: a key with a ``kid`` only for tokens with that ``kid`` (or
   none), a key with an ``alg`` only for that ``alg``, and only a key of the algorithm's type (RSA for RS*/PS*,
   EC of the matching curve for ES*, ``oct`` for HS*, OKP Ed25519 for EdDSA): an HMAC token verifies only against
   an ``oct`` key the issuer published, never against an RSA or EC public key. Keys shorter than PyJWT's minimum
   (RSA 2048 bits, HMAC the digest size) verify nothing.

The decision:

8. A provider ``Pi`` passes when its locations hold at least one token and every one verifies for rule i.
   ``allow_missing`` passes when every token in every location verifies for some rule with the token's issuer
   that lists the location, which holds trivially without tokens.
9. The request is authenticated when ``allow_missing`` or any provider passes; otherwise it is rejected with 401
   and the reason of the first failing token, preferring a reason other than an unknown issuer.
10. The identity is that of the first verified token; None without a token. ``scope`` and ``permission`` claims
    (and the rule's ``spaceDelimitedClaims``) given as space-delimited strings are split into lists, as Istio
    normalizes them for ``request.auth.claims``.
11. Header changes: every header a rule writes (``outputPayloadToHeader``, ``outputClaimToHeaders``) is first removed
    from the request, so a client cannot forge them; then, for each verified token, its rule's payload header gets
    the token's payload segment (base64url) and its claim headers get the claim's value (strings, numbers,
    booleans, lists of those joined by ``,``; nested claims by ``.``; a value with a control or non-ASCII
    character is left out). A verified token read from a header is removed unless its rule says ``forwardOriginalToken``
    (Envoy does not remove tokens from parameters or cookies).
12. A CORS preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) is not authenticated
    (Istio's ``bypass_cors_preflight``); rule 11's removals still apply.
13. :func:`authenticate` never raises on what a request carries, and :func:`parse_jwks` never raises on a key set.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jwt
from jwt.algorithms import Algorithm, get_default_algorithms
from jwt.api_jwk import PyJWK

from ambit.model.requestauth import (
    DEFAULT_HEADER,
    DEFAULT_PARAM,
    MAX_JWKS_BYTES,
    JwtRule,
    RequestAuthentication,
    RequestIdentity,
)
from ambit.model.routes import HeaderModifier

__all__ = [
    "CLOCK_SKEW_SECONDS",
    "MAX_CLAIM_DEPTH",
    "MAX_JWKS_BYTES",
    "MAX_JWKS_KEYS",
    "MAX_TOKEN_BYTES",
    "Authenticated",
    "JsonWebKey",
    "JsonWebKeySet",
    "KeySets",
    "Rejected",
    "applicable",
    "authenticate",
    "parse_jwks",
]

MAX_TOKEN_BYTES = 16 * 1024
"""A longer token is refused before any parsing. Envoy bounds tokens only by its 60 KiB header limit; 16 KiB holds
the largest tokens identity providers issue (Entra ID caps group claims at about 8 KiB of token)."""
MAX_JWKS_KEYS = 100
MAX_CLAIM_DEPTH = 32
"""Nesting of objects and arrays in a token payload."""
CLOCK_SKEW_SECONDS = 60
"""Envoy's default ``clock_skew_seconds``."""

# jwt_verify_lib's status texts, which Envoy logs and answers with.
BAD_FORMAT = "Jwt is not in the form of Header.Payload.Signature"
BAD_HEADER = "Jwt header is an invalid Base64url input or an invalid JSON"
BAD_ALG = "Jwt header [alg] field is not a string"
UNSUPPORTED_ALG = "Jwt header [alg] field value is invalid"
BAD_KID = "Jwt header [kid] field is not a string"
BAD_PAYLOAD = "Jwt payload is an invalid Base64 or an invalid JSON"
BAD_SIGNATURE_ENCODING = "Jwt signature is an invalid Base64"
UNKNOWN_ISSUER = "Jwt issuer is not configured"
NOT_YET_VALID = "Jwt not yet valid"
EXPIRED = "Jwt is expired"
AUDIENCE_NOT_ALLOWED = "Audiences in Jwt are not allowed"
VERIFICATION_FAILS = "Jwt verification fails"
NO_MATCHING_KEY = "Jwks doesn't have key to match kid or alg from Jwt"
JWKS_FETCH_FAILED = "Jwks remote fetch is failed"
JWKS_NOT_JSON = "Jwks is an invalid JSON"
JWKS_NO_KEYS = "Jwks does not have [keys] field"
JWKS_KEYS_NOT_ARRAY = "[keys] in Jwks is not an array"
JWKS_NO_VALID_KEYS = "Jwks doesn't have any valid public key"
TOKEN_TOO_LONG = "Jwt is longer than 16384 bytes"

ALGORITHMS = frozenset(
    (
        "RS256",
        "RS384",
        "RS512",
        "PS256",
        "PS384",
        "PS512",
        "ES256",
        "ES384",
        "ES512",
        "HS256",
        "HS384",
        "HS512",
        "EdDSA",
    )
)
_JWT_CHARS = re.compile(r"[A-Za-z0-9_.\-]+")
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
"""What a claim may hold to be written into a header: HTTP/1.1 carries ASCII (h11 refuses anything else)."""
_SPACE_DELIMITED = ("scope", "permission")
_WWW_AUTHENTICATE = ("www-authenticate", 'Bearer error="invalid_token"')


# Keys.


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
_PYJWT_ALGORITHMS = get_default_algorithms()


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
    try:
        # PyJWK builds the key from the JWK; rule 7 then decides which algorithms may use it.
        key = PyJWK({k: v for k, v in entry.items() if k != "alg"}, algorithm=names[0]).key
    except (jwt.PyJWTError, ValueError, TypeError, KeyError, OverflowError, binascii.Error):
        return None
    verifiers: dict[str, tuple[Algorithm, Any]] = {}
    for name in names:
        algorithm = _PYJWT_ALGORITHMS[name]
        try:
            prepared = algorithm.prepare_key(key)
        except (jwt.PyJWTError, ValueError, TypeError):
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


# Outcomes.


@dataclass(frozen=True, slots=True)
class Authenticated:
    identity: RequestIdentity | None
    """The first verified token's; None when the request carried no token."""
    request_headers: HeaderModifier | None = None
    """What to change before forwarding (rule 11); None: nothing."""


@dataclass(frozen=True, slots=True)
class Rejected:
    reason: str
    """Envoy's text, for the access log and the answer's body."""
    status: int = 401
    headers: tuple[tuple[str, str], ...] = (_WWW_AUTHENTICATE,)

    @property
    def body(self) -> bytes:
        return self.reason.encode()


Outcome = Authenticated | Rejected


# Tokens.

_Location = tuple[str, str, str]
"""``("header", name, prefix)``, ``("param", name, "")`` or ``("cookie", name, "")``."""


def _locations(rule: JwtRule) -> tuple[_Location, ...]:
    if not (rule.from_headers or rule.from_params or rule.from_cookies):
        return (("header", DEFAULT_HEADER.name, DEFAULT_HEADER.prefix), ("param", DEFAULT_PARAM, ""))
    return (
        *(("header", h.name.lower(), h.prefix) for h in rule.from_headers),
        *(("param", p, "") for p in rule.from_params),
        *(("cookie", c, "") for c in rule.from_cookies),
    )


@dataclass(frozen=True, slots=True)
class _Parsed:
    alg: str
    kid: str
    claims: dict[str, Any]
    payload_segment: str
    signing_input: bytes
    signature: bytes


def _b64decode(segment: str) -> bytes | None:
    if not _B64URL.fullmatch(segment) or len(segment) % 4 == 1:
        return None
    try:
        return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
    except (binascii.Error, ValueError):
        return None


def _json_object(data: bytes | None) -> dict[str, Any] | None:
    if data is None:
        return None
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) and _depth_ok(value) else None


def _depth_ok(value: object) -> bool:
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > MAX_CLAIM_DEPTH:
            return False
        stack.extend((child, depth + 1) for child in children)
    return True


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _parse(token: str) -> _Parsed | str:
    """The token's header and claims, unverified (rule 3), or the reason it is malformed."""
    if len(token) > MAX_TOKEN_BYTES:
        return TOKEN_TOO_LONG
    parts = token.split(".")
    if len(parts) != 3:
        return BAD_FORMAT
    header = _json_object(_b64decode(parts[0]))
    if header is None:
        return BAD_HEADER
    alg = header.get("alg")
    if not isinstance(alg, str):
        return BAD_ALG
    if alg not in ALGORITHMS:
        return UNSUPPORTED_ALG
    kid = header.get("kid", "")
    if not isinstance(kid, str):
        return BAD_KID
    claims = _json_object(_b64decode(parts[1]))
    if claims is None:
        return BAD_PAYLOAD
    for name in ("iss", "sub", "azp"):
        if name in claims and not isinstance(claims[name], str):
            return BAD_PAYLOAD
    aud = claims.get("aud", [])
    if not (isinstance(aud, str) or (isinstance(aud, list) and all(isinstance(a, str) for a in aud))):
        return BAD_PAYLOAD
    for name in ("exp", "nbf", "iat"):
        if name in claims and not _number(claims[name]):
            return BAD_PAYLOAD
    signature = _b64decode(parts[2])
    if signature is None:
        return BAD_SIGNATURE_ENCODING
    return _Parsed(alg, kid, claims, parts[1], f"{parts[0]}.{parts[1]}".encode(), signature)


def _audiences(claims: Mapping[str, Any]) -> tuple[str, ...]:
    aud = claims.get("aud", ())
    return (aud,) if isinstance(aud, str) else tuple(aud)


def _bare_audience(audience: str) -> str:
    for scheme in ("http://", "https://"):
        if audience.startswith(scheme):
            audience = audience[len(scheme) :]
            break
    return audience[:-1] if audience.endswith("/") else audience


def _verify(parsed: _Parsed, rule: JwtRule, keys: KeySets, now: float) -> str | None:
    """Rules 5-7 for a token whose issuer is the rule's: None when it verifies, else the reason."""
    claims = parsed.claims
    nbf, exp = claims.get("nbf"), claims.get("exp")
    if nbf is not None and nbf > now + CLOCK_SKEW_SECONDS:
        return NOT_YET_VALID
    if exp is not None and exp < now - CLOCK_SKEW_SECONDS:
        return EXPIRED
    if rule.audiences:
        wanted = {_bare_audience(a) for a in rule.audiences}
        if not any(_bare_audience(a) in wanted for a in _audiences(claims)):
            return AUDIENCE_NOT_ALLOWED
    key_set = keys.find(rule)
    if isinstance(key_set, JwksRejected):
        return key_set.reason
    candidates = [k for k in key_set.keys if k.fits(parsed.alg, parsed.kid)]
    if not candidates:
        return NO_MATCHING_KEY
    for key in candidates:
        algorithm, prepared = key.verifiers[parsed.alg]
        try:
            if algorithm.verify(parsed.signing_input, prepared, parsed.signature):
                return None
        except (jwt.PyJWTError, ValueError, TypeError, OverflowError):
            continue
    return VERIFICATION_FAILS


# Reading the request.


def _query_params(target: str) -> dict[str, str]:
    _, _, query = target.partition("?")
    query = query.partition("#")[0]
    params: dict[str, str] = {}
    for part in query.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        name = urllib.parse.unquote(name, errors="replace")
        params.setdefault(name, urllib.parse.unquote(value, errors="replace"))
    return params


def _cookies(headers: Sequence[tuple[str, str]]) -> dict[str, str]:
    cookies: dict[str, str] = {}
    for name, value in headers:
        if name != "cookie":
            continue
        for pair in value.split(";"):
            key, sep, val = pair.strip().partition("=")
            if not sep or not key:
                continue
            val = val.strip()
            if len(val) >= 2 and val[0] == val[-1] == '"':
                val = val[1:-1]
            cookies.setdefault(key.strip(), val)
    return cookies


def _extract(
    locations: Iterable[_Location], target: str, headers: Sequence[tuple[str, str]]
) -> list[tuple[_Location, str]]:
    found: list[tuple[_Location, str]] = []
    params: dict[str, str] | None = None
    cookies: dict[str, str] | None = None
    for location in locations:
        kind, name, prefix = location
        if kind == "header":
            values = [v for n, v in headers if n == name]
            if not values:
                continue
            value = ",".join(values)
            if prefix:
                at = value.find(prefix)
                if at < 0:
                    continue
                run = _JWT_CHARS.search(value, at + len(prefix))
                value = value if run is None else run.group()
            found.append((location, value))
        elif kind == "param":
            params = _query_params(target) if params is None else params
            if name in params:
                found.append((location, params[name]))
        else:
            cookies = _cookies(headers) if cookies is None else cookies
            if name in cookies:
                found.append((location, cookies[name]))
    return found


def _is_preflight(method: str, headers: Sequence[tuple[str, str]]) -> bool:
    names = {n for n, _ in headers}
    return method == "OPTIONS" and "origin" in names and "access-control-request-method" in names


# The decision.


def applicable(policies: Iterable[RequestAuthentication], service_key: str) -> tuple[RequestAuthentication, ...]:
    """The policies that apply to a request for ``service_key`` (``namespace/hostname``; empty for a workload)."""
    return tuple(p for p in policies if not p.services or service_key in p.services)


def _claim(claims: Mapping[str, Any], path: str) -> object:
    value: object = claims.get(path)
    if value is None and "." in path:
        value = claims
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
    return value


def _header_text(value: object) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = value
    elif isinstance(value, int) or (isinstance(value, float) and value.is_integer() and math.isfinite(value)):
        text = str(int(value))
    elif isinstance(value, float) and math.isfinite(value):
        text = repr(value)
    elif isinstance(value, list) and value and all(not isinstance(v, (list, dict)) for v in value):
        parts = [_header_text(v) for v in value]
        if any(p is None for p in parts):
            return None
        text = ",".join(p for p in parts if p is not None)
    else:
        return None
    return text if _HEADER_VALUE.fullmatch(text) else None


def _identity(claims: dict[str, Any], rule: JwtRule) -> RequestIdentity:
    normalized = dict(claims)
    for name in (*_SPACE_DELIMITED, *rule.space_delimited_claims):
        if isinstance(normalized.get(name), str):
            normalized[name] = normalized[name].split()
    return RequestIdentity(
        issuer=claims.get("iss", ""),
        subject=claims.get("sub", ""),
        audiences=_audiences(claims),
        presenter=claims.get("azp", ""),
        claims=normalized,
    )


def authenticate(
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]],
    policies: Sequence[RequestAuthentication],
    keys: KeySets,
    now: float,
) -> Authenticated | Rejected:
    """Rules 1-13 for one request; ``headers`` have lower-case names, ``target`` is the path with its query."""
    rules = [rule for policy in policies for rule in policy.rules]
    if not rules:
        return Authenticated(None)
    written: list[str] = []
    for rule in rules:
        for name in (rule.output_payload_to_header, *(c.header for c in rule.output_claim_to_headers)):
            if name and name.lower() not in written:
                written.append(name.lower())
    sanitize = HeaderModifier(remove=tuple(written)) if written else None
    if _is_preflight(method, headers):
        return Authenticated(None, sanitize)

    rule_locations = [_locations(rule) for rule in rules]
    ordered: list[_Location] = []
    for locations in rule_locations:
        ordered.extend(loc for loc in locations if loc not in ordered)
    tokens = _extract(ordered, target, headers)
    if not tokens:
        return Authenticated(None, sanitize)

    parsed = [_parse(text) for _, text in tokens]
    verdicts: dict[tuple[int, int], str | None] = {}

    def check(t: int, r: int) -> str | None:
        """Rules 4-7 for token ``t`` and rule ``r`` (memoized: several requirements ask the same)."""
        if (t, r) not in verdicts:
            p, rule = parsed[t], rules[r]
            if isinstance(p, str):
                verdicts[t, r] = p
            elif p.claims.get("iss") != rule.issuer or tokens[t][0] not in rule_locations[r]:
                verdicts[t, r] = UNKNOWN_ISSUER
            else:
                verdicts[t, r] = _verify(p, rule, keys, now)
        return verdicts[t, r]

    # allow_missing: every token verifies for some rule that lists its location (rule 8).
    accepted: list[tuple[int, int]] | None = []
    failures: list[str] = []
    for t in range(len(tokens)):
        reasons = [check(t, r) for r in range(len(rules))]
        good = next((r for r, reason in enumerate(reasons) if reason is None), None)
        if good is None:
            failures.extend(r for r in reasons if r is not None)
            accepted = None
            break
        assert accepted is not None
        accepted.append((t, good))
    if accepted is None:
        for r in range(len(rules)):
            mine = [t for t, (loc, _) in enumerate(tokens) if loc in rule_locations[r]]
            if mine and all(check(t, r) is None for t in mine):
                accepted = [(t, r) for t in mine]
                break
    if accepted is None:
        specific = [f for f in failures if f != UNKNOWN_ISSUER]
        return Rejected(specific[0] if specific else failures[0] if failures else UNKNOWN_ISSUER)

    sets: dict[str, str] = {}
    removes = list(written)
    for t, r in accepted:
        rule, p = rules[r], parsed[t]
        assert not isinstance(p, str)
        if rule.output_payload_to_header:
            sets[rule.output_payload_to_header.lower()] = p.payload_segment
        for mapping in rule.output_claim_to_headers:
            text = _header_text(_claim(p.claims, mapping.claim))
            if text is not None:
                sets[mapping.header.lower()] = text
        kind, name, _ = tokens[t][0]
        if kind == "header" and not rule.forward_original_token and name not in removes:
            removes.append(name)
    first_token, first_rule = accepted[0]
    first = parsed[first_token]
    assert not isinstance(first, str)
    changes = HeaderModifier(set=tuple(sets.items()), remove=tuple(n for n in removes if n not in sets))
    identity = _identity(first.claims, rules[first_rule])
    return Authenticated(identity, changes if (changes.set or changes.remove) else None)
