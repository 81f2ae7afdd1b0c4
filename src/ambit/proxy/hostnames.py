"""On-demand resolution of hostname endpoints (spec §4.1 ``Workload.hostname``, §11.2 test_on_demand_dns_request).

Theory of operation: a ``resolution: DNS`` ServiceEntry's endpoints are names, not addresses. When the outbound
plan picks one (:attr:`ambit.model.state.Destination.resolve_hostname`), the node proxy asks
:meth:`HostnameResolver.fetch_address` for an address of the original destination's family, as ztunnel resolves
such workloads on demand. :class:`HostnameCache` is the pure part (what is known, until when); the resolver is the
thin asyncio shell around an injected :data:`Lookup` (:func:`upstream_lookup` asks the node's nameservers with
dnspython; tests pass their own).

Rules:

1. The cache key is (name in lower case without the trailing dot, IP version). An entry lives for the answer's
   TTL, clamped to [:data:`MIN_TTL`, :data:`MAX_TTL`]; a failed or empty lookup is remembered for
   :data:`NEGATIVE_TTL` seconds, so a flood of connections to a dead name asks upstream once per period.
2. The cache holds at most ``max_entries`` names; the least recently used goes first. An answer keeps at most
   :data:`MAX_ADDRESSES` addresses.
3. Concurrent misses of one key share one lookup; at most ``max_pending`` distinct lookups run at once, further
   misses fail at once ("too many lookups"): a pod cannot make the proxy hold unbounded work.
4. Every lookup is bounded by ``timeout`` seconds. Whatever fails (timeout, NXDOMAIN, no address of that family,
   a broken answer) raises :class:`HostnameLookupError` with a short ``reason`` (counted) and a message that says
   what failed (kept with a negative entry, so a cached failure reads as the first did); nothing else escapes.
5. ``requests`` counts every fetch and ``misses`` the lookups the cache could not answer (ztunnel's
   ``istio_on_demand_dns_total`` and its cache misses; ``observe`` hears of the first family's lookup only).
6. The address is of the original destination's IP version when the name has one; a name that exists but has
   only the other version's addresses gives one of those (as ztunnel prefers the family, then falls back). An
   error (NXDOMAIN, timeout) is not asked again for the other version.
7. :meth:`HostnameResolver.fetch_addresses` gives every address of both versions (IPv4 first; Envoy's lookup
   family ALL), for a caller that tries them all; an error for IPv4 is not asked again for IPv6, as in rule 6.
8. :func:`upstream_lookup` asks over plain DNS (UDP, then TCP), never DNS over HTTPS or QUIC: dnspython's
   query module is imported with its DNS-over-HTTPS support switched off first, so the process never loads the
   HTTP/2 client stack that support would import. It is imported by the first lookup, in a thread (not on the
   loop, which it would stall for tens of milliseconds), so a node proxy that never resolves a hostname endpoint
   never holds dnspython (about 4 MiB); the first lookup's time includes the import.
"""

from __future__ import annotations

import asyncio
import importlib
import random
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from ambit.model.workload import IPAddress
from ambit.proxy.errors import ProxyError

MIN_TTL = 5.0
MAX_TTL = 300.0
NEGATIVE_TTL = 5.0
MAX_ADDRESSES = 64
MAX_CNAME_HOPS = 8
NO_ADDRESS = "no address"


