"""The DNS proxy's pure decision (spec §9): aliases, wildcards, service choice, families, parse errors."""

from __future__ import annotations

import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdatatype
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.dns_state import mesh

from ambit.dns.answer import Answered, DnsClient, Forward, Malformed, decide, parse_query
from ambit.dns.forwarder import is_local_address
from ambit.dns.names import aliases, kube_fqdns, split, wildcards
from ambit.dns.resolvconf import parse_resolv_conf

DOMAIN = ("cluster", "local")


CLIENT = DnsClient(namespace="ns1")


def ask(host: str, rdtype: str = "A", client: DnsClient = CLIENT) -> Answered | Forward:
    query = dns.message.make_query(host, rdtype)
    return decide(mesh(), client, query)


def records(decision: Answered | Forward) -> list[tuple[str, str, str]]:
    assert isinstance(decision, Answered), decision
    assert decision.response.flags & dns.flags.AA
    assert decision.response.rcode() == dns.rcode.NOERROR
    out = []
    for rrset in decision.response.answer:
        for rdata in sorted(rrset, key=str):
            out.append((rrset.name.to_text(), dns.rdatatype.to_text(rrset.rdtype), rdata.to_text()))
    return out


# Names (zt:src/dns/server.rs test_to_kube_fqdns, test_get_wildcards).


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("name", ["name.ns1.svc.cluster.local"]),
        ("name.ns2", ["name.ns2.svc.cluster.local", "name.ns2.ns1.svc.cluster.local"]),
        ("name.ns2.svc", ["name.ns2.svc.cluster.local", "name.ns2.svc.svc.cluster.local"]),
        ("name.ns2.not-svc", ["name.ns2.not-svc.svc.cluster.local"]),
        ("pod.sub-domain.ns.svc", ["pod.sub-domain.ns.svc.cluster.local"]),
        ("pod.sub-domain.ns.not-svc", []),
        ("name.ns2.svc.cluster.local", []),
        ("www.google.com", ["www.google.com.svc.cluster.local"]),
    ],
)
def test_kubernetes_expansions_follow_the_pod_search_forms(host: str, expected: list[str]) -> None:
    assert [".".join(n) for n in kube_fqdns(split(host), "ns1", DOMAIN)] == expected


def test_wildcards_cover_each_parent_most_specific_first() -> None:
    assert wildcards(split("svc1")) == [("svc1",)]
    assert [".".join(n) for n in wildcards(split("svc1.ns1.svc.cluster.local"))] == [
        "svc1.ns1.svc.cluster.local",
        "*.ns1.svc.cluster.local",
        "*.svc.cluster.local",
        "*.cluster.local",
        "*.local",
    ]


def test_a_search_domain_expansion_is_stripped_back_to_the_asked_name() -> None:
    found = aliases(split("api.example.com.ns1.svc.cluster.local"), "ns1", DOMAIN)
    assert found[0].name == split("api.example.com.ns1.svc.cluster.local")
    stripped = [a for a in found if a.stripped is not None]
    assert stripped[0].name == split("api.example.com")
    assert len({a.name for a in found}) == len(found)


