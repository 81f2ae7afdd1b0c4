"""What the mesh answers for one name and record type, without dnspython: rules 2-7 of :mod:`ambit.dns.answer`.

Theory of operation: pure. :func:`resolve` looks a name (:func:`host_labels` of its raw labels) up among the mesh's
Services and returns :class:`Records` (the addresses, a CNAME step, the access log's result) or :class:`Forward`.
Both ways of answering use it: the fast one (:mod:`ambit.dns.fastpath`, wire bytes in and out) and the dnspython one
(:func:`ambit.dns.answer.decide`). It is a module of its own so that a pod's DNS proxy answers the common query
without importing dnspython, which loads (about 4 MiB, tens of milliseconds) with the first query that needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ambit.dns.names import Labels, aliases, join, wildcards
from ambit.model.workload import HealthPolicy, HealthStatus, IPAddress, IPFamilies, Service, Workload

TTL = 30
RDTYPE_A = 1
"""The A record type's number (dnspython's ``dns.rdatatype.A``)."""
RDTYPE_AAAA = 28
"""The AAAA record type's number."""


class ServiceView(Protocol):
    """What the decision reads of the workload state (:class:`~ambit.model.state.WorkloadState` is one)."""

    def find_services_by_hostname(self, hostname: str) -> Sequence[Service]: ...

    def find_endpoints(self, service: Service) -> Sequence[Workload]: ...


@dataclass(frozen=True, slots=True)
class DnsClient:
    """The pod asking: its namespace (for the search path and the preferred Service) and its network."""

    namespace: str
    network: str = ""
    name: str = ""
    canonical_name: str = ""
    canonical_revision: str = ""


@dataclass(frozen=True, slots=True)
class Forward:
    """Ask the pod's resolvers; ``reason`` says why the mesh does not answer."""

    reason: str


@dataclass(frozen=True, slots=True)
class _Match:
    service: Service
    name: Labels
    stripped: Labels | None


@dataclass(frozen=True, slots=True)
class Records:
    """The mesh's answer to one name and type (rules 4-6), before it becomes a message: the same for every query
    of that name (in any case) and type from one client, as long as the workload state does not change."""

    rdtype: int
    """A or AAAA."""
    addresses: tuple[IPAddress, ...]
    """In the state's order (the answer shuffles them); empty: an empty NOERROR answer."""
    cname_labels: int | None
    """Rule 6: the answer is a CNAME from the asked name to its first ``cname_labels`` labels, which own the
    addresses; ``None``: the asked name owns them."""
    result: str
    """For the access log."""


Resolution = Records | Forward


def resolve(
    view: ServiceView, client: DnsClient, labels: Labels, rdtype: int, *, domain: Labels, ipv6: bool
) -> Resolution:
    """What the mesh answers for ``labels`` (see :func:`host_labels`) and ``rdtype`` (rules 2-7)."""
    if rdtype not in (RDTYPE_A, RDTYPE_AAAA):
        return Forward("record type")
    if not labels:
        return Forward("not a host name")
    match = _find(view, client, labels, domain)
    if match is None:
        return Forward("unknown host")
    family = 4 if rdtype == RDTYPE_A else 6
    if not _family_allowed(match.service, family, ipv6):
        return Records(rdtype, (), None, "service does not support this record type")
    addresses = _addresses(view, client, match.service, family)
    if not addresses:
        return Records(rdtype, (), None, "no records")
    cname = len(match.stripped) if match.stripped is not None and match.name[0] != "*" else None
    return Records(rdtype, tuple(addresses), cname, "success")


Lookup = Callable[[Sequence[bytes], int], Resolution]
"""A (cached) :func:`resolve` for one client and workload state: an absolute name's raw labels and a type in."""


def host_labels(raw: Sequence[bytes]) -> Labels:
    """An absolute name's labels (the root's empty one last) in lower case, or ``()`` when it cannot be a host
    name we know (rule 7)."""
    out: list[str] = []
    for label in raw[:-1]:
        text = label.decode("latin-1").lower()
        if not text or "." in text:
            return ()
        out.append(text)
    return tuple(out)


def _find(view: ServiceView, client: DnsClient, name: Labels, domain: Labels) -> _Match | None:
    svc_suffix = "." + join(("svc", *domain))
    for alias in aliases(name, client.namespace, domain):
        for candidate in wildcards(alias.name):
            usable = [
                s
                for s in view.find_services_by_hostname(join(candidate))
                if s.visible_to(client.namespace) and (s.vips or s.hostname.endswith(svc_suffix))
            ]
            best = _best(usable, client.namespace)
            if best is not None:
                return _Match(best, candidate, alias.stripped)
    return None


def _best(services: Sequence[Service], namespace: str) -> Service | None:
    """Rule 4: the client's namespace, then canonical, then the first."""
    canonical: Service | None = None
    for service in services:
        if service.namespace == namespace:
            return service
        if service.canonical and canonical is None:
            canonical = service
    if canonical is not None:
        return canonical
    return services[0] if services else None


def _family_allowed(service: Service, family: int, ipv6: bool) -> bool:
    if family == 6 and not ipv6:
        return False
    if service.ip_families is IPFamilies.IPV4_ONLY:
        return family == 4
    if service.ip_families is IPFamilies.IPV6_ONLY:
        return family == 6
    return True


def _addresses(view: ServiceView, client: DnsClient, service: Service, family: int) -> list[IPAddress]:
    if service.vips:
        # A CIDR range VIP is no host's address: it is never an answer.
        return [
            vip.ip
            for vip in service.vips
            if vip.ip.version == family and vip.network == client.network and vip.length is None
        ]
    out: list[IPAddress] = []
    for workload in view.find_endpoints(service):
        if workload.status is not HealthStatus.HEALTHY and service.health_policy is not HealthPolicy.ALLOW_ALL:
            continue
        first = next((a for a in workload.addresses if a.version == family), None)
        if first is not None and first not in out:
            out.append(first)
    return out
