"""What the simulated wildcard clients of one worker process hold, shared by content (issue 22).

A node proxy holds every name and version it was sent, so that a reconnect names them
(:mod:`ambit.xds.client_session`, rule 4). Each simulated client holding its own map of 110,000 names and versions
was ~22 MB (the names and versions as strings of their own, and the dict), 250 clients per worker 5.5 GB: at the full
size a worker was killed by the kernel's OOM killer. But wildcard clients in sync hold the same map.

Rules:

1. A :class:`HeldPool` (one per worker process and type) keeps each distinct held map once, keyed by its digest: the
   XOR of ``hash((name, version))`` over its entries (a process-local, order-free 64-bit digest, updated in the size
   of a change). A client holds a digest and a reference to the pool's map, never a map of its own; the pool
   forgets a map when no client holds it any more.
2. A response moves a client from its map to the map with the response applied: the new digest is computed from the
   response and the entries it replaces; when another client of the worker already holds that map it is shared,
   otherwise the first client to reach it copies its old map once and applies the change. Names and versions are
   interned in the pool, so maps that are copied share their strings.
3. :class:`WildcardSession` is :class:`~ambit.xds.client_session.ClientSession` for a wildcard client (the same
   opening requests, the same ACKs and NACKs, rule 5's resync when what it holds is over the opening request's
   limit, the same upserts and removals reported), but keeps its maps in the pool; on-demand clients hold a few
   hundred names and keep the session of their own.
4. A reconnecting client sends its held versions (110,000 names: 6.7 MB): the pool encodes them once per map, and
   a client's opening is its own fields' encoding followed by those bytes (protobuf reads concatenated encodings
   of disjoint fields as one message). Building and encoding them per attempt cost ~50 ms of CPU and ~15 MB a
   client, so 1,000 clients retrying while the control plane restarted took the machine's CPU from the starting
   control plane and a worker past 6 GB (killed by the OOM killer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ambit.api import discovery_pb2 as dpb
from ambit.xds.client_session import MAX_INITIAL_REQUEST_BYTES, NACK_CODE

Held = dict[str, str]


class HeldPool:
    """The distinct held maps of one type in one worker (rule 1) and the strings they share (rule 2)."""

    def __init__(self) -> None:
        self._maps: dict[int, list[object]] = {0: [{}, 0]}
        self._openings: dict[int, bytes] = {}
        self._strings: dict[str, str] = {}
        self.copies = 0
        """How many maps were made (rule 2's first client to reach one)."""

    def __len__(self) -> int:
        return len(self._maps)

    def intern(self, text: str) -> str:
        return self._strings.setdefault(text, text)

    def get(self, digest: int) -> Held | None:
        entry = self._maps.get(digest)
        return None if entry is None else entry[0]  # type: ignore[return-value]

    def opening(self, digest: int) -> bytes:
        """Rule 4: the held versions of the map with ``digest`` as a request's encoded ``initial_resource_versions``,
        encoded once per map."""
        encoded = self._openings.get(digest)
        if encoded is None:
            held = self.get(digest) or {}
            encoded = dpb.DeltaDiscoveryRequest(initial_resource_versions=held).SerializeToString()
            self._openings[digest] = encoded
        return encoded

    def hold(self, digest: int, held: Held) -> Held:
        """Count one more holder of the map with ``digest`` (``held`` is it, when new); the pool's map."""
        entry = self._maps.get(digest)
        if entry is None:
            entry = self._maps[digest] = [held, 0]
            self.copies += 1
        entry[1] = int(entry[1]) + 1  # type: ignore[call-overload]
        return entry[0]  # type: ignore[return-value]

    def release(self, digest: int) -> None:
        entry = self._maps.get(digest)
        if entry is None:
            return
        entry[1] = int(entry[1]) - 1  # type: ignore[call-overload]
        if int(entry[1]) <= 0 and digest != 0:  # type: ignore[call-overload]
            del self._maps[digest]
            self._openings.pop(digest, None)


def entry_hash(name: str, version: str) -> int:
    return hash((name, version)) & 0xFFFF_FFFF_FFFF_FFFF


@dataclass(frozen=True, slots=True)
class Applied:
    """One response's effect, as the harness counts it."""

    type_url: str
    upserts: tuple[str, ...]
    removals: tuple[str, ...]
    reply: dpb.DeltaDiscoveryRequest


class WildcardSession:
    """Rule 3: a wildcard client's session whose held maps live in the worker's pools."""

    def __init__(
        self, pools: Mapping[str, HeldPool], *, node: dpb.Node, max_initial_request: int = MAX_INITIAL_REQUEST_BYTES
    ) -> None:
        self._pools = pools
        self._node = node
        self._max_initial_request = max_initial_request
        self._digests: dict[str, int] = {}
        self._held: dict[str, Held] = {}
        for type_url, pool in pools.items():
            self._digests[type_url] = 0
            self._held[type_url] = pool.hold(0, {})
        self._first_seen: set[str] = set()
        self._resync: set[str] = set()
        self.synced = False

    def count(self, type_url: str) -> int:
        return len(self._held.get(type_url, ()))

    def pending(self, type_url: str) -> frozenset[str]:
        return frozenset()

    def initial_requests(self) -> list[bytes]:
        """The opening requests, encoded (rule 4): the node proxy's, byte for byte in content."""
        self._first_seen.clear()
        self._resync.clear()
        requests = []
        for type_url in self._held:
            head = dpb.DeltaDiscoveryRequest(node=self._node, type_url=type_url).SerializeToString()
            versions = self._pools[type_url].opening(self._digests[type_url])
            if len(head) + len(versions) > self._max_initial_request:
                versions = b""
                self._resync.add(type_url)
            requests.append(head + versions)  # two encodings of disjoint fields concatenated: one message
        return requests

    def apply(self, response: dpb.DeltaDiscoveryResponse) -> Applied:
        type_url = response.type_url
        reply = dpb.DeltaDiscoveryRequest(type_url=type_url, response_nonce=response.nonce)
        pool = self._pools.get(type_url)
        if pool is None:
            reply.error_detail.code, reply.error_detail.message = NACK_CODE, f"type {type_url!r} was not subscribed"
            return Applied(type_url, (), (), reply)
        old = self._held[type_url]
        delta: dict[str, str | None] = {}
        errors: list[str] = []
        for resource in response.resources:
            if not resource.name:
                errors.append(": name: required")
                continue
            if not resource.HasField("resource"):
                errors.append(f"{resource.name}: resource: missing (no body)")
                continue
            delta[pool.intern(resource.name)] = pool.intern(resource.version)
        upserts = tuple(delta)
        removals: list[str] = []
        for name in response.removed_resources:
            present = delta[name] is not None if name in delta else name in old
            if present:
                delta[pool.intern(name)] = None
                removals.append(name)
        if type_url in self._resync:  # the first response after opening without versions is everything
            self._resync.discard(type_url)
            for name in old:
                if name not in delta:
                    delta[name] = None
                    removals.append(name)
        digest = self._digests[type_url]
        for name, version in delta.items():
            before = old.get(name)
            if before is not None:
                digest ^= entry_hash(name, before)
            if version is not None:
                digest ^= entry_hash(name, version)
        if digest != self._digests[type_url]:
            shared = pool.get(digest)
            if shared is None:
                shared = dict(old)
                for name, version in delta.items():
                    if version is None:
                        shared.pop(name, None)
                    else:
                        shared[name] = version
            self._held[type_url] = pool.hold(digest, shared)
            pool.release(self._digests[type_url])
            self._digests[type_url] = digest
        if errors:
            reply.error_detail.code = NACK_CODE
            reply.error_detail.message = "; ".join(errors)
        self._first_seen.add(type_url)
        if self._first_seen >= set(self._held):
            self.synced = True
        return Applied(type_url, upserts, tuple(removals), reply)
