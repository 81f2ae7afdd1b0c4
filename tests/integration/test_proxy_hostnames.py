"""On-demand resolution of hostname endpoints (spec §4.1 ``Workload.hostname``; ztunnel's on-demand DNS, §11.2
test_on_demand_dns_request) against a real DNS server on loopback: the cache, its TTL and bounds, and hostile or
absent answers, each ending in a clean :class:`HostnameLookupError`."""

from __future__ import annotations

import asyncio
import ipaddress
import time

import dns.message
import dns.name
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.integration.dns_upstream import HOST, scripted_dns

from ambit.proxy.hostname_lookup import answer_addresses
from ambit.proxy.hostnames import (
    MAX_ADDRESSES,
    MIN_TTL,
    HostnameCache,
    HostnameLookupError,
    HostnameResolver,
    Resolved,
    cache_key,
    upstream_lookup,
)
from ambit.telemetry.metrics import ProxyMetrics

pytestmark = pytest.mark.timeout(60)
V4 = ipaddress.ip_address("240.240.0.1")
V6 = ipaddress.ip_address("2001:2::1")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def resolver(port: int, clock: Clock, **kw: object) -> HostnameResolver:
    lookup = upstream_lookup((HOST,), port=port, timeout=float(kw.pop("upstream_timeout", 1.0)))  # type: ignore[arg-type]
    return HostnameResolver(lookup, clock=clock, choose=lambda addresses: addresses[0], **kw)  # type: ignore[arg-type]


async def test_one_miss_then_one_cache_hit() -> None:
    async with scripted_dns({"api.example.com": ["198.18.50.1", "2001:db8::1"]}) as upstream:
        hosts = resolver(upstream.port, Clock())
        assert await hosts.fetch_address("api.example.com", V4) == ipaddress.ip_address("198.18.50.1")
        assert await hosts.fetch_address("API.example.com.", V4) == ipaddress.ip_address("198.18.50.1")
        assert (hosts.requests, hosts.misses) == (2, 1)
        assert upstream.asked[("api.example.com", "A")] == 1
        assert await hosts.fetch_address("api.example.com", V6) == ipaddress.ip_address("2001:db8::1")
        assert upstream.asked[("api.example.com", "AAAA")] == 1


async def test_the_metrics_count_one_on_demand_miss_and_one_hit() -> None:
    metrics = ProxyMetrics()
    async with scripted_dns({"api.example.com": ["198.18.50.1"]}) as upstream:
        lookup = upstream_lookup((HOST,), port=upstream.port, timeout=1.0)
        hosts = HostnameResolver(lookup, clock=Clock(), observe=lambda miss: metrics.on_demand_dns(miss=miss))
        for _ in range(2):
            await hosts.fetch_address("api.example.com", V4)
    text = metrics.render().decode()
    assert "istio_on_demand_dns_total 2.0" in text
    assert "istio_on_demand_dns_cache_misses_total 1.0" in text


async def test_an_answer_is_kept_for_its_ttl_then_asked_again() -> None:
    clock = Clock()
    async with scripted_dns({"api.example.com": ["198.18.50.1"]}, ttl=30) as upstream:
        hosts = resolver(upstream.port, clock)
        await hosts.fetch_address("api.example.com", V4)
        clock.now += 29
        await hosts.fetch_address("api.example.com", V4)
        assert upstream.asked[("api.example.com", "A")] == 1
        clock.now += 2
        await hosts.fetch_address("api.example.com", V4)
        assert upstream.asked[("api.example.com", "A")] == 2


async def test_concurrent_misses_share_one_lookup() -> None:
    async with scripted_dns({"api.example.com": ["198.18.50.1"]}) as upstream:
        hosts = resolver(upstream.port, Clock())
        found = await asyncio.gather(*(hosts.fetch_address("api.example.com", V4) for _ in range(50)))
        assert set(found) == {ipaddress.ip_address("198.18.50.1")}
        assert upstream.asked[("api.example.com", "A")] == 1


