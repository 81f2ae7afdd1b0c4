"""What the control plane's informers keep of each object: the fields its readers read, with repeated strings shared.

Theory of operation: an informer applies its kind's transform (:func:`transform_for`) to every object it lists or
is sent, before storing it and before any handler sees it (client-go's ``SetTransform``). At 50,000 pods the
caches were most of the control plane's memory (1,134 MiB before any client, issue 22): every object was kept as
parsed, with fields nobody here reads (a pod's container images, probes, environment and volumes, its container
statuses, a Node's images and capacity, every object's ``managedFields``). The readers of the caches are the
translation (:mod:`ambit.controlplane.translate`), the status writers (:mod:`ambit.controlplane.status`, which
patch only status and read only metadata and status), the view's own change filters
(:mod:`ambit.controlplane.view`), the monitoring's event counters and the CA's node authorization
(:class:`ambit.controlplane.ca.nodeauth.InformerPodIndex`, which shares the view's pod informer). The gateway
controller and the webhook keep their own caches and are not transformed.

Rules:

1. Every kind: ``metadata.managedFields`` and the annotation ``kubectl.kubernetes.io/last-applied-configuration``
   are dropped (no reader reads them; the gateway controller's copy of a Gateway's annotations leaves the latter
   out anyway). Nothing else of a kind not named below changes.
2. Pods: ``spec`` keeps everything but the fields listed in :data:`POD_SPEC_DROPPED` (scheduling, volumes, security
   and DNS settings); each container and init container keeps ``name``, ``ports`` (each port's ``name``,
   ``containerPort`` and ``protocol``: named target ports resolve to them) and ``restartPolicy`` (a native
   sidecar). ``status`` keeps ``phase``, ``podIP``, ``podIPs``, ``hostIP``, ``hostIPs`` and each condition's
   ``type`` and ``status``.
3. Nodes: ``metadata`` (rule 1) only; ``spec`` and ``status`` are dropped (the translation reads a Node's locality
   labels; the node authorization asks the API server whether a Node exists).
4. Strings that repeat across objects are interned (one copy per process): every mapping key, and the values of
   labels, annotations, namespaces, node names, service accounts, phases, conditions, protocols and port names
   (:func:`_interned`). Names, uids, versions and addresses are unique or nearly, and are left as they are.
5. A transform never fails on a malformed object: what is not a mapping (or a list) where one is expected is kept
   as it is, so the readers report it as they would have.
6. Values that repeat whole across objects are shared too (one copy per process while any cached object holds it,
   :class:`SharedValues`): the mappings and lists under the keys in :data:`SHARED_KEYS` (a pod's labels, its
   containers, its conditions, its host IPs, its owner references: the same for every replica). Two values are
   shared only when their MessagePack encodings are equal byte for byte (key order, and the types JSON has: an
   integer is not a float, a string key not an integer one, ``true`` not 1) and they compare equal (which tells a
   date from its text and a tuple from a list), so a shared value is indistinguishable from the one it replaces.
   Cached objects are read-only (:mod:`ambit.k8s.informer`), which is what makes sharing them safe.

The test that matters is in ``tests/unit/test_cached_fields.py``: translating the transformed objects gives exactly
what translating the whole ones gives, over the golden inputs and random additions to them in the dropped fields.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import msgspec

from ambit.k8s import kinds

Object = dict[str, Any]
Transform = Callable[[Object], Object]

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

POD_SPEC_DROPPED = frozenset(
    {
        "volumes",
        "affinity",
        "tolerations",
        "topologySpreadConstraints",
        "securityContext",
        "imagePullSecrets",
        "dnsPolicy",
        "dnsConfig",
        "restartPolicy",
        "terminationGracePeriodSeconds",
        "activeDeadlineSeconds",
        "schedulerName",
        "enableServiceLinks",
        "priority",
        "priorityClassName",
        "preemptionPolicy",
        "serviceAccount",
        "automountServiceAccountToken",
        "runtimeClassName",
        "overhead",
        "readinessGates",
        "nodeSelector",
        "ephemeralContainers",
        "resourceClaims",
        "schedulingGates",
        "os",
    }
)
"""Pod spec fields no reader of the control plane's caches reads (rule 2)."""

_CONTAINER_KEPT = ("name", "ports", "restartPolicy")
_PORT_KEPT = ("name", "containerPort", "protocol")
_POD_STATUS_KEPT = ("phase", "podIP", "podIPs", "hostIP", "hostIPs")
_INTERNED_VALUES = frozenset(
    {"namespace", "nodeName", "serviceAccountName", "phase", "type", "status", "protocol", "kind", "zone"}
)
"""Keys whose string values repeat across objects (rule 4); plus every label and annotation."""

SHARED_KEYS = frozenset(
    {"labels", "annotations", "ownerReferences", "containers", "initContainers", "conditions", "hostIPs", "ports"}
)
"""Keys whose mapping or list values repeat whole across objects (rule 6)."""

_intern = sys.intern
_encode = msgspec.msgpack.Encoder().encode


