"""The simulated cluster: what the scale harness creates in the API server, paced, and how it churns it.

Shape (all names deterministic, so the harness knows every xDS resource name in advance):

- ``namespaces`` namespaces ``scale-NNNN`` labelled ``istio.io/dataplane-mode=ambient``;
- ``services`` Services spread evenly over them, ``svc-NNNNN`` selecting ``app: svc-NNNNN``, one HTTP port;
- ``pods`` pods spread evenly over the Services (pod ``i`` belongs to Service ``i % services``), each already
  scheduled (``nodeName`` one of the ``nodes`` simulated nodes), running, ready, enrolled
  (``ambient.istio.io/redirection: enabled``) and with an IP from 198.18.0.0/15 below the Service range;
- one EndpointSlice per Service (``svc-NNNNN-scale``), listing its pods with their readiness, as kube's
  EndpointSlice controller writes it;
- ``policies`` AuthorizationPolicies, round-robin over the namespaces, each allowing one Service's pods from its
  namespace's principals on one port.

A pod is created, then its status is patched on the same connection (Running, ready, its IP), as the kubelet
reports it: two requests per pod. Every request goes out at its slot (item ``i`` at
``start + i / rate``) from ``connections`` keep-alive connections, so the load is paced, not a burst; rate 0 means
as fast as the connections go.

Churn: change ``k`` touches a pod no other change touches, in the order add, delete, readiness flip, label change
(``version``, which is the workload's canonical revision), so that each change's xDS resource (``Kubernetes//Pod/
<ns>/<name>``, a workload uid) arrives at each client exactly once. Each change is followed, on the same
connection, by the write the EndpointSlice controller would make for it (the pod's Service's slice with the pod
added, removed or not ready; a label change that keeps the Service's selector writes none), so the control plane
sees the churn a real cluster makes: two objects per change.

On demand (``--on-demand N``): each simulated node proxy looks up ``N`` pods by ``network/IP``
(:func:`demanded_pods`: drawn from the loaded pods and those the churn will add, with the client's own seed), as a
node proxy with ``XDS_ON_DEMAND`` asks for the destinations its pods connect to; a change reaches the clients that
looked its pod up (:func:`churn_pods` says which pod each change touches).
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

from bench.kube_client import Endpoint

POD_RANGE = ipaddress.IPv4Network("198.18.0.0/15")
SERVICE_CIDR = "198.19.192.0/18"
"""Cluster IPs (16,384): the API server is started with this; pods take addresses below it (114,688)."""
MAX_PODS = int(ipaddress.IPv4Address("198.19.192.0")) - int(POD_RANGE.network_address) - 1
CLUSTER_ID = "Kubernetes"
MERGE_PATCH = "application/merge-patch+json"
_encode = msgspec.json.Encoder().encode


class ClusterLoadError(RuntimeError):
    """A create or change was refused."""


@dataclass(frozen=True, slots=True)
class ClusterShape:
    namespaces: int
    services: int
    pods: int
    policies: int
    nodes: int

    def __post_init__(self) -> None:
        if not 0 < self.namespaces <= self.services:
            raise ValueError("need at least one namespace and at least one Service per namespace")
        if self.pods + 10 * self.nodes > MAX_PODS:
            raise ValueError(f"at most {MAX_PODS - 10 * self.nodes:,} pods fit 198.18.0.0/15 below the Services")

    def namespace(self, i: int) -> str:
        return f"scale-{i:04d}"

    def service_namespace(self, service: int) -> str:
        return self.namespace(service % self.namespaces)

    def pod_name(self, i: int) -> str:
        return f"pod-{i:06d}"

    def pod_namespace(self, i: int) -> str:
        return self.service_namespace(i % self.services)

    def workload(self, i: int) -> str:
        """The pod's xDS resource name (its workload uid)."""
        return f"{CLUSTER_ID}//Pod/{self.pod_namespace(i)}/{self.pod_name(i)}"

    def node(self, i: int) -> str:
        return f"node-{i % self.nodes:04d}"


def pod_ip(i: int) -> str:
    return str(POD_RANGE.network_address + 1 + i)


def churn_pods(shape: ClusterShape, changes: int) -> list[int]:
    """The pod each of :func:`churn`'s changes touches, in order: existing pods from the end of the loaded range
    backwards, added ones numbered after it."""
    existing = iter(range(shape.pods - 1, -1, -1))
    added = iter(range(shape.pods, shape.pods + changes))
    return [next(added) if CHURN_KINDS[k % len(CHURN_KINDS)] == "add" else next(existing) for k in range(changes)]


def demanded_pods(shape: ClusterShape, client: int, count: int, changes: int) -> list[int]:
    """The pods client number ``client`` looks up on demand: ``count`` of the loaded pods and the ones ``changes``
    churn changes add, drawn with the client's own seed (the same in every run)."""
    universe = shape.pods + (changes + len(CHURN_KINDS) - 1) // len(CHURN_KINDS)
    return sorted(random.Random(client).sample(range(universe), min(count, universe)))