class HostnameLookupError(ProxyError):
    """A hostname endpoint could not be resolved (the network's or the resolver's fault); ``reason`` is counted."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Resolved:
    """What a lookup found: addresses of the asked family (possibly none), and for how long they hold."""

    addresses: tuple[IPAddress, ...]
    ttl: float


Lookup = Callable[[str, int], Awaitable[Resolved]]
"""``(name, IP version 4 or 6)`` → :class:`Resolved`; raises :class:`HostnameLookupError`."""


@dataclass(frozen=True, slots=True)
class _Entry:
    addresses: tuple[IPAddress, ...]
    expires: float
    failure: str = ""
    detail: str = ""


def cache_key(name: str, version: int) -> tuple[str, int]:
    return name.rstrip(".").lower(), version


class HostnameCache:
    """Answers by (name, version), valid until their expiry (rules 1 and 2). Pure: the caller passes ``now``."""

    def __init__(self, max_entries: int = 1024) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, int], _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, key: tuple[str, int], now: float) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= now:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry

    def store(self, key: tuple[str, int], resolved: Resolved, now: float) -> _Entry:
        ttl = min(max(resolved.ttl, MIN_TTL), MAX_TTL)
        return self._put(key, _Entry(resolved.addresses[:MAX_ADDRESSES], now + ttl))

    def store_failure(self, key: tuple[str, int], reason: str, now: float, detail: str = "") -> _Entry:
        return self._put(key, _Entry((), now + NEGATIVE_TTL, reason, detail))

    def _put(self, key: tuple[str, int], entry: _Entry) -> _Entry:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return entry


class HostnameResolver:
    """Resolves hostname endpoints on demand through ``lookup``, with a :class:`HostnameCache` (rules 1-5)."""

    def __init__(
        self,
        lookup: Lookup,
        *,
        clock: Callable[[], float],
        timeout: float = 5.0,
        max_entries: int = 1024,
        max_pending: int = 64,
        choose: Callable[[Sequence[IPAddress]], IPAddress] = random.choice,
        observe: Callable[[bool], None] | None = None,
    ) -> None:
        self._lookup = lookup
        self._clock = clock
        self.timeout = timeout
        self.max_pending = max_pending
        self._choose = choose
        self._observe = observe  # told of every fetch and whether it missed the cache (the metrics)
        self.cache = HostnameCache(max_entries)
        self._pending: dict[tuple[str, int], asyncio.Future[_Entry]] = {}
        self.requests = 0
        self.misses = 0

    async def fetch_address(self, name: str, like: IPAddress) -> IPAddress:
        """One address of ``name``, of ``like``'s IP version when it has one, else of the other (rule 6); raises
        :class:`HostnameLookupError`."""
        self.requests += 1
        entry, missed = await self._entry(cache_key(name, like.version))
        if self._observe is not None:
            self._observe(missed)
        if not entry.addresses and entry.failure == NO_ADDRESS:
            entry, _ = await self._entry(cache_key(name, 10 - like.version))
        if not entry.addresses:
            raise HostnameLookupError(entry.detail or f"cannot resolve {name}: {entry.failure}", entry.failure)
        return self._choose(entry.addresses)

    async def fetch_addresses(self, name: str) -> tuple[IPAddress, ...]:
        """Every address of ``name``, IPv4 then IPv6, at least one (rule 7); raises :class:`HostnameLookupError`."""
        self.requests += 1
        v4, missed = await self._entry(cache_key(name, 4))
        if self._observe is not None:
            self._observe(missed)
        if not v4.addresses and v4.failure != NO_ADDRESS:
            raise HostnameLookupError(v4.detail or f"cannot resolve {name}: {v4.failure}", v4.failure)
        v6, _ = await self._entry(cache_key(name, 6))
        if not v4.addresses and not v6.addresses:
            raise HostnameLookupError(v6.detail or f"cannot resolve {name}: {v6.failure}", v6.failure)
        return v4.addresses + v6.addresses

    async def _entry(self, key: tuple[str, int]) -> tuple[_Entry, bool]:
        """The cached entry for ``key``, else a fresh one; and whether the cache missed."""
        entry = self.cache.find(key, self._clock())
        if entry is not None:
            return entry, False
        self.misses += 1
        return await self._fetch(key), True

    async def _fetch(self, key: tuple[str, int]) -> _Entry:
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        if len(self._pending) >= self.max_pending:
            raise HostnameLookupError(f"cannot resolve {key[0]}: too many lookups at once", "overload")
        future: asyncio.Future[_Entry] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            entry = await self._ask(key)
            future.set_result(entry)
            return entry
        finally:
            del self._pending[key]
            if not future.done():  # cancelled while asking: waiters must not hang
                future.cancel()

    async def _ask(self, key: tuple[str, int]) -> _Entry:
        name, version = key
        try:
            async with asyncio.timeout(self.timeout):
                resolved = await self._lookup(name, version)
        except TimeoutError:
            return self.cache.store_failure(
                key, "timeout", self._clock(), f"{name}: no answer within {self.timeout:g}s"
            )
        except HostnameLookupError as exc:
            return self.cache.store_failure(key, exc.reason, self._clock(), str(exc))
        usable = tuple(a for a in resolved.addresses if a.version == version)
        if not usable:
            return self.cache.store_failure(key, NO_ADDRESS, self._clock())
        return self.cache.store(key, Resolved(usable, resolved.ttl), self._clock())


def upstream_lookup(nameservers: Sequence[str], *, port: int = 53, timeout: float = 2.0) -> Lookup:
    """A :data:`Lookup` that asks ``nameservers`` in turn (UDP, TCP when truncated), from the caller's netns.

    dnspython (:mod:`ambit.proxy.hostname_lookup`) is imported by the first lookup, in a thread (rule 8)."""
    ask: Lookup | None = None

    async def lookup(name: str, version: int) -> Resolved:
        nonlocal ask
        if ask is None:
            module = await asyncio.to_thread(importlib.import_module, "ambit.proxy.hostname_lookup")
            ask = module.plain_dns_lookup(nameservers, port=port, timeout=timeout)
        return await ask(name, version)

    return lookup
