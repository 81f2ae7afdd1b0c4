"""Authorization: which policies apply to a connection or request, and whether it may go on (spec §4.3, §7.1, §7.3).

Theory of operation: the node proxy describes each inbound connection as a :class:`Connection` and asks
:meth:`PolicyIndex.check` for a :class:`Decision`. The index finds the policies of the destination by lookup (its
namespace, the global set, the keys its workload lists), never by scanning every policy. The same engine answers
``ambit policy explain``, so :class:`Decision` also carries a trace of every policy it looked at. A waypoint or
gateway uses the same functions with a :class:`Request` as well (the L7 fields of a match, rules 11 to 15): there is
one engine, L7 extends it.

Rules of one policy (spec §4.3):

1. A policy matches if any of its rules matches; a policy without rules never matches.
2. A rule matches if all of its clauses match; a rule without clauses matches every connection.
3. A clause matches if any of its non-empty matches matches; empty matches are skipped.
4. Within a match every populated field must hold. A field holds if some value of its positive list matches
   (when the list is given) and no value of its negative list matches (when that list is given).
5. Identity fields (principals, namespaces, service accounts) compare against the peer's verified identity;
   ``principals`` against ``<trust domain>/ns/<ns>/sa/<sa>`` (the id without ``spiffe://``). Without an identity
   (plaintext) no value matches, so a positive list fails and a negative list holds.
6. IPs match by CIDR containment; IPv4-mapped IPv6 addresses are read as IPv4.

Rules of the decision (spec §7.3):

7. The policies of a destination are the NAMESPACE-scoped policies of its namespace, every GLOBAL policy and the
   keys its workload lists; a listed key that is not known is skipped and reported.
8. Any enforced (not dry-run) DENY that matches → denied, "explicitly denied by: ns/name" (the first by key).
9. Otherwise, no enforced ALLOW → allowed; an enforced ALLOW that matches → allowed; else denied, "allow
   policies exist, but none allowed".
10. Dry-run policies never change the decision. They are evaluated as a set of their own (DENY first, then
    ALLOW, as above) and what they would have done is reported in :attr:`Decision.dry_run`.

Rules of L7 (a waypoint or gateway, spec §7.1; Istio's RBAC semantics):

11. With a :class:`Request`, the L7 fields of a match are further fields of rule 4: hosts against the authority,
    lower-cased (the match values are lower-case; as Istio, ``example.com`` does not match ``example.com:8080``:
    a policy names ``example.com:*`` for that); methods exactly; paths against the normalized path without query;
    request principals against ``<iss>/<sub>`` of the validated token; remote IPs against the original client
    (else the connection's source); audiences and presenter against the token's ``aud`` and ``azp``; SNI against
    the downstream server name. A value that is absent (no token, no SNI) matches nothing, so a positive list
    fails and a negative list holds, as rule 5.
12. Keyed conditions (:class:`~ambit.model.policy.KeyedMatch`): a header by its lower-case name (values received
    more than once are joined by ``,``); a claim by its path through nested objects, a list claim holding if any of
    its strings would; non-string claims match nothing. ``values`` need the attribute present; ``not_values``
    hold when it is absent.
13. Without a :class:`Request` (the node proxy, or TCP through a waypoint), as istiod builds a TCP filter: an
    ALLOW rule with any L7 field never matches; in a DENY or AUDIT the L7 fields are ignored and the rest of the
    match applies (a match of L7 fields only then holds). So a DENY without a request denies at least what it
    denies for any request.
14. AUDIT policies never change the decision; the enforced ones that match are listed in
    :attr:`Decision.audited` for the access log.
15. Dry-run AUDIT policies are ignored.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ambit.model.identity import SpiffeId
from ambit.model.path_templates import path_matches_template
from ambit.model.policy import Action, Cidr, KeyedMatch, Match, Policy, Scope, ServiceAccountMatch, StringMatch
from ambit.model.workload import IPAddress, Workload

if TYPE_CHECKING:  # a waypoint's type: the node proxy's L4 decisions never load the JWT model
    from ambit.model.requestauth import RequestIdentity

__all__ = [
    "Applicable",
    "Connection",
    "Decision",
    "PolicyIndex",
    "PolicyTrace",
    "Request",
    "decide",
    "evaluate",
    "match_holds",
    "matching_rule",
    "policy_matches",
]

NOT_ALLOWED = "allow policies exist, but none allowed"


def explicitly_denied(key: str) -> str:
    return f"explicitly denied by: {key}"


def _plain_ip(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


@dataclass(frozen=True, slots=True)
class Connection:
    """What a policy may look at for one inbound connection (rule 6 applied on construction)."""

    source_ip: IPAddress
    source_identity: SpiffeId | None
    """The peer's verified identity; None without mutual TLS."""
    destination_ip: IPAddress
    destination_port: int
    principal: str | None = field(init=False, compare=False)
    """The identity as policies name it: ``td/ns/<ns>/sa/<sa>`` (None without one)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "source_ip", _plain_ip(self.source_ip))
        object.__setattr__(self, "destination_ip", _plain_ip(self.destination_ip))
        i = self.source_identity
        principal = None if i is None else f"{i.trust_domain}/ns/{i.namespace}/sa/{i.service_account}"
        object.__setattr__(self, "principal", principal)


@dataclass(frozen=True, slots=True)
class Request:
    """The L7 attributes of one HTTP request, for the waypoint and gateway (L7 fields of :class:`Match`).

    The L4 attributes stay on the :class:`Connection` the request arrived on. Without a :class:`Request` (the node
    proxy, or TCP through a waypoint) a match with L7 fields is judged as istiod does for a TCP filter chain:
    in an ALLOW such a rule never matches; in a DENY the L7 fields are ignored and the rest of it applies.
    """

    method: str
    host: str
    """The authority (``Host`` or ``:authority``) as received."""
    path: str
    """Normalized, without the query."""
    headers: tuple[tuple[str, str], ...] = ()
    """Names lower-case, in the order received."""
    identity: RequestIdentity | None = None
    """The validated JWT's attributes; None when the request carried no token."""
    remote_ip: IPAddress | None = None
    """The original client when ``X-Forwarded-For`` names one; None: the connection's source."""
    sni: str | None = None

    def header(self, name: str) -> str | None:
        """The value of header ``name`` (lower-case), its values joined by ``,`` when repeated; None if absent."""
        values = [v for n, v in self.headers if n == name]
        return ",".join(values) if values else None


