"""The waypoint's L7 routing engine: which rule of a destination's route table a request takes, and what follows.

:func:`route` is a :data:`~ambit.waypoint.decisions.Router`: pure, no I/O, no clock; the shell passes the random
number. Tables arrive already ordered by Gateway API precedence (:mod:`ambit.model.routes`); the engine takes the
first entry that matches.

Rules:

1. No table, or a table without HTTP rules: the default route, Forward to the destination, request unchanged, with
   the table's ``default_retry`` (the mesh config's ``defaultHttpRetryPolicy``, its per-try timeout included;
   Istio's default policy without a table). HTTP rules present and none matches: Respond 404.
2. Whether a rule's match holds is :mod:`ambit.waypoint.matching`'s business: method, path (Exact, element-wise
   PathPrefix, RegularExpression as a full match), headers (names case-insensitive) and query parameters.
3. Tables are compiled once (:func:`compile_table`, cached by the table's identity): regular expressions, cleaned
   header modifiers, cumulative weights. What cannot work (a regular expression that does not compile, or that
   :mod:`ambit.waypoint.patterns` refuses as unsafe) is listed in :attr:`CompiledTable.problems` and that match
   never holds; a request never raises.
4. The first entry whose match holds takes the request: the translator has ordered them by Gateway API precedence.
5. A rule with a redirect answers it (status and ``Location``, see :mod:`ambit.waypoint.filters`); nothing else of
   the rule runs.
6. Otherwise a backend is drawn by weight with ``random`` in [0, 1) over the cumulative weights (weight 0, or
   negative, is never drawn). No backend with a weight answers 500 (istiod's direct response); a draw that lands on
   an unresolved backend answers the rule's ``missing_backend_status`` (Envoy's cluster-not-found code: 500 for
   Gateway API, 503 for a VirtualService), empty, with flag ``NC``.
7. Filters run in a fixed order: the rule's request header modifier, its URL rewrite (hostname replaces the
   authority, the path is replaced fully or by prefix), then the drawn backend's own header modifier. The rule's
   response header modifier travels in the :class:`Forward` for the shell to apply. A rewrite hostname or a redirect
   location that is not visible ASCII answers 500 rather than reach the wire.
8. Mirrors get the request as it is after rule 7's first two filters (not the other backend's own modifier), with
   ``-shadow`` appended to the authority's host as Envoy does. Mirror ``i`` fires when ``100 * r_i < percent``,
   where ``r_i`` is derived from ``random`` deterministically: the fractional part of
   ``random * 1_000_003 + 0.618... * (i + 1)``. Its low-order digits are independent enough of the high-order ones
   that draw the backend for percent splits; a test checks the rates.
9. ``random`` outside [0, 1) (or NaN) is read as 0.
10. VirtualService actions: a rule's ``fault`` runs first: its delay applies when ``100 * r_d < delay_percent``
    and its abort when ``100 * r_a < abort_percent`` (``r_d``, ``r_a`` derived from ``random`` like mirror draws,
    with indexes -2 and -3), the delay travelling in the decision for the shell to wait out. An abort with a gRPC
    status answers 200: a gRPC request (``content-type: application/grpc*``) with that ``grpc-status`` and
    ``grpc-message: fault filter abort`` and no body (trailers only), another request with the text. Then a
    ``direct_response`` answers with its status and body. A draw that lands on an unresolved backend answers the
    rule's ``missing_backend_status`` (503 for a VirtualService destination the waypoint does not know). A
    ``regex_rewrite`` replaces every match in the path (query kept) after rule 7's rewrite; one whose pattern
    :mod:`ambit.waypoint.patterns` refuses or whose substitution names a missing group is listed in ``problems``
    and its rule answers 500, as does a rewritten path that is not visible ASCII.
11. A rule's ``cors`` policy (:mod:`ambit.waypoint.cors`) runs after the fault, on the request as received: a
    preflight it answers gets 200 and the CORS headers (after any fault delay); otherwise the rule acts as
    usual and its CORS headers are set on the answer (a Forward's response headers, or the router's own 500/503),
    replacing any of those names the rule's response header modifier sets. A rule with a redirect or a direct
    response has no CORS (Envoy's filter bypasses such routes).
12. The waypoint's router (:func:`waypoint_route`) first adds ``x-forwarded-proto: http`` to a request that has
    none, as Envoy's connection manager does when it does not use the remote address (istiod's waypoint listener):
    the waypoint's streams are plaintext inside HBONE; a value the client sent (an ingress gateway's ``https``) is
    kept. Route matches see it. (The ingress gateway, at the edge, sets its own from its connection.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ambit.model.routes import (
    ISTIO_RETRY,
    BackendService,
    Fault,
    HeaderModifier,
    HttpRetry,
    RouteRule,
    RouteTable,
    Timeouts,
    WeightedBackend,
)
from ambit.waypoint.cors import AnswerPreflight, CompiledCors, compile_cors, plan_cors
from ambit.waypoint.decisions import Decision, Forward, RequestHead, Respond
from ambit.waypoint.filters import (
    HeaderEdit,
    chained,
    clean_modifier,
    is_visible_ascii,
    redirect_location,
    rewrite_path,
    split_authority,
    split_target,
)
from ambit.waypoint.matching import MatchTest, RequestFacts, compile_match
from ambit.waypoint.patterns import SUBJECT_LIMIT, safe_pattern

__all__ = ["CompiledTable", "compile_table", "route", "route_tcp", "waypoint_route", "with_request_id"]

REQUEST_ID = "x-request-id"
FORWARDED_PROTO = "x-forwarded-proto"
_CACHE_SIZE = 512
"""Compiled tables kept; a waypoint's config holds one table per destination it serves."""
_MIRROR_SCALE = 1_000_003.0
_GOLDEN = 0.6180339887498949
_NO_TIMEOUTS = Timeouts()
_TEXT = (("content-type", "text/plain"),)
FAULT_BODY = b"fault filter abort"


