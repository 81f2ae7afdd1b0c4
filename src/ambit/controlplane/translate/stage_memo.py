"""Which stages of a translation a call told what changed may take from the previous call (issue 22).

Theory of operation: :func:`~ambit.controlplane.translate.translate_all` runs in stages, each a pure function of
some kinds of objects and some settings whose value is immutable: the policy stage
(:mod:`~ambit.controlplane.translate.policy_side`), the service stage
(:mod:`~ambit.controlplane.translate.service_side`), the gateway stage
(:mod:`~ambit.controlplane.translate.gateway_side`), then the service index, the pods' workloads
(:mod:`~ambit.controlplane.translate.pod_workloads`), the hand-added endpoints' and the ServiceEntries' workloads.
A :class:`StageMemo` keeps one stage's last value with the settings it was made under; :class:`ChangedKinds` says
which kinds of objects the caller's ``changed`` names. A stage whose kinds did not change and whose settings are
equal takes its previous value as it is (the same object), so a pod's readiness change costs what the pod side
costs, whatever the number of Services and policies.

Rules:

1. Only a call told what changed (``changed`` not None), through a memo whose previous call ended normally,
   reuses anything; any other call makes every stage and keeps the values (so the next call may reuse them).
2. Namespaces and ConfigMaps (the discovery filter, the mesh config, the network, credentials) are read by every
   stage: a change of either makes every stage again. So does a kind this module does not know, for every stage
   but the policy stage, which reads only its two kinds.
3. Policy stage: reused while no AuthorizationPolicy or PeerAuthentication changed and the root namespace and
   whether dry-run policies are enforced are the same.
4. Service stage: reused while every changed object is of the pod side (:data:`POD_SIDE`: Pods, EndpointSlices,
   Nodes, WorkloadEntries) and the domain, cluster, trust domain and root namespace are the same.
5. Gateway stage: reused while the service stage was, the proxy version is the same, and either no Pod changed or
   no Istio Gateway exists to select pods and no Gateway API Gateway is deployed by hand (whose config the pods
   behind its Services read).
6. Service index: reused while the service stage was and no changed EndpointSlice is, or was when the index was
   made, one the index reads (a slice of a Service without a selector).
7. Hand-added endpoints' workloads (:mod:`~ambit.controlplane.translate.endpointslices`): reused while the service
   stage was and every changed EndpointSlice neither had (when they were made) nor has an endpoint whose
   ``targetRef`` is not a Pod: such a slice gives no workload and no skip.
8. ServiceEntries' inline endpoints' workloads: reused while the policy and service stages both were.
9. A changed ConfigMap no stage read is not a change (:meth:`ChangedKinds.ignoring`): the service stage records
   every ConfigMap it looks up, found or not (:class:`ConfigMapReads`), and the mesh config is read by every call.
   The control plane's own ``istio-ca-root-cert`` in each namespace is such a ConfigMap: at 1,000 namespaces its
   creation made 1,000 whole translations one after another, each slowing the next create (issue 22).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ambit.controlplane.translate.pod_workloads import Changes

__all__ = ["EVERY_STAGE", "POD_SIDE", "POLICY_KINDS", "ChangedKinds", "ConfigMapReads", "StageMemo"]

T = TypeVar("T")

EVERY_STAGE = frozenset({"namespaces", "configmaps"})
"""Kinds every stage reads (rule 2)."""
POLICY_KINDS = frozenset({"authorizationpolicies", "peerauthentications"})
"""The policy stage's kinds (rule 3)."""
POD_SIDE = frozenset({"pods", "endpointslices", "nodes", "workloadentries"})
"""The kinds no part of the service stage reads (rule 4)."""


@dataclass(frozen=True, slots=True)
class ChangedKinds:
    """The kinds of the objects a call's ``changed`` names (None: not known, rule 1)."""

    changed: Changes | None
    kinds: frozenset[str] | None

    @classmethod
    def of(cls, changed: Changes | None) -> ChangedKinds:
        return cls(changed, None if changed is None else frozenset(kind for kind, _ in changed))

    def none_of(self, kinds: frozenset[str]) -> bool:
        """Whether the changes are known and name no object of ``kinds`` nor of :data:`EVERY_STAGE`."""
        return self.kinds is not None and not self.kinds & (kinds | EVERY_STAGE)

    def only(self, kinds: frozenset[str]) -> bool:
        """Whether the changes are known and every one is of ``kinds``."""
        return self.kinds is not None and self.kinds <= kinds

    def ignoring(self, kind: str, unread: Callable[[str], bool]) -> ChangedKinds:
        """These changes without the objects of ``kind`` whose ``namespace/name`` is ``unread`` (rule 9)."""
        if self.changed is None or self.kinds is None or kind not in self.kinds:
            return self
        kept = {(k, key): obj for (k, key), obj in self.changed.items() if k != kind or not unread(key)}
        return self if len(kept) == len(self.changed) else ChangedKinds.of(kept)

    def objects(self, kind: str) -> Iterator[tuple[str, Mapping[str, Any] | None]]:
        """(``namespace/name``, the object now or None) of each changed object of ``kind``."""
        for (of_kind, key), obj in (self.changed or {}).items():
            if of_kind == kind:
                yield key, obj


class ConfigMapReads(Mapping[tuple[str, str], Mapping[str, Any]]):
    """ConfigMaps by (namespace, name) that remember every key looked up, found or not (rule 9); iterating or
    sizing the whole mapping counts as reading every ConfigMap."""

    __slots__ = ("_by_key", "_read", "_read_all")

    def __init__(self, by_key: Mapping[tuple[str, str], Mapping[str, Any]]) -> None:
        self._by_key = by_key
        self._read: set[tuple[str, str]] = set()
        self._read_all = False

    def __getitem__(self, key: tuple[str, str]) -> Mapping[str, Any]:
        self._read.add(key)
        return self._by_key[key]

    def get(self, key: tuple[str, str], default: Any = None) -> Any:
        self._read.add(key)
        return self._by_key.get(key, default)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, tuple):
            self._read.add(key)
        return key in self._by_key

    def __iter__(self) -> Iterator[tuple[str, str]]:
        self._read_all = True
        return iter(self._by_key)

    def __len__(self) -> int:
        self._read_all = True
        return len(self._by_key)

    def __bool__(self) -> bool:  # ``maps or {}`` must not count as reading them all: an empty one reads the same
        return True

    def was_read(self, namespace_name: str) -> bool:
        """Whether the ConfigMap ``namespace/name`` was looked up."""
        if self._read_all:
            return True
        namespace, _, name = namespace_name.partition("/")
        return (namespace, name) in self._read


@dataclass(slots=True)
class StageMemo(Generic[T]):
    """One stage's last value and the settings it was made under."""

    settings: object = None
    value: T | None = None
    reused: bool = False
    """Whether the last call took the value as it was."""

    def find(self, settings: object, unchanged: bool) -> T | None:
        """The previous value when its kinds did not change (``unchanged``) and ``settings`` are equal."""
        self.reused = unchanged and self.value is not None and self.settings == settings
        return self.value if self.reused else None

    def keep(self, settings: object, value: T) -> T:
        self.settings, self.value = settings, value
        return value
