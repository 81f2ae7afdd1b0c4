"""Which name a request to a ``DYNAMIC_DNS`` wildcard ServiceEntry host goes to (pure): the client's ``Host`` or SNI
is attacker-controlled, so anything the entry's host does not cover, an IP literal, a name with odd characters or
one too long is refused 404 before anything is resolved; a covered name becomes a hostname endpoint at the port's
target port, with originated TLS naming it (upstream TestWaypointAsEgressGatewayForWildcardEntries)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.model.destination_policy import ClientTls, TlsMode
from ambit.model.workload import AppProtocol, NetworkAddress, PortMapping, Service
from ambit.waypoint.destinations import PLAIN, UNRESOLVED, Endpoint, Refusal, Transport
from ambit.waypoint.dynamic_hosts import (
    covers,
    dynamic_protocol,
    judge_name,
    name_of_host,
    plan_request,
    plan_server_name,
)

WILDCARD = "*.external.svc.cluster.local"
SERVICE = Service(
    name="external-wildcard",
    namespace="apps",
    hostname=WILDCARD,
    vips=(NetworkAddress("", ipaddress.ip_address("240.240.0.1")),),
    ports=(
        PortMapping(80, 0, AppProtocol.HTTP11),
        PortMapping(443, 0, AppProtocol.TLS),
        PortMapping(8080, 443, AppProtocol.HTTP11),
        PortMapping(9000, 0, AppProtocol.TCP),
        PortMapping(9001, 0, AppProtocol.UNKNOWN),
    ),
)
SIMPLE = Transport(tls=ClientTls(mode=TlsMode.SIMPLE, insecure_skip_verify=True))


@pytest.mark.parametrize(
    ("host", "name"),
    [
        ("external.external.svc.cluster.local", "external.external.svc.cluster.local"),
        ("External.EXTERNAL.svc.cluster.local", "external.external.svc.cluster.local"),
        ("external.external.svc.cluster.local.", "external.external.svc.cluster.local"),
        ("a.b.external.svc.cluster.local", "a.b.external.svc.cluster.local"),
        ("external.external.svc.cluster.local:8080", "external.external.svc.cluster.local"),
    ],
)
def test_a_covered_host_is_the_name_to_resolve(host: str, name: str) -> None:
    found = plan_request(SERVICE, 80, host, PLAIN)
    assert isinstance(found, Endpoint)
    assert found.resolve_hostname == name and found.ip == UNRESOLVED and found.port == 80
    assert found.workload.hostname == name and found.workload.uid == f"apps/{WILDCARD}/dynamic/{name}"


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("external.non-existent.svc.cluster.local", "does not match"),  # upstream: "overriding with invalid Host"
        ("external.svc.cluster.local", "does not match"),  # the wildcard's parent
        (".external.svc.cluster.local", "not a host name"),  # an empty first label
        ("evil.com", "does not match"),
        ("external.svc.cluster.local.evil.com", "does not match"),
        ("10.0.0.1", "IP literal"),
        ("10.0.0.1:80", "IP literal"),
        ("[::1]:80", "IP literal"),
        ("[::1]", "IP literal"),
        ("127.1", "IP literal"),
        ("2130706433", "IP literal"),
        ("", "empty host"),
        ("a b.external.svc.cluster.local", "not a host name"),
        ("a\x00.external.svc.cluster.local", "not a host name"),
        ("a/b.external.svc.cluster.local", "not a host name"),
        ("*.external.svc.cluster.local", "not a host name"),  # the wildcard itself
        ("é.external.svc.cluster.local", "not a host name"),
        ("-a.external.svc.cluster.local", "not a host name"),
        ("a..external.svc.cluster.local", "not a host name"),
        ("x" * 64 + ".external.svc.cluster.local", "not a host name"),
        (".".join(["a"] * 120) + ".external.svc.cluster.local", "longer than 253"),
        ("a" * 100_000, "longer than 253"),
        ("external.external.svc.cluster.local:", "no valid port"),
        ("external.external.svc.cluster.local:http", "no valid port"),
        ("external.external.svc.cluster.local:123456", "no valid port"),
        ("::1", "not a host name"),
    ],
)
def test_a_host_outside_the_wildcard_or_not_a_name_is_refused_404(host: str, why: str) -> None:
    found = plan_request(SERVICE, 80, host, PLAIN)
    assert isinstance(found, Refusal), host
    assert found.status == 404 and why in found.reason
    assert len(found.reason) < 300  # the client's text is quoted, not copied whole


def test_the_port_dialled_is_the_target_port_never_the_hosts() -> None:
    found = plan_request(SERVICE, 8080, "external.external.svc.cluster.local:9999", PLAIN)
    assert isinstance(found, Endpoint) and found.port == 443


def test_only_http_ports_forward_requests_by_host_and_only_tls_ports_by_server_name() -> None:
    assert [dynamic_protocol(SERVICE, p) for p in (80, 443, 8080, 9000, 9001, 1)] == [
        AppProtocol.HTTP11,
        AppProtocol.TLS,
        AppProtocol.HTTP11,
        None,
        None,
        None,
    ]
    for port in (443, 9000, 9001, 1):
        assert plan_request(SERVICE, port, "external.external.svc.cluster.local", PLAIN) is None
    for port in (80, 8080, 9000, 9001):
        refused = plan_server_name(SERVICE, port, "external.external.svc.cluster.local", PLAIN)
        assert isinstance(refused, Refusal) and refused.status == 503


def test_a_server_name_is_judged_as_a_host_is() -> None:
    found = plan_server_name(SERVICE, 443, "external.external.svc.cluster.local", PLAIN)
    assert isinstance(found, Endpoint) and found.resolve_hostname == "external.external.svc.cluster.local"
    assert found.port == 443
    for name in (None, "", "external.other.svc.cluster.local", "10.0.0.1"):
        refused = plan_server_name(SERVICE, 443, name, PLAIN)
        assert isinstance(refused, Refusal) and refused.status == 404, name


def test_originated_tls_names_the_resolved_host_unless_the_rule_gives_an_sni() -> None:
    found = plan_request(SERVICE, 8080, "external.external.svc.cluster.local", SIMPLE)
    assert isinstance(found, Endpoint)
    assert found.transport.sni == "external.external.svc.cluster.local" and found.port == 443
    fixed = Transport(tls=ClientTls(mode=TlsMode.SIMPLE, sni="fixed.example.com"), sni="fixed.example.com")
    kept = plan_request(SERVICE, 8080, "external.external.svc.cluster.local", fixed)
    assert isinstance(kept, Endpoint) and kept.transport.sni == "fixed.example.com"
    plain = plan_request(SERVICE, 80, "external.external.svc.cluster.local", PLAIN)
    assert isinstance(plain, Endpoint) and plain.transport == PLAIN


@pytest.mark.parametrize(
    ("pattern", "name", "covered"),
    [
        ("*.example.com", "a.example.com", True),
        ("*.example.com", "a.b.example.com", True),
        ("*.EXAMPLE.com.", "a.example.com", True),
        ("*.example.com", "example.com", False),
        ("*.example.com", "aexample.com", False),
        ("*.example.com", ".example.com", False),
        ("exact.example.com", "exact.example.com", True),
        ("exact.example.com", "a.exact.example.com", False),
        ("*", "anything.com", False),  # fail closed: the waypoint is not an open proxy
        ("*example.com", "a.example.com", False),
        ("*.", "a", False),
        ("*.*.example.com", "a.b.example.com", False),
        ("", "", False),
    ],
)
def test_coverage_is_a_suffix_under_a_whole_first_label_wildcard(pattern: str, name: str, covered: bool) -> None:
    assert covers(pattern, name) is covered


LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(st.lists(LABEL, min_size=1, max_size=4), st.booleans(), st.none() | st.integers(0, 65535))
def test_any_name_under_the_wildcard_is_accepted_lower_cased(labels: list[str], upper: bool, port: int | None) -> None:
    name = ".".join(labels) + WILDCARD[1:]
    if all(label.isdigit() for label in name.split(".")):
        return
    host = (name.upper() if upper else name) + (f":{port}" if port is not None else "")
    found = plan_request(SERVICE, 80, host, PLAIN)
    assert isinstance(found, Endpoint) and found.resolve_hostname == name


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=300))
def test_any_host_gives_an_endpoint_under_the_wildcard_or_a_404_and_never_raises(host: str) -> None:
    found = plan_request(SERVICE, 80, host, PLAIN)
    if isinstance(found, Endpoint):
        name = found.resolve_hostname
        assert name.endswith(WILDCARD[1:]) and len(name) <= 253 and name == name.lower()
        assert name.isascii() and not any(c in name for c in " /:[]*\x00")
    else:
        assert isinstance(found, Refusal) and found.status == 404


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab.-_:[]*0123456789"), max_size=80))
def test_judge_name_accepts_only_covered_host_names(name: str) -> None:
    judged = judge_name(name, WILDCARD)
    assert isinstance(judged, str | Refusal)
    if isinstance(judged, str):
        assert covers(WILDCARD, judged)
    hosted = name_of_host(name)
    assert isinstance(hosted, str | Refusal)
