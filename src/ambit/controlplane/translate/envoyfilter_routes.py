"""EnvoyFilter ``HTTP_ROUTE`` MERGE patches → changes to a waypoint's route rules, made by the control plane.

Theory of operation: istiod merges an ``HTTP_ROUTE`` patch into every Envoy route of the waypoint's route
configurations that its match selects. Ambit's waypoint has no Envoy routes; its route rules
(:class:`~ambit.model.routes.RouteRule`) are what those routes are generated from, so the control plane merges the
patch's fields into the rules the match selects, before the configuration is served. :func:`read_route_merge`
reads one patch (or says why it cannot be honoured); :func:`merge_routes` applies a waypoint's merges, in istiod's
order, to its tables. Pure.

Rules (istiod's ``patchHTTPRoute``; Envoy's ``Route`` and ``RetryPolicy`` fields):

1. Only ``MERGE`` is honoured; ``REMOVE``, ``ADD`` and ``INSERT_*`` (which add or drop Envoy routes the engine
   has no form for) are refused with a note, like any other unsupported patch.
2. Selection: the route configuration (``name`` ``inbound-vip|<port>|<protocol>|<host>``, ``portNumber``) and
   virtual host (``name`` ``inbound|http|<port>``, ``domainName``) as for a VIRTUAL_HOST patch
   (:mod:`ambit.controlplane.translate.envoyfilter_patches` rule 3), then ``vhost.route.name`` and
   ``vhost.route.action``. A route's name is, as istiod names them, the HTTPRoute rule's or VirtualService http
   route's ``name``; an unnamed Gateway API rule's generated name (``<ns>.<name>.<index>``) is not matched (a
   patch naming one is refused: name the rule). ``action`` ``ROUTE`` selects rules that forward,
   ``REDIRECT`` redirects, ``DIRECT_RESPONSE`` direct responses; ``ANY`` (or none) every rule. A Service port
   with no route attached has istiod's default route, named ``default`` (action ROUTE, to the Service itself): a
   merge that selects it turns the engine's implicit default into that rule, named ``default``, and merges into
   it; the request is routed as before.
3. Fields merged, with protobuf's merge (a scalar replaces, a list appends): ``route.timeout`` (the request
   timeout; ``0s`` none), ``route.retry_policy.num_retries``, ``.retry_on`` (``5xx``, ``gateway-error``,
   ``connect-failure``, ``retriable-status-codes``), ``.retriable_status_codes``, ``.per_try_timeout`` (the
   backend request timeout) and ``.retry_back_off.base_interval``; ``request_headers_to_add`` /
   ``_to_remove`` and the response pair, whose additions are ``append`` (``APPEND_IF_EXISTS_OR_ADD``) or
   overwrite (``OVERWRITE_IF_EXISTS_OR_ADD``, ``append: false``), joined to the rule's header filters. Any other
   field, retry condition or append action refuses the whole patch (noted), so a patch applies whole or not at
   all.
4. Merges apply in the order the EnvoyFilters are given to the waypoint (priority, then root namespace first,
   then age), each to every rule it selects.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ambit.controlplane.translate import shapes
from ambit.model.envoyfilter import PatchScope
from ambit.model.field_names import is_token
from ambit.model.header_rules import has_line_break, is_framing
from ambit.model.route_matches import RouteMatch
from ambit.model.routes import BackendService, HeaderModifier, RetryPolicy, RouteRule, RouteTable, WeightedBackend

__all__ = ["RouteMerge", "RouteMergeError", "merge_routes", "read_route_merge"]

ACTIONS = ("ANY", "ROUTE", "REDIRECT", "DIRECT_RESPONSE")
DEFAULT_ROUTE = "default"
"""istiod's name for the route of a Service port no route is attached to."""
MAX_CODES = 100
_DURATION = re.compile(r"(\d{1,9})(?:\.(\d{1,9}))?s")
_GENERATED_NAME = re.compile(r"[^.]+\.[^.]+\.\d+")
_RETRY_ON = {
    "5xx": tuple(range(500, 600)),
    "gateway-error": (502, 503, 504),
    "connect-failure": (),
    "retriable-status-codes": (),
}
_ROUTE_FIELDS = {"timeout", "retry_policy", "retryPolicy"}
_RETRY_FIELDS = {
    "num_retries",
    "numRetries",
    "retry_on",
    "retryOn",
    "retriable_status_codes",
    "retriableStatusCodes",
    "per_try_timeout",
    "perTryTimeout",
    "retry_back_off",
    "retryBackOff",
}
HEADER_LISTS = {
    "request_headers_to_add": ("request", False),
    "requestHeadersToAdd": ("request", False),
    "request_headers_to_remove": ("request", True),
    "requestHeadersToRemove": ("request", True),
    "response_headers_to_add": ("response", False),
    "responseHeadersToAdd": ("response", False),
    "response_headers_to_remove": ("response", True),
    "responseHeadersToRemove": ("response", True),
}
"""Envoy's header-list fields (both JSON spellings): which side they edit, and whether they remove."""


