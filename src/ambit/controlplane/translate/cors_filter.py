"""A Gateway API HTTPRoute ``CORS`` filter (GEP-1767) → the route rule's :class:`~ambit.model.routes.CorsPolicy`,
as istiod's ``createCorsFilter`` maps it to a VirtualService ``corsPolicy``; :mod:`ambit.waypoint.cors` applies it.

Rules:

1. ``allowOrigins``, in order, each to one origin match: ``*`` alone to a regular expression that holds for any
   well-formed origin (``scheme://host[:port]``), not to Envoy's every-origin ``*`` (so ``null`` or an origin with a
   path is refused); an origin without ``*`` to an Exact match; one ending in its only ``*`` to a Prefix match of
   the rest; any other to a regular expression of the whole origin, its ``*`` matching any text (``.`` included, so
   ``https://*.bar.com`` also allows ``https://a.b.bar.com``: the CRD's "greedy to the left"). An origin the CRD's
   pattern refuses (:func:`is_cors_origin`) is left out: the webhook refuses such objects, and a regular expression
   of several ``*`` would cost polynomial time on every request.
2. ``allowMethods``, ``allowHeaders`` and ``exposeHeaders`` are joined with ``,`` (``*`` is kept: the engine echoes
   the preflight's request for it); ``allowCredentials: true`` sets credentials.
3. ``maxAge`` in seconds; absent, the CRD's default 5 (what the API server stores); below 1, none (istiod writes
   ``maxAge`` only when positive).
4. A preflight whose origin is not allowed is answered by the proxy without ``Access-Control-Allow-Origin``
   (istiod sets ``unmatchedPreflights: IGNORE``), never forwarded to the backend.
5. Values of the wrong type are left out; nothing raises.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ambit.model.route_matches import ValueMatch, ValueMatchType
from ambit.model.routes import CorsPolicy

__all__ = ["ANY_ORIGIN_PATTERN", "MAX_AGE_DEFAULT", "ORIGIN_MAX", "cors_policy", "is_cors_origin", "origin_match"]

ORIGIN_MAX = 253
"""The CRD's ``maxLength`` of a ``CORSOrigin``."""
MAX_AGE_DEFAULT = 5
"""The CRD's default ``maxAge`` (seconds)."""
ANY_ORIGIN_PATTERN = r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s?#]+$"
"""istiod's expression for ``*``: a scheme, ``://`` and a host with an optional port, nothing else."""
_ORIGIN = re.compile(r"\*|https?://(?:(?:\*\.)?(?:[a-zA-Z0-9-]+\.)*[a-zA-Z0-9-]+|\*)(?::[0-9]{1,5})?")
"""The CRD's ``CORSOrigin`` pattern, used with ``fullmatch`` (Go's ``$`` is the end of the text). Linear: each
repeated label must end with ``.``, so there is one way to split a host."""
_GO_META = frozenset("\\.+*?()|[]{}^$")
"""The characters Go's ``regexp.QuoteMeta`` escapes: the expression is the one istiod writes for RE2."""


def is_cors_origin(text: str) -> bool:
    """Whether ``text`` is a ``CORSOrigin`` the CRD admits: ``*``, or ``http(s)://`` a host (``*``, or DNS labels
    with an optional leading ``*.``) and an optional port of 1-5 digits, at most :data:`ORIGIN_MAX` characters."""
    return 0 < len(text) <= ORIGIN_MAX and _ORIGIN.fullmatch(text) is not None


def origin_match(origin: str) -> ValueMatch:
    """The origin match of one admitted ``allowOrigins`` entry (rule 1)."""
    if origin == "*":
        return ValueMatch("origin", ANY_ORIGIN_PATTERN, ValueMatchType.REGULAR_EXPRESSION)
    if "*" not in origin:
        return ValueMatch("origin", origin, ValueMatchType.EXACT)
    if origin.count("*") == 1 and origin.endswith("*"):
        return ValueMatch("origin", origin[:-1], ValueMatchType.PREFIX)
    quoted = "".join("\\" + c if c in _GO_META else c for c in origin).replace("\\*", ".*")
    return ValueMatch("origin", f"^{quoted}$", ValueMatchType.REGULAR_EXPRESSION)


def _texts(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str) and v] if isinstance(value, list) else []


def cors_policy(value: Any) -> CorsPolicy:
    """The policy of one ``cors`` filter object (the module's rules)."""
    spec = value if isinstance(value, Mapping) else {}
    max_age = spec.get("maxAge")
    if max_age is None:
        max_age = MAX_AGE_DEFAULT
    if not isinstance(max_age, int) or isinstance(max_age, bool) or max_age < 1:
        max_age = None
    return CorsPolicy(
        allow_origins=tuple(origin_match(o) for o in _texts(spec.get("allowOrigins")) if is_cors_origin(o)),
        allow_methods=",".join(_texts(spec.get("allowMethods"))),
        allow_headers=",".join(_texts(spec.get("allowHeaders"))),
        expose_headers=",".join(_texts(spec.get("exposeHeaders"))),
        max_age=max_age,
        allow_credentials=spec.get("allowCredentials") is True,
        forward_unmatched_preflights=False,
    )
