"""Responses encoded once for every client that is sent the same resources (issue 22's fan-out), sans-IO.

Theory of operation: when a change reaches many node proxies, each one's :class:`~ambit.xds.session.ServerSession`
decides the same :class:`~ambit.xds.session.Delta` (the same resources and removals; only the nonce differs), and a
client that opens a type holding nothing is sent the whole set, as every other such client is. A
:class:`FrameCache` encodes that response body once and hands every such client a :class:`Frame`: the shared body
plus that client's own encoded nonce. The gRPC shell sends ``frame.data()`` as the message's bytes.

Rules:

1. A frame's ``body`` is the encoded ``DeltaDiscoveryResponse`` without a nonce: ``type_url``, each resource, each
   removed name. Its ``tail`` is the encoding of a response holding only the client's ``nonce``. Protobuf reads
   the fields of a message in any order, concatenates repeated fields and keeps a scalar's last occurrence; the
   body never holds a nonce, so ``body + tail`` parses to exactly :meth:`Delta.message` (tested with hypothesis).
2. A body is found by the snapshot it was made for (the :class:`~ambit.xds.resource_set.ResourceSet` object, by
   identity) and, within it, by the names and versions sent and the names removed. A version is a content hash:
   the session already treats an equal version as equal content (it never resends it), so an equal key is an
   equal body.
3. Bound: per type URL, bodies of the last :attr:`FrameSettings.snapshots` snapshots asked about are kept (a
   newer snapshot retires the oldest with all its bodies), and all bodies together stay within
   :attr:`FrameSettings.max_bytes`, least recently used out first; the body just made is always kept, so the
   cache holds at most ``max_bytes`` plus one body (a wildcard answer of 100,000 workloads is ~34 MiB).
4. Pure bookkeeping: no clock, no I/O; :attr:`FrameCache.encodings` and :attr:`FrameCache.reuses` count what it did.

Size: a response is never split. The server's gRPC sends any size (grpcio's send limit is off by default) and
HTTP/2 carries it in flow-controlled DATA frames as the client reads; the limit is the client's receive cap:
ztunnel's ADS client decodes up to 200 MiB, our node proxy up to 256 MiB (``ambit.xds.client``). An Address is
~190 bytes on the wire, so the wildcard answer reaches ztunnel's cap near a million workloads, ten times issue 22's
target. Splitting it would cost more than it saves: ztunnel (and our client) counts a type as synced, and turns
ready, at its first ACKed response, so the first part of a split answer would make a node proxy ready with part
of the mesh. The shell counts and logs any frame over :data:`LARGEST_CLIENT_MESSAGE` instead.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from ambit import protowire
from ambit.api import discovery_pb2 as dpb
from ambit.xds.resource_set import ResourceSet, XdsResource
from ambit.xds.session import Delta

__all__ = ["DEFAULT_FRAME_SETTINGS", "LARGEST_CLIENT_MESSAGE", "Frame", "FrameCache", "FrameSettings"]

LARGEST_CLIENT_MESSAGE = 200 * 1024 * 1024
"""The largest response every node proxy accepts: ztunnel's ADS decode limit (ours is 256 MiB)."""

_Key = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]
_REMEMBERED = 8
"""Resource tuples whose keys are remembered by identity (rule 3's bound covers the bodies; this, the keys)."""
_REMEMBERED_FROM = 64
"""Only tuples this long are worth remembering: a push's few resources are keyed faster than looked up."""


@dataclass(frozen=True, slots=True)
class FrameSettings:
    """How much a :class:`FrameCache` keeps (rule 3)."""

    snapshots: int = 2
    """Snapshots per type URL whose bodies are kept: the current one, and the one before for the clients of a push
    round that started just before a change."""
    max_bytes: int = 128 * 1024 * 1024
    """All bodies together, beyond the one just made."""


DEFAULT_FRAME_SETTINGS = FrameSettings()


@dataclass(frozen=True, slots=True)
class Frame:
    """One client's response as bytes: a shared ``body`` and that client's ``tail`` (rule 1)."""

    type_url: str
    body: bytes
    tail: bytes

    def data(self) -> bytes:
        """The message's encoding, as gRPC sends it."""
        return self.body + self.tail

    def __len__(self) -> int:
        return len(self.body) + len(self.tail)


