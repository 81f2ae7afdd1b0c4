"""Validation of the kinds and fields that place and roll out pods: DaemonSet strategies, ControllerRevisions,
PriorityClasses, PodDisruptionBudgets, tolerations, node affinity and taints; and the Priority admission step."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.json_strategies import json_values

from ambit.apiserver.errors import ApiError
from ambit.apiserver.priority import admit_pod, builtin_classes
from ambit.apiserver.validation import validate_object

Obj = dict[str, Any]
CONTAINERS = [{"name": "c", "image": "registry.example/c:1"}]


def fields(causes: list[tuple[str, str]]) -> list[str]:
    return sorted(path for path, _ in causes)


def daemon_set(strategy: Any) -> Obj:
    labels = {"app": "a"}
    return {
        "metadata": {"name": "a", "namespace": "ns"},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": CONTAINERS}},
            "updateStrategy": strategy,
        },
    }


@pytest.mark.parametrize(
    ("strategy", "problems"),
    [
        ({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}, []),
        ({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "25%"}}, []),
        ({"type": "OnDelete"}, []),
        (
            {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 0}},
            ["spec.updateStrategy.rollingUpdate.maxUnavailable"],
        ),
        (
            {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 1}},
            ["spec.updateStrategy.rollingUpdate.maxSurge"],
        ),
        (
            {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "150%", "maxSurge": 0}},
            ["spec.updateStrategy.rollingUpdate.maxUnavailable"],
        ),
        (
            {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "x%", "maxSurge": 0}},
            ["spec.updateStrategy.rollingUpdate.maxUnavailable"],
        ),
        (
            {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": -1, "maxSurge": 0}},
            ["spec.updateStrategy.rollingUpdate.maxUnavailable"],
        ),
        ({"type": "OnDelete", "rollingUpdate": {}}, ["spec.updateStrategy.rollingUpdate"]),
        ({"type": "Sometimes"}, ["spec.updateStrategy"]),
    ],
)
def test_daemon_set_update_strategies_are_checked_as_kube_checks_them(strategy: Obj, problems: list[str]) -> None:
    assert fields(validate_object("DaemonSet", "apps", daemon_set(strategy))) == problems


def test_a_daemon_set_template_must_restart_always_and_match_its_selector() -> None:
    body = daemon_set({"type": "OnDelete"})
    body["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
    body["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    assert fields(validate_object("DaemonSet", "apps", body)) == [
        "spec.template.metadata.labels",
        "spec.template.spec.restartPolicy",
    ]


def test_controller_revisions_need_data_and_a_non_negative_revision() -> None:
    good = {"metadata": {"name": "a-1"}, "data": {"spec": {}}, "revision": 0}
    assert validate_object("ControllerRevision", "apps", good) == []
    assert fields(validate_object("ControllerRevision", "apps", {"metadata": {"name": "a-1"}})) == ["data", "revision"]
    bad = {**good, "revision": -1}
    assert fields(validate_object("ControllerRevision", "apps", bad)) == ["revision"]


def test_priority_class_names_starting_system_are_reserved_and_user_values_capped() -> None:
    for builtin in builtin_classes():
        assert validate_object("PriorityClass", "scheduling.k8s.io", builtin) == []
    forged = {"metadata": {"name": "system-node-critical"}, "value": 5}
    [(path, message)] = validate_object("PriorityClass", "scheduling.k8s.io", forged)
    assert path == "metadata.name"
    assert "reserved for system use only" in message and "must be 2000001000" in message
    invented = {"metadata": {"name": "system-mine"}, "value": 5}
    assert (
        "is not a known system priority class" in validate_object("PriorityClass", "scheduling.k8s.io", invented)[0][1]
    )
    greedy = {"metadata": {"name": "greedy"}, "value": 1000000001}
    assert fields(validate_object("PriorityClass", "scheduling.k8s.io", greedy)) == ["value"]
    odd = {"metadata": {"name": "odd"}, "value": 1, "preemptionPolicy": "Sometimes", "globalDefault": "yes"}
    assert fields(validate_object("PriorityClass", "scheduling.k8s.io", odd)) == ["globalDefault", "preemptionPolicy"]
    assert fields(validate_object("PriorityClass", "scheduling.k8s.io", {"metadata": {"name": "x"}})) == ["value"]


def test_a_disruption_budget_takes_min_available_or_max_unavailable_not_both() -> None:
    def pdb(**spec: Any) -> Obj:
        return {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"selector": {"matchLabels": {"a": "b"}}, **spec}}

    assert validate_object("PodDisruptionBudget", "policy", pdb(minAvailable="50%")) == []
    assert validate_object("PodDisruptionBudget", "policy", pdb(maxUnavailable=1)) == []
    assert fields(validate_object("PodDisruptionBudget", "policy", pdb(minAvailable=1, maxUnavailable=1))) == [
        "spec.minAvailable"
    ]
    assert fields(validate_object("PodDisruptionBudget", "policy", pdb(minAvailable="101%"))) == ["spec.minAvailable"]


def test_tolerations_affinity_and_taints_are_checked() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "containers": CONTAINERS,
            "tolerations": [
                {"operator": "Exists"},
                {"key": "k", "operator": "Exists", "value": "v"},
                {"operator": "Equal", "value": "v"},
                {"key": "k", "effect": "Sometimes"},
                {"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5},
            ],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [{"key": "zone", "operator": "Near"}],
                                "matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["x"]}],
                            }
                        ]
                    }
                }
            },
        },
    }
    assert fields(validate_object("Pod", "", pod)) == [
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]."
        "matchExpressions[0].operator",
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]."
        "matchFields[0].key",
        "spec.tolerations[1].operator",
        "spec.tolerations[2].operator",
        "spec.tolerations[3].effect",
        "spec.tolerations[4].effect",
    ]
    node = {
        "metadata": {"name": "n"},
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}, {"key": "k", "effect": "NoSchedule"}, {"key": "j"}]},
    }
    assert fields(validate_object("Node", "", node)) == ["spec.taints[1]", "spec.taints[2].effect"]


@given(tolerations=json_values(), affinity=json_values(), taints=json_values())
def test_placement_fields_never_make_validation_raise(tolerations: Any, affinity: Any, taints: Any) -> None:
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": CONTAINERS, "tolerations": tolerations, "affinity": affinity},
    }
    validate_object("Pod", "", pod)
    validate_object("Node", "", {"metadata": {"name": "n"}, "spec": {"taints": taints}})


@given(value=st.one_of(st.integers(), st.text(max_size=6), st.none(), st.booleans(), st.floats()))
def test_int_or_percent_fields_never_raise(value: Any) -> None:
    validate_object("DaemonSet", "apps", daemon_set({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": value}}))
    validate_object("PodDisruptionBudget", "policy", {"metadata": {"name": "p"}, "spec": {"minAvailable": value}})


# -- Priority admission -----------------------------------------------------------------------------------------
def pod(**spec: Any) -> Obj:
    return {"metadata": {"name": "web"}, "spec": {"containers": CONTAINERS, **spec}}


def test_a_pod_gets_its_class_priority_or_the_global_default_or_zero() -> None:
    classes = [*builtin_classes(), {"metadata": {"name": "low"}, "value": -5, "preemptionPolicy": "Never"}]
    critical = pod(priorityClassName="system-node-critical")
    admit_pod(critical, classes)
    assert (critical["spec"]["priority"], critical["spec"]["preemptionPolicy"]) == (2000001000, "PreemptLowerPriority")
    plain = pod()
    admit_pod(plain, classes)
    assert (plain["spec"]["priority"], "priorityClassName" in plain["spec"]) == (0, False)
    classes.append({"metadata": {"name": "default"}, "value": 7, "globalDefault": True})
    defaulted = pod()
    admit_pod(defaulted, classes)
    assert (defaulted["spec"]["priority"], defaulted["spec"]["priorityClassName"]) == (7, "default")
    low = pod(priorityClassName="low")
    admit_pod(low, classes)
    assert (low["spec"]["priority"], low["spec"]["preemptionPolicy"]) == (-5, "Never")


def test_a_pod_cannot_name_a_missing_class_or_choose_its_own_priority() -> None:
    with pytest.raises(ApiError) as missing:
        admit_pod(pod(priorityClassName="gold"), builtin_classes())
    assert (missing.value.code, missing.value.message) == (
        403,
        'pods "web" is forbidden: no PriorityClass with name gold was found',
    )
    with pytest.raises(ApiError) as forged:
        admit_pod(pod(priority=2000001000), builtin_classes())
    assert "must not be provided in pod spec; priority admission controller computed 0" in forged.value.message
    with pytest.raises(ApiError):
        admit_pod(pod(priorityClassName="system-node-critical", preemptionPolicy="Never"), builtin_classes())
