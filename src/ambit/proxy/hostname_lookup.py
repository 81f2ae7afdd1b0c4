"""Asking nameservers for a hostname endpoint's addresses with dnspython: the lookup behind
:func:`ambit.proxy.hostnames.upstream_lookup`, imported by its first lookup (rules 4 and 8 there)."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from types import ModuleType

import dns.exception
import dns.message
import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype

from ambit.proxy.hostnames import (
    MAX_ADDRESSES,
    MAX_CNAME_HOPS,
    NEGATIVE_TTL,
    HostnameLookupError,
    Lookup,
    Resolved,
)

__all__ = ["answer_addresses", "plain_dns_lookup"]


def answer_addresses(response: dns.message.Message, name: str, version: int) -> Resolved:
    """The addresses ``response`` gives for ``name`` (following CNAMEs within it), and the smallest TTL on the way;
    raises :class:`HostnameLookupError` for an error code."""
    if response.rcode() != dns.rcode.NOERROR:
        raise HostnameLookupError(f"{name}: {dns.rcode.to_text(response.rcode())}", "rcode")
    rdtype = dns.rdatatype.A if version == 4 else dns.rdatatype.AAAA
    owner = dns.name.from_text(name)
    ttls: list[float] = []
    for _ in range(MAX_CNAME_HOPS):
        found = response.get_rrset(response.answer, owner, dns.rdataclass.IN, rdtype)
        if found is not None:
            ttls.append(found.ttl)
            addresses = tuple(ipaddress.ip_address(rdata.address) for rdata in list(found)[:MAX_ADDRESSES])
            return Resolved(addresses, min(ttls))
        alias = response.get_rrset(response.answer, owner, dns.rdataclass.IN, dns.rdatatype.CNAME)
        if alias is None:
            break
        ttls.append(alias.ttl)
        owner = alias[0].target
    return Resolved((), min(ttls, default=NEGATIVE_TTL))


def plain_dns_lookup(nameservers: Sequence[str], *, port: int = 53, timeout: float = 2.0) -> Lookup:
    """A :data:`Lookup` that asks ``nameservers`` in turn (UDP, TCP when truncated), from the caller's netns."""
    asyncquery = _plain_dns_query()

    async def lookup(name: str, version: int) -> Resolved:
        if not nameservers:
            raise HostnameLookupError(f"cannot resolve {name}: no nameserver", "no upstream")
        rdtype = dns.rdatatype.A if version == 4 else dns.rdatatype.AAAA
        last = HostnameLookupError(f"cannot resolve {name}", "error")
        for server in nameservers:
            query = dns.message.make_query(name, rdtype)
            try:
                # Datagrams that are not the answer (garbage, another id, another source) are ignored, as the
                # DNS proxy's forwarder does: a spoofed packet cannot fail the lookup, only the timeout can.
                response, _tcp = await asyncquery.udp_with_fallback(
                    query, server, timeout=timeout, port=port, ignore_unexpected=True, ignore_errors=True
                )
            except dns.exception.Timeout:
                last = HostnameLookupError(f"{server} did not answer for {name}", "timeout")
                continue
            except (dns.exception.DNSException, OSError, ValueError, EOFError) as exc:
                last = HostnameLookupError(f"cannot ask {server} for {name}: {exc}", "error")
                continue
            try:
                return answer_addresses(response, name, version)
            except (dns.exception.DNSException, ValueError) as exc:
                raise HostnameLookupError(f"{server} answered nonsense for {name}: {exc}", "error") from None
        raise last

    return lookup


def _plain_dns_query() -> ModuleType:
    """dnspython's asyncio query module, imported without its DNS-over-HTTPS support (rule 8)."""
    import dns._features

    dns._features.force("doh", False)
    import dns.asyncquery

    return dns.asyncquery