def _strings(positive: Sequence[StringMatch], negative: Sequence[StringMatch], value: str | None) -> bool:
    """Rule 4 for a string field; without a value (no identity) no string matches."""
    if value is None:
        return not positive
    if positive and not any(m.matches(value) for m in positive):
        return False
    return not (negative and any(m.matches(value) for m in negative))


def _paths(match: Match, path: str) -> bool:
    """Rule 11's paths with templates: each list is its string matches or its templates."""
    if (match.paths or match.path_templates) and not (
        any(m.matches(path) for m in match.paths) or any(path_matches_template(t, path) for t in match.path_templates)
    ):
        return False
    return not (
        any(m.matches(path) for m in match.not_paths)
        or any(path_matches_template(t, path) for t in match.not_path_templates)
    )


def _accounts(
    positive: Sequence[ServiceAccountMatch], negative: Sequence[ServiceAccountMatch], identity: SpiffeId | None
) -> bool:
    if identity is None:
        return not positive
    ns, sa = identity.namespace, identity.service_account

    def hit(m: ServiceAccountMatch) -> bool:
        return m.namespace == ns and m.service_account == sa

    if positive and not any(hit(m) for m in positive):
        return False
    return not (negative and any(hit(m) for m in negative))


@functools.lru_cache(maxsize=65536)
def _span(cidr: Cidr) -> tuple[int, int, int]:
    """``(version, first, last)`` of a CIDR as integers: containment without ipaddress's comparisons."""
    first = int(cidr.network_address)
    return cidr.version, first, first + cidr.num_addresses - 1


