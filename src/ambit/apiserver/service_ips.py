"""Cluster IPs for Services: a requested address is checked, an absent one is the lowest free address.

Theory of operation: the allocations are the ``spec.clusterIPs`` (or ``spec.clusterIP``) of the stored Services,
read at each write, so there is no second record to keep in step with the store. The Service ranges are one, or
two of different families (kube-apiserver's ``--service-cluster-ip-range=<v4>,<v6>``; the first is the primary).
Which families a Service gets, and which of its addresses are to be allocated, is
:func:`ambit.apiserver.service_families.plan_families`' decision (kube's rules); this module then checks each
requested address (in the range of its family, free) and allocates the missing ones from their family's range.
An ExternalName Service gets no address; a headless one (``clusterIP: None``) keeps ``None``. Addresses ending in
``.0`` are never handed out, nor is the first address of a range (the API server's own ``default/kubernetes``
Service, :mod:`ambit.apiserver.kubernetes_service`), nor the tenth (``198.19.0.10`` in the lab): by kubeadm's
convention it is cluster DNS's. Each is taken only by a Service that asks for it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
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

SERVICES = ("", "services")
_ALLOCATION_SCAN = 1 << 20
"""At most this many candidates are tried in a range before it counts as full (an IPv6 range is huge)."""


def service_ranges(service_cidr: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """``"<cidr>[,<cidr>]"`` as networks, primary first; a ``ValueError`` for a bad setting."""
    networks = [ipaddress.ip_network(part.strip()) for part in service_cidr.split(",") if part.strip()]
    cluster_families([str(n) for n in networks])
    return networks


class ServiceIpAllocator:
    def __init__(self, store: Store, service_cidr: str) -> None:
        self.store = store
        self.networks = service_ranges(service_cidr)
        self.network = self.networks[0]
        self.families = cluster_families([str(n) for n in self.networks])
        self.by_family = dict(zip(self.families, self.networks, strict=True))
        self.reserved: set[str] = set()
        for network in self.networks:
            first, tenth = network.network_address + 1, network.network_address + 10
            self.reserved |= {str(first), *([str(tenth)] if network.num_addresses > 16 else [])}

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
        used = self._used(obj)
        chosen: list[str] = []
        for i, (family, wanted) in enumerate(zip(plan.families, plan.cluster_ips, strict=True)):
            if wanted is None:
                address = self._lowest_free(family, used)
            else:
                address = str(ipaddress.ip_address(wanted))
                if not kept.get(wanted):
                    self._check(obj, i, family, address, used)
            used.add(address)
            chosen.append(address)
        spec["clusterIP"], spec["clusterIPs"] = chosen[0], chosen

    def _used(self, obj: JsonObject) -> set[str]:
        meta = obj.get("metadata") or {}
        me = (meta.get("namespace"), meta.get("name"))
        used: set[str] = set()
        for item in self.store.items(SERVICES):
            spec, item_meta = item.obj.get("spec"), item.obj.get("metadata") or {}
            if not isinstance(spec, dict) or (item_meta.get("namespace"), item_meta.get("name")) == me:
                continue
            for ip in spec.get("clusterIPs") or [spec.get("clusterIP")]:
                if isinstance(ip, str) and ip and ip != HEADLESS:
                    used.add(str(ipaddress.ip_address(ip)) if _is_ip(ip) else ip)
        return used

    def _check(self, obj: JsonObject, index: int, family: str, address: str, used: set[str]) -> None:
        field = "spec.clusterIP" if index == 0 else f"spec.clusterIPs[{index}]"
        network = self.by_family.get(family)
        if network is None or ipaddress.ip_address(address) not in network:
            where = f"the service range {network}" if network is not None else "any service range of this cluster"
            raise errors.invalid("Service", _name(obj), [(field, f"{address} is not in {where}")])
        if address in used:
            raise errors.invalid("Service", _name(obj), [(field, f"{address} is already allocated")])

    def _lowest_free(self, family: str, used: set[str]) -> str:
        network = self.by_family[family]
        for n, host in enumerate(network.hosts()):
            if n >= _ALLOCATION_SCAN:
                break
            text = str(host)
            if text not in used and not (family == "IPv4" and text.endswith(".0")) and text not in self.reserved:
                return text
        raise errors.ApiError(500, "InternalError", f"the service IP range {network} is full")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _name(obj: JsonObject) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


__all__ = ["ServiceIpAllocator", "family_of", "service_ranges"]
