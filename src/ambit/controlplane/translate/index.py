"""Which services select which endpoints, and on which ports: the ``services`` map of every workload (spec §4.1).

Rules:

1. A Kubernetes Service selects the pods and WorkloadEntries of its own namespace whose labels contain all of its
   ``spec.selector`` (a non-empty map). A Service without a selector selects the pods named as ``targetRef`` of
   an endpoint of its EndpointSlices (label ``kubernetes.io/service-name``); it selects no WorkloadEntry.
2. A ServiceEntry with a ``workloadSelector`` selects pods and WorkloadEntries of its namespace the same way, once
   for each of its hosts. An empty selector selects nothing, as for Services.
3. Each selected port maps the service port to a number for this endpoint:

   - a pod: a numeric target as is; a named target is the pod's container port of that name and protocol;
   - a WorkloadEntry or an inline ServiceEntry endpoint: its ``ports`` map keyed by the service port's name wins;
     else a numeric target as is; else a named target looked up in that map.

   A port that cannot be resolved is left out of that endpoint's map (the node proxy then skips the endpoint
   for that port).

4. A Service with a selector gives a selection made from the Service alone (and the cluster's domain), kept by its
   uid and resourceVersion between translations when the caller passes a memo; a Service without one reads its
   slices and is indexed again each time.

The index is built once per translation and only read after that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.translate.services import hostname, port_number, service_key, target_port
from ambit.model.workload import PortMapping

SERVICE_NAME_LABEL = "kubernetes.io/service-name"

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ServicePort:
    """One port of a Service or ServiceEntry, before it is resolved for an endpoint."""

    number: int
    target: int | str
    """The numeric target port, or the name of one."""
    name: str = ""
    protocol: str = "TCP"


PortResolver = Callable[[ServicePort], int | None]


@dataclass(frozen=True, slots=True)
class Selection:
    """One service key and the endpoints it selects (rules 1 and 2)."""

    key: str
    selector: Mapping[str, str] | None
    """Labels an endpoint must carry; None: selected by EndpointSlice (Kubernetes Services only)."""
    ports: tuple[ServicePort, ...]
    slice_pods: frozenset[str] = frozenset()


def kubernetes_ports(spec: Obj) -> tuple[ServicePort, ...]:
    """A Kubernetes Service's ports (invalid numbers and repeats of a number left out)."""
    out: dict[int, ServicePort] = {}
    for port in spec.get("ports") or ():
        number = port_number(port.get("port"))
        if number is None or number in out:
            continue
        target = target_port(port, number)
        resolved = port_number(target)
        out[number] = ServicePort(
            number,
            resolved if resolved is not None else str(target),
            str(port.get("name") or ""),
            str(port.get("protocol") or "TCP"),
        )
    return tuple(out.values())


SelectionMemo = dict[tuple[str, str, str], tuple[str, Selection]]
"""(uid, resourceVersion, domain) of a Service with a selector → its namespace and selection (rule 4)."""


