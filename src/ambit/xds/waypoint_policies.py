"""Model waypoint policies ↔ ``ambit.waypoint.v1.WaypointPolicy`` (``proto/waypoint.proto`` field 3 of
WaypointConfig).

Theory of operation: :func:`waypoint_policy_to_proto` encodes an L7 :class:`~ambit.model.policy.Policy` field for
field; :func:`waypoint_policy_from_proto` judges one received as part of a WaypointConfig, with the same rigour as
the routes (:mod:`ambit.xds.routes`) and the node proxy's policies (:mod:`ambit.xds.authorization`): the first
problem raises :class:`XdsConversionError` naming the field, e.g.
``shop/waypoint: policies[1].rules[0].clauses[0].matches[0].methods[0]: not an HTTP method token``.

Rules:

1. Scope is WAYPOINT or SERVICE, action ALLOW, DENY, AUDIT or CUSTOM; the unspecified value and values this build does
   not know are refused (a policy read the wrong way changes who gets in). A SERVICE policy lists at least one
   service, a WAYPOINT policy none; a service is ``namespace/hostname``.
2. Name and namespace are required; every string is printable.
3. Methods are HTTP tokens. Header keys are one header-name token, claim keys one or more non-empty names. Host
   matches and header names are lower-cased on reading (their comparison is case-insensitive).
4. Addresses and ports as the node proxy's policies (:class:`~ambit.xds.authorization.PolicyReader`).
5. A path template must be one (``{*}`` or ``{**}``) and valid (:func:`ambit.model.path_templates.template_problem`).
6. A CUSTOM policy carries its external authorizer (:mod:`ambit.xds.ext_authz`), any other none.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ambit.api import authorization_pb2 as apb
from ambit.api import waypoint_pb2 as pb
from ambit.model.field_names import is_token
from ambit.model.path_templates import is_path_template, template_problem
from ambit.model.policy import (
    Action,
    Cidr,
    Clause,
    KeyedMatch,
    Match,
    Policy,
    Rule,
    Scope,
    ServiceAccountMatch,
    StringMatch,
)
from ambit.xds.authorization import PolicyReader, address_to_proto, string_match_to_proto
from ambit.xds.ext_authz import ext_authz_from_proto, ext_authz_to_proto

__all__ = ["waypoint_policy_from_proto", "waypoint_policy_to_proto"]

_SCOPES = {Scope.WAYPOINT: pb.POLICY_SCOPE_WAYPOINT, Scope.SERVICE: pb.POLICY_SCOPE_SERVICE}
_ACTIONS = {
    Action.ALLOW: pb.POLICY_ACTION_ALLOW,
    Action.DENY: pb.POLICY_ACTION_DENY,
    Action.AUDIT: pb.POLICY_ACTION_AUDIT,
    Action.CUSTOM: pb.POLICY_ACTION_CUSTOM,
}
_SCOPE_OF = {v: k for k, v in _SCOPES.items()}
_ACTION_OF = {v: k for k, v in _ACTIONS.items()}
_STRINGS = (
    "namespaces",
    "not_namespaces",
    "principals",
    "not_principals",
    "hosts",
    "not_hosts",
    "paths",
    "not_paths",
    "request_principals",
    "not_request_principals",
    "audiences",
    "not_audiences",
    "presenters",
    "not_presenters",
    "sni",
    "not_sni",
)
_ACCOUNTS = ("service_accounts", "not_service_accounts")
_ADDRESSES = ("source_ips", "not_source_ips", "destination_ips", "not_destination_ips", "remote_ips", "not_remote_ips")
_PORTS = ("destination_ports", "not_destination_ports")
_METHODS = ("methods", "not_methods")
_KEYED = ("request_headers", "request_claims")
_TEMPLATES = ("path_templates", "not_path_templates")


# Encoding.


def _keyed(match: KeyedMatch) -> pb.KeyedMatch:
    return pb.KeyedMatch(
        key=list(match.key),
        values=[string_match_to_proto(m) for m in match.values],
        not_values=[string_match_to_proto(m) for m in match.not_values],
    )


def _match(match: Match) -> pb.PolicyMatch:
    out = pb.PolicyMatch()
    for name in _STRINGS:
        getattr(out, name).extend(string_match_to_proto(m) for m in getattr(match, name))
    for name in _ACCOUNTS:
        getattr(out, name).extend(
            apb.ServiceAccountMatch(namespace=m.namespace, serviceAccount=m.service_account)
            for m in getattr(match, name)
        )
    for name in _ADDRESSES:
        getattr(out, name).extend(address_to_proto(c) for c in getattr(match, name))
    for name in (*_PORTS, *_METHODS, *_TEMPLATES):
        getattr(out, name).extend(getattr(match, name))
    for name in _KEYED:
        getattr(out, name).extend(_keyed(k) for k in getattr(match, name))
    return out


def waypoint_policy_to_proto(policy: Policy) -> pb.WaypointPolicy:
    """``policy`` (scope WAYPOINT or SERVICE) as the wire message; a node proxy scope is a bug (ValueError)."""
    if policy.scope not in _SCOPES:
        raise ValueError(f"{policy.key}: scope {policy.scope.name} is not a waypoint scope")
    return pb.WaypointPolicy(
        name=policy.name,
        namespace=policy.namespace,
        scope=_SCOPES[policy.scope],
        action=_ACTIONS[policy.action],
        rules=[
            pb.PolicyRule(clauses=[pb.PolicyClause(matches=[_match(m) for m in c.matches]) for c in rule.clauses])
            for rule in policy.rules
        ],
        dry_run=policy.dry_run,
        services=list(policy.services),
        ext_authz=ext_authz_to_proto(policy.ext_authz) if policy.ext_authz is not None else None,
    )


# Decoding.


def _strings(
    read: PolicyReader, field: str, items: Iterable[apb.StringMatch], *, lower: bool = False
) -> tuple[StringMatch, ...]:
    out = []
    for i, m in enumerate(items):
        match = read.string_match(f"{field}[{i}]", m)
        out.append(StringMatch(match.kind, match.value.lower()) if lower else match)
    return tuple(out)


def _keyed_of(read: PolicyReader, field: str, message: pb.KeyedMatch, *, header: bool) -> KeyedMatch:
    key: Sequence[str] = list(message.key)
    if header:
        if len(key) != 1 or not is_token(key[0]):
            raise read.fail(f"{field}.key", f"expected one header name, got {list(key)!r}")
        key = [key[0].lower()]
    else:
        if not key:
            raise read.fail(f"{field}.key", "a claim path is required")
        for i, part in enumerate(key):
            read.text(f"{field}.key[{i}]", part, required=True)
    return KeyedMatch(
        tuple(key),
        _strings(read, f"{field}.values", message.values),
        _strings(read, f"{field}.not_values", message.not_values),
    )


def _match_of(read: PolicyReader, field: str, message: pb.PolicyMatch) -> Match:
    values: dict[str, object] = {}
    for name in _STRINGS:
        values[name] = _strings(read, f"{field}.{name}", getattr(message, name), lower=name in ("hosts", "not_hosts"))
    for name in _ACCOUNTS:
        accounts = []
        for i, m in enumerate(getattr(message, name)):
            at = f"{field}.{name}[{i}]"
            accounts.append(
                ServiceAccountMatch(
                    read.text(f"{at}.namespace", m.namespace, required=True),
                    read.text(f"{at}.serviceAccount", m.serviceAccount, required=True),
                )
            )
        values[name] = tuple(accounts)
    for name in _ADDRESSES:
        cidrs: tuple[Cidr, ...] = tuple(
            read.cidr(f"{field}.{name}[{i}]", m) for i, m in enumerate(getattr(message, name))
        )
        values[name] = cidrs
    for name in _PORTS:
        values[name] = tuple(read.port(f"{field}.{name}[{i}]", p) for i, p in enumerate(getattr(message, name)))
    for name in _METHODS:
        methods = []
        for i, method in enumerate(getattr(message, name)):
            if not is_token(method):
                raise read.fail(f"{field}.{name}[{i}]", f"not an HTTP method token: {method!r}")
            methods.append(method)
        values[name] = tuple(methods)
    for name in _TEMPLATES:
        templates = []
        for i, template in enumerate(getattr(message, name)):
            problem = template_problem(template) if is_path_template(template) else "no {*} or {**}"
            if problem is not None:
                raise read.fail(f"{field}.{name}[{i}]", f"not a valid path template ({problem}): {template[:64]!r}")
            templates.append(template)
        values[name] = tuple(templates)
    for name in _KEYED:
        values[name] = tuple(
            _keyed_of(read, f"{field}.{name}[{i}]", k, header=name == "request_headers")
            for i, k in enumerate(getattr(message, name))
        )
    return Match(**values)  # type: ignore[arg-type]


def waypoint_policy_from_proto(read: PolicyReader, field: str, message: pb.WaypointPolicy) -> Policy:
    """Judge and convert one policy at ``field`` of a WaypointConfig (rules 1-4)."""
    scope = _SCOPE_OF.get(message.scope)
    if scope is None:
        raise read.fail(f"{field}.scope", f"unsupported value {message.scope}")
    action = _ACTION_OF.get(message.action)
    if action is None:
        raise read.fail(f"{field}.action", f"unsupported value {message.action}")
    services = tuple(read.text(f"{field}.services[{i}]", s, required=True) for i, s in enumerate(message.services))
    for i, service in enumerate(services):
        namespace, slash, host = service.partition("/")
        if not (namespace and slash and host):
            raise read.fail(f"{field}.services[{i}]", f"expected namespace/hostname, got {service!r}")
    if scope is Scope.SERVICE and not services:
        raise read.fail(f"{field}.services", "a SERVICE policy names at least one service")
    if scope is Scope.WAYPOINT and services:
        raise read.fail(f"{field}.services", "a WAYPOINT policy names no service")
    has_ext_authz = message.HasField("ext_authz")
    if (action is Action.CUSTOM) != has_ext_authz:
        raise read.fail(f"{field}.ext_authz", "a CUSTOM policy, and only a CUSTOM policy, names an authorizer")
    ext_authz = ext_authz_from_proto(read, f"{field}.ext_authz", message.ext_authz) if has_ext_authz else None
    return Policy(
        name=read.text(f"{field}.name", message.name, required=True),
        namespace=read.text(f"{field}.namespace", message.namespace, required=True),
        scope=scope,
        action=action,
        rules=tuple(
            Rule(
                tuple(
                    Clause(
                        tuple(
                            _match_of(read, f"{field}.rules[{r}].clauses[{c}].matches[{m}]", match)
                            for m, match in enumerate(clause.matches)
                        )
                    )
                    for c, clause in enumerate(rule.clauses)
                )
            )
            for r, rule in enumerate(message.rules)
        ),
        dry_run=message.dry_run,
        services=services,
        ext_authz=ext_authz,
    )
