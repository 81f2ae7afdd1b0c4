"""Kubernetes and Istio objects → the Workload API (spec §4.1), as pure functions over plain API dicts.

Theory of operation: :func:`translate_all` takes snapshots of the kinds istiod's ambient index reads for L4 (Pods,
Services, EndpointSlices, Namespaces, ServiceEntries, WorkloadEntries; spec §10.1) and returns a
:class:`Translation`: one :class:`LocalConfig` and the list of what had to be left out (:class:`Skipped`, each
naming the object and the field to fix). :func:`translate` is the same without the list. Nothing here keeps state
between calls or does I/O: the caller (an informer-driven view, a test) decides when to translate again.

Order of work: Kubernetes Services first, then ServiceEntries (their hosts may not take a Service's key), then one
index of every selecting service, then the workloads (pods, WorkloadEntries, inline ServiceEntry endpoints) with
their services maps.

The output is deterministic: workloads are ordered by uid, services by namespace then hostname, skips sorted, and
equal inputs give equal outputs, so a writer can compare renderings to skip rewriting an unchanged file.

Modules: ``workloads`` (a Pod becomes a Workload), ``services`` (a Service becomes a Service), ``serviceentries``
(a ServiceEntry becomes Services and endpoint Workloads), ``workloadentries`` (a WorkloadEntry becomes a
Workload), ``index`` (which services select which endpoints, on which ports), ``skips`` (what was left out).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.translate.index import ServiceIndex
from ambit.controlplane.translate.serviceentries import (
    parse_service_entries,
    selections,
    service_entry_services,
    service_entry_workloads,
)
from ambit.controlplane.translate.services import service_network, translate_service
from ambit.controlplane.translate.skips import SkipMemory, Skipped
from ambit.controlplane.translate.workloadentries import translate_workload_entry
from ambit.controlplane.translate.workloads import translate_pod
from ambit.model.localconfig import LocalConfig
from ambit.model.workload import Service, Workload

__all__ = ["SkipMemory", "Skipped", "Translation", "translate", "translate_all"]


@dataclass(frozen=True, slots=True)
class Translation:
    """The workload API's content, and what the translation had to leave out."""

    config: LocalConfig
    skipped: tuple[Skipped, ...] = ()


def translate_all(
    pods: Iterable[Mapping[str, Any]],
    services: Iterable[Mapping[str, Any]],
    endpoint_slices: Iterable[Mapping[str, Any]],
    namespaces: Iterable[Mapping[str, Any]],
    *,
    service_entries: Iterable[Mapping[str, Any]] = (),
    workload_entries: Iterable[Mapping[str, Any]] = (),
    cluster_id: str = "Kubernetes",
    trust_domain: str = "cluster.local",
    domain: str = "cluster.local",
) -> Translation:
    """The workloads and services the node proxies should know, and the problems found on the way."""
    skips: list[Skipped] = []
    network = service_network(namespaces)
    service_list = list(services)
    translated: list[Service] = [
        s for svc in service_list if (s := translate_service(svc, domain=domain, network=network, skips=skips))
    ]
    taken = {s.key for s in translated}
    entries = parse_service_entries(service_entries, taken=taken, skips=skips)
    for entry in entries:
        translated.extend(service_entry_services(entry, network=network))
    index = ServiceIndex.build(service_list, endpoint_slices, domain=domain, extra=selections(entries))
    workloads: list[Workload] = []
    for pod in pods:
        w = translate_pod(pod, index, cluster_id=cluster_id, trust_domain=trust_domain, network=network, skips=skips)
        if w is not None:
            workloads.append(w)
    for wle in workload_entries:
        w = translate_workload_entry(
            wle, index, cluster_id=cluster_id, trust_domain=trust_domain, network=network, skips=skips
        )
        if w is not None:
            workloads.append(w)
    for entry in entries:
        workloads.extend(
            service_entry_workloads(
                entry, cluster_id=cluster_id, trust_domain=trust_domain, network=network, skips=skips
            )
        )
    return Translation(
        config=LocalConfig(
            workloads=tuple(sorted(workloads, key=lambda w: w.uid)),
            services=tuple(sorted(translated, key=lambda s: (s.namespace, s.hostname))),
        ),
        skipped=tuple(sorted(set(skips))),
    )


def translate(
    pods: Iterable[Mapping[str, Any]],
    services: Iterable[Mapping[str, Any]],
    endpoint_slices: Iterable[Mapping[str, Any]],
    namespaces: Iterable[Mapping[str, Any]],
    *,
    service_entries: Iterable[Mapping[str, Any]] = (),
    workload_entries: Iterable[Mapping[str, Any]] = (),
    cluster_id: str = "Kubernetes",
    trust_domain: str = "cluster.local",
    domain: str = "cluster.local",
) -> LocalConfig:
    """:func:`translate_all` without the problems."""
    return translate_all(
        pods,
        services,
        endpoint_slices,
        namespaces,
        service_entries=service_entries,
        workload_entries=workload_entries,
        cluster_id=cluster_id,
        trust_domain=trust_domain,
        domain=domain,
    ).config
