"""Model policies ↔ the ``istio.security.Authorization`` resource (spec §4.3).

Theory of operation: :func:`authorization_of` encodes a :class:`~ambit.model.policy.Policy` field for field.
:func:`decode_authorization` is where a peer's resource is judged, like :mod:`ambit.xds.convert` does for
addresses: the first problem raises :class:`XdsConversionError` naming the resource and the field (for example
``prod/allow-web: rules[0].clauses[1].matches[0].source_ips[2].length: /40 is longer than 32``), so that the
session NACKs that one resource and keeps every other policy.

Rules:

1. The resource name is ``namespace/name`` of the body; a resource whose name disagrees is refused.
2. Addresses are 4 or 16 bytes with a prefix length up to 32 or 128; host bits are cleared, as a CIDR means.
3. Ports are 1..65535.
4. ``extensions`` (on the policy or a match) are not understood: a match with an extension is refused, since
   skipping it would change what the policy matches.
5. Nothing but :class:`XdsConversionError` escapes decoding.
6. Only the node proxy's subset crosses this wire (spec §4.3): the actions ALLOW and DENY, the scopes GLOBAL,
   NAMESPACE and WORKLOAD_SELECTOR, L4 match fields. Encoding a policy with AUDIT, a waypoint scope, ``services``
   or an L7 match raises :class:`XdsConversionError` (a control plane bug, never silently dropped fields); decoding
   refuses action 2 and scopes 3 and 4, which the proto does not define, so a hostile or buggy control plane
   cannot hand the node proxy a policy it would judge by the waypoint's rules.
"""

from __future__ import annotations

import ipaddress
from typing import TypeVar

from google.protobuf import any_pb2, empty_pb2
from google.protobuf.message import DecodeError

from ambit.api import authorization_pb2 as pb
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
from ambit.xds.convert import FieldReader
from ambit.xds.errors import XdsConversionError
from ambit.xds.session import AUTHORIZATION_TYPE_URL

__all__ = [
    "AUTHORIZATION_TYPE_URL",
    "PolicyReader",
    "address_to_proto",
    "authorization_of",
    "decode_authorization",
    "pack_authorization",
    "policy_of",
    "string_match_to_proto",
]

T = TypeVar("T")

_STRING_FIELDS = ("namespaces", "not_namespaces", "principals", "not_principals")
_ACCOUNT_FIELDS = ("service_accounts", "not_service_accounts")
_IP_FIELDS = ("source_ips", "not_source_ips", "destination_ips", "not_destination_ips")
_PORT_FIELDS = ("destination_ports", "not_destination_ports")
_NODE_ACTIONS = frozenset({Action.ALLOW, Action.DENY})
_NODE_SCOPES = frozenset({Scope.GLOBAL, Scope.NAMESPACE, Scope.WORKLOAD_SELECTOR})


# Encoding.


def string_match_to_proto(match: StringMatch) -> pb.StringMatch:
    if match.kind is StringMatchKind.EXACT:
        return pb.StringMatch(exact=match.value)
    if match.kind is StringMatchKind.PREFIX:
        return pb.StringMatch(prefix=match.value)
    if match.kind is StringMatchKind.SUFFIX:
        return pb.StringMatch(suffix=match.value)
    return pb.StringMatch(presence=empty_pb2.Empty())


def address_to_proto(cidr: Cidr) -> pb.Address:
    return pb.Address(address=cidr.network_address.packed, length=cidr.prefixlen)


def _match(match: Match) -> pb.Match:
    out = pb.Match()
    for name in _STRING_FIELDS:
        getattr(out, name).extend(string_match_to_proto(m) for m in getattr(match, name))
    for name in _ACCOUNT_FIELDS:
        getattr(out, name).extend(
            pb.ServiceAccountMatch(namespace=m.namespace, serviceAccount=m.service_account)
            for m in getattr(match, name)
        )
    for name in _IP_FIELDS:
        getattr(out, name).extend(address_to_proto(c) for c in getattr(match, name))
    for name in _PORT_FIELDS:
        getattr(out, name).extend(getattr(match, name))
    return out


def _check_node_subset(policy: Policy) -> None:
    """Rule 6 for encoding."""
    if policy.action not in _NODE_ACTIONS:
        raise XdsConversionError(policy.key, "action", f"{policy.action.name} is not sent to the node proxy")
    if policy.scope not in _NODE_SCOPES:
        raise XdsConversionError(policy.key, "scope", f"{policy.scope.name} is not sent to the node proxy")
    if policy.services:
        raise XdsConversionError(policy.key, "services", "service-attached policies are not sent to the node proxy")
    for r, rule in enumerate(policy.rules):
        for c, clause in enumerate(rule.clauses):
            for m, match in enumerate(clause.matches):
                if match.is_l7:
                    raise XdsConversionError(
                        policy.key,
                        f"rules[{r}].clauses[{c}].matches[{m}]",
                        "L7 fields are not sent to the node proxy",
                    )


def authorization_of(policy: Policy) -> pb.Authorization:
    """The node proxy's resource for ``policy``; raises :class:`XdsConversionError` outside its subset (rule 6)."""
    _check_node_subset(policy)
    return pb.Authorization(
        name=policy.name,
        namespace=policy.namespace,
        scope=pb.Scope.Name(policy.scope.value),
        action=pb.Action.Name(policy.action.value),
        rules=[
            pb.Rule(clauses=[pb.Clause(matches=[_match(m) for m in clause.matches]) for clause in rule.clauses])
            for rule in policy.rules
        ],
        dry_run=policy.dry_run,
    )