# Answers (zt:src/dns/server.rs lookup cases).


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("productpage.ns1.svc.cluster.local.", [("productpage.ns1.svc.cluster.local.", "A", "198.19.0.9")]),
        ("productpage.ns1.", [("productpage.ns1.", "A", "198.19.0.9")]),
        ("productpage.", [("productpage.", "A", "198.19.0.9")]),
        ("productpage.ns1.svc.", [("productpage.ns1.svc.", "A", "198.19.0.9")]),
        ("example.ns2.", [("example.ns2.", "A", "198.19.0.10")]),
        ("example.ns2.svc.cluster.local.", [("example.ns2.svc.cluster.local.", "A", "198.19.0.10")]),
        ("api.example.com.", [("api.example.com.", "A", "240.240.0.1")]),
        ("foo.wildcard.", [("foo.wildcard.", "A", "198.19.10.10")]),
        ("a.b.wildcard.", [("a.b.wildcard.", "A", "198.19.11.11")]),
        ("foo.svc.mesh.company.net.", [("foo.svc.mesh.company.net.", "A", "198.19.1.3")]),
        (
            "foo.svc.mesh.company.net.ns1.svc.cluster.local.",
            [("foo.svc.mesh.company.net.ns1.svc.cluster.local.", "A", "198.19.1.3")],
        ),
        ("everywhere.io.", [("everywhere.io.", "A", "198.19.3.1")]),
        ("canonical.svc.", [("canonical.svc.", "A", "198.19.4.4")]),
        (
            "headless.ns1.svc.cluster.local.",
            [
                ("headless.ns1.svc.cluster.local.", "A", "198.18.30.30"),
                ("headless.ns1.svc.cluster.local.", "A", "198.18.31.31"),
            ],
        ),
        ("ProductPage.NS1.", [("ProductPage.NS1.", "A", "198.19.0.9")]),
    ],
)
def test_mesh_names_are_answered_with_their_addresses(host: str, expected: list[tuple[str, str, str]]) -> None:
    assert records(ask(host)) == expected


def test_a_search_domain_expansion_is_answered_with_a_cname_to_the_asked_name() -> None:
    assert records(ask("api.example.com.ns1.svc.cluster.local.")) == [
        ("api.example.com.ns1.svc.cluster.local.", "CNAME", "api.example.com."),
        ("api.example.com.", "A", "240.240.0.1"),
    ]
    assert records(ask("productpage.ns1.ns1.svc.cluster.local.")) == [
        ("productpage.ns1.ns1.svc.cluster.local.", "CNAME", "productpage.ns1."),
        ("productpage.ns1.", "A", "198.19.0.9"),
    ]


def test_aaaa_gets_the_v6_addresses_and_a_family_without_any_is_an_empty_answer() -> None:
    assert records(ask("dual.localhost.", "AAAA")) == [("dual.localhost.", "AAAA", "2001:db8::8329")]
    assert records(ask("api.example.com.", "AAAA")) == [("api.example.com.", "AAAA", "2001:2::1")]
    assert records(ask("ipv6.localhost.")) == []
    assert records(ask("ipv4.localhost.", "AAAA")) == []
    assert records(ask("v4only.ns1.svc.cluster.local.", "AAAA")) == []
    assert records(ask("headless.ns1.svc.cluster.local.", "AAAA")) == [
        ("headless.ns1.svc.cluster.local.", "AAAA", "2001:db8::30"),
        ("headless.ns1.svc.cluster.local.", "AAAA", "2001:db8::31"),
    ]


def test_aaaa_is_empty_when_ipv6_is_off() -> None:
    query = dns.message.make_query("dual.localhost.", "AAAA")
    decision = decide(mesh(), CLIENT, query, ipv6=False)
    assert records(decision) == []


def test_only_vips_on_the_clients_network_are_answered() -> None:
    assert records(ask("nw2-only.ns1.svc.cluster.local.")) == []
    assert records(ask("nw2-only.ns1.svc.cluster.local.", client=DnsClient("ns1", "nw2"))) == [
        ("nw2-only.ns1.svc.cluster.local.", "A", "198.19.2.1")
    ]


@pytest.mark.parametrize(
    ("host", "rdtype"),
    [
        ("productpage.ns1.", "NS"),
        ("productpage.ns1.", "TXT"),
        ("example.", "A"),  # a short name of another namespace
        ("www.bing.com.", "A"),
        ("headless.example.com.", "A"),  # no VIP and not under svc.cluster.local
        ("headless.pod0.ns1.svc.cluster.local.", "A"),
        (".", "A"),
    ],
)
def test_everything_else_is_forwarded(host: str, rdtype: str) -> None:
    assert isinstance(ask(host, rdtype), Forward)


def test_a_label_holding_a_dot_never_passes_for_two() -> None:
    query = dns.message.make_query(dns.name.Name((b"api.example", b"com", b"")), "A")
    assert isinstance(decide(mesh(), CLIENT, query), Forward)