def namespace_manifest(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"istio.io/dataplane-mode": "ambient"}}}


def service_manifest(shape: ClusterShape, j: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"svc-{j:05d}", "namespace": shape.service_namespace(j)},
        "spec": {
            "selector": {"app": f"svc-{j:05d}"},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}],
        },
    }


def pod_manifest(shape: ClusterShape, i: int, *, version: str = "v1", ready: bool = True) -> dict[str, Any]:
    service = i % shape.services
    ip = pod_ip(i)
    return {
        "metadata": {
            "name": shape.pod_name(i),
            "namespace": shape.pod_namespace(i),
            "labels": {"app": f"svc-{service:05d}", "version": version},
            "annotations": {"ambient.istio.io/redirection": "enabled"},
        },
        "spec": {
            "nodeName": shape.node(i),
            "serviceAccountName": "default",
            "containers": [{"name": "app", "image": "app", "ports": [{"containerPort": 8080, "name": "http"}]}],
        },
        "status": pod_status(ip, ready),
    }


def pod_status(ip: str, ready: bool) -> dict[str, Any]:
    return {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }


def policy_manifest(shape: ClusterShape, k: int) -> dict[str, Any]:
    service = k % shape.services
    namespace = shape.service_namespace(service)
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": f"allow-{k:05d}", "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"app": f"svc-{service:05d}"}},
            "action": "ALLOW",
            "rules": [
                {
                    "from": [{"source": {"principals": [f"cluster.local/ns/{namespace}/sa/client-{k % 7}"]}}],
                    "to": [{"operation": {"ports": ["8080"]}}],
                }
            ],
        },
    }


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    body: bytes | None = None
    content_type: str = "application/json"
    tag: str = ""
    """What the caller wants back with the timing (the xDS resource name a change touches)."""
    then: Request | None = None
    """A request sent right after this one on the same connection (a new pod's status, as its kubelet reports)."""


@dataclass
class PacedRun:
    """What a paced batch did: per request tag, (sent, acknowledged) monotonic times."""

    times: dict[str, tuple[float, float]] = field(default_factory=dict)
    elapsed: float = 0.0
    count: int = 0
    late: float = 0.0
    """The most any request went out after its slot (the pacing could not be kept when this grows)."""

    @property
    def rate(self) -> float:
        return self.count / self.elapsed if self.elapsed > 0 else 0.0


async def paced(
    endpoint: Endpoint,
    requests: Sequence[Request],
    *,
    rate: float,
    connections: int,
    accept: Callable[[int], bool] = lambda status: status in (200, 201),
) -> PacedRun:
    """Send ``requests`` in order, request ``i`` not before ``start + i / rate``; stop at the first refusal."""
    run = PacedRun()
    items = iter(enumerate(requests))
    began = time.monotonic()

    async def connection() -> None:
        async with endpoint.session(1) as session:
            for i, request in items:
                slot = began + i / rate if rate > 0 else 0.0
                wait = slot - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                else:
                    run.late = max(run.late, -wait) if rate > 0 else 0.0
                sent = time.monotonic()
                step: Request | None = request
                while step is not None:
                    await _send(session, step, accept)
                    step = step.then
                run.count += 1
                if request.tag:
                    run.times[request.tag] = (sent, time.monotonic())

    await asyncio.gather(*(connection() for _ in range(max(1, connections))))
    run.elapsed = time.monotonic() - began
    return run


async def _send(session: aiohttp.ClientSession, request: Request, accept: Callable[[int], bool]) -> None:
    headers = {"Content-Type": request.content_type}
    try:
        async with session.request(request.method, request.path, data=request.body, headers=headers) as resp:
            raw = await resp.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ClusterLoadError(f"{request.method} {request.path}: {exc!r}") from None
    if not accept(resp.status):
        detail = raw[:300].decode(errors="replace")
        raise ClusterLoadError(f"{request.method} {request.path}: {resp.status} {detail}")


def pod_create(shape: ClusterShape, i: int, *, tag: str = "") -> Request:
    """Create pod ``i``, then report its status (the API server starts every new pod Pending, as a kubelet's pod
    is until it runs)."""
    manifest = pod_manifest(shape, i)
    status = {"status": manifest.pop("status")}
    base = f"/api/v1/namespaces/{shape.pod_namespace(i)}/pods"
    then = Request("PATCH", f"{base}/{shape.pod_name(i)}/status", _encode(status), MERGE_PATCH)
    return Request("POST", base, _encode(manifest), tag=tag, then=then)


