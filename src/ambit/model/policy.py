"""Authorization policy: L4 as the node proxy receives it (spec §4.3 ``istio.security.Authorization``), and the L7
attributes only a waypoint or gateway can enforce (spec §7.1, §7.5).

Theory of operation: a :class:`Policy` is the model form of one ``Authorization`` resource; the control plane makes
them from AuthorizationPolicy and PeerAuthentication objects (spec §7.2, §7.4) and the node proxy evaluates them
(:mod:`ambit.rbac`). The shape follows the proto one to one so that nothing is lost in either direction:
policy → rules (ORed) → clauses (ANDed) → matches (ORed) → fields of a match (ANDed) → values of a field (ORed).

Invariants:

- Every collection is a tuple, so policies are hashable and compare by value.
- A policy's key is ``namespace/name``, the string workloads list in ``authorization_policies``.
- :class:`Cidr` is always a network (host bits zero), /32 or /128 for a single address.
- The L7 fields of :class:`Match` (below its L4 ones) are never sent to a node proxy: the control plane drops them
  for the node proxy as istiod does (spec §7.2) and the ztunnel codec refuses a match that has one. Only the
  waypoint's configuration carries them. :attr:`Match.is_l7` says whether a match has any.
- :class:`Action.AUDIT` exists only at L7 (it never changes a decision; the waypoint logs it), and so does
  :class:`Action.CUSTOM` (its rules choose the requests an external authorizer decides).
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass, field

from ambit.model.extauthz import ExtAuthzProvider

__all__ = [
    "Action",
    "Cidr",
    "Clause",
    "KeyedMatch",
    "Match",
    "Policy",
    "Rule",
    "Scope",
    "ServiceAccountMatch",
    "StringMatch",
    "StringMatchKind",
]

Cidr = ipaddress.IPv4Network | ipaddress.IPv6Network


class Scope(enum.Enum):
    """Which destinations a policy applies to (spec §7.3 lookup)."""

    GLOBAL = 0
    """Every workload in the mesh (an AuthorizationPolicy without selector in the root namespace)."""
    NAMESPACE = 1
    """Every workload of the policy's namespace."""
    WORKLOAD_SELECTOR = 2
    """The workloads that list the policy's key in ``authorization_policies``."""
    WAYPOINT = 3
    """Waypoint or gateway only: every request it handles (``targetRefs`` to its Gateway, or to the GatewayClass
    from the root namespace; spec §7.5)."""
    SERVICE = 4
    """Waypoint or gateway only: requests to the Services in :attr:`Policy.services` (``targetRefs`` to a Service or
    a ServiceEntry)."""


class Action(enum.Enum):
    ALLOW = 0
    DENY = 1
    AUDIT = 2
    """Waypoint only: marks matching requests for the access log, never changes the decision (spec §7.1)."""
    CUSTOM = 3
    """Waypoint only: requests matching its rules are checked with the external authorizer in
    :attr:`Policy.ext_authz` before any DENY or ALLOW policy is looked at (:mod:`ambit.waypoint.ext_authz`)."""


class StringMatchKind(enum.Enum):
    EXACT = "exact"
    PREFIX = "prefix"
    SUFFIX = "suffix"
    PRESENCE = "presence"
    """Any non-empty value (the ``*`` form)."""


@dataclass(frozen=True, slots=True)
class StringMatch:
    kind: StringMatchKind
    value: str = ""
    """Empty for PRESENCE."""

    @classmethod
    def exact(cls, value: str) -> StringMatch:
        return cls(StringMatchKind.EXACT, value)

    @classmethod
    def prefix(cls, value: str) -> StringMatch:
        return cls(StringMatchKind.PREFIX, value)

    @classmethod
    def suffix(cls, value: str) -> StringMatch:
        return cls(StringMatchKind.SUFFIX, value)

    @classmethod
    def presence(cls) -> StringMatch:
        return cls(StringMatchKind.PRESENCE)

    @classmethod
    def of_pattern(cls, pattern: str) -> StringMatch:
        """Istio's string forms (spec §7.2): ``*`` presence, ``*x`` suffix, ``x*`` prefix, anything else exact."""
        if pattern == "*":
            return cls.presence()
        if pattern.startswith("*"):
            return cls.suffix(pattern[1:])
        if pattern.endswith("*"):
            return cls.prefix(pattern[:-1])
        return cls.exact(pattern)

    def matches(self, value: str) -> bool:
        if self.kind is StringMatchKind.EXACT:
            return value == self.value
        if self.kind is StringMatchKind.PREFIX:
            return value.startswith(self.value)
        if self.kind is StringMatchKind.SUFFIX:
            return value.endswith(self.value)
        return value != ""

    def __str__(self) -> str:
        if self.kind is StringMatchKind.EXACT:
            return self.value
        if self.kind is StringMatchKind.PREFIX:
            return f"{self.value}*"
        if self.kind is StringMatchKind.SUFFIX:
            return f"*{self.value}"
        return "*"


@dataclass(frozen=True, slots=True)
class ServiceAccountMatch:
    namespace: str
    service_account: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.service_account}"


@dataclass(frozen=True, slots=True)
class KeyedMatch:
    """A ``when`` condition on a keyed attribute: ``request.headers[name]`` or ``request.auth.claims[a][b]``.

    Holds when, if ``values`` are given, the attribute is present and some entry matches it, and no ``not_values``
    entry matches it (an absent attribute matches none: a ``not_values``-only condition holds without it, as
    Envoy's negated header and metadata matchers do). A claim that is a list holds if any of its string elements
    would; a claim that is not a string (number, object) matches nothing. A header received more than once is
    matched as its values joined by ``,``.
    """

    key: tuple[str, ...]
    """A header name (one element, lower-case) or a claim path (one element per level, e.g. ``("groups",)``)."""
    values: tuple[StringMatch, ...] = ()
    not_values: tuple[StringMatch, ...] = ()


