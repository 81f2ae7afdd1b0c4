"""Gateway API listener conflicts at an ingress Gateway (class ``istio``), as istiod computes and reports them
(:mod:`ambit.controlplane.translate.listeners` rule 3, :mod:`ambit.controlplane.gateway.ingress_status` rule 6,
:mod:`ambit.controlplane.translate.ingress` rule 8). The tables are istiod's own cases
(pilot/pkg/config/kube/gatewaycommon/listener_conflict_test.go), with the Gateway's own listeners where istiod's
use a ListenerSet (Ambit has none; the winners-only rule is the same)."""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.gateway.ingress_status import ingress_status
from ambit.controlplane.gateway.status import Deployed
from ambit.controlplane.translate.ingress import served_listeners, translate_ingress
from ambit.controlplane.translate.listeners import (
    CONFLICT_MESSAGE,
    conflict_reason,
    judge_listeners,
    listener_conflicts,
    listeners_distinct,
)
from ambit.model.ingress import ListenerProtocol
from ambit.model.workload import Service
from ambit.tls.certs import issue_server_cert, new_ca

NOW = time.time()
PAIR = issue_server_cert(
    new_ca("conflict test CA", now=NOW), common_name="a.com", dns_names=["a.com"], ip_addresses=[], now=NOW
)
SECRET = {
    "metadata": {"name": "cert", "namespace": "infra"},
    "type": "kubernetes.io/tls",
    "data": {"tls.crt": base64.b64encode(PAIR.cert_pem).decode(), "tls.key": base64.b64encode(PAIR.key_pem).decode()},
}


def listener(name: str, port: int, protocol: str, hostname: str | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "port": port, "protocol": protocol, **extra}
    if hostname is not None:
        out["hostname"] = hostname
    if protocol in ("HTTPS", "TLS") and "tls" not in extra:
        out["tls"] = {"mode": "Terminate", "certificateRefs": [{"name": "cert"}]}
    return out


def gateway(*listeners: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "gw", "namespace": "infra", "generation": 3},
        "spec": {"gatewayClassName": "istio", "listeners": list(listeners)},
    }


def find_secret(namespace: str, name: str) -> dict[str, Any] | None:
    return SECRET if (namespace, name) == ("infra", "cert") else None


def conflicts(*listeners: dict[str, Any]) -> dict[str, str]:
    judged = judge_listeners(gateway(*listeners), find_secret)
    return {j.name: j.conflicted[1] for j in judged if j.conflicted[0]}


# -- istiod's TestListenersDistinct and TestListenerConflictReason --------------------------------------------
DISTINCT = [
    ("different hostnames", ("HTTP", 80, "a.com"), ("HTTP", 80, "b.com"), True),
    ("same hostname", ("HTTP", 80, "a.com"), ("HTTP", 80, "a.com"), False),
    ("http vs tcp", ("HTTP", 80, "a.com"), ("TCP", 80, None), False),
    ("nil hostname vs explicit wildcard", ("HTTPS", 443, None), ("HTTPS", 443, "*"), False),
    ("nil hostname vs specific hostname", ("HTTPS", 443, None), ("HTTPS", 443, "httpbin.example.com"), True),
    ("https vs tls different hostnames", ("HTTPS", 443, "a.com"), ("TLS", 443, "b.com"), True),
    ("https vs tls same hostname", ("HTTPS", 443, "a.com"), ("TLS", 443, "a.com"), False),
    ("tcp vs tcp same port", ("TCP", 8080, None), ("TCP", 8080, None), False),
    ("tcp vs udp same port", ("TCP", 8080, None), ("UDP", 8080, None), False),
    ("different ports", ("HTTP", 80, "a.com"), ("HTTP", 81, "a.com"), True),
    ("http vs https, other hostnames", ("HTTP", 443, "a.com"), ("HTTPS", 443, "b.com"), True),
    ("http vs https, no hostnames", ("HTTP", 443, None), ("HTTPS", 443, None), False),
]


def _raw(spec: tuple[str, int, str | None]) -> dict[str, Any]:
    protocol, port, hostname = spec
    return listener("x", port, protocol, hostname)


@pytest.mark.parametrize(("case", "a", "b", "want"), DISTINCT, ids=[c[0] for c in DISTINCT])
def test_two_listeners_are_distinct_exactly_as_istiod_decides(case: str, a: Any, b: Any, want: bool) -> None:
    assert listeners_distinct(_raw(a), _raw(b)) is want
    assert listeners_distinct(_raw(b), _raw(a)) is want