def creates(shape: ClusterShape) -> dict[str, list[Request]]:
    """The loading requests by phase, in the order they must go: namespaces, Services, pods, their Services'
    EndpointSlices, policies."""
    namespaces = [
        Request("POST", "/api/v1/namespaces", _encode(namespace_manifest(shape.namespace(n))))
        for n in range(shape.namespaces)
    ]
    services = [
        Request(
            "POST",
            f"/api/v1/namespaces/{shape.service_namespace(j)}/services",
            _encode(service_manifest(shape, j)),
        )
        for j in range(shape.services)
    ]
    pods = [pod_create(shape, i) for i in range(shape.pods)]
    slices = [
        Request("POST", _slices_path(shape, j), _encode(endpoint_slice_manifest(shape, j, members)))
        for j, members in initial_members(shape).items()
    ]
    policies = [
        Request(
            "POST",
            f"/apis/security.istio.io/v1/namespaces/{shape.service_namespace(k % shape.services)}"
            "/authorizationpolicies",
            _encode(policy_manifest(shape, k)),
        )
        for k in range(shape.policies)
    ]
    return {
        "namespaces": namespaces,
        "services": services,
        "pods": pods,
        "endpoint_slices": slices,
        "policies": policies,
    }


SLICE_PORT = {"name": "http", "port": 8080, "protocol": "TCP"}


def slice_name(service: int) -> str:
    return f"svc-{service:05d}-scale"


def endpoint_slice_manifest(shape: ClusterShape, service: int, members: dict[int, bool]) -> dict[str, Any]:
    """Service ``service``'s slice: its pods ``members`` (pod index → ready), in index order."""
    namespace = shape.service_namespace(service)
    endpoints = [
        {
            "addresses": [str(POD_RANGE.network_address + 1 + i)],
            "conditions": {"ready": ready, "serving": ready, "terminating": False},
            "targetRef": {"kind": "Pod", "name": shape.pod_name(i), "namespace": namespace},
            "nodeName": shape.node(i),
        }
        for i, ready in sorted(members.items())
    ]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": slice_name(service),
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": f"svc-{service:05d}",
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
        },
        "addressType": "IPv4",
        "ports": [SLICE_PORT],
        "endpoints": endpoints,
    }


def _slices_path(shape: ClusterShape, service: int) -> str:
    return f"/apis/discovery.k8s.io/v1/namespaces/{shape.service_namespace(service)}/endpointslices"


def slice_update(shape: ClusterShape, service: int, members: dict[int, bool]) -> Request:
    """The whole slice written again (an unconditional update, as the controller's own after a fresh read)."""
    body = _encode(endpoint_slice_manifest(shape, service, members))
    return Request("PUT", f"{_slices_path(shape, service)}/{slice_name(service)}", body)


def initial_members(shape: ClusterShape) -> dict[int, dict[int, bool]]:
    """Each Service's pods right after loading: every loaded pod, ready."""
    members: dict[int, dict[int, bool]] = {j: {} for j in range(shape.services)}
    for i in range(shape.pods):
        members[i % shape.services][i] = True
    return members


def _then(request: Request, last: Request) -> Request:
    """``request`` followed by its chain, then ``last``."""
    follow = _then(request.then, last) if request.then is not None else last
    return Request(request.method, request.path, request.body, request.content_type, request.tag, follow)


CHURN_KINDS = ("add", "delete", "readiness", "label")


def churn(shape: ClusterShape, changes: int) -> list[Request]:
    """``changes`` requests cycling through :data:`CHURN_KINDS`, each on a pod no other change touches; tagged
    with the workload name each one changes. Existing pods are taken from the end of the loaded range backwards,
    new ones numbered after it."""
    if changes * 3 // 4 + 3 > shape.pods:
        raise ValueError(f"{changes} changes need at least {changes * 3 // 4 + 3} loaded pods")
    requests: list[Request] = []
    members = initial_members(shape)
    for k, i in enumerate(churn_pods(shape, changes)):
        kind = CHURN_KINDS[k % len(CHURN_KINDS)]
        if kind == "add":
            members[i % shape.services][i] = True
            update = slice_update(shape, i % shape.services, members[i % shape.services])
            requests.append(_then(pod_create(shape, i, tag=shape.workload(i)), update))
            continue
        service = i % shape.services
        path = f"/api/v1/namespaces/{shape.pod_namespace(i)}/pods/{shape.pod_name(i)}"
        if kind == "delete":
            del members[service][i]
            change = Request("DELETE", path + "?gracePeriodSeconds=0", tag=shape.workload(i))
            requests.append(_then(change, slice_update(shape, service, members[service])))
        elif kind == "readiness":
            members[service][i] = False
            body = _encode({"status": pod_status(pod_ip(i), ready=False)})
            change = Request("PATCH", path + "/status", body, MERGE_PATCH, tag=shape.workload(i))
            requests.append(_then(change, slice_update(shape, service, members[service])))
        else:
            body = _encode({"metadata": {"labels": {"version": "v2"}}})
            requests.append(Request("PATCH", path, body, MERGE_PATCH, tag=shape.workload(i)))
    return requests
