"""The common query answered from bytes: a sans-IO shortcut past dnspython for mesh names (spec §9).

Theory of operation: almost every query a pod sends is one question, class IN, type A or AAAA, for a name the mesh
knows, without EDNS or with a bare OPT record. :func:`parse_simple_query` reads exactly such a query (strictly,
bounds-checked, never raising); :class:`AnswerCache` holds, per asked name (in lower case) and type, the mesh's
:data:`~ambit.dns.answer.Resolution` and, for an answer, its records as wire bytes (a :class:`Template`);
:func:`build_answer` joins the header, the question as asked and the template. Whatever this module declines
(``None``, or a :class:`~ambit.dns.answer.Forward` from the cache) goes the dnspython way
(:mod:`ambit.dns.answer`), which answers it as before: the two paths give the same answer to every query the fast
one takes (the same id, flags, question, records, and EDNS record, up to compression and the shuffle).

Rules:

1. A query is simple when it has: a 12-byte header with QR clear and opcode QUERY (other flag bits are read as
   dnspython reads them: only RD matters), QDCOUNT 1, ANCOUNT 0, NSCOUNT 0 and ARCOUNT 0 or 1; a question name of
   plain labels (a length byte 1-63 then the label: no compression pointer, no other label type) ending in the
   root, 255 bytes at most with its length bytes; class IN and type A or AAAA; with ARCOUNT 1, an OPT record
   owned by the root with no options (RDLENGTH 0), its payload size and flags whatever they are; and nothing
   after. Anything else is declined, whatever the bytes (even a truncated header): nothing here raises.
2. The answer: the query's id; flags QR, AA and the query's RD, opcode QUERY, NOERROR (dnspython's
   ``make_response`` plus AA); the question copied as asked (its case kept); the records; with EDNS, an OPT
   record advertising 8192 bytes, version 0, no flags, no options. Every owner name is a compression pointer: to
   the question, or in a CNAME answer (:mod:`ambit.dns.answer` rule 6) to the CNAME's target, which is the asked
   name's first labels as asked. The order of the addresses is the shuffle's.
3. An answer longer than the client takes is declined (over UDP: 512 bytes, or the EDNS payload size up to 65535;
   over TCP: 65535), so the dnspython way sends it truncated, with TC.
4. The cache answers for one client namespace and network and one state generation: a lookup with another tag
   empties it first. It holds at most ``max_entries`` names (answered and forwarded alike); one more empties it,
   so a pod asking random names costs itself a recomputation now and then, and no memory beyond the bound.
5. A name found in the cache is not read label by label again: its key is the lower-cased wire form of a name
   read before (plain labels, or dnspython's reading of the name), and lower-casing leaves every length byte
   (at most 63) as it is and turns no other byte into one, so bytes that lower-case to a key are a plain name
   with the same labels. Only a name the cache does not hold is checked (:func:`plain_name`) before it is
   resolved and kept.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ambit.dns.names import Labels
from ambit.dns.resolution import TTL, DnsClient, Forward, Records, Resolution, ServiceView, host_labels, resolve

MAX_NAME = 255
"""A name's longest wire form (RFC 1035 §3.1), length bytes and root included."""
MAX_LABEL = 63
UDP_DEFAULT_PAYLOAD = 512
MAX_MESSAGE = 65535
OUR_PAYLOAD = 8192
"""The payload size a response's OPT record advertises (dnspython's ``make_response`` default)."""
MAX_ENTRIES = 1024

_TYPE_A = 1
_TYPE_AAAA = 28
_TYPE_CNAME = 5
_TYPE_OPT = 41
_CLASS_IN = 1
_QR_OPCODE = 0xF800
_RD = 0x0100
_RESPONSE_FLAGS = 0x8400  # QR, AA; opcode QUERY, rcode NOERROR
_HEADER = struct.Struct("!HHHHHH")
_TYPE_CLASS = struct.Struct("!HH")
_RR_FIXED = struct.Struct("!HHIH")
_OPT_TAIL = struct.Struct("!HHIH")
_POINTER = struct.Struct("!H")
_TO_QUESTION = b"\xc0\x0c"
_OPT_RECORD = b"\x00" + _RR_FIXED.pack(_TYPE_OPT, OUR_PAYLOAD, 0, 0)