_NO_EDITS = HeaderModifier()


class RouteMergeError(Exception):
    """Why a patch cannot be honoured (the note's reason)."""


@dataclass(frozen=True, slots=True)
class RouteMerge:
    """One honoured ``HTTP_ROUTE`` MERGE: which rules, and what it sets."""

    source: str
    scope: PatchScope
    name: str = ""
    """The route name to select; ``""`` any."""
    action: str = "ANY"
    timeout: float | None = None
    """Set: the request timeout (0: none)."""
    per_try_timeout: float | None = None
    attempts: int | None = None
    retry_on: tuple[str, ...] | None = None
    """Set: the new ``retry_on`` conditions (replacing the rule's)."""
    codes: tuple[int, ...] = ()
    """``retriable_status_codes`` appended."""
    backoff: float | None = None
    request: HeaderModifier = _NO_EDITS
    response: HeaderModifier = _NO_EDITS

    def selects(self, table: RouteTable, hostname: str, rule: RouteRule) -> bool:
        """Rule 2 for one rule of ``table`` (a Service's, ``hostname``)."""
        if not self.scope.covers(hostname, table.port) or (self.name and rule.rule_name != self.name):
            return False
        if self.action == "REDIRECT":
            return rule.redirect is not None
        if self.action == "DIRECT_RESPONSE":
            return rule.redirect is None and rule.direct_response is not None
        if self.action == "ROUTE":
            return rule.redirect is None and rule.direct_response is None
        return True


def _duration(value: object, at: str) -> float:
    if not isinstance(value, str) or (found := _DURATION.fullmatch(value)) is None:
        raise RouteMergeError(f"{at}: expected a duration such as 1.5s")
    return int(found.group(1)) + (int(found.group(2).ljust(9, "0")) / 1e9 if found.group(2) else 0.0)


def _header_name(name: object, at: str) -> str:
    if not isinstance(name, str) or not is_token(name) or name.lower() == "host" or is_framing(name):
        raise RouteMergeError(f"{at}: {name!r} is not a header name Ambit edits")
    return name.lower()


def _header_option(raw: object, at: str) -> tuple[bool, str, str]:
    """(overwrite, name, value) of one ``HeaderValueOption``."""
    option = shapes.mapping(raw, at)
    if set(option) - {"header", "append", "append_action", "appendAction"}:
        raise RouteMergeError(f"{at}: only header, append and append_action are supported")
    header = shapes.mapping(option.get("header"), f"{at}.header", required=True)
    if set(header) - {"key", "value"}:
        raise RouteMergeError(f"{at}.header: only key and value are supported")
    name = _header_name(header.get("key"), f"{at}.header.key")
    value = header.get("value", "")
    if not isinstance(value, str) or has_line_break(value) or "%" in value.replace("%%", ""):
        raise RouteMergeError(f"{at}.header.value: a plain string without CR, LF, NUL or %-substitutions")
    action = option.get("append_action", option.get("appendAction"))
    append = option.get("append")
    if action is not None and append is not None:
        raise RouteMergeError(f"{at}: append and append_action may not both be set")
    if action in (None, "APPEND_IF_EXISTS_OR_ADD") and append in (None, True):
        return False, name, value.replace("%%", "%")
    if action == "OVERWRITE_IF_EXISTS_OR_ADD" or append is False:
        return True, name, value.replace("%%", "%")
    raise RouteMergeError(f"{at}.append_action: {action!r} is not supported on a route")


