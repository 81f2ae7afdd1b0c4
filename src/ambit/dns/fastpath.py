"""The common query answered again: a sans-IO response cache in front of dnspython for mesh names (spec §9).

Theory of operation: almost every query a pod sends is one question, class IN, type A or AAAA, for a name the mesh
knows, asked again and again, without EDNS or with a bare OPT record. The first time, the dnspython way
(:mod:`ambit.dns.answer`) answers it and the server hands that response to :meth:`AnswerCache.remember`; after
that :meth:`AnswerCache.answer` reads the query just enough to find it (:func:`parse_simple_query`: strictly,
bounds-checked, never raising) and sends dnspython's response again with the new query's id and RD bit. No packet
is built here: every byte of an answer but those two fields is what dnspython wrote. :class:`AnswerCache` also
keeps, per asked name (in lower case) and type, the mesh's :data:`~ambit.dns.resolution.Resolution`, which the
dnspython way looks up through :meth:`AnswerCache.resolution`.

Rules:

1. A query is simple when it has: a 12-byte header with QR clear and opcode QUERY (other flag bits are read as
   dnspython reads them: only RD matters), QDCOUNT 1, ANCOUNT 0, NSCOUNT 0 and ARCOUNT 0 or 1; a question name of
   plain labels (a length byte 1-63 then the label: no compression pointer, no other label type) ending in the
   root, 255 bytes at most with its length bytes; class IN and type A or AAAA; with ARCOUNT 1, an OPT record
   owned by the root with no options (RDLENGTH 0), its payload size and flags whatever they are; and nothing
   after. Anything else is declined, whatever the bytes (even a truncated header): nothing here raises.
2. dnspython's response to a simple query depends on the query only through its question (name as asked, case
   included, type and class), whether it has EDNS (the response's OPT record is always dnspython's own: payload
   8192, version 0, no flags, no options), its id and its RD bit (``make_response`` copies RD alone). So a
   response is remembered under (the question's bytes, EDNS or not) and replayed with the id and RD of the query
   it answers: the same message dnspython would write for it.
3. Only a mesh answer with at most one address is remembered: the addresses of a longer one are shuffled anew for
   each query, which only the dnspython way does. Forwarded names and errors are never remembered.
4. An answer longer than the client takes is declined (over UDP: 512 bytes, or the EDNS payload size up to 65535;
   over TCP: 65535), so the dnspython way sends it truncated, with TC.
5. Both caches hold one client namespace and network and one state generation: a lookup or a remember with another
   tag empties them first. Each holds at most ``max_entries`` entries; one more empties it, so a pod asking random
   names costs itself a recomputation now and then, and no memory beyond the bound.
6. A response is found by the query's question bytes as they are; they equal a remembered key only if they are
   the plain name of a simple query checked when it was remembered, so a query's name is not read label by label
   on the way to a hit.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ambit.dns.names import Labels
from ambit.dns.resolution import DnsClient, Resolution, ServiceView, host_labels, resolve

MAX_NAME = 255
"""A name's longest wire form (RFC 1035 §3.1), length bytes and root included."""
MAX_LABEL = 63
UDP_DEFAULT_PAYLOAD = 512
MAX_MESSAGE = 65535
MAX_ENTRIES = 1024

_TYPE_A = 1
_TYPE_AAAA = 28
_TYPE_OPT = 41
_CLASS_IN = 1
_QR_OPCODE = 0xF800
_RD = 0x0100
_HEADER = struct.Struct("!HHHHHH")
_TYPE_CLASS = struct.Struct("!HH")
_OPT_TAIL = struct.Struct("!HHIH")
_ID_FLAGS = struct.Struct("!HH")
_FLAGS = struct.Struct("!H")


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


class RenderedMessage(Protocol):
    """A response the dnspython way made (``dns.message.Message``; this module does not import dnspython)."""

    def to_wire(self) -> bytes: ...


class AnswerCache:
    """What the mesh answers, per name and type, for the client of one DNS proxy (rule 5)."""

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
        self._entries: dict[tuple[bytes, int], Resolution] = {}
        self._answers: dict[tuple[bytes, bool], tuple[int, bytes]] = {}
        """(question bytes, EDNS or not) → the remembered response's flags but RD, and its bytes after the flags."""
        self._tag: tuple[int, str, str] | None = None

    def answer(self, client: DnsClient, wire: bytes, *, udp: bool) -> tuple[bytes, int] | None:
        """A remembered answer to ``wire`` from ``client`` and the query's type, or ``None`` to leave the message
        to the dnspython way (rules 1, 2, 4, 6)."""
        query = parse_simple_query(wire, check_name=False)
        if query is None or not self._current(client):
            return None
        found = self._answers.get((wire[12 : query.question_end], query.payload is not None))
        if found is None:
            return None
        flags, rest = found
        if len(rest) + 4 > (query.max_udp_size if udp else MAX_MESSAGE):
            return None
        return _ID_FLAGS.pack(query.id, flags | (query.flags & _RD)) + rest, query.rdtype

    def remember(self, client: DnsClient, wire: bytes, response: RenderedMessage, addresses: int) -> None:
        """Keep the dnspython way's mesh answer ``response`` to ``wire``, which had ``addresses`` addresses, for the
        next query with the same question (rules 2, 3, 5)."""
        if addresses > 1 or self._versioned is None:
            return
        query = parse_simple_query(wire)
        if query is None:
            return
        self._current(client)
        rendered = response.to_wire()
        if len(rendered) > MAX_MESSAGE or len(rendered) < 12:
            return
        if len(self._answers) >= self._max_entries:
            self._answers.clear()
        (flags,) = _FLAGS.unpack_from(rendered, 2)
        self._answers[(wire[12 : query.question_end], query.payload is not None)] = (flags & ~_RD, rendered[4:])

    def find(self, client: DnsClient, key: bytes, rdtype: int) -> Resolution:
        """The mesh's resolution of the name with ``key`` (:func:`name_key`) for ``client``."""
        if self._current(client):
            found = self._entries.get((key, rdtype))
            if found is not None:
                return found
        found = resolve(self._view, client, host_labels(_raw_labels(key)), rdtype, domain=self._domain, ipv6=self._ipv6)
        if self._versioned is not None:
            if len(self._entries) >= self._max_entries:
                self._entries.clear()
            self._entries[(key, rdtype)] = found
        return found

    def resolution(self, client: DnsClient, raw_labels: Sequence[bytes], rdtype: int) -> Resolution:
        """:func:`~ambit.dns.resolution.resolve` through the cache, for the dnspython way."""
        return self.find(client, name_key(raw_labels), rdtype)

    def __len__(self) -> int:
        return len(self._entries) + len(self._answers)

    def _current(self, client: DnsClient) -> bool:
        """Whether the caches are for ``client`` and the view's generation; empties them when not (rule 5)."""
        if self._versioned is None:  # a view that cannot say when it changes: nothing is kept
            return False
        tag = (self._versioned.generation, client.namespace, client.network)
        if tag != self._tag:
            self._entries.clear()
            self._answers.clear()
            self._tag = tag
            return False
        return True
