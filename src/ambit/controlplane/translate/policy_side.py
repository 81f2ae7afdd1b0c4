"""The policy stage of a translation: AuthorizationPolicies and PeerAuthentications → the L4 policy table.

Theory of operation: :func:`policy_side` turns every AuthorizationPolicy (through the caller's
:data:`PolicyMemo`, by uid and resourceVersion) and every PeerAuthentication into one :class:`PolicySide`: the
policies the node proxies receive, sorted by key, the ``ZtunnelAccepted`` statuses, what had to be left out, and
:class:`PolicyKeys`, the selections a workload's policy keys are found with. The value reads nothing but those two
kinds (already filtered by the discovery filter), the root namespace and whether dry-run policies are enforced, so
a translation whose changes name neither kind, nor a Namespace or ConfigMap, takes the previous call's value as it
is (:mod:`~ambit.controlplane.translate.stage_memo` rule 3): its cost then does not grow with the number of
policies, and the pods' context holds the same :class:`PolicyKeys` object, compared by identity.

Rules:

1. A policy key listed twice (an AuthorizationPolicy and a converted PeerAuthentication cannot share one, but a
   caller may hand over two objects of one key) keeps the last one made, AuthorizationPolicies first.
2. A workload lists the keys of the selector policies of its namespace and of the root namespace whose selector
   its labels satisfy, and the keys PeerAuthentication resolves to for it, sorted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.translate.peerauth import PeerAuthIndex
from ambit.controlplane.translate.policies import (
    PolicySelection,
    PolicyStatus,
    PolicyTranslation,
    translate_authorization_policy,
)
from ambit.controlplane.translate.skips import Skipped
from ambit.model.policy import Policy

__all__ = ["PolicyKeys", "PolicyMemo", "PolicySide", "policy_side"]

PolicyMemo = dict[tuple[str, str, str, bool], tuple[PolicyTranslation, tuple[Skipped, ...]]]
"""(uid, resourceVersion, root namespace, dry run enabled) → an AuthorizationPolicy's translation and skips."""


@dataclass(frozen=True, slots=True)
class PolicyKeys:
    """Which policy keys a workload lists (rule 2)."""

    by_namespace: Mapping[str, tuple[PolicySelection, ...]]
    everywhere: tuple[PolicySelection, ...]
    peer: PeerAuthIndex

    def find(self, namespace: str, labels: Mapping[str, Any]) -> tuple[str, ...]:
        text_labels = {str(k): str(v) for k, v in labels.items()}
        keys = {
            s.key
            for s in (*self.by_namespace.get(namespace, ()), *self.everywhere)
            if s.selects(namespace, text_labels)
        }
        keys.update(self.peer.find_keys(namespace, text_labels))
        return tuple(sorted(keys))


@dataclass(frozen=True, slots=True)
class PolicySide:
    """The policy stage's value."""

    policies: tuple[Policy, ...]
    """Every policy for the node proxies, by key (rule 1)."""
    statuses: tuple[PolicyStatus, ...]
    """The ``ZtunnelAccepted`` condition of each AuthorizationPolicy that has one, by key."""
    keys: PolicyKeys
    skips: tuple[Skipped, ...]


def policy_side(
    authorization_policies: Iterable[Mapping[str, Any]],
    peer_authentications: Iterable[Mapping[str, Any]],
    *,
    root_namespace: str,
    enable_dry_run: bool,
    memo: PolicyMemo | None,
) -> PolicySide:
    """The policy stage; ``memo`` (the caller's, or None) holds exactly this call's AuthorizationPolicies after."""
    skips: list[Skipped] = []
    policies: list[Policy] = []
    statuses: list[PolicyStatus] = []
    by_namespace: dict[str, list[PolicySelection]] = {}
    everywhere: list[PolicySelection] = []
    fresh_memo: PolicyMemo = {}
    for obj in authorization_policies:
        meta = obj.get("metadata") or {}
        memo_key = (str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""), root_namespace, enable_dry_run)
        remembered = memo.get(memo_key) if memo is not None and all(memo_key[:2]) else None
        if remembered is None:
            own_skips: list[Skipped] = []
            result = translate_authorization_policy(
                obj, root_namespace=root_namespace, enable_dry_run=enable_dry_run, skips=own_skips
            )
            remembered = (result, tuple(own_skips))
        result, own = remembered
        skips.extend(own)
        if all(memo_key[:2]):
            fresh_memo[memo_key] = remembered
        if result.policy is not None:
            policies.append(result.policy)
        if result.status is not None:
            statuses.append(result.status)
        if result.selection is not None:
            target = (
                everywhere if result.selection.everywhere else by_namespace.setdefault(result.selection.namespace, [])
            )
            target.append(result.selection)
    if memo is not None:
        memo.clear()
        memo.update(fresh_memo)
    peer = PeerAuthIndex.build(peer_authentications, root_namespace=root_namespace, skips=skips)
    policies.extend(peer.policies)
    return PolicySide(
        policies=tuple(sorted({p.key: p for p in policies}.values(), key=lambda p: p.key)),
        statuses=tuple(sorted(statuses, key=lambda s: s.key)),
        keys=PolicyKeys({ns: tuple(items) for ns, items in by_namespace.items()}, tuple(everywhere), peer),
        skips=tuple(skips),
    )
