"""A VirtualService HTTP rule's ``match`` conditions and ``rewrite``, checked at admission as istiod's webhook checks
them (``validateHTTPRouteMatchRequest``, ``validateStringMatch``, ``validateStringMatchRegexp``,
``ValidateHTTPHeaderNameOrJwtClaimRoute``, ``validateHTTPRewrite``).

Rules:

1. A ``StringMatch`` is an object holding at most one of ``exact``, ``prefix``, ``regex`` (a protobuf oneof), a
   string; none is a presence match.
2. A ``regex`` is not empty, at most 1024 characters, and one Go's ``regexp.Compile`` (RE2 syntax) accepts
   (:mod:`ambit.controlplane.webhook.re2_syntax`).
3. ``uri`` may have an empty ``prefix`` (Envoy's path prefix ``""`` matches every path); ``scheme``, ``method``,
   ``authority`` and each ``headers`` and ``queryParams`` value may not.
4. ``headers``: a value may not be null. ``withoutHeaders``: ``regex: "*"`` is a presence match (istiod's
   translation), not checked as a regular expression; other values as ``headers``.
5. A ``headers`` or ``withoutHeaders`` name is not empty and is a token (RFC 9110), a pseudo-header (``:method``,
   ``:scheme``, ``:authority``, ``:path``, ``:status``), or a JWT claim (``@request.auth.claims.a.b`` or
   ``@request.auth.claims[a][b]``, the prefix in any case, as istiod's ``jwt.ToRoutingClaim`` reads it).
6. ``rewrite``: not both ``uri`` and ``uriRegexRewrite``; at least one of them or ``authority``; a
   ``uriRegexRewrite`` needs both ``match`` and ``rewrite``, and its ``match`` is a regular expression (rule 2).
7. One object's regular expressions are checked up to :data:`REGEX_BUDGET` characters in all; past that the rest
   are refused unchecked (an admission request of megabytes of patterns would otherwise hold the webhook for
   seconds; Istio has no such bound, and no usable VirtualService comes near it).
"""

from __future__ import annotations

from typing import Any

from ambit.controlplane.webhook.fields import Fields, describe
from ambit.controlplane.webhook.re2_syntax import re2_problem
from ambit.model.field_names import is_token

__all__ = ["REGEX_BUDGET", "MatchChecker"]

REGEX_BUDGET = 256 * 1024
"""Characters of regular expressions checked per object (rule 7): about 256 of the longest istiod allows."""
CLAIM_PREFIX = "@request.auth.claims"
PSEUDO_HEADERS = frozenset((":method", ":scheme", ":authority", ":path", ":status"))
_KINDS = ("exact", "prefix", "regex")


def _claim_form(name: str) -> bool:
    """istiod's ``jwt.ToRoutingClaim(name).Match``."""
    if not name.lower().startswith(CLAIM_PREFIX):
        return False
    rest = name[len(CLAIM_PREFIX) :]
    return (rest.startswith(".") and len(rest) > 1) or (rest.startswith("[") and rest.endswith("]") and len(rest) > 2)


def header_name_problem(name: str) -> str | None:
    """Rule 5: why ``name`` cannot be matched on, or None."""
    if not name:
        return "header name cannot be empty"
    if _claim_form(name) or name in PSEUDO_HEADERS or is_token(name):
        return None
    return f"header name {name[:64]!r} is not a valid header name"


class MatchChecker:
    """The checks of one object, sharing its regular-expression budget (rule 7)."""

    __slots__ = ("budget", "f")

    def __init__(self, f: Fields) -> None:
        self.f = f
        self.budget = REGEX_BUDGET

    def regex(self, pattern: str, path: str) -> None:
        """Rule 2."""
        if not pattern:
            self.f.error(path, "regex string match should not be empty")
            return
        self.budget -= len(pattern)
        if self.budget < 0:
            self.f.error(path, f"not checked: this object's regular expressions exceed {REGEX_BUDGET} characters")
            return
        problem = re2_problem(pattern)
        if problem is not None:
            self.f.error(path, f"{problem}; Istio uses RE2 style regex-based match")

    def string_match(self, value: Any, path: str, *, empty_prefix: bool = False, star: bool = False) -> None:
        """Rules 1-3 for one ``StringMatch``; ``star``: ``regex: "*"`` is a presence match (rule 4)."""
        f = self.f
        spec = f.mapping(value, path, known=_KINDS)
        given = [kind for kind in _KINDS if spec.get(kind) is not None]
        if len(given) > 1:
            f.error(path, f"only one of exact, prefix, regex may be set, not {' and '.join(given)}")
            return
        for kind in given:
            text = spec[kind]
            if not isinstance(text, str):
                f.error(f"{path}.{kind}", f"expected a string, got {describe(text)}")
            elif kind == "prefix" and not text and not empty_prefix:
                f.error(f"{path}.prefix", "prefix string match should not be empty")
            elif kind == "regex" and not (star and text == "*"):
                self.regex(text, f"{path}.regex")

    def headers(self, value: Any, path: str, *, without: bool) -> None:
        """Rules 4 and 5 for ``headers`` (``without``: ``withoutHeaders``)."""
        for name, match in sorted(self.f.mapping(value, path).items()):
            where = f"{path}[{name}]"
            problem = header_name_problem(name)
            if problem is not None:
                self.f.error(where, problem)
            if match is None:
                if not without:
                    self.f.error(where, "header match cannot be null")
                continue
            self.string_match(match, where, star=without)

    def match(self, value: dict[str, Any], path: str) -> None:
        """One ``HTTPMatchRequest`` (rules 1-5)."""
        f = self.f
        self.string_match(f.get(value, "uri"), f"{path}.uri", empty_prefix=True)
        for name in ("scheme", "method", "authority"):
            self.string_match(f.get(value, name), f"{path}.{name}")
        self.headers(f.get(value, "headers"), f"{path}.headers", without=False)
        self.headers(f.get(value, "withoutHeaders"), f"{path}.withoutHeaders", without=True)
        for name, match in sorted(f.mapping(f.get(value, "queryParams"), f"{path}.queryParams").items()):
            self.string_match(match, f"{path}.queryParams[{name}]")

    def rewrite(self, value: Any, path: str) -> None:
        """Rule 6."""
        if value is None:
            return
        f = self.f
        spec = f.mapping(value, path)
        if not spec and not isinstance(value, dict):
            return
        uri = f.string(f.get(spec, "uri"), f"{path}.uri")
        authority = f.string(f.get(spec, "authority"), f"{path}.authority")
        regex_rewrite = f.get(spec, "uriRegexRewrite")
        if uri and regex_rewrite is not None:
            f.error(path, "rewrite may only contain one of uri or uriRegexRewrite")
        elif not uri and regex_rewrite is None and not authority:
            f.error(path, "rewrite must specify at least one of uri, uriRegexRewrite or authority")
        if regex_rewrite is None:
            return
        where = f"{path}.uriRegexRewrite"
        rewrite = f.mapping(regex_rewrite, where, known=("match", "rewrite"))
        match = f.string(rewrite.get("match"), f"{where}.match")
        target = f.string(rewrite.get("rewrite"), f"{where}.rewrite")
        if not match or not target:
            f.error(where, "uriRegexRewrite requires both rewrite and match")
        if match:
            self.regex(match, f"{where}.match")
