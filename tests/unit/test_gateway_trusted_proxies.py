"""``gatewayTopology.numTrustedProxies`` at the ingress gateway: where the count comes from
(:mod:`ambit.controlplane.translate.gateway_topology`, :mod:`ambit.controlplane.translate.meshconfig` rule 8), and
what it does to the client address ``remoteIpBlocks`` sees (:mod:`ambit.waypoint.forwarded_for`,
:mod:`ambit.waypoint.authorization` rule 4). The address rules are Envoy's for ``use_remote_address: true`` with
``xff_num_trusted_hops`` N (its documented x-forwarded-for examples)."""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.gateway_topology import gateway_trusted_proxies, num_trusted_proxies
from ambit.controlplane.translate.meshconfig import MeshConfigError, parse_mesh_config
from ambit.model.policy import Action, Clause, Match, Policy, Rule, Scope
from ambit.rbac import Applicable, Connection, decide
from ambit.waypoint.authorization import request_of
from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.forwarded_for import edge_headers, trusted_client

PEER = ipaddress.ip_address("198.18.0.1")
FORGED = "198.19.77.5"


def xff(*values: str) -> tuple[tuple[str, str], ...]:
    return tuple(("x-forwarded-for", v) for v in values)


@pytest.mark.parametrize(
    ("headers", "hops", "client"),
    [
        ((), 0, "198.18.0.1"),
        (xff(FORGED), 0, "198.18.0.1"),  # the default: nothing the client says is believed
        (xff(FORGED), 1, FORGED),
        (xff("198.19.0.1, 198.19.0.2, 198.19.0.3"), 1, "198.19.0.3"),
        (xff("198.19.0.1, 198.19.0.2, 198.19.0.3"), 2, "198.19.0.2"),
        (xff("198.19.0.1", "198.19.0.2,198.19.0.3"), 3, "198.19.0.1"),  # repeated headers read in order
        (xff("198.19.0.3"), 2, "198.18.0.1"),  # fewer addresses than trusted hops: the peer
        ((), 1, "198.18.0.1"),
        (xff("not-an-address"), 1, "198.18.0.1"),
        (xff("2001:db8::1"), 1, "2001:db8::1"),
    ],
)
def test_the_client_address_is_the_nth_from_the_right_as_envoy_reads_it(
    headers: tuple[tuple[str, str], ...], hops: int, client: str
) -> None:
    assert trusted_client(headers, PEER, hops) == ipaddress.ip_address(client)


@given(st.lists(st.text(max_size=40), max_size=4), st.integers(min_value=0, max_value=8))
def test_any_forwarded_for_gives_the_peer_or_one_of_the_last_n_addresses(values: list[str], hops: int) -> None:
    headers = xff(*values)
    found = trusted_client(headers, PEER, hops)
    addresses = [item.strip() for value in values for item in value.split(",")]
    assert found == PEER or (hops and str(found) == str(ipaddress.ip_address(addresses[-hops])))


def test_the_gateway_appends_its_peer_and_replaces_the_client_s_external_address() -> None:
    headers = (("x-envoy-external-address", "198.19.9.9"), *xff(FORGED), ("accept", "*/*"))
    out = edge_headers(headers, PEER, PEER)
    assert out == (
        ("accept", "*/*"),
        ("x-forwarded-for", f"{FORGED}, 198.18.0.1"),
        ("x-envoy-external-address", "198.18.0.1"),
    )
    assert edge_headers((), PEER, PEER)[0] == ("x-forwarded-for", "198.18.0.1")


def test_remote_ip_blocks_follow_the_client_address_the_gateway_decided_on() -> None:
    """The attack: with 0 trusted hops the forged header does not reach the DENY on ``remoteIpBlocks``; with 1 it
    does."""
    deny = Policy(
        "edge",
        "deny-range",
        Scope.WAYPOINT,
        Action.DENY,
        (Rule((Clause((Match(remote_ips=(ipaddress.ip_network("198.19.77.0/24"),)),)),)),),
    )
    applicable = Applicable.of([deny], ())
    head = RequestHead("GET", "/", "a.example", xff(FORGED))
    connection = Connection(PEER, None, ipaddress.ip_address("198.18.0.50"), 8080)
    for hops, allowed in ((0, True), (1, False)):
        request = request_of(head, None, trusted_client(head.headers, PEER, hops))
        assert decide(applicable, connection, request).allowed is allowed, hops


