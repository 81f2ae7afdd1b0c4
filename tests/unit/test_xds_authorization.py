"""Model ↔ proto Authorization conversion (spec §4.3): round trips, clear refusals, fuzzed bytes."""

from __future__ import annotations

import ipaddress

import pytest
from google.protobuf import any_pb2, empty_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.api import authorization_pb2 as pb
from ambit.api import workload_pb2
from ambit.model.policy import (
    Action,
    Clause,
    Match,
    Policy,
    Rule,
    Scope,
    ServiceAccountMatch,
    StringMatch,
    StringMatchKind,
)
from ambit.xds.authorization import (
    AUTHORIZATION_TYPE_URL,
    authorization_of,
    decode_authorization,
    pack_authorization,
    policy_of,
)
from ambit.xds.errors import XdsConversionError

EVERY_FIELD = Policy(
    name="allow-web",
    namespace="shop",
    scope=Scope.WORKLOAD_SELECTOR,
    action=Action.DENY,
    dry_run=True,
    rules=(
        Rule(
            (
                Clause(
                    (
                        Match(
                            namespaces=(StringMatch.exact("shop"), StringMatch.prefix("team-")),
                            not_namespaces=(StringMatch.suffix("-dev"),),
                            service_accounts=(ServiceAccountMatch("shop", "web"),),
                            not_service_accounts=(ServiceAccountMatch("shop", "batch"),),
                            principals=(StringMatch.exact("cluster.local/ns/shop/sa/web"),),
                            not_principals=(StringMatch.presence(),),
                            source_ips=(ipaddress.ip_network("198.18.0.0/16"),),
                            not_source_ips=(ipaddress.ip_network("198.18.1.1/32"),),
                            destination_ips=(ipaddress.ip_network("fd00::/64"),),
                            not_destination_ips=(ipaddress.ip_network("fd00::1/128"),),
                            destination_ports=(8080, 9090),
                            not_destination_ports=(22,),
                        ),
                        Match(destination_ports=(80,)),
                    )
                ),
                Clause(),
            )
        ),
        Rule(),
    ),
)


def _round_trip(policy: Policy) -> Policy:
    return decode_authorization(policy.key, pack_authorization(authorization_of(policy)))


def test_a_policy_with_every_field_survives_a_round_trip() -> None:
    assert _round_trip(EVERY_FIELD) == EVERY_FIELD


def test_presence_is_an_empty_message_on_the_wire() -> None:
    message = authorization_of(EVERY_FIELD)
    assert message.rules[0].clauses[0].matches[0].not_principals[0].WhichOneof("match_type") == "presence"


@pytest.mark.parametrize(
    ("pattern", "kind", "value"),
    [
        ("*", StringMatchKind.PRESENCE, ""),
        ("*.example.com", StringMatchKind.SUFFIX, ".example.com"),
        ("team-*", StringMatchKind.PREFIX, "team-"),
        ("shop", StringMatchKind.EXACT, "shop"),
    ],
)
def test_istio_string_patterns_become_string_matches(pattern: str, kind: StringMatchKind, value: str) -> None:
    match = StringMatch.of_pattern(pattern)
    assert (match.kind, match.value) == (kind, value)
    assert str(match) == pattern


def test_a_cidr_with_host_bits_is_read_as_its_network() -> None:
    message = pb.Authorization(
        name="p",
        namespace="ns",
        rules=[
            pb.Rule(
                clauses=[pb.Clause(matches=[pb.Match(source_ips=[pb.Address(address=bytes([10, 1, 2, 3]), length=8)])])]
            )
        ],
    )
    policy = policy_of(message)
    assert policy.rules[0].clauses[0].matches[0].source_ips == (ipaddress.ip_network("10.0.0.0/8"),)


