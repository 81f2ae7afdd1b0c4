"""Cluster DNS's answering core: table tests per rule of ambit.lab.dns.answer, and hypothesis on the parser."""

from __future__ import annotations

import ipaddress
from typing import Any

import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdatatype
import dns.reversename
import pytest
from hypothesis import given
from hypothesis import strategies as st
from json_strategies import json_objects, json_values

from ambit.lab.dns.answer import MAX_CNAME_CHAIN, Transport, respond
from ambit.lab.dns.records import ClusterRecords, build_records, parse_zone


def service(
    ns: str, name: str, cluster_ip: str, ports: list[dict[str, Any]] | None = None, **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"clusterIP": cluster_ip, "ports": ports or [{"name": "http", "port": 80}], **spec}
    if cluster_ip != "None":
        body["clusterIPs"] = [cluster_ip]
    return {"metadata": {"namespace": ns, "name": name}, "spec": body}


def endpoint_slice(ns: str, svc: str, endpoints: list[dict[str, Any]], ports: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": ns, "name": f"{svc}-abcde", "labels": {"kubernetes.io/service-name": svc}},
        "endpoints": endpoints,
        "ports": ports,
    }


RECORDS = build_records(
    [
        service(
            "apps",
            "server",
            "198.19.0.20",
            [{"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}],
        ),
        service("apps", "db", "None", [{"name": "pg", "port": 5432}]),
        service("apps", "ext", "", type="ExternalName", externalName="api.example.com"),
        service("apps", "alias", "", type="ExternalName", externalName="server.apps.svc.cluster.local"),
        service("apps", "twice", "", type="ExternalName", externalName="alias.apps.svc.cluster.local"),
        service("apps", "loop-a", "", type="ExternalName", externalName="loop-b.apps.svc.cluster.local"),
        service("apps", "loop-b", "", type="ExternalName", externalName="loop-a.apps.svc.cluster.local"),
        *(
            service("apps", f"hop{i}", "", type="ExternalName", externalName=f"hop{i + 1}.apps.svc.cluster.local")
            for i in range(12)
        ),
        service("apps", "gone", "", type="ExternalName", externalName="nothing.apps.svc.cluster.local"),
        service("apps", "outside", "", type="ExternalName", externalName="www.example.com"),
        service("other", "server", "198.19.0.21"),
    ],
    [
        endpoint_slice(
            "apps",
            "db",
            [
                {"addresses": ["198.18.1.5"], "conditions": {"ready": True}, "hostname": "db-0"},
                {"addresses": ["198.18.2.6"], "conditions": {}},
                {"addresses": ["198.18.2.7"], "conditions": {"ready": False}, "hostname": "db-2"},
            ],
            [{"name": "pg", "port": 15432, "protocol": "TCP"}],
        ),
    ],
    {"api.example.com": "198.18.3.9", "v6.example.com": "fd00::1, 198.18.3.10"},
)


def ask(name: str, rdtype: str = "A", records: ClusterRecords = RECORDS, **kwargs: Any) -> dns.message.Message:
    query = dns.message.make_query(name, rdtype, **kwargs)
    wire = respond(records, query.to_wire(), Transport.UDP)
    assert wire is not None
    response = dns.message.from_wire(wire)
    assert response.id == query.id
    return response


def addresses(response: dns.message.Message) -> list[str]:
    return sorted(rd.to_text() for rrset in response.answer for rd in rrset if rrset.rdtype != dns.rdatatype.CNAME)


def test_a_cluster_ip_service_answers_its_cluster_ip_authoritatively() -> None:
    response = ask("server.apps.svc.cluster.local")
    assert response.rcode() == dns.rcode.NOERROR and addresses(response) == ["198.19.0.20"]
    assert response.flags & dns.flags.AA
    assert ask("SERVER.Apps.svc.cluster.local.").answer[0][0].to_text() == "198.19.0.20"


def test_an_ipv4_only_service_answers_aaaa_with_no_records_and_the_soa() -> None:
    response = ask("server.apps.svc.cluster.local", "AAAA")
    assert response.rcode() == dns.rcode.NOERROR and response.answer == []
    assert response.authority[0].rdtype == dns.rdatatype.SOA


def test_a_headless_service_answers_every_ready_endpoint_and_none_that_is_not() -> None:
    assert addresses(ask("db.apps.svc.cluster.local")) == ["198.18.1.5", "198.18.2.6"]
    assert addresses(ask("db-0.db.apps.svc.cluster.local")) == ["198.18.1.5"]
    assert addresses(ask("198-18-2-6.db.apps.svc.cluster.local")) == ["198.18.2.6"]
    assert ask("db-2.db.apps.svc.cluster.local").rcode() == dns.rcode.NXDOMAIN


def test_srv_for_a_named_port_of_a_cluster_ip_service_names_the_service() -> None:
    response = ask("_http._tcp.server.apps.svc.cluster.local", "SRV")
    assert [rd.to_text() for rd in response.answer[0]] == ["0 100 80 server.apps.svc.cluster.local."]
    assert addresses(dns.message.Message()) == []
    assert [rd.to_text() for rd in response.additional[0]] == ["198.19.0.20"]
    assert ask("_dns._udp.server.apps.svc.cluster.local", "SRV").answer[0][0].port == 53
    assert ask("_dns._tcp.server.apps.svc.cluster.local", "SRV").rcode() == dns.rcode.NXDOMAIN


def test_srv_for_a_headless_service_names_each_ready_endpoint_with_the_target_port() -> None:
    response = ask("_pg._tcp.db.apps.svc.cluster.local", "SRV")
    assert sorted(rd.to_text() for rd in response.answer[0]) == [
        "0 100 15432 198-18-2-6.db.apps.svc.cluster.local.",
        "0 100 15432 db-0.db.apps.svc.cluster.local.",
    ]
    assert sorted(r.name.to_text() for r in response.additional) == [
        "198-18-2-6.db.apps.svc.cluster.local.",
        "db-0.db.apps.svc.cluster.local.",
    ]


def test_ptr_names_the_service_of_a_cluster_ip_and_the_host_of_a_headless_endpoint() -> None:
    response = ask(dns.reversename.from_address("198.19.0.20").to_text(), "PTR")
    assert response.answer[0][0].to_text() == "server.apps.svc.cluster.local."
    response = ask(dns.reversename.from_address("198.18.1.5").to_text(), "PTR")
    assert response.answer[0][0].to_text() == "db-0.db.apps.svc.cluster.local."
    assert ask(dns.reversename.from_address("8.8.8.8").to_text(), "PTR").rcode() == dns.rcode.REFUSED


def test_pod_names_spell_their_address() -> None:
    assert addresses(ask("198-18-1-5.apps.pod.cluster.local")) == ["198.18.1.5"]
    assert ask("198-18-1-999.apps.pod.cluster.local").rcode() == dns.rcode.NXDOMAIN


def test_ipv6_pod_names_spell_their_address_with_dashes_for_colons_and_answer_aaaa_only() -> None:
    assert addresses(ask("fd00-ab-0-1--5.apps.pod.cluster.local", "AAAA")) == ["fd00:ab:0:1::5"]
    empty = ask("fd00-ab-0-1--5.apps.pod.cluster.local", "A")
    assert empty.rcode() == dns.rcode.NOERROR and not empty.answer
    assert ask("fd00-ab-0-1---5.apps.pod.cluster.local", "AAAA").rcode() == dns.rcode.NXDOMAIN
    assert ask("fd00-zz-0-1--5.apps.pod.cluster.local", "AAAA").rcode() == dns.rcode.NXDOMAIN


def test_a_dual_stack_service_answers_a_with_its_ipv4_and_aaaa_with_its_ipv6_cluster_ip() -> None:
    dual = service("apps", "dual", "198.19.0.30", ipFamilies=["IPv4", "IPv6"])
    dual["spec"]["clusterIPs"] = ["198.19.0.30", "fd00:ab:ffff::30"]
    six = service("apps", "six", "fd00:ab:ffff::31", ipFamilies=["IPv6"])
    records = build_records([dual, six], [])
    assert addresses(ask("dual.apps.svc.cluster.local", "A", records)) == ["198.19.0.30"]
    assert addresses(ask("dual.apps.svc.cluster.local", "AAAA", records)) == ["fd00:ab:ffff::30"]
    assert addresses(ask("six.apps.svc.cluster.local", "AAAA", records)) == ["fd00:ab:ffff::31"]
    nodata = ask("six.apps.svc.cluster.local", "A", records)
    assert nodata.rcode() == dns.rcode.NOERROR and not nodata.answer
    ptr = ask(dns.reversename.from_address("fd00:ab:ffff::30").to_text(), "PTR", records)
    assert ptr.answer[0][0].to_text() == "dual.apps.svc.cluster.local."


@pytest.mark.parametrize(
    "name",
    [
        "nothing.apps.svc.cluster.local",
        "server.nowhere.svc.cluster.local",
        "a.b.c.server.apps.svc.cluster.local",
        "x.cluster.local",
        "nowhere.svc.cluster.local",
        "server.apps.svc.cluster.local.apps.svc.cluster.local",
    ],
)
def test_unknown_names_in_the_cluster_domain_are_nxdomain_with_the_soa(name: str) -> None:
    response = ask(name)
    assert response.rcode() == dns.rcode.NXDOMAIN and response.answer == []
    assert response.authority[0].rdtype == dns.rdatatype.SOA
    assert response.authority[0].name.to_text() == "cluster.local."


def test_names_that_exist_without_records_are_empty_answers() -> None:
    for name in ("apps.svc.cluster.local", "svc.cluster.local", "cluster.local"):
        response = ask(name)
        assert response.rcode() == dns.rcode.NOERROR and response.answer == [], name
    assert ask("cluster.local", "SOA").answer[0].rdtype == dns.rdatatype.SOA
    assert ask("server.apps.svc.cluster.local", "TXT").answer == []


def test_an_external_name_service_answers_a_cname_followed_to_names_the_lab_answers() -> None:
    response = ask("ext.apps.svc.cluster.local")
    assert response.answer[0].rdtype == dns.rdatatype.CNAME
    assert response.answer[0][0].to_text() == "api.example.com."
    assert addresses(response) == ["198.18.3.9"], "CoreDNS resolves the target: a stub resolver does not chase it"
    in_cluster = ask("alias.apps.svc.cluster.local")
    assert [r.rdtype for r in in_cluster.answer] == [dns.rdatatype.CNAME, dns.rdatatype.A]
    assert addresses(in_cluster) == ["198.19.0.20"] and in_cluster.rcode() == dns.rcode.NOERROR
    chained = ask("twice.apps.svc.cluster.local")
    assert [r.rdtype for r in chained.answer] == [dns.rdatatype.CNAME, dns.rdatatype.CNAME, dns.rdatatype.A]


def test_an_external_name_chain_is_bounded_and_its_last_name_decides_the_rcode() -> None:
    looping = ask("loop-a.apps.svc.cluster.local")
    assert [r.name.to_text() for r in looping.answer] == [
        "loop-a.apps.svc.cluster.local.",
        "loop-b.apps.svc.cluster.local.",
    ]
    long = ask("hop0.apps.svc.cluster.local")
    assert len(long.answer) == 1 + MAX_CNAME_CHAIN and all(r.rdtype == dns.rdatatype.CNAME for r in long.answer)
    missing = ask("gone.apps.svc.cluster.local")
    assert missing.answer[0].rdtype == dns.rdatatype.CNAME and missing.rcode() == dns.rcode.NXDOMAIN
    outside = ask("outside.apps.svc.cluster.local")
    assert len(outside.answer) == 1 and outside.rcode() == dns.rcode.NOERROR, "nothing is forwarded"
    only = ask("alias.apps.svc.cluster.local", "CNAME")
    assert [r.rdtype for r in only.answer] == [dns.rdatatype.CNAME], "a CNAME question gets the CNAME alone"


def test_the_lab_zone_answers_its_names_and_nothing_else_is_forwarded() -> None:
    response = ask("api.example.com")
    assert addresses(response) == ["198.18.3.9"] and response.flags & dns.flags.AA
    assert addresses(ask("v6.example.com", "AAAA")) == ["fd00::1"]
    assert ask("api.example.com", "AAAA").answer == []
    for name in ("www.example.com", "example.com", "google.com", "localhost"):
        assert ask(name).rcode() == dns.rcode.REFUSED, name


def test_a_zone_entry_that_is_not_an_address_is_reported_and_left_out() -> None:
    zone, errors = parse_zone({"good.example.com": "198.18.3.1", "bad.example.com": "not-an-ip", "nodots": "1.2.3.4"})
    assert list(zone) == ["good.example.com"] and zone["good.example.com"] == (ipaddress.ip_address("198.18.3.1"),)
    assert len(errors) == 2


@pytest.mark.parametrize("end", ["", "\n"])
def test_names_ending_in_a_newline_are_no_dns_names_and_are_left_out(end: str) -> None:
    records = build_records(
        [
            service("apps", f"web{end}", "198.19.0.30"),
            service("apps", "api", "198.19.0.31", [{"name": f"http{end}", "port": 80}]),
            service("apps", "db", "None"),
        ],
        [endpoint_slice("apps", "db", [{"addresses": ["198.18.1.5"], "hostname": f"db-0{end}"}], [])],
        {f"a.example.com{end}": "198.18.3.1"},
    )
    api = records.find_service("apps", "api")
    (endpoint,) = records.find_endpoints("apps", "db")
    kept = (
        records.find_service("apps", f"web{end}") is not None,
        api is not None and len(api.ports) == 1,
        endpoint.has_hostname,
        bool(records.zone),
    )
    assert kept == ((False,) * 4 if end else (True,) * 4)
    assert len(records.zone_errors) == (1 if end else 0)


def test_other_classes_opcodes_and_edns_versions_get_their_error_codes() -> None:
    assert ask("server.apps.svc.cluster.local", "TXT", rdclass="CH").rcode() == dns.rcode.REFUSED
    assert ask("server.apps.svc.cluster.local", use_edns=1).rcode() == dns.rcode.BADVERS
    query = dns.message.make_query("server.apps.svc.cluster.local", "A")
    query.set_opcode(dns.opcode.UPDATE)
    wire = respond(RECORDS, query.to_wire(), Transport.UDP)
    assert wire is not None and dns.message.from_wire(wire).rcode() == dns.rcode.NOTIMP


def test_responses_and_runts_are_dropped_and_garbage_gets_formerr() -> None:
    query = dns.message.make_query("server.apps.svc.cluster.local", "A")
    reply = respond(RECORDS, query.to_wire(), Transport.UDP)
    assert reply is not None and respond(RECORDS, reply, Transport.UDP) is None
    assert respond(RECORDS, b"\x00" * 11, Transport.UDP) is None
    garbage = respond(RECORDS, b"\x12\x34\x01\x00\x00\x05" + b"\xff" * 20, Transport.UDP)
    assert garbage is not None
    parsed = dns.message.from_wire(garbage)
    assert parsed.id == 0x1234 and parsed.rcode() == dns.rcode.FORMERR


def test_a_large_answer_is_truncated_over_udp_and_whole_over_tcp() -> None:
    many = [{"addresses": [f"198.18.1.{i}"], "conditions": {"ready": True}} for i in range(2, 52)]
    records = build_records([service("apps", "big", "None")], [endpoint_slice("apps", "big", many, [])])
    query = dns.message.make_query("big.apps.svc.cluster.local", "A")
    udp = respond(records, query.to_wire(), Transport.UDP)
    assert udp is not None and len(udp) <= 512
    assert dns.message.from_wire(udp).flags & dns.flags.TC
    tcp = respond(records, query.to_wire(), Transport.TCP)
    assert tcp is not None and len(addresses(dns.message.from_wire(tcp))) == 50
    edns = dns.message.make_query("big.apps.svc.cluster.local", "A", use_edns=0, payload=4096)
    large = respond(records, edns.to_wire(), Transport.UDP)
    assert large is not None and 512 < len(large) <= 1232


@given(st.binary(max_size=600))
def test_any_bytes_get_a_clean_answer_or_nothing(wire: bytes) -> None:
    for transport in Transport:
        reply = respond(RECORDS, wire, transport)
        if reply is not None:
            assert len(reply) <= 512 or transport is Transport.TCP
            assert dns.message.from_wire(reply).flags & dns.flags.QR


@given(
    st.lists(
        st.sampled_from(["server", "apps", "svc", "cluster", "local", "db", "db-0", "_pg", "_tcp", "pod", "x"]),
        max_size=7,
    ),
    st.sampled_from(["A", "AAAA", "SRV", "PTR", "TXT", "ANY", "SOA", "NS", "CNAME"]),
    st.integers(min_value=0, max_value=0xFFFF),
)
def test_any_well_formed_query_gets_an_answer_that_parses(labels: list[str], rdtype: str, flip: int) -> None:
    query = dns.message.make_query(".".join(labels) or ".", rdtype)
    wire = bytearray(query.to_wire())
    wire[2:4] = (flip & 0x7FFF).to_bytes(2, "big")
    reply = respond(RECORDS, bytes(wire), Transport.UDP)
    assert reply is not None and dns.message.from_wire(reply).id == query.id


@given(st.lists(json_objects(), max_size=4), st.lists(json_objects(), max_size=4), json_values(max_leaves=10))
def test_any_api_objects_build_records_without_raising(services: list[Any], slices: list[Any], zone: Any) -> None:
    records = build_records(services, slices, zone if isinstance(zone, dict) else None)
    for (namespace, name), service in records.services.items():
        query = dns.message.make_query(f"{name}.{namespace}.svc.cluster.local", "A").to_wire()
        assert respond(records, query, Transport.UDP) is not None
        assert service.namespace == namespace
