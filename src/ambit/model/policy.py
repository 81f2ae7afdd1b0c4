"""L4 authorization policy as the node proxy receives it (spec §4.3 ``istio.security.Authorization``).

Theory of operation: a :class:`Policy` is the model form of one ``Authorization`` resource; the control plane makes
them from AuthorizationPolicy and PeerAuthentication objects (spec §7.2, §7.4) and the node proxy evaluates them
(:mod:`ambit.rbac`). The shape follows the proto one to one so that nothing is lost in either direction:
policy → rules (ORed) → clauses (ANDed) → matches (ORed) → fields of a match (ANDed) → values of a field (ORed).

Invariants:

- Every collection is a tuple, so policies are hashable and compare by value.
- A policy's key is ``namespace/name``, the string workloads list in ``authorization_policies``.
- :class:`Cidr` is always a network (host bits zero), /32 or /128 for a single address.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass, field

__all__ = [
    "Action",
    "Cidr",
    "Clause",
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


class Action(enum.Enum):
    ALLOW = 0
    DENY = 1


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

    is_empty: bool = field(init=False, compare=False, repr=False)
    """No field populated: such a match never matches (ztunnel skips it)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_empty", self._no_field())

    def _no_field(self) -> bool:
        return not (
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

    @property
    def key(self) -> str:
        """``namespace/name``: the resource name on the wire and the entry in ``Workload.authorization_policies``."""
        return f"{self.namespace}/{self.name}"