def _ips(positive: Sequence[Cidr], negative: Sequence[Cidr], ip: IPAddress) -> bool:
    version, value = ip.version, int(ip)

    def hit(cidr: Cidr) -> bool:
        v, first, last = _span(cidr)
        return v == version and first <= value <= last

    if positive and not any(hit(c) for c in positive):
        return False
    return not (negative and any(hit(c) for c in negative))


def _many(positive: Sequence[StringMatch], negative: Sequence[StringMatch], values: Sequence[str]) -> bool:
    """Rule 4 for a field with several values (audiences, a list claim): some value matches, none is excluded."""
    if positive and not any(m.matches(v) for v in values for m in positive):
        return False
    return not (negative and any(m.matches(v) for v in values for m in negative))


def _claim(claims: Mapping[str, Any], path: Sequence[str]) -> tuple[str, ...] | None:
    """The string values of the claim at ``path`` (rule 12); None when absent or not a string or list of them."""
    value: Any = claims
    for step in path:
        if not isinstance(value, Mapping) or step not in value:
            return None
        value = value[step]
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, str))
    return None


def _keyed(match: KeyedMatch, values: Sequence[str] | None) -> bool:
    if values is None:
        return not match.values
    return _many(match.values, match.not_values, values)


def _l7_holds(match: Match, conn: Connection, request: Request) -> bool:
    """Rules 11 and 12 for the L7 fields of one match."""
    if (match.hosts or match.not_hosts) and not _strings(match.hosts, match.not_hosts, request.host.lower()):
        return False
    if match.methods and request.method not in match.methods:
        return False
    if match.not_methods and request.method in match.not_methods:
        return False
    if match.path_templates or match.not_path_templates:
        if not _paths(match, request.path):
            return False
    elif (match.paths or match.not_paths) and not _strings(match.paths, match.not_paths, request.path):
        return False
    identity = request.identity
    if (match.request_principals or match.not_request_principals) and not _strings(
        match.request_principals, match.not_request_principals, identity.principal if identity else None
    ):
        return False
    if (match.remote_ips or match.not_remote_ips) and not _ips(
        match.remote_ips, match.not_remote_ips, _plain_ip(request.remote_ip or conn.source_ip)
    ):
        return False
    if (match.audiences or match.not_audiences) and not _many(
        match.audiences, match.not_audiences, identity.audiences if identity else ()
    ):
        return False
    if (match.presenters or match.not_presenters) and not _strings(
        match.presenters, match.not_presenters, (identity.presenter or None) if identity else None
    ):
        return False
    if (match.sni or match.not_sni) and not _strings(match.sni, match.not_sni, request.sni or None):
        return False
    for keyed in match.request_headers:
        value = request.header(keyed.key[0]) if keyed.key else None
        if not _keyed(keyed, None if value is None else (value,)):
            return False
    for keyed in match.request_claims:
        if not _keyed(keyed, _claim(identity.claims, keyed.key) if identity else None):
            return False
    return True


def match_holds(match: Match, conn: Connection, request: Request | None = None) -> bool:
    """Rule 4 for one non-empty match, with its L7 fields when there is a request (rules 11 to 13)."""
    if request is not None and match.is_l7 and not _l7_holds(match, conn, request):
        return False
    identity = conn.source_identity
    if (match.principals or match.not_principals) and not _strings(
        match.principals, match.not_principals, conn.principal
    ):
        return False
    if (match.namespaces or match.not_namespaces) and not _strings(
        match.namespaces, match.not_namespaces, identity.namespace if identity else None
    ):
        return False
    if (match.service_accounts or match.not_service_accounts) and not _accounts(
        match.service_accounts, match.not_service_accounts, identity
    ):
        return False
    if (match.source_ips or match.not_source_ips) and not _ips(match.source_ips, match.not_source_ips, conn.source_ip):
        return False
    if (match.destination_ips or match.not_destination_ips) and not _ips(
        match.destination_ips, match.not_destination_ips, conn.destination_ip
    ):
        return False
    port = conn.destination_port
    if match.destination_ports and port not in match.destination_ports:
        return False
    return not (match.not_destination_ports and port in match.not_destination_ports)


