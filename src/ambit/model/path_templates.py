"""AuthorizationPolicy path templates (``paths: ["/api/{*}/items/{**}"]``), as istiod validates them and Envoy's
``uri_template`` matcher matches them.

Theory of operation: pure. :func:`is_path_template` says whether a ``paths``/``notPaths`` entry is a template
(istiod's ``ContainsPathTemplate``); :func:`template_problem` judges one as istiod's admission does and as Envoy's
template parser would, returning what is wrong or None; :func:`template_regex` compiles a valid one (memoised:
policies name few distinct templates); :func:`path_matches_template` matches a request path against it.

Rules:

1. An entry is a template when it contains ``{*}`` or ``{**}``; other entries keep Istio's string forms (exact,
   ``x*`` prefix, ``*x`` suffix, ``*``).
2. Admission (istiod's ``CheckValidPathTemplate``, :func:`admission_problem`, run on every ``paths`` entry): the
   entry, leading and trailing ``/`` stripped, split at ``/`` into segments: ``{*}`` and ``{**}`` are operators;
   no operator may follow ``{**}``; any other segment holds no ``{`` or ``}``, and in a template consists of
   RFC 3986 ``pchar`` characters (``A-Z a-z 0-9 - . _ ~ % ! $ & ' ( ) + , ; : @ =``), so an empty segment
   (``//``) is refused there. A valid template (:func:`template_problem`) also starts with ``/``, as Envoy's
   template parser needs, and is at most :data:`MAX_TEMPLATE` characters (ours: a bound on what a policy may
   make us compile).
3. Matching (Envoy's ``uri_template``, istiod writing ``{*}`` as ``*`` and ``{**}`` as ``**``): the whole path
   without its query must match; ``{*}`` is one or more ``pchar`` (one segment, never ``/``), ``{**}`` zero or
   more ``pchar`` or ``/``; every other character is literal and case-sensitive. ``/{**}/x`` therefore needs a
   ``/`` before ``x`` on both sides of the operator (``//x`` matches, ``/x`` does not), as in Envoy.
"""

from __future__ import annotations

import functools
import re

MATCH_ONE = "{*}"
MATCH_ANY = "{**}"
MAX_TEMPLATE = 1024
_PCHAR = "a-zA-Z0-9\\-._~%!$&'()+,;:@="
_LITERAL = re.compile(f"[{_PCHAR}]+")
_ONE = f"[{_PCHAR}]+"
_ANY = f"[{_PCHAR}/]*"


def is_path_template(entry: str) -> bool:
    """Rule 1."""
    return MATCH_ONE in entry or MATCH_ANY in entry


def template_problem(entry: str) -> str | None:
    """Rule 2: what makes ``entry`` (a template, rule 1) invalid, or None."""
    if len(entry) > MAX_TEMPLATE:
        return f"longer than {MAX_TEMPLATE} characters"
    if not entry.startswith("/"):
        return "a path template starts with '/'"
    return admission_problem(entry)


def admission_problem(entry: str) -> str | None:
    """Rule 2's admission check of any ``paths`` entry, template or not: what istiod would refuse, or None."""
    template = is_path_template(entry)
    seen_any = False
    for segment in entry.strip("/").split("/"):
        if segment in (MATCH_ONE, MATCH_ANY):
            if seen_any:
                return "{**} is not the last operator"
            seen_any = segment == MATCH_ANY
        elif "{" in segment or "}" in segment:
            return "contains '{' or '}' beyond a supported path template"
        elif template and not _LITERAL.fullmatch(segment):
            return f"segment {segment[:64]!r} is not a valid string literal"
    return None


@functools.lru_cache(maxsize=512)
def template_regex(entry: str) -> re.Pattern[str]:
    """Rule 3 as one regular expression (``entry`` valid by rule 2: :func:`template_problem` is None)."""
    parts: list[str] = []
    for piece in re.split(r"(\{\*\*\}|\{\*\})", entry):
        if piece == MATCH_ANY:
            parts.append(_ANY)
        elif piece == MATCH_ONE:
            parts.append(_ONE)
        else:
            parts.append(re.escape(piece))
    return re.compile("".join(parts))


def path_matches_template(entry: str, path: str) -> bool:
    """Rule 3: ``path`` (the request's, query and fragment removed) against the valid template ``entry``."""
    return template_regex(entry).fullmatch(path) is not None
