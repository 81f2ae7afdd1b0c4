"""Answering one DNS query from :class:`~ambit.lab.dns.records.ClusterRecords` (pure: bytes in, bytes out).

Theory of operation: :func:`respond` parses a datagram or TCP message with dnspython, :func:`resolve` decides the
answer as a dnspython message, and :func:`respond` renders it within the transport's size limit. Nothing here
does I/O or forwards: every name is answered from the records, refused, or dropped.

Rules (``<d>`` is the cluster domain, ``cluster.local``):

1. Input that is not a query is dropped (None): shorter than a DNS header, or with the QR bit set (a response
   sent to us, which is how reflection loops start). Input that is a query but does not parse, or that holds
   other than one question, is answered FORMERR with the query's id. An opcode other than QUERY is NOTIMP (before
   parsing), a
   class other than IN is REFUSED, an EDNS version above 0 is BADVERS.
2. ``<svc>.<ns>.svc.<d>``: a Service with addresses answers A/AAAA with them; a headless one with its ready
   endpoints' addresses; an ExternalName one with a CNAME to its target, followed (as CoreDNS does) when the target
   is a name these records answer, up to :data:`MAX_CNAME_CHAIN` links and never to a name already in the answer
   (a loop of ExternalName Services ends where it closes): the target's records join the answer, and
   its rcode is the response's (NXDOMAIN for a target under the cluster domain that does not exist). A question
   for the CNAME itself (type CNAME) is not followed.
3. ``<endpoint>.<svc>.<ns>.svc.<d>``: a ready endpoint of a headless Service, by hostname or dashed address.
4. ``_<port>._<proto>.<svc>.<ns>.svc.<d>`` SRV: one record ``0 100 <port> <svc fqdn>`` for a Service with
   addresses, one per ready endpoint ``0 100 <target port> <endpoint>.<svc fqdn>`` for a headless Service, with
   the targets' addresses in the additional section. Only named ports have SRV names.
5. ``<a-b-c-d>.<ns>.pod.<d>``: the IPv4 address spelled by the first label (kube-dns's "pods insecure" mode);
   an IPv6 address with ``-`` for ``:`` (``fd00-ab-0-1--5``), as CoreDNS reads it, answers AAAA.
6. Names under ``<d>`` that rules 2 to 5 do not know are NXDOMAIN; names that exist without records of the
   asked type (AAAA of an IPv4-only Service, ``<ns>.svc.<d>`` of a namespace with Services, the apex) are
   NOERROR with no answer. Both carry the zone's SOA in the authority section. The apex answers SOA and NS.
7. PTR under ``in-addr.arpa``/``ip6.arpa`` for an address in the records' pointers; other reverse names REFUSED.
8. A name of the lab zone answers its A/AAAA addresses (NOERROR with no answer for other types).
9. Anything else is REFUSED: nothing is forwarded to the host's resolvers.
10. Every answer from rules 2 to 8 is authoritative (AA). Over UDP the response fits 512 bytes, or the query's
    EDNS payload size capped at :data:`OUR_PAYLOAD`; a longer one is truncated with the TC bit set, and the
    client retries over TCP, where the limit is 65535.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import struct
from collections.abc import Iterable

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.reversename
import dns.rrset

from ambit.lab.dns.records import ClusterRecords, Endpoint, IPAddress, ServiceRecord

TTL = 5
MAX_CNAME_CHAIN = 8
"""Seconds, for answers and negative answers alike (CoreDNS's kubernetes plugin default)."""
OUR_PAYLOAD = 1232
"""Largest UDP response we send to an EDNS client (the DNS flag day 2020 value)."""
UDP_LIMIT = 512
TCP_LIMIT = 65535
HEADER = 12
_QR = 0x8000


class Transport(enum.Enum):
    UDP = "udp"
    TCP = "tcp"


def respond(records: ClusterRecords, wire: bytes, transport: Transport) -> bytes | None:
    """Rule 1 and rule 10 around :func:`resolve`: the response's bytes, or None to send nothing."""
    if len(wire) < HEADER:
        return None
    (query_id, flags) = struct.unpack("!HH", wire[:4])
    if flags & _QR:
        return None
    if dns.opcode.from_flags(flags) != dns.opcode.QUERY:
        return _bare_error(query_id, flags, dns.rcode.NOTIMP)
    try:
        query = dns.message.from_wire(wire)
    except (dns.exception.DNSException, ValueError, UnicodeError, IndexError, struct.error):
        # dnspython reports malformed input as DNSException, and a few kinds of bad rdata as the stdlib's
        # errors; all of them are the peer's fault and get the same FORMERR.
        return _bare_error(query_id, flags, dns.rcode.FORMERR)
    if len(query.question) != 1:
        return _bare_error(query_id, flags, dns.rcode.FORMERR)
    response = resolve(records, query)
    if transport is Transport.TCP:
        limit = TCP_LIMIT
    elif query.edns >= 0:
        limit = max(UDP_LIMIT, min(query.payload, OUR_PAYLOAD))
    else:
        limit = UDP_LIMIT
    return response.to_wire(max_size=limit, prefer_truncation=True)


def _bare_error(query_id: int, flags: int, rcode: dns.rcode.Rcode) -> bytes:
    message = dns.message.Message(id=query_id)
    opcode_bits = flags & 0x7800
    message.flags = dns.flags.QR | opcode_bits | (flags & dns.flags.RD)
    message.set_rcode(rcode)
    return message.to_wire()


def resolve(records: ClusterRecords, query: dns.message.Message) -> dns.message.Message:
    """Rules 2 to 9 for a parsed query with one question."""
    response = dns.message.make_response(query, our_payload=OUR_PAYLOAD)
    if query.edns > 0:
        response.set_rcode(dns.rcode.BADVERS)
        return response
    question = query.question[0]
    if question.rdclass != dns.rdataclass.IN:
        response.set_rcode(dns.rcode.REFUSED)
        return response
    _Resolver(records, response, question.name, dns.rdatatype.RdataType(question.rdtype)).run()
    return response


_IN_ADDR = dns.name.from_text("in-addr.arpa")
_IP6 = dns.name.from_text("ip6.arpa")


@functools.lru_cache(maxsize=8)
def _zone_name(domain: str) -> dns.name.Name:
    return dns.name.from_text(domain)


def _labels(name: dns.name.Name) -> list[str]:
    return [label.decode("latin-1").lower() for label in name.labels if label]


def _dashed_ip(label: str) -> IPAddress | None:
    parts = label.split("-")
    if len(parts) == 4 and all(p.isdigit() and len(p) <= 3 for p in parts):
        try:
            return ipaddress.IPv4Address(".".join(str(int(p)) for p in parts))
        except ValueError:
            return None
    if 3 <= len(parts) <= 9 and all(len(p) <= 4 and all(c in "0123456789abcdef" for c in p) for p in parts):
        try:
            return ipaddress.IPv6Address(label.replace("-", ":"))
        except ValueError:
            return None
    return None


class _Resolver:
    """One question's answer, written into ``response`` (a short-lived helper of :func:`resolve`)."""

    def __init__(
        self,
        records: ClusterRecords,
        response: dns.message.Message,
        qname: dns.name.Name,
        qtype: dns.rdatatype.RdataType,
        chain: int = 0,
    ) -> None:
        self.records = records
        self.chain = chain
        self.response = response
        self.qname = qname
        self.qtype = qtype
        self.domain = _zone_name(records.domain)

    def run(self) -> None:
        labels = _labels(self.qname)
        if self.qname.is_subdomain(self.domain):
            self.response.flags |= dns.flags.AA
            self._cluster(labels[: len(labels) - len(self.domain.labels) + 1])
        elif self.qname.is_subdomain(_IN_ADDR) or self.qname.is_subdomain(_IP6):
            self._reverse()
        elif ".".join(labels) in self.records.zone:
            self.response.flags |= dns.flags.AA
            self._addresses(self.records.zone[".".join(labels)])
        else:
            self.response.set_rcode(dns.rcode.REFUSED)

    # -- rules 2 to 6 ---------------------------------------------------------------------------------------
    def _cluster(self, rel: list[str]) -> None:
        if not rel:
            return self._apex()
        if rel[-1] == "svc":
            return self._service_names(rel[:-1])
        if rel[-1] == "pod" and len(rel) == 3:
            address = _dashed_ip(rel[0])
            if address is not None:
                return self._answer_or_empty(self._address_rrset(self.qname, [address]))
        return self._nxdomain()

    def _service_names(self, rel: list[str]) -> None:
        if not rel:
            return self._nodata()
        if len(rel) == 1:
            return self._nodata() if rel[0] in self.records.namespaces else self._nxdomain()
        service = self.records.find_service(rel[-1], rel[-2])
        if service is None:
            return self._nxdomain()
        if len(rel) == 2:
            return self._service(service)
        if len(rel) == 3 and service.headless:
            chosen = [e.address for e in self._endpoints(service) if e.name == rel[0]]
            return self._addresses(chosen) if chosen else self._nxdomain()
        if len(rel) == 4 and rel[0].startswith("_") and rel[1].startswith("_"):
            return self._srv(service, rel[0][1:], rel[1][1:])
        return self._nxdomain()

    def _service(self, service: ServiceRecord) -> None:
        if service.external_name is not None:
            target = dns.name.from_text(service.external_name)
            self.response.answer.append(
                dns.rrset.from_text(self.qname, TTL, "IN", "CNAME", target.to_text()),
            )
            if (
                self.qtype != dns.rdatatype.CNAME
                and self.chain < MAX_CNAME_CHAIN
                and self._ours(target)
                and all(rrset.name != target for rrset in self.response.answer)
            ):
                _Resolver(self.records, self.response, target, self.qtype, self.chain + 1).run()
            return None
        if service.headless:
            return self._addresses(sorted({e.address for e in self._endpoints(service)}, key=str))
        return self._addresses(service.addresses)

    def _ours(self, name: dns.name.Name) -> bool:
        """Whether these records answer ``name`` (rule 2's CNAME is followed only then: nothing is forwarded)."""
        return name.is_subdomain(self.domain) or ".".join(_labels(name)) in self.records.zone

    def _endpoints(self, service: ServiceRecord) -> tuple[Endpoint, ...]:
        return self.records.find_endpoints(service.namespace, service.name)

    def _srv(self, service: ServiceRecord, port_name: str, protocol: str) -> None:
        fqdn = dns.name.from_text(f"{service.name}.{service.namespace}.svc", self.domain)
        targets: list[tuple[int, dns.name.Name, Iterable[IPAddress]]] = []
        if service.headless:
            for endpoint in sorted(self._endpoints(service), key=lambda e: (e.name, str(e.address))):
                for port in endpoint.ports:
                    if (port.name, port.protocol) == (port_name, protocol):
                        targets.append(
                            (port.port, dns.name.Name((endpoint.name.encode(), *fqdn.labels)), [endpoint.address])
                        )
        else:
            for port in service.ports:
                if (port.name, port.protocol) == (port_name, protocol):
                    targets.append((port.port, fqdn, service.addresses))
        if not targets:
            return self._nxdomain()
        if self.qtype not in (dns.rdatatype.SRV, dns.rdatatype.ANY):
            return self._nodata()
        texts = [f"0 100 {port} {target.to_text()}" for port, target, _ in targets]
        self.response.answer.append(dns.rrset.from_text_list(self.qname, TTL, "IN", "SRV", texts))
        for _, target, addresses in targets:
            for rdtype, version in (("A", 4), ("AAAA", 6)):
                chosen = sorted({str(a) for a in addresses if a.version == version})
                if chosen:
                    self.response.additional.append(dns.rrset.from_text_list(target, TTL, "IN", rdtype, chosen))
        return None

    def _apex(self) -> None:
        if self.qtype in (dns.rdatatype.SOA, dns.rdatatype.ANY):
            self.response.answer.append(self._soa())
        elif self.qtype == dns.rdatatype.NS:
            nameserver = dns.name.from_text("ns.dns", self.domain).to_text()
            self.response.answer.append(dns.rrset.from_text(self.domain, TTL, "IN", "NS", nameserver))
        else:
            self._nodata()

    # -- rules 7 and 8 --------------------------------------------------------------------------------------
    def _reverse(self) -> None:
        try:
            address = ipaddress.ip_address(dns.reversename.to_address(self.qname))
        except (dns.exception.DNSException, ValueError, UnicodeError):
            address = None
        target = self.records.pointers.get(address) if address is not None else None
        if target is None:
            self.response.set_rcode(dns.rcode.REFUSED)
            return
        self.response.flags |= dns.flags.AA
        if self.qtype in (dns.rdatatype.PTR, dns.rdatatype.ANY):
            self.response.answer.append(dns.rrset.from_text(self.qname, TTL, "IN", "PTR", target + "."))

    # -- answers --------------------------------------------------------------------------------------------
    def _addresses(self, addresses: Iterable[IPAddress]) -> None:
        self._answer_or_empty(self._address_rrset(self.qname, addresses))

    def _address_rrset(self, name: dns.name.Name, addresses: Iterable[IPAddress]) -> dns.rrset.RRset | None:
        want = {dns.rdatatype.A: 4, dns.rdatatype.AAAA: 6}.get(self.qtype)
        if want is None and self.qtype == dns.rdatatype.ANY:
            want = 4
        chosen = sorted({str(a) for a in addresses if a.version == want}) if want else []
        if not chosen:
            return None
        return dns.rrset.from_text_list(name, TTL, "IN", "A" if want == 4 else "AAAA", chosen)

    def _answer_or_empty(self, rrset: dns.rrset.RRset | None) -> None:
        if rrset is None:
            self._nodata()
        else:
            self.response.answer.append(rrset)

    def _soa(self) -> dns.rrset.RRset:
        mname = dns.name.from_text("ns.dns", self.domain).to_text()
        rname = dns.name.from_text("hostmaster", self.domain).to_text()
        text = f"{mname} {rname} 1 7200 1800 86400 {TTL}"
        return dns.rrset.from_text(self.domain, TTL, "IN", "SOA", text)

    def _nodata(self) -> None:
        if self.qname.is_subdomain(self.domain):
            self.response.authority.append(self._soa())

    def _nxdomain(self) -> None:
        self.response.set_rcode(dns.rcode.NXDOMAIN)
        self.response.authority.append(self._soa())