def _policy_message(**match: object) -> pb.Authorization:
    return pb.Authorization(name="p", namespace="ns", rules=[pb.Rule(clauses=[pb.Clause(matches=[pb.Match(**match)])])])


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (pb.Authorization(namespace="ns"), r"ns/: name: required"),
        (pb.Authorization(name="p", namespace="ns", scope=7), r"ns/p: scope: unsupported value 7"),
        (pb.Authorization(name="p", namespace="ns", action=5), r"ns/p: action: unsupported value 5"),
        (pb.Authorization(name="p", namespace="ns", action=2), r"ns/p: action: unsupported value 2"),
        (pb.Authorization(name="p", namespace="ns", scope=3), r"ns/p: scope: unsupported value 3"),
        (pb.Authorization(name="p", namespace="ns", scope=4), r"ns/p: scope: unsupported value 4"),
        (
            _policy_message(source_ips=[pb.Address(address=b"\x01\x02\x03", length=8)]),
            r"rules\[0\]\.clauses\[0\]\.matches\[0\]\.source_ips\[0\]\.address: expected 4 or 16 bytes, got 3",
        ),
        (
            _policy_message(destination_ips=[pb.Address(address=bytes(4), length=40)]),
            r"destination_ips\[0\]\.length: /40 is longer than 32",
        ),
        (_policy_message(destination_ports=[0]), r"destination_ports\[0\]: out of range 1\.\.65535: 0"),
        (_policy_message(not_destination_ports=[70000]), r"not_destination_ports\[0\]: out of range"),
        (_policy_message(principals=[pb.StringMatch()]), r"principals\[0\]: no match type set"),
        (_policy_message(namespaces=[pb.StringMatch(exact="a\x00b")]), r"namespaces\[0\]\.exact: has unprintable"),
        (
            _policy_message(service_accounts=[pb.ServiceAccountMatch(namespace="ns")]),
            r"service_accounts\[0\]\.serviceAccount: required",
        ),
        (
            _policy_message(extensions=[workload_pb2.Extension(name="x")]),
            r"matches\[0\]\.extensions: match extensions are not supported",
        ),
        (
            pb.Authorization(name="p", namespace="ns", extensions=[workload_pb2.Extension(name="x")]),
            r"ns/p: extensions: policy extensions are not supported",
        ),
    ],
)
def test_bad_policies_are_refused_naming_the_resource_and_field(message: pb.Authorization, expected: str) -> None:
    with pytest.raises(XdsConversionError, match=expected):
        decode_authorization(f"{message.namespace}/{message.name}", pack_authorization(message))


def test_a_resource_named_differently_from_its_body_is_refused() -> None:
    with pytest.raises(XdsConversionError, match=r"other/p: name: resource name does not match its policy"):
        decode_authorization("other/p", pack_authorization(pb.Authorization(name="p", namespace="ns")))


def test_a_body_of_another_type_is_refused() -> None:
    with pytest.raises(XdsConversionError, match=r"resource\.type_url: expected"):
        decode_authorization("ns/p", any_pb2.Any(type_url="type.googleapis.com/istio.workload.Address"))


def test_bytes_that_are_not_an_authorization_are_refused() -> None:
    with pytest.raises(XdsConversionError, match=r"not a valid Authorization message"):
        decode_authorization("ns/p", any_pb2.Any(type_url=AUTHORIZATION_TYPE_URL, value=b"\x0a\xff\xff"))


def _decode_only_conversion_errors(value: bytes) -> None:
    try:
        policy = decode_authorization("", any_pb2.Any(type_url=AUTHORIZATION_TYPE_URL, value=value))
    except XdsConversionError as exc:
        assert str(exc)
    else:
        assert isinstance(policy, Policy)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_give_a_policy_or_a_conversion_error(value: bytes) -> None:
    _decode_only_conversion_errors(value)


VALID = pack_authorization(authorization_of(EVERY_FIELD)).value


