"""Tokens: where a request carries them, and whether one verifies for one rule.

Theory of operation: :func:`extract_tokens` reads a request's token locations (rules 1-2 of
:mod:`ambit.requestauth`); :func:`parse_token` reads a token's header and claims without trusting them (rule 3);
:func:`verify_token` checks one parsed token against one rule (rules 5-7: times, audiences, then the signature with
PyJWT). The cheap checks come first, as in Envoy, so a malformed or expired token costs no signature work.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambit.model.requestauth import DEFAULT_HEADER, DEFAULT_PARAM, JwtRule
from ambit.requestauth.keys import JwksRejected, KeySets
from ambit.requestauth.reasons import (
    AUDIENCE_NOT_ALLOWED,
    BAD_ALG,
    BAD_FORMAT,
    BAD_HEADER,
    BAD_KID,
    BAD_PAYLOAD,
    BAD_SIGNATURE_ENCODING,
    EXPIRED,
    NO_MATCHING_KEY,
    NOT_YET_VALID,
    UNSUPPORTED_ALG,
    VERIFICATION_FAILS,
)

__all__ = [
    "ALGORITHMS",
    "CLOCK_SKEW_SECONDS",
    "MAX_CLAIM_DEPTH",
    "MAX_TOKEN_BYTES",
    "Location",
    "ParsedToken",
    "audiences_of",
    "extract_tokens",
    "is_cors_preflight",
    "locations_of",
    "parse_token",
    "verify_token",
]

MAX_TOKEN_BYTES = 16 * 1024
"""A longer token is refused before any parsing. Envoy bounds tokens only by its 60 KiB header limit; 16 KiB holds
the largest tokens identity providers issue (Entra ID caps group claims at about 8 KiB of token)."""
MAX_JWKS_KEYS = 100
TOKEN_TOO_LONG = f"Jwt is longer than {MAX_TOKEN_BYTES} bytes"
MAX_CLAIM_DEPTH = 32
"""Nesting of objects and arrays in a token payload."""
CLOCK_SKEW_SECONDS = 60
"""Envoy's default ``clock_skew_seconds``."""


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

Location = tuple[str, str, str]
"""``("header", name, prefix)``, ``("param", name, "")`` or ``("cookie", name, "")``."""


def locations_of(rule: JwtRule) -> tuple[Location, ...]:
    """Where ``rule`` reads tokens (rule 1), in its own order."""
    if not (rule.from_headers or rule.from_params or rule.from_cookies):
        return (("header", DEFAULT_HEADER.name, DEFAULT_HEADER.prefix), ("param", DEFAULT_PARAM, ""))
    return (
        *(("header", h.name.lower(), h.prefix) for h in rule.from_headers),
        *(("param", p, "") for p in rule.from_params),
        *(("cookie", c, "") for c in rule.from_cookies),
    )


@dataclass(frozen=True, slots=True)
class ParsedToken:
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


def parse_token(token: str) -> ParsedToken | str:
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
    return ParsedToken(alg, kid, claims, parts[1], f"{parts[0]}.{parts[1]}".encode(), signature)


def audiences_of(claims: Mapping[str, Any]) -> tuple[str, ...]:
    aud = claims.get("aud", ())
    return (aud,) if isinstance(aud, str) else tuple(aud)


def _bare_audience(audience: str) -> str:
    for scheme in ("http://", "https://"):
        if audience.startswith(scheme):
            audience = audience[len(scheme) :]
            break
    return audience[:-1] if audience.endswith("/") else audience


def verify_token(parsed: ParsedToken, rule: JwtRule, keys: KeySets, now: float) -> str | None:
    """Rules 5-7 for a token whose issuer is the rule's: None when it verifies, else the reason."""
    claims = parsed.claims
    nbf, exp = claims.get("nbf"), claims.get("exp")
    if nbf is not None and nbf > now + CLOCK_SKEW_SECONDS:
        return NOT_YET_VALID
    if exp is not None and exp < now - CLOCK_SKEW_SECONDS:
        return EXPIRED
    if rule.audiences:
        wanted = {_bare_audience(a) for a in rule.audiences}
        if not any(_bare_audience(a) in wanted for a in audiences_of(claims)):
            return AUDIENCE_NOT_ALLOWED
    key_set = keys.find(rule)
    if isinstance(key_set, JwksRejected):
        return key_set.reason
    candidates = [k for k in key_set.keys if k.fits(parsed.alg, parsed.kid)]
    if not candidates:
        return NO_MATCHING_KEY
    import jwt  # loaded already: a key set was parsed (:mod:`ambit.requestauth.keys`)

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


def extract_tokens(
    locations: Iterable[Location], target: str, headers: Sequence[tuple[str, str]]
) -> list[tuple[Location, str]]:
    found: list[tuple[Location, str]] = []
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


def is_cors_preflight(method: str, headers: Sequence[tuple[str, str]]) -> bool:
    names = {n for n, _ in headers}
    return method == "OPTIONS" and "origin" in names and "access-control-request-method" in names
