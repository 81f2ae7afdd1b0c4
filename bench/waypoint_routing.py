"""Waypoint routing engine microbenchmark: µs per :func:`ambit.waypoint.routing.route` call.

``.venv/bin/python bench/waypoint_routing.py [--rules N] [--calls N]`` builds a table of N rules the way a
translator would order them (Exact paths, long prefixes, method, header and query matches, a RegularExpression
and a catch-all, with header modifiers, a rewrite and a 90/10 split) and times requests that land at the first
rule, in the middle, on the last rule (the catch-all, after every other rule was tried) and the default route.
One thread, no I/O: only the engine is measured.
"""

from __future__ import annotations

import argparse
import time

from ambit.model.route_matches import PathMatch, PathMatchType, RouteMatch, ValueMatch, ValueMatchType
from ambit.model.routes import (
    BackendService,
    HeaderModifier,
    PathModifier,
    PathModifierType,
    RouteRule,
    RouteTable,
    URLRewrite,
    WeightedBackend,
)
from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.routing import route

DEST = BackendService("app", "reviews.app.svc.cluster.local", 9080)
V1 = BackendService("app", "reviews-v1.app.svc.cluster.local", 9080)
V2 = BackendService("app", "reviews-v2.app.svc.cluster.local", 9080)


def build_table(rules: int) -> RouteTable:
    built: list[RouteRule] = []
    for i in range(rules - 1):
        kind = i % 5
        if kind == 0:
            match = RouteMatch(path=PathMatch(PathMatchType.EXACT, f"/exact/{i}"))
        elif kind == 1:
            match = RouteMatch(path=PathMatch(PathMatchType.PATH_PREFIX, f"/api/v{i}/items"), method="POST")
        elif kind == 2:
            match = RouteMatch(
                path=PathMatch(PathMatchType.PATH_PREFIX, f"/api/v{i}"),
                headers=(
                    ValueMatch("x-version", f"v{i}"),
                    ValueMatch("x-user", "u[0-9]+", ValueMatchType.REGULAR_EXPRESSION),
                ),
            )
        elif kind == 3:
            match = RouteMatch(path=PathMatch(PathMatchType.PATH_PREFIX, "/q"), query_params=(ValueMatch("v", str(i)),))
        else:
            match = RouteMatch(path=PathMatch(PathMatchType.REGULAR_EXPRESSION, rf"/re/{i}/[a-z]+/[0-9]+"))
        built.append(
            RouteRule(
                route=f"HTTPRoute/app/r{i}",
                match=match,
                backends=(WeightedBackend(V1, 90), WeightedBackend(V2, 10)),
                request_headers=HeaderModifier(set=(("x-route", str(i)),)),
            )
        )
    built.append(
        RouteRule(
            route="HTTPRoute/app/catch-all",
            match=RouteMatch(),
            backends=(WeightedBackend(V1, 90), WeightedBackend(V2, 10)),
            request_headers=HeaderModifier(set=(("x-route", "last"),), add=(("x-extra", "1"),), remove=("cookie",)),
            rewrite=URLRewrite(path=PathModifier(PathModifierType.REPLACE_PREFIX_MATCH, "/v2")),
        )
    )
    return RouteTable(DEST.service_key, DEST.port, http=tuple(built))


HEADERS = (
    ("user-agent", "curl/8.5.0"),
    ("accept", "*/*"),
    ("x-user", "u42"),
    ("cookie", "session=abc"),
    ("x-request-id", "5f1c0a4e-8b1d-4c57-9d3e-7f0a1b2c3d4e"),
)


def time_calls(table: RouteTable | None, request: RequestHead, calls: int) -> float:
    """µs of this process's CPU per call, best of three runs (CPU time, so a busy machine inflates it less)."""
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for i in range(calls):
            route(table, DEST, request, (i % 1000) / 1000)
        best = min(best, time.process_time() - started)
    return best / calls * 1e6


def reference(calls: int) -> float:
    """µs per ``sum(range(100))``, a yardstick of this interpreter on this machine at this moment."""
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for _ in range(calls):
            sum(range(100))
        best = min(best, time.process_time() - started)
    return best / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", type=int, default=20)
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    table = build_table(args.rules)
    cases = {
        "first rule (Exact path)": RequestHead("GET", "/exact/0", "reviews:9080", HEADERS),
        "middle rule (headers + regex)": RequestHead(
            "GET", "/api/v7/x", "reviews:9080", (*HEADERS, ("x-version", "v7"))
        ),
        f"last rule (catch-all, {args.rules - 1} misses)": RequestHead(
            "GET", "/other/path?a=1", "reviews:9080", HEADERS
        ),
    }
    print(f"route() with a {args.rules}-rule table, {args.calls} calls, best of 3")
    for name, request in cases.items():
        print(f"  {name:<40} {time_calls(table, request, args.calls):7.2f} µs/call")
    default = time_calls(None, cases["first rule (Exact path)"], args.calls)
    print(f"  {'default route (no table)':<40} {default:7.2f} µs/call")
    print(f"  {'yardstick: sum(range(100))':<40} {reference(args.calls):7.2f} µs/call")


if __name__ == "__main__":
    main()
