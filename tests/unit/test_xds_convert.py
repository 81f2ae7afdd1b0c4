"""Model ↔ proto Address conversion: round trips, default elision, clear errors, and fuzzed bytes."""

from __future__ import annotations

import dataclasses
import ipaddress

import pytest
from google.protobuf import any_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.api import workload_pb2 as pb
from ambit.controlplane.addresses import addresses, content_version
from ambit.model.localconfig import LocalConfig
from ambit.model.routing_preference import MAX_ROUTING_SCOPES
from ambit.model.workload import (
    AppProtocol,
    HealthPolicy,
    HealthStatus,
    IPFamilies,
    LoadBalancingMode,
    Locality,
    NetworkAddress,
    NetworkMode,
    PortMapping,
    RoutingScope,
    Service,
    TunnelProtocol,
    Workload,
)
from ambit.xds.convert import (
    ADDRESS_TYPE_URL,
    address_aliases,
    address_from_proto,
    address_of,
    decode_address,
    pack_address,
    resource_name,
)
from ambit.xds.errors import XdsConversionError

WEB = Workload(
    uid="Kubernetes//Pod/shop/web-1",
    name="web-1",
    namespace="shop",
    addresses=(ipaddress.ip_address("198.18.200.5"), ipaddress.ip_address("fd00::5")),
    network="net1",
    tunnel_protocol=TunnelProtocol.HBONE,
    trust_domain="example.org",
    service_account="web",
    node="node-a",
    canonical_name="web",
    canonical_revision="v1",
    workload_name="web",
    workload_type="deployment",
    cluster_id="Kubernetes",
    status=HealthStatus.UNHEALTHY,
    services={"shop/web.shop.svc.cluster.local": (PortMapping(80, 8080), PortMapping(443, 0))},
    authorization_policies=("shop/allow-web", "istio-system/istio_converted_static_strict"),
    network_mode=NetworkMode.HOST_NETWORK,
    locality=Locality("us-east", "us-east-1a", "rack-7"),
    capacity=3,
)
WEB_SVC = Service(
    name="web",
    namespace="shop",
    hostname="web.shop.svc.cluster.local",
    vips=(NetworkAddress("net1", ipaddress.ip_address("198.18.210.1")),),
    ports=(PortMapping(80, 8080, AppProtocol.HTTP11), PortMapping(443, 0, AppProtocol.TLS)),
    subject_alt_names=("spiffe://example.org/ns/shop/sa/web",),
    health_policy=HealthPolicy.ALLOW_ALL,
    canonical=True,
    ip_families=IPFamilies.DUAL,
    load_balancing_mode=LoadBalancingMode.PASSTHROUGH,
)


def _round_trip(item: Workload | Service) -> Workload | Service:
    address = address_of(item)
    return decode_address(resource_name(address), pack_address(address))


def test_a_workload_with_every_field_survives_a_round_trip() -> None:
    assert _round_trip(WEB) == WEB


def test_a_service_with_every_field_survives_a_round_trip() -> None:
    assert _round_trip(WEB_SVC) == WEB_SVC


def test_default_trust_domain_and_service_account_are_elided_on_the_wire_and_restored() -> None:
    plain = Workload(uid="c//Pod/ns/p", name="p", namespace="ns", addresses=())
    message = address_of(plain).workload
    assert message.trust_domain == "" and message.service_account == ""
    assert _round_trip(plain) == plain


def test_resource_names_are_the_uid_and_namespace_slash_hostname() -> None:
    assert resource_name(address_of(WEB)) == WEB.uid
    assert resource_name(address_of(WEB_SVC)) == "shop/web.shop.svc.cluster.local"


def test_aliases_are_network_slash_ip_keys() -> None:
    assert address_aliases(address_of(WEB)) == ("net1/198.18.200.5", "net1/fd00::5")
    assert address_aliases(address_of(WEB_SVC)) == ("net1/198.18.210.1",)


