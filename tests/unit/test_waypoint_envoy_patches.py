"""EnvoyFilter header edits at the waypoint (ambit.waypoint.envoy_patches) and on the wire
(ambit.xds.envoy_patches): Envoy's append actions, and what a waypoint refuses to be sent."""

from __future__ import annotations

import pytest

from ambit.api import waypoint_pb2 as pb
from ambit.model.envoyfilter import HeaderAction, HeaderOp, HeaderPatch, PatchScope, ProxyPatches
from ambit.model.ingress import GatewayConfig
from ambit.model.routes import WaypointConfig
from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.envoy_patches import apply_header_ops, edit_request
from ambit.xds.errors import XdsConversionError
from ambit.xds.gateway import gateway_config_from_proto, gateway_config_to_proto
from ambit.xds.routes import decode_waypoint_config, pack_waypoint_config, waypoint_config_to_proto

A = HeaderAction
HEADERS = [("x", "1"), ("y", "2"), ("x", "3")]


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        (HeaderOp(A.APPEND, "x", "9"), [("x", "1"), ("y", "2"), ("x", "3"), ("x", "9")]),
        (HeaderOp(A.ADD_IF_ABSENT, "x", "9"), HEADERS),
        (HeaderOp(A.ADD_IF_ABSENT, "z", "9"), [*HEADERS, ("z", "9")]),
        (HeaderOp(A.OVERWRITE, "x", "9"), [("x", "9"), ("y", "2")]),
        (HeaderOp(A.OVERWRITE, "z", "9"), [*HEADERS, ("z", "9")]),
        (HeaderOp(A.OVERWRITE_IF_EXISTS, "y", "9"), [("x", "1"), ("y", "9"), ("x", "3")]),
        (HeaderOp(A.OVERWRITE_IF_EXISTS, "z", "9"), HEADERS),
        (HeaderOp(A.REMOVE, "x"), [("y", "2")]),
        (HeaderOp(A.REMOVE, "z"), HEADERS),
    ],
)
def test_each_action_does_what_envoy_does(op: HeaderOp, expected: list[tuple[str, str]]) -> None:
    assert apply_header_ops(HEADERS, [op]) == expected


def test_edits_run_in_order_and_never_touch_the_authority() -> None:
    request = RequestHead("GET", "/", "reviews:80", (("a", "1"),))
    edited = edit_request(
        request, [HeaderOp(A.REMOVE, "a"), HeaderOp(A.APPEND, "a", "2"), HeaderOp(A.APPEND, "b", "3")]
    )
    assert edited.headers == (("a", "2"), ("b", "3")) and edited.authority == "reviews:80"


def test_route_edits_are_scoped_and_removals_run_first_within_a_level() -> None:
    patches = ProxyPatches(
        routes=(
            HeaderPatch("a/f[0]", (HeaderOp(A.APPEND, "x", "vhost"),)),
            HeaderPatch("a/f[1]", (HeaderOp(A.REMOVE, "x"),)),
            HeaderPatch("a/f[2]", (HeaderOp(A.APPEND, "x", "other"),), scope=PatchScope("other", 0)),
            HeaderPatch("a/f[3]", (HeaderOp(A.APPEND, "x", "rc"),), level=1),
        )
    )
    ops = patches.route_request_ops("reviews", 80)
    assert ops == (HeaderOp(A.REMOVE, "x"), HeaderOp(A.APPEND, "x", "vhost"), HeaderOp(A.APPEND, "x", "rc"))


def _config(patches: ProxyPatches) -> WaypointConfig:
    return WaypointConfig("app/waypoint", envoy_patches=patches)


