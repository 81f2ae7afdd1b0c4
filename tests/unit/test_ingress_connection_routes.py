"""TLS passthrough and TCP listeners at the ingress gateway, the pure parts: TLSRoute and TCPRoute translation into a
GatewayConfig (and the routes' ingress parent status), the wire form, and the pick of a connection's backends by
server name."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.tls_hello import record_with_name

from ambit.controlplane.gateway.ingress_status import ingress_attached_routes
from ambit.controlplane.translate.ingress import translate_ingress
from ambit.model.ingress import GatewayConfig, IngressListener, ListenerProtocol, VirtualHost
from ambit.model.route_matches import RouteMatch
from ambit.model.routes import BackendService, RouteRule, WeightedBackend
from ambit.model.workload import Service
from ambit.tls.clienthello import HELLO_LIMIT
from ambit.waypoint.errors import HelloRefusedError
from ambit.waypoint.ingress_connections import Closed, plan_backend, read_hello
from ambit.waypoint.ingress_routing import IngressRouter
from ambit.xds.errors import XdsConversionError
from ambit.xds.gateway import decode_gateway_config, gateway_config_to_proto, pack_gateway_config

G = "gateway.networking.k8s.io"
SERVICES = [Service(name, "app", f"{name}.app.svc.cluster.local") for name in ("one", "two", "three")]
ALL = {"namespaces": {"from": "All"}}
PASSTHROUGH = {"name": "tls", "port": 9443, "protocol": "TLS", "tls": {"mode": "Passthrough"}, "allowedRoutes": ALL}
TCP = {"name": "tcp", "port": 9000, "protocol": "TCP", "allowedRoutes": ALL}
HTTP = {"name": "http", "port": 8080, "protocol": "HTTP", "allowedRoutes": ALL}


def backend(name: str, port: int = 443) -> BackendService:
    return BackendService("app", f"{name}.app.svc.cluster.local", port)


def gateway(*listeners: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "edge", "name": "edge"},
        "spec": {"gatewayClassName": "istio", "listeners": list(listeners)},
    }


def tls_route(name: str, *backends: tuple[str, int], hostnames: list[str] | None = None, **ref: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "parentRefs": [{"name": "edge", "namespace": "edge", **ref}],
        "rules": [{"backendRefs": [{"name": b, "port": 443, "weight": w} for b, w in backends]}],
    }
    if hostnames is not None:
        spec["hostnames"] = hostnames
    created = f"2026-01-0{len(name) % 9 + 1}T00:00:00Z"
    return {"metadata": {"namespace": "app", "name": name, "generation": 2, "creationTimestamp": created}, "spec": spec}


def tcp_route(name: str, *backends: tuple[str, int], **ref: Any) -> dict[str, Any]:
    route = tls_route(name, *backends, **ref)
    for item in route["spec"]["rules"][0]["backendRefs"]:
        item["port"] = 9000
    return route


def translate(gw: dict[str, Any], *, tls: list[Any] = (), tcp: list[Any] = (), http: list[Any] = ()) -> Any:  # type: ignore[assignment]
    return translate_ingress(
        gateways=[gw],
        http_routes=list(http),
        tls_routes=list(tls),
        tcp_routes=list(tcp),
        k8s_services=SERVICES,
        find_secret=lambda ns, name: None,
        namespace_labels={},
    )


def accepted(out: Any, name: str) -> tuple[bool, str]:
    status = next(s for s in out.status if s.name == name)
    condition = status.parents[0].conditions[0]
    return condition.status, condition.reason


# -- translation ----------------------------------------------------------------------------------------------
def test_tls_routes_become_virtual_hosts_by_server_name_most_specific_first() -> None:
    out = translate(
        gateway(PASSTHROUGH),
        tls=[
            tls_route("any", ("three", 1)),
            tls_route("wild", ("two", 1), hostnames=["*.example.com"]),
            tls_route("exact", ("one", 3), ("two", 1), hostnames=["a.example.com"]),
        ],
    )
    (listener,) = out.configs[0].listeners
    assert listener.protocol is ListenerProtocol.TLS and listener.certificates == ()
    assert [(v.hostname, v.http) for v in listener.virtual_hosts] == [
        ("a.example.com", ()),
        ("*.example.com", ()),
        ("*", ()),
    ]
    assert listener.virtual_hosts[0].tcp_backends == (
        WeightedBackend(backend("one"), 3),
        WeightedBackend(backend("two"), 1),
    )
    assert all(accepted(out, n) == (True, "Accepted") for n in ("any", "wild", "exact"))
    assert {s.kind for s in out.status} == {"TLSRoute"}


def test_the_oldest_tls_route_wins_a_hostname() -> None:
    young = tls_route("younger-route", ("two", 1), hostnames=["a.example.com"])  # created on the 5th
    old = tls_route("old", ("one", 1), hostnames=["a.example.com"])  # created on the 4th
    out = translate(gateway(PASSTHROUGH), tls=[young, old])
    (vhost,) = out.configs[0].listeners[0].virtual_hosts
    assert vhost.tcp_backends == (WeightedBackend(backend("one"), 1),)


def test_route_kinds_attach_only_where_the_listener_supports_them() -> None:
    http_route = {
        "metadata": {"namespace": "app", "name": "web"},
        "spec": {"parentRefs": [{"name": "edge", "namespace": "edge", "sectionName": "tls"}]},
    }
    out = translate(
        gateway(PASSTHROUGH, HTTP, TCP),
        tls=[tls_route("on-http", ("one", 1), sectionName="http"), tls_route("anywhere", ("one", 1))],
        tcp=[tcp_route("on-tls", ("one", 1), sectionName="tls"), tcp_route("tcp", ("two", 1))],
        http=[http_route],
    )
    assert accepted(out, "on-http") == (False, "NotAllowedByListeners")
    assert accepted(out, "on-tls") == (False, "NotAllowedByListeners")
    assert accepted(out, "web") == (False, "NotAllowedByListeners")
    assert accepted(out, "anywhere") == accepted(out, "tcp") == (True, "Accepted")
    by_name = {item.name: item for item in out.configs[0].listeners}
    assert [v.hostname for v in by_name["tls"].virtual_hosts] == ["*"]
    assert by_name["http"].virtual_hosts == ()
    (tcp,) = by_name["tcp"].virtual_hosts
    assert (tcp.hostname, tcp.tcp_backends) == ("*", (WeightedBackend(backend("two", 9000), 1),))


def test_a_tls_route_outside_the_listener_hostname_is_not_attached() -> None:
    listener = dict(PASSTHROUGH, hostname="*.example.com")
    out = translate(gateway(listener), tls=[tls_route("far", ("one", 1), hostnames=["a.example.org"])])
    assert accepted(out, "far") == (False, "NoMatchingListenerHostname")
    out = translate(gateway(listener), tls=[tls_route("near", ("one", 1))])
    assert [v.hostname for v in out.configs[0].listeners[0].virtual_hosts] == ["*.example.com"]


def test_an_unknown_backend_keeps_its_share_and_says_so() -> None:
    out = translate(gateway(TCP), tcp=[tcp_route("tcp", ("one", 1), ("missing", 1))])
    (vhost,) = out.configs[0].listeners[0].virtual_hosts
    assert vhost.tcp_backends[1] == WeightedBackend(None, 1)
    resolved = out.status[0].parents[0].conditions[1]
    assert (resolved.status, resolved.reason) == (False, "BackendNotFound")


def test_attached_routes_count_only_kinds_the_listener_supports() -> None:
    gw = gateway(PASSTHROUGH, TCP, HTTP)
    routes = {
        "HTTPRoute": [tls_route("h", ("one", 1))],
        "TLSRoute": [tls_route("t", ("one", 1)), tls_route("t2", ("one", 1), sectionName="tls")],
        "TCPRoute": [tcp_route("c", ("one", 1))],
    }
    assert ingress_attached_routes(gw, routes) == {"tls": 2, "tcp": 1, "http": 1}


# -- wire form ------------------------------------------------------------------------------------------------
def _config(*listeners: IngressListener) -> GatewayConfig:
    return GatewayConfig("edge/edge", listeners)


def test_tls_and_tcp_listeners_survive_the_wire() -> None:
    config = _config(
        IngressListener(
            "tls", 9443, ListenerProtocol.TLS, "", (), (VirtualHost("a.b", (), (WeightedBackend(backend("one"), 2),)),)
        ),
        IngressListener(
            "tcp", 9000, ListenerProtocol.TCP, "", (), (VirtualHost("*", (), (WeightedBackend(None, 1),)),)
        ),
    )
    assert decode_gateway_config("edge/edge", pack_gateway_config(gateway_config_to_proto(config))) == config


@pytest.mark.parametrize(
    ("protocol", "vhost", "field"),
    [
        (ListenerProtocol.TLS, VirtualHost("*", (RouteRule(route="r", match=RouteMatch()),)), "http"),
        (ListenerProtocol.HTTP, VirtualHost("*", (), (WeightedBackend(backend("one"), 1),)), "tcp_backends"),
    ],
)
def test_backends_of_the_wrong_kind_for_a_listener_are_refused(
    protocol: ListenerProtocol, vhost: VirtualHost, field: str
) -> None:
    config = _config(IngressListener("l", 9443, protocol, "", (), (vhost,)))
    with pytest.raises(XdsConversionError, match=f"virtual_hosts\\[0\\].{field}"):
        decode_gateway_config("edge/edge", pack_gateway_config(gateway_config_to_proto(config)))


# -- routing --------------------------------------------------------------------------------------------------
ROUTER = IngressRouter(
    _config(
        IngressListener(
            "tls",
            9443,
            ListenerProtocol.TLS,
            "",
            (),
            (
                VirtualHost("a.example.com", (), (WeightedBackend(backend("one"), 1),)),
                VirtualHost("*.example.com", (), (WeightedBackend(backend("two"), 1),)),
                VirtualHost("*.b.example.com", (), ()),
            ),
        ),
        IngressListener(
            "tcp", 9000, ListenerProtocol.TCP, "", (), (VirtualHost("*", (), (WeightedBackend(None, 1),)),)
        ),
        IngressListener("http", 8080, ListenerProtocol.HTTP),
    )
)


@pytest.mark.parametrize(
    ("port", "name", "expected"),
    [
        (9443, "a.example.com", "a.example.com"),  # exact beats wildcard
        (9443, "z.example.com", "*.example.com"),
        (9443, "x.b.example.com", None),  # the most specific host has no backends: closed, not the next one
        (9443, "example.com", None),
        (9443, "", None),
        (9000, "", "*"),
        (8080, "", None),  # an HTTP port routes requests, not connections
        (1234, "a.example.com", None),
    ],
)
def test_a_connection_is_routed_by_its_server_name(port: int, name: str, expected: str | None) -> None:
    found = ROUTER.find_connection_route(port, name)
    assert (found.hostname if found is not None else None) == expected


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80), st.sampled_from([9443, 9000, 8080, 1]))
def test_any_server_name_gives_a_route_or_none(name: str, port: int) -> None:
    found = ROUTER.find_connection_route(port, name.lower())
    assert found is None or found.tcp_backends


# -- the passthrough listener's plan and its bounded read ----------------------------------------------------
@pytest.mark.parametrize(
    ("port", "name", "random", "expected"),
    [
        (9443, "a.example.com", 0.0, backend("one")),
        (9443, "nowhere.example", 0.0, Closed("no route for server name 'nowhere.example'")),
        (9443, "", 0.0, Closed("no route")),
        (9000, "", 0.5, Closed("the chosen backend did not resolve")),
    ],
)
def test_the_plan_of_a_connection(port: int, name: str, random: float, expected: object) -> None:
    assert plan_backend(ROUTER, port, name, random) == expected


def test_all_weights_zero_closes_the_connection() -> None:
    router = IngressRouter(
        _config(
            IngressListener(
                "tcp", 1, ListenerProtocol.TCP, "", (), (VirtualHost("*", (), (WeightedBackend(backend("one"), 0),)),)
            )
        )
    )
    assert plan_backend(router, 1, "", 0.3) == Closed("every backend has weight 0")


class Drip:
    """A client's bytes handed out in pieces, recording how much the reader asked for."""

    def __init__(self, data: bytes, piece: int, *, then_silence: bool = False) -> None:
        self.data, self.piece, self.then_silence = data, piece, then_silence
        self.asked: list[int] = []

    async def recv(self, n: int) -> bytes:
        self.asked.append(n)
        if not self.data and self.then_silence:
            await asyncio.sleep(3600)
        out, self.data = self.data[: min(n, self.piece)], self.data[min(n, self.piece) :]
        return out