def test_versions_are_content_hashes_that_change_only_with_the_content() -> None:
    config = LocalConfig((WEB,), (WEB_SVC,))
    first, again = addresses(config), addresses(LocalConfig((WEB,), (WEB_SVC,)))
    assert set(first) == {WEB.uid, WEB_SVC.key}
    assert {k: v[0] for k, v in first.items()} == {k: v[0] for k, v in again.items()}
    moved = Workload(**{**{f: getattr(WEB, f) for f in WEB.__slots__}, "node": "node-b"})  # type: ignore[arg-type]
    assert content_version(address_of(moved)) != first[WEB.uid][0]


def _bad_workload(**fields: object) -> pb.Address:
    message = address_of(WEB)
    for key, value in fields.items():
        if key == "addresses":
            del message.workload.addresses[:]
            message.workload.addresses.extend(value)  # type: ignore[arg-type]
        else:
            setattr(message.workload, key, value)
    return message


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        (_bad_workload(addresses=[b"\x01\x02\x03\x04\x05"]), "workload.addresses[0]: expected 4 or 16 bytes, got 5"),
        (_bad_workload(namespace=""), "workload.namespace: required"),
        (_bad_workload(namespace="a/b"), "workload.namespace: bad SPIFFE part"),
        (_bad_workload(service_account=".."), "workload.service_account: bad SPIFFE part"),
        (_bad_workload(trust_domain="Upper.Case"), "workload.trust_domain: bad SPIFFE part"),
        (_bad_workload(tunnel_protocol=pb.LEGACY_ISTIO_MTLS), "workload.tunnel_protocol: unsupported value 2"),
        (_bad_workload(uid=""), "workload.uid: required"),
    ],
)
def test_bad_workload_fields_are_refused_naming_the_resource_and_field(address: pb.Address, expected: str) -> None:
    with pytest.raises(XdsConversionError) as caught:
        address_from_proto(address)
    assert expected in str(caught.value)
    assert str(caught.value).startswith(address.workload.uid or "(unnamed)")


def test_ports_out_of_range_are_refused() -> None:
    address = address_of(WEB_SVC)
    address.service.ports[0].service_port = 70000
    with pytest.raises(XdsConversionError, match=r"shop/web.shop.svc.cluster.local: service.ports\[0\].service_port"):
        address_from_proto(address)
    address = address_of(WEB)
    address.workload.services["shop/web.shop.svc.cluster.local"].ports[0].target_port = 65536
    with pytest.raises(XdsConversionError, match=r"target_port: out of range 0..65535"):
        address_from_proto(address)


def test_a_vip_range_round_trips_and_a_bad_prefix_is_refused() -> None:
    ranged = dataclasses.replace(
        WEB_SVC, vips=(NetworkAddress("net1", ipaddress.ip_address("198.18.210.0"), 24), *WEB_SVC.vips)
    )
    assert _round_trip(ranged) == ranged
    assert address_of(ranged).service.addresses[0].length == 24
    assert not address_of(ranged).service.addresses[1].HasField("length")
    address = address_of(WEB_SVC)
    address.service.addresses[0].length = 24
    with pytest.raises(XdsConversionError, match=r"service.addresses\[0\].length: 198.18.210.1/24 has host bits"):
        address_from_proto(address)
    address.service.addresses[0].length = 33
    with pytest.raises(XdsConversionError, match=r"service.addresses\[0\].length: out of range 0..32: 33"):
        address_from_proto(address)
    address.service.addresses[0].length = 32
    assert address_from_proto(address) == WEB_SVC  # a full-length prefix is one address


def test_a_resource_named_differently_from_its_body_is_refused() -> None:
    with pytest.raises(XdsConversionError, match=r"^other: name: resource name does not match"):
        decode_address("other", pack_address(address_of(WEB)))


def test_a_body_of_another_type_or_no_type_is_refused() -> None:
    with pytest.raises(XdsConversionError, match=r"resource\.type_url"):
        decode_address("x", any_pb2.Any(type_url="type.googleapis.com/other", value=b""))
    with pytest.raises(XdsConversionError, match="type: neither a workload nor a service"):
        decode_address("x", any_pb2.Any(type_url=ADDRESS_TYPE_URL, value=b""))


