"""One VirtualService ``HTTPMatchRequest`` entry → :class:`~ambit.model.route_matches.RouteMatch`, as istiod's
``route.go`` ``TranslateRouteMatch`` reads it. Whether an entry can hold at a waypoint or gateway server at all is
:mod:`ambit.controlplane.translate.virtualservice_rules`'s business (its rule 1); here an entry's values are read,
and one that cannot be used raises :class:`~ambit.controlplane.translate.virtualservice_values.BadField`, which drops
the entry there.

Rules:

1. ``StringMatch``: ``exact``, ``prefix`` (a plain string prefix, as Envoy's), ``regex`` (RE2, full match); an
   empty one (``{}``) or ``regex: "*"`` means "present" (istiod's ``present_match``). Header names are
   lower-cased; ``authority`` is a match on the ``host``, ``scheme`` on ``:scheme`` (``https`` only where an
   ingress gateway terminated the client's TLS), ``method`` on the method (exact only; another kind drops
   the entry). A header match may name a pseudo-header (``:method``, ``:authority``, ``:path``, ``:scheme``), as
   Envoy's header matcher reads them. ``ignoreUriCase`` and ``withoutHeaders`` are carried to the engine.
2. A header named ``@request.auth.claims.a.b`` or ``@request.auth.claims[a][b]`` matches the verified JWT's claim
   ``a.b`` instead (istiod's ``translateMetadataMatch``), in ``headers`` and ``withoutHeaders``
   (:class:`~ambit.model.route_matches.ClaimMatch`); a malformed claim name drops the entry.
3. A value RE2 would refuse, an exact ``uri`` not starting with ``/``, or a query parameter without a name drops
   the entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ambit.controlplane.translate.virtualservice_values import (
    BadField,
    read_mapping,
    read_printable,
    read_string_match,
    read_text,
)
from ambit.model.field_names import is_token
from ambit.model.route_matches import (
    MAX_CLAIM_PATH,
    PSEUDO_HEADERS,
    ClaimMatch,
    PathMatch,
    PathMatchType,
    RouteMatch,
    ValueMatch,
    ValueMatchType,
)

__all__ = ["CLAIM_HEADER", "read_route_match"]

CLAIM_HEADER = "@request.auth.claims"
"""The header-name prefix of a JWT claim match (istiod's ``jwt.HeaderJWTClaim``)."""

Obj = Mapping[str, Any]


def _path_match(value: Any, field: str) -> PathMatch | None:
    if value is None:
        return None
    match = read_string_match("", value, field)
    if match.kind is ValueMatchType.PRESENT:
        return None
    if match.kind is ValueMatchType.EXACT:
        if not match.value.startswith("/"):
            raise BadField(f"{field}.exact", "an exact path must start with /")
        return PathMatch(PathMatchType.EXACT, match.value)
    if match.kind is ValueMatchType.PREFIX:
        return PathMatch(PathMatchType.PREFIX, match.value)
    return PathMatch(PathMatchType.REGULAR_EXPRESSION, match.value)


def _claim_path(name: str) -> tuple[str, ...] | None:
    """The claim names of a ``@request.auth.claims`` header name (istiod's ``jwt.ToRoutingClaim``): ``.a.b`` or
    ``[a][b]`` after the prefix (matched case-insensitively); None when ``name`` is not such a name. Empty names
    and more than :data:`~ambit.model.route_matches.MAX_CLAIM_PATH` of them are refused (no claim could hold)."""
    if not name.lower().startswith(CLAIM_HEADER):
        return None
    rest = name[len(CLAIM_HEADER) :]
    if rest.startswith(".") and len(rest) > 1:
        path = tuple(rest[1:].split("."))
    elif rest.startswith("[") and rest.endswith("]") and len(rest) > 2:
        path = tuple(rest[1:-1].split("]["))
    else:
        return None
    if len(path) > MAX_CLAIM_PATH or not all(step and step.isprintable() for step in path):
        return None
    return path


def _header_matches(value: Any, field: str) -> tuple[tuple[ValueMatch, ...], tuple[ClaimMatch, ...]]:
    """Header matches, and the JWT claim matches written as ``@request.auth.claims`` headers (rules 1-2)."""
    out: list[ValueMatch] = []
    claims: list[ClaimMatch] = []
    for name, match in sorted(read_mapping(value, field).items(), key=lambda item: str(item[0]).lower()):
        if isinstance(name, str) and name.lower().startswith(CLAIM_HEADER):
            path = _claim_path(name)
            if path is None:
                raise BadField(f"{field}.{name}", "not a claim name (@request.auth.claims.a.b or [a][b])")
            found = read_string_match(name, match, f"{field}.{name}")
            claims.append(ClaimMatch(path, found.value, found.kind))
            continue
        pseudo = isinstance(name, str) and name.lower() in PSEUDO_HEADERS
        if not isinstance(name, str) or not (pseudo or is_token(name)):
            raise BadField(f"{field}", f"not a header name: {name!r}")
        out.append(read_string_match(name.lower(), match, f"{field}.{name}"))
    return tuple(out), tuple(claims)


def read_route_match(match: Obj, field: str) -> RouteMatch:
    """One ``HTTPMatchRequest`` entry as a table entry's match (rules 1-3); a bad value raises :class:`BadField`."""
    method: str | None = None
    if match.get("method") is not None:
        found = read_string_match(":method", match["method"], f"{field}.method")
        if found.kind is not ValueMatchType.EXACT or not found.value:
            raise BadField(f"{field}.method", "only an exact method match is supported")
        method = read_printable(found.value, f"{field}.method.exact")
    plain, claims = _header_matches(match.get("headers"), f"{field}.headers")
    headers = list(plain)
    if match.get("authority") is not None:
        headers.append(read_string_match("host", match["authority"], f"{field}.authority"))
    if match.get("scheme") is not None:  # istiod: a header match on :scheme
        headers.append(read_string_match(":scheme", match["scheme"], f"{field}.scheme"))
    query = tuple(
        read_string_match(_query_name(name, f"{field}.queryParams"), value, f"{field}.queryParams.{name}")
        for name, value in sorted(
            read_mapping(match.get("queryParams"), f"{field}.queryParams").items(), key=lambda i: str(i[0])
        )
    )
    ignore_case = match.get("ignoreUriCase")
    without, without_claims = _header_matches(match.get("withoutHeaders"), f"{field}.withoutHeaders")
    return RouteMatch(
        path=_path_match(match.get("uri"), f"{field}.uri"),
        headers=tuple(headers),
        query_params=query,
        method=method,
        ignore_path_case=ignore_case is True,
        without_headers=without,
        claims=claims,
        without_claims=without_claims,
    )


def _query_name(name: Any, field: str) -> str:
    text = read_text(name, field)
    if not text:
        raise BadField(field, "a query parameter needs a name")
    return text
