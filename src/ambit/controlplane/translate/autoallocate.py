"""Addresses for ServiceEntries that have none, allocated as istiod's IP autoallocate controller does.

Theory of operation: pure. An entry that qualifies gets, for each of its hosts that is not a wildcard (any host
of a ``DYNAMIC_DNS`` entry, whose hosts are all wildcards: istiod's ``keepHost``), one IPv4
address from 240.240.0.0/16 and one IPv6 address from 2001:2::/48, kept in the entry's own
``status.addresses`` (``[{"value": ip, "host": host}]``), so a restarted control plane finds them there and keeps
them: the addresses are stable for the entry's life. The translation (:mod:`~ambit.controlplane.translate.
serviceentries`) reads them back as the hosts' VIPs, so node proxies answer DNS for the host with them and capture
connections to them. :class:`AddressAllocator` remembers which addresses are taken; :func:`plan_addresses` says
what one entry's ``status.addresses`` should become.

Rules:

1. An entry qualifies unless its ``spec.resolution`` is ``NONE`` (the default; a proxy could not tell which
   address the application meant), it has ``spec.addresses``, or its label
   ``networking.istio.io/enable-autoallocate-ip`` is ``false`` (any case).
2. Addresses an entry's status already holds for a host it still has are kept, in their order; a host without a
   v4 (or v6) address gets the next free one. Addresses of hosts the entry no longer has are dropped; an entry
   that no longer qualifies loses them all.
3. :meth:`AddressAllocator.warm` runs over every entry before anything is allocated, oldest entry first
   (``creationTimestamp``, namespace, name): an address two entries claim (a copied object) stays with the first,
   and the other is given a new one. A status address outside the ranges, or not an address, is dropped.
4. Allocation takes the lowest free address of the range (never the range's first or last), skipping every address
   ever taken in this process: an address freed by a deleted entry is not handed out again until a restart, so a
   pod's cached answer does not point at another entry's host.
5. A range that is full allocates nothing for the host (logged by the caller); the entry keeps what it has.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

IPV4_RANGE = ipaddress.ip_network("240.240.0.0/16")
IPV6_RANGE = ipaddress.ip_network("2001:2::/48")
OPT_OUT_LABEL = "networking.istio.io/enable-autoallocate-ip"

Obj = Mapping[str, Any]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def qualifies(obj: Obj) -> bool:
    """Rule 1."""
    spec = obj.get("spec") or {}
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if str(spec.get("resolution") or "NONE").upper() == "NONE":
        return False
    if spec.get("addresses"):
        return False
    return str(labels.get(OPT_OUT_LABEL, "")).lower() != "false"


def hosts_of(obj: Obj) -> list[str]:
    """The entry's hosts that can have addresses: strings, not wildcards unless the entry resolves by
    ``DYNAMIC_DNS``, each once."""
    spec = obj.get("spec") or {}
    hosts = spec.get("hosts") or []
    wildcards = str(spec.get("resolution") or "").upper() == "DYNAMIC_DNS"
    out: list[str] = []
    for host in hosts if isinstance(hosts, list) else ():
        if isinstance(host, str) and host and (wildcards or not host.startswith("*")) and host not in out:
            out.append(host)
    return out


def status_addresses(obj: Obj) -> list[tuple[str, IPAddress]]:
    """(host, address) pairs of ``status.addresses`` that parse and lie in the ranges (rule 3)."""
    status = obj.get("status")
    raw = status.get("addresses") if isinstance(status, Mapping) else None
    out: list[tuple[str, IPAddress]] = []
    for item in raw if isinstance(raw, list) else ():
        if not isinstance(item, Mapping):
            continue
        try:
            ip = ipaddress.ip_address(str(item.get("value")))
        except ValueError:
            continue
        if ip in (IPV4_RANGE if ip.version == 4 else IPV6_RANGE):
            out.append((str(item.get("host") or ""), ip))
    return out


def auto_vips(obj: Obj) -> dict[str, tuple[IPAddress, ...]]:
    """Host → its allocated addresses, for a qualifying entry (what the translation uses as VIPs)."""
    if not qualifies(obj):
        return {}
    out: dict[str, tuple[IPAddress, ...]] = {}
    for host, ip in status_addresses(obj):
        out[host] = (*out.get(host, ()), ip)
    return out


def entry_order(obj: Obj) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("creationTimestamp") or ""), str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def entry_key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


@dataclass(slots=True)
class _Range:
    network: ipaddress.IPv4Network | ipaddress.IPv6Network
    taken: set[IPAddress] = field(default_factory=set)
    cursor: int = 1

    def take(self, ip: IPAddress) -> bool:
        """Mark ``ip`` taken; False when it already was."""
        if ip in self.taken:
            return False
        self.taken.add(ip)
        return True

    def next(self) -> IPAddress | None:
        last = self.network.num_addresses - 1
        while self.cursor < last:
            ip = self.network[self.cursor]
            self.cursor += 1
            if ip not in self.taken:
                self.taken.add(ip)
                return ip
        return None


class AddressAllocator:
    """Which addresses are taken (rules 3-5); one per control plane process."""

    def __init__(self) -> None:
        self._ranges = {4: _Range(IPV4_RANGE), 6: _Range(IPV6_RANGE)}
        self._owner: dict[IPAddress, str] = {}

    def warm(self, entries: Iterable[Obj]) -> None:
        """Learn the addresses every entry's status holds, oldest entry first (rule 3)."""
        for obj in sorted(entries, key=entry_order):
            if not qualifies(obj):
                continue
            key, hosts = entry_key(obj), set(hosts_of(obj))
            for host, ip in status_addresses(obj):
                if host in hosts and self._owner.setdefault(ip, key) == key:
                    self._ranges[ip.version].take(ip)

    def owns(self, key: str, ip: IPAddress) -> bool:
        return self._owner.get(ip) == key

    def allocate(self, key: str, version: int) -> IPAddress | None:
        ip = self._ranges[version].next()
        if ip is not None:
            self._owner[ip] = key
        return ip


def plan_addresses(obj: Obj, allocator: AddressAllocator) -> list[dict[str, str]] | None:
    """The entry's new ``status.addresses`` (``[]``: remove them), or None when they are right as they are.

    Allocates what is missing from ``allocator`` (warmed first with every entry).
    """
    current = status_addresses(obj)
    raw = (obj.get("status") or {}).get("addresses") if isinstance(obj.get("status"), Mapping) else None
    if not qualifies(obj):
        return [] if raw else None
    key = entry_key(obj)
    wanted: list[dict[str, str]] = []
    for host in hosts_of(obj):
        have = [ip for h, ip in current if h == host and allocator.owns(key, ip)]
        for version in (4, 6):
            if not any(ip.version == version for ip in have):
                ip = allocator.allocate(key, version)
                if ip is not None:
                    have.append(ip)
        have.sort(key=lambda ip: ip.version)
        wanted += [{"value": str(ip), "host": host} for ip in have]
    as_written = None
    if isinstance(raw, list) and all(isinstance(item, Mapping) for item in raw):
        as_written = [dict(item) for item in raw]
    return None if as_written == wanted or (not wanted and not raw) else wanted