@settings(max_examples=600, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4), st.integers(0, 8))
def test_mutated_policy_bytes_give_a_policy_or_a_conversion_error(flips: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(VALID)
    for position, byte in flips:
        data[position % len(data)] = byte
    _decode_only_conversion_errors(bytes(data[: len(data) - cut]))


_text = st.text(st.sampled_from("abcdefgh-./0123"), min_size=1, max_size=10)
_string_matches = st.lists(
    st.one_of(
        st.builds(StringMatch.exact, _text),
        st.builds(StringMatch.prefix, _text),
        st.builds(StringMatch.suffix, _text),
        st.just(StringMatch.presence()),
    ),
    max_size=2,
).map(tuple)
_accounts = st.lists(st.builds(ServiceAccountMatch, _text, _text), max_size=2).map(tuple)
_cidrs = st.lists(
    st.one_of(
        st.builds(lambda ip, n: ipaddress.ip_network((ip, n), strict=False), st.ip_addresses(v=4), st.integers(0, 32)),
        st.builds(lambda ip, n: ipaddress.ip_network((ip, n), strict=False), st.ip_addresses(v=6), st.integers(0, 128)),
    ),
    max_size=2,
).map(tuple)
_ports = st.lists(st.integers(1, 65535), max_size=2).map(tuple)
_matches = st.builds(
    Match,
    namespaces=_string_matches,
    not_namespaces=_string_matches,
    service_accounts=_accounts,
    not_service_accounts=_accounts,
    principals=_string_matches,
    not_principals=_string_matches,
    source_ips=_cidrs,
    not_source_ips=_cidrs,
    destination_ips=_cidrs,
    not_destination_ips=_cidrs,
    destination_ports=_ports,
    not_destination_ports=_ports,
)
policies = st.builds(
    Policy,
    name=_text,
    namespace=_text,
    scope=st.sampled_from([Scope.GLOBAL, Scope.NAMESPACE, Scope.WORKLOAD_SELECTOR]),
    action=st.sampled_from([Action.ALLOW, Action.DENY]),
    rules=st.lists(
        st.builds(Rule, st.lists(st.builds(Clause, st.lists(_matches, max_size=2).map(tuple)), max_size=2).map(tuple)),
        max_size=2,
    ).map(tuple),
    dry_run=st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(policies)
def test_random_policies_survive_a_round_trip(policy: Policy) -> None:
    assert _round_trip(policy) == policy


def test_presence_message_is_the_protobuf_empty() -> None:
    assert pb.StringMatch(presence=empty_pb2.Empty()).WhichOneof("match_type") == "presence"


def test_a_bad_policy_in_a_response_is_nacked_while_the_other_policies_apply() -> None:
    from ambit.api import discovery_pb2 as dpb
    from ambit.rbac import PolicyIndex
    from ambit.xds.client_session import ClientSession

    session = ClientSession({AUTHORIZATION_TYPE_URL: decode_authorization})
    session.initial_requests()
    bad = pb.Authorization(name="bad", namespace="shop", scope=9)
    response = dpb.DeltaDiscoveryResponse(
        type_url=AUTHORIZATION_TYPE_URL,
        nonce="n-1",
        resources=[
            dpb.Resource(name="shop/bad", version="1", resource=pack_authorization(bad)),
            dpb.Resource(name=EVERY_FIELD.key, version="1", resource=pack_authorization(authorization_of(EVERY_FIELD))),
        ],
    )
    update = session.apply(response)
    assert update.nacked and "shop/bad: scope: unsupported value 9" in update.reply.error_detail.message
    index = PolicyIndex(value for _, value in update.upserts if isinstance(value, Policy))
    assert index.all() == [EVERY_FIELD]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (Policy("p", "ns", Scope.NAMESPACE, Action.AUDIT), r"ns/p: action: AUDIT is not sent to the node proxy"),
        (Policy("p", "ns", Scope.WAYPOINT, Action.ALLOW), r"ns/p: scope: WAYPOINT is not sent"),
        (Policy("p", "ns", Scope.SERVICE, Action.DENY, services=("ns/a.ns.svc.cluster.local",)), r"scope: SERVICE"),
        (
            Policy("p", "ns", Scope.NAMESPACE, Action.DENY, services=("ns/a.ns.svc.cluster.local",)),
            r"ns/p: services: service-attached policies are not sent",
        ),
        (
            Policy(
                "p",
                "ns",
                Scope.NAMESPACE,
                Action.DENY,
                (Rule((Clause((Match(destination_ports=(80,)), Match(methods=("POST",)))),)),),
            ),
            r"ns/p: rules\[0\]\.clauses\[0\]\.matches\[1\]: L7 fields are not sent to the node proxy",
        ),
        (
            Policy(
                "p",
                "ns",
                Scope.GLOBAL,
                Action.ALLOW,
                (Rule((Clause((Match(request_principals=(StringMatch.presence(),)),)),)),),
            ),
            r"matches\[0\]: L7 fields",
        ),
    ],
)
def test_policies_outside_the_node_proxy_subset_are_not_encoded(policy: Policy, expected: str) -> None:
    with pytest.raises(XdsConversionError, match=expected):
        authorization_of(policy)
