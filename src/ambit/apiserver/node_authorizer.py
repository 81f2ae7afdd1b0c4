"""Node authorization and node restriction: what a node's kubelet may read and write, as kube-apiserver's Node
authorizer and NodeRestriction admission plugin decide.

A node is a user ``system:node:<name>`` in the group ``system:nodes``. The authorizer runs before RBAC and either
allows a request or has no opinion (RBAC then decides; no default binding grants nodes anything).

Rules of the authorizer (:meth:`NodeAuthorizer.allows`):

1. Secrets, ConfigMaps, PersistentVolumeClaims: ``get``, and ``list``/``watch`` of one object by name, only when a
   pod bound to the node refers to the object (volumes, projected sources, ``env``/``envFrom`` of every container,
   ``imagePullSecrets``, claims). A list of all of them is never allowed.
   PersistentVolumes (cluster-scoped): ``get`` only, and only of a volume that a claim such a pod refers to is
   bound to (the claim's ``spec.volumeName``): pod → claim → volume, as kube's graph has it.
2. ``serviceaccounts/token`` ``create``: only for a service account that a pod bound to the node runs as.
3. Everything else: kube's static node rules (:data:`NODE_RULES`): read Pods, Services, Nodes; write its Node,
   Pod status, Events, Leases; delete Pods (graceful deletion ends on the node); token and access reviews.

Rules of the restriction (:func:`restrict` and the two below it), on writes by a node, after the authorizer allowed
them:

4. Nodes: a node creates, updates or patches only its own Node object (and its status). It may create its Node
   with taints (kubelet's ``--register-with-taints``) but never changes them afterwards, nor the Node's owner
   references: a node that could lift its own taints could steer to itself the pods they keep away (Istio's
   ``cni.istio.io/not-ready`` would let ambient pods start before the node agent is ready).
5. Pods: a node creates none (no mirror pods here), deletes and updates the status of only pods bound to itself,
   and never updates a pod's spec or metadata.
6. Leases in ``kube-node-lease``: only the one named after the node.
7. TokenRequest: only bound to a Pod that is bound to the node (an unbound token would outlive the pod).
8. Evictions (``pods/eviction``): only of a pod bound to the node, checked in admission, before the eviction reads
   or charges a PodDisruptionBudget: a node's stolen credential could otherwise spend the budgets that guard
   other nodes' pods (each refused eviction would still mark a pod disrupted for two minutes). An eviction of a
   pod that does not exist passes on to the eviction's own 404, as kube's NodeRestriction lets it.

The graph of rules 1 and 2 is read from the store at each request, over the pods bound to the node in the request's
namespace (kube keeps an incremental graph; the lab's sizes do not need one).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ambit.apiserver import errors
from ambit.apiserver.rbac_policy import Attributes, Rule, rules_allow
from ambit.apiserver.store import Store

NODES_GROUP = "system:nodes"
NODE_PREFIX = "system:node:"
NODE_LEASE_NAMESPACE = "kube-node-lease"
PODS = ("", "pods")
CLAIMS = ("", "persistentvolumeclaims")

_READ = ("get", "list", "watch")
NODE_RULES: tuple[Rule, ...] = (
    Rule(_READ, ("",), ("services", "pods", "nodes", "endpoints", "namespaces")),
    Rule(("create", "update", "patch"), ("",), ("nodes", "nodes/status")),
    Rule(("create", "delete"), ("",), ("pods",)),
    Rule(("update", "patch"), ("",), ("pods/status",)),
    Rule(("create",), ("",), ("pods/eviction",)),
    Rule(("create", "update", "patch"), ("", "events.k8s.io"), ("events",)),
    Rule(("get", "create", "update", "patch", "delete"), ("coordination.k8s.io",), ("leases",)),
    Rule(("create",), ("authentication.k8s.io",), ("tokenreviews",)),
    Rule(("create",), ("authorization.k8s.io",), ("subjectaccessreviews", "localsubjectaccessreviews")),
    Rule(_READ, ("node.k8s.io",), ("runtimeclasses",)),
)
"""Rule 3: what any node may do, as kube's bootstrap NodeRules (the parts this server serves)."""

