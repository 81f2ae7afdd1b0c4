"""Cluster IPs for Services: a requested address is checked, an absent one is the lowest free address.

Theory of operation: the allocations are the ``spec.clusterIP`` of the stored Services, read at each create, so
there is no second record to keep in step with the store. An ExternalName Service gets no address, a headless one
(``clusterIP: None``) keeps ``None``; a requested address must be in the service range and free. Addresses ending
in ``.0`` are never handed out, nor is the first address of the range (the API server's own ``default/kubernetes``
Service, :mod:`ambit.apiserver.kubernetes_service`), nor the tenth (``198.19.0.10`` in the lab): by kubeadm's
convention it is cluster DNS's. Each is taken only by a Service that asks for it.
"""

from __future__ import annotations

import ipaddress

from ambit.apiserver import errors
from ambit.apiserver.requests import JsonObject
from ambit.apiserver.store import Store

SERVICES = ("", "services")


class ServiceIpAllocator:
    def __init__(self, store: Store, service_cidr: str) -> None:
        self.store = store
        self.network = ipaddress.ip_network(service_cidr)
        first, tenth = self.network.network_address + 1, self.network.network_address + 10
        self.reserved = {str(first), *([str(tenth)] if self.network.num_addresses > 16 else [])}

    def allocate(self, obj: JsonObject) -> None:
        """Set ``spec.clusterIP``/``clusterIPs`` of a Service being created, or raise ``invalid``."""
        spec = obj.get("spec")
        if not isinstance(spec, dict) or spec.get("type") == "ExternalName":
            return
        wanted = spec.get("clusterIP")
        if wanted == "None":
            spec["clusterIPs"] = ["None"]
            return
        used = {
            s.obj.get("spec", {}).get("clusterIP")
            for s in self.store.items(SERVICES)
            if isinstance(s.obj.get("spec"), dict)
        }
        if wanted:
            try:
                address = ipaddress.ip_address(wanted)
            except ValueError:
                raise errors.invalid("Service", "", [("spec.clusterIP", f"{wanted!r} is not a valid IP")]) from None
            if address not in self.network:
                raise errors.invalid(
                    "Service", "", [("spec.clusterIP", f"{wanted} is not in the service range {self.network}")]
                )
            if wanted in used:
                raise errors.invalid("Service", "", [("spec.clusterIP", f"{wanted} is already allocated")])
            spec["clusterIPs"] = [wanted]
            return
        for host in self.network.hosts():
            text = str(host)
            if text not in used and not text.endswith(".0") and text not in self.reserved:
                spec["clusterIP"] = text
                spec["clusterIPs"] = [text]
                return
        raise errors.ApiError(500, "InternalError", f"the service IP range {self.network} is full")
