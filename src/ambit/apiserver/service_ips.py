"""Cluster IPs for Services: a requested address is checked, an absent one is the next free address.

Theory of operation: the Service ranges are one, or two of different families (kube-apiserver's
``--service-cluster-ip-range=<v4>,<v6>``; the first is the primary). Which families a Service gets, and which of its
addresses are to be allocated, is :func:`ambit.apiserver.service_families.plan_families`' decision (kube's rules);
this module then checks each requested address (in the range of its family, free) and allocates the missing ones
from their family's range. An ExternalName Service gets no address; a headless one (``clusterIP: None``) keeps
``None``. Addresses ending in ``.0`` are never handed out, nor is the first address of a range (the API server's
own ``default/kubernetes`` Service, :mod:`ambit.apiserver.kubernetes_service`), nor the tenth (``198.19.0.10`` in
the lab): by kubeadm's convention it is cluster DNS's. Each is taken only by a Service that asks for it.

The allocator keeps its state beside the store, as kube-apiserver's ``ipallocator`` keeps a bitmap beside etcd, so
that a create costs the same at 10 Services and at 10,000 (reading every stored Service per create made loading
10,000 Services take minutes, issue 22). Rules:

1. Who holds which address is an index of the stored Services (:class:`ClusterIpIndex`), kept by the store itself
   (:meth:`ambit.apiserver.store.Store.add_index`): rebuilt from the stored Services when the API server starts,
   and changed by every write of a Service, whichever path made it (create, update, patch, delete, a namespace's
   deletion), after its transaction commits.
2. The store's write is the arbiter: before it commits a Service, the index refuses it (422, ``already
   allocated``) when one of its addresses is held by another stored Service. Writes are synchronous, so two
   creates racing through admission (which may await webhooks) can never both store one address.
3. An address handed out by ``allocate`` is reserved until the Service holding it is stored, or for
   ``RESERVATION_SECONDS`` if that create fails or was a dry run, so that a concurrent create does not pick it.
4. Each range has a cursor: the next address to try. Allocation walks from the cursor to the end of the range,
   then from its start (each candidate tried at most once), skipping held, reserved and kept addresses, and leaves
   the cursor after the address chosen. A freed address is therefore handed out again only once the cursor has
   gone round the range, as kube's allocator avoids reusing an address at once; and a create costs O(1) amortised
   until the range is nearly full. At start the cursor is after the highest held address of its range.
5. A requested address (``spec.clusterIP(s)``) must be in its family's range and neither held by another Service nor
   reserved; the addresses a Service already holds (an update) are its own.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ambit.apiserver import errors
from ambit.apiserver.requests import JsonObject
from ambit.apiserver.service_families import (
    HEADLESS,
    FamilyPlan,
    ServiceFamilyError,
    cluster_families,
    family_of,
    plan_families,
)
from ambit.apiserver.store import Store
from ambit.model.dnsname import is_ip

SERVICES = ("", "services")
_ALLOCATION_SCAN = 1 << 20
"""At most this many candidates are tried in a range before it counts as full (an IPv6 range is huge)."""


def service_ranges(service_cidr: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """``"<cidr>[,<cidr>]"`` as networks, primary first; a ``ValueError`` for a bad setting."""
    networks = [ipaddress.ip_network(part.strip()) for part in service_cidr.split(",") if part.strip()]
    cluster_families([str(n) for n in networks])
    return networks


ServiceKey = tuple[str, str]
"""(namespace, name) of a Service."""


def held_addresses(obj: Mapping[str, Any]) -> list[str]:
    """The cluster IPs a Service object holds (normalised; not ``None``, nothing that is not an address)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return []
    ips = spec.get("clusterIPs") or [spec.get("clusterIP")]
    if not isinstance(ips, list):
        return []
    return [str(ipaddress.ip_address(ip)) for ip in ips if isinstance(ip, str) and ip != HEADLESS and is_ip(ip)]