_Drawn = tuple[float, WeightedBackend, HeaderEdit | None, HeaderModifier | None]


@dataclass(frozen=True, slots=True)
class _CompiledRule:
    rule: RouteRule
    test: MatchTest
    request_headers: HeaderEdit | None
    response_headers: HeaderModifier | None
    backends: tuple[_Drawn, ...]
    """(cumulative weight, backend, its request header edit, the response modifier of the rule then the backend),
    weight > 0 only."""
    total: float
    regex_rewrite: tuple[re.Pattern[str], str] | None = None
    broken: bool = False
    """The rule's regex rewrite cannot work: the rule answers 500 rather than forward an unrewritten path."""
    cors: CompiledCors | None = None


def _regex_rewrite(rule: RouteRule, problems: list[str]) -> tuple[re.Pattern[str], str] | bool | None:
    """The compiled ``regex_rewrite``, None without one, False when it cannot work (reported in ``problems``)."""
    if rule.regex_rewrite is None:
        return None
    where = f"{rule.route or 'route'} regex rewrite"
    pattern = safe_pattern(rule.regex_rewrite.pattern)
    if isinstance(pattern, str):
        problems.append(f"{where}: pattern {rule.regex_rewrite.pattern!r} refused: {pattern}")
        return False
    try:
        pattern.sub(rule.regex_rewrite.substitution, "")  # parses the substitution: bad group references raise
    except (re.error, IndexError) as exc:
        problems.append(f"{where}: substitution {rule.regex_rewrite.substitution!r} refused: {exc}")
        return False
    return pattern, rule.regex_rewrite.substitution


def _compile_rule(rule: RouteRule) -> tuple[_CompiledRule, tuple[str, ...]]:
    backends: list[_Drawn] = []
    total = 0.0
    response = clean_modifier(rule.response_headers)
    for backend in rule.backends:
        if backend.weight > 0:
            total += backend.weight
            answers = chained(response, clean_modifier(backend.response_headers))
            backends.append((total, backend, HeaderEdit.of(backend.request_headers), answers))
    test, problems = compile_match(rule.match, rule.route or "route")
    extra: list[str] = []
    rewrite = _regex_rewrite(rule, extra)
    cors = None
    if rule.cors is not None and rule.redirect is None and rule.direct_response is None:
        cors = compile_cors(rule.cors, rule.route or "route")
        extra.extend(cors.problems)
    compiled = _CompiledRule(
        rule=rule,
        test=test,
        request_headers=HeaderEdit.of(rule.request_headers),
        response_headers=response,
        backends=tuple(backends),
        total=total,
        regex_rewrite=rewrite if isinstance(rewrite, tuple) else None,
        broken=rewrite is False,
        cors=cors,
    )
    return compiled, problems + tuple(extra)


def _unit(random: float) -> float:
    return random if 0.0 <= random < 1.0 else 0.0


def _mirror_draw(random: float, index: int) -> float:
    """Draw ``index`` derived from ``random``, in [0, 1) (``%``: non-negative also for the faults' negative
    indexes)."""
    return (random * _MIRROR_SCALE + _GOLDEN * (index + 1)) % 1.0


def _shadow(authority: str) -> str:
    host, port = split_authority(authority)
    return f"{host}-shadow" if port is None else f"{host}-shadow:{port}"


