"""The DNS proxy's fast path (:mod:`ambit.dns.fastpath`): a remembered dnspython answer, sent again for any query
the fast path takes, means what the dnspython way's answer to that query means; everything else is declined,
whatever the bytes."""

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
from ambit.dns.fastpath import MAX_MESSAGE, AnswerCache, SimpleQuery, name_key, parse_simple_query
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


def udp_wire(response: dns.message.Message, query: dns.message.Message) -> bytes:
    limit = max(512, min(query.payload, 65535)) if query.edns >= 0 else 512
    return response.to_wire(max_size=limit, prefer_truncation=True)


def slow(wire: bytes, state: WorkloadState = STATE, client: DnsClient = CLIENT) -> bytes | None:
    """What the dnspython way sends for ``wire`` when the mesh answers it (over UDP), or ``None``."""
    query = parse_query(wire)
    if not isinstance(query, dns.message.Message):
        return None
    decision = decide(state, client, query)
    if not isinstance(decision, Answered):
        return None
    return udp_wire(decision.response, query)


def serve(wire: bytes, cache: AnswerCache, state: WorkloadState = STATE, client: DnsClient = CLIENT) -> bytes | None:
    """What the server sends for ``wire`` (over UDP) when the mesh answers it, or ``None``: the fast path's answer,
    else the dnspython way's through the cache, which the cache then remembers (as DnsServer does)."""
    answer = fast(wire, cache, client)
    if answer is not None:
        return answer
    query = parse_query(wire)
    if not isinstance(query, dns.message.Message):
        return None
    decision = decide(state, client, query, lookup=lambda raw, rdtype: cache.resolution(client, raw, rdtype))
    if not isinstance(decision, Answered):
        return None
    cache.remember(client, wire, decision.response, decision.endpoints)
    return udp_wire(decision.response, query)


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
    """A cache that has answered every name of :data:`HOSTS`, both types, with and without EDNS, in both cases."""
    cache = new_cache(max_entries=1 << 20)  # never emptied by the names the tests add
    for host in HOSTS:
        for name in (host, host.upper()):
            for rdtype in ("A", "AAAA"):
                for edns in (-1, 0):
                    serve(query_wire(name + ".", rdtype, edns=edns), cache)
    return cache


WARM = warm_cache()


def replayable(wire: bytes) -> bool:
    """Whether the dnspython way answers ``wire`` from the mesh with at most one address (fastpath rule 3)."""
    answer = slow(wire)
    if answer is None:
        return False
    message = dns.message.from_wire(answer)
    return (
        not message.flags & dns.flags.TC
        and sum(r.rdtype != dns.rdatatype.CNAME for r in message.answer) <= 1
        and all(len(r) == 1 for r in message.answer)
    )


def assert_same(wire: bytes) -> bytes | None:
    """A new cache declines ``wire``, answers it the dnspython way once, and then declines it or sends it again as
    the dnspython way would answer it, as does a cache that knows every name; returns the answer sent again."""
    cache = new_cache()
    assert fast(wire, cache) is None
    serve(wire, cache)
    again = fast(wire, cache)
    assert again == fast(wire, WARM) or parse_simple_query(wire) is None or fast(wire, WARM) is None
    for answer in (again, fast(wire, WARM)):
        if answer is not None:
            expected = slow(wire)
            assert expected is not None, "the fast path answered what the dnspython way does not"
            assert meaning(answer) == meaning(expected)
    return again


def test_a_mesh_name_answered_once_is_answered_again_as_dnspython_answers_it() -> None:
    for host in HOSTS:
        for rdtype in ("A", "AAAA"):
            for edns in (-1, 0):
                wire = query_wire(host + ".", rdtype, edns=edns)
                answer = assert_same(wire)
                assert (answer is not None) == replayable(wire), (host, rdtype, edns)


def test_an_answer_is_sent_again_with_the_new_querys_id_and_rd_bit() -> None:
    cache = new_cache()
    first = query_wire("productpage.", qid=7)
    serve(first, cache)
    for qid, flags in [(7, 0x0100), (0, 0), (0xFFFF, 0x0110), (12345, 0x0000)]:
        wire = struct.pack("!HH", qid, flags) + first[4:]
        answer = fast(wire, cache)
        assert answer is not None
        assert meaning(answer) == meaning(slow(wire) or b""), (qid, flags)
        assert struct.unpack("!HH", answer[:4]) == (qid, 0x8400 | (flags & 0x0100))


