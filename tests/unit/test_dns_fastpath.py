"""The DNS proxy's fast path (:mod:`ambit.dns.fastpath`): for any query it takes, the answer means what the
dnspython way's answer means; everything else is declined, whatever the bytes."""

from __future__ import annotations

import struct

import dns.edns
import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdatatype
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tests.unit.dns_state import mesh, svc

from ambit.dns.answer import Answered, DnsClient, decide, parse_query
from ambit.dns.fastpath import (
    MAX_MESSAGE,
    AnswerCache,
    SimpleQuery,
    Template,
    build_answer,
    name_key,
    parse_simple_query,
)
from ambit.model.state import WorkloadState

DOMAIN = ("cluster", "local")
CLIENT = DnsClient(namespace="ns1")
STATE = mesh()
HOSTS = [
    "productpage",
    "productpage.ns1",
    "productpage.ns1.svc",
    "productpage.ns1.svc.cluster.local",
    "productpage.ns1.ns1.svc.cluster.local",
    "example.ns2",
    "example",
    "api.example.com",
    "api.example.com.ns1.svc.cluster.local",
    "api.example.com.svc.cluster.local",
    "api.example.com.cluster.local",
    "dual.localhost",
    "ipv6.localhost",
    "ipv4.localhost",
    "foo.wildcard",
    "foo.wildcard.ns1.svc.cluster.local",
    "a.b.wildcard",
    "foo.svc.mesh.company.net.ns1.svc.cluster.local",
    "nw2-only.ns1.svc.cluster.local",
    "headless.ns1.svc.cluster.local",
    "headless.example.com",
    "everywhere.io",
    "canonical.svc",
    "v4only.ns1.svc.cluster.local",
    "www.bing.com",
    "cluster.local",
]


def fast(wire: bytes, cache: AnswerCache, client: DnsClient = CLIENT) -> bytes | None:
    """What the server's fast path sends for ``wire`` (over UDP), or ``None``."""
    found = cache.answer(client, wire, udp=True)
    if found is not None:
        assert parse_simple_query(wire) is not None, "answered a query that is not simple"
    return None if found is None else found[0]


def slow(wire: bytes, state: WorkloadState = STATE, client: DnsClient = CLIENT) -> bytes | None:
    """What the dnspython way sends for ``wire`` when the mesh answers it (over UDP), or ``None``."""
    query = parse_query(wire)
    if not isinstance(query, dns.message.Message):
        return None
    decision = decide(state, client, query)
    if not isinstance(decision, Answered):
        return None
    limit = max(512, min(query.payload, 65535)) if query.edns >= 0 else 512
    return decision.response.to_wire(max_size=limit, prefer_truncation=True)


def meaning(wire: bytes) -> tuple[object, ...]:
    """Everything an answer says, compression and order apart (dnspython shuffles records as it writes them)."""
    message = dns.message.from_wire(wire)
    return (
        message.id,
        message.flags,
        message.rcode(),
        message.edns,
        message.payload if message.edns >= 0 else None,
        message.ednsflags,
        message.options,
        [(q.name.to_text(), q.rdclass, q.rdtype) for q in message.question],
        [(r.name.to_text(), r.rdclass, r.rdtype, r.ttl, sorted(d.to_text() for d in r)) for r in message.answer],
        message.authority,
        message.additional,
    )


def new_cache(state: WorkloadState = STATE, **kw: int) -> AnswerCache:
    return AnswerCache(state, domain=DOMAIN, ipv6=True, **kw)


def query_wire(host: str, rdtype: str = "A", *, edns: int = -1, payload: int = 1232, qid: int = 7) -> bytes:
    return dns.message.make_query(host, rdtype, use_edns=edns, payload=payload, id=qid).to_wire()