async def test_read_hello_returns_the_bytes_read_and_the_server_name() -> None:
    hello = record_with_name(b"drip.example")
    drip = Drip(hello + b"after", 7)
    data, found = await read_hello(drip.recv, 5.0)
    assert found.server_name == "drip.example" and hello.startswith(data[: len(hello)]) and len(data) >= len(hello)


@pytest.mark.parametrize(
    ("drip", "reason"),
    [
        (Drip(b"\x16\x03\x01\x40\x00" + b"\x01\x00\x3f\xfb" + b"\x00" * 40000, 1000), "does not fit"),
        (Drip(b"\x16\x03\x01\x00\x10", 5, then_silence=True), "no whole ClientHello within 0.2s"),
        (Drip(b"\x16\x03\x01", 3), "closed before"),
        (Drip(b"GET / HTTP/1.1\r\n", 100), "not a TLS handshake record"),
    ],
)
async def test_read_hello_refuses_within_its_bounds(drip: Drip, reason: str) -> None:
    with pytest.raises(HelloRefusedError, match=reason):
        await read_hello(drip.recv, 0.2, limit=HELLO_LIMIT)
    assert sum(min(n, drip.piece) for n in drip.asked) <= HELLO_LIMIT  # never read past the limit


def test_a_terminated_tls_connection_takes_the_listener_its_handshake_picked() -> None:
    cert = ()
    to = {name: (VirtualHost("*", tcp_backends=(WeightedBackend(backend(name, 9000), 1),)),) for name in ("one", "two")}
    exact = IngressListener("exact", 9443, ListenerProtocol.TLS_TERMINATE, "a.example", cert, to["one"])
    rest = IngressListener("rest", 9443, ListenerProtocol.TLS_TERMINATE, "", cert, to["two"])
    router = IngressRouter(GatewayConfig("edge/edge", (exact, rest)))
    # the handshake's pick holds, whatever name the plan is given (the decrypted stream carries none)
    assert plan_backend(router, 9443, "", 0.5, "exact") == backend("one", 9000)
    assert plan_backend(router, 9443, "", 0.5, "rest") == backend("two", 9000)
    # no pick (a client without server name on a port that verifies no client): the listener without hostname
    assert plan_backend(router, 9443, "", 0.5) == backend("two", 9000)
    assert plan_backend(router, 9443, "", 0.5, "gone") == backend("two", 9000)  # an unknown listener: picked anew
