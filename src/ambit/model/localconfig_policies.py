"""A local config file's L4 authorization policies (spec §4.3): read from and written to the file's form.

Theory of operation: :func:`read_policy` reads one entry of the file's ``policies`` list, :func:`policy_to_dict`
writes one back (also what ``/config_dump`` can show), by :mod:`ambit.model.localconfig` rule 8: ``name``,
``namespace`` (required), ``scope``, ``action``, ``dryRun`` and ``rules`` → ``clauses`` → ``matches``; a match names
only its populated fields. String matches are Istio's pattern form (``*``, ``*x``, ``x*``, ``x``) or, for a value
that form cannot say (an exact ``a*``), a mapping with one of ``exact``, ``prefix``, ``suffix``, ``presence``.
Service accounts are ``namespace/name``; IPs are CIDRs with host bits clear; ports are 1..65535. A node proxy's
policy is only ALLOW or DENY, of the global, namespace or workload-selector scope.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from ambit.model.errors import LocalConfigError
from ambit.model.localconfig_fields import (
    choice,
    describe,
    read_bool,
    read_each,
    read_field,
    read_mapping,
    read_name,
    read_string,
)
from ambit.model.policy import (
    Action,
    Cidr,
    Clause,
    Match,
    Policy,
    Rule,
    Scope,
    ServiceAccountMatch,
    StringMatch,
    StringMatchKind,
)

__all__ = ["match_to_dict", "policy_to_dict", "read_policy"]

_POLICY_KEYS = ("name", "namespace", "scope", "action", "dryRun", "rules")
_STRING_MATCH_FIELDS = {
    "namespaces": "namespaces",
    "notNamespaces": "not_namespaces",
    "principals": "principals",
    "notPrincipals": "not_principals",
}
_ACCOUNT_FIELDS = {"serviceAccounts": "service_accounts", "notServiceAccounts": "not_service_accounts"}
_CIDR_FIELDS = {
    "sourceIps": "source_ips",
    "notSourceIps": "not_source_ips",
    "destinationIps": "destination_ips",
    "notDestinationIps": "not_destination_ips",
}
_PORT_FIELDS = {"destinationPorts": "destination_ports", "notDestinationPorts": "not_destination_ports"}
_MATCH_KEYS = (*_STRING_MATCH_FIELDS, *_ACCOUNT_FIELDS, *_CIDR_FIELDS, *_PORT_FIELDS)


def _string_match(value: object, path: str) -> StringMatch:
    if isinstance(value, str):
        return StringMatch.of_pattern(read_string(value, path))
    item = read_mapping(value, path, tuple(kind.value for kind in StringMatchKind))
    if len(item) != 1:
        raise LocalConfigError(f"{path}: expected a pattern string or exactly one of exact, prefix, suffix, presence")
    [(key, inner)] = item.items()
    kind = StringMatchKind(key)
    if kind is StringMatchKind.PRESENCE:
        if inner not in (None, {}, True):
            raise LocalConfigError(f"{path}.presence: expected {{}} or true, got {describe(inner)}")
        return StringMatch.presence()
    return StringMatch(kind, read_string(inner, f"{path}.{key}"))


def _account(value: object, path: str) -> ServiceAccountMatch:
    text = read_string(value, path)
    namespace, slash, account = text.partition("/")
    if not (namespace and slash and account):
        raise LocalConfigError(f"{path}: {text!r} is not 'namespace/serviceaccount'")
    return ServiceAccountMatch(namespace, account)


def _cidr(value: object, path: str) -> Cidr:
    text = read_string(value, path)
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        raise LocalConfigError(f"{path}: not a CIDR with host bits clear: {exc}") from None


def _policy_port(value: object, path: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        raise LocalConfigError(f"{path}: expected a port number 1..65535, got {describe(value)}")
    return value


def _match(value: object, path: str) -> Match:
    item = read_mapping(value, path, _MATCH_KEYS)
    fields: dict[str, Any] = {}
    for key, name in _STRING_MATCH_FIELDS.items():
        fields[name] = read_each(item, key, path, _string_match)
    for key, name in _ACCOUNT_FIELDS.items():
        fields[name] = read_each(item, key, path, _account)
    for key, name in _CIDR_FIELDS.items():
        fields[name] = read_each(item, key, path, _cidr)
    for key, name in _PORT_FIELDS.items():
        fields[name] = read_each(item, key, path, _policy_port)
    return Match(**fields)


def _clause(value: object, path: str) -> Clause:
    return Clause(read_each(read_mapping(value, path, ("matches",)), "matches", path, _match))


def _rule(value: object, path: str) -> Rule:
    return Rule(read_each(read_mapping(value, path, ("clauses",)), "clauses", path, _clause))


_NODE_SCOPES = (Scope.GLOBAL, Scope.NAMESPACE, Scope.WORKLOAD_SELECTOR)
_NODE_ACTIONS = (Action.ALLOW, Action.DENY)
"""What a node proxy's policy can be: AUDIT and the waypoint scopes exist only at L7 (ambit.model.policy)."""


def read_policy(value: object, path: str) -> Policy:
    item = read_mapping(value, path, _POLICY_KEYS)
    return Policy(
        name=read_field(item, "name", path, read_name),
        namespace=read_field(item, "namespace", path, read_name),
        scope=read_field(item, "scope", path, choice({s.name: s for s in _NODE_SCOPES}), Scope.GLOBAL),
        action=read_field(item, "action", path, choice({a.name: a for a in _NODE_ACTIONS}), Action.ALLOW),
        rules=read_each(item, "rules", path, _rule),
        dry_run=read_field(item, "dryRun", path, read_bool, False),
    )


def _string_match_form(match: StringMatch) -> str | dict[str, Any]:
    pattern = str(match)
    if StringMatch.of_pattern(pattern) == match:
        return pattern
    return {match.kind.value: {} if match.kind is StringMatchKind.PRESENCE else match.value}


def match_to_dict(match: Match) -> dict[str, Any]:
    """The file form of one match: only its populated fields (localconfig rule 8)."""
    out: dict[str, Any] = {}
    for key, name in _STRING_MATCH_FIELDS.items():
        if values := getattr(match, name):
            out[key] = [_string_match_form(v) for v in values]
    for key, name in _ACCOUNT_FIELDS.items():
        if values := getattr(match, name):
            out[key] = [str(v) for v in values]
    for key, name in _CIDR_FIELDS.items():
        if values := getattr(match, name):
            out[key] = [str(v) for v in values]
    for key, name in _PORT_FIELDS.items():
        if values := getattr(match, name):
            out[key] = list(values)
    return out


def policy_to_dict(policy: Policy) -> dict[str, Any]:
    """The file form of one policy (also what ``/config_dump`` can show)."""
    return {
        "name": policy.name,
        "namespace": policy.namespace,
        "scope": policy.scope.name,
        "action": policy.action.name,
        "dryRun": policy.dry_run,
        "rules": [
            {"clauses": [{"matches": [match_to_dict(m) for m in clause.matches]} for clause in rule.clauses]}
            for rule in policy.rules
        ],
    }