@dataclass(frozen=True, slots=True)
class Match:
    """One alternative of a clause: every populated field must match (spec §4.3)."""

    namespaces: tuple[StringMatch, ...] = ()
    not_namespaces: tuple[StringMatch, ...] = ()
    service_accounts: tuple[ServiceAccountMatch, ...] = ()
    not_service_accounts: tuple[ServiceAccountMatch, ...] = ()
    principals: tuple[StringMatch, ...] = ()
    not_principals: tuple[StringMatch, ...] = ()
    source_ips: tuple[Cidr, ...] = ()
    not_source_ips: tuple[Cidr, ...] = ()
    destination_ips: tuple[Cidr, ...] = ()
    not_destination_ips: tuple[Cidr, ...] = ()
    destination_ports: tuple[int, ...] = ()
    not_destination_ports: tuple[int, ...] = ()
    # L7: the waypoint and the gateway only (module invariants).
    hosts: tuple[StringMatch, ...] = ()
    """Against the request's authority, case-insensitively (the matches hold lower-case values)."""
    not_hosts: tuple[StringMatch, ...] = ()
    methods: tuple[str, ...] = ()
    """Exact, case-sensitive (HTTP methods are)."""
    not_methods: tuple[str, ...] = ()
    paths: tuple[StringMatch, ...] = ()
    """Against the normalized path without query (spec §7.1)."""
    not_paths: tuple[StringMatch, ...] = ()
    path_templates: tuple[str, ...] = ()
    """``paths`` entries with ``{*}``/``{**}`` (:mod:`ambit.model.path_templates`, valid): a path matching one of
    them, or one of ``paths``, matches."""
    not_path_templates: tuple[str, ...] = ()
    request_principals: tuple[StringMatch, ...] = ()
    """Against ``<iss>/<sub>`` of a validated JWT (``request.auth.principal`` too); none without a token."""
    not_request_principals: tuple[StringMatch, ...] = ()
    remote_ips: tuple[Cidr, ...] = ()
    """Against the original client (the first ``X-Forwarded-For`` entry, else the peer address)."""
    not_remote_ips: tuple[Cidr, ...] = ()
    request_headers: tuple[KeyedMatch, ...] = ()
    request_claims: tuple[KeyedMatch, ...] = ()
    audiences: tuple[StringMatch, ...] = ()
    """``request.auth.audiences``: against each audience of the validated JWT."""
    not_audiences: tuple[StringMatch, ...] = ()
    presenters: tuple[StringMatch, ...] = ()
    """``request.auth.presenter``: the JWT's ``azp``."""
    not_presenters: tuple[StringMatch, ...] = ()
    sni: tuple[StringMatch, ...] = ()
    """``connection.sni``: the server name the downstream TLS handshake asked for."""
    not_sni: tuple[StringMatch, ...] = ()

    is_empty: bool = field(init=False, compare=False, repr=False)
    """No field populated: such a match never matches (ztunnel skips it)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_empty", not (self._has_l4() or self.is_l7))

    @property
    def is_l7(self) -> bool:
        """Some L7 field is populated: only a waypoint or gateway can evaluate this match."""
        return bool(
            self.hosts
            or self.not_hosts
            or self.methods
            or self.not_methods
            or self.paths
            or self.not_paths
            or self.path_templates
            or self.not_path_templates
            or self.request_principals
            or self.not_request_principals
            or self.remote_ips
            or self.not_remote_ips
            or self.request_headers
            or self.request_claims
            or self.audiences
            or self.not_audiences
            or self.presenters
            or self.not_presenters
            or self.sni
            or self.not_sni
        )

    def _has_l4(self) -> bool:
        return bool(
            self.namespaces
            or self.not_namespaces
            or self.service_accounts
            or self.not_service_accounts
            or self.principals
            or self.not_principals
            or self.source_ips
            or self.not_source_ips
            or self.destination_ips
            or self.not_destination_ips
            or self.destination_ports
            or self.not_destination_ports
        )


@dataclass(frozen=True, slots=True)
class Clause:
    """Matches that are ORed; a clause with no (non-empty) match never matches."""

    matches: tuple[Match, ...] = ()


@dataclass(frozen=True, slots=True)
class Rule:
    """Clauses that are ANDed; a rule with no clause matches every connection."""

    clauses: tuple[Clause, ...] = ()

    is_l7: bool = field(init=False, compare=False, repr=False)
    """Some match of the rule has an L7 field (an ALLOW rule that then never matches without a request)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_l7", any(m.is_l7 for c in self.clauses for m in c.matches))


@dataclass(frozen=True, slots=True)
class Policy:
    """One ``istio.security.Authorization`` resource."""

    name: str
    namespace: str
    scope: Scope
    action: Action
    rules: tuple[Rule, ...] = ()
    """ORed; a policy with no rule never matches."""
    dry_run: bool = False
    services: tuple[str, ...] = ()
    """Scope SERVICE: the keys (``namespace/hostname``, as :attr:`~ambit.model.routes.RouteTable.service_key`) of
    the Services and ServiceEntries the policy targets."""
    ext_authz: ExtAuthzProvider | None = None
    """Action CUSTOM: the external authorizer its provider names (always set for CUSTOM, never otherwise)."""

    @property
    def key(self) -> str:
        """``namespace/name``: the resource name on the wire and the entry in ``Workload.authorization_policies``."""
        return f"{self.namespace}/{self.name}"