async def test_a_name_with_only_the_other_family_gives_one_of_those() -> None:
    async with scripted_dns({"v6only.example.com": ["2001:db8::6"]}) as upstream:
        hosts = resolver(upstream.port, Clock())
        assert await hosts.fetch_address("v6only.example.com", V4) == ipaddress.ip_address("2001:db8::6")
        assert await hosts.fetch_address("v6only.example.com", V4) == ipaddress.ip_address("2001:db8::6")
        assert upstream.asked[("v6only.example.com", "A")] == 1 and upstream.asked[("v6only.example.com", "AAAA")] == 1


async def test_a_cname_chain_in_the_answer_is_followed() -> None:
    async with scripted_dns({"www.example.com": "cname:edge.example.net", "edge.example.net": ["198.18.50.9"]}) as up:
        assert await resolver(up.port, Clock()).fetch_address("www.example.com", V4) == ipaddress.ip_address(
            "198.18.50.9"
        )


async def test_a_huge_answer_comes_over_tcp_and_is_bounded() -> None:
    async with scripted_dns({"big.example.com": "huge"}) as upstream:
        hosts = resolver(upstream.port, Clock())
        found = await hosts.fetch_address("big.example.com", V4)
        assert ipaddress.ip_address("198.18.100.0") <= found < ipaddress.ip_address("198.18.102.0")
        assert upstream.asked[("big.example.com", "A")] == 2  # truncated over UDP, asked again over TCP
        entry = hosts.cache.find(cache_key("big.example.com", 4), Clock()())
        assert entry is not None and len(entry.addresses) == MAX_ADDRESSES


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ({}, "rcode"),  # NXDOMAIN
        ({"api.example.com": []}, "no address"),  # a name without an address of either family
        ({"api.example.com": "garbage"}, "timeout"),  # nonsense is ignored; nothing else comes
        ({"api.example.com": "silent"}, "timeout"),
    ],
)
async def test_no_usable_answer_fails_cleanly_and_is_remembered_briefly(script: dict[str, object], reason: str) -> None:
    clock = Clock()
    async with scripted_dns(script) as upstream:  # type: ignore[arg-type]
        hosts = resolver(upstream.port, clock, timeout=0.5, upstream_timeout=0.3)
        started = time.monotonic()
        with pytest.raises(HostnameLookupError) as info:
            await hosts.fetch_address("api.example.com", V4)
        assert info.value.reason == reason
        assert time.monotonic() - started < 2.0
        asked = sum(upstream.asked.values())
        with pytest.raises(HostnameLookupError):  # the negative entry answers: no second query
            await hosts.fetch_address("api.example.com", V4)
        assert sum(upstream.asked.values()) == asked
        clock.now += MIN_TTL + 1
        with pytest.raises(HostnameLookupError):
            await hosts.fetch_address("api.example.com", V4)
        assert sum(upstream.asked.values()) > asked


async def test_a_dead_upstream_fails_cleanly() -> None:
    async with scripted_dns({}) as upstream:
        port = upstream.port
    hosts = resolver(port, Clock(), timeout=1.0, upstream_timeout=0.3)  # nothing listens there any more
    with pytest.raises(HostnameLookupError):
        await hosts.fetch_address("api.example.com", V4)


async def test_too_many_distinct_lookups_at_once_are_refused_not_queued() -> None:
    async with scripted_dns({f"n{i}.example.com": "silent" for i in range(20)}) as upstream:
        hosts = resolver(upstream.port, Clock(), timeout=0.5, upstream_timeout=0.4, max_pending=4)
        results = await asyncio.gather(
            *(hosts.fetch_address(f"n{i}.example.com", V4) for i in range(20)), return_exceptions=True
        )
        assert all(isinstance(r, HostnameLookupError) for r in results)
        reasons = [r.reason for r in results if isinstance(r, HostnameLookupError)]
        assert reasons.count("overload") == 16 and reasons.count("timeout") == 4
        assert sum(upstream.asked.values()) <= 4