class ClusterIpIndex:
    """Which stored Service holds each cluster IP (rule 1), and the store's check before each write (rule 2)."""

    def __init__(self) -> None:
        self.holders: dict[str, ServiceKey] = {}
        self.pending: dict[str, float] = {}
        """Reserved addresses (rule 3) → when the reservation ends; storing the address ends it."""

    def check(self, namespace: str, name: str, old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> None:
        me = (namespace, name)
        for address in held_addresses(new):
            holder = self.holders.get(address)
            if holder is not None and holder != me:
                field = "spec.clusterIPs"
                raise errors.invalid("Service", name, [(field, f"{address} is already allocated")])

    def apply(self, namespace: str, name: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        me = (namespace, name)
        if old is not None:
            for address in held_addresses(old):
                if self.holders.get(address) == me:
                    del self.holders[address]
        if new is not None:
            for address in held_addresses(new):
                self.holders[address] = me
                self.pending.pop(address, None)


RESERVATION_SECONDS = 120.0
"""How long an address handed out stays reserved for a create that has not stored its Service (rule 3)."""


class _Range:
    """One family's range and its cursor (rule 4), as offsets from the network address."""

    def __init__(self, network: ipaddress.IPv4Network | ipaddress.IPv6Network, kept: set[str]) -> None:
        self.network = network
        self.base = int(network.network_address)
        self.v4 = network.version == 4
        # hosts(): every address but the network's (and IPv4's broadcast); at most _ALLOCATION_SCAN candidates.
        self.first = 1 if network.num_addresses > 2 or not self.v4 else 0
        last = network.num_addresses - (2 if self.v4 and network.num_addresses > 2 else 1)
        if network.num_addresses == 1:
            self.first, last = 0, 0
        self.last = min(last, self.first + _ALLOCATION_SCAN - 1)
        self.cursor = self.first
        self.kept = kept

    def address(self, offset: int) -> str:
        return str(ipaddress.ip_address(self.base + offset))

    def offset(self, address: str) -> int:
        return int(ipaddress.ip_address(address)) - self.base

    def candidates(self) -> Iterator[tuple[int, str]]:
        """From the cursor to the end of the range, then from its start to the cursor."""
        span = self.last - self.first + 1
        for step in range(span):
            offset = self.first + (self.cursor - self.first + step) % span
            text = self.address(offset)
            if (self.v4 and text.endswith(".0")) or text in self.kept:
                continue
            yield offset, text


class ServiceIpAllocator:
    def __init__(self, store: Store, service_cidr: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.networks = service_ranges(service_cidr)
        self.network = self.networks[0]
        self.families = cluster_families([str(n) for n in self.networks])
        self.by_family = dict(zip(self.families, self.networks, strict=True))
        self.reserved: set[str] = set()
        for network in self.networks:
            first, tenth = network.network_address + 1, network.network_address + 10
            self.reserved |= {str(first), *([str(tenth)] if network.num_addresses > 16 else [])}
        self._clock = clock
        self.index = ClusterIpIndex()
        self._pending = self.index.pending
        store.add_index(SERVICES, self.index)
        self._ranges = {family: _Range(network, self.reserved) for family, network in self.by_family.items()}
        for span in self._ranges.values():
            held = [span.offset(a) for a in self.index.holders if ipaddress.ip_address(a) in span.network]
            highest = max(held, default=span.first - 1)
            span.cursor = highest + 1 if span.first <= highest < span.last else span.first

    def allocate(self, obj: JsonObject) -> None:
        """Set the family fields and ``spec.clusterIP``/``clusterIPs`` of a Service being created, or raise
        ``invalid``."""
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        self._apply(obj, spec, self._plan(obj, spec, None), {})

    def reallocate(self, old: Mapping[str, Any], new: JsonObject) -> None:
        """The same for an update: immutable first address and family, the upgrade and the downgrade."""
        spec = new.get("spec")
        if not isinstance(spec, dict):
            return
        old_spec = old.get("spec") or {}
        if spec.get("type") == "ExternalName" or old_spec.get("type") == "ExternalName":
            # Changing to or from ExternalName starts over, as a create does.
            self._apply(new, spec, self._plan(new, spec, None), {})
            return
        plan = self._plan(new, spec, old_spec)
        kept = {ip: True for ip in old_spec.get("clusterIPs") or ()}
        self._apply(new, spec, plan, kept)

    def _plan(self, obj: JsonObject, spec: dict[str, Any], old: Mapping[str, Any] | None) -> FamilyPlan:
        try:
            return plan_families(spec, self.families, old)
        except ServiceFamilyError as exc:
            raise errors.invalid("Service", _name(obj), exc.causes) from None

    def _apply(self, obj: JsonObject, spec: dict[str, Any], plan: FamilyPlan, kept: Mapping[str, bool]) -> None:
        if plan.policy is None:  # ExternalName
            for key in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"):
                spec.pop(key, None)
            return
        spec["ipFamilyPolicy"] = plan.policy
        spec["ipFamilies"] = list(plan.families)
        if plan.headless:
            spec["clusterIP"], spec["clusterIPs"] = HEADLESS, [HEADLESS]
            return
        self._expire()
        meta = obj.get("metadata") or {}
        me = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        chosen: list[str] = []
        for i, (family, wanted) in enumerate(zip(plan.families, plan.cluster_ips, strict=True)):
            if wanted is None:
                address = self._next_free(family, chosen)
            else:
                address = str(ipaddress.ip_address(wanted))
                if not kept.get(wanted):
                    self._check(obj, me, i, family, address, chosen)
            chosen.append(address)
        until = self._clock() + RESERVATION_SECONDS
        for address in chosen:
            if self.index.holders.get(address) != me:
                self._pending[address] = until
        spec["clusterIP"], spec["clusterIPs"] = chosen[0], chosen

    def _expire(self) -> None:
        """End the reservations past their time (rule 3)."""
        if self._pending:
            now = self._clock()
            for address in [a for a, until in self._pending.items() if until <= now]:
                del self._pending[address]

    def _taken(self, address: str, me: ServiceKey | None) -> bool:
        holder = self.index.holders.get(address)
        return (holder is not None and holder != me) or address in self._pending

    def _check(self, obj: JsonObject, me: ServiceKey, index: int, family: str, address: str, chosen: list[str]) -> None:
        field = "spec.clusterIP" if index == 0 else f"spec.clusterIPs[{index}]"
        network = self.by_family.get(family)
        if network is None or ipaddress.ip_address(address) not in network:
            where = f"the service range {network}" if network is not None else "any service range of this cluster"
            raise errors.invalid("Service", _name(obj), [(field, f"{address} is not in {where}")])
        if address in chosen or self._taken(address, me):
            raise errors.invalid("Service", _name(obj), [(field, f"{address} is already allocated")])

    def _next_free(self, family: str, chosen: list[str]) -> str:
        span = self._ranges[family]
        for offset, text in span.candidates():
            if text not in chosen and not self._taken(text, None):
                span.cursor = offset + 1 if offset < span.last else span.first
                return text
        raise errors.ApiError(500, "InternalError", f"the service IP range {span.network} is full")


def _name(obj: JsonObject) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


__all__ = ["ClusterIpIndex", "ServiceIpAllocator", "family_of", "held_addresses", "service_ranges"]