def test_the_cname_for_a_search_expansion_keeps_the_asked_case() -> None:
    answer = assert_same(query_wire("API.Example.com.NS1.svc.cluster.local."))
    assert answer is not None
    message = dns.message.from_wire(answer)
    assert [r.name.to_text() for r in message.answer] == ["API.Example.com.NS1.svc.cluster.local.", "API.Example.com."]
    assert message.answer[0][0].to_text() == "API.Example.com."
    other_case = fast(query_wire("api.example.com.ns1.svc.cluster.local."), WARM)
    assert other_case is not None
    assert [r.name.to_text() for r in dns.message.from_wire(other_case).answer][1] == "api.example.com."


def test_names_the_mesh_does_not_answer_are_declined() -> None:
    cache = new_cache()
    for host, rdtype in [("www.bing.com.", "A"), ("productpage.", "TXT"), ("example.", "A"), (".", "A")]:
        assert serve(query_wire(host, rdtype), cache) is None
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
    host = ".".join(("a" * 63, "b" * 63, "c" * 63, "d" * 35))
    state.upsert_service(svc("long", "ns1", host, "198.19.7.7"))
    cache = new_cache(state)
    asked = host + ".ns1.svc.cluster.local."  # a CNAME to the long name, then its address: 524 bytes
    plain = query_wire(asked)
    truncated = serve(plain, cache, state)
    assert truncated is not None and dns.message.from_wire(truncated).flags & dns.flags.TC
    assert fast(plain, cache) is None  # remembered, but over 512 bytes
    whole = cache.answer(CLIENT, plain, udp=False)
    assert whole is not None and len(whole[0]) == 524 and not dns.message.from_wire(whole[0]).flags & dns.flags.TC
    big = query_wire(asked, edns=0, payload=4096)
    serve(big, cache, state)
    answer = fast(big, cache)
    assert answer is not None and meaning(answer) == meaning(slow(big, state) or b"")
    small = query_wire(asked, edns=0, payload=100)  # under 512 counts as 512
    assert fast(small, cache) is None


def test_an_answer_with_several_addresses_is_never_sent_again() -> None:
    """Their order is shuffled anew for each query, which only the dnspython way does."""
    cache = new_cache()
    wire = query_wire("headless.ns1.svc.cluster.local.")
    answer = serve(wire, cache)
    assert answer is not None and len(dns.message.from_wire(answer).answer[0]) == 2
    assert fast(wire, cache) is None
    assert fast(wire, WARM) is None


def test_the_cache_follows_the_state_and_the_client() -> None:
    state = mesh()
    cache = new_cache(state)
    wire = query_wire("api.example.com.")
    serve(wire, cache, state)
    first = fast(wire, cache)
    assert first is not None and "240.240.0.1" in dns.message.from_wire(first).answer[0].to_text()
    state.upsert_service(svc("api", "ns1", "api.example.com", "240.240.0.9"))
    assert fast(wire, cache) is None  # a new generation: nothing remembered
    second = serve(wire, cache, state)
    assert second is not None and "240.240.0.9" in dns.message.from_wire(second).answer[0].to_text()
    assert fast(wire, cache) == second
    state.remove_service("ns1/api.example.com")
    assert fast(wire, cache) is None and serve(wire, cache, state) is None
    # The same short name means another Service for a client of another namespace.
    short = query_wire("example.")
    assert serve(short, cache, state) is None
    ns2 = DnsClient("ns2")
    assert serve(short, cache, state, ns2) is not None
    assert fast(short, cache, ns2) is not None and fast(short, cache) is None
    nw2 = query_wire("nw2-only.ns1.svc.cluster.local.")
    empty = serve(nw2, cache, state)
    assert empty is not None and dns.message.from_wire(empty).answer == []
    assert fast(nw2, cache) == empty
    other_network = DnsClient("ns1", "nw2")
    answered = serve(nw2, cache, state, other_network)
    assert answered is not None and dns.message.from_wire(answered).answer != []


def test_the_cache_is_bounded_against_a_pod_asking_random_names() -> None:
    cache = new_cache(max_entries=64)
    for i in range(1000):
        serve(query_wire(f"random-{i}.example.org."), cache)  # forwarded: a resolution each
        serve(query_wire(f"random-{i}.wildcard."), cache)  # answered: a resolution and an answer each
        assert len(cache) <= 2 * 64
    wire = query_wire("productpage.")
    serve(wire, cache)
    assert fast(wire, cache) is not None


def test_a_view_that_cannot_say_when_it_changes_is_never_cached() -> None:
    class Plain:
        def __init__(self, state: WorkloadState) -> None:
            self.find_services_by_hostname = state.find_services_by_hostname
            self.find_endpoints = state.find_endpoints

    state = mesh()
    cache = AnswerCache(Plain(state), domain=DOMAIN, ipv6=True)
    wire = query_wire("api.example.com.")
    assert serve(wire, cache, state) is not None
    assert fast(wire, cache) is None
    state.remove_service("ns1/api.example.com")
    assert serve(wire, cache, state) is None
    assert len(cache) == 0


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