class CompiledTable:
    """A :class:`RouteTable` made ready to route: regular expressions compiled, modifiers cleaned, weights summed."""

    __slots__ = ("problems", "rules", "table")

    def __init__(self, table: RouteTable) -> None:
        compiled = [_compile_rule(rule) for rule in table.http]
        self.table = table
        self.rules = tuple(rule for rule, _ in compiled)
        self.problems: tuple[str, ...] = tuple(problem for _, problems in compiled for problem in problems)
        """What in the table cannot work (refused regular expressions), for logs and config dumps."""

    def route(self, destination: BackendService, request: RequestHead, random: float) -> Decision:
        """What to do with ``request`` sent to ``destination`` (the module's rules)."""
        if not self.rules:
            return _default_route(self.table.default_retry, destination, request)
        facts = RequestFacts(request)
        method, path = request.method, facts.path
        for compiled in self.rules:
            test = compiled.test
            if (
                (test.method is None or test.method == method)
                and (test.path is None or test.path(path))
                and (not test.needs_facts or test.holds_for(facts))
            ):
                return _take(compiled, destination, request, _unit(random))
        return Respond(404, flags="NR", by_router=False)


def _draw(backends: tuple[_Drawn, ...], draw: float) -> _Drawn | None:
    for entry in backends:
        if draw < entry[0]:
            return entry
    return backends[-1] if backends else None  # a draw at the very top of the range


def _take(compiled: _CompiledRule, destination: BackendService, request: RequestHead, random: float) -> Decision:
    rule = compiled.rule
    delay = 0.0
    if rule.fault is not None:
        fault = rule.fault
        if fault.delay > 0 and 100.0 * _mirror_draw(random, -2) < fault.delay_percent:
            delay = fault.delay
        aborts = fault.abort_status or fault.abort_grpc_status is not None
        if aborts and 100.0 * _mirror_draw(random, -3) < fault.abort_percent:
            return replace(_abort(fault, request, rule.route, delay), response_headers=compiled.response_headers)
    plan = plan_cors(compiled.cors, request) if compiled.cors is not None else None
    if isinstance(plan, AnswerPreflight):
        return Respond(200, plan.headers, route=rule.route, delay=delay, by_router=False)
    decision = _act(compiled, destination, request, random)
    if isinstance(decision, Respond) and compiled.response_headers is not None:
        decision = replace(decision, response_headers=compiled.response_headers)
    if plan is not None:
        decision = _with_cors(decision, plan.headers)
    return replace(decision, delay=delay) if delay else decision


def _with_cors(decision: Decision, added: tuple[tuple[str, str], ...]) -> Decision:
    """``decision`` with the CORS headers ``added`` set on its answer (rule 11)."""
    names = {name for name, _ in added}
    if isinstance(decision, Respond):
        kept = tuple((n, v) for n, v in decision.headers if n not in names)
        return replace(decision, headers=kept + added)
    modifier = decision.response_headers or HeaderModifier()
    return replace(
        decision,
        response_headers=HeaderModifier(
            set=tuple((n, v) for n, v in modifier.set if n not in names) + added,
            add=tuple((n, v) for n, v in modifier.add if n not in names),
            remove=modifier.remove,
        ),
    )


def _abort(fault: Fault, request: RequestHead, route: str, delay: float) -> Respond:
    """Rule 10's abort. A gRPC status abort answers 200, as Envoy's fault filter does: a gRPC request gets that
    ``grpc-status`` and ``grpc-message`` with no body (trailers only), any other request the text."""
    if fault.abort_grpc_status is None:
        return Respond(fault.abort_status, _TEXT, FAULT_BODY, route=route, delay=delay, flags="FI")
    if not (request.header("content-type") or "").startswith("application/grpc"):
        return Respond(200, _TEXT, FAULT_BODY, route=route, delay=delay, flags="FI")
    headers = (
        ("content-type", "application/grpc"),
        ("grpc-status", str(fault.abort_grpc_status)),
        ("grpc-message", FAULT_BODY.decode()),
    )
    return Respond(200, headers, b"", route=route, delay=delay, flags="FI")


