"""A route's CORS policy (a VirtualService ``corsPolicy``) applied to one request: Envoy's CORS filter as istiod
configures it per route. Pure: :func:`plan_cors` reads a request head and says what the router does.

Rules:

1. A request without an ``Origin`` header (or with an empty one) is not a CORS request: nothing happens. Several
   ``Origin`` fields are read as their values joined with ``,`` (as Envoy folds a repeated header).
2. The origin is allowed when one of the policy's matches holds for it (Exact, Prefix, RegularExpression as a full
   match), or holds for the text ``*`` (Envoy: a ``*`` entry allows every origin). A regular expression that
   :mod:`ambit.waypoint.patterns` refuses never holds (listed in :attr:`CompiledCors.problems`).
3. A preflight is an ``OPTIONS`` request with an ``Origin`` and a non-empty ``Access-Control-Request-Method``.
   An allowed preflight is answered 200 by the waypoint with ``Access-Control-Allow-Origin`` (the request's
   origin), ``-Allow-Credentials: true`` when set, ``-Allow-Methods`` and ``-Allow-Headers`` as configured
   (``*`` echoes the preflight's ``Access-Control-Request-Method`` / ``-Headers``), ``-Max-Age`` in seconds, and
   ``-Expose-Headers`` when configured (Envoy's CORS filter answers the preflight through its own response path,
   which adds what rule 5 adds). The requested method is not checked against the list (the browser does that).
4. A preflight whose origin is not allowed goes on to the backend like any request when the policy forwards
   unmatched preflights (``FORWARD``, the default), with no CORS header added; with ``IGNORE`` it is answered 200
   as in rule 3 but without ``Access-Control-Allow-Origin`` or ``-Expose-Headers`` (Envoy writes the other
   headers regardless).
5. Any other request with an allowed origin is forwarded; its answer gets ``Access-Control-Allow-Origin`` (the
   request's origin), ``-Allow-Credentials: true`` when set and ``-Expose-Headers`` when configured, replacing
   any the backend sent. A request whose origin is not allowed gets no CORS header.
6. Nothing from the request reaches a response unless it is visible ASCII with inner spaces and tabs (no CR, LF,
   NUL or other control, nothing outside ASCII): an origin that is not is treated as not allowed, an echoed value
   that is not is left out. Configured values with CR, LF or NUL are dropped when compiled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ambit.model.route_matches import ValueMatchType
from ambit.model.routes import CorsPolicy
from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.patterns import SUBJECT_LIMIT, safe_pattern

__all__ = ["AddCorsHeaders", "AnswerPreflight", "CompiledCors", "CorsPlan", "compile_cors", "plan_cors"]

ALLOW_ORIGIN = "access-control-allow-origin"
ALLOW_METHODS = "access-control-allow-methods"
ALLOW_HEADERS = "access-control-allow-headers"
ALLOW_CREDENTIALS = "access-control-allow-credentials"
EXPOSE_HEADERS = "access-control-expose-headers"
MAX_AGE = "access-control-max-age"
REQUEST_METHOD = "access-control-request-method"
REQUEST_HEADERS = "access-control-request-headers"
_SAFE_VALUE = re.compile(r"[\x21-\x7e]([\t\x20-\x7e]*[\x21-\x7e])?")
_BAD_CONFIG = re.compile(r"[\r\n\x00]")


@dataclass(frozen=True, slots=True)
class AnswerPreflight:
    """Answer the request 200 with ``headers`` instead of routing it to a backend (rules 3 and 4)."""

    headers: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class AddCorsHeaders:
    """Route the request as usual and set ``headers`` on its answer (rule 5)."""

    headers: tuple[tuple[str, str], ...]


CorsPlan = AnswerPreflight | AddCorsHeaders | None
"""None: CORS changes nothing for this request."""


def _safe(value: str | None) -> str | None:
    """``value`` when it may be written into a response as it is (rule 6), else None."""
    if value is None or len(value) > SUBJECT_LIMIT or _SAFE_VALUE.fullmatch(value) is None:
        return None
    return value


def _configured(value: str) -> str:
    return "" if _BAD_CONFIG.search(value) else value


@dataclass(frozen=True, slots=True, eq=False)
class CompiledCors:
    """A :class:`CorsPolicy` made ready to apply, once per route table."""

    policy: CorsPolicy
    exact: frozenset[str]
    prefixes: tuple[str, ...]
    patterns: tuple[re.Pattern[str], ...]
    problems: tuple[str, ...]
    allow_methods: str
    allow_headers: str
    expose_headers: str
    any_origin: bool
    """A match holds for ``*``: every origin is allowed (rule 2)."""

    def allows(self, origin: str) -> bool:
        if self.any_origin or origin in self.exact:
            return True
        if any(origin.startswith(p) for p in self.prefixes):
            return True
        return any(p.fullmatch(origin) is not None for p in self.patterns)


def compile_cors(policy: CorsPolicy, where: str = "route") -> CompiledCors:
    """``policy`` compiled: origin regular expressions checked by :mod:`ambit.waypoint.patterns` (rule 2)."""
    exact: set[str] = set()
    prefixes: list[str] = []
    patterns: list[re.Pattern[str]] = []
    problems: list[str] = []
    for match in policy.allow_origins:
        if match.kind is ValueMatchType.EXACT:
            exact.add(match.value)
        elif match.kind is ValueMatchType.PREFIX:
            prefixes.append(match.value)
        elif match.kind is ValueMatchType.REGULAR_EXPRESSION:
            pattern = safe_pattern(match.value)
            if isinstance(pattern, str):
                problems.append(f"{where} CORS origin pattern {match.value!r} refused: {pattern}")
            else:
                patterns.append(pattern)
    any_origin = (
        "*" in exact or any("*".startswith(p) for p in prefixes if p) or any(p.fullmatch("*") for p in patterns)
    )
    return CompiledCors(
        policy=policy,
        exact=frozenset(exact),
        prefixes=tuple(p for p in prefixes if p),
        patterns=tuple(patterns),
        problems=tuple(problems),
        allow_methods=_configured(policy.allow_methods),
        allow_headers=_configured(policy.allow_headers),
        expose_headers=_configured(policy.expose_headers),
        any_origin=any_origin,
    )


def _echo(configured: str, request: RequestHead, name: str) -> str | None:
    if configured == "*":
        return _safe(request.header(name))
    return configured or None


def plan_cors(cors: CompiledCors, request: RequestHead) -> CorsPlan:
    """What ``cors`` does with ``request`` (the module's rules)."""
    values = [v for n, v in request.headers if n == "origin"]
    raw = ",".join(values)  # several Origin fields read as one list (as Envoy folds them): no single match holds
    if not raw:
        return None
    origin = _safe(raw)
    allowed = origin is not None and cors.allows(origin)
    policy = cors.policy
    if request.method == "OPTIONS" and request.header(REQUEST_METHOD):
        if not allowed and policy.forward_unmatched_preflights:
            return None
        headers: list[tuple[str, str]] = []
        if allowed and origin is not None:
            headers.append((ALLOW_ORIGIN, origin))
        if policy.allow_credentials:
            headers.append((ALLOW_CREDENTIALS, "true"))
        methods = _echo(cors.allow_methods, request, REQUEST_METHOD)
        if methods:
            headers.append((ALLOW_METHODS, methods))
        allow_headers = _echo(cors.allow_headers, request, REQUEST_HEADERS)
        if allow_headers:
            headers.append((ALLOW_HEADERS, allow_headers))
        if policy.max_age is not None:
            headers.append((MAX_AGE, str(policy.max_age)))
        if allowed and cors.expose_headers:
            headers.append((EXPOSE_HEADERS, cors.expose_headers))
        return AnswerPreflight(tuple(headers))
    if not allowed or origin is None:
        return None
    added = [(ALLOW_ORIGIN, origin)]
    if policy.allow_credentials:
        added.append((ALLOW_CREDENTIALS, "true"))
    if cors.expose_headers:
        added.append((EXPOSE_HEADERS, cors.expose_headers))
    return AddCorsHeaders(tuple(added))
