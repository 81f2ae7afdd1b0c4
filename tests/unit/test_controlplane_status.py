"""Planning the ``ZtunnelAccepted`` condition (spec §10.3): write only on change, keep others, flip times."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, cast

from ambit.controlplane.status import PolicyStatusWriter, StatusWriter, plan_conditions, rfc3339
from ambit.controlplane.translate import PolicyStatus
from ambit.k8s import KubeClient, KubeClientError, kinds

ACCEPTED = PolicyStatus("ns", "p", 2, True, "Accepted", "attached to ztunnel")
T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"


def test_a_new_condition_is_added_with_the_time_of_now() -> None:
    assert plan_conditions(None, ACCEPTED, T0) == [
        {
            "type": "ZtunnelAccepted",
            "status": "True",
            "reason": "Accepted",
            "message": "attached to ztunnel",
            "observedGeneration": 2,
            "lastTransitionTime": T0,
        }
    ]


def test_an_unchanged_condition_is_not_written() -> None:
    current = plan_conditions(None, ACCEPTED, T0)
    assert plan_conditions(current, ACCEPTED, T1) is None


def test_a_new_generation_is_written_but_keeps_the_transition_time() -> None:
    current = plan_conditions(None, ACCEPTED, T0)
    [condition] = (
        plan_conditions(current, PolicyStatus("ns", "p", 3, True, "Accepted", "attached to ztunnel"), T1) or []
    )
    assert condition["observedGeneration"] == 3 and condition["lastTransitionTime"] == T0


def test_a_status_flip_moves_the_transition_time() -> None:
    current = plan_conditions(None, ACCEPTED, T0)
    audit = PolicyStatus("ns", "p", 3, False, "UnsupportedValue", "ztunnel does not support the AUDIT action")
    [condition] = plan_conditions(current, audit, T1) or []
    assert condition["status"] == "False" and condition["lastTransitionTime"] == T1


def test_other_conditions_are_kept_in_place() -> None:
    waypoint = {"type": "WaypointAccepted", "status": "True", "reason": "Accepted", "message": "bound to ns/w"}
    planned = plan_conditions([waypoint], ACCEPTED, T0)
    assert planned is not None and planned[0] == waypoint and planned[1]["type"] == "ZtunnelAccepted"


def test_a_policy_without_a_ztunnel_status_loses_the_condition_and_one_without_it_is_left_alone() -> None:
    waypoint = {"type": "WaypointAccepted", "status": "True"}
    current = plan_conditions([waypoint], ACCEPTED, T0)
    assert plan_conditions(current, None, T1) == [waypoint]
    assert plan_conditions([waypoint], None, T1) is None


def test_times_are_whole_seconds_in_utc() -> None:
    assert rfc3339(1767225600.9) == "2026-01-01T00:00:00Z"


def test_the_control_plane_role_may_write_policy_status_but_not_the_policies() -> None:
    """deploy/rbac/istiod.yaml: status through the subresource only; the spec stays the user's."""
    from pathlib import Path

    import yaml

    from ambit.apiserver.rbac_policy import Attributes, rules_allow, rules_from

    docs = list(yaml.safe_load_all((Path(__file__).parents[2] / "deploy" / "rbac" / "istiod.yaml").read_text()))
    [role] = [d for d in docs if d and d["kind"] == "ClusterRole" and d["metadata"]["name"].startswith("istiod")]
    rules = rules_from(role["rules"])
    user, groups = "system:serviceaccount:istio-system:istiod", ("system:serviceaccounts",)

    def may(verb: str, sub: str = "") -> bool:
        attrs = Attributes(user, groups, verb, True, "security.istio.io", "authorizationpolicies", sub, "shop", "p")
        return rules_allow(rules, attrs)

    assert may("patch", "status") and may("get") and may("list") and may("watch")
    assert not may("patch") and not may("update") and not may("delete")


def test_a_status_only_update_of_a_policy_does_not_need_a_translation() -> None:
    from ambit.controlplane.view import _translated_part

    policy = {"metadata": {"name": "p", "generation": 1, "resourceVersion": "5"}, "spec": {"action": "DENY"}}
    written = {**policy, "metadata": {**policy["metadata"], "resourceVersion": "6"}, "status": {"conditions": []}}
    assert _translated_part(policy) == _translated_part(written)
    relabelled = {**policy, "metadata": {**policy["metadata"], "labels": {"a": "b"}}}
    assert _translated_part(policy) != _translated_part(relabelled)
    respecced = {**policy, "spec": {"action": "ALLOW"}}
    assert _translated_part(policy) != _translated_part(respecced)


async def test_a_writer_whose_planning_fails_once_tries_again_instead_of_ending() -> None:
    """A defect planning one object's status (hostile spec fields) is logged and the pass retried; before, it ended
    the writer's task and no status was ever written again."""
    plans: list[str] = []
    planned_twice = asyncio.Event()

    class Flaky(StatusWriter):
        def _plan(self, status: Mapping[str, Any], key: str, namespace: str, now: str) -> dict[str, Any] | None:
            plans.append(key)
            if len(plans) == 2:
                planned_twice.set()
            if len(plans) == 1:
                raise TypeError("a defect in the plan")
            return None

    objects = [{"metadata": {"name": "allow", "namespace": "apps", "resourceVersion": "1"}}]
    client = cast(KubeClient, object())  # never reached: nothing is planned
    writer = Flaky(client, lambda: objects, clock=time.time, retry=0.01, kind=kinds.AUTHORIZATION_POLICIES, name="t")
    writer.start()
    try:
        writer._wake()
        await asyncio.wait_for(planned_twice.wait(), 5)
        assert plans == ["apps/allow", "apps/allow"]
    finally:
        await writer.aclose()