class FrameCache:
    """Encoded response bodies shared between clients (rules 1-4)."""

    __slots__ = ("_bodies", "_bytes", "_kept", "_keys", "_settings", "encodings", "reuses")

    def __init__(self, settings: FrameSettings = DEFAULT_FRAME_SETTINGS) -> None:
        self._settings = settings
        self._kept: dict[str, list[ResourceSet]] = {}
        """Type URL → the snapshots whose bodies are kept, newest last; held so that no newer set can take the
        identity of one whose bodies are still here."""
        self._bodies: OrderedDict[tuple[str, int, _Key], bytes] = OrderedDict()  # least recently used first
        self._bytes = 0
        self._keys: OrderedDict[int, tuple[tuple[XdsResource, ...], _Key]] = OrderedDict()
        """The keys of the last resource tuples seen, by identity (each held, so its id stays its own): clients
        of one snapshot's wildcard answer share one tuple (session rule 9), whose key is then built once."""
        self.encodings = 0
        """Bodies encoded."""
        self.reuses = 0
        """Frames made from a body encoded for another client."""

    @property
    def size(self) -> int:
        """Bytes of bodies held."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._bodies)

    def frame(self, current: ResourceSet, delta: Delta) -> Frame:
        """``delta`` (decided by a session from ``current``) as bytes, its body shared with every other client sent
        the same resources of the same snapshot."""
        self._keep(delta.type_url, current)
        key = (delta.type_url, id(current), self._key(delta))
        body = self._bodies.get(key)
        if body is None:
            body = self._bodies[key] = _body(delta)
            self.encodings += 1
            self._bytes += len(body)
            while self._bytes - len(body) > self._settings.max_bytes:  # rule 3: the newest (last) stays
                _, dropped = self._bodies.popitem(last=False)
                self._bytes -= len(dropped)
        else:
            self._bodies.move_to_end(key)
            self.reuses += 1
        return Frame(delta.type_url, body, dpb.DeltaDiscoveryResponse(nonce=delta.nonce).SerializeToString())

    def _key(self, delta: Delta) -> _Key:
        resources = delta.resources
        seen = self._keys.get(id(resources))
        if seen is not None and seen[0] is resources and seen[1][2] == delta.removed:
            return seen[1]
        key = (tuple(r.name for r in resources), tuple(r.version for r in resources), delta.removed)
        if len(resources) >= _REMEMBERED_FROM:
            self._keys[id(resources)] = (resources, key)
            while len(self._keys) > _REMEMBERED:
                self._keys.popitem(last=False)
        return key

    def _keep(self, type_url: str, current: ResourceSet) -> None:
        kept = self._kept.setdefault(type_url, [])
        if kept and kept[-1] is current:  # the newest: every stream's push of a change asks about it
            return
        if any(snapshot is current for snapshot in kept):
            return
        kept.append(current)
        if len(kept) > self._settings.snapshots:
            retired = id(kept.pop(0))
            for key in [k for k in self._bodies if k[0] == type_url and k[1] == retired]:
                self._bytes -= len(self._bodies.pop(key))


RESOURCES_TAG = protowire.key(2, protowire.LENGTH)
"""``DeltaDiscoveryResponse.resources`` (field 2, length-delimited): each resource's encoding follows it."""


def _body(delta: Delta) -> bytes:
    """Rule 1: the response without its nonce, assembled from each resource's own encoding (field 2, in order)
    followed by the encoded rest (fields 4 and 6): the bytes ``SerializeToString`` gives for the whole message,
    which writes its fields in number order, without a ``Resource`` message per resource."""
    parts: list[bytes] = []
    for resource in delta.resources:
        wire = resource.wire
        parts += (RESOURCES_TAG, protowire.varint(len(wire)), wire)
    rest = dpb.DeltaDiscoveryResponse(type_url=delta.type_url, removed_resources=delta.removed)
    parts.append(rest.SerializeToString())
    return b"".join(parts)
