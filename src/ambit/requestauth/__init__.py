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
   (RSA 2048 bits, HMAC the digest size) are left out of the key set.

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

Modules: :mod:`~ambit.requestauth.tokens` (rules 1-7 for one token), :mod:`~ambit.requestauth.keys` (key sets),
:mod:`~ambit.requestauth.reasons` (Envoy's texts); this module decides (rules 8-12).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambit.model.requestauth import MAX_JWKS_BYTES, JwtRule, RequestAuthentication, RequestIdentity
from ambit.model.routes import HeaderModifier
from ambit.requestauth.keys import MAX_JWKS_KEYS, JsonWebKey, JsonWebKeySet, JwksRejected, KeySets, parse_jwks
from ambit.requestauth.reasons import UNKNOWN_ISSUER
from ambit.requestauth.tokens import (
    CLOCK_SKEW_SECONDS,
    MAX_CLAIM_DEPTH,
    MAX_TOKEN_BYTES,
    Location,
    audiences_of,
    extract_tokens,
    is_cors_preflight,
    locations_of,
    parse_token,
    verify_token,
)

__all__ = [
    "CLOCK_SKEW_SECONDS",
    "MAX_CLAIM_DEPTH",
    "MAX_JWKS_BYTES",
    "MAX_JWKS_KEYS",
    "MAX_TOKEN_BYTES",
    "Authenticated",
    "JsonWebKey",
    "JsonWebKeySet",
    "JwksRejected",
    "KeySets",
    "Rejected",
    "applicable",
    "authenticate",
    "parse_jwks",
]

_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
"""What a claim may hold to be written into a header: HTTP/1.1 carries ASCII (h11 refuses anything else)."""
_SPACE_DELIMITED = ("scope", "permission")
_WWW_AUTHENTICATE = ("www-authenticate", 'Bearer error="invalid_token"')


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
        audiences=audiences_of(claims),
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
    if is_cors_preflight(method, headers):
        return Authenticated(None, sanitize)

    rule_locations = [locations_of(rule) for rule in rules]
    ordered: list[Location] = []
    for locations in rule_locations:
        ordered.extend(loc for loc in locations if loc not in ordered)
    tokens = extract_tokens(ordered, target, headers)
    if not tokens:
        return Authenticated(None, sanitize)

    parsed = [parse_token(text) for _, text in tokens]
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
                verdicts[t, r] = verify_token(p, rule, keys, now)
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