def test_the_cache_is_bounded_and_drops_the_least_recently_used() -> None:
    cache = HostnameCache(max_entries=3)
    for i in range(3):
        cache.store((f"n{i}", 4), Resolved((V4,), 60), 0.0)
    assert cache.find(("n0", 4), 1.0) is not None  # n0 used: n1 is now the oldest
    cache.store(("n3", 4), Resolved((V4,), 60), 1.0)
    assert len(cache) == 3 and cache.find(("n1", 4), 1.0) is None and cache.find(("n0", 4), 1.0) is not None


def test_ttls_are_clamped() -> None:
    cache = HostnameCache()
    zero = cache.store(("a", 4), Resolved((V4,), 0), 0.0)
    forever = cache.store(("b", 4), Resolved((V4,), 10**9), 0.0)
    assert zero.expires == MIN_TTL and forever.expires == 300.0


def _response(name: str, *records: tuple[str, str, str]) -> dns.message.Message:
    response = dns.message.make_response(dns.message.make_query(name, "A"))
    for owner, rdtype, value in records:
        response.answer.append(dns.rrset.from_text(owner, 30, "IN", rdtype, value))
    return response


def test_records_for_other_names_are_not_taken() -> None:
    forged = _response("api.example.com", ("evil.example.com.", "A", "198.18.66.6"))
    assert answer_addresses(forged, "api.example.com", 4).addresses == ()


def test_a_cname_loop_ends_without_an_address() -> None:
    loop = _response("a.example.com", ("a.example.com.", "CNAME", "b.example.com."), ("b.example.com.", "CNAME", "a."))
    loop.answer.append(dns.rrset.from_text("a.", 30, "IN", "CNAME", "a.example.com."))
    assert answer_addresses(loop, "a.example.com", 4).addresses == ()


@given(st.lists(st.tuples(st.sampled_from(["a.example.com.", "b.example.com.", "c."]),
                          st.sampled_from(["A", "AAAA", "CNAME", "TXT"]), st.integers(0, 3)), max_size=12))  # fmt: skip
def test_any_answer_section_gives_addresses_of_the_family_or_none(records: list[tuple[str, str, int]]) -> None:
    values = {"A": "198.18.0.{}", "AAAA": "2001:db8::{}", "CNAME": "{}.example.com.", "TXT": '"t{}"'}
    response = dns.message.make_response(dns.message.make_query("a.example.com", "A"))
    for owner, rdtype, n in records:
        value = values[rdtype].format(n) if rdtype != "CNAME" else ["a.example.com.", "b.example.com.", "c.", "c."][n]
        response.find_rrset(response.answer, dns.name.from_text(owner), dns.rdataclass.IN,
                            dns.rdatatype.from_text(rdtype), create=True).add(
            dns.rdata.from_text("IN", rdtype, value), 30)  # fmt: skip
    resolved = answer_addresses(response, "a.example.com", 4)
    assert all(a.version == 4 for a in resolved.addresses) and len(resolved.addresses) <= MAX_ADDRESSES


async def test_every_address_of_both_versions_for_a_race_and_an_error_is_not_asked_twice() -> None:
    async with scripted_dns({"api.example.com": ["198.18.50.1", "198.18.50.2", "2001:db8::1"]}) as upstream:
        hosts = resolver(upstream.port, Clock())
        found = await hosts.fetch_addresses("api.example.com")
        # IPv4 then IPv6; within a family in the answer's order, which the DNS message does not fix.
        assert sorted(found[:2]) == [ipaddress.ip_address(a) for a in ("198.18.50.1", "198.18.50.2")]
        assert found[2:] == (ipaddress.ip_address("2001:db8::1"),)
        assert await hosts.fetch_addresses("API.example.com.") == await hosts.fetch_addresses("api.example.com")
        assert upstream.asked[("api.example.com", "A")] == upstream.asked[("api.example.com", "AAAA")] == 1
        with pytest.raises(HostnameLookupError, match="NXDOMAIN"):
            await hosts.fetch_addresses("missing.example.com")
        assert upstream.asked[("missing.example.com", "AAAA")] == 0
