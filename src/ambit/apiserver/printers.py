"""Columns and cells that kube-apiserver prints for built-in kinds, for ``kubectl get`` (see ``tables``).

Theory of operation: :data:`PRINTERS` maps ``(group, kind)`` to a :class:`Printer`: its column definitions and
a function turning one object (plain JSON, as stored) and the current time into the row's cells. Cells always
include the priority-1 ("wide") columns; kubectl hides those unless ``-o wide``, exactly as kube-apiserver
does, which always generates wide rows on the server side.

Invariants: a cell function never raises on any JSON-shaped object (missing or mistyped fields print as
kubectl's placeholders, ``<none>``, ``<unknown>``, 0); the number of cells always equals the number of
columns; time comes in as ``now`` (seconds since the epoch), never from a clock.

This module holds the catalogue (each kind's columns with their descriptions) and :data:`DEFAULT`; the cell
functions live by kind: :mod:`~ambit.apiserver.pod_cells`, :mod:`~ambit.apiserver.object_cells` (the other core
objects and the small groups), :mod:`~ambit.apiserver.workload_cells` (apps/v1), :mod:`~ambit.apiserver.batch_cells`
(batch/v1); claims, volumes and classes have their own printers in :mod:`~ambit.apiserver.storage_printers`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.apiserver.batch_cells import cron_job_cells, job_cells
from ambit.apiserver.cells import (
    Cell,
    created_at,
    name_of,
)
from ambit.apiserver.object_cells import (
    config_map_cells,
    endpoint_slice_cells,
    endpoints_cells,
    event_cells,
    events_v1_cells,
    lease_cells,
    namespace_cells,
    network_policy_cells,
    node_cells,
    pod_disruption_budget_cells,
    priority_class_cells,
    secret_cells,
    service_account_cells,
    service_cells,
)
from ambit.apiserver.pod_cells import pod_cells, pod_conditions
from ambit.apiserver.workload_cells import (
    controller_revision_cells,
    daemon_set_cells,
    deployment_cells,
    replica_set_cells,
    stateful_set_cells,
)

Cells = Callable[[Mapping[str, Any], float], list[Cell]]


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    description: str
    type: str = "string"
    format: str = ""
    priority: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }


@dataclass(frozen=True, slots=True)
class Printer:
    columns: tuple[Column, ...]
    cells: Cells
    conditions: Callable[[Mapping[str, Any]], list[dict[str, Any]]] | None = None


def _name_column(what: str = "the object") -> Column:
    return Column("Name", f"Name of {what}, unique within its namespace or the cluster.", format="name")


AGE = Column("Age", "Time since the object was created (metadata.creationTimestamp).")
CREATED_AT = Column("Created At", "When the object was created (metadata.creationTimestamp).", type="date")
NAME = _name_column()


# ---- the catalogue ---------------------------------------------------------------------------------------

_WIDE_CONTAINERS = Column("Containers", "Names of the containers in the pod template.", priority=1)
_WIDE_IMAGES = Column("Images", "Images of the containers in the pod template.", priority=1)
_WIDE_SELECTOR = Column("Selector", "Label selector of the pods this object manages.", priority=1)


def _col(name: str, description: str, type: str = "string", priority: int = 0) -> Column:
    return Column(name, description, type=type, priority=priority)


PRINTERS: dict[tuple[str, str], Printer] = {
    ("", "Pod"): Printer(
        (
            _name_column("the pod"),
            _col("Ready", "Ready containers out of all containers."),
            _col("Status", "Phase of the pod, or the reason a container is waiting or terminated."),
            _col("Restarts", "Container restarts, with the time since the last one."),
            AGE,
            _col("IP", "The pod's first IP address.", priority=1),
            _col("Node", "Node the pod is bound to.", priority=1),
            _col("Nominated Node", "Node the scheduler nominated for preemption.", priority=1),
            _col("Readiness Gates", "Readiness gates that are true, out of all gates.", priority=1),
        ),
        pod_cells,
        pod_conditions,
    ),
    ("", "Service"): Printer(
        (
            _name_column("the service"),
            _col("Type", "How the service is exposed: ClusterIP, NodePort, LoadBalancer, ExternalName."),
            _col("Cluster-IP", "Virtual IP of the service inside the cluster."),
            _col("External-IP", "Addresses the service is reachable at from outside the cluster."),
            _col("Port(s)", "Service ports as port[:nodePort]/protocol."),
            AGE,
            _col("Selector", "Labels of the pods this service routes to.", priority=1),
        ),
        service_cells,
    ),
    ("", "Namespace"): Printer(
        (_name_column("the namespace"), _col("Status", "Active or Terminating."), AGE), namespace_cells
    ),
    ("", "Node"): Printer(
        (
            _name_column("the node"),
            _col("Status", "Ready condition of the node, and whether it accepts new pods."),
            _col("Roles", "Roles from node-role.kubernetes.io/* labels."),
            AGE,
            _col("Version", "Kubelet version."),
            _col("Internal-IP", "First InternalIP address.", priority=1),
            _col("External-IP", "First ExternalIP address.", priority=1),
            _col("OS-Image", "Operating system image.", priority=1),
            _col("Kernel-Version", "Kernel version.", priority=1),
            _col("Container-Runtime", "Container runtime and version.", priority=1),
        ),
        node_cells,
    ),
    ("", "ConfigMap"): Printer(
        (NAME, _col("Data", "Number of keys in data and binaryData.", "integer"), AGE), config_map_cells
    ),
    ("", "Secret"): Printer(
        (NAME, _col("Type", "Secret type."), _col("Data", "Number of keys in data.", "integer"), AGE),
        secret_cells,
    ),
    ("", "ServiceAccount"): Printer(
        (NAME, _col("Secrets", "Number of secrets listed by the account.", "integer"), AGE),
        service_account_cells,
    ),
    ("", "Endpoints"): Printer(
        (NAME, _col("Endpoints", "Ready addresses as ip:port, abbreviated after three."), AGE),
        endpoints_cells,
    ),
    ("discovery.k8s.io", "EndpointSlice"): Printer(
        (
            NAME,
            _col("AddressType", "IPv4, IPv6 or FQDN."),
            _col("Ports", "Ports of the slice, abbreviated after three."),
            _col("Endpoints", "Endpoint addresses, abbreviated after three."),
            AGE,
        ),
        endpoint_slice_cells,
    ),
    ("coordination.k8s.io", "Lease"): Printer(
        (NAME, _col("Holder", "Identity of the current holder of the lease."), AGE), lease_cells
    ),
    ("apps", "Deployment"): Printer(
        (
            NAME,
            _col("Ready", "Ready replicas out of desired replicas."),
            _col("Up-to-date", "Replicas running the latest pod template.", "integer"),
            _col("Available", "Replicas available to serve.", "integer"),
            AGE,
            _WIDE_CONTAINERS,
            _WIDE_IMAGES,
            _WIDE_SELECTOR,
        ),
        deployment_cells,
    ),
    ("apps", "ReplicaSet"): Printer(
        (
            NAME,
            _col("Desired", "Desired number of replicas.", "integer"),
            _col("Current", "Replicas that exist.", "integer"),
            _col("Ready", "Replicas that are ready.", "integer"),
            AGE,
            _WIDE_CONTAINERS,
            _WIDE_IMAGES,
            _WIDE_SELECTOR,
        ),
        replica_set_cells,
    ),
    ("apps", "DaemonSet"): Printer(
        (
            NAME,
            _col("Desired", "Nodes that should run the daemon pod.", "integer"),
            _col("Current", "Nodes running the daemon pod.", "integer"),
            _col("Ready", "Nodes whose daemon pod is ready.", "integer"),
            _col("Up-to-date", "Nodes running the latest pod template.", "integer"),
            _col("Available", "Nodes whose daemon pod is available.", "integer"),
            _col("Node Selector", "Node labels the daemon pods are restricted to."),
            AGE,
            _WIDE_CONTAINERS,
            _WIDE_IMAGES,
            _WIDE_SELECTOR,
        ),
        daemon_set_cells,
    ),
    ("apps", "ControllerRevision"): Printer(
        (
            NAME,
            _col("Controller", "Controller of the object, as kind.group/name."),
            _col("Revision", "Revision of the controller's template this object holds.", "integer"),
            AGE,
        ),
        controller_revision_cells,
    ),
    ("scheduling.k8s.io", "PriorityClass"): Printer(
        (
            NAME,
            _col("Value", "The priority pods of this class get.", "integer"),
            _col("Global-Default", "Whether pods without a class get this one.", "boolean"),
            AGE,
            _col("PreemptionPolicy", "Whether pods of this class preempt lower-priority pods."),
        ),
        priority_class_cells,
    ),
    ("policy", "PodDisruptionBudget"): Printer(
        (
            NAME,
            _col("Min Available", "Pods that must stay available, as a number or a percentage."),
            _col("Max Unavailable", "Pods that may be unavailable, as a number or a percentage."),
            _col("Allowed Disruptions", "Evictions the budget allows now.", "integer"),
            AGE,
        ),
        pod_disruption_budget_cells,
    ),
    ("networking.k8s.io", "NetworkPolicy"): Printer(
        (NAME, _col("Pod-Selector", "The pods the policy applies to, as a label selector."), AGE),
        network_policy_cells,
    ),
    ("apps", "StatefulSet"): Printer(
        (NAME, _col("Ready", "Ready replicas out of desired replicas."), AGE, _WIDE_CONTAINERS, _WIDE_IMAGES),
        stateful_set_cells,
    ),
    ("batch", "Job"): Printer(
        (
            NAME,
            _col("Status", "Complete, Failed, Terminating, Suspended, FailureTarget, SuccessCriteriaMet or Running."),
            _col("Completions", "Succeeded pods out of the completions the Job needs."),
            _col("Duration", "Time from the Job's start to its completion, or to now."),
            AGE,
            _WIDE_CONTAINERS,
            _WIDE_IMAGES,
            _WIDE_SELECTOR,
        ),
        job_cells,
    ),
    ("batch", "CronJob"): Printer(
        (
            NAME,
            _col("Schedule", "The cron schedule Jobs are made on."),
            _col("Timezone", "The time zone the schedule is read in."),
            _col("Suspend", "Whether new Jobs are held back.", "boolean"),
            _col("Active", "Jobs made by this CronJob that are running.", "integer"),
            _col("Last Schedule", "Time since a Job was last scheduled."),
            AGE,
            _WIDE_CONTAINERS,
            _WIDE_IMAGES,
            _WIDE_SELECTOR,
        ),
        cron_job_cells,
    ),
}

_EVENT_COLUMNS = (
    _col("Last Seen", "Time since the event was last observed."),
    _col("Type", "Normal or Warning."),
    _col("Reason", "Short machine-readable reason."),
    _col("Object", "The object the event is about, as kind/name."),
    _col("Subobject", "Field path within the object, such as a container.", priority=1),
    _col("Source", "Component (and host) that reported the event.", priority=1),
    _col("Message", "Human-readable description."),
    _col("First Seen", "Time since the event was first observed.", priority=1),
    _col("Count", "How many times the event occurred.", "integer", priority=1),
    Column("Name", "Name of the event object.", format="name", priority=1),
)
PRINTERS[("", "Event")] = Printer(_EVENT_COLUMNS, event_cells)
PRINTERS[("events.k8s.io", "Event")] = Printer(_EVENT_COLUMNS, events_v1_cells)


def _default_cells(obj: Mapping[str, Any], now: float) -> list[Cell]:
    return [name_of(obj), created_at(obj)]


DEFAULT = Printer((NAME, CREATED_AT), _default_cells)
"""kube-apiserver's fallback for kinds without a printer (CustomResourceDefinition among them)."""