@pytest.mark.parametrize(
    ("proxy_config", "want"),
    [
        ({}, None),
        ({"gatewayTopology": {}}, None),
        ({"gatewayTopology": {"numTrustedProxies": 2}}, 2),
        ({"gateway_topology": {"num_trusted_proxies": 1}}, 1),
        ({"gatewayTopology": {"numTrustedProxies": 0}}, 0),
    ],
)
def test_num_trusted_proxies_is_read_from_a_proxy_config(proxy_config: dict[str, Any], want: int | None) -> None:
    assert num_trusted_proxies(proxy_config, "defaultConfig") == want


@pytest.mark.parametrize("value", [-1, 65, "2", True, 1.5])
def test_a_count_out_of_range_or_not_an_integer_is_refused_with_the_field_named(value: Any) -> None:
    with pytest.raises(ValueError, match=r"defaultConfig\.gatewayTopology\.numTrustedProxies"):
        num_trusted_proxies({"gatewayTopology": {"numTrustedProxies": value}}, "defaultConfig")


def gateway(annotation: str | None = None, infrastructure: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "edge", "namespace": "in-edge"}
    spec: dict[str, Any] = {
        "gatewayClassName": "istio",
        "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}],
    }
    if annotation is not None:
        meta["annotations"] = {"proxy.istio.io/config": annotation}
    if infrastructure is not None:
        spec["infrastructure"] = {"annotations": {"proxy.istio.io/config": infrastructure}}
    return {"metadata": meta, "spec": spec}


TRUST_TWO = json.dumps({"gatewayTopology": {"numTrustedProxies": 2}})


@pytest.mark.parametrize(
    ("obj", "mesh", "want"),
    [
        (gateway(), None, None),
        (gateway(), 1, 1),
        (gateway(TRUST_TWO), 1, 2),
        (gateway("gatewayTopology:\n  numTrustedProxies: 3\n"), None, 3),
        (gateway(TRUST_TWO, "gatewayTopology: {numTrustedProxies: 4}"), None, 4),
        (gateway("gatewayTopology: {numTrustedProxies: 9000}"), 1, 1),  # a bad annotation: the mesh's count
        (gateway("{{{ not yaml"), None, None),
        (gateway("a: &x [1]\nb: *x\n"), None, None),
        (gateway("[1, 2]"), None, None),
    ],
)
def test_a_gateway_s_count_comes_from_its_annotation_then_the_mesh_default(
    obj: dict[str, Any], mesh: int | None, want: int | None
) -> None:
    assert gateway_trusted_proxies(obj, mesh) == want


def test_the_mesh_default_config_gives_the_count_and_a_bad_one_is_a_mesh_config_error() -> None:
    assert parse_mesh_config("defaultConfig:\n  gatewayTopology:\n    numTrustedProxies: 2\n").trusted_proxies == 2
    assert parse_mesh_config("defaultConfig: {}\n").trusted_proxies is None
    with pytest.raises(MeshConfigError, match="numTrustedProxies"):
        parse_mesh_config("defaultConfig:\n  gatewayTopology:\n    numTrustedProxies: -3\n")
    with pytest.raises(MeshConfigError, match="defaultConfig"):
        parse_mesh_config("defaultConfig: 7\n")


def _hops(gateways: list[dict[str, Any]], envoy_filters: list[dict[str, Any]] = ()) -> dict[str, int | None]:  # type: ignore[assignment]
    namespaces = [{"metadata": {"name": "in-edge", "labels": {}}}]
    translation = translate_all([], [], [], namespaces, gateways=gateways, envoy_filters=envoy_filters)
    return {c.gateway: c.envoy_patches.xff_trusted_hops for c in translation.gateway_configs}


def test_the_gateway_s_count_reaches_its_config_as_xff_trusted_hops_and_an_envoy_filter_wins() -> None:
    assert _hops([gateway()]) == {"in-edge/edge": None}
    assert _hops([gateway(TRUST_TWO)]) == {"in-edge/edge": 2}
    envoy_filter = {
        "metadata": {"name": "xff", "namespace": "in-edge"},
        "spec": {
            "targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "edge"}],
            "configPatches": [
                {
                    "applyTo": "NETWORK_FILTER",
                    "match": {
                        "context": "GATEWAY",
                        "listener": {
                            "filterChain": {"filter": {"name": "envoy.filters.network.http_connection_manager"}}
                        },
                    },
                    "patch": {
                        "operation": "MERGE",
                        "value": {
                            "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.network."
                                "http_connection_manager.v3.HttpConnectionManager",
                                "xff_num_trusted_hops": 5,
                            }
                        },
                    },
                }
            ],
        },
    }
    assert _hops([gateway(TRUST_TWO)], [envoy_filter]) == {"in-edge/edge": 5}