def test_bytes_that_are_not_an_address_message_are_refused() -> None:
    with pytest.raises(XdsConversionError, match=r"resource\.value: not a valid Address message"):
        decode_address("x", any_pb2.Any(type_url=ADDRESS_TYPE_URL, value=b"\x0a\xff\xff"))


def _decode_only_conversion_errors(value: bytes) -> None:
    try:
        item = decode_address("", any_pb2.Any(type_url=ADDRESS_TYPE_URL, value=value))
    except XdsConversionError as exc:
        assert str(exc)
    else:
        assert isinstance(item, Workload | Service)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_give_a_value_or_a_conversion_error(value: bytes) -> None:
    _decode_only_conversion_errors(value)


VALID = [pack_address(address_of(WEB)).value, pack_address(address_of(WEB_SVC)).value]


@settings(max_examples=600, deadline=None)
@given(
    st.sampled_from(VALID),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    st.integers(0, 10_000),
)
def test_mutated_resource_bytes_give_a_value_or_a_conversion_error(
    value: bytes, flips: list[tuple[int, int]], cut: int
) -> None:
    data = bytearray(value)
    for position, byte in flips:
        data[position % len(data)] = byte
    _decode_only_conversion_errors(bytes(data[: len(data) - cut % 8]))


_names = st.text(st.sampled_from("abcdefghijklmnop-0123456789"), min_size=1, max_size=12)
_ips = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6).filter(lambda ip: ip.scope_id is None))
_ports = st.lists(
    st.builds(PortMapping, st.integers(1, 65535), st.integers(0, 65535), st.sampled_from(AppProtocol)),
    max_size=3,
    unique_by=lambda p: p.service_port,
).map(tuple)


@settings(max_examples=150, deadline=None)
@given(
    st.builds(
        Workload,
        uid=_names,
        name=_names,
        namespace=_names,
        addresses=st.lists(_ips, max_size=3).map(tuple),
        network=_names,
        tunnel_protocol=st.sampled_from(TunnelProtocol),
        service_account=_names,
        node=_names,
        workload_type=st.sampled_from(["deployment", "cronjob", "pod", "job"]),
        status=st.sampled_from(HealthStatus),
        services=st.dictionaries(st.builds("{}/{}".format, _names, _names), _ports, max_size=2),
        authorization_policies=st.lists(st.builds("{}/{}".format, _names, _names), max_size=3).map(tuple),
        network_mode=st.sampled_from(NetworkMode),
        locality=st.builds(Locality, st.just("") | _names, st.just("") | _names, st.just("") | _names),
        capacity=st.integers(0, 0xFFFFFFFF),
    )
)
def test_random_workloads_survive_a_round_trip(workload: Workload) -> None:
    assert _round_trip(workload) == workload


def test_new_fields_go_on_the_wire_as_istiod_writes_them() -> None:
    workload = address_of(WEB).workload
    assert workload.network_mode == pb.HOST_NETWORK
    assert (workload.locality.region, workload.locality.zone, workload.locality.subzone) == (
        "us-east",
        "us-east-1a",
        "rack-7",
    )
    service = address_of(WEB_SVC).service
    assert service.canonical and service.ip_families == pb.DUAL
    assert [p.app_protocol for p in service.ports] == [pb.HTTP11, pb.TLS]


def test_capacity_is_sent_only_when_it_is_not_one_and_absent_reads_as_one() -> None:
    plain = Workload(uid="u/x/y", name="y", namespace="x", addresses=())
    assert not address_of(plain).workload.HasField("capacity")
    assert address_of(WEB).workload.capacity.value == 3
    message = address_of(plain)
    message.workload.capacity.value = 0  # present and zero: never picked by a weighted choice, as in ztunnel
    assert address_from_proto(message).capacity == 0  # type: ignore[union-attr]