def _act(compiled: _CompiledRule, destination: BackendService, request: RequestHead, random: float) -> Decision:
    rule = compiled.rule
    if rule.direct_response is not None and rule.redirect is None:
        direct = rule.direct_response
        return Respond(direct.status, _TEXT if direct.body else (), direct.body, route=rule.route)
    if rule.redirect is not None:
        if not request.authority:
            request = RequestHead(request.method, request.path, destination.hostname, request.headers, request.scheme)
        test = compiled.test
        location = redirect_location(request, rule.redirect, destination.port, test.prefix, literal=test.literal_prefix)
        if not is_visible_ascii(location):
            return Respond(500, route=rule.route)
        return Respond(rule.redirect.status_code, (("location", location),), route=rule.route)
    chosen = _draw(compiled.backends, random * compiled.total)
    if chosen is None:
        return Respond(500, route=rule.route)
    if chosen[1].backend is None:
        return Respond(rule.missing_backend_status, route=rule.route, flags="NC")  # Envoy: no cluster found
    backend, backend_edit = chosen[1].backend, chosen[2]
    if compiled.request_headers is not None:
        request = compiled.request_headers.apply(request)
    if rule.rewrite is not None:
        path = request.path
        if rule.rewrite.path is not None:
            path = rewrite_path(path, rule.rewrite.path, compiled.test.prefix, literal=compiled.test.literal_prefix)
        hostname = rule.rewrite.hostname
        if hostname is not None and not is_visible_ascii(hostname):
            return Respond(500, route=rule.route)
        authority = hostname or request.authority
        request = RequestHead(request.method, path, authority, request.headers, request.scheme)
    if compiled.broken:
        return Respond(500, route=rule.route)
    if compiled.regex_rewrite is not None:
        pattern, substitution = compiled.regex_rewrite
        path, query = split_target(request.path)
        if len(path) <= SUBJECT_LIMIT:
            path = pattern.sub(substitution, path)
        if not is_visible_ascii(path):
            return Respond(500, route=rule.route)
        request = RequestHead(request.method, (path or "/") + query, request.authority, request.headers, request.scheme)
    mirrors = (
        tuple(
            (
                mirror.backend,
                RequestHead(request.method, request.path, _shadow(request.authority), request.headers, request.scheme),
            )
            for index, mirror in enumerate(rule.mirrors)
            if 100.0 * _mirror_draw(random, index) < mirror.percent
        )
        if rule.mirrors
        else ()
    )
    if backend_edit is not None:
        request = backend_edit.apply(request)
    return Forward(
        backend,
        request,
        response_headers=chosen[3],
        timeouts=rule.timeouts,
        retry=rule.retry,
        mirrors=mirrors,
        route=rule.route,
        missing_backend_status=rule.missing_backend_status,
    )


_compiled: dict[int, tuple[RouteTable, CompiledTable]] = {}
"""Compiled tables by ``id(table)``; the entry keeps its table alive, so an id is never reused while cached."""


def compile_table(table: RouteTable) -> CompiledTable:
    """The compiled form of ``table``, made once per table object (rule 3) and kept for the last few tables."""
    entry = _compiled.get(id(table))
    if entry is not None and entry[0] is table:
        return entry[1]
    compiled = CompiledTable(table)
    if len(_compiled) >= _CACHE_SIZE:
        del _compiled[next(iter(_compiled))]
    _compiled[id(table)] = (table, compiled)
    return compiled


def route(table: RouteTable | None, destination: BackendService, request: RequestHead, random: float) -> Decision:
    """The :data:`~ambit.waypoint.decisions.Router`: what to do with ``request`` sent to ``destination``."""
    if table is None or not table.http:
        return _default_route(ISTIO_RETRY if table is None else table.default_retry, destination, request)
    return compile_table(table).route(destination, request, random)


def _default_route(retry: HttpRetry, destination: BackendService, request: RequestHead) -> Forward:
    """Rule 1."""
    timeouts = _NO_TIMEOUTS if retry.per_try_timeout is None else Timeouts(backend_request=retry.per_try_timeout)
    return Forward(destination, request, timeouts=timeouts, retry=retry.policy)


def waypoint_route(
    table: RouteTable | None, destination: BackendService, request: RequestHead, random: float
) -> Decision:
    """The waypoint's :data:`~ambit.waypoint.decisions.Router`: rule 12, then :func:`route`."""
    routed = request.route_headers
    if request.header(FORWARDED_PROTO) is not None and (routed is None or any(n == FORWARDED_PROTO for n, _ in routed)):
        return route(table, destination, request, random)
    return route(table, destination, request.edit_headers(_with_forwarded_proto), random)


def _with_forwarded_proto(headers: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    return headers if any(n == FORWARDED_PROTO for n, _ in headers) else (*headers, (FORWARDED_PROTO, "http"))


def route_tcp(table: RouteTable | None, destination: BackendService, random: float) -> BackendService | None:
    """Where a TCP stream to ``destination`` goes: a ``tcp_backends`` entry drawn by weight, or the destination
    itself when no TCPRoute or TLSRoute is attached; None (close the stream) when the draw lands on nothing or an
    unresolved backend."""
    if table is None or not table.tcp_backends:
        return destination
    weighted = [b for b in table.tcp_backends if b.weight > 0]
    draw = _unit(random) * sum(b.weight for b in weighted)
    for backend in weighted:
        if draw < backend.weight:
            return backend.backend
        draw -= backend.weight
    return weighted[-1].backend if weighted else None


def with_request_id(request: RequestHead, generated: str) -> RequestHead:
    """``request`` with ``x-request-id: generated`` added when it carries none (or an empty one); an existing id is
    kept, so one id follows a request through every proxy."""
    if request.header(REQUEST_ID):
        return request
    headers = (*((n, v) for n, v in request.headers if n != REQUEST_ID), (REQUEST_ID, generated))
    return RequestHead(request.method, request.path, request.authority, headers, request.scheme)