def test_the_answer_keeps_the_query_id_and_recursion_flag() -> None:
    query = dns.message.make_query("api.example.com.", "A", id=4242)
    decision = decide(mesh(), CLIENT, query)
    assert isinstance(decision, Answered)
    assert decision.response.id == 4242
    assert decision.response.flags & dns.flags.RD
    assert decision.response.answer[0].ttl == 30


def test_the_shuffle_decides_the_order() -> None:
    query = dns.message.make_query("headless.ns1.svc.cluster.local.", "A")
    decision = decide(mesh(), CLIENT, query, shuffle=lambda addresses: addresses.reverse())
    assert isinstance(decision, Answered)
    assert [r.to_text() for r in decision.response.answer[0]] == ["198.18.31.31", "198.18.30.30"]


# Parsing.


def test_a_query_parses_and_non_queries_are_refused_or_dropped() -> None:
    query = dns.message.make_query("a.example.", "A")
    assert isinstance(parse_query(query.to_wire()), dns.message.Message)
    response = dns.message.make_response(query)
    assert parse_query(response.to_wire()) == Malformed("response")
    assert parse_query(b"\x00\x01") == Malformed("short")
    notify = dns.message.make_query("a.example.", "SOA")
    notify.set_opcode(dns.opcode.NOTIFY)
    refused = parse_query(notify.to_wire())
    assert isinstance(refused, Answered)
    assert refused.response.rcode() == dns.rcode.NOTIMP
    empty = dns.message.Message(id=7)
    formerr = parse_query(empty.to_wire())
    assert isinstance(formerr, Answered)
    assert formerr.response.rcode() == dns.rcode.FORMERR


@settings(max_examples=500)
@given(st.binary(max_size=600))
def test_any_bytes_parse_or_are_dropped_and_never_raise(wire: bytes) -> None:
    result = parse_query(wire)
    if isinstance(result, dns.message.Message):
        decision = decide(mesh(), CLIENT, result)
        if isinstance(decision, Answered):
            decision.response.to_wire()
    elif isinstance(result, Answered):
        result.response.to_wire()


@given(st.lists(st.sampled_from(["a", "b", "svc", "ns1", "cluster", "local", "*", "x-y"]), max_size=8))
def test_any_label_sequence_is_decided(labels: list[str]) -> None:
    host = ".".join(labels) + "."
    for rdtype in ("A", "AAAA"):
        decision = decide(mesh(), CLIENT, dns.message.make_query(host, rdtype))
        assert isinstance(decision, Answered | Forward)


# resolv.conf.


def test_resolv_conf_is_read_as_the_resolver_reads_it() -> None:
    conf = parse_resolv_conf(
        "# kubelet\nnameserver 198.19.0.10\nnameserver fe80::1%eth0\nnameserver bogus\n"
        "search ns1.svc.cluster.local svc.cluster.local cluster.local\n"
        "options ndots:5 timeout:2 attempts:9 rotate\n"
        "nameserver 198.19.0.11 ; two\nnameserver 198.19.0.12\nnameserver 198.19.0.13\n"
    )
    assert conf.nameservers == ("198.19.0.10", "198.19.0.11", "198.19.0.12")
    assert conf.search == ("ns1.svc.cluster.local", "svc.cluster.local", "cluster.local")
    assert (conf.ndots, conf.timeout, conf.attempts) == (5, 2.0, 5)
    assert parse_resolv_conf("").nameservers == ("127.0.0.1",)


@given(st.text(max_size=400))
def test_any_resolv_conf_text_is_read(text: str) -> None:
    conf = parse_resolv_conf(text)
    assert 1 <= len(conf.nameservers) <= 3


@pytest.mark.parametrize(
    ("server", "local"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", True),
        ("::", True),
        ("::ffff:0.0.0.0", True),
        ("198.18.0.10", False),
        ("::ffff:198.18.0.10", False),
        ("2001:db8::53", False),
    ],
)
def test_a_nameserver_on_this_host_is_never_forwarded_to(server: str, local: bool) -> None:
    """The forwarder skips nameservers that would be the host itself (the bench found the mapped and unspecified
    forms passing ``is_loopback``)."""
    assert is_local_address(server) is local
