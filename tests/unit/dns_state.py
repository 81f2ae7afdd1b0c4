"""A workload state for DNS proxy tests: Services of every kind the DNS proxy answers for (spec §9)."""

from __future__ import annotations

from ambit.model.state import WorkloadState
from ambit.model.workload import (
    HealthStatus,
    IPFamilies,
    NetworkAddress,
    Service,
    Workload,
    parse_ip,
)


def svc(name: str, namespace: str, hostname: str, *vips: str, **kw: object) -> Service:
    return Service(
        name=name,
        namespace=namespace,
        hostname=hostname,
        vips=tuple(NetworkAddress(str(kw.pop("network", "")), parse_ip(v)) for v in vips),
        **kw,  # type: ignore[arg-type]
    )


def endpoint(name: str, namespace: str, service_key: str, *addresses: str, healthy: bool = True) -> Workload:
    return Workload(
        uid=f"Kubernetes//Pod/{namespace}/{name}",
        name=name,
        namespace=namespace,
        addresses=tuple(parse_ip(a) for a in addresses),
        services={service_key: ()},
        status=HealthStatus.HEALTHY if healthy else HealthStatus.UNHEALTHY,
    )


def mesh() -> WorkloadState:
    state = WorkloadState()
    services = [
        svc("productpage", "ns1", "productpage.ns1.svc.cluster.local", "198.19.0.9", canonical=True),
        svc("example", "ns2", "example.ns2.svc.cluster.local", "198.19.0.10", canonical=True),
        svc("api", "ns1", "api.example.com", "240.240.0.1", "2001:2::1"),
        svc("dual", "ns1", "dual.localhost", "198.19.0.2", "2001:db8::8329"),
        svc("v6", "ns1", "ipv6.localhost", "2001:db8::1"),
        svc("v4", "ns1", "ipv4.localhost", "198.19.0.4"),
        svc("wild", "ns1", "*.wildcard", "198.19.10.10"),
        svc("wild2", "ns1", "*.b.wildcard", "198.19.11.11"),
        svc("mesh", "ns1", "*.svc.mesh.company.net", "198.19.1.3"),
        svc("nw2", "ns1", "nw2-only.ns1.svc.cluster.local", "198.19.2.1", network="nw2"),
        svc("headless", "ns1", "headless.ns1.svc.cluster.local"),
        svc("external", "ns1", "headless.example.com"),
        svc("everywhere", "ns3", "everywhere.io", "198.19.3.3"),
        svc("everywhere", "ns1", "everywhere.io", "198.19.3.1"),
        svc("canon", "ns3", "canonical.svc", "198.19.4.3"),
        svc("canon", "ns4", "canonical.svc", "198.19.4.4", canonical=True),
        svc(
            "fam", "ns1", "v4only.ns1.svc.cluster.local", "198.19.5.5", "2001:db8::55", ip_families=IPFamilies.IPV4_ONLY
        ),
    ]
    for service in services:
        state.upsert_service(service)
    key = "ns1/headless.ns1.svc.cluster.local"
    state.upsert_workload(endpoint("h0", "ns1", key, "198.18.30.30", "2001:db8::30"))
    state.upsert_workload(endpoint("h1", "ns1", key, "198.18.31.31", "2001:db8::31"))
    state.upsert_workload(endpoint("h2", "ns1", key, "198.18.32.32", healthy=False))
    return state