@dataclass(frozen=True, slots=True)
class ServiceIndex:
    """The selections of each namespace, ready to be matched against endpoints."""

    by_namespace: Mapping[str, tuple[Selection, ...]]

    @classmethod
    def build(
        cls,
        services: Iterable[Obj],
        endpoint_slices: Iterable[Obj],
        *,
        domain: str,
        extra: Iterable[tuple[str, Selection]] = (),
        memo: SelectionMemo | None = None,
    ) -> ServiceIndex:
        """Index Kubernetes Services (with their EndpointSlices) and ``extra`` (namespace, selection) pairs.

        ``memo``, when given, keeps the selection of each Service with a selector by (uid, resourceVersion,
        domain), all it is made from (rule 4); after the call it holds exactly this call's."""
        services = list(services)
        known = dict(memo) if memo is not None else {}
        if memo is not None:
            memo.clear()
        # Only a Service without a selector reads its slices (rule 1): the slices of the others are not walked.
        selectorless: set[tuple[str, str]] = set()
        for svc in services:
            if not (svc.get("spec") or {}).get("selector"):
                meta = svc.get("metadata") or {}
                selectorless.add((str(meta.get("namespace", "")), str(meta.get("name", ""))))
        slice_pods: dict[tuple[str, str], set[str]] = {}
        for eps in endpoint_slices if selectorless else ():
            meta = eps.get("metadata") or {}
            owner = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
            if not owner or (str(meta.get("namespace", "")), str(owner)) not in selectorless:
                continue
            pods = slice_pods.setdefault((str(meta.get("namespace", "")), str(owner)), set())
            for endpoint in eps.get("endpoints") or ():
                ref = endpoint.get("targetRef") or {}
                if ref.get("kind") == "Pod" and ref.get("name"):
                    pods.add(str(ref["name"]))
        out: dict[str, list[Selection]] = {}
        for svc in services:
            meta, spec = svc.get("metadata") or {}, svc.get("spec") or {}
            version = (str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""), domain)
            remembered = known.get(version) if version[0] and version[1] else None
            if remembered is not None:
                if memo is not None:
                    memo[version] = remembered
                out.setdefault(remembered[0], []).append(remembered[1])
                continue
            name, namespace = str(meta.get("name", "")), str(meta.get("namespace", ""))
            if not name or not namespace or spec.get("type") == "ExternalName":
                continue
            selector = spec.get("selector") or None
            entry = Selection(
                key=service_key(namespace, hostname(name, namespace, domain)),
                selector={str(k): str(v) for k, v in selector.items()} if selector else None,
                ports=kubernetes_ports(spec),
                # Only a Service without a selector reads its slices (rule 1): keeping them out of the others'
                # selections keeps the index equal while endpoints come and go, so the translation memo holds.
                slice_pods=frozenset() if selector else frozenset(slice_pods.get((namespace, name), ())),
            )
            out.setdefault(namespace, []).append(entry)
            if selector and memo is not None and version[0] and version[1]:
                memo[version] = (namespace, entry)
        for namespace, entry in extra:
            out.setdefault(namespace, []).append(entry)
        return cls({ns: tuple(sorted(entries, key=lambda e: e.key)) for ns, entries in out.items()})

    def find_services(
        self, namespace: str, labels: Mapping[str, Any], resolve: PortResolver, *, pod_name: str | None = None
    ) -> dict[str, tuple[PortMapping, ...]]:
        """The services map of one endpoint: service key → its port mappings for this endpoint.

        ``pod_name`` is given for pods only: EndpointSlices select pods, never WorkloadEntries.
        """
        out: dict[str, tuple[PortMapping, ...]] = {}
        for entry in self.by_namespace.get(namespace, ()):
            if entry.selector is not None:
                selected = all(labels.get(k) == v for k, v in entry.selector.items())
            else:
                selected = pod_name is not None and pod_name in entry.slice_pods
            if selected and entry.key not in out:
                out[entry.key] = resolve_ports(entry.ports, resolve)
        return out


def resolve_ports(ports: Iterable[ServicePort], resolve: PortResolver) -> tuple[PortMapping, ...]:
    out: list[PortMapping] = []
    for port in ports:
        target = resolve(port)
        if target is not None:
            out.append(PortMapping(port.number, target))
    return tuple(out)


def pod_port_resolver(pod: Obj) -> PortResolver:
    """Rule 3 for a pod: named targets are the pod's container ports."""

    def resolve(port: ServicePort) -> int | None:
        if isinstance(port.target, int):
            return port.target
        for container in (pod.get("spec") or {}).get("containers") or ():
            for declared in container.get("ports") or ():
                if declared.get("name") == port.target and str(declared.get("protocol") or "TCP") == port.protocol:
                    return port_number(declared.get("containerPort"))
        return None

    return resolve


def entry_port_resolver(ports: Mapping[str, Any] | None) -> PortResolver:
    """Rule 3 for a WorkloadEntry or an inline endpoint with the ``ports`` map ``ports`` (name → number)."""
    overrides = {str(k): n for k, v in (ports or {}).items() if (n := port_number(v)) is not None}

    def resolve(port: ServicePort) -> int | None:
        if port.name and port.name in overrides:
            return overrides[port.name]
        if isinstance(port.target, int):
            return port.target
        return overrides.get(port.target)

    return resolve
