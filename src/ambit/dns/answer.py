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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

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

from ambit.dns.names import Labels, aliases, join, split, wildcards
from ambit.dns.settings import DEFAULT_DOMAIN
from ambit.model.workload import HealthPolicy, HealthStatus, IPAddress, IPFamilies, Service, Workload

TTL = 30


class ServiceView(Protocol):
    """What the decision reads of the workload state (:class:`~ambit.model.state.WorkloadState` is one)."""

    def find_services_by_hostname(self, hostname: str) -> Sequence[Service]: ...

    def find_endpoints(self, service: Service) -> Sequence[Workload]: ...


@dataclass(frozen=True, slots=True)
class DnsClient:
    """The pod asking: its namespace (for the search path and the preferred Service) and its network."""

    namespace: str
    network: str = ""
    name: str = ""
    canonical_name: str = ""
    canonical_revision: str = ""


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


@dataclass(frozen=True, slots=True)
class Forward:
    """Ask the pod's resolvers; ``reason`` says why the mesh does not answer."""

    reason: str


Decision = Answered | Forward


@dataclass(frozen=True, slots=True)
class _Match:
    service: Service
    name: Labels
    stripped: Labels | None


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


@dataclass(frozen=True, slots=True)
class Records:
    """The mesh's answer to one name and type (rules 4-6), before it becomes a message: the same for every query
    of that name (in any case) and type from one client, as long as the workload state does not change."""

    rdtype: int
    """A or AAAA."""
    addresses: tuple[IPAddress, ...]
    """In the state's order (the answer shuffles them); empty: an empty NOERROR answer."""
    cname_labels: int | None
    """Rule 6: the answer is a CNAME from the asked name to its first ``cname_labels`` labels, which own the
    addresses; ``None``: the asked name owns them."""
    result: str
    """For the access log."""


Resolution = Records | Forward


def resolve(
    view: ServiceView, client: DnsClient, labels: Labels, rdtype: int, *, domain: Labels, ipv6: bool
) -> Resolution:
    """What the mesh answers for ``labels`` (see :func:`host_labels`) and ``rdtype`` (rules 2-7)."""
    if rdtype not in (dns.rdatatype.A, dns.rdatatype.AAAA):
        return Forward("record type")
    if not labels:
        return Forward("not a host name")
    match = _find(view, client, labels, domain)
    if match is None:
        return Forward("unknown host")
    family = 4 if rdtype == dns.rdatatype.A else 6
    if not _family_allowed(match.service, family, ipv6):
        return Records(rdtype, (), None, "service does not support this record type")
    addresses = _addresses(view, client, match.service, family)
    if not addresses:
        return Records(rdtype, (), None, "no records")
    cname = len(match.stripped) if match.stripped is not None and match.name[0] != "*" else None
    return Records(rdtype, tuple(addresses), cname, "success")


Lookup = Callable[[Sequence[bytes], int], Resolution]
"""A (cached) :func:`resolve` for one client and workload state: an absolute name's raw labels and a type in."""


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


def host_labels(raw: Sequence[bytes]) -> Labels:
    """An absolute name's labels (the root's empty one last) in lower case, or ``()`` when it cannot be a host
    name we know (rule 7)."""
    out: list[str] = []
    for label in raw[:-1]:
        text = label.decode("latin-1").lower()
        if not text or "." in text:
            return ()
        out.append(text)
    return tuple(out)


def _find(view: ServiceView, client: DnsClient, name: Labels, domain: Labels) -> _Match | None:
    svc_suffix = "." + join(("svc", *domain))
    for alias in aliases(name, client.namespace, domain):
        for candidate in wildcards(alias.name):
            usable = [
                s
                for s in view.find_services_by_hostname(join(candidate))
                if s.visible_to(client.namespace) and (s.vips or s.hostname.endswith(svc_suffix))
            ]
            best = _best(usable, client.namespace)
            if best is not None:
                return _Match(best, candidate, alias.stripped)
    return None


def _best(services: Sequence[Service], namespace: str) -> Service | None:
    """Rule 4: the client's namespace, then canonical, then the first."""
    canonical: Service | None = None
    for service in services:
        if service.namespace == namespace:
            return service
        if service.canonical and canonical is None:
            canonical = service
    if canonical is not None:
        return canonical
    return services[0] if services else None


def _family_allowed(service: Service, family: int, ipv6: bool) -> bool:
    if family == 6 and not ipv6:
        return False
    if service.ip_families is IPFamilies.IPV4_ONLY:
        return family == 4
    if service.ip_families is IPFamilies.IPV6_ONLY:
        return family == 6
    return True


def _addresses(view: ServiceView, client: DnsClient, service: Service, family: int) -> list[IPAddress]:
    if service.vips:
        # A CIDR range VIP is no host's address: it is never an answer.
        return [
            vip.ip
            for vip in service.vips
            if vip.ip.version == family and vip.network == client.network and vip.length is None
        ]
    out: list[IPAddress] = []
    for workload in view.find_endpoints(service):
        if workload.status is not HealthStatus.HEALTHY and service.health_policy is not HealthPolicy.ALLOW_ALL:
            continue
        first = next((a for a in workload.addresses if a.version == family), None)
        if first is not None and first not in out:
            out.append(first)
    return out