def test_a_passthrough_service_goes_on_the_wire_as_istiod_writes_it_and_an_unknown_mode_is_refused() -> None:
    message = address_of(WEB_SVC)
    lb = message.service.load_balancing
    assert (lb.mode, lb.health_policy) == (pb.LoadBalancing.PASSTHROUGH, pb.LoadBalancing.ALLOW_ALL)
    plain = Service(name="x", namespace="shop", hostname="x.example.com")
    assert not address_of(plain).service.HasField("load_balancing")
    message.service.load_balancing.mode = 9
    with pytest.raises(XdsConversionError, match=r"service\.load_balancing\.mode: unsupported value 9"):
        address_from_proto(message)


PREFER_CLOSE_SVC = Service(
    name="web",
    namespace="shop",
    hostname="web.shop.svc.cluster.local",
    load_balancing_mode=LoadBalancingMode.FAILOVER,
    routing_preference=(RoutingScope.NETWORK, RoutingScope.REGION, RoutingScope.ZONE),
)


def test_a_routing_preference_goes_on_the_wire_as_istiod_writes_it_and_survives_a_round_trip() -> None:
    lb = address_of(PREFER_CLOSE_SVC).service.load_balancing
    assert list(lb.routing_preference) == [pb.LoadBalancing.NETWORK, pb.LoadBalancing.REGION, pb.LoadBalancing.ZONE]
    assert (lb.mode, lb.health_policy) == (pb.LoadBalancing.FAILOVER, pb.LoadBalancing.ONLY_HEALTHY)
    assert _round_trip(PREFER_CLOSE_SVC) == PREFER_CLOSE_SVC
    every = dataclasses.replace(PREFER_CLOSE_SVC, routing_preference=tuple(RoutingScope))
    assert _round_trip(every) == every
    # A preference alone (UNSPECIFIED mode, where it is not weighed) is still sent, as it is.
    alone = dataclasses.replace(PREFER_CLOSE_SVC, load_balancing_mode=LoadBalancingMode.UNSPECIFIED)
    assert address_of(alone).service.HasField("load_balancing")
    assert _round_trip(alone) == alone


@pytest.mark.parametrize("scope", [0, 7, 99])
def test_an_unspecified_or_unknown_routing_scope_is_refused(scope: int) -> None:
    message = address_of(PREFER_CLOSE_SVC)
    message.service.load_balancing.routing_preference.append(scope)  # type: ignore[arg-type]
    with pytest.raises(
        XdsConversionError, match=rf"service\.load_balancing\.routing_preference\[3\]: unsupported value {scope}"
    ):
        address_from_proto(message)


def test_a_routing_preference_longer_than_one_of_each_scope_is_refused() -> None:
    message = address_of(PREFER_CLOSE_SVC)
    message.service.load_balancing.routing_preference.extend([pb.LoadBalancing.ZONE] * MAX_ROUTING_SCOPES)
    with pytest.raises(XdsConversionError, match=r"routing_preference: 9 scopes, more than 6"):
        address_from_proto(message)


def test_an_unknown_locality_is_not_sent() -> None:
    plain = Workload(uid="u/x/y", name="y", namespace="x", addresses=())
    assert not address_of(plain).workload.HasField("locality")
    assert _round_trip(plain) == plain


def test_an_app_protocol_from_a_newer_control_plane_reads_as_unknown() -> None:
    address = address_of(WEB_SVC)
    address.service.ports[0].app_protocol = 42  # type: ignore[assignment]
    service = address_from_proto(address)
    assert isinstance(service, Service) and service.ports[0].app_protocol is AppProtocol.UNKNOWN


@pytest.mark.parametrize(("field", "expected"), [("network_mode", "workload.network_mode: unsupported value 9")])
def test_an_unknown_network_mode_is_refused(field: str, expected: str) -> None:
    address = address_of(WEB)
    setattr(address.workload, field, 9)
    with pytest.raises(XdsConversionError, match=expected):
        address_from_proto(address)


def test_an_unknown_ip_family_is_refused() -> None:
    address = address_of(WEB_SVC)
    address.service.ip_families = 7  # type: ignore[assignment]
    with pytest.raises(XdsConversionError, match=r"service\.ip_families: unsupported value 7"):
        address_from_proto(address)