def matching_rule(policy: Policy, conn: Connection, request: Request | None = None) -> int | None:
    """The index of the first rule of ``policy`` that matches ``conn`` (and ``request``; rules 1 to 3, 13), or None."""
    tcp_allow = request is None and policy.action is Action.ALLOW
    for index, rule in enumerate(policy.rules):
        if tcp_allow and rule.is_l7:
            continue  # rule 13
        for clause in rule.clauses:
            for match in clause.matches:
                if not match.is_empty and match_holds(match, conn, request):
                    break
            else:
                break  # no match of this clause holds: the rule fails
        else:
            return index
    return None


def policy_matches(policy: Policy, conn: Connection, request: Request | None = None) -> bool:
    return matching_rule(policy, conn, request) is not None


@dataclass(frozen=True, slots=True)
class PolicyTrace:
    """One policy the decision looked at, and which of its rules matched (None: none did)."""

    key: str
    action: Action
    dry_run: bool
    rule: int | None


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str = ""
    """Why a connection is denied (empty when allowed)."""
    denied_by: str | None = None
    """The key of the DENY policy that matched, if one did."""
    dry_run: str = ""
    """What the dry-run policies would have said, when they would have denied: e.g. "explicitly denied by: ns/n"."""
    missing: tuple[str, ...] = ()
    """Keys the workload lists that the index does not know (rule 7)."""
    trace: tuple[PolicyTrace, ...] = field(default=(), compare=False)
    audited: tuple[str, ...] = ()
    """Keys of the enforced AUDIT policies that matched (rule 14)."""


def _verdict(traces: Iterable[PolicyTrace]) -> tuple[bool, str, str | None]:
    """Rules 8 and 9 over one set of evaluated policies (all enforced, or all dry-run)."""
    allows = False
    allowed = False
    for t in traces:
        if t.action is Action.DENY:
            if t.rule is not None:
                return False, explicitly_denied(t.key), t.key
        elif t.action is Action.ALLOW:
            allows = True
            allowed = allowed or t.rule is not None
    if allows and not allowed:
        return False, NOT_ALLOWED, None
    return True, "", None


def evaluate(
    policies: Iterable[Policy], conn: Connection, missing: tuple[str, ...] = (), request: Request | None = None
) -> Decision:
    """The decision for ``conn`` (and ``request``) under ``policies`` (rules 8 to 15), policies in key order."""
    traces = tuple(
        PolicyTrace(p.key, p.action, p.dry_run, matching_rule(p, conn, request)) for p in sorted(policies, key=_order)
    )
    allowed, reason, denied_by = _verdict(t for t in traces if not t.dry_run)
    dry_allowed, dry_reason, _ = _verdict(t for t in traces if t.dry_run)
    audited = tuple(t.key for t in traces if t.action is Action.AUDIT and not t.dry_run and t.rule is not None)
    return Decision(allowed, reason, denied_by, "" if dry_allowed else dry_reason, missing, traces, audited)


def _order(policy: Policy) -> tuple[str, str]:
    return (policy.namespace, policy.name)


_CACHE_LIMIT = 4096
"""Destinations whose applicable policies are cached (cleared whole when full, and on every policy change)."""


@dataclass(frozen=True, slots=True)
class Applicable:
    """The policies of one destination, split and ordered for :func:`decide`."""

    deny: tuple[Policy, ...]
    allow: tuple[Policy, ...]
    dry_run: tuple[Policy, ...]
    missing: tuple[str, ...]
    allowed: Decision
    """The decision when nothing denies (shared: no allocation per connection)."""
    audit: tuple[Policy, ...] = ()
    """Enforced AUDIT policies (rule 14)."""

    @classmethod
    def of(cls, policies: Iterable[Policy], missing: tuple[str, ...]) -> Applicable:
        ordered = sorted(policies, key=_order)
        return cls(
            tuple(p for p in ordered if not p.dry_run and p.action is Action.DENY),
            tuple(p for p in ordered if not p.dry_run and p.action is Action.ALLOW),
            tuple(p for p in ordered if p.dry_run and p.action is not Action.AUDIT),
            missing,
            Decision(True, missing=missing),
            tuple(p for p in ordered if not p.dry_run and p.action is Action.AUDIT),
        )