REASONS = [
    ("http vs tcp", ("HTTP", 80, "a.com"), ("TCP", 80, None), "ProtocolConflict"),
    ("tcp vs udp", ("TCP", 8080, None), ("UDP", 8080, None), "ProtocolConflict"),
    ("http same hostname", ("HTTP", 80, "a.com"), ("HTTP", 80, "a.com"), "HostnameConflict"),
    ("https vs tls same hostname", ("HTTPS", 443, "a.com"), ("TLS", 443, "a.com"), "ProtocolConflict"),
    ("tcp vs tcp same port", ("TCP", 8080, None), ("TCP", 8080, None), "ProtocolConflict"),
]


@pytest.mark.parametrize(("case", "a", "b", "want"), REASONS, ids=[c[0] for c in REASONS])
def test_the_conflict_reason_is_istiod_s(case: str, a: Any, b: Any, want: str) -> None:
    assert conflict_reason(_raw(a), _raw(b)) == want


# -- istiod's Compute* cases on one Gateway -------------------------------------------------------------------
def test_of_two_listeners_with_one_port_and_hostname_the_first_wins() -> None:
    assert conflicts(listener("first", 80, "HTTP", "shared.com"), listener("second", 80, "HTTP", "shared.com")) == {
        "second": "HostnameConflict"
    }


def test_only_winning_listeners_take_a_slot() -> None:
    found = conflicts(
        listener("winner", 80, "HTTP", "foo.com"),
        listener("dropped", 80, "HTTP", "foo.com"),
        listener("other", 80, "HTTP", "bar.com"),
        listener("same", 80, "HTTP", "foo.com"),
    )
    assert found == {"dropped": "HostnameConflict", "same": "HostnameConflict"}
    # a TCP listener that lost frees the port for nothing else: the later HTTP one still conflicts with the winner
    found = conflicts(
        listener("web", 80, "HTTP", "a.com"), listener("tcp", 80, "TCP"), listener("web2", 80, "HTTP", "b.com")
    )
    assert found == {"tcp": "ProtocolConflict"}


def test_no_hostname_conflicts_with_an_explicit_wildcard() -> None:
    assert conflicts(listener("wildcard", 443, "HTTPS"), listener("also-wildcard", 443, "HTTPS", "*")) == {
        "also-wildcard": "HostnameConflict"
    }


def test_a_tcp_listener_beside_an_http_one_and_a_udp_one_beside_tcp_are_protocol_conflicts() -> None:
    assert conflicts(listener("gw", 80, "HTTP", "gw.com"), listener("tcp", 80, "TCP")) == {"tcp": "ProtocolConflict"}
    assert conflicts(listener("tcp", 8080, "TCP"), listener("udp", 8080, "UDP")) == {"udp": "ProtocolConflict"}


def test_https_beside_tls_passthrough_on_one_port_is_served_when_their_hostnames_differ() -> None:
    passthrough = listener("pass", 443, "TLS", "b.com", tls={"mode": "Passthrough"})
    judged = judge_listeners(gateway(listener("web", 443, "HTTPS", "a.com"), passthrough), find_secret)
    assert [(j.name, j.ready, j.conflicted[0]) for j in judged] == [("web", True, False), ("pass", True, False)]
    assert [j.name for j in served_listeners(judged)] == ["web", "pass"]


def test_conflicts_are_decided_before_unsupported_protocols_so_an_invalid_listener_still_holds_its_slot() -> None:
    # istiod computes conflicts on the spec alone, before buildListener judges the protocol
    judged = judge_listeners(gateway(listener("udp", 80, "UDP"), listener("web", 80, "HTTP")), find_secret)
    assert [(j.name, j.accepted[1], j.conflicted[1]) for j in judged] == [
        ("udp", "UnsupportedProtocol", "NoConflicts"),
        ("web", "ProtocolConflict", "ProtocolConflict"),
    ]


def test_a_conflicted_listener_looks_up_no_certificate() -> None:
    asked: list[tuple[str, str]] = []

    def recording(namespace: str, name: str) -> dict[str, Any] | None:
        asked.append((namespace, name))
        return find_secret(namespace, name)

    other = listener("dup", 443, "HTTPS", "a.com")
    other["tls"] = {"certificateRefs": [{"name": "other-cert"}]}
    judge_listeners(gateway(listener("web", 443, "HTTPS", "a.com"), other), recording)
    assert asked == [("infra", "cert")]


