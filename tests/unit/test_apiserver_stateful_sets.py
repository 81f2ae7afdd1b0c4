"""StatefulSets in the embedded API server, without HTTP: kube's defaults, the validation rules and their field
paths, which spec fields an update may change, the ``kubectl get sts`` row; and that no spec, however malformed,
makes any of them raise anything but a 422."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.apiserver.defaults import apply_defaults
from ambit.apiserver.errors import ApiError
from ambit.apiserver.printers import PRINTERS
from ambit.apiserver.registry import Registry
from ambit.apiserver.strategies import StatefulSetStrategy, StrategyContext
from ambit.apiserver.validation import validate_object

Obj = dict[str, Any]


def stateful_set(**spec: Any) -> Obj:
    labels = {"app": "db"}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "db", "image": "db:1"}]}},
            **spec,
        },
    }


def template(name: str) -> Obj:
    """A claim template that passes a claim's rules."""
    spec = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    return {"metadata": {"name": name}, "spec": spec}


def fields(obj: Obj) -> list[str]:
    return [field for field, _ in validate_object("StatefulSet", "apps", obj)]


def test_the_server_fills_in_kubes_defaults() -> None:
    obj = stateful_set(volumeClaimTemplates=[{"metadata": {"name": "data"}, "spec": {}}])
    apply_defaults("apps", "StatefulSet", obj)
    spec = obj["spec"]
    assert spec["replicas"] == 1
    assert spec["podManagementPolicy"] == "OrderedReady"
    assert spec["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
    assert spec["revisionHistoryLimit"] == 10
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    assert "minReadySeconds" not in spec  # 0, which kube's JSON leaves out
    assert spec["template"]["spec"]["restartPolicy"] == "Always"
    assert spec["volumeClaimTemplates"][0] == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "spec": {"volumeMode": "Filesystem"},
        "status": {"phase": "Pending"},
    }
    assert obj["status"] == {}


def test_on_delete_gets_no_rolling_update_and_given_values_stay() -> None:
    obj = stateful_set(updateStrategy={"type": "OnDelete"}, replicas=0, podManagementPolicy="Parallel")
    apply_defaults("apps", "StatefulSet", obj)
    assert obj["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert (obj["spec"]["replicas"], obj["spec"]["podManagementPolicy"]) == (0, "Parallel")
    partitioned = stateful_set(updateStrategy={"rollingUpdate": {"partition": 2}})
    apply_defaults("apps", "StatefulSet", partitioned)
    assert partitioned["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"serviceName": ""},
        {"serviceName": "db", "replicas": 0, "podManagementPolicy": "Parallel"},
        {"updateStrategy": {"type": "OnDelete"}},
        {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 3, "maxUnavailable": "50%"}}},
        {"ordinals": {"start": 4}, "minReadySeconds": 5, "revisionHistoryLimit": 0},
        {"persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"}},
        {"volumeClaimTemplates": [template("data"), template("logs")]},
    ],
)
def test_well_formed_stateful_sets_pass(spec: Obj) -> None:
    assert fields(stateful_set(**spec)) == []


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"replicas": -1}, ["spec.replicas"]),
        ({"selector": {"matchLabels": {"app": "web"}}}, ["spec.template.metadata.labels"]),
        ({"selector": {}}, ["spec.selector"]),
        ({"serviceName": "Db_1"}, ["spec.serviceName"]),
        ({"serviceName": 7}, ["spec.serviceName"]),
        ({"podManagementPolicy": "Random"}, ["spec.podManagementPolicy"]),
        ({"updateStrategy": {"type": "Recreate"}}, ["spec.updateStrategy"]),
        ({"updateStrategy": {"type": "OnDelete", "rollingUpdate": {}}}, ["spec.updateStrategy.rollingUpdate"]),
        ({"updateStrategy": {"rollingUpdate": {"partition": -1}}}, ["spec.updateStrategy.rollingUpdate.partition"]),
        (
            {"updateStrategy": {"rollingUpdate": {"maxUnavailable": 0}}},
            ["spec.updateStrategy.rollingUpdate.maxUnavailable"],
        ),
        (
            {"updateStrategy": {"rollingUpdate": {"maxUnavailable": "150%"}}},
            ["spec.updateStrategy.rollingUpdate.maxUnavailable"],
        ),
        ({"updateStrategy": "fast"}, ["spec.updateStrategy"]),
        ({"minReadySeconds": -1, "revisionHistoryLimit": -2}, ["spec.minReadySeconds", "spec.revisionHistoryLimit"]),
        ({"ordinals": {"start": -1}}, ["spec.ordinals.start"]),
        ({"ordinals": 3}, ["spec.ordinals"]),
        (
            {"persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Keep"}},
            ["spec.persistentVolumeClaimRetentionPolicy.whenDeleted"],
        ),
        (
            {"volumeClaimTemplates": [template("a"), template("a"), {"spec": template("b")["spec"]}, 5]},
            [
                "spec.volumeClaimTemplates[1].metadata.name",
                "spec.volumeClaimTemplates[3]",
                "spec.volumeClaimTemplates[2].metadata.name",
            ],
        ),
        (
            {"volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]},
            ["spec.volumeClaimTemplates[0].spec.resources[storage]"],
        ),
    ],
)
def test_malformed_stateful_sets_are_refused_naming_each_field(spec: Obj, expected: list[str]) -> None:
    assert sorted(fields(stateful_set(**spec))) == sorted(expected)