def mixed_case(draw: st.DrawFn, text: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
    return "".join(c.upper() if flip else c for c, flip in zip(text, flips, strict=True))


@st.composite
def queries(draw: st.DrawFn) -> bytes:
    """Queries as stub resolvers send them, for mesh names and others, sometimes with EDNS, with any header."""
    host = mixed_case(draw, draw(st.sampled_from(HOSTS))) + "."
    message = dns.message.make_query(
        host,
        draw(st.sampled_from(["A", "AAAA", "A", "AAAA", "TXT", "SRV"])),
        use_edns=draw(st.sampled_from([-1, -1, 0])),
        payload=draw(st.sampled_from([0, 512, 1232, 4096, 65535])),
        ednsflags=draw(st.sampled_from([0, dns.flags.DO])),
        id=draw(st.integers(0, 0xFFFF)),
    )
    message.flags = draw(st.integers(0, 0xFFFF)) & ~0xF800  # any flag bits but QR and the opcode
    return message.to_wire()


def warm_cache() -> AnswerCache:
    """A cache that has seen every name of :data:`HOSTS`, both types, with and without EDNS, in both cases."""
    cache = new_cache(max_entries=1 << 20)  # never emptied by the names the tests add
    for host in HOSTS:
        for name in (host, host.upper()):
            for rdtype in ("A", "AAAA"):
                for edns in (-1, 0):
                    fast(query_wire(name + ".", rdtype, edns=edns), cache)
    return cache


WARM = warm_cache()


def assert_same(wire: bytes) -> bytes | None:
    """The fast path, with an empty cache and with one that knows the names, declines ``wire`` or answers it as
    the dnspython way does; returns its answer."""
    answer = fast(wire, new_cache())
    assert answer == fast(wire, WARM)
    if answer is not None:
        expected = slow(wire)
        assert expected is not None, "the fast path answered what the dnspython way does not"
        assert meaning(answer) == meaning(expected)
    return answer


def test_a_mesh_name_is_answered_from_bytes_as_dnspython_answers_it() -> None:
    for host in HOSTS:
        for rdtype in ("A", "AAAA"):
            for edns in (-1, 0):
                wire = query_wire(host + ".", rdtype, edns=edns)
                answer = assert_same(wire)
                assert (answer is None) == (slow(wire) is None), (host, rdtype, edns)


def test_the_cname_for_a_search_expansion_keeps_the_asked_case() -> None:
    answer = assert_same(query_wire("API.Example.com.NS1.svc.cluster.local."))
    assert answer is not None
    message = dns.message.from_wire(answer)
    assert [r.name.to_text() for r in message.answer] == ["API.Example.com.NS1.svc.cluster.local.", "API.Example.com."]
    assert message.answer[0][0].to_text() == "API.Example.com."
    assert len(answer) < len(slow(query_wire("API.Example.com.NS1.svc.cluster.local.")) or b"") + 8


def test_names_the_mesh_does_not_answer_are_declined() -> None:
    cache = new_cache()
    for host, rdtype in [("www.bing.com.", "A"), ("productpage.", "TXT"), ("example.", "A"), (".", "A")]:
        assert fast(query_wire(host, rdtype), cache) is None


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(queries())
def test_any_stub_query_is_declined_or_answered_as_dnspython_answers_it(wire: bytes) -> None:
    assert_same(wire)


@st.composite
def mutations(draw: st.DrawFn) -> bytes:
    wire = bytearray(draw(queries()))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["set", "insert", "delete", "truncate", "append"]))
        at = draw(st.integers(0, len(wire)))
        byte = draw(st.sampled_from([0, 1, 5, 28, 41, 63, 64, 0xC0, 0xC0 | 12, 0xFF, draw(st.integers(0, 255))]))
        if kind == "set" and at < len(wire):
            wire[at] = byte
        elif kind == "insert":
            wire.insert(at, byte)
        elif kind == "delete" and at < len(wire):
            del wire[at]
        elif kind == "truncate":
            del wire[at:]
        else:
            wire.extend(draw(st.binary(max_size=12)))
    return bytes(wire)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(mutations())
def test_a_mutated_query_is_declined_or_answered_as_dnspython_answers_it(wire: bytes) -> None:
    assert_same(wire)


@settings(max_examples=800)
@given(st.binary(max_size=300))
def test_any_bytes_are_declined_or_read_as_dnspython_reads_them(wire: bytes) -> None:
    query = parse_simple_query(wire)
    if query is None:
        return
    message = dns.message.from_wire(wire)
    assert message.question[0].rdtype == query.rdtype
    assert message.id == query.id
    assert name_key(message.question[0].name.labels) == wire[12 : query.name_end].lower()
    assert_same(wire)


def simple(wire: bytes) -> SimpleQuery | None:
    return parse_simple_query(wire)


def test_odd_queries_are_declined() -> None:
    plain = query_wire("productpage.", "A")
    assert simple(plain) is not None
    assert simple(plain + b"\x00") is None, "trailing bytes"
    assert simple(plain[:-1]) is None
    assert simple(plain[:11]) is None
    assert simple(b"") is None
    header = plain[:12]
    # A compression pointer in the question (to the header: nonsense, but dnspython follows pointers).
    assert simple(header + b"\xc0\x0c" + plain[-4:]) is None
    # Labels of 64 bytes and names over 255 bytes.
    long_label = header + b"\x40" + b"a" * 64 + b"\x00" + plain[-4:]
    assert simple(long_label) is None
    too_long = header + (b"\x3f" + b"a" * 63) * 4 + b"\x00" + plain[-4:]
    assert len(too_long) - 12 - 4 == 257 and simple(too_long) is None
    just_fits = header + (b"\x3f" + b"a" * 63) * 3 + b"\x3d" + b"a" * 61 + b"\x00" + plain[-4:]
    assert simple(just_fits) is not None
    # Another opcode, a response, two questions, an answer section, and class CH.
    for offset, value in [(2, 0x08), (2, 0x80), (5, 2), (7, 1), (9, 1)]:
        changed = bytearray(plain)
        changed[offset] |= value
        assert simple(bytes(changed)) is None, (offset, value)
    assert simple(plain[:-1] + b"\x03") is None
    # EDNS: a bare OPT is taken, options or another record in its place are not.
    assert simple(query_wire("productpage.", edns=0)) is not None
    cookie = dns.edns.CookieOption(b"12345678", b"")
    with_cookie = dns.message.make_query("productpage.", "A", use_edns=0, options=[cookie])
    assert simple(with_cookie.to_wire()) is None
    tsigish = bytearray(query_wire("productpage.", edns=0))
    tsigish[-10] = 250  # the additional record's type
    assert simple(bytes(tsigish)) is None