# -- status: istiod's ReportListenerConflict (listenerset-protocol-conflict.status.yaml.golden) ---------------
def _listener_status(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next(item for item in status["listeners"] if item["name"] == name)


def test_a_conflicted_listener_reports_istiod_s_three_conditions_and_its_kinds() -> None:
    gw = gateway(listener("gateway-listener", 80, "HTTP", "gateway-listener.com"), listener("tcp", 80, "TCP"))
    judged = judge_listeners(gw, find_secret)
    attached = {"gateway-listener": 1, "tcp": 2}  # routes naming each listener by sectionName
    status = ingress_status(gw, Deployed(service_exists=True), judged, host="h", addresses=(), attached=attached)
    lost = _listener_status(status, "tcp")
    assert [(c["type"], c["status"], c["reason"], c["message"]) for c in lost["conditions"]] == [
        ("Accepted", "False", "ProtocolConflict", CONFLICT_MESSAGE),
        ("Conflicted", "True", "ProtocolConflict", CONFLICT_MESSAGE),
        ("Programmed", "False", "ProtocolConflict", CONFLICT_MESSAGE),
    ]
    assert CONFLICT_MESSAGE == "Listener has a conflict with another listener attached to the same Gateway"
    assert lost["supportedKinds"] == [{"group": "gateway.networking.k8s.io", "kind": "TCPRoute"}]
    assert lost["attachedRoutes"] == 0 and _listener_status(status, "gateway-listener")["attachedRoutes"] == 1
    won = _listener_status(status, "gateway-listener")
    assert {c["type"]: (c["status"], c["reason"]) for c in won["conditions"]} == {
        "Accepted": ("True", "Accepted"),
        "Conflicted": ("False", "NoConflicts"),
        "Programmed": ("True", "Programmed"),
        "ResolvedRefs": ("True", "ResolvedRefs"),
    }
    accepted = next(c for c in status["conditions"] if c["type"] == "Accepted")
    assert (accepted["status"], accepted["reason"]) == ("True", "ListenersNotValid")
    assert accepted["message"] == "One or more of the Gateway's listeners are invalid"


def test_a_conflicted_listener_with_an_unsupported_route_kind_also_reports_invalid_route_kinds() -> None:
    tcp = listener("tcp", 80, "TCP", allowedRoutes={"kinds": [{"kind": "HTTPRoute"}]})
    gw = gateway(listener("web", 80, "HTTP"), tcp)
    status = ingress_status(gw, Deployed(service_exists=True), judge_listeners(gw, find_secret), host="h", addresses=())
    lost = _listener_status(status, "tcp")
    assert [(c["type"], c["reason"]) for c in lost["conditions"]][-1] == ("ResolvedRefs", "InvalidRouteKinds")
    assert lost["supportedKinds"] == []


# -- which listeners are served -------------------------------------------------------------------------------
def test_plain_http_beside_https_with_other_hostnames_serves_the_kind_first_in_name_order() -> None:
    plain, tls = listener("a-plain", 8443, "HTTP", "plain.com"), listener("b-tls", 8443, "HTTPS", "a.com")
    judged = judge_listeners(gateway(tls, plain), find_secret)
    assert all(j.ready for j in judged)  # istiod's status: both Programmed
    assert [j.name for j in served_listeners(judged)] == ["a-plain"]  # istiod skips the TLS server after it
    plain, tls = listener("b-plain", 8443, "HTTP", "plain.com"), listener("a-tls", 8443, "HTTPS", "a.com")
    judged = judge_listeners(gateway(plain, tls), find_secret)
    assert [j.name for j in served_listeners(judged)] == ["a-tls"]
    other_port = listener("z-plain", 8080, "HTTP")
    judged = judge_listeners(gateway(plain, tls, other_port), find_secret)
    assert [j.name for j in served_listeners(judged)] == ["a-tls", "z-plain"]


SERVICES = [Service("echo", "infra", "echo.infra.svc.cluster.local")]


def _route(namespace: str, section: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "grab", "namespace": namespace, "generation": 1},
        "spec": {
            "parentRefs": [{"name": "gw", "namespace": "infra", "sectionName": section}],
            "rules": [{"backendRefs": [{"name": "echo", "namespace": "infra", "port": 80}]}],
        },
    }