def decide(applicable: Applicable, conn: Connection, request: Request | None = None) -> Decision:
    """Rules 8 to 15 as :func:`evaluate`, stopping at the first policy that settles the decision."""
    dry = ""
    if applicable.dry_run:
        traces = (PolicyTrace(p.key, p.action, True, matching_rule(p, conn, request)) for p in applicable.dry_run)
        dry_allowed, dry_reason, _ = _verdict(traces)
        dry = "" if dry_allowed else dry_reason
    audited = tuple(p.key for p in applicable.audit if matching_rule(p, conn, request) is not None)
    for policy in applicable.deny:
        if matching_rule(policy, conn, request) is not None:
            return Decision(False, explicitly_denied(policy.key), policy.key, dry, applicable.missing, audited=audited)
    if applicable.allow and not any(matching_rule(p, conn, request) is not None for p in applicable.allow):
        return Decision(False, NOT_ALLOWED, None, dry, applicable.missing, audited=audited)
    if not dry and not audited:
        return applicable.allowed
    return Decision(True, "", None, dry, applicable.missing, audited=audited)


class PolicyIndex:
    """Policies by key, with the indexes of rule 7: by namespace (NAMESPACE scope) and the GLOBAL set."""

    def __init__(self, policies: Iterable[Policy] = ()) -> None:
        self._by_key: dict[str, Policy] = {}
        self._by_namespace: dict[str, dict[str, Policy]] = {}
        self._global: dict[str, Policy] = {}
        self._cache: dict[tuple[str, tuple[str, ...]], Applicable] = {}
        for policy in policies:
            self.put(policy)

    def __len__(self) -> int:
        return len(self._by_key)

    def all(self) -> list[Policy]:
        return [self._by_key[k] for k in sorted(self._by_key)]

    def find(self, key: str) -> Policy | None:
        return self._by_key.get(key)

    def put(self, policy: Policy) -> Policy | None:
        """Add or replace a policy; returns the one it replaced."""
        old = self.remove(policy.key)
        self._cache.clear()
        self._by_key[policy.key] = policy
        if policy.scope is Scope.NAMESPACE:
            self._by_namespace.setdefault(policy.namespace, {})[policy.key] = policy
        elif policy.scope is Scope.GLOBAL:
            self._global[policy.key] = policy
        return old

    def remove(self, key: str) -> Policy | None:
        policy = self._by_key.pop(key, None)
        if policy is None:
            return None
        self._cache.clear()
        if policy.scope is Scope.NAMESPACE:
            scoped = self._by_namespace.get(policy.namespace, {})
            scoped.pop(key, None)
            if not scoped:
                self._by_namespace.pop(policy.namespace, None)
        elif policy.scope is Scope.GLOBAL:
            self._global.pop(key, None)
        return policy

    def replace_all(self, policies: Iterable[Policy]) -> None:
        self._by_key.clear()
        self._by_namespace.clear()
        self._global.clear()
        self._cache.clear()
        for policy in policies:
            self.put(policy)

    def find_for(self, workload: Workload) -> tuple[list[Policy], tuple[str, ...]]:
        """The policies that apply to ``workload`` and the listed keys that are unknown (rule 7)."""
        found: dict[str, Policy] = dict(self._global)
        found.update(self._by_namespace.get(workload.namespace, {}))
        missing: list[str] = []
        for key in workload.authorization_policies:
            policy = self._by_key.get(key)
            if policy is None:
                missing.append(key)
            else:
                found[key] = policy
        return list(found.values()), tuple(missing)

    def applicable(self, workload: Workload) -> Applicable:
        """The policies of ``workload`` sorted for :func:`decide`, cached per (namespace, listed keys)."""
        key = (workload.namespace, workload.authorization_policies)
        found = self._cache.get(key)
        if found is None:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            policies, missing = self.find_for(workload)
            found = self._cache[key] = Applicable.of(policies, missing)
        return found

    def check(self, workload: Workload, conn: Connection) -> Decision:
        """The proxy's decision for ``conn`` to ``workload`` (rules 7 to 10; no trace: see :func:`evaluate`)."""
        return decide(self.applicable(workload), conn)
