"""The pods' share of a translation, kept between calls and patched by the pods that changed.

Theory of operation: a pod's entry (its finished workload or None, its labels, what had to be left out of it) is
made from the pod and from the translation's *context* only (the service index, the network, the nodes' localities,
the policy selections, the waypoints, the cluster and trust domain: everything else a pod's workload reads).
:class:`PodWorkloads` keeps every pod's entry by pod key ``namespace/name``, the pods' workloads in uid order (the
order of the translation's output), their labels by uid and the non-empty skips by pod key, so that a translation
whose context did not change costs as much as the pods that changed, not as much as all the pods.

Rules:

1. :meth:`PodWorkloads.build` walks every pod, in input order. A pod's entry is reused when its (uid,
   resourceVersion) and the context equal the previous call's (a pod without a uid or resourceVersion is
   translated every time); any other pod is translated. This is the path when the changes are not known.
2. :meth:`PodWorkloads.patch` is taken instead when the caller names the objects that changed since the previous
   call through the same memo (``changed``: ``(kind plural, namespace/name)`` → the object now, or None when it is
   gone), the previous call left a patchable state, and the context and the discovery filter equal the previous
   call's. Only the named pods are looked at: each one's old workload leaves the uid order, and its new entry
   (reused under rule 1 when its uid and resourceVersion did not change) joins it; a pod the discovery filter does
   not admit is gone. Every other pod keeps its entry: the caller vouches that it did not change.
3. The pods' workloads are ordered by uid, and a pod's uid is made from its key, so no two pods share one; the
   translation merges the other workloads in after the pods of an equal uid, which is what a stable sort of the
   pods followed by the others gives.
4. A build that meets two pods with one key (which no informer cache holds) leaves the state unpatchable: the next
   call builds again. So does a call whose context differs (rule 1 then reuses nothing).
5. ``changed_uids`` after a call is the set of uids whose pod workload appeared, disappeared or was replaced by a
   different one (rule 2), or None after a build (unknown: compare everything).

Nothing here does I/O; the state belongs to the caller's :class:`~ambit.controlplane.translate.TranslationMemo`.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ambit.controlplane.translate.discovery import DiscoveryFilter
from ambit.controlplane.translate.skips import Skipped
from ambit.model.workload import Workload

__all__ = ["Changes", "PodEntry", "PodWorkloads", "pod_key"]

PodEntry = tuple[Workload | None, Mapping[str, str], tuple[Skipped, ...]]
"""A pod's finished workload (None: not a workload), its labels, and what had to be left out of it."""
Changes = Mapping[tuple[str, str], Mapping[str, Any] | None]
"""The objects that changed since the previous translation through the same memo: ``(kind plural,
"namespace/name")`` → the object now (None: deleted). Kinds are the informers' plurals (``pods``, ...)."""
VersionKey = tuple[str, str]


