"""The RequestAuthentication codec (ambit.xds.requestauth, WaypointConfig field 4): model → proto → model is the
identity (hypothesis), and a bad policy is refused with one error naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import duration_pb2
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.jwt_keys import rsa_signer

from ambit.api import requestauth_pb2 as rpb
from ambit.api import waypoint_pb2 as pb
from ambit.model.requestauth import ClaimToHeader, JwtHeader, JwtRule, RequestAuthentication
from ambit.model.routes import WaypointConfig
from ambit.xds.errors import XdsConversionError
from ambit.xds.routes import decode_waypoint_config, pack_waypoint_config, waypoint_config_to_proto

JWKS = rsa_signer(kid="k").jwks()
NAME = "app/waypoint"
TOKEN = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=12)
PRINTABLE = st.text(
    st.characters(codec="utf-8", categories=["L", "N", "P", "S"], include_characters=" "), min_size=1, max_size=16
)

rules = st.builds(
    JwtRule,
    issuer=PRINTABLE,
    audiences=st.lists(PRINTABLE, max_size=2).map(tuple),
    jwks=st.just(""),
    jwks_uri=TOKEN.map(lambda t: f"https://{t}.example/jwks"),
    from_headers=st.lists(st.builds(JwtHeader, TOKEN, st.sampled_from(["", "Bearer ", "Token "])), max_size=2).map(
        tuple
    ),
    from_params=st.lists(PRINTABLE, max_size=2).map(tuple),
    from_cookies=st.lists(PRINTABLE, max_size=2).map(tuple),
    output_payload_to_header=st.one_of(st.just(""), TOKEN),
    output_claim_to_headers=st.lists(st.builds(ClaimToHeader, TOKEN, PRINTABLE), max_size=2).map(tuple),
    forward_original_token=st.booleans(),
    timeout_seconds=st.integers(1, 100_000).map(lambda ms: ms / 1000),
    space_delimited_claims=st.lists(PRINTABLE, max_size=2).map(tuple),
) | st.builds(JwtRule, issuer=PRINTABLE, jwks=st.just(JWKS))
policies = st.builds(
    RequestAuthentication,
    TOKEN,
    st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=10),
    st.lists(rules, max_size=3).map(tuple),
    st.lists(TOKEN.map(lambda t: f"app/{t}.app.svc.cluster.local"), max_size=2).map(tuple),
)


def decode(message: pb.WaypointConfig) -> WaypointConfig:
    return decode_waypoint_config(NAME, pack_waypoint_config(message))


@given(st.lists(policies, max_size=3).map(tuple))
def test_model_to_proto_and_back_is_the_identity(authns: tuple[RequestAuthentication, ...]) -> None:
    config = WaypointConfig(NAME, request_authentications=authns)
    assert decode(waypoint_config_to_proto(config)) == config


def test_a_config_without_policies_is_unchanged_on_the_wire() -> None:
    assert waypoint_config_to_proto(WaypointConfig(NAME)) == pb.WaypointConfig(waypoint=NAME)


GOOD: dict[str, Any] = {"issuer": "i", "jwks_uri": "https://k.example/jwks"}


@pytest.mark.parametrize(
    ("rule", "field"),
    [
        ({**GOOD, "issuer": ""}, "rules[0].issuer"),
        ({"issuer": "i"}, "rules[0].jwks_uri"),
        ({**GOOD, "jwks": JWKS}, "rules[0].jwks_uri"),
        ({**GOOD, "jwks_uri": "file:///etc/passwd"}, "rules[0].jwks_uri"),
        ({"issuer": "i", "jwks": "not json"}, "rules[0].jwks"),
        ({"issuer": "i", "jwks": '{"keys": {}}'}, "rules[0].jwks"),
        ({"issuer": "i", "jwks": '{"keys": []}' + " " * (256 * 1024)}, "rules[0].jwks"),
        ({**GOOD, "audiences": [""]}, "rules[0].audiences[0]"),
        ({**GOOD, "from_headers": [rpb.JwtHeader(name="X-Upper")]}, "rules[0].from_headers[0].name"),
        ({**GOOD, "from_headers": [rpb.JwtHeader(name="x", prefix="a\r\nb")]}, "rules[0].from_headers[0].prefix"),
        ({**GOOD, "from_params": [""]}, "rules[0].from_params[0]"),
        ({**GOOD, "output_payload_to_header": "bad header"}, "rules[0].output_payload_to_header"),
        ({**GOOD, "output_claim_to_headers": [rpb.ClaimToHeader(header="x", claim="")]}, "claim"),
        ({**GOOD, "timeout": duration_pb2.Duration(seconds=0)}, "rules[0].timeout"),
        ({**GOOD, "timeout": duration_pb2.Duration(seconds=-1)}, "rules[0].timeout"),
    ],
)
def test_bad_fields_are_refused_by_name(rule: dict[str, Any], field: str) -> None:
    policy = rpb.RequestAuthentication(name="jwt", namespace="app", rules=[rpb.JwtRule(**rule)])
    with pytest.raises(XdsConversionError) as caught:
        decode(pb.WaypointConfig(waypoint=NAME, request_authentications=[policy]))
    assert caught.value.field.startswith("request_authentications[0].")
    assert caught.value.field.endswith(field)


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        (rpb.RequestAuthentication(name="", namespace="app"), "request_authentications[0].name"),
        (rpb.RequestAuthentication(name="a", namespace="bad/ns"), "request_authentications[0].namespace"),
        (rpb.RequestAuthentication(name="a", namespace="app", services=[""]), "request_authentications[0].services[0]"),
    ],
)
def test_bad_policies_are_refused_by_name(policy: rpb.RequestAuthentication, field: str) -> None:
    with pytest.raises(XdsConversionError) as caught:
        decode(pb.WaypointConfig(waypoint=NAME, request_authentications=[policy]))
    assert caught.value.field == field


def test_an_absent_timeout_is_five_seconds() -> None:
    policy = rpb.RequestAuthentication(name="a", namespace="app", rules=[rpb.JwtRule(**GOOD)])
    config = decode(pb.WaypointConfig(waypoint=NAME, request_authentications=[policy]))
    assert config.request_authentications[0].rules[0].timeout_seconds == 5.0