def test_the_workload_rules_apply_to_stateful_sets_too() -> None:
    obj = stateful_set()
    obj["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    assert fields(obj) == ["spec.template.spec.restartPolicy"]
    assert fields({"metadata": {"name": "db"}, "spec": {}}) == ["spec.selector", "spec.template"]


def _strategy() -> StatefulSetStrategy:
    def commit(*_: Any) -> None:
        raise AssertionError("nothing is stored")

    return StatefulSetStrategy(StrategyContext(None, Registry(), None, lambda: 0.0, commit))  # type: ignore[arg-type]


def _rtype() -> Any:
    found = Registry().find("apps", "statefulsets")
    assert found is not None
    return found


@pytest.mark.parametrize(
    "change",
    [
        {"replicas": 4},
        {"ordinals": {"start": 2}},
        {"template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "db", "image": "2"}]}}},
        {"updateStrategy": {"type": "OnDelete"}},
        {"revisionHistoryLimit": 3},
        {"persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Delete"}},
        {"minReadySeconds": 9},
    ],
)
def test_an_update_may_change_the_mutable_fields(change: Obj) -> None:
    old = stateful_set()
    apply_defaults("apps", "StatefulSet", old)
    new = copy.deepcopy(old)
    new["spec"].update(change)
    _strategy().derive(_rtype(), old, new)


@pytest.mark.parametrize(
    "change",
    [
        {"serviceName": "other"},
        {"selector": {"matchLabels": {"app": "db", "tier": "x"}}},
        {"podManagementPolicy": "Parallel"},
        {"volumeClaimTemplates": [{"metadata": {"name": "data"}}]},
    ],
)
def test_an_update_may_not_change_the_other_fields(change: Obj) -> None:
    old = stateful_set()
    apply_defaults("apps", "StatefulSet", old)
    new = copy.deepcopy(old)
    new["spec"].update(change)
    with pytest.raises(ApiError) as caught:
        _strategy().derive(_rtype(), old, new)
    assert caught.value.code == 422
    assert "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template'" in str(
        caught.value.message
    )


def test_the_printed_row_shows_ready_out_of_desired() -> None:
    printer = PRINTERS[("apps", "StatefulSet")]
    obj = stateful_set(replicas=3)
    obj["status"] = {"readyReplicas": 2}
    assert [c.name for c in printer.columns] == ["Name", "Ready", "Age", "Containers", "Images"]
    assert printer.cells(obj, 0.0)[:2] == ["db", "2/3"]
    assert printer.cells(stateful_set(), 0.0)[1] == "0/1"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
SPEC_KEYS = (
    "replicas",
    "serviceName",
    "podManagementPolicy",
    "updateStrategy",
    "ordinals",
    "minReadySeconds",
    "revisionHistoryLimit",
    "persistentVolumeClaimRetentionPolicy",
    "volumeClaimTemplates",
    "selector",
    "template",
)


@settings(max_examples=300)
@given(
    values=st.dictionaries(st.sampled_from(SPEC_KEYS), JSON, max_size=5),
    nested=st.dictionaries(st.sampled_from(["type", "rollingUpdate", "partition", "start", "metadata"]), JSON),
)
def test_no_spec_makes_defaults_validation_or_the_update_rule_raise(values: Obj, nested: Obj) -> None:
    obj = stateful_set(**values)
    for key in ("updateStrategy", "ordinals"):
        if key not in values:
            obj["spec"][key] = dict(nested)
    apply_defaults("apps", "StatefulSet", obj)
    validate_object("StatefulSet", "apps", obj)
    old = stateful_set()
    apply_defaults("apps", "StatefulSet", old)
    try:
        _strategy().derive(_rtype(), old, obj)
    except ApiError as refused:
        assert refused.code == 422
