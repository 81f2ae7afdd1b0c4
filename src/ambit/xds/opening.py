"""A delta ADS request as the server reads it off the wire, with a reconnect's held versions left encoded. Pure.

Theory of operation: a node proxy reconnecting after a control-plane restart opens with every resource it holds
named in ``initial_resource_versions`` (110,000 names: ~6.7 MB). Parsed as the map it is declared as, that request
costs the server a hash table of every name in the parser and, to compare it with the set, a Python step or a
C comparison per name; almost always the answer is "exactly the set's versions" (session rule 12). So the server
parses requests with :data:`WIRE_REQUEST`: the same message with field 5 declared as ``repeated bytes``, which
protobuf's wire format allows (a map is a repeated message of ``key = 1, value = 2`` entries), so each entry stays
the bytes it came as. :func:`parse_request` returns a plain :class:`~ambit.api.discovery_pb2.DeltaDiscoveryRequest`
for a request without held versions, and a :class:`Reconnect` otherwise: the request with every field but the held
versions, and the held versions as :class:`WireVersions`.

Rules:

1. A request without held versions parses exactly as ``DeltaDiscoveryRequest.FromString`` would.
2. :meth:`WireVersions.digest` is an order-free digest of the entries: their count and the sum of their
   (per-process keyed) hashes. Two encodings of the same entries in any order have the same digest; different
   entries have a different one except with probability about 2^-64 (the hash key is secret to the process, so a
   peer cannot aim at a collision; and what a client's held versions decide is only what that client is sent).
3. A set's digest is made from the set's own request (:meth:`~ambit.xds.resource_set.ResourceSet.versions_request`)
   encoded by the same protobuf runtime, so a client whose entries are encoded as protobuf encodes a map entry
   (key, then value, each once) matches it; an entry encoded otherwise (fields swapped, repeated, or a default
   left out) does not, and that reconnect is held name by name through :meth:`WireVersions.parsed`, the map
   protobuf gives, as if the digest had not been tried. The digest can say "equal" wrongly (rule 2), never
   "different" wrongly for a difference that matters: a mismatch only costs the slower comparison.
4. :meth:`WireVersions.parsed` parses the request bytes again as the declared map (duplicate keys: the last wins,
   as protobuf's parsers do), only when the digest did not match.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from ambit.api import discovery_pb2 as dpb

__all__ = ["WIRE_REQUEST", "Reconnect", "WireVersions", "parse_request", "set_fields", "versions_digest"]

_VERSIONS_FIELD = dpb.DeltaDiscoveryRequest.DESCRIPTOR.fields_by_name["initial_resource_versions"]


def _wire_request_class() -> type[Message]:
    """``DeltaDiscoveryRequest`` with its held versions as ``repeated bytes``, in a pool of its own (so that the
    same full name can be declared twice)."""
    pool = descriptor_pool.DescriptorPool()
    pending = [dpb.DESCRIPTOR]
    files: list[descriptor_pb2.FileDescriptorProto] = []
    while pending:  # the file and everything it imports, dependencies first
        file = pending.pop()
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        files.insert(0, proto)
        pending.extend(file.dependencies)
    added: set[str] = set()
    for proto in files:
        if proto.name in added:
            continue
        added.add(proto.name)
        if proto.name == dpb.DESCRIPTOR.name:
            (message,) = (m for m in proto.message_type if m.name == "DeltaDiscoveryRequest")
            (versions,) = (f for f in message.field if f.number == _VERSIONS_FIELD.number)
            versions.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
            versions.ClearField("type_name")  # and the map's entry type goes: nothing refers to it
            kept = [n for n in message.nested_type if not n.options.map_entry]
            del message.nested_type[:]
            message.nested_type.extend(kept)
        pool.Add(proto)
    full_name = dpb.DeltaDiscoveryRequest.DESCRIPTOR.full_name
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))


WIRE_REQUEST = _wire_request_class()
"""The request message with ``initial_resource_versions`` as ``repeated bytes`` (one encoded entry each)."""


@dataclass(frozen=True, slots=True, eq=False)
class WireVersions:
    """A request's ``initial_resource_versions`` as sent: each map entry's encoding, and the request's bytes."""

    entries: Sequence[bytes]
    data: bytes
    """The whole request as received (held only while the request is decided; no copy of it is made)."""

    def __len__(self) -> int:
        return len(self.entries)

    def digest(self) -> tuple[int, int]:
        """Rule 2: (count, sum of the entries' hashes)."""
        return versions_digest(self.entries)

    def parsed(self) -> Mapping[str, str]:
        """Rule 4: the held versions as the map the request declares."""
        return dpb.DeltaDiscoveryRequest.FromString(self.data).initial_resource_versions


@dataclass(frozen=True, slots=True, eq=False)
class Reconnect:
    """A request that names held versions: every other field as a plain request, the held versions left encoded."""

    request: dpb.DeltaDiscoveryRequest
    """The request without ``initial_resource_versions``."""
    versions: WireVersions


def versions_digest(entries: Sequence[bytes]) -> tuple[int, int]:
    """Rule 2 over encoded entries."""
    return len(entries), sum(map(hash, entries))


def parse_request(data: bytes) -> dpb.DeltaDiscoveryRequest | Reconnect:
    """The server's request deserializer (rules 1 and 4)."""
    wire = WIRE_REQUEST.FromString(data)
    entries = wire.initial_resource_versions  # type: ignore[attr-defined]
    if not entries:
        return dpb.DeltaDiscoveryRequest.FromString(data)
    return Reconnect(dpb.DeltaDiscoveryRequest.FromString(_without_versions(wire)), WireVersions(entries, data))


def _without_versions(wire: Message) -> bytes:
    """The encoding of ``wire``'s fields other than the held versions (the request's head: a few hundred bytes),
    copied field by field: parsing the request a second time to drop them cost as much as the first parse."""
    head = WIRE_REQUEST()
    set_fields(head, [(f, v) for f, v in wire.ListFields() if f.number != _VERSIONS_FIELD.number])
    return head.SerializeToString()


def set_fields(message: Message, fields: Iterable[tuple[FieldDescriptor, Any]]) -> None:
    """Give ``message`` the values of ``fields`` (a message's ``ListFields()``, of the same message type)."""
    for descriptor, value in fields:
        if descriptor.is_repeated:
            getattr(message, descriptor.name).extend(value)
        elif descriptor.message_type is not None:
            getattr(message, descriptor.name).CopyFrom(value)
        else:
            setattr(message, descriptor.name, value)


def encoded_entries(request: dpb.DeltaDiscoveryRequest) -> list[bytes]:
    """The entries of ``request``'s held versions as this protobuf runtime encodes them (rule 3)."""
    return list(WIRE_REQUEST.FromString(request.SerializeToString()).initial_resource_versions)  # type: ignore[attr-defined]