def pack_authorization(message: pb.Authorization) -> any_pb2.Any:
    """``message`` as a google.protobuf.Any with the Authorization type URL (deterministic bytes)."""
    return any_pb2.Any(type_url=AUTHORIZATION_TYPE_URL, value=message.SerializeToString(deterministic=True))


# Decoding.


class PolicyReader(FieldReader):
    """:class:`~ambit.xds.convert.FieldReader` with the checks of policy fields (also the waypoint policies')."""

    def enum_of(self, field: str, value: int, kind: type[T], allowed: frozenset[T]) -> T:
        try:
            member = kind(value)  # type: ignore[call-arg]
        except ValueError:
            raise self.fail(field, f"unsupported value {value}") from None
        if member not in allowed:
            raise self.fail(field, f"unsupported value {value}")
        return member

    def string_match(self, field: str, message: pb.StringMatch) -> StringMatch:
        kind = message.WhichOneof("match_type")
        if kind is None:
            raise self.fail(field, "no match type set")
        if kind == "presence":
            return StringMatch.presence()
        return StringMatch(StringMatchKind(kind), self.text(f"{field}.{kind}", getattr(message, kind)))

    def cidr(self, field: str, message: pb.Address) -> Cidr:
        raw = message.address
        if len(raw) not in (4, 16):
            raise self.fail(f"{field}.address", f"expected 4 or 16 bytes, got {len(raw)}")
        ip = ipaddress.ip_address(raw)
        if message.length > ip.max_prefixlen:
            raise self.fail(f"{field}.length", f"/{message.length} is longer than {ip.max_prefixlen}")
        return ipaddress.ip_network((ip, message.length), strict=False)

    def port(self, field: str, value: int) -> int:
        if not 1 <= value <= 65535:
            raise self.fail(field, f"out of range 1..65535: {value}")
        return value


def _read_match(read: PolicyReader, field: str, message: pb.Match) -> Match:
    if len(message.extensions):
        raise read.fail(f"{field}.extensions", "match extensions are not supported")
    values: dict[str, tuple[object, ...]] = {}
    for name in _STRING_FIELDS:
        values[name] = tuple(read.string_match(f"{field}.{name}[{i}]", m) for i, m in enumerate(getattr(message, name)))
    for name in _ACCOUNT_FIELDS:
        accounts: list[ServiceAccountMatch] = []
        for i, m in enumerate(getattr(message, name)):
            at = f"{field}.{name}[{i}]"
            accounts.append(
                ServiceAccountMatch(
                    read.text(f"{at}.namespace", m.namespace, required=True),
                    read.text(f"{at}.serviceAccount", m.serviceAccount, required=True),
                )
            )
        values[name] = tuple(accounts)
    for name in _IP_FIELDS:
        values[name] = tuple(read.cidr(f"{field}.{name}[{i}]", m) for i, m in enumerate(getattr(message, name)))
    for name in _PORT_FIELDS:
        values[name] = tuple(read.port(f"{field}.{name}[{i}]", p) for i, p in enumerate(getattr(message, name)))
    return Match(**values)  # type: ignore[arg-type]


def policy_of(message: pb.Authorization, name: str = "") -> Policy:
    """The model value of an Authorization; ``name`` (the xDS resource name), when given, must match its body."""
    read = PolicyReader(name or f"{message.namespace}/{message.name}")
    if len(message.extensions):
        raise read.fail("extensions", "policy extensions are not supported")
    policy = Policy(
        name=read.text("name", message.name, required=True),
        namespace=read.text("namespace", message.namespace),
        scope=read.enum_of("scope", message.scope, Scope, _NODE_SCOPES),
        action=read.enum_of("action", message.action, Action, _NODE_ACTIONS),
        rules=tuple(
            Rule(
                tuple(
                    Clause(
                        tuple(
                            _read_match(read, f"rules[{r}].clauses[{c}].matches[{m}]", match)
                            for m, match in enumerate(clause.matches)
                        )
                    )
                    for c, clause in enumerate(rule.clauses)
                )
            )
            for r, rule in enumerate(message.rules)
        ),
        dry_run=message.dry_run,
    )
    if name and policy.key != name:
        raise read.fail("name", f"resource name does not match its policy ({policy.key!r})")
    return policy


def decode_authorization(name: str, body: any_pb2.Any) -> Policy:
    """Unpack and convert one xDS resource body of type :data:`AUTHORIZATION_TYPE_URL`."""
    if body.type_url != AUTHORIZATION_TYPE_URL:
        raise XdsConversionError(name, "resource.type_url", f"expected {AUTHORIZATION_TYPE_URL}, got {body.type_url!r}")
    message = pb.Authorization()
    try:
        message.ParseFromString(body.value)
    except (DecodeError, ValueError, RecursionError) as exc:
        raise XdsConversionError(name, "resource.value", f"not a valid Authorization message: {exc}") from None
    try:
        return policy_of(message, name)
    except (ValueError, TypeError, OverflowError) as exc:  # a model invariant we did not anticipate
        raise XdsConversionError(name, "authorization", str(exc)) from None