def test_patches_travel_to_the_waypoint_unchanged() -> None:
    patches = ProxyPatches(
        filters=(HeaderPatch("app/f[0]", (HeaderOp(A.APPEND, "x-lua", "hello world"),), (HeaderOp(A.REMOVE, "s"),)),),
        routes=(
            HeaderPatch("app/f[1]", (HeaderOp(A.ADD_IF_ABSENT, "v", "1"),), scope=PatchScope("h", 80)),
            HeaderPatch("app/f[2]", (), (HeaderOp(A.OVERWRITE_IF_EXISTS, "r", "2"),), level=1),
        ),
        upstream_h2=(PatchScope("ext.example.com", 8080),),
        xff_trusted_hops=1,
    )
    body = pack_waypoint_config(waypoint_config_to_proto(_config(patches)))
    assert decode_waypoint_config("app/waypoint", body).envoy_patches == patches
    plain = pack_waypoint_config(waypoint_config_to_proto(_config(ProxyPatches())))
    assert decode_waypoint_config("app/waypoint", plain).envoy_patches == ProxyPatches()


@pytest.mark.parametrize(
    ("op", "field"),
    [
        (pb.HeaderOp(action=pb.HEADER_APPEND, name="x", value="a\r\nb"), "value"),
        (pb.HeaderOp(action=pb.HEADER_APPEND, name="x", value="a\x00"), "value"),
        (pb.HeaderOp(action=pb.HEADER_APPEND, name="host", value="evil"), "name"),
        (pb.HeaderOp(action=pb.HEADER_APPEND, name="transfer-encoding", value="chunked"), "name"),
        (pb.HeaderOp(action=pb.HEADER_APPEND, name="X-Upper", value="1"), "name"),
        (pb.HeaderOp(action=pb.HEADER_APPEND, name="a b", value="1"), "name"),
        (pb.HeaderOp(action=99, name="x", value="1"), "action"),  # type: ignore[arg-type]
        (pb.HeaderOp(action=pb.HEADER_REMOVE, name="x", value="1"), "value"),
    ],
)
def test_a_waypoint_refuses_edits_that_could_split_or_reframe_a_message(op: pb.HeaderOp, field: str) -> None:
    message = waypoint_config_to_proto(_config(ProxyPatches()))
    message.envoy_patches.filters.add(source="x", request=[op])
    with pytest.raises(XdsConversionError, match=rf"envoy_patches\.filters\[0\]\.request\[0\]\.{field}"):
        decode_waypoint_config("app/waypoint", pack_waypoint_config(message))


def test_a_filter_with_a_scope_or_a_level_is_refused() -> None:
    message = waypoint_config_to_proto(_config(ProxyPatches()))
    message.envoy_patches.filters.add(source="x", scope=pb.PatchScope(hostname="h"))
    with pytest.raises(XdsConversionError, match="a filter applies everywhere"):
        decode_waypoint_config("app/waypoint", pack_waypoint_config(message))
    message = waypoint_config_to_proto(_config(ProxyPatches()))
    message.envoy_patches.routes.add(source="x", level=2)
    with pytest.raises(XdsConversionError, match="unknown level"):
        decode_waypoint_config("app/waypoint", pack_waypoint_config(message))


def test_a_gateway_config_carries_its_patches_too() -> None:
    patches = ProxyPatches(filters=(HeaderPatch("app/f[0]", (HeaderOp(A.APPEND, "x-lua", "1"),)),))
    message = gateway_config_to_proto(GatewayConfig("app/gateway", envoy_patches=patches))
    assert gateway_config_from_proto(message, "app/gateway").envoy_patches == patches
    message.envoy_patches.filters[0].request[0].value = "a\r\nb"
    with pytest.raises(XdsConversionError, match="envoy_patches"):
        gateway_config_from_proto(message, "app/gateway")


def test_trusted_hops_zero_travel_as_set_and_too_many_are_refused() -> None:
    zero = ProxyPatches(xff_trusted_hops=0)
    body = pack_waypoint_config(waypoint_config_to_proto(_config(zero)))
    assert decode_waypoint_config("app/waypoint", body).envoy_patches == zero
    message = waypoint_config_to_proto(_config(ProxyPatches()))
    message.envoy_patches.xff_trusted_hops = 65
    with pytest.raises(XdsConversionError, match=r"envoy_patches\.xff_trusted_hops"):
        decode_waypoint_config("app/waypoint", pack_waypoint_config(message))
