"""The L7 half of the one authorization engine (ambit.rbac rules 11 to 15): a table per field, TCP semantics and AUDIT,
and properties that a request can never make a DENY weaker than at TCP nor an ALLOW stronger."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.model.identity import SpiffeId
from ambit.model.policy import Action, Clause, KeyedMatch, Match, Policy, Rule, Scope, StringMatch
from ambit.model.requestauth import RequestIdentity
from ambit.rbac import NOT_ALLOWED, Applicable, Connection, Request, decide, evaluate, match_holds, matching_rule

WEB = SpiffeId("cluster.local", "shop", "web")
CONN = Connection(ipaddress.ip_address("198.18.1.5"), WEB, ipaddress.ip_address("198.18.2.7"), 8080)
TOKEN = RequestIdentity(
    "https://issuer.example",
    "alice",
    audiences=("shop", "billing"),
    presenter="cli",
    claims={"iss": "https://issuer.example", "groups": ["admin", 7], "org": {"team": "red"}, "n": 5},
)


def request(
    method: str = "GET",
    host: str = "Shop.Example",
    path: str = "/cart/items",
    headers: tuple[tuple[str, str], ...] = (("x-env", "prod"),),
    identity: RequestIdentity | None = TOKEN,
    remote: str | None = None,
    sni: str | None = None,
) -> Request:
    return Request(method, host, path, headers, identity, ipaddress.ip_address(remote) if remote else None, sni)


def s(*patterns: str) -> tuple[StringMatch, ...]:
    return tuple(StringMatch.of_pattern(p) for p in patterns)


def net(text: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return (ipaddress.ip_network(text),)


L7_CASES = [
    # hosts: case-insensitive, exact authority (a port must be named: "host:*")
    (Match(hosts=s("shop.example")), request(), True),
    (Match(hosts=s("shop.example")), request(host="shop.example:8080"), False),
    (Match(hosts=s("shop.example:*")), request(host="SHOP.example:8080"), True),
    (Match(hosts=s("*.example")), request(), True),
    (Match(not_hosts=s("shop.example")), request(host="SHOP.EXAMPLE"), False),
    (Match(not_hosts=s("other.example")), request(), True),
    # methods: exact, case-sensitive
    (Match(methods=("GET",)), request(), True),
    (Match(methods=("get",)), request(), False),
    (Match(methods=("POST", "PUT")), request(), False),
    (Match(not_methods=("POST",)), request(method="POST"), False),
    (Match(not_methods=("POST",)), request(), True),
    # paths: exact, prefix, suffix, presence
    (Match(paths=s("/cart/items")), request(), True),
    (Match(paths=s("/cart/*")), request(), True),
    (Match(paths=s("*/items")), request(), True),
    (Match(paths=s("*")), request(), True),
    (Match(paths=s("/cart")), request(), False),
    (Match(not_paths=s("/cart/*")), request(), False),
    (Match(not_paths=s("/admin*")), request(), True),
    # path templates: alternatives of their list (Envoy's OR of url_path and uri_template permissions)
    (Match(path_templates=("/{*}/items",)), request(), True),
    (Match(path_templates=("/{*}",)), request(), False),
    (Match(paths=s("/nope"), path_templates=("/cart/{**}",)), request(), True),
    (Match(paths=s("/cart/*"), path_templates=("/x/{*}",)), request(), True),
    (Match(paths=s("/nope"), path_templates=("/x/{*}",)), request(), False),
    (Match(not_path_templates=("/{**}/items",)), request(), False),
    (Match(not_paths=s("/admin"), not_path_templates=("/admin/{*}",)), request(), True),
    (Match(paths=s("/cart/*"), not_path_templates=("/{*}/items",)), request(), False),
    # request principals: <iss>/<sub>; none without a token
    (Match(request_principals=s("https://issuer.example/alice")), request(), True),
    (Match(request_principals=s("*")), request(), True),
    (Match(request_principals=s("*")), request(identity=None), False),
    (Match(request_principals=s("https://issuer.example/*")), request(), True),
    (Match(request_principals=s("https://other/*")), request(), False),
    (Match(not_request_principals=s("*")), request(identity=None), True),
    (Match(not_request_principals=s("*")), request(), False),
    # remote IPs: the original client, else the connection's source
    (Match(remote_ips=net("198.18.1.0/24")), request(), True),
    (Match(remote_ips=net("198.18.1.0/24")), request(remote="203.0.113.9"), False),
    (Match(remote_ips=net("203.0.113.0/24")), request(remote="::ffff:203.0.113.9"), True),
    (Match(not_remote_ips=net("203.0.113.9/32")), request(remote="203.0.113.9"), False),
    # headers
    (Match(request_headers=(KeyedMatch(("x-env",), s("prod")),)), request(), True),
    (Match(request_headers=(KeyedMatch(("x-env",), s("dev")),)), request(), False),
    (Match(request_headers=(KeyedMatch(("x-env",), s("*")),)), request(headers=()), False),
    (Match(request_headers=(KeyedMatch(("x-env",), (), s("dev")),)), request(), True),
    (Match(request_headers=(KeyedMatch(("x-env",), (), s("prod")),)), request(), False),
    (Match(request_headers=(KeyedMatch(("x-env",), (), s("prod")),)), request(headers=()), True),
    (
        Match(request_headers=(KeyedMatch(("x-env",), s("prod,dev")),)),
        request(headers=(("x-env", "prod"), ("x-env", "dev"))),
        True,
    ),
    (
        Match(request_headers=(KeyedMatch(("x-env",), s("p*"), s("*dev")),)),
        request(headers=(("x-env", "prod"), ("x-env", "dev"))),
        False,
    ),
    # claims: nested paths, list claims, non-string claims match nothing
    (Match(request_claims=(KeyedMatch(("groups",), s("admin")),)), request(), True),
    (Match(request_claims=(KeyedMatch(("groups",), s("7")),)), request(), False),
    (Match(request_claims=(KeyedMatch(("org", "team"), s("red")),)), request(), True),
    (Match(request_claims=(KeyedMatch(("org", "team"), s("blue")),)), request(), False),
    (Match(request_claims=(KeyedMatch(("org", "team", "x"), s("*")),)), request(), False),
    (Match(request_claims=(KeyedMatch(("n",), s("5")),)), request(), False),
    (Match(request_claims=(KeyedMatch(("groups",), s("admin")),)), request(identity=None), False),
    (Match(request_claims=(KeyedMatch(("groups",), (), s("admin")),)), request(identity=None), True),
    (Match(request_claims=(KeyedMatch(("groups",), (), s("admin")),)), request(), False),
    # audiences, presenter, SNI
    (Match(audiences=s("billing")), request(), True),
    (Match(audiences=s("ops")), request(), False),
    (Match(not_audiences=s("billing")), request(), False),
    (Match(audiences=s("*")), request(identity=None), False),
    (Match(presenters=s("cli")), request(), True),
    (Match(presenters=s("*")), request(identity=RequestIdentity("i", "s")), False),
    (Match(sni=s("*.example")), request(sni="shop.example"), True),
    (Match(sni=s("*")), request(), False),
    (Match(not_sni=s("*")), request(), True),
    # L7 and L4 fields together: all must hold
    (Match(methods=("GET",), namespaces=s("shop")), request(), True),
    (Match(methods=("GET",), namespaces=s("jobs")), request(), False),
]


@pytest.mark.parametrize(("match", "req", "expected"), L7_CASES)
def test_l7_match_fields(match: Match, req: Request, expected: bool) -> None:
    assert match_holds(match, CONN, req) is expected


def one(match: Match, action: Action, name: str = "p") -> Policy:
    return Policy(name, "shop", Scope.WAYPOINT, action, (Rule((Clause((match,)),)),))


def test_without_a_request_an_allow_rule_with_l7_fields_never_matches() -> None:
    allow = Policy(
        "p",
        "shop",
        Scope.WAYPOINT,
        Action.ALLOW,
        (
            Rule((Clause((Match(methods=("GET",)), Match(namespaces=s("shop")))),)),
            Rule((Clause((Match(namespaces=s("jobs")),)),)),
        ),
    )
    assert matching_rule(allow, CONN, request()) == 0
    assert matching_rule(allow, CONN) is None  # the L7 rule is skipped whole, the L4 one does not match
    assert evaluate([allow], CONN).reason == NOT_ALLOWED


def test_without_a_request_a_deny_ignores_its_l7_fields() -> None:
    deny = one(Match(methods=("POST",), namespaces=s("shop")), Action.DENY)
    assert matching_rule(deny, CONN, request()) is None  # a GET is not denied
    assert matching_rule(deny, CONN) == 0  # at TCP the method is ignored: shop is denied
    only_l7 = one(Match(paths=s("/admin*")), Action.DENY)
    assert matching_rule(only_l7, CONN) == 0
    other_ns = one(Match(methods=("POST",), namespaces=s("jobs")), Action.DENY)
    assert matching_rule(other_ns, CONN) is None


def test_deny_post_beats_allow() -> None:
    allow = one(Match(paths=s("/cart/*")), Action.ALLOW, "allow")
    deny = one(Match(methods=("POST",)), Action.DENY, "deny")
    applicable = Applicable.of([allow, deny], ())
    assert decide(applicable, CONN, request()).allowed
    post = decide(applicable, CONN, request(method="POST"))
    assert (post.allowed, post.denied_by) == (False, "shop/deny")
    assert not decide(applicable, CONN, request(path="/admin")).allowed


def test_audit_never_changes_the_decision_and_is_reported() -> None:
    audit = one(Match(paths=s("/cart/*")), Action.AUDIT, "audit")
    alone = Applicable.of([audit], ())
    d = decide(alone, CONN, request())
    assert (d.allowed, d.audited) == (True, ("shop/audit",))
    assert decide(alone, CONN, request(path="/x")) == alone.allowed
    assert evaluate([audit], CONN, request=request()).audited == ("shop/audit",)
    # An AUDIT is not an ALLOW: it does not make "allow policies exist".
    deny_all = Applicable.of([audit, one(Match(paths=s("*")), Action.DENY, "deny")], ())
    denied = decide(deny_all, CONN, request())
    assert (denied.allowed, denied.audited) == (False, ("shop/audit",))
    dry = Policy("dry", "shop", Scope.WAYPOINT, Action.AUDIT, audit.rules, dry_run=True)
    assert decide(Applicable.of([dry], ()), CONN, request()).audited == ()
    assert evaluate([dry], CONN, request=request()).audited == ()


# --- properties ------------------------------------------------------------------------------------------------

_strings = st.sampled_from(["/cart/items", "/admin", "GET", "POST", "shop.example", "prod", "*", "/cart/*", "*s"])
_patterns = st.lists(_strings.map(StringMatch.of_pattern), max_size=2).map(tuple)
_methods = st.lists(st.sampled_from(["GET", "POST", "PUT"]), max_size=2).map(tuple)
_matches = st.builds(
    Match,
    namespaces=st.lists(st.sampled_from([StringMatch.exact("shop"), StringMatch.exact("jobs")]), max_size=1).map(tuple),
    methods=_methods,
    not_methods=_methods,
    paths=_patterns,
    not_paths=_patterns,
    hosts=_patterns,
    request_principals=_patterns,
    not_request_principals=_patterns,
    request_headers=st.lists(
        st.builds(KeyedMatch, key=st.just(("x-env",)), values=_patterns, not_values=_patterns), max_size=1
    ).map(tuple),
)
_rules = st.lists(
    st.lists(st.lists(_matches, min_size=1, max_size=2).map(lambda ms: Clause(tuple(ms))), max_size=2).map(
        lambda cs: Rule(tuple(cs))
    ),
    min_size=1,
    max_size=2,
).map(tuple)
_requests = st.builds(
    request,
    method=st.sampled_from(["GET", "POST"]),
    host=st.sampled_from(["shop.example", "x"]),
    path=st.sampled_from(["/cart/items", "/admin", "/"]),
    headers=st.sampled_from([(), (("x-env", "prod"),), (("x-env", "dev"),)]),
    identity=st.sampled_from([None, TOKEN]),
)


@settings(max_examples=300, deadline=None)
@given(_rules, _requests)
def test_a_deny_at_tcp_denies_at_least_what_it_denies_for_any_request(rules: tuple[Rule, ...], req: Request) -> None:
    deny = Policy("d", "shop", Scope.WAYPOINT, Action.DENY, rules)
    if matching_rule(deny, CONN, req) is not None:
        assert matching_rule(deny, CONN) is not None


@settings(max_examples=300, deadline=None)
@given(_rules, _requests)
def test_an_allow_at_tcp_allows_no_more_than_for_any_request(rules: tuple[Rule, ...], req: Request) -> None:
    allow = Policy("a", "shop", Scope.WAYPOINT, Action.ALLOW, rules)
    if matching_rule(allow, CONN) is not None:
        assert matching_rule(allow, CONN, req) is not None


@settings(max_examples=200, deadline=None)
@given(_rules, _rules, _rules, _requests)
def test_decide_agrees_with_evaluate_and_audit_changes_nothing(
    allow: tuple[Rule, ...], deny: tuple[Rule, ...], audit: tuple[Rule, ...], req: Request
) -> None:
    policies = [
        Policy("a", "shop", Scope.WAYPOINT, Action.ALLOW, allow),
        Policy("d", "shop", Scope.WAYPOINT, Action.DENY, deny),
    ]
    with_audit = [*policies, Policy("u", "shop", Scope.WAYPOINT, Action.AUDIT, audit)]
    for r in (req, None):
        full = evaluate(with_audit, CONN, request=r)
        fast = decide(Applicable.of(with_audit, ()), CONN, r)
        assert (fast.allowed, fast.reason, fast.denied_by, fast.audited) == (
            full.allowed,
            full.reason,
            full.denied_by,
            full.audited,
        )
        assert evaluate(policies, CONN, request=r).allowed == full.allowed
