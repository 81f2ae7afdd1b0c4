"""The lab's load balancer (a cloud's, or MetalLB's, role): every Service of type ``LoadBalancer`` gets an address
from the lab's load-balancer range, written to ``status.loadBalancer.ingress[0].ip``.

Theory of operation: :func:`plan_addresses` (pure) decides, for all Services at once, which address each holds;
:class:`LoadBalancerController` (the reconcile shell, one worker so that two Services are never planned apart)
writes a Service's status when it differs from the plan. The node's Service rules
(:mod:`ambit.lab.network.services`) then proxy that address like the cluster IP, and the root namespace routes
the range to the first node, so that a client on the machine reaches the Service (``curl http://<ip>:<port>``).

Rules of :func:`plan_addresses`:

1. Only Services of type ``LoadBalancer`` that are not being deleted hold an address. Any other Service holds
   none; one that still shows an address of the range (its type changed) has it removed.
2. A Service keeps the address its status already shows when it lies in the range and no Service planned before
   it holds it. Services are planned oldest first (creation timestamp, then ``namespace/name``), so on a clash
   the older one keeps the address.
3. ``spec.loadBalancerIP`` (deprecated, still honoured by clouds) is taken when it lies in the range and is free.
4. Otherwise the lowest free address of the range (the network and broadcast addresses excluded). A full range
   leaves the Service without an address (pending, as on a cloud out of quota).
5. Addresses outside the range in a Service's status are someone else's: left as they are when the Service has
   nothing of ours to write.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from ambit.k8s import EventRecorder, Informer, KubeClient, kinds
from ambit.lab.controllers.controller import Controller
from ambit.lab.controllers.ownership import Object, is_deleting, key_of
from ambit.lab.controllers.settings import ControllerSettings, Informers
from ambit.lab.controllers.workqueue import Key

__all__ = ["LoadBalancerController", "plan_addresses", "status_ips"]

log = logging.getLogger("ambit.lab.controllers.loadbalancer")


def status_ips(service: Mapping[str, Any]) -> list[str]:
    """The ``ip`` of each entry of ``status.loadBalancer.ingress``."""
    status = service.get("status")
    lb = status.get("loadBalancer") if isinstance(status, Mapping) else None
    ingress = lb.get("ingress") if isinstance(lb, Mapping) else None
    return [
        item["ip"]
        for item in (ingress if isinstance(ingress, list) else ())
        if isinstance(item, Mapping) and isinstance(item.get("ip"), str)
    ]


def _in(network: ipaddress.IPv4Network, text: Any) -> ipaddress.IPv4Address | None:
    try:
        address = ipaddress.ip_address(text) if isinstance(text, str) else None
    except ValueError:
        return None
    if not isinstance(address, ipaddress.IPv4Address) or address not in network:
        return None
    if address in (network.network_address, network.broadcast_address):
        return None
    return address


def _wants(service: Mapping[str, Any]) -> bool:
    spec = service.get("spec")
    return isinstance(spec, Mapping) and spec.get("type") == "LoadBalancer" and not is_deleting(service)


def _age(service: Mapping[str, Any]) -> tuple[str, Key]:
    created = (service.get("metadata") or {}).get("creationTimestamp")
    return (created if isinstance(created, str) else "", key_of(service))


def plan_addresses(services: Iterable[Mapping[str, Any]], cidr: str) -> dict[Key, str | None]:
    """Every Service's address (None: none of ours), rules 1-4."""
    network = ipaddress.IPv4Network(cidr)
    ordered = sorted(services, key=_age)
    taken: set[ipaddress.IPv4Address] = set()
    plan: dict[Key, str | None] = {}
    pending: list[Mapping[str, Any]] = []
    for service in ordered:
        if not _wants(service):
            plan[key_of(service)] = None
            continue
        held = next((a for ip in status_ips(service) if (a := _in(network, ip)) is not None), None)
        if held is not None and held not in taken:
            taken.add(held)
            plan[key_of(service)] = str(held)
        else:
            pending.append(service)
    free = (a for a in network.hosts() if a not in taken)
    for service in pending:
        requested = _in(network, (service.get("spec") or {}).get("loadBalancerIP"))
        if requested is not None and requested not in taken:
            chosen: ipaddress.IPv4Address | None = requested
        else:
            chosen = next((a for a in free if a not in taken), None)
        if chosen is not None:
            taken.add(chosen)
        plan[key_of(service)] = str(chosen) if chosen is not None else None
    return plan


class LoadBalancerController(Controller):
    """Writes each LoadBalancer Service's address (the reconcile shell of :func:`plan_addresses`)."""

    name = "service-lb-controller"
    failure_reason = "SyncLoadBalancerFailed"

    def __init__(
        self,
        client: KubeClient,
        informers: Informers,
        recorder: EventRecorder,
        settings: ControllerSettings,
        *,
        cidr: str,
    ) -> None:
        self._network = ipaddress.IPv4Network(cidr)  # a bad setting fails here, not in a reconcile
        self.cidr = cidr
        super().__init__(client, informers, recorder, settings)

    def setup(self) -> None:
        self._written: dict[Key, str | None] = {}
        """What our last write gave each Service: the plan counts it while the cache lags behind."""
        self.watch_objects(on_delete=self._deleted)

    @property
    def objects(self) -> Informer:
        return self.informers.services

    def _deleted(self, service: Object) -> None:
        self._written.pop(key_of(service), None)
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        """An address came free: queue the Services still waiting for one."""
        for other in self.informers.services.items():
            if _wants(other) and not status_ips(other):
                self.queue.add(key_of(other))

    def all_keys(self) -> list[Key]:
        return [key_of(s) for s in self.informers.services.items() if _wants(s) or status_ips(s)]

    def _view(self) -> list[Mapping[str, Any]]:
        """The cached Services, with the addresses our own writes gave them where the cache has not caught up."""
        out: list[Mapping[str, Any]] = []
        for cached in self.informers.services.items():
            key = key_of(cached)
            if key not in self._written:
                out.append(cached)
                continue
            written = self._written[key]
            ingress = [{"ip": written}] if written else []
            out.append({**cached, "status": {**(cached.get("status") or {}), "loadBalancer": {"ingress": ingress}}})
        return out

    async def reconcile(self, key: Key) -> float | None:
        service = self.find(key)
        if service is None:
            return None
        wanted = plan_addresses(self._view(), self.cidr).get(key)
        current = status_ips(service)
        ours = [ip for ip in current if _in(self._network, ip) is not None]
        if wanted is None and not ours:
            return None  # rule 5: nothing of ours to write
        if wanted is not None and current == [wanted]:
            return None
        ingress = [{"ip": wanted}] if wanted is not None else []
        patch = {
            "metadata": {"resourceVersion": (service.get("metadata") or {}).get("resourceVersion")},
            "status": {"loadBalancer": {"ingress": ingress}},
        }
        await self.client.patch_status(kinds.SERVICES, key[1], patch, key[0])
        self._written[key] = wanted
        if wanted is not None:
            log.info("load balancer: %s/%s has %s", key[0], key[1], wanted)
            self.recorder.record(service, "Normal", "EnsuredLoadBalancer", f"Ensured load balancer {wanted}", "Sync")
        elif ours:
            self._wake_waiters()
        if wanted is None and _wants(service):
            self.recorder.record(service, "Warning", "AllocationFailed", f"no free address in {self.cidr}", "Sync")
        return None