ROOT_CA_CONFIG_MAP = "kube-root-ca.crt"
_GRAPH_KINDS = {"secrets": "secret", "configmaps": "configmap", "persistentvolumeclaims": "claim"}


def node_of(user: str, groups: tuple[str, ...]) -> str | None:
    """The node a user is, or None when it is not one."""
    if NODES_GROUP in groups and user.startswith(NODE_PREFIX) and len(user) > len(NODE_PREFIX):
        return user[len(NODE_PREFIX) :]
    return None


def _containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(key) or ():
            if isinstance(c, Mapping):
                yield c


def references(pod: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """``(kind, name)`` of each Secret, ConfigMap and claim a pod refers to (kind as in :data:`_GRAPH_KINDS`)."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return
    if spec.get("automountServiceAccountToken") is not False:
        # kube's ServiceAccount admission adds a projected volume with this ConfigMap (the API server's CA) to every
        # pod that mounts its token; this server's kubelet mounts it without the volume, so the edge is implied.
        yield "configmap", ROOT_CA_CONFIG_MAP
    for ref in spec.get("imagePullSecrets") or ():
        if isinstance(ref, Mapping):
            yield "secret", str(ref.get("name", ""))
    for volume in spec.get("volumes") or ():
        if not isinstance(volume, Mapping):
            continue
        if isinstance(v := volume.get("secret"), Mapping):
            yield "secret", str(v.get("secretName", ""))
        if isinstance(v := volume.get("configMap"), Mapping):
            yield "configmap", str(v.get("name", ""))
        if isinstance(v := volume.get("persistentVolumeClaim"), Mapping):
            yield "claim", str(v.get("claimName", ""))
        if isinstance(v := volume.get("projected"), Mapping):
            for source in v.get("sources") or ():
                if isinstance(source, Mapping):
                    if isinstance(s := source.get("secret"), Mapping):
                        yield "secret", str(s.get("name", ""))
                    if isinstance(s := source.get("configMap"), Mapping):
                        yield "configmap", str(s.get("name", ""))
    for container in _containers(spec):
        for item in container.get("envFrom") or ():
            if isinstance(item, Mapping):
                if isinstance(r := item.get("secretRef"), Mapping):
                    yield "secret", str(r.get("name", ""))
                if isinstance(r := item.get("configMapRef"), Mapping):
                    yield "configmap", str(r.get("name", ""))
        for env in container.get("env") or ():
            source = env.get("valueFrom") if isinstance(env, Mapping) else None
            if isinstance(source, Mapping):
                if isinstance(r := source.get("secretKeyRef"), Mapping):
                    yield "secret", str(r.get("name", ""))
                if isinstance(r := source.get("configMapKeyRef"), Mapping):
                    yield "configmap", str(r.get("name", ""))


def _service_account(pod: Mapping[str, Any]) -> str:
    spec = pod.get("spec")
    return str((spec.get("serviceAccountName") if isinstance(spec, Mapping) else "") or "default")


def bound_to(pod: Mapping[str, Any] | None, node: str) -> bool:
    spec = (pod or {}).get("spec")
    return isinstance(spec, Mapping) and spec.get("nodeName") == node


class NodeAuthorizer:
    """Rules 1-3 over the store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def _pods_on(self, node: str, namespace: str) -> Iterator[Mapping[str, Any]]:
        for item in self.store.items(PODS, namespace):
            if bound_to(item.obj, node):
                yield item.obj

    def _volumes_of(self, node: str) -> set[str]:
        """The volumes bound to the claims of the pods bound to ``node`` (rule 1)."""
        found: set[str] = set()
        for item in self.store.items(PODS):
            if not bound_to(item.obj, node):
                continue
            for kind, name in references(item.obj):
                claim = self.store.get(CLAIMS, item.namespace, name) if kind == "claim" and name else None
                spec = (claim.obj.get("spec") if claim is not None else None) or {}
                if isinstance(spec, Mapping) and isinstance(spec.get("volumeName"), str) and spec["volumeName"]:
                    found.add(spec["volumeName"])
        return found

    def allows(self, node: str, a: Attributes) -> bool:
        if not a.resource_request:
            return False
        if a.api_group == "" and a.resource in _GRAPH_KINDS and not a.subresource:
            if a.verb not in _READ or not a.name or not a.namespace:
                return False
            wanted = (_GRAPH_KINDS[a.resource], a.name)
            return any(wanted in set(references(pod)) for pod in self._pods_on(node, a.namespace))
        if a.api_group == "" and a.resource == "persistentvolumes" and not a.subresource:
            return a.verb == "get" and bool(a.name) and a.name in self._volumes_of(node)
        if a.api_group == "" and a.resource == "serviceaccounts" and a.subresource == "token":
            if a.verb != "create" or not a.namespace:
                return False
            return any(_service_account(pod) == a.name for pod in self._pods_on(node, a.namespace))
        return rules_allow(NODE_RULES, a)


def _forbidden(node: str, what: str) -> errors.ApiError:
    return errors.ApiError(403, "Forbidden", f'node "{node}" {what}')


def restrict(
    node: str,
    operation: str,
    resource: str,
    subresource: str,
    namespace: str,
    name: str,
    obj: Mapping[str, Any] | None,
    old: Mapping[str, Any] | None,
) -> None:
    """Rules 4-6 for one write by ``node`` (``operation`` CREATE, UPDATE or DELETE); raises 403 when refused."""
    if resource == "nodes":
        target = name or str(((obj or {}).get("metadata") or {}).get("name", ""))
        if target != node:
            raise _forbidden(node, f"is not allowed to modify node {target!r}")
        if operation == "UPDATE" and obj is not None and old is not None:
            if _spec_field(obj, "taints") != _spec_field(old, "taints"):
                raise _forbidden(node, "is not allowed to modify taints")
            if _meta_field(obj, "ownerReferences") != _meta_field(old, "ownerReferences"):
                raise _forbidden(node, "is not allowed to modify ownerReferences")
    elif resource == "pods":
        if subresource == "" and operation == "CREATE":
            raise _forbidden(node, "can only create mirror pods, and this server has none")
        if subresource == "" and operation == "UPDATE":
            raise _forbidden(node, "is not allowed to update a pod's spec or metadata")
        if subresource in ("", "status") and not bound_to(old, node):
            raise _forbidden(node, f"can only modify pods bound to itself; pod {namespace}/{name} is not")
    elif resource == "leases" and namespace == NODE_LEASE_NAMESPACE:
        target = name or str(((obj or {}).get("metadata") or {}).get("name", ""))
        if target != node:
            raise _forbidden(node, f"can only modify its own lease, not {target!r}")


def _spec_field(obj: Mapping[str, Any], key: str) -> Any:
    spec = obj.get("spec")
    return (spec.get(key) if isinstance(spec, Mapping) else None) or None  # absent and empty are the same


def _meta_field(obj: Mapping[str, Any], key: str) -> Any:
    meta = obj.get("metadata")
    return (meta.get(key) if isinstance(meta, Mapping) else None) or None


def restrict_token_request(node: str, bound_pod: Mapping[str, Any] | None) -> None:
    """Rule 7: ``bound_pod`` is the pod the TokenRequest binds to (None: unbound)."""
    if bound_pod is None:
        raise _forbidden(node, "requested a token not bound to a pod; nodes may only request pod-bound tokens")
    if not bound_to(bound_pod, node):
        meta = bound_pod.get("metadata") or {}
        raise _forbidden(
            node, f"requested a token bound to pod {meta.get('namespace')}/{meta.get('name')}, which is not on it"
        )


def restrict_eviction(node: str, namespace: str, name: str, pod: Mapping[str, Any] | None) -> None:
    """Rule 8: ``pod`` is the pod the eviction names, as stored (None: there is none)."""
    if pod is not None and not bound_to(pod, node):
        raise _forbidden(node, f"can only evict pods with spec.nodeName set to itself; pod {namespace}/{name} is not")
