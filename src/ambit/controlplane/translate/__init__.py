"""Kubernetes objects → the Workload API (spec §4.1), as pure functions over plain API dicts.

Theory of operation: :func:`translate` takes snapshots of the four kinds istiod's ambient index reads for L4
(Pods, Services, EndpointSlices, Namespaces; spec §10.1) and returns one :class:`LocalConfig`. Nothing here keeps
state between calls or does I/O: the caller (an informer-driven writer, a test) decides when to translate again.
The output is deterministic: workloads are ordered by uid, services by namespace then hostname, and equal inputs
give equal outputs, so a writer can compare renderings to skip rewriting an unchanged file.

Modules: ``workloads`` (a Pod becomes a Workload, and which Services it serves on which ports), ``services`` (a
Service becomes a Service).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ambit.controlplane.translate.services import service_network, translate_service
from ambit.controlplane.translate.workloads import ServiceIndex, translate_pod
from ambit.model.localconfig import LocalConfig

__all__ = ["translate"]


def translate(
    pods: Iterable[Mapping[str, Any]],
    services: Iterable[Mapping[str, Any]],
    endpoint_slices: Iterable[Mapping[str, Any]],
    namespaces: Iterable[Mapping[str, Any]],
    *,
    cluster_id: str = "Kubernetes",
    trust_domain: str = "cluster.local",
    domain: str = "cluster.local",
) -> LocalConfig:
    """The workloads and services the node proxies should know, from the cluster's current objects."""
    service_list = list(services)
    network = service_network(namespaces)
    index = ServiceIndex.build(service_list, endpoint_slices, domain=domain)
    workloads = [
        w
        for pod in pods
        if (w := translate_pod(pod, index, cluster_id=cluster_id, trust_domain=trust_domain, network=network))
        is not None
    ]
    translated = [s for svc in service_list if (s := translate_service(svc, domain=domain, network=network))]
    return LocalConfig(
        workloads=tuple(sorted(workloads, key=lambda w: w.uid)),
        services=tuple(sorted(translated, key=lambda s: (s.namespace, s.hostname))),
    )