class SharedValues:
    """One copy of each repeated value (rule 6), keyed by its MessagePack encoding.

    The table is pruned of the values nothing else refers to any more whenever it has doubled since the last
    pruning, so it holds about as many values as the caches do, and a pruning costs O(table) once per as many
    additions: the values of deleted objects do not accumulate."""

    __slots__ = ("_prune_at", "_table")

    MIN_PRUNE = 4096

    def __init__(self) -> None:
        self._table: dict[bytes, Any] = {}
        self._prune_at = self.MIN_PRUNE

    def __len__(self) -> int:
        return len(self._table)

    def share(self, value: Any) -> Any:
        """The copy already held of a value equal to ``value`` (same encoding), or ``value`` itself, now held."""
        try:
            key = _encode(value)
        except (TypeError, ValueError, OverflowError):  # not encodable: not shared
            return value
        found = self._table.get(key)
        if found is not None:
            return found if found == value else value
        if len(self._table) >= self._prune_at:
            self.prune()
        self._table[key] = value
        return value

    def prune(self) -> None:
        """Forget the values only the table refers to."""
        table = self._table
        for key in list(table):
            if sys.getrefcount(table[key]) <= 2:  # the table's reference and the argument's
                del table[key]
        self._prune_at = max(self.MIN_PRUNE, 2 * len(table))


_SHARED = SharedValues()
"""The process's shared values (as :func:`sys.intern`'s table is the process's strings)."""


def _interned(value: Any, *, values: bool = False) -> Any:
    """``value`` with every mapping key interned, and string values too where ``values`` (or the key is one of
    :data:`_INTERNED_VALUES`); lists and mappings are copied, anything else is returned as it is."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            k = _intern(key) if isinstance(key, str) else key
            if isinstance(item, str):
                out[k] = _intern(item) if values or k in _INTERNED_VALUES else item
            else:
                kept = _interned(item, values=values or k in ("labels", "annotations", "matchLabels", "selector"))
                out[k] = _SHARED.share(kept) if k in SHARED_KEYS and isinstance(kept, (dict, list)) else kept
        return out
    if isinstance(value, list):
        return [_interned(item, values=values) for item in value]
    if isinstance(value, str) and values:
        return _intern(value)
    return value


def _metadata(obj: Object) -> Any:
    """Rule 1 on ``obj['metadata']`` (not copied when there is nothing to drop)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return meta
    annotations = meta.get("annotations")
    if "managedFields" not in meta and not (isinstance(annotations, dict) and LAST_APPLIED in annotations):
        return meta
    meta = {k: v for k, v in meta.items() if k != "managedFields"}
    if isinstance(annotations, dict) and LAST_APPLIED in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    return meta


def common(obj: Object) -> Object:
    """Rule 1 (and rule 4): any kind."""
    if not isinstance(obj, dict):
        return obj
    meta = _metadata(obj)
    slim = {k: (meta if k == "metadata" else v) for k, v in obj.items()}
    out: Object = _interned(slim)
    return out


def _container(container: Any) -> Any:
    if not isinstance(container, dict):
        return container
    out = {k: container[k] for k in _CONTAINER_KEPT if k in container}
    ports = out.get("ports")
    if isinstance(ports, list):
        out["ports"] = [{k: p[k] for k in _PORT_KEPT if k in p} if isinstance(p, dict) else p for p in ports]
    return out


def _conditions(conditions: Any) -> Any:
    if not isinstance(conditions, list):
        return conditions
    return [{k: c[k] for k in ("type", "status") if k in c} if isinstance(c, dict) else c for c in conditions]


def pod(obj: Object) -> Object:
    """Rules 1, 2 and 4."""
    if not isinstance(obj, dict):
        return obj
    out: Object = {}
    for key, value in obj.items():
        if key == "metadata":
            out[key] = _metadata(obj)
        elif key == "spec" and isinstance(value, dict):
            spec = {k: v for k, v in value.items() if k not in POD_SPEC_DROPPED}
            for field in ("containers", "initContainers"):
                if isinstance(spec.get(field), list):
                    spec[field] = [_container(c) for c in spec[field]]
            out[key] = spec
        elif key == "status" and isinstance(value, dict):
            status = {k: value[k] for k in _POD_STATUS_KEPT if k in value}
            if "conditions" in value:
                status["conditions"] = _conditions(value["conditions"])
            out[key] = status
        else:
            out[key] = value
    interned: Object = _interned(out)
    return interned


def node(obj: Object) -> Object:
    """Rules 1, 3 and 4."""
    if not isinstance(obj, dict):
        return obj
    out: Object = _interned(
        {k: (_metadata(obj) if k == "metadata" else v) for k, v in obj.items() if k not in ("spec", "status")}
    )
    return out


def transform_for(kind: kinds.ResourceKind) -> Transform:
    """The transform the view's informer on ``kind`` applies."""
    if kind is kinds.PODS:
        return pod
    if kind is kinds.NODES:
        return node
    return common