def _headers(value: Mapping[str, Any], at: str) -> dict[str, HeaderModifier]:
    """The header lists of a merge, per side, as header filters (``set`` for overwrites, ``add`` for appends)."""
    out: dict[str, HeaderModifier] = {}
    for side in ("request", "response"):
        sets: list[tuple[str, str]] = []
        adds: list[tuple[str, str]] = []
        removes: list[str] = []
        for key in sorted(k for k in value if HEADER_LISTS.get(k, ("", False))[0] == side):
            remove = HEADER_LISTS[key][1]
            for i, item in enumerate(shapes.list_of(value[key], f"{at}.{key}")):
                if remove:
                    removes.append(_header_name(item, f"{at}.{key}[{i}]"))
                    continue
                overwrite, name, text = _header_option(item, f"{at}.{key}[{i}]")
                (sets if overwrite else adds).append((name, text))
        out[side] = HeaderModifier(tuple(sets), tuple(adds), tuple(removes))
    return out


def _retry(raw: object, at: str) -> dict[str, Any]:
    retry = shapes.mapping(raw, at)
    unknown = set(retry) - _RETRY_FIELDS
    if unknown:
        raise RouteMergeError(f"{at}: {', '.join(sorted(unknown))} not supported")
    out: dict[str, Any] = {}
    if (count := retry.get("num_retries", retry.get("numRetries"))) is not None:
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= 100:
            raise RouteMergeError(f"{at}.num_retries: expected 0..100")
        out["attempts"] = count
    if (text := retry.get("retry_on", retry.get("retryOn"))) is not None:
        conditions = tuple(c.strip() for c in shapes.text(text, f"{at}.retry_on").split(",") if c.strip())
        unknown_on = [c for c in conditions if c not in _RETRY_ON]
        if unknown_on:
            raise RouteMergeError(f"{at}.retry_on: {', '.join(unknown_on)} not supported by Ambit's retries")
        out["retry_on"] = conditions
    raw_codes = shapes.list_of(retry.get("retriable_status_codes", retry.get("retriableStatusCodes")), f"{at}.codes")
    if len(raw_codes) > MAX_CODES or not all(
        isinstance(c, int) and not isinstance(c, bool) and 100 <= c <= 599 for c in raw_codes
    ):
        raise RouteMergeError(f"{at}.retriable_status_codes: at most {MAX_CODES} status codes 100..599")
    out["codes"] = tuple(raw_codes)
    if (per_try := retry.get("per_try_timeout", retry.get("perTryTimeout"))) is not None:
        out["per_try_timeout"] = _duration(per_try, f"{at}.per_try_timeout")
    back_off = shapes.mapping(retry.get("retry_back_off", retry.get("retryBackOff")), f"{at}.retry_back_off")
    if back_off:
        if set(back_off) - {"base_interval", "baseInterval"}:
            raise RouteMergeError(f"{at}.retry_back_off: only base_interval is supported")
        out["backoff"] = _duration(back_off.get("base_interval", back_off.get("baseInterval")), f"{at}.base_interval")
    return out