@dataclass(frozen=True, slots=True)
class SimpleQuery:
    """A query of rule 1, as offsets into its wire form."""

    id: int
    flags: int
    name_end: int
    """Offset just after the question name's root label."""
    rdtype: int
    payload: int | None
    """The EDNS payload size, or ``None`` without EDNS."""

    @property
    def question_end(self) -> int:
        return self.name_end + 4

    @property
    def max_udp_size(self) -> int:
        if self.payload is None:
            return UDP_DEFAULT_PAYLOAD
        return max(UDP_DEFAULT_PAYLOAD, min(self.payload, MAX_MESSAGE))


def parse_simple_query(wire: bytes, *, check_name: bool = True) -> SimpleQuery | None:
    """``wire`` as a query of rule 1, or ``None`` (declined) for anything else; never raises.

    The question name is where the message's size puts it (the fixed-size question tail and OPT record come
    after it); ``check_name=False`` leaves its labels unread, for a caller that finds the name among names read
    before (rule 5 of :class:`AnswerCache`)."""
    size = len(wire)
    if size < 17:  # header, root name, type, class
        return None
    qid, flags, qdcount, ancount, nscount, arcount = _HEADER.unpack_from(wire)
    if flags & _QR_OPCODE or qdcount != 1 or ancount or nscount or arcount > 1:
        return None
    payload: int | None = None
    name_end = size - 4
    if arcount:
        name_end -= 11
        if name_end < 13 or wire[name_end + 4] != 0:
            return None
        opt_type, payload, _ttl, rdlength = _OPT_TAIL.unpack_from(wire, name_end + 5)
        if opt_type != _TYPE_OPT or rdlength:
            return None
    rdtype, rdclass = _TYPE_CLASS.unpack_from(wire, name_end)
    if rdclass != _CLASS_IN or rdtype not in (_TYPE_A, _TYPE_AAAA):
        return None
    if check_name and not plain_name(wire, name_end):
        return None
    return SimpleQuery(qid, flags, name_end, rdtype, payload)


def plain_name(wire: bytes, name_end: int) -> bool:
    """Whether ``wire[12:name_end]`` is a name of plain labels ending in the root, 255 bytes at most (rule 1)."""
    if name_end - 12 > MAX_NAME:
        return False
    offset = 12
    last = name_end - 1
    while offset < last:
        length = wire[offset]
        if length == 0 or length > MAX_LABEL:  # the root too early, a compression pointer, another label type
            return False
        offset += length + 1
    return offset == last and wire[last] == 0


def name_key(raw_labels: Sequence[bytes]) -> bytes:
    """The cache key of a name given as its raw labels (the root's empty one last): its wire form, ASCII lower
    case, as :func:`parse_simple_query`'s question name lowered. Equal keys give equal :func:`host_labels`."""
    return b"".join(bytes((len(label),)) + label for label in raw_labels).lower()


def _raw_labels(key: bytes) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    while offset < len(key):
        length = key[offset]
        out.append(key[offset + 1 : offset + 1 + length])
        offset += 1 + length
    return out


@runtime_checkable
class VersionedView(ServiceView, Protocol):
    """A service view that says when it changes (:class:`~ambit.model.state.WorkloadState` is one)."""

    @property
    def generation(self) -> int:
        """Differs after every change."""
        ...


@dataclass(frozen=True, slots=True)
class Template:
    """An answer's records as wire bytes, but for their owner names."""

    records: Records
    rdata: tuple[bytes, ...]
    """Per address: TYPE, CLASS, TTL, RDLENGTH and RDATA."""

    @classmethod
    def of(cls, records: Records) -> Template:
        rdata = tuple(
            _RR_FIXED.pack(records.rdtype, _CLASS_IN, TTL, len(address.packed)) + address.packed
            for address in records.addresses
        )
        return cls(records, rdata)


