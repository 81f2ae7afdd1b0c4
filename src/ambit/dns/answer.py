"""The DNS proxy's decision: a query from a pod, and the workload state, in; an answer or "forward" out (spec §9).

Theory of operation: pure. :func:`parse_query` turns a datagram or TCP message into a query, or says why it is
not one (never raises, whatever the bytes). :func:`decide` looks the question up among the mesh's Services (and
ServiceEntry hosts, which are Services too, with their explicit or auto-allocated addresses as VIPs) and returns
:class:`Answered` with a response message, or :class:`Forward` for the shell to ask the pod's resolvers.

Rules:

1. Only a query (QR clear, opcode QUERY) with exactly one question is handled; anything else that parses is
   answered FORMERR (several or no questions) or NOTIMP (another opcode); what does not parse, or is a response,
   is dropped (:class:`Malformed`).
2. Only class IN, type A or AAAA is answered locally; every other type is forwarded.
3. The name is looked up under each of its aliases and each alias's wildcards (:mod:`ambit.dns.names`), in that
   order; the first alias and wildcard that has a usable Service wins. A name none matches is forwarded.
4. A usable Service is visible to the client's namespace (``visibility``: a namespace-visible Service of another
   namespace is as if absent, so the name may go on to another Service or upstream) and has VIPs, or is headless
   under ``svc.<domain>`` (then its healthy endpoints' addresses answer). Among the Services with one hostname
   (one per namespace), the one in the client's namespace wins, then a canonical one, then the first (oldest).
5. The answer is authoritative, TTL 30: the VIPs on the client's network of the asked family (headless: each
   endpoint's first address of that family), in the order ``shuffle`` leaves them. A family the Service does not
   have (its ``ip_families``, or AAAA with IPv6 off) or no address at all is an empty NOERROR answer, never
   NXDOMAIN: the name exists.
6. When the match came through a stripped alias (the asked name was a search-domain expansion) and not a
   wildcard, the answer is a CNAME from the asked name to the stripped one, then the addresses under the stripped
   name; otherwise the addresses are under the asked name, in the asker's case.
7. Names with a label holding a dot, or the root alone, are never matched (forwarded): a label ``a.b`` must not
   pass for two.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.rrset
from dns.rdtypes.ANY.CNAME import CNAME
from dns.rdtypes.IN.A import A
from dns.rdtypes.IN.AAAA import AAAA

from ambit.dns.names import split
from ambit.dns.resolution import TTL, Lookup, ServiceView, host_labels, resolve
from ambit.dns.resolution import DnsClient as DnsClient  # noqa: PLC0414 (re-exported for its older callers)
from ambit.dns.resolution import Forward as Forward  # noqa: PLC0414
from ambit.dns.settings import DEFAULT_DOMAIN
from ambit.model.workload import IPAddress


@dataclass(frozen=True, slots=True)
class Malformed:
    """Not a query we can answer: drop it (rule 1); ``reason`` is counted."""

    reason: str


@dataclass(frozen=True, slots=True)
class Answered:
    """Send ``response``; ``result`` and ``endpoints`` are for the access log."""

    response: dns.message.Message
    result: str
    endpoints: int = 0


Decision = Answered | Forward


def parse_query(wire: bytes) -> dns.message.Message | Malformed | Answered:
    """The query in ``wire``, an error answer for a query we cannot take (rule 1), or :class:`Malformed`."""
    try:
        message = dns.message.from_wire(wire, ignore_trailing=False)
    except dns.message.ShortHeader:
        return Malformed("short")
    except (dns.exception.DNSException, ValueError, UnicodeError, IndexError, KeyError, TypeError) as exc:
        return Malformed(type(exc).__name__)
    if message.flags & dns.flags.QR:
        return Malformed("response")
    if message.opcode() != dns.opcode.QUERY:
        return Answered(error_response(message, dns.rcode.NOTIMP), "not implemented")
    if len(message.question) != 1:
        return Answered(error_response(message, dns.rcode.FORMERR), "format error")
    return message


def error_response(query: dns.message.Message, rcode: dns.rcode.Rcode) -> dns.message.Message:
    """An answer to ``query`` with ``rcode`` and no records (SERVFAIL when the client or upstream failed)."""
    response = dns.message.make_response(query)
    response.set_rcode(rcode)
    return response


def decide(
    view: ServiceView,
    client: DnsClient,
    query: dns.message.Message,
    *,
    domain: str = DEFAULT_DOMAIN,
    ipv6: bool = True,
    shuffle: Callable[[list[IPAddress]], None] | None = None,
    lookup: Lookup | None = None,
) -> Decision:
    """Answer ``query`` (one question, see :func:`parse_query`) from ``view``, or say to forward it (rules 2-7).
    ``lookup``, when given, stands for :func:`resolve` with ``view`` and ``client`` (a cache of it)."""
    question = query.question[0]
    if question.rdclass != dns.rdataclass.IN:
        return Forward("record type")
    if lookup is None or not question.name.is_absolute():
        labels = host_labels(question.name.labels) if question.name.is_absolute() else ()
        resolution = resolve(view, client, labels, question.rdtype, domain=split(domain), ipv6=ipv6)
    else:
        resolution = lookup(question.name.labels, question.rdtype)
    if isinstance(resolution, Forward):
        return resolution
    response = dns.message.make_response(query)
    response.flags |= dns.flags.AA
    if not resolution.addresses:
        return Answered(response, resolution.result)
    addresses = list(resolution.addresses)
    if shuffle is not None:
        shuffle(addresses)
    owner = question.name
    if resolution.cname_labels is not None:
        target = dns.name.Name((*question.name.labels[: resolution.cname_labels], b""))
        cname = CNAME(dns.rdataclass.IN, dns.rdatatype.CNAME, target)  # type: ignore[no-untyped-call]
        response.answer.append(dns.rrset.from_rdata(owner, TTL, cname))
        owner = target
    # Rdata objects made directly: parsing their text form costs more than the rest of the answer.
    # (dnspython's rdata constructors are not annotated.)
    records: list[dns.rdata.Rdata] = [
        A(dns.rdataclass.IN, dns.rdatatype.A, str(a))  # type: ignore[no-untyped-call]
        if resolution.rdtype == dns.rdatatype.A
        else AAAA(dns.rdataclass.IN, dns.rdatatype.AAAA, str(a))  # type: ignore[no-untyped-call]
        for a in addresses
    ]
    response.answer.append(dns.rrset.from_rdata_list(owner, TTL, records))
    return Answered(response, resolution.result, len(addresses))
