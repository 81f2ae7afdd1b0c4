"""Columns and cells that kube-apiserver prints for built-in kinds, for ``kubectl get`` (see ``tables``).

Theory of operation: :data:`PRINTERS` maps ``(group, kind)`` to a :class:`Printer`: its column definitions and
a function turning one object (plain JSON, as stored) and the current time into the row's cells. Cells always
include the priority-1 ("wide") columns; kubectl hides those unless ``-o wide``, exactly as kube-apiserver
does, which always generates wide rows on the server side.

Invariants: a cell function never raises on any JSON-shaped object (missing or mistyped fields print as
kubectl's placeholders, ``<none>``, ``<unknown>``, 0); the number of cells always equals the number of
columns; time comes in as ``now`` (seconds since the epoch), never from a clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.apiserver.batch_cells import cron_job_cells, job_cells
from ambit.apiserver.cells import (
    Cell,
    abbreviate,
    age,
    as_int,
    as_list,
    as_map,
    as_maps,
    as_str,
    created_at,
    format_label_selector,
    format_labels,
    human_duration,
    name_of,
    parse_timestamp,
    since,
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


def _containers_and_images(template: Any) -> tuple[str, str]:
    containers = as_maps(as_map(as_map(template).get("spec")).get("containers"))
    names = ",".join(as_str(c.get("name")) for c in containers)
    images = ",".join(as_str(c.get("image")) for c in containers)
    return names, images


def _name_column(what: str = "the object") -> Column:
    return Column("Name", f"Name of {what}, unique within its namespace or the cluster.", format="name")


AGE = Column("Age", "Time since the object was created (metadata.creationTimestamp).")
CREATED_AT = Column("Created At", "When the object was created (metadata.creationTimestamp).", type="date")
NAME = _name_column()


# ---- core/v1 ---------------------------------------------------------------------------------------------


def _pod_cells(pod: Mapping[str, Any], now: float) -> list[Cell]:
    spec, status = as_map(pod.get("spec")), as_map(pod.get("status"))
    ready, total, restarts, reason = _pod_summary(spec, status)
    restarts_cell = str(restarts.count)
    if restarts.count and restarts.last is not None:
        restarts_cell = f"{restarts.count} ({human_duration(now - restarts.last)} ago)"
    if as_map(pod.get("metadata")).get("deletionTimestamp"):
        if status.get("reason") == "NodeLost":
            reason = "Unknown"
        elif status.get("phase") not in ("Succeeded", "Failed"):
            reason = "Terminating"
    ips = [as_str(as_map(ip).get("ip")) for ip in as_list(status.get("podIPs"))]
    ip = (ips[0] if ips else "") or as_str(status.get("podIP")) or "<none>"
    gates = [as_str(g.get("conditionType")) for g in as_maps(spec.get("readinessGates"))]
    gates_cell = "<none>"
    if gates:
        true = {as_str(c.get("type")) for c in as_maps(status.get("conditions")) if c.get("status") == "True"}
        gates_cell = f"{sum(1 for g in gates if g in true)}/{len(gates)}"
    return [
        name_of(pod),
        f"{ready}/{total}",
        reason,
        restarts_cell,
        age(pod, now),
        ip,
        as_str(spec.get("nodeName")) or "<none>",
        as_str(status.get("nominatedNodeName")) or "<none>",
        gates_cell,
    ]


@dataclass(slots=True)
class _Restarts:
    count: int = 0
    last: float | None = None

    def add(self, container_status: Mapping[str, Any]) -> None:
        self.count += as_int(container_status.get("restartCount"))
        last_state = as_map(as_map(container_status.get("lastState")).get("terminated"))
        finished = parse_timestamp(last_state.get("finishedAt"))
        if finished is not None and (self.last is None or finished > self.last):
            self.last = finished


def _pod_summary(spec: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[int, int, _Restarts, str]:
    """(ready containers, containers, restarts, status reason) the way kubectl's STATUS column reads a pod.

    Init containers are looked at first: the first one that has not finished successfully names the status
    (``Init:1/2``, ``Init:CrashLoopBackOff``). Then the last app container with a waiting or terminated reason
    wins, so a crash-looping container shows through a phase of Running. Sidecars (init containers with
    ``restartPolicy: Always``) count as containers once started.
    """
    init_specs = as_maps(spec.get("initContainers"))
    sidecars = {as_str(c.get("name")) for c in init_specs if c.get("restartPolicy") == "Always"}
    total = len(as_list(spec.get("containers"))) + len(sidecars)
    ready = 0
    reason = as_str(status.get("reason")) or as_str(status.get("phase"))
    conditions = {as_str(c.get("type")): c for c in as_maps(status.get("conditions"))}
    scheduled = as_map(conditions.get("PodScheduled"))
    if scheduled.get("status") == "False" and scheduled.get("reason") == "SchedulingGated":
        reason = "SchedulingGated"

    sidecar_restarts = _Restarts()
    restarts = _Restarts()
    initializing = False
    for i, cs in enumerate(as_maps(status.get("initContainerStatuses"))):
        restarts.add(cs)
        is_sidecar = as_str(cs.get("name")) in sidecars
        if is_sidecar:
            sidecar_restarts.add(cs)
        state = as_map(cs.get("state"))
        terminated, waiting = as_map(state.get("terminated")), as_map(state.get("waiting"))
        if state.get("terminated") is not None and as_int(terminated.get("exitCode")) == 0:
            continue
        if is_sidecar and cs.get("started") is True:
            ready += 1 if cs.get("ready") is True else 0
            continue
        if state.get("terminated") is not None:
            reason = "Init:" + (as_str(terminated.get("reason")) or _exit_text(terminated))
        elif as_str(waiting.get("reason")) not in ("", "PodInitializing"):
            reason = "Init:" + as_str(waiting.get("reason"))
        else:
            reason = f"Init:{i}/{len(init_specs)}"
        initializing = True
        break

    if not initializing or as_map(conditions.get("Initialized")).get("status") == "True":
        restarts = sidecar_restarts
        running = False
        for cs in reversed(as_maps(status.get("containerStatuses"))):
            restarts.add(cs)
            state = as_map(cs.get("state"))
            terminated, waiting = as_map(state.get("terminated")), as_map(state.get("waiting"))
            if as_str(waiting.get("reason")):
                reason = as_str(waiting.get("reason"))
            elif state.get("terminated") is not None:
                reason = as_str(terminated.get("reason")) or _exit_text(terminated)
            elif cs.get("ready") is True and state.get("running") is not None:
                running = True
                ready += 1
        if reason == "Completed" and running:
            reason = "Running" if as_map(conditions.get("Ready")).get("status") == "True" else "NotReady"
    return ready, total, restarts, reason


def _exit_text(terminated: Mapping[str, Any]) -> str:
    signal = as_int(terminated.get("signal"))
    return f"Signal:{signal}" if signal else f"ExitCode:{as_int(terminated.get('exitCode'))}"


def _pod_conditions(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    # kube-apiserver marks finished pods so clients can tell them apart without parsing the status cell.
    phase = as_map(pod.get("status")).get("phase")
    message = {"Succeeded": "The pod has completed successfully.", "Failed": "The pod failed."}.get(str(phase))
    if message is None:
        return []
    return [{"type": "Completed", "status": "True", "reason": phase, "message": message}]


def _service_cells(svc: Mapping[str, Any], now: float) -> list[Cell]:
    spec = as_map(svc.get("spec"))
    kind = as_str(spec.get("type"), "ClusterIP")
    external_ips = [ip for ip in as_list(spec.get("externalIPs")) if isinstance(ip, str)]
    if kind in ("ClusterIP", "NodePort"):
        external = ",".join(external_ips) or "<none>"
    elif kind == "LoadBalancer":
        ingress = as_maps(as_map(as_map(svc.get("status")).get("loadBalancer")).get("ingress"))
        lb = [as_str(i.get("ip")) or as_str(i.get("hostname")) for i in ingress]
        external = ",".join([a for a in lb if a] + external_ips) or "<pending>"
    elif kind == "ExternalName":
        external = as_str(spec.get("externalName"))
    else:
        external = "<unknown>"
    ports = []
    for port in as_maps(spec.get("ports")):
        protocol = as_str(port.get("protocol"), "TCP")
        node_port = as_int(port.get("nodePort"))
        number = as_int(port.get("port"))
        ports.append(f"{number}:{node_port}/{protocol}" if node_port else f"{number}/{protocol}")
    return [
        name_of(svc),
        kind,
        as_str(spec.get("clusterIP")) or "<none>",
        external,
        ",".join(ports) or "<none>",
        age(svc, now),
        format_labels(spec.get("selector")),
    ]


def _node_cells(node: Mapping[str, Any], now: float) -> list[Cell]:
    spec, status = as_map(node.get("spec")), as_map(node.get("status"))
    ready = next((c for c in as_maps(status.get("conditions")) if c.get("type") == "Ready"), None)
    states = ["Unknown" if ready is None else ("Ready" if ready.get("status") == "True" else "NotReady")]
    if spec.get("unschedulable") is True:
        states.append("SchedulingDisabled")
    roles = set()
    for key, value in as_map(as_map(node.get("metadata")).get("labels")).items():
        if key.startswith("node-role.kubernetes.io/") and key != "node-role.kubernetes.io/":
            roles.add(key.removeprefix("node-role.kubernetes.io/"))
        elif key == "kubernetes.io/role" and isinstance(value, str) and value:
            roles.add(value)
    addresses = as_maps(status.get("addresses"))
    info = as_map(status.get("nodeInfo"))

    def address(kind: str) -> str:
        return next((as_str(a.get("address")) for a in addresses if a.get("type") == kind), "") or "<none>"

    return [
        name_of(node),
        ",".join(states),
        ",".join(sorted(roles)) or "<none>",
        age(node, now),
        as_str(info.get("kubeletVersion")),
        address("InternalIP"),
        address("ExternalIP"),
        as_str(info.get("osImage")) or "<unknown>",
        as_str(info.get("kernelVersion")) or "<unknown>",
        as_str(info.get("containerRuntimeVersion")) or "<unknown>",
    ]


def _event_cells(event: Mapping[str, Any], now: float) -> list[Cell]:
    """core/v1 Event; events.k8s.io/v1 events are mapped onto this shape by :func:`_events_v1_cells`."""
    first = since(event.get("firstTimestamp"), now)
    if parse_timestamp(event.get("firstTimestamp")) is None:
        first = since(event.get("eventTime"), now)
    last = since(event.get("lastTimestamp"), now)
    if parse_timestamp(event.get("lastTimestamp")) is None:
        last = first
    count = as_int(event.get("count"))
    series = event.get("series")
    if isinstance(series, Mapping):
        last = since(series.get("lastObservedTime"), now)
        count = as_int(series.get("count"))
    elif count == 0:
        count = 1  # a singleton event in the new API carries no count
    involved = as_map(event.get("involvedObject"))
    target = as_str(involved.get("kind")).lower()
    if as_str(involved.get("name")):
        target = f"{target}/{as_str(involved.get('name'))}"
    source = as_map(event.get("source"))
    component = as_str(source.get("component")) or as_str(event.get("reportingComponent"))
    host = as_str(source.get("host")) or as_str(event.get("reportingInstance"))
    return [
        last,
        as_str(event.get("type")),
        as_str(event.get("reason")),
        target,
        as_str(involved.get("fieldPath")),
        f"{component}, {host}" if host else component,
        as_str(event.get("message")).strip(),
        first,
        count,
        name_of(event),
    ]


def _events_v1_cells(event: Mapping[str, Any], now: float) -> list[Cell]:
    core = {
        "metadata": event.get("metadata"),
        "type": event.get("type"),
        "reason": event.get("reason"),
        "involvedObject": event.get("regarding"),
        "message": event.get("note"),
        "source": event.get("deprecatedSource"),
        "reportingComponent": event.get("reportingController"),
        "reportingInstance": event.get("reportingInstance"),
        "firstTimestamp": event.get("deprecatedFirstTimestamp"),
        "lastTimestamp": event.get("deprecatedLastTimestamp"),
        "count": event.get("deprecatedCount"),
        "eventTime": event.get("eventTime"),
        "series": event.get("series"),
    }
    return _event_cells(core, now)


def _endpoints_cells(ep: Mapping[str, Any], now: float) -> list[Cell]:
    pairs: list[str] = []
    for subset in as_maps(ep.get("subsets")):
        ports = [as_int(p.get("port")) for p in as_maps(subset.get("ports"))]
        for address in as_maps(subset.get("addresses")):
            ip = as_str(address.get("ip"))
            pairs.extend([f"{ip}:{port}" for port in ports] if ports else [ip])
    return [name_of(ep), abbreviate(pairs), age(ep, now)]


def _endpoint_slice_cells(eps: Mapping[str, Any], now: float) -> list[Cell]:
    ports = []
    for port in as_maps(eps.get("ports")):
        number = port.get("port")
        ports.append(str(as_int(number)) if number is not None else as_str(port.get("name")) or "*")
    addresses = [a for e in as_maps(eps.get("endpoints")) for a in as_list(e.get("addresses")) if isinstance(a, str)]
    return [
        name_of(eps),
        as_str(eps.get("addressType")),
        abbreviate(ports, empty="<unset>"),
        abbreviate(addresses, empty="<unset>"),
        age(eps, now),
    ]


def _namespace_cells(ns: Mapping[str, Any], now: float) -> list[Cell]:
    return [name_of(ns), as_str(as_map(ns.get("status")).get("phase")), age(ns, now)]


def _config_map_cells(cm: Mapping[str, Any], now: float) -> list[Cell]:
    return [name_of(cm), len(as_map(cm.get("data"))) + len(as_map(cm.get("binaryData"))), age(cm, now)]


def _secret_cells(secret: Mapping[str, Any], now: float) -> list[Cell]:
    kind = as_str(secret.get("type"), "Opaque")
    return [name_of(secret), kind, len(as_map(secret.get("data"))), age(secret, now)]


def _service_account_cells(sa: Mapping[str, Any], now: float) -> list[Cell]:
    return [name_of(sa), len(as_list(sa.get("secrets"))), age(sa, now)]


def _lease_cells(lease: Mapping[str, Any], now: float) -> list[Cell]:
    return [name_of(lease), as_str(as_map(lease.get("spec")).get("holderIdentity")), age(lease, now)]


# ---- apps/v1 ---------------------------------------------------------------------------------------------


def _deployment_cells(d: Mapping[str, Any], now: float) -> list[Cell]:
    spec, status = as_map(d.get("spec")), as_map(d.get("status"))
    names, images = _containers_and_images(spec.get("template"))
    return [
        name_of(d),
        f"{as_int(status.get('readyReplicas'))}/{as_int(spec.get('replicas'), 1)}",
        as_int(status.get("updatedReplicas")),
        as_int(status.get("availableReplicas")),
        age(d, now),
        names,
        images,
        format_label_selector(spec.get("selector")),
    ]


def _replica_set_cells(rs: Mapping[str, Any], now: float) -> list[Cell]:
    spec, status = as_map(rs.get("spec")), as_map(rs.get("status"))
    names, images = _containers_and_images(spec.get("template"))
    return [
        name_of(rs),
        as_int(spec.get("replicas"), 1),
        as_int(status.get("replicas")),
        as_int(status.get("readyReplicas")),
        age(rs, now),
        names,
        images,
        format_label_selector(spec.get("selector")),
    ]


def _daemon_set_cells(ds: Mapping[str, Any], now: float) -> list[Cell]:
    spec, status = as_map(ds.get("spec")), as_map(ds.get("status"))
    template = as_map(spec.get("template"))
    names, images = _containers_and_images(template)
    return [
        name_of(ds),
        as_int(status.get("desiredNumberScheduled")),
        as_int(status.get("currentNumberScheduled")),
        as_int(status.get("numberReady")),
        as_int(status.get("updatedNumberScheduled")),
        as_int(status.get("numberAvailable")),
        format_labels(as_map(template.get("spec")).get("nodeSelector")),
        age(ds, now),
        names,
        images,
        format_label_selector(spec.get("selector")),
    ]


def _stateful_set_cells(ss: Mapping[str, Any], now: float) -> list[Cell]:
    spec, status = as_map(ss.get("spec")), as_map(ss.get("status"))
    names, images = _containers_and_images(spec.get("template"))
    ready = f"{as_int(status.get('readyReplicas'))}/{as_int(spec.get('replicas'), 1)}"
    return [name_of(ss), ready, age(ss, now), names, images]


def _controller_revision_cells(rev: Mapping[str, Any], now: float) -> list[Cell]:
    controller = "<none>"
    for ref in as_maps(as_map(rev.get("metadata")).get("ownerReferences")):
        if ref.get("controller") is True:
            group = as_str(ref.get("apiVersion")).rpartition("/")[0]
            kind = as_str(ref.get("kind")).lower()
            controller = f"{kind}.{group}/{as_str(ref.get('name'))}" if group else f"{kind}/{as_str(ref.get('name'))}"
            break
    return [name_of(rev), controller, as_int(rev.get("revision")), age(rev, now)]


# ---- scheduling.k8s.io/v1, policy/v1 ---------------------------------------------------------------------


def _priority_class_cells(pc: Mapping[str, Any], now: float) -> list[Cell]:
    policy = as_str(pc.get("preemptionPolicy"), "PreemptLowerPriority")
    return [name_of(pc), as_int(pc.get("value")), pc.get("globalDefault") is True, age(pc, now), policy]


def _pod_disruption_budget_cells(pdb: Mapping[str, Any], now: float) -> list[Cell]:
    spec, status = as_map(pdb.get("spec")), as_map(pdb.get("status"))

    def shown(value: Any) -> str:
        return "N/A" if value is None or isinstance(value, dict | list | bool) else str(value)

    return [
        name_of(pdb),
        shown(spec.get("minAvailable")),
        shown(spec.get("maxUnavailable")),
        as_int(status.get("disruptionsAllowed")),
        age(pdb, now),
    ]


def _network_policy_cells(policy: Mapping[str, Any], now: float) -> list[Cell]:
    return [name_of(policy), format_label_selector(as_map(policy.get("spec")).get("podSelector")), age(policy, now)]


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
        _pod_cells,
        _pod_conditions,
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
        _service_cells,
    ),
    ("", "Namespace"): Printer(
        (_name_column("the namespace"), _col("Status", "Active or Terminating."), AGE), _namespace_cells
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
        _node_cells,
    ),
    ("", "ConfigMap"): Printer(
        (NAME, _col("Data", "Number of keys in data and binaryData.", "integer"), AGE), _config_map_cells
    ),
    ("", "Secret"): Printer(
        (NAME, _col("Type", "Secret type."), _col("Data", "Number of keys in data.", "integer"), AGE),
        _secret_cells,
    ),
    ("", "ServiceAccount"): Printer(
        (NAME, _col("Secrets", "Number of secrets listed by the account.", "integer"), AGE),
        _service_account_cells,
    ),
    ("", "Endpoints"): Printer(
        (NAME, _col("Endpoints", "Ready addresses as ip:port, abbreviated after three."), AGE),
        _endpoints_cells,
    ),
    ("discovery.k8s.io", "EndpointSlice"): Printer(
        (
            NAME,
            _col("AddressType", "IPv4, IPv6 or FQDN."),
            _col("Ports", "Ports of the slice, abbreviated after three."),
            _col("Endpoints", "Endpoint addresses, abbreviated after three."),
            AGE,
        ),
        _endpoint_slice_cells,
    ),
    ("coordination.k8s.io", "Lease"): Printer(
        (NAME, _col("Holder", "Identity of the current holder of the lease."), AGE), _lease_cells
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
        _deployment_cells,
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
        _replica_set_cells,
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
        _daemon_set_cells,
    ),
    ("apps", "ControllerRevision"): Printer(
        (
            NAME,
            _col("Controller", "Controller of the object, as kind.group/name."),
            _col("Revision", "Revision of the controller's template this object holds.", "integer"),
            AGE,
        ),
        _controller_revision_cells,
    ),
    ("scheduling.k8s.io", "PriorityClass"): Printer(
        (
            NAME,
            _col("Value", "The priority pods of this class get.", "integer"),
            _col("Global-Default", "Whether pods without a class get this one.", "boolean"),
            AGE,
            _col("PreemptionPolicy", "Whether pods of this class preempt lower-priority pods."),
        ),
        _priority_class_cells,
    ),
    ("policy", "PodDisruptionBudget"): Printer(
        (
            NAME,
            _col("Min Available", "Pods that must stay available, as a number or a percentage."),
            _col("Max Unavailable", "Pods that may be unavailable, as a number or a percentage."),
            _col("Allowed Disruptions", "Evictions the budget allows now.", "integer"),
            AGE,
        ),
        _pod_disruption_budget_cells,
    ),
    ("networking.k8s.io", "NetworkPolicy"): Printer(
        (NAME, _col("Pod-Selector", "The pods the policy applies to, as a label selector."), AGE),
        _network_policy_cells,
    ),
    ("apps", "StatefulSet"): Printer(
        (NAME, _col("Ready", "Ready replicas out of desired replicas."), AGE, _WIDE_CONTAINERS, _WIDE_IMAGES),
        _stateful_set_cells,
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
PRINTERS[("", "Event")] = Printer(_EVENT_COLUMNS, _event_cells)
PRINTERS[("events.k8s.io", "Event")] = Printer(_EVENT_COLUMNS, _events_v1_cells)


def _default_cells(obj: Mapping[str, Any], now: float) -> list[Cell]:
    return [name_of(obj), created_at(obj)]


DEFAULT = Printer((NAME, CREATED_AT), _default_cells)
"""kube-apiserver's fallback for kinds without a printer (CustomResourceDefinition among them)."""
