"""What a route rule matches on: the request's path, headers, query parameters, method and verified JWT claims.

Theory of operation: a :class:`RouteMatch` holds when every present part of it holds (Gateway API's
``HTTPRouteMatch``; a VirtualService's ``HTTPMatchRequest`` is translated to the same). Paths are matched by
:class:`PathMatchType` (Gateway API's three kinds and a VirtualService's plain string prefix), header and query
parameter values by :class:`ValueMatchType`; a header match may name one of :data:`PSEUDO_HEADERS`; a claim match
(:class:`ClaimMatch`) reads the verified JWT's payload, along a path of at most :data:`MAX_CLAIM_PATH` names. The
order in which a table's matches are tried is :mod:`ambit.model.routes`'. Every value is frozen and hashable.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

MAX_REGEX = 1024
"""The longest regular expression a route match may hold (the translator refuses longer; the waypoint's reader too)."""

__all__ = [
    "MAX_CLAIM_PATH",
    "PSEUDO_HEADERS",
    "ClaimMatch",
    "PathMatch",
    "PathMatchType",
    "RouteMatch",
    "ValueMatch",
    "ValueMatchType",
]


class PathMatchType(enum.Enum):
    """Gateway API ``HTTPPathMatch.type``."""

    EXACT = "Exact"
    PATH_PREFIX = "PathPrefix"
    REGULAR_EXPRESSION = "RegularExpression"
    PREFIX = "Prefix"
    """A VirtualService ``uri.prefix``: a plain string prefix (``/foo`` matches ``/foobar``), as Envoy's ``prefix``."""


class ValueMatchType(enum.Enum):
    """Gateway API ``HTTPHeaderMatch.type`` / ``HTTPQueryParamMatch.type`` / ``GRPCMethodMatch.type``, and the
    VirtualService ``StringMatch`` kinds Gateway API lacks."""

    EXACT = "Exact"
    REGULAR_EXPRESSION = "RegularExpression"
    PREFIX = "Prefix"
    """The value starts with ``value`` (a VirtualService ``prefix``)."""
    PRESENT = "Present"
    """The header or parameter is present, whatever its value (a VirtualService ``{}`` or ``regex: "*"``)."""


@dataclass(frozen=True, slots=True)
class PathMatch:
    kind: PathMatchType
    value: str
    """For PathPrefix, matched element-wise: ``/foo`` matches ``/foo`` and ``/foo/bar``, not ``/foobar``."""


PSEUDO_HEADERS = frozenset((":method", ":authority", ":path", ":scheme"))
"""The request pseudo-headers a header match may name (Envoy's header matcher reads them): the method, the
authority (``Host``), the request target (path and query) and the scheme, whatever the HTTP version."""


@dataclass(frozen=True, slots=True)
class ValueMatch:
    """A header (name compared case-insensitively; one of :data:`PSEUDO_HEADERS` reads that part of the request)
    or query parameter (name compared exactly) match."""

    name: str
    value: str
    kind: ValueMatchType = ValueMatchType.EXACT


MAX_CLAIM_PATH = 16
"""The most names a claim match's path may hold (deeper than any token the authenticator accepts)."""


@dataclass(frozen=True, slots=True)
class ClaimMatch:
    """A match on a claim of the request's verified JWT (a VirtualService header match named
    ``@request.auth.claims.<a>.<b>`` or ``@request.auth.claims[<a>][<b>]``, which istiod turns into a match on
    Envoy's ``jwt_authn`` payload): it holds when the claim at ``path`` is a string that matches, or a list holding
    one (``PRESENT``: the claim exists). Absent, or without a verified token, it does not hold."""

    path: tuple[str, ...]
    value: str
    kind: ValueMatchType = ValueMatchType.EXACT


@dataclass(frozen=True, slots=True)
class RouteMatch:
    """One ``HTTPRouteMatch``: every present part must hold. For GRPCRoute the translator writes the method match
    as an Exact (or RegularExpression) path ``/<service>/<method>`` and a ``POST`` method."""

    path: PathMatch | None = None
    headers: tuple[ValueMatch, ...] = ()
    query_params: tuple[ValueMatch, ...] = ()
    method: str | None = None
    ignore_path_case: bool = False
    """Compare the path case-insensitively (a VirtualService ``ignoreUriCase``)."""
    without_headers: tuple[ValueMatch, ...] = ()
    """Each must *not* hold (a VirtualService ``withoutHeaders``): a missing header reads as empty, and a
    ``PRESENT`` entry means the header must be absent."""
    claims: tuple[ClaimMatch, ...] = ()
    """Each must hold on the verified JWT's claims."""
    without_claims: tuple[ClaimMatch, ...] = ()
    """Each must *not* hold (a request without a verified JWT holds none)."""