def test_a_tenant_of_another_namespace_cannot_ride_a_permissive_listener_that_lost_a_conflict() -> None:
    """The attack: the owner's listener admits only its own namespace; a later duplicate admits all namespaces. If
    the duplicate were served, a tenant's route could take the owner's host and port."""
    owner = listener("web", 8080, "HTTP", "shop.example.com")
    duplicate = listener("open", 8080, "HTTP", "shop.example.com", allowedRoutes={"namespaces": {"from": "All"}})
    out = translate_ingress(
        gateways=[gateway(owner, duplicate)],
        http_routes=[
            _route("tenant", "open"),
            _route("tenant", "web") | {"metadata": {"name": "grab2", "namespace": "tenant"}},
        ],
        k8s_services=SERVICES,
        find_secret=find_secret,
        namespace_labels={},
    )
    (config,) = out.configs
    assert [(item.name, item.protocol) for item in config.listeners] == [("web", ListenerProtocol.HTTP)]
    assert config.listeners[0].virtual_hosts == ()  # nothing of the tenant's is served there
    by_name = {s.name: s.parents[0].conditions[0] for s in out.status}
    assert (by_name["grab"].status, by_name["grab"].reason) == (False, "NotAllowedByListeners")
    assert (by_name["grab2"].status, by_name["grab2"].reason) == (False, "NotAllowedByListeners")


# -- properties -----------------------------------------------------------------------------------------------
_listener_strategy = st.fixed_dictionaries(
    {
        "port": st.sampled_from([80, 443, 8080]),
        "protocol": st.sampled_from(["HTTP", "HTTPS", "TLS", "TCP", "UDP", "HBONE", "", 7]),
        "hostname": st.sampled_from(["", "*", "a.com", "b.com", None]),
    }
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_listener_strategy, max_size=8))
def test_winners_are_pairwise_distinct_and_every_loser_meets_an_earlier_winner(items: list[dict[str, Any]]) -> None:
    raw = [{"name": f"l{i}", **item} for i, item in enumerate(items)]
    lost = listener_conflicts(raw)
    winners = [item for item in raw if id(item) not in lost]
    for i, a in enumerate(winners):
        assert all(listeners_distinct(a, b) for b in winners[i + 1 :])
    for index, item in enumerate(raw):
        if id(item) in lost:
            earlier = [w for w in winners if raw.index(w) < index]
            assert any(not listeners_distinct(item, w) for w in earlier)
    if raw:
        assert id(raw[0]) not in lost
    judged = judge_listeners(gateway(*raw), find_secret)  # never raises, whatever the spec holds
    assert {j.name for j in judged if j.conflicted[0]} == {item["name"] for item in raw if id(item) in lost}


def test_istiod_s_golden_gateway_of_two_distinct_http_listeners_reports_no_conflict() -> None:
    """pilot/pkg/config/kube/gateway/testdata/listenerset-hostname-conflict: the Gateway's own listeners (port 80,
    HTTP, two hostnames) as its .status.yaml.golden has them."""
    gw = gateway(
        listener("gateway-listener", 80, "HTTP", "gateway-listener.com"),
        listener("hostname-conflict-with-gateway-listener", 80, "HTTP", "hostname-conflict-with-gateway-listener.com"),
    )
    status = ingress_status(gw, Deployed(service_exists=True), judge_listeners(gw, find_secret), host="h", addresses=())
    golden = [
        ("Accepted", "True", "Accepted", "No errors found"),
        ("Conflicted", "False", "NoConflicts", "No errors found"),
        ("Programmed", "True", "Programmed", "No errors found"),
        ("ResolvedRefs", "True", "ResolvedRefs", "No errors found"),
    ]
    for item in status["listeners"]:
        assert [(c["type"], c["status"], c["reason"], c["message"]) for c in item["conditions"]] == golden
        assert item["supportedKinds"] == [
            {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"},
            {"group": "gateway.networking.k8s.io", "kind": "GRPCRoute"},
        ]


def test_a_listener_whose_certificate_does_not_resolve_makes_the_gateway_listeners_not_valid() -> None:
    """istiod's reportGatewayStatus counts the listeners buildListener programmed: one with a missing Secret is
    Accepted but not programmed, so the Gateway is Accepted with ListenersNotValid; with none valid, not Accepted."""
    missing = listener("web", 443, "HTTPS", "a.com")
    missing["tls"] = {"certificateRefs": [{"name": "absent"}]}
    gw = gateway(listener("plain", 80, "HTTP"), missing)
    status = ingress_status(gw, Deployed(service_exists=True), judge_listeners(gw, find_secret), host="h", addresses=())
    accepted = next(c for c in status["conditions"] if c["type"] == "Accepted")
    assert (accepted["status"], accepted["reason"]) == ("True", "ListenersNotValid")
    gw = gateway(missing)
    status = ingress_status(gw, Deployed(service_exists=True), judge_listeners(gw, find_secret), host="h", addresses=())
    accepted = next(c for c in status["conditions"] if c["type"] == "Accepted")
    assert (accepted["status"], accepted["reason"], accepted["message"]) == (
        "False",
        "ListenersNotValid",
        "None of the Gateway's listeners are valid",
    )
