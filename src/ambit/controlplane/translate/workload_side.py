"""The workload stages of a translation that are not the pods' own
(:mod:`~ambit.controlplane.translate.pod_workloads` keeps those): the service index, the hand-added EndpointSlice
endpoints' workloads, the ServiceEntries' inline endpoints' workloads, each taken from the previous call while
what it reads did not change (:mod:`~ambit.controlplane.translate.stage_memo` rules 6-8); one pod's finished
workload (services map, policy keys, waypoint and application tunnel); and the workload changes since the previous
call that the encoders patch by.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import Any

from ambit.controlplane.translate.endpointslices import endpoint_slice_workloads, gives_workloads
from ambit.controlplane.translate.fields import object_labels
from ambit.controlplane.translate.index import SERVICE_NAME_LABEL, ServiceIndex
from ambit.controlplane.translate.pod_workloads import PodEntry
from ambit.controlplane.translate.policy_side import PolicyKeys
from ambit.controlplane.translate.service_side import ServiceSide
from ambit.controlplane.translate.serviceentries import selections, service_entry_workloads
from ambit.controlplane.translate.skips import Skipped
from ambit.controlplane.translate.stage_memo import ChangedKinds
from ambit.controlplane.translate.translation import EntryWorkloads, StageMemos, TranslationMemo, WorkloadChanges
from ambit.controlplane.translate.waypoints import WaypointIndex
from ambit.controlplane.translate.workloads import translate_pod
from ambit.model.workload import Locality, Workload

__all__ = ["entry_workloads", "hand_added_workloads", "pod_workload", "service_index", "workload_changes_since"]


def _slices_untouched(known: ChangedKinds, used: Collection[str], matters: Callable[[Mapping[str, Any]], bool]) -> bool:
    """Whether no changed EndpointSlice is one a stage used last time (``used``) or one that ``matters`` to it now."""
    return not any(key in used or (eps is not None and matters(eps)) for key, eps in known.objects("endpointslices"))


def service_index(
    stages: StageMemos,
    known: ChangedKinds,
    side: ServiceSide,
    services: list[Mapping[str, Any]],
    slices: list[Mapping[str, Any]],
    domain: str,
    translation_memo: TranslationMemo | None,
) -> ServiceIndex:
    """The service index, the previous call's while the slices it reads did not change (:mod:`~ambit.controlplane.
    translate.stage_memo` rule 6)."""
    previous = stages.index.value
    unchanged = (
        stages.services.reused
        and previous is not None
        and _slices_untouched(known, previous[1], lambda eps: _slice_owner(eps) in side.selectorless)
    )
    found = stages.index.find(domain, unchanged)
    if found is not None:
        return found[0]
    index = ServiceIndex.build(
        services,
        slices,
        domain=domain,
        extra=selections(side.entries),
        memo=translation_memo.selections if translation_memo is not None else None,
    )
    read_now = frozenset(
        _object_key(eps) for eps in slices if side.selectorless and _slice_owner(eps) in side.selectorless
    )
    return stages.index.keep(domain, (index, read_now))[0]


def hand_added_workloads(
    stages: StageMemos,
    known: ChangedKinds,
    side: ServiceSide,
    services: list[Mapping[str, Any]],
    slices: list[Mapping[str, Any]],
    domain: str,
    cluster_id: str,
    trust_domain: str,
    translation_memo: TranslationMemo | None,
) -> tuple[tuple[Workload, ...], tuple[Skipped, ...]]:
    """The hand-added endpoints' workloads and skips, the previous call's while no changed slice gives or gave any
    (:mod:`~ambit.controlplane.translate.stage_memo` rule 7)."""
    previous = stages.slices.value
    unchanged = (
        stages.services.reused and previous is not None and _slices_untouched(known, previous[2], gives_workloads)
    )
    settings = (domain, cluster_id, trust_domain)
    found = stages.slices.find(settings, unchanged)
    if found is not None:
        return found[0], found[1]
    own: list[Skipped] = []
    made = tuple(
        endpoint_slice_workloads(
            slices,
            services,
            domain=domain,
            cluster_id=cluster_id,
            trust_domain=trust_domain,
            network=side.network,
            skips=own,
            memo=translation_memo.slices if translation_memo is not None else None,
        )
    )
    giving_now = frozenset(_object_key(eps) for eps in slices if gives_workloads(eps))
    kept = stages.slices.keep(settings, (made, tuple(own), giving_now))
    return kept[0], kept[1]


def entry_workloads(
    stages: StageMemos,
    side: ServiceSide,
    keys: PolicyKeys,
    waypoints: WaypointIndex,
    network: str,
    cluster_id: str,
    trust_domain: str,
) -> EntryWorkloads:
    """The ServiceEntries' inline endpoints' workloads with their labels, and the skips; the previous call's while
    the policy and service stages were reused (:mod:`~ambit.controlplane.translate.stage_memo` rule 8)."""
    entry_settings = (cluster_id, trust_domain)
    entry_made = stages.entry_workloads.find(entry_settings, stages.policies.reused and stages.services.reused)
    if entry_made is None:
        entry_skips: list[Skipped] = []
        entry_made = stages.entry_workloads.keep(
            entry_settings,
            (
                tuple(
                    made
                    for entry in side.entries
                    for made in service_entry_workloads(
                        entry,
                        cluster_id=cluster_id,
                        trust_domain=trust_domain,
                        network=network,
                        skips=entry_skips,
                        policy_keys=keys.find,
                        waypoint_of=lambda namespace, labels: waypoints.find_for_workload(namespace, labels).address,
                    )
                ),
                tuple(entry_skips),
            ),
        )
    return entry_made


def _slice_owner(eps: Mapping[str, Any]) -> tuple[str, str]:
    meta = eps.get("metadata") or {}
    return (str(meta.get("namespace", "")), str((meta.get("labels") or {}).get(SERVICE_NAME_LABEL) or ""))


def workload_changes_since(
    memo: TranslationMemo, pod_changes: set[str] | None, others: list[Workload]
) -> WorkloadChanges | None:
    """The changes since the memo's previous workloads: the pods' (when patched), and every uid of the other
    workloads (not pods') unless they are equal, in order, to the previous call's."""
    if pod_changes is None or memo.workloads is None:
        return None
    uids = set(pod_changes)
    previous = memo.other_workloads
    if len(previous) != len(others) or any(a is not b and a != b for a, b in zip(previous, others, strict=True)):
        uids.update(w.uid for w in previous)
        uids.update(w.uid for w in others)
    return WorkloadChanges(memo.workloads, frozenset(uids))


def pod_workload(
    pod: Mapping[str, Any],
    index: ServiceIndex,
    keys: PolicyKeys,
    waypoints: WaypointIndex,
    cluster_id: str,
    trust_domain: str,
    network: str,
    localities: Mapping[str, Locality],
) -> PodEntry:
    """One pod's finished workload (or None), its labels and what had to be left out of it."""
    own_skips: list[Skipped] = []
    w = translate_pod(
        pod,
        index,
        cluster_id=cluster_id,
        trust_domain=trust_domain,
        network=network,
        skips=own_skips,
        localities=localities,
    )
    if w is None:
        return None, {}, tuple(own_skips)
    labels = (pod.get("metadata") or {}).get("labels") or {}
    pod_labels = object_labels(pod)
    waypoint = waypoints.find_for_workload(w.namespace, pod_labels, pod=True).address
    w = replace(
        w,
        authorization_policies=keys.find(w.namespace, labels),
        waypoint=waypoint,
        application_tunnel=waypoints.find_application_tunnel(w.namespace, pod_labels),
    )
    return w, pod_labels, tuple(own_skips)


def _object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