def test_an_answer_too_long_for_udp_is_declined_so_that_dnspython_truncates_it() -> None:
    state = WorkloadState()
    wide = svc("wide", "ns1", "wide.example.com", *(f"198.19.{i // 250}.{i % 250 + 1}" for i in range(40)))
    state.upsert_service(wide)
    cache = new_cache(state)
    plain = query_wire("wide.example.com.")
    assert fast(plain, cache) is None  # 40 records of 16 bytes: over 512
    truncated = slow(plain, state)
    assert truncated is not None and dns.message.from_wire(truncated).flags & dns.flags.TC
    big = query_wire("wide.example.com.", edns=0, payload=4096)
    answer = fast(big, cache)
    assert answer is not None and len(dns.message.from_wire(answer).answer[0]) == 40
    small = query_wire("wide.example.com.", edns=0, payload=100)  # under 512 counts as 512
    assert fast(small, cache) is None


def test_the_cache_follows_the_state_and_the_client() -> None:
    state = mesh()
    cache = new_cache(state)
    wire = query_wire("api.example.com.")
    first = fast(wire, cache)
    assert first is not None and "240.240.0.1" in dns.message.from_wire(first).answer[0].to_text()
    state.upsert_service(svc("api", "ns1", "api.example.com", "240.240.0.9"))
    second = fast(wire, cache)
    assert second is not None and "240.240.0.9" in dns.message.from_wire(second).answer[0].to_text()
    state.remove_service("ns1/api.example.com")
    assert fast(wire, cache) is None
    # The same short name means another Service for a client of another namespace.
    short = query_wire("example.")
    assert fast(short, cache) is None
    assert fast(short, cache, DnsClient("ns2")) is not None
    nw2 = query_wire("nw2-only.ns1.svc.cluster.local.")
    empty = fast(nw2, cache)
    assert empty is not None and dns.message.from_wire(empty).answer == []
    answered = fast(nw2, cache, DnsClient("ns1", "nw2"))
    assert answered is not None and dns.message.from_wire(answered).answer != []


def test_the_cache_is_bounded_against_a_pod_asking_random_names() -> None:
    cache = new_cache(max_entries=64)
    for i in range(1000):
        fast(query_wire(f"random-{i}.example.org."), cache)
        assert len(cache) <= 64
    assert fast(query_wire("productpage."), cache) is not None


def test_a_view_that_cannot_say_when_it_changes_is_never_cached() -> None:
    class Plain:
        def __init__(self, state: WorkloadState) -> None:
            self.find_services_by_hostname = state.find_services_by_hostname
            self.find_endpoints = state.find_endpoints

    state = mesh()
    cache = AnswerCache(Plain(state), domain=DOMAIN, ipv6=True)
    wire = query_wire("api.example.com.")
    assert fast(wire, cache) is not None
    state.remove_service("ns1/api.example.com")
    assert fast(wire, cache) is None
    assert len(cache) == 0


def test_the_shuffle_orders_the_records_and_the_template_is_untouched() -> None:
    cache = new_cache()
    wire = query_wire("headless.ns1.svc.cluster.local.")
    query = parse_simple_query(wire)
    assert query is not None
    template = cache.find(CLIENT, wire[12 : query.name_end].lower(), query.rdtype)
    assert isinstance(template, Template)
    answer = build_answer(query, wire, template, lambda records: records.reverse())
    assert [r.to_text() for r in dns.message.from_wire(answer).answer[0]] == ["198.18.31.31", "198.18.30.30"]
    assert [r.to_text() for r in dns.message.from_wire(build_answer(query, wire, template)).answer[0]] == [
        "198.18.30.30",
        "198.18.31.31",
    ]


@pytest.mark.parametrize("payload", [0, 511, 512, 4096, 65535])
def test_the_udp_limit_follows_the_edns_payload(payload: int) -> None:
    query = parse_simple_query(query_wire("productpage.", edns=0, payload=payload))
    assert query is not None
    assert query.max_udp_size == max(512, min(payload, MAX_MESSAGE))
    no_edns = parse_simple_query(query_wire("productpage."))
    assert no_edns is not None and no_edns.max_udp_size == 512


@given(st.lists(st.binary(min_size=1, max_size=63), min_size=1, max_size=3), st.sampled_from(["A", "AAAA"]))
def test_any_label_bytes_are_answered_alike(labels: list[bytes], rdtype: str) -> None:
    """Labels with dots, spaces and non-ASCII bytes: a name the mesh may know under a wildcard or not at all."""
    name = dns.name.Name((*labels, b"wildcard", b""))
    wire = dns.message.make_query(name, rdtype).to_wire()
    assume(struct.unpack("!H", wire[2:4])[0] & 0xF800 == 0)
    answer = assert_same(wire)
    assert (answer is None) == (slow(wire) is None)
