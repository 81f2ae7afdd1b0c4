"""The controllers' settings, and the informers they share (one cache per kind for all controllers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ambit.k8s import Informer, InformerSettings, ResourceKind

ENDPOINTS = ResourceKind("", "v1", "endpoints", "Endpoints")
"""core/v1 Endpoints (not among ``ambit.k8s.kinds``: only the legacy Endpoints controller writes them)."""


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """What ``ambit lab up`` runs and how; the defaults suit a lab of a few nodes and a few hundred pods."""

    scheduler: bool = True
    """Run the scheduler (binds pods to nodes)."""
    workloads: bool = True
    """Run the Deployment, ReplicaSet, DaemonSet and StatefulSet controllers."""
    batch: bool = True
    """Run the Job, CronJob and TTL-after-finished controllers."""
    taint_eviction: bool = True
    """Run the NoExecute taint manager (evicts pods that do not tolerate their node's NoExecute taints)."""
    disruption: bool = True
    """Run the disruption controller (keeps PodDisruptionBudgets' status, which evictions charge)."""
    endpoints: bool = True
    """Run the EndpointSlice and (legacy) Endpoints controllers."""
    load_balancer_cidr: str | None = None
    """Give LoadBalancer Services addresses from this range (:mod:`ambit.lab.controllers.loadbalancer`); None:
    no load balancer, their status stays pending."""
    local_path_dir: Path | None = None
    """The lab directory whose nodes' private trees (``nodes/<node>/root``) hold the local-path provisioner's
    volumes (:mod:`ambit.lab.controllers.provisioner`); None: no provisioner runs."""
    volumes: bool = True
    """Run the PersistentVolume controller (binds claims to volumes, their phases and protection finalizers)."""
    workers: int = 2
    """Reconcile workers per controller (the scheduler always has one, so that its placements see each other)."""
    retry_initial: float = 0.05
    """Seconds before the first retry of a key whose reconcile failed; doubles with each further failure."""
    retry_max: float = 30.0
    """The longest delay between retries of one key."""
    expectations_timeout: float = 300.0
    """Seconds after which a ReplicaSet stops waiting for the informer to show pods it created or deleted."""
    burst_replicas: int = 500
    """The most pods one ReplicaSet reconcile creates or deletes."""
    job_backoff_base: float = 10.0
    """Seconds a Job waits before it replaces its first failed pod; doubles with each further failure since the
    last success (kube-controller-manager's 10 s)."""
    job_backoff_max: float = 360.0
    """The longest wait before a Job replaces a failed pod (kube's 6 minutes)."""
    max_endpoints_per_slice: int = 100
    """Endpoints per EndpointSlice (kube-controller-manager's ``--max-endpoints-per-slice``)."""
    reporting_instance: str = "ambit-lab"
    """``reportingInstance`` of the Events the controllers record."""
    sync_timeout: float = 60.0
    """Seconds ``ControllerManager.start()`` waits for the informers' first lists."""
    resync: float | None = 30.0
    """Seconds between resyncs, when every controller queues every object it is responsible for again, so that a
    missed event still converges (None: never)."""
    informer: InformerSettings = field(default_factory=InformerSettings)


@dataclass(frozen=True, slots=True)
class Informers:
    """The shared caches; handlers are added by the controllers before the manager starts them."""

    pods: Informer
    nodes: Informer
    services: Informer
    deployments: Informer
    replicasets: Informer
    endpointslices: Informer
    endpoints: Informer
    daemonsets: Informer
    statefulsets: Informer
    controllerrevisions: Informer
    poddisruptionbudgets: Informer
    jobs: Informer
    cronjobs: Informer
    persistentvolumeclaims: Informer
    persistentvolumes: Informer
    storageclasses: Informer

    def all(self) -> list[Informer]:
        return [
            self.pods,
            self.nodes,
            self.services,
            self.deployments,
            self.replicasets,
            self.endpointslices,
            self.endpoints,
            self.daemonsets,
            self.statefulsets,
            self.controllerrevisions,
            self.poddisruptionbudgets,
            self.jobs,
            self.cronjobs,
            self.persistentvolumeclaims,
            self.persistentvolumes,
            self.storageclasses,
        ]
