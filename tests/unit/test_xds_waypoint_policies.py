"""Waypoint policies on the wire (WaypointConfig field 3): round trips, refusals naming the field, fuzzed bytes."""

from __future__ import annotations

import contextlib
import ipaddress
import re

import pytest
from google.protobuf import any_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.api import authorization_pb2 as apb
from ambit.api import waypoint_pb2 as pb
from ambit.model.policy import Action, Clause, KeyedMatch, Match, Policy, Rule, Scope, ServiceAccountMatch, StringMatch
from ambit.model.routes import WaypointConfig
from ambit.xds.errors import XdsConversionError
from ambit.xds.routes import (
    WAYPOINT_CONFIG_TYPE_URL,
    decode_waypoint_config,
    pack_waypoint_config,
    waypoint_config_to_proto,
)


def net(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(text)


EVERY_FIELD = Match(
    namespaces=(StringMatch.exact("shop"),),
    not_namespaces=(StringMatch.prefix("dev-"),),
    service_accounts=(ServiceAccountMatch("shop", "web"),),
    not_service_accounts=(ServiceAccountMatch("shop", "old"),),
    principals=(StringMatch.suffix("/sa/web"),),
    not_principals=(StringMatch.presence(),),
    source_ips=(net("198.18.0.0/16"),),
    not_source_ips=(net("198.18.9.9/32"),),
    destination_ips=(net("fd00::/64"),),
    not_destination_ips=(net("fd00::1/128"),),
    destination_ports=(8080,),
    not_destination_ports=(22,),
    hosts=(StringMatch.exact("shop.example"), StringMatch.suffix(".example:8080")),
    not_hosts=(StringMatch.prefix("admin."),),
    methods=("GET", "HEAD"),
    not_methods=("DELETE",),
    paths=(StringMatch.prefix("/cart/"),),
    not_paths=(StringMatch.exact("/admin"),),
    path_templates=("/api/{*}/items",),
    not_path_templates=("/{**}/secret",),
    request_principals=(StringMatch.prefix("https://issuer.example/"),),
    not_request_principals=(StringMatch.presence(),),
    remote_ips=(net("203.0.113.0/24"),),
    not_remote_ips=(net("203.0.113.7/32"),),
    request_headers=(KeyedMatch(("x-env",), (StringMatch.exact("prod"),), (StringMatch.prefix("dev"),)),),
    request_claims=(KeyedMatch(("org", "team"), (StringMatch.exact("red"),)),),
    audiences=(StringMatch.exact("shop"),),
    not_audiences=(StringMatch.exact("ops"),),
    presenters=(StringMatch.exact("cli"),),
    not_presenters=(StringMatch.exact("bad"),),
    sni=(StringMatch.suffix(".example"),),
    not_sni=(StringMatch.exact("x.example"),),
)
POLICIES = (
    Policy("allow", "shop", Scope.WAYPOINT, Action.ALLOW, (Rule((Clause((EVERY_FIELD, Match(methods=("PUT",)))),)),)),
    Policy("audit", "shop", Scope.SERVICE, Action.AUDIT, (Rule(),), dry_run=True, services=("shop/a.example",)),
    Policy("deny", "shop", Scope.WAYPOINT, Action.DENY),
)
CONFIG = WaypointConfig("shop/waypoint", policies=POLICIES)


def roundtrip(message: pb.WaypointConfig) -> WaypointConfig:
    return decode_waypoint_config("shop/waypoint", pack_waypoint_config(message))


def test_every_field_survives_a_round_trip() -> None:
    assert roundtrip(waypoint_config_to_proto(CONFIG)) == CONFIG


def test_node_proxy_scopes_are_not_encoded() -> None:
    with pytest.raises(ValueError, match="not a waypoint scope"):
        waypoint_config_to_proto(
            WaypointConfig("shop/waypoint", policies=(Policy("p", "shop", Scope.GLOBAL, Action.ALLOW),))
        )


def test_host_matches_and_header_names_are_lower_cased_on_reading() -> None:
    message = waypoint_config_to_proto(CONFIG)
    message.policies[0].rules[0].clauses[0].matches[0].hosts[0].exact = "Shop.EXAMPLE"
    message.policies[0].rules[0].clauses[0].matches[0].request_headers[0].key[0] = "X-Env"
    assert roundtrip(message) == CONFIG


def _with(**fields: object) -> pb.WaypointConfig:
    policy = pb.WaypointPolicy(
        name="p", namespace="shop", scope=pb.POLICY_SCOPE_WAYPOINT, action=pb.POLICY_ACTION_ALLOW
    )
    for key, value in fields.items():
        if key == "match":
            policy.rules.add().clauses.add().matches.append(value)  # type: ignore[arg-type]
        else:
            setattr(policy, key, value) if not isinstance(value, list) else getattr(policy, key).extend(value)
    return pb.WaypointConfig(waypoint="shop/waypoint", policies=[policy])


M = re.escape("policies[0].rules[0].clauses[0].matches[0]")


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (_with(scope=0), r"policies\[0\]\.scope: unsupported value 0"),
        (_with(scope=7), r"policies\[0\]\.scope: unsupported value 7"),
        (_with(action=0), r"policies\[0\]\.action: unsupported value 0"),
        (_with(action=5), r"policies\[0\]\.action: unsupported value 5"),
        (_with(action=4), r"policies\[0\]\.ext_authz: a CUSTOM policy, and only a CUSTOM policy, names an authorizer"),
        (_with(name=""), r"policies\[0\]\.name: required"),
        (_with(namespace=""), r"policies\[0\]\.namespace: required"),
        (_with(services=["shop/a"]), r"policies\[0\]\.services: a WAYPOINT policy names no service"),
        (_with(scope=pb.POLICY_SCOPE_SERVICE), r"policies\[0\]\.services: a SERVICE policy names at least one"),
        (
            _with(scope=pb.POLICY_SCOPE_SERVICE, services=["nohost"]),
            r"policies\[0\]\.services\[0\]: expected namespace/hostname",
        ),
        (_with(match=pb.PolicyMatch(methods=["GET POST"])), rf"{M}\.methods\[0\]: not an HTTP method token"),
        (_with(match=pb.PolicyMatch(not_methods=[""])), rf"{M}\.not_methods\[0\]: not an HTTP method token"),
        (_with(match=pb.PolicyMatch(methods=["GET\n"])), rf"{M}\.methods\[0\]: not an HTTP method token"),
        (_with(match=pb.PolicyMatch(paths=[apb.StringMatch()])), rf"{M}\.paths\[0\]: no match type set"),
        (
            _with(match=pb.PolicyMatch(path_templates=["/plain"])),
            rf"{M}\.path_templates\[0\]: not a valid path template \(no ",
        ),
        (
            _with(match=pb.PolicyMatch(not_path_templates=["/{**}/{*}"])),
            rf"{M}\.not_path_templates\[0\]: not a valid path template \(\{{\*\*\}} is not the last",
        ),
        (
            _with(match=pb.PolicyMatch(path_templates=["x/{*}"])),
            rf"{M}\.path_templates\[0\]: not a valid path template \(a path template starts with",
        ),
        (_with(match=pb.PolicyMatch(hosts=[apb.StringMatch(exact="a\nb")])), rf"{M}\.hosts\[0\]\.exact: has unprint"),
        (
            _with(match=pb.PolicyMatch(remote_ips=[apb.Address(address=bytes(4), length=33)])),
            rf"{M}\.remote_ips\[0\]\.length: /33 is longer than 32",
        ),
        (_with(match=pb.PolicyMatch(destination_ports=[0])), rf"{M}\.destination_ports\[0\]: out of range"),
        (
            _with(match=pb.PolicyMatch(request_headers=[pb.KeyedMatch(key=["a", "b"])])),
            rf"{M}\.request_headers\[0\]\.key: expected one header name",
        ),
        (
            _with(match=pb.PolicyMatch(request_headers=[pb.KeyedMatch(key=["bad name"])])),
            rf"{M}\.request_headers\[0\]\.key: expected one header name",
        ),
        (
            _with(match=pb.PolicyMatch(request_headers=[pb.KeyedMatch(key=["x-team\n"])])),
            rf"{M}\.request_headers\[0\]\.key: expected one header name",
        ),
        (
            _with(match=pb.PolicyMatch(request_claims=[pb.KeyedMatch()])),
            rf"{M}\.request_claims\[0\]\.key: a claim path is required",
        ),
        (
            _with(match=pb.PolicyMatch(request_claims=[pb.KeyedMatch(key=["org", ""])])),
            rf"{M}\.request_claims\[0\]\.key\[1\]: required",
        ),
        (
            _with(match=pb.PolicyMatch(service_accounts=[apb.ServiceAccountMatch(namespace="shop")])),
            rf"{M}\.service_accounts\[0\]\.serviceAccount: required",
        ),
    ],
)
def test_bad_policies_are_refused_naming_the_field(message: pb.WaypointConfig, expected: str) -> None:
    with pytest.raises(XdsConversionError, match=rf"^shop/waypoint: {expected}"):
        roundtrip(message)


_GOOD = pack_waypoint_config(waypoint_config_to_proto(CONFIG)).value


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_GOOD) - 1), st.integers(0, 255)), max_size=4), st.integers(0, len(_GOOD)))
def test_mutated_bytes_give_a_config_or_a_conversion_error(flips: list[tuple[int, int]], cut: int) -> None:
    raw = bytearray(_GOOD)
    for at, value in flips:
        raw[at] = value
    body = any_pb2.Any(type_url=WAYPOINT_CONFIG_TYPE_URL, value=bytes(raw[:cut]))
    with contextlib.suppress(XdsConversionError):
        decode_waypoint_config("shop/waypoint", body)
