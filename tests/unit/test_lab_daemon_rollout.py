"""The DaemonSet controller's pure decisions: node fit (taints, tolerations, affinity), daemon pods, revisions,
manage and the rolling update, with a property test of the rolling update's availability invariants."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.lab.controllers import daemon_rollout as dr
from ambit.lab.controllers import revisions
from ambit.lab.controllers.eviction import eviction_time, no_execute_taints
from ambit.lab.controllers.placement import Taint, place, tolerates, why_not
from ambit.lab.controllers.pods import is_ready, rfc3339

Obj = dict[str, Any]


def node(name: str, *, ready: bool = True, taints: list[Obj] | None = None, **labels: str) -> Obj:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints} if taints else {},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def ds(strategy: Obj | None = None, **pod_spec: Any) -> Obj:
    labels = {"app": "agent"}
    body: Obj = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "agent", "namespace": "kube-system", "uid": "ds-1", "generation": 1},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "a", "image": "a:1"}]}},
        },
    }
    body["spec"]["template"]["spec"].update(pod_spec)
    body["metadata"]["annotations"] = {dr.GENERATION_ANNOTATION: "1"}
    if strategy is not None:
        body["spec"]["updateStrategy"] = strategy
    return body


# -- tolerations, taints, affinity ------------------------------------------------------------------------------
def test_tolerations_match_taints_as_kube_matches_them() -> None:
    taint = Taint("dedicated", "db", "NoSchedule")
    assert tolerates({"key": "dedicated", "value": "db", "effect": "NoSchedule"}, taint)
    assert tolerates({"key": "dedicated", "operator": "Exists"}, taint)  # empty effect: every effect
    assert tolerates({"operator": "Exists"}, taint)  # empty key with Exists: every taint
    assert not tolerates({"key": "dedicated", "value": "web", "effect": "NoSchedule"}, taint)
    assert not tolerates({"key": "dedicated", "value": "db", "effect": "NoExecute"}, taint)
    assert not tolerates({"value": "db"}, taint)  # empty key needs Exists


def test_the_scheduler_filters_say_why_in_kubes_words() -> None:
    pod: Obj = {"spec": {"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]}}
    cordoned = node("c")
    cordoned["spec"]["unschedulable"] = True
    assert why_not(pod, cordoned) is None
    assert why_not({"spec": {}}, cordoned) == "node(s) were unschedulable"
    assert why_not({"spec": {}}, node("t", taints=[{"key": "k", "value": "v", "effect": "NoExecute"}])) == (
        "node(s) had untolerated taint {k: v}"
    )
    assert why_not({"spec": {}}, node("p", taints=[{"key": "k", "effect": "PreferNoSchedule"}])) is None
    assert (
        why_not({"spec": {}}, node("n", ready=False))
        == "node(s) had untolerated taint {node.kubernetes.io/not-ready: }"
    )
    assert why_not({"spec": {"tolerations": [{"operator": "Exists"}]}}, node("n", ready=False)) is None


def test_required_node_affinity_supports_every_operator_and_match_fields() -> None:
    def pod_with(*exprs: Obj, fields: list[Obj] | None = None) -> Obj:
        term: Obj = {"matchExpressions": list(exprs)}
        if fields:
            term["matchFields"] = fields
        required = {"nodeSelectorTerms": [term]}
        return {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}}}

    n = node("n1", zone="a", cores="8")
    assert why_not(pod_with({"key": "zone", "operator": "In", "values": ["a", "b"]}), n) is None
    assert why_not(pod_with({"key": "zone", "operator": "NotIn", "values": ["a"]}), n) is not None
    assert why_not(pod_with({"key": "gpu", "operator": "DoesNotExist"}), n) is None
    assert why_not(pod_with({"key": "zone", "operator": "Exists"}), n) is None
    assert why_not(pod_with({"key": "cores", "operator": "Gt", "values": ["4"]}), n) is None
    assert why_not(pod_with({"key": "cores", "operator": "Lt", "values": ["4"]}), n) is not None
    pinned = pod_with(fields=[{"key": "metadata.name", "operator": "In", "values": ["n1"]}])
    assert why_not(pinned, n) is None
    assert why_not(pinned, node("n2")) == "node(s) didn't match Pod's node affinity/selector"
    assert why_not(pod_with(), n) is not None  # an empty term matches nothing


def test_placement_counts_each_node_under_its_first_failure_and_sorts_as_kube() -> None:
    pod: Obj = {"spec": {"nodeSelector": {"disk": "ssd"}}}
    nodes = [node("a", taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}]), node("b", disk="hdd")]
    assert place(pod, nodes, {}).message == (
        "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint {k: v}."
    )


def test_no_execute_eviction_waits_for_the_smallest_toleration_seconds() -> None:
    taints = no_execute_taints(
        node("n", taints=[{"key": "k", "effect": "NoExecute"}, {"key": "s", "effect": "NoSchedule"}])
    )
    assert taints == [Taint("k", "", "NoExecute")]
    since = {Taint("k", "", "NoExecute"): 100.0}.__getitem__
    assert eviction_time([], taints, since) == float("-inf")
    assert eviction_time([{"key": "k", "operator": "Exists"}], taints, since) is None
    short = [
        {"operator": "Exists", "tolerationSeconds": 30},
        {"key": "k", "operator": "Exists", "tolerationSeconds": 10},
    ]
    assert eviction_time(short, taints, since) == 110.0


# -- daemon pods and revisions ----------------------------------------------------------------------------------
def test_daemon_pods_get_kubes_tolerations_and_are_pinned_to_their_node() -> None:
    d = ds(
        hostNetwork=True,
        tolerations=[{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}],
    )
    d["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": []}]}
        }
    }
    pod = dr.new_pod(d, "n1", "abc")
    keys = [(t["key"], t["effect"]) for t in pod["spec"]["tolerations"]]
    assert len(keys) == len(set(keys)) == 7
    assert ("node.kubernetes.io/network-unavailable", "NoSchedule") in keys
    required = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    ]
    assert pod["metadata"]["labels"] == {
        "app": "agent",
        "controller-revision-hash": "abc",
        "pod-template-generation": "1",
    }
    assert pod["metadata"]["generateName"] == "agent-"
    assert dr.target_node(pod) == "n1"
    assert d["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ] == [{"matchExpressions": []}]  # the DaemonSet itself is untouched


def test_node_fit_follows_selectors_and_taints_and_lets_pods_stay_through_no_schedule() -> None:
    d = ds(nodeSelector={"role": "worker"})
    assert dr.node_fit(d, node("w", role="worker")) == dr.Fit(True, True)
    assert dr.node_fit(d, node("e", role="edge")) == dr.Fit(False, False)
    no_schedule = node("w", role="worker", taints=[{"key": "k", "effect": "NoSchedule"}])
    assert dr.node_fit(d, no_schedule) == dr.Fit(False, True)
    no_execute = node("w", role="worker", taints=[{"key": "k", "effect": "NoExecute"}])
    assert dr.node_fit(d, no_execute) == dr.Fit(False, False)
    cordoned = node("w", role="worker")
    cordoned["spec"]["unschedulable"] = True
    assert dr.node_fit(d, cordoned) == dr.Fit(True, True)  # daemon pods tolerate cordoned nodes


def test_revisions_hold_the_template_as_kube_stores_it_and_the_current_one_is_renumbered() -> None:
    d = ds()
    rev = revisions.new_revision(d, 1)
    pod_hash = revisions.current_hash(d)
    assert rev["metadata"]["name"] == f"agent-{pod_hash}"
    assert rev["metadata"]["labels"] == {"app": "agent", "controller-revision-hash": pod_hash}
    assert rev["data"] == {"spec": {"template": {**d["spec"]["template"], "$patch": "replace"}}}
    assert rev["metadata"]["ownerReferences"][0]["controller"] is True
    assert revisions.matches(d, rev)
    changed = ds()
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "a:2"
    assert revisions.current_hash(changed) != pod_hash
    second = revisions.new_revision(changed, 2)
    history = revisions.sort_out(d, [second, rev])  # back to the first template
    assert history.current is rev and history.old == [second] and history.next_number == 3
    fresh = revisions.sort_out(changed, [rev])
    assert fresh.current is None and fresh.next_number == 2


def test_pruning_keeps_the_limit_and_every_revision_a_pod_uses() -> None:
    d = ds()
    d["spec"]["revisionHistoryLimit"] = 1
    old = []
    for i in range(1, 5):
        rev = revisions.new_revision(d, i)
        rev["metadata"]["labels"]["controller-revision-hash"] = f"h{i}"
        old.append(rev)
    assert [r["revision"] for r in revisions.to_prune(d, old, set())] == [1, 2, 3]
    assert [r["revision"] for r in revisions.to_prune(d, old, {"h1"})] == [2, 3, 4]


# -- manage and the rolling update ------------------------------------------------------------------------------
_clock = itertools.count(1_700_000_000)


def pod(name: str, node_name: str, pod_hash: str, *, ready: bool = True, phase: str = "Running") -> Obj:
    return {
        "metadata": {
            "name": name,
            "namespace": "kube-system",
            "creationTimestamp": rfc3339(next(_clock)),
            "labels": {"app": "agent", "controller-revision-hash": pod_hash},
        },
        "spec": {"nodeName": node_name},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_manage_creates_missing_pods_and_removes_extra_failed_and_misplaced_ones() -> None:
    d = ds(nodeSelector={"role": "worker"})
    nodes = [node("a", role="worker"), node("b", role="worker"), node("c", role="edge"), node("d", role="worker")]
    pods = [
        pod("a1", "a", "h"),
        pod("a2", "a", "h"),
        pod("c1", "c", "h"),
        pod("d1", "d", "h", phase="Failed"),
        pod("gone1", "gone", "h"),
    ]
    plan = dr.manage(d, nodes, dr.by_node(pods), "h", 0.0)
    assert plan.create_on == ["b"]
    assert sorted(p["metadata"]["name"] for p in plan.delete) == ["a2", "c1", "d1", "gone1"]


def test_a_terminating_pod_holds_its_node_until_it_is_gone() -> None:
    leaving = pod("a1", "a", "old")
    leaving["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    plan = dr.manage(ds(), [node("a")], dr.by_node([leaving]), "new", 0.0)
    assert plan.create_on == [] and plan.delete == []


def test_rolling_update_deletes_unavailable_old_pods_first_then_within_max_unavailable() -> None:
    d = ds({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "50%", "maxSurge": 0}})
    nodes = [node(n) for n in "abcd"]
    pods = [pod("a1", "a", "old", ready=False), pod("b1", "b", "old"), pod("c1", "c", "old"), pod("d1", "d", "old")]
    plan = dr.rolling_update(d, nodes, dr.by_node(pods), "new", 0.0)
    assert [p["metadata"]["name"] for p in plan.delete] == ["a1", "b1", "c1"]  # a1 free, then 2 (50% of 4)


def test_surge_creates_new_pods_beside_old_ones_and_deletes_the_old_once_the_new_is_available() -> None:
    d = ds({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}})
    nodes = [node(n) for n in "abc"]
    pods = [pod("a1", "a", "old"), pod("b1", "b", "old"), pod("c1", "c", "old")]
    assert dr.rolling_update(d, nodes, dr.by_node(pods), "new", 0.0).create_on == ["a"]
    pods.append(pod("a2", "a", "new", ready=False))
    step = dr.rolling_update(d, nodes, dr.by_node(pods), "new", 0.0)
    assert (step.create_on, step.delete) == ([], [])
    pods[-1] = pod("a2", "a", "new")
    step = dr.rolling_update(d, nodes, dr.by_node(pods), "new", 0.0)
    assert ([p["metadata"]["name"] for p in step.delete], step.create_on) == (["a1"], ["b"])


def test_status_counts_nodes_as_kube_does() -> None:
    d = ds(nodeSelector={"role": "worker"})
    nodes = [node("a", role="worker"), node("b", role="worker"), node("c", role="edge")]
    pods = [pod("a1", "a", "new"), pod("b1", "b", "old", ready=False), pod("c1", "c", "new")]
    status = dr.daemon_status(d, nodes, dr.by_node(pods), "new", 0.0)
    assert status == {
        "currentNumberScheduled": 2,
        "numberMisscheduled": 1,
        "desiredNumberScheduled": 2,
        "numberReady": 1,
        "updatedNumberScheduled": 1,
        "numberAvailable": 1,
        "numberUnavailable": 1,
        "observedGeneration": 1,
    }


@settings(max_examples=150)
@given(
    node_count=st.integers(1, 6),
    limit=st.one_of(st.integers(1, 4), st.sampled_from(["20%", "50%", "100%"])),
    surge=st.booleans(),
    readiness=st.lists(st.booleans(), min_size=1, max_size=40),
)
def test_a_rolling_update_never_exceeds_its_budget_and_finishes(
    node_count: int, limit: int | str, surge: bool, readiness: list[bool]
) -> None:
    rolling = {"maxUnavailable": 0, "maxSurge": limit} if surge else {"maxUnavailable": limit, "maxSurge": 0}
    d = ds({"type": "RollingUpdate", "rollingUpdate": rolling})
    nodes = [node(f"n{i}") for i in range(node_count)]
    max_surge, max_unavailable = dr.surge_and_unavailable(d, node_count)
    names = itertools.count()
    pods = {f"p{next(names)}": pod("", f"n{i}", "old") for i in range(node_count)}
    for name, p in pods.items():
        p["metadata"]["name"] = name
    # Readiness follows the drawn pattern for a while, then every pod becomes ready: the bound on the loop must
    # leave room for the rollout to end after the last "not ready" (40 x 3 flips, then at most 2 steps per node).
    flips = iter(readiness * 3)
    for _ in range(400):
        by_node = dr.by_node(pods.values())
        plan = dr.manage(d, nodes, by_node, "new", 0.0)
        step = dr.rolling_update(d, nodes, by_node, "new", 0.0)
        for victim in [*plan.delete, *step.delete]:
            pods.pop(victim["metadata"]["name"], None)
        for target in dict.fromkeys([*plan.create_on, *step.create_on]):
            name = f"p{next(names)}"
            pods[name] = pod(name, target, "new", ready=False)
        per_node = dr.by_node(pods.values())
        without = sum(1 for n in nodes if not any(is_ready(p) for p in per_node.get(n["metadata"]["name"], [])))
        assert all(len(ps) <= 2 for ps in per_node.values()), "never more than one surge pod per node"
        if surge:
            assert without == 0, "surge keeps every node served"
            assert sum(1 for ps in per_node.values() if len(ps) == 2) <= max_surge
        else:
            assert without <= max_unavailable
            assert all(len(ps) == 1 for ps in per_node.values())
        done = all(
            len(per_node.get(n["metadata"]["name"], [])) == 1
            and per_node[n["metadata"]["name"]][0]["metadata"]["labels"]["controller-revision-hash"] == "new"
            and is_ready(per_node[n["metadata"]["name"]][0])
            for n in nodes
        )
        if done:
            return
        for p in pods.values():  # the kubelet: some new pods become ready
            if not is_ready(p) and next(flips, True):
                p["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    raise AssertionError("the rollout did not finish")