def read_route_merge(
    match: Mapping[str, Any], value: Mapping[str, Any], at: str, source: str, scope: PatchScope
) -> RouteMerge:
    """Rules 2 and 3 for one patch whose route-configuration ``scope`` was read already; :class:`RouteMergeError`
    when it cannot be honoured. ``at`` is the patch's field path."""
    rc = shapes.mapping(match.get("routeConfiguration", match.get("route_configuration")), f"{at}.match")
    vhost = shapes.mapping(rc.get("vhost"), f"{at}.match.routeConfiguration.vhost")
    route = shapes.mapping(vhost.get("route"), f"{at}.match.routeConfiguration.vhost.route")
    if set(route) - {"name", "action"}:
        raise RouteMergeError(f"{at}.match.routeConfiguration.vhost.route: only name and action are matched")
    name = shapes.text(route.get("name"), f"{at}.match.routeConfiguration.vhost.route.name")
    if name and _GENERATED_NAME.fullmatch(name):
        raise RouteMergeError(
            f"{at}.match.routeConfiguration.vhost.route.name: {name!r} is the generated name of an unnamed rule, "
            "which Ambit does not match (name the rule)"
        )
    action = shapes.text(route.get("action"), f"{at}.match.routeConfiguration.vhost.route.action") or "ANY"
    if action not in ACTIONS:
        raise RouteMergeError(f"{at}.match.routeConfiguration.vhost.route.action: unknown action {action!r}")
    unknown = set(value) - _ROUTE_FIELDS.union({"route"}, HEADER_LISTS)
    if unknown or not value:
        what = ", ".join(sorted(unknown)) or "nothing"
        raise RouteMergeError(f"{at}.patch.value: merging {what} is not supported (see the route fields Ambit has)")
    target = shapes.mapping(value.get("route"), f"{at}.patch.value.route")
    if set(target) - _ROUTE_FIELDS:
        extra = ", ".join(sorted(set(target) - _ROUTE_FIELDS))
        raise RouteMergeError(f"{at}.patch.value.route: merging {extra} is not supported")
    timeout = _duration(target["timeout"], f"{at}.patch.value.route.timeout") if "timeout" in target else None
    retry = _retry(target.get("retry_policy", target.get("retryPolicy")), f"{at}.patch.value.route.retry_policy")
    headers = _headers(value, f"{at}.patch.value")
    return RouteMerge(
        source,
        scope,
        name,
        action,
        timeout,
        retry.get("per_try_timeout"),
        retry.get("attempts"),
        retry.get("retry_on"),
        retry.get("codes", ()),
        retry.get("backoff"),
        headers["request"],
        headers["response"],
    )


def _joined(base: HeaderModifier | None, more: HeaderModifier) -> HeaderModifier | None:
    if not (more.set or more.add or more.remove):
        return base
    base = base or HeaderModifier()
    return HeaderModifier(base.set + more.set, base.add + more.add, base.remove + more.remove)


def _merged(rule: RouteRule, merge: RouteMerge) -> RouteRule:
    """Rule 3 on one rule."""
    timeouts, retry = rule.timeouts, rule.retry
    if merge.timeout is not None:
        timeouts = replace(timeouts, request=merge.timeout or None)
    if merge.per_try_timeout is not None:
        timeouts = replace(timeouts, backend_request=merge.per_try_timeout or None)
    codes = retry.codes + tuple(c for c in merge.codes if c not in retry.codes)
    on_connect_failure = retry.on_connect_failure
    if merge.retry_on is not None:
        listed = "retriable-status-codes" in merge.retry_on
        chosen = {c for condition in merge.retry_on for c in _RETRY_ON[condition]}
        codes = tuple(sorted(chosen | (set(codes) if listed else set())))
        on_connect_failure = any(c in ("5xx", "gateway-error", "connect-failure") for c in merge.retry_on)
    retry = RetryPolicy(
        retry.attempts if merge.attempts is None else merge.attempts,
        codes,
        retry.backoff if merge.backoff is None else merge.backoff,
        on_connect_failure,
    )
    return replace(
        rule,
        timeouts=timeouts,
        retry=retry,
        request_headers=_joined(rule.request_headers, merge.request),
        response_headers=_joined(rule.response_headers, merge.response),
    )


def merge_routes(tables: Iterable[RouteTable], merges: Iterable[RouteMerge]) -> tuple[RouteTable, ...]:
    """Rule 4: ``tables`` with every merge applied to the rules it selects (tables keyed ``namespace/hostname``)."""
    chosen = tuple(merges)
    out = []
    for table in tables:
        namespace, _, hostname = table.service_key.partition("/")
        rules = list(table.http)
        if not rules and table.service_key:
            default = RouteRule(
                "",
                RouteMatch(),
                backends=(WeightedBackend(BackendService(namespace, hostname, table.port)),),
                rule_name=DEFAULT_ROUTE,
            )
            if any(merge.selects(table, hostname, default) for merge in chosen):
                rules = [default]
        for merge in chosen:
            rules = [_merged(r, merge) if merge.selects(table, hostname, r) else r for r in rules]
        out.append(replace(table, http=tuple(rules)) if chosen else table)
    return tuple(out)