async def test_a_pass_plans_only_objects_that_changed_since_their_last_empty_plan() -> None:
    """Rule 10: every configuration change wakes the writers; an object with the same resourceVersion and the same
    wanted status as at its last plan that wrote nothing is not planned again; a new wanted status, or someone
    else's write (a new resourceVersion), is."""
    planned: list[str] = []
    objects: dict[str, dict[str, Any]] = {
        name: {"metadata": {"name": name, "namespace": "ns", "resourceVersion": "1", "generation": 1}}
        for name in ("a", "b", "c")
    }

    class Client:
        async def patch_status(self, kind: object, name: str, body: dict[str, Any], namespace: str) -> dict[str, Any]:
            version = str(int(body["metadata"]["resourceVersion"]) + 1)
            objects[name] = {**objects[name], "status": body["status"]}
            objects[name]["metadata"] = {**objects[name]["metadata"], "resourceVersion": version}
            return objects[name]

    class Counting(PolicyStatusWriter):
        def _plan(self, status: Mapping[str, Any], key: str, namespace: str, now: str) -> dict[str, Any] | None:
            planned.append(key)
            return super()._plan(status, key, namespace, now)

    writer = Counting(cast(KubeClient, Client()), lambda: list(objects.values()), clock=time.time)
    wanted = {n: PolicyStatus("ns", n, 1, True, "Accepted", "attached to ztunnel") for n in objects}

    async def one_pass() -> list[str]:
        planned.clear()
        assert await writer.write_once()
        return sorted(planned)

    writer.submit(wanted.values())
    assert await one_pass() == ["ns/a", "ns/b", "ns/c"] and writer.writes == 3
    assert await one_pass() == ["ns/a", "ns/b", "ns/c"]  # each written object's new version, planned once
    assert await one_pass() == [] and writer.writes == 3  # nothing changed: nothing planned
    wanted["b"] = PolicyStatus("ns", "b", 1, False, "Invalid", "bad rule")
    writer.submit(wanted.values())
    assert await one_pass() == ["ns/b"] and writer.writes == 4
    assert objects["b"]["status"]["conditions"][0]["status"] == "False"
    objects["c"] = {**objects["c"], "status": {}, "metadata": {**objects["c"]["metadata"], "resourceVersion": "9"}}
    assert await one_pass() == ["ns/b", "ns/c"] and writer.writes == 5  # b's new version; c's condition put back
    assert objects["c"]["status"]["conditions"][0]["reason"] == "Accepted"
    assert await one_pass() == ["ns/c"] and await one_pass() == []


async def test_a_pass_is_skipped_whole_while_neither_the_cache_nor_the_wanted_statuses_changed() -> None:
    """Rule 11: after a pass that found everything settled, a pass with the same generation (the cache's last
    resourceVersion) and the same wanted statuses does not even walk the objects; a new generation, a different
    wanted status, or a failed write makes the next pass walk them again. A resubmission of equal statuses does
    not."""
    walks: list[int] = []
    generation = ["10"]
    fail = [False]
    objects: dict[str, dict[str, Any]] = {
        name: {"metadata": {"name": name, "namespace": "ns", "resourceVersion": "1", "generation": 1}}
        for name in ("a", "b")
    }

    class Client:
        async def patch_status(self, kind: object, name: str, body: dict[str, Any], namespace: str) -> dict[str, Any]:
            if fail[0]:
                raise KubeClientError("the API server is away")
            version = str(int(body["metadata"]["resourceVersion"]) + 1)
            objects[name] = {**objects[name], "status": body["status"]}
            objects[name]["metadata"] = {**objects[name]["metadata"], "resourceVersion": version}
            generation[0] = str(int(generation[0]) + 1)  # the informer sees our write
            return objects[name]

    def listed() -> list[dict[str, Any]]:
        walks.append(1)
        return list(objects.values())

    writer = PolicyStatusWriter(cast(KubeClient, Client()), listed, clock=time.time, generation=lambda: generation[0])
    wanted = {n: PolicyStatus("ns", n, 1, True, "Accepted", "attached to ztunnel") for n in objects}

    async def walked() -> bool:
        walks.clear()
        ok = await writer.write_once()
        assert ok != fail[0]
        return bool(walks)

    writer.submit(wanted.values())
    assert await walked() and writer.writes == 2  # both written
    assert await walked()  # the cache moved (our own writes): walked, nothing to write
    assert not await walked() and not await walked()  # settled, nothing changed: no walk
    writer.submit(list(wanted.values()))  # the next translation, the same statuses
    assert not await walked()
    generation[0] = "99"  # someone else's write of some object (or a new object)
    assert await walked() and not await walked()
    wanted["b"] = PolicyStatus("ns", "b", 1, False, "Invalid", "bad rule")
    fail[0] = True
    writer.submit(wanted.values())
    assert await walked() and await walked()  # the write failed: every pass walks until it goes through
    fail[0] = False
    assert await walked() and writer.writes == 3 and objects["b"]["status"]["conditions"][0]["status"] == "False"
    assert await walked() and not await walked()


async def test_a_writer_without_a_generation_walks_on_every_pass() -> None:
    walks: list[int] = []

    def listed() -> list[dict[str, Any]]:
        walks.append(1)
        return []

    writer = PolicyStatusWriter(cast(KubeClient, object()), listed, clock=time.time)
    writer.submit([])
    for _ in range(3):
        assert await writer.write_once()
    assert len(walks) == 3