def pod_key(pod: Mapping[str, Any]) -> str:
    """``namespace/name`` of a pod (the key of a pod change)."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def _version_key(pod: Mapping[str, Any]) -> VersionKey:
    meta = pod.get("metadata") or {}
    return (str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""))


def _uid(w: Workload) -> str:
    return w.uid


@dataclass(slots=True)
class PodWorkloads:
    """Every pod's entry between translations (rules 1 to 5)."""

    context: object = None
    discovery: DiscoveryFilter | None = None
    entries: dict[str, tuple[VersionKey, PodEntry]] = field(default_factory=dict)
    ordered: list[Workload] = field(default_factory=list)
    """The pods' workloads by uid."""
    labels: dict[str, Mapping[str, str]] = field(default_factory=dict)
    """Each pod workload's labels, by uid."""
    skipped: dict[str, tuple[Skipped, ...]] = field(default_factory=dict)
    """The pods that had something left out, by pod key."""
    patchable: bool = False
    hits: int = 0
    """Pods whose entry was reused, in the last call."""
    changed_uids: set[str] | None = None

    def __len__(self) -> int:
        return len(self.entries)

    def can_patch(self, context: object, discovery: DiscoveryFilter, changed: Changes | None) -> bool:
        """Whether :meth:`patch` may serve this call (rule 2)."""
        return changed is not None and self.patchable and self.context == context and self.discovery == discovery

    def build(
        self,
        pods: Iterable[Mapping[str, Any]],
        context: object,
        discovery: DiscoveryFilter,
        translate: Callable[[Mapping[str, Any]], PodEntry],
    ) -> None:
        """Rule 1: every pod, reusing entries while the context holds."""
        reusable = self.entries if self.context == context else {}
        entries: dict[str, tuple[VersionKey, PodEntry]] = {}
        workloads: list[Workload] = []
        labels: dict[str, Mapping[str, str]] = {}
        skipped: dict[str, tuple[Skipped, ...]] = {}
        hits = 0
        unique = True
        for pod in pods:
            key, version = pod_key(pod), _version_key(pod)
            known = reusable.get(key)
            if known is not None and known[0] == version and all(version):
                entry = known[1]
                hits += 1
            else:
                entry = translate(pod)
            if key in entries:
                unique = False
            entries[key] = (version, entry)
            workload, pod_labels, pod_skips = entry
            if pod_skips:
                skipped[key] = skipped.get(key, ()) + pod_skips
            if workload is not None:
                labels[workload.uid] = pod_labels
                workloads.append(workload)
        workloads.sort(key=_uid)
        self.context, self.discovery, self.entries, self.ordered = context, discovery, entries, workloads
        self.labels, self.skipped, self.hits, self.patchable = labels, skipped, hits, unique
        self.changed_uids = None

    def patch(self, changed: Changes, translate: Callable[[Mapping[str, Any]], PodEntry]) -> None:
        """Rule 2: only the changed pods; :meth:`can_patch` must have said yes."""
        assert self.discovery is not None
        changed_uids: set[str] = set()
        hits = len(self.entries)
        for (kind, key), pod in changed.items():
            if kind != "pods":
                continue
            known = self.entries.pop(key, None)
            old = known[1][0] if known is not None else None
            if known is not None:
                hits -= 1
                self.skipped.pop(key, None)
            if old is not None:
                self._remove(old)
            if pod is None or not self.discovery.admits(pod):
                if old is not None:
                    changed_uids.add(old.uid)
                continue
            version = _version_key(pod)
            if known is not None and known[0] == version and all(version):
                entry = known[1]
                hits += 1
            else:
                entry = translate(pod)
            self.entries[key] = (version, entry)
            workload, pod_labels, pod_skips = entry
            if pod_skips:
                self.skipped[key] = pod_skips
            if workload is not None:
                self.labels[workload.uid] = pod_labels
                bisect.insort_right(self.ordered, workload, key=_uid)
            if old is not None and (workload is None or workload.uid != old.uid or workload != old):
                changed_uids.add(old.uid)
            if workload is not None and (old is None or workload.uid != old.uid or workload != old):
                changed_uids.add(workload.uid)
        self.hits = hits
        self.changed_uids = changed_uids

    def _remove(self, workload: Workload) -> None:
        at = bisect.bisect_left(self.ordered, workload.uid, key=_uid)
        while at < len(self.ordered) and self.ordered[at].uid == workload.uid:
            if self.ordered[at] is workload:
                del self.ordered[at]
                break
            at += 1
        self.labels.pop(workload.uid, None)

    def workloads_with(self, others: Iterable[Workload]) -> tuple[Workload, ...]:
        """The pods' workloads and ``others`` by uid, ``others`` after pods of an equal uid and in their own order
        among equal uids (rule 3)."""
        merged = list(self.ordered)
        for w in others:
            bisect.insort_right(merged, w, key=_uid)
        return tuple(merged)

    def all_skips(self) -> Iterable[Skipped]:
        for own in self.skipped.values():
            yield from own