class AnswerCache:
    """What the mesh answers, per name and type, for the client of one DNS proxy (rule 4)."""

    def __init__(
        self,
        view: ServiceView,
        *,
        domain: Labels,
        ipv6: bool,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self._view = view
        self._versioned = view if isinstance(view, VersionedView) else None
        self._domain = domain
        self._ipv6 = ipv6
        self._max_entries = max_entries
        self._entries: dict[tuple[bytes, int], Template | Forward] = {}
        self._tag: tuple[int, str, str] | None = None

    def answer(
        self, client: DnsClient, wire: bytes, *, udp: bool, shuffle: Callable[[list[bytes]], None] | None = None
    ) -> tuple[bytes, int] | None:
        """The fast path for one message from ``client``: the answer and the query's type, or ``None`` to leave
        the message to the dnspython way (rules 1-3)."""
        query = parse_simple_query(wire, check_name=False)
        if query is None:
            return None
        key = wire[12 : query.name_end].lower()
        found = self._cached(client, key, query.rdtype)
        if found is None:
            if not plain_name(wire, query.name_end):
                return None
            found = self._store(key, query.rdtype, self._compute(client, key, query.rdtype))
        if isinstance(found, Forward):
            return None
        answer = build_answer(query, wire, found, shuffle)
        if len(answer) > (query.max_udp_size if udp else MAX_MESSAGE):
            return None
        return answer, query.rdtype

    def find(self, client: DnsClient, key: bytes, rdtype: int) -> Template | Forward:
        """The answer's template, or why to forward, for the name with ``key`` (:func:`name_key`)."""
        found = self._cached(client, key, rdtype)
        if found is None:
            found = self._store(key, rdtype, self._compute(client, key, rdtype))
        return found

    def resolution(self, client: DnsClient, raw_labels: Sequence[bytes], rdtype: int) -> Resolution:
        """:func:`~ambit.dns.answer.resolve` through the cache, for the dnspython way."""
        found = self.find(client, name_key(raw_labels), rdtype)
        return found if isinstance(found, Forward) else found.records

    def __len__(self) -> int:
        return len(self._entries)

    def _cached(self, client: DnsClient, key: bytes, rdtype: int) -> Template | Forward | None:
        if self._versioned is None:  # a view that cannot say when it changes: nothing is kept
            return None
        tag = (self._versioned.generation, client.namespace, client.network)
        if tag != self._tag:
            self._entries.clear()
            self._tag = tag
            return None
        return self._entries.get((key, rdtype))

    def _store(self, key: bytes, rdtype: int, found: Template | Forward) -> Template | Forward:
        if self._versioned is not None:
            if len(self._entries) >= self._max_entries:
                self._entries.clear()
            self._entries[(key, rdtype)] = found
        return found

    def _compute(self, client: DnsClient, key: bytes, rdtype: int) -> Template | Forward:
        labels = host_labels(_raw_labels(key))
        resolution = resolve(self._view, client, labels, rdtype, domain=self._domain, ipv6=self._ipv6)
        return resolution if isinstance(resolution, Forward) else Template.of(resolution)


def build_answer(
    query: SimpleQuery, wire: bytes, template: Template, shuffle: Callable[[list[bytes]], None] | None = None
) -> bytes:
    """The answer to ``query`` (read from ``wire``) with ``template``'s records (rule 2)."""
    rdata: Sequence[bytes] = template.rdata
    if shuffle is not None and len(rdata) > 1:
        rdata = list(rdata)
        shuffle(rdata)
    question_end = query.question_end
    cname_labels = template.records.cname_labels if rdata else None
    count = len(rdata) + (cname_labels is not None)
    header = _HEADER.pack(
        query.id, _RESPONSE_FLAGS | (query.flags & _RD), 1, count, 0, 0 if query.payload is None else 1
    )
    parts = [header, wire[12:question_end]]
    if cname_labels is None:
        parts.extend(_TO_QUESTION + record for record in rdata)
    else:
        offset = 12
        for _ in range(cname_labels):
            offset += wire[offset] + 1
        target = wire[12:offset] + b"\x00"
        parts.append(_TO_QUESTION + _RR_FIXED.pack(_TYPE_CNAME, _CLASS_IN, TTL, len(target)) + target)
        to_target = _POINTER.pack(0xC000 | (question_end + 12))  # the CNAME's owner pointer and fixed fields
        parts.extend(to_target + record for record in rdata)
    if query.payload is not None:
        parts.append(_OPT_RECORD)
    return b"".join(parts)
