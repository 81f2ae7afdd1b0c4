from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.apiserver.errors import ApiError
from ambit.apiserver.patch import (
    MERGE_BY_VALUE,
    MergeKeys,
    json_merge_patch,
    json_patch,
    merge_keys_for,
    strategic_merge_patch,
)


def _canon(value: Any) -> str:
    """Strict JSON identity: key order ignored, but true is not 1 and 1 is not 1.0."""
    return json.dumps(value, sort_keys=True)


def _containers(value: Any) -> Iterator[int]:
    if isinstance(value, dict | list):
        yield id(value)
        for child in value.values() if isinstance(value, dict) else value:
            yield from _containers(child)


# ---------------------------------------------------------------------------------------------- RFC 7386


@pytest.mark.parametrize(
    ("target", "patch", "expected"),
    [
        ({"x": 1}, {"x": 2}, {"x": 2}),
        ({"x": 1}, {"y": 2}, {"x": 1, "y": 2}),
        ({"x": 1, "y": 2}, {"x": None}, {"y": 2}),
        ({"x": [1, 2]}, {"x": [3]}, {"x": [3]}),
        ({"x": {"y": 1, "z": 2}}, {"x": {"z": None, "w": 3}}, {"x": {"y": 1, "w": 3}}),
        ({"x": "scalar"}, {"x": {"y": None, "z": 1}}, {"x": {"z": 1}}),
        ([1, 2], {"x": 1}, {"x": 1}),
        ({"x": 1}, ["a"], ["a"]),
        ({"x": 1}, "text", "text"),
        ({}, {"x": {"y": {"z": None}}}, {"x": {"y": {}}}),
        ({"x": 1}, {"y": [{"a": None}]}, {"x": 1, "y": [{"a": None}]}),
        ({"x": 1}, {}, {"x": 1}),
        (None, {"x": None}, {}),
    ],
)
def test_json_merge_patch_follows_rfc_7386(target: Any, patch: Any, expected: Any) -> None:
    assert _canon(json_merge_patch(target, patch)) == _canon(expected)


def test_json_merge_patch_keeps_the_order_of_existing_keys() -> None:
    result = json_merge_patch({"a": 1, "b": 2, "c": 3}, {"a": 9, "d": 4})
    assert list(result) == ["a", "b", "c", "d"]


# ---------------------------------------------------------------------------------------------- RFC 6902

DOC: dict[str, Any] = {"name": "web", "tags": ["a", "b"], "spec": {"replicas": 1, "a/b": 2, "m~n": 3}}


@pytest.mark.parametrize(
    ("operations", "expected"),
    [
        ([{"op": "add", "path": "/owner", "value": "me"}], {**DOC, "owner": "me"}),
        ([{"op": "add", "path": "/tags/1", "value": "x"}], {**DOC, "tags": ["a", "x", "b"]}),
        ([{"op": "add", "path": "/tags/-", "value": "c"}], {**DOC, "tags": ["a", "b", "c"]}),
        ([{"op": "add", "path": "/tags/2", "value": "c"}], {**DOC, "tags": ["a", "b", "c"]}),
        ([{"op": "add", "path": "/name", "value": None}], {**DOC, "name": None}),
        ([{"op": "add", "path": "", "value": [1]}], [1]),
        ([{"op": "remove", "path": "/tags/0"}], {**DOC, "tags": ["b"]}),
        ([{"op": "remove", "path": "/spec/a~1b"}], {**DOC, "spec": {"replicas": 1, "m~n": 3}}),
        ([{"op": "replace", "path": "/spec/m~0n", "value": 4}], {**DOC, "spec": {**DOC["spec"], "m~n": 4}}),
        ([{"op": "replace", "path": "/tags/1", "value": "z"}], {**DOC, "tags": ["a", "z"]}),
        ([{"op": "replace", "path": "", "value": {}}], {}),
        (
            [{"op": "move", "from": "/name", "path": "/title"}],
            {k: v for k, v in DOC.items() if k != "name"} | {"title": "web"},
        ),
        ([{"op": "move", "from": "/tags/0", "path": "/tags/1"}], {**DOC, "tags": ["b", "a"]}),
        ([{"op": "move", "from": "/name", "path": "/name"}], DOC),
        ([{"op": "copy", "from": "/tags", "path": "/spec/tags"}], {**DOC, "spec": {**DOC["spec"], "tags": ["a", "b"]}}),
        ([{"op": "test", "path": "/spec/replicas", "value": 1.0}], DOC),
        ([{"op": "test", "path": "/tags", "value": ["a", "b"]}], DOC),
        ([{"op": "test", "path": "", "value": DOC}], DOC),
        ([], DOC),
        ([{"op": "add", "path": "/x", "value": 1, "extra": "ignored"}], {**DOC, "x": 1}),
    ],
)
def test_json_patch_follows_rfc_6902(operations: list[Any], expected: Any) -> None:
    assert _canon(json_patch(DOC, operations)) == _canon(expected)


def test_json_patch_operations_apply_in_sequence() -> None:
    ops = [
        {"op": "add", "path": "/list", "value": []},
        {"op": "add", "path": "/list/-", "value": {"k": 1}},
        {"op": "copy", "from": "/list/0", "path": "/list/-"},
        {"op": "replace", "path": "/list/1/k", "value": 2},
        {"op": "test", "path": "/list/0/k", "value": 1},
    ]
    assert json_patch({}, ops) == {"list": [{"k": 1}, {"k": 2}]}


@pytest.mark.parametrize(
    ("operations", "fragment"),
    [
        ({"op": "add"}, "must be an array"),
        (["add"], "operation 0 must be an object"),
        ([{"op": "frobnicate", "path": "/a"}], "unknown op 'frobnicate'"),
        ([{"path": "/a"}], "unknown op None"),
        ([{"op": "add", "path": "/a"}], "has no 'value'"),
        ([{"op": "test", "path": "/a"}], "has no 'value'"),
        ([{"op": "remove"}], "'path' must be a string"),
        ([{"op": "remove", "path": "a"}], "not a valid JSON pointer"),
        ([{"op": "remove", "path": "/a~2"}], "not a valid JSON pointer"),
        ([{"op": "move", "path": "/a"}], "'from' must be a string"),
        # Shape is checked for every operation before any applies, so a later 400 beats an earlier 422.
        ([{"op": "remove", "path": "/nope"}, {"op": "bogus"}], "unknown op 'bogus'"),
    ],
)
def test_malformed_json_patch_is_a_bad_request(operations: Any, fragment: str) -> None:
    with pytest.raises(ApiError) as caught:
        json_patch(DOC, operations)
    assert caught.value.code == 400
    assert fragment in caught.value.message


@pytest.mark.parametrize(
    ("operation", "fragment"),
    [
        ({"op": "test", "path": "/name", "value": "db"}, "test failed"),
        ({"op": "test", "path": "/spec/replicas", "value": True}, "test failed"),
        ({"op": "remove", "path": "/nope"}, "'/nope' does not exist"),
        ({"op": "replace", "path": "/nope", "value": 1}, "'/nope' does not exist"),
        ({"op": "add", "path": "/nope/deeper", "value": 1}, "'/nope' does not exist"),
        ({"op": "add", "path": "/name/x", "value": 1}, "/name is not an object or an array"),
        ({"op": "add", "path": "/tags/3", "value": 1}, "'3' is not a valid index"),
        ({"op": "add", "path": "/tags/01", "value": 1}, "'01' is not a valid index"),
        ({"op": "remove", "path": "/tags/-"}, "'-' is not a valid index"),
        ({"op": "replace", "path": "/tags/2", "value": 1}, "'2' is not a valid index"),
        ({"op": "add", "path": "/tags/" + "9" * 5000, "value": 1}, "is not a valid index"),
        ({"op": "remove", "path": ""}, "cannot remove the whole document"),
        ({"op": "move", "from": "/spec", "path": "/spec/inner"}, "into one of its own children"),
        ({"op": "copy", "from": "/nope", "path": "/x"}, "'/nope' does not exist"),
    ],
)
def test_json_patch_that_cannot_apply_is_unprocessable(operation: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ApiError) as caught:
        json_patch(DOC, [operation])
    assert caught.value.code == 422
    assert fragment in caught.value.message


# ---------------------------------------------------------------------------------------------- strategic

POD_KEYS = merge_keys_for("", "Pod")
DEPLOYMENT_KEYS = merge_keys_for("apps", "Deployment")


def _pod(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "labels": {"app": "web", "tier": "front"}, "finalizers": ["a.io/x"]},
        "spec": {
            "containers": [
                {
                    "name": "a",
                    "image": "a:1",
                    "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}],
                    "ports": [{"containerPort": 80, "protocol": "TCP"}],
                },
                {"name": "b", "image": "b:1"},
            ],
            "tolerations": [{"key": "k1", "operator": "Exists"}],
            **spec,
        },
    }


def test_apply_patch_with_element_order_merges_and_orders_containers() -> None:
    patch = {
        "spec": {
            "$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
            "containers": [{"name": "b", "image": "x"}],
        }
    }
    result = strategic_merge_patch(_pod(), patch, POD_KEYS)
    assert [c["name"] for c in result["spec"]["containers"]] == ["b", "a"]
    assert result["spec"]["containers"][0] == {"name": "b", "image": "x"}
    assert result["spec"]["containers"][1]["env"] == _pod()["spec"]["containers"][0]["env"]


def test_element_order_puts_unnamed_items_last_in_their_relative_order() -> None:
    pod = _pod()
    pod["spec"]["containers"].append({"name": "c", "image": "c:1"})
    patch = {"spec": {"$setElementOrder/containers": [{"name": "new"}, {"name": "b"}], "containers": [{"name": "new"}]}}
    result = strategic_merge_patch(pod, patch, POD_KEYS)
    assert [c["name"] for c in result["spec"]["containers"]] == ["new", "b", "a", "c"]


def test_new_list_items_are_appended_and_existing_items_keep_their_place() -> None:
    patch = {"spec": {"containers": [{"name": "z", "image": "z:1"}, {"name": "a", "image": "a:2"}]}}
    result = strategic_merge_patch(_pod(), patch, POD_KEYS)
    assert [(c["name"], c["image"]) for c in result["spec"]["containers"]] == [("a", "a:2"), ("b", "b:1"), ("z", "z:1")]


def test_patch_delete_directive_removes_the_item_with_that_merge_key() -> None:
    patch = {"spec": {"containers": [{"name": "b", "$patch": "delete"}]}}
    result = strategic_merge_patch(_pod(), patch, POD_KEYS)
    assert [c["name"] for c in result["spec"]["containers"]] == ["a"]


def test_env_merges_by_name_and_null_removes_a_field_inside_an_item() -> None:
    patch = {
        "spec": {
            "containers": [
                {
                    "name": "a",
                    "env": [
                        {"name": "Y", "value": "two"},
                        {"name": "Z", "value": "3"},
                        {"name": "X", "$patch": "delete"},
                    ],
                    "ports": [{"containerPort": 80, "protocol": None, "name": "http"}],
                }
            ]
        }
    }
    container = strategic_merge_patch(_pod(), patch, POD_KEYS)["spec"]["containers"][0]
    assert container["env"] == [{"name": "Y", "value": "two"}, {"name": "Z", "value": "3"}]
    assert container["ports"] == [{"containerPort": 80, "name": "http"}]


def test_labels_null_deletes_and_finalizers_take_the_union() -> None:
    patch = {"metadata": {"labels": {"tier": None, "new": "1"}, "finalizers": ["b.io/y", "a.io/x"]}}
    meta = strategic_merge_patch(_pod(), patch, POD_KEYS)["metadata"]
    assert meta["labels"] == {"app": "web", "new": "1"}
    assert meta["finalizers"] == ["a.io/x", "b.io/y"]


def test_delete_from_primitive_list_removes_values_before_the_union() -> None:
    pod = _pod()
    pod["metadata"]["finalizers"] = ["a.io/x", "b.io/y", "c.io/z"]
    patch = {
        "metadata": {
            "$deleteFromPrimitiveList/finalizers": ["b.io/y", "not-there"],
            "$setElementOrder/finalizers": ["c.io/z", "d.io/w", "a.io/x"],
            "finalizers": ["d.io/w"],
        }
    }
    meta = strategic_merge_patch(pod, patch, POD_KEYS)["metadata"]
    assert meta["finalizers"] == ["c.io/z", "d.io/w", "a.io/x"]
    assert not any(k.startswith("$") for k in meta)


def test_lists_without_a_merge_key_are_replaced() -> None:
    patch = {"spec": {"tolerations": [{"key": "k2", "operator": "Exists"}]}}
    result = strategic_merge_patch(_pod(), patch, POD_KEYS)
    assert result["spec"]["tolerations"] == [{"key": "k2", "operator": "Exists"}]


def test_patch_replace_item_replaces_a_whole_merged_list() -> None:
    patch = {"spec": {"containers": [{"name": "only", "image": "o:1"}, {"$patch": "replace"}]}}
    result = strategic_merge_patch(_pod(), patch, POD_KEYS)
    assert result["spec"]["containers"] == [{"name": "only", "image": "o:1"}]


def test_patch_replace_in_a_map_replaces_the_map() -> None:
    patch = {"metadata": {"labels": {"$patch": "replace", "only": "1", "gone": None}}}
    assert strategic_merge_patch(_pod(), patch, POD_KEYS)["metadata"]["labels"] == {"only": "1"}


def test_patch_delete_in_a_map_removes_the_map() -> None:
    patch = {"metadata": {"labels": {"$patch": "delete"}}}
    assert "labels" not in strategic_merge_patch(_pod(), patch, POD_KEYS)["metadata"]


def test_patch_delete_at_the_root_empties_the_object() -> None:
    assert strategic_merge_patch(_pod(), {"$patch": "delete"}, POD_KEYS) == {}


def test_strategic_patch_must_be_an_object() -> None:
    with pytest.raises(ApiError) as caught:
        strategic_merge_patch(_pod(), ["not", "a", "map"], POD_KEYS)  # type: ignore[arg-type]
    assert caught.value.code == 400


def test_retain_keys_drops_original_keys_it_does_not_name() -> None:
    deployment = {"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}}
    patch = {"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}
    assert strategic_merge_patch(deployment, patch, DEPLOYMENT_KEYS) == {"spec": {"strategy": {"type": "Recreate"}}}


def test_retain_keys_that_omit_a_patched_key_are_unprocessable() -> None:
    patch = {"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": {"maxSurge": 2}}}}
    with pytest.raises(ApiError) as caught:
        strategic_merge_patch({"spec": {}}, patch, DEPLOYMENT_KEYS)
    assert caught.value.code == 422


def test_pod_template_containers_merge_in_a_deployment() -> None:
    deployment = {"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "a:1"}, {"name": "b"}]}}}}
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "a:2"}]}}}}
    result = strategic_merge_patch(deployment, patch, DEPLOYMENT_KEYS)
    assert result["spec"]["template"]["spec"]["containers"] == [{"name": "a", "image": "a:2"}, {"name": "b"}]


def test_directives_in_new_values_never_reach_the_result() -> None:
    patch = {
        "spec": {
            "initContainers": [{"name": "i", "$patch": "replace", "env": [{"name": "E", "$patch": "delete"}]}],
            "volumes": [{"$patch": "replace"}],
            "extra": {"$patch": "replace", "k": {"$retainKeys": ["x"], "x": 1}},
        }
    }
    result = strategic_merge_patch({"spec": {}}, patch, POD_KEYS)
    assert result == {"spec": {"initContainers": [{"name": "i", "env": []}], "volumes": [], "extra": {"k": {"x": 1}}}}
    assert "$" not in json.dumps(result)


@pytest.mark.parametrize(
    "patch",
    [
        {"spec": {"containers": [{"image": "no-name"}]}},
        {"spec": {"containers": ["a"]}},
        {"spec": {"tolerations": [{"key": "k1", "$patch": "delete"}]}},
        {"metadata": {"finalizers": [{"x": 1}]}},
        {"metadata": {"$patch": "explode"}},
        {"metadata": {"$unknown": 1}},
        {"metadata": {"$retainKeys": "name"}},
        {"metadata": {"$retainKeys": [1]}},
        {"metadata": {"$setElementOrder/finalizers": "a"}},
        {"metadata": {"$deleteFromPrimitiveList/finalizers": "a"}},
    ],
)
def test_malformed_strategic_patch_is_a_bad_request(patch: dict[str, Any]) -> None:
    with pytest.raises(ApiError) as caught:
        strategic_merge_patch(_pod(), patch, POD_KEYS)
    assert caught.value.code == 400


def test_merge_key_table_covers_the_built_in_kinds() -> None:
    assert POD_KEYS[("spec", "containers", "volumeMounts")] == "mountPath"
    assert POD_KEYS[("spec", "initContainers", "ports")] == "containerPort"
    assert POD_KEYS[("metadata", "finalizers")] == MERGE_BY_VALUE
    assert ("spec", "tolerations") not in POD_KEYS
    assert DEPLOYMENT_KEYS[("spec", "template", "spec", "containers", "env")] == "name"
    assert merge_keys_for("apps", "DaemonSet")[("status", "conditions")] == "type"
    assert merge_keys_for("", "Service")[("spec", "ports")] == "port"
    assert merge_keys_for("", "Node")[("status", "addresses")] == "type"
    assert merge_keys_for("", "ServiceAccount")[("secrets",)] == "name"
    assert ("endpoints",) not in merge_keys_for("discovery.k8s.io", "EndpointSlice")
    assert merge_keys_for("", "ConfigMap")[("metadata", "ownerReferences")] == "uid"
    assert merge_keys_for("example.com", "Widget") == {}
    assert merge_keys_for("apps", "Pod") == {}


# ---------------------------------------------------------------------------------------------- properties

_keys = st.text(alphabet="abcdxyz/~-", min_size=1, max_size=3)
_plain_scalars = (
    st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=3)
)
_docs = st.recursive(
    _plain_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_keys, children, max_size=4),
    max_leaves=15,
)
_objects = st.dictionaries(_keys, _docs, max_size=4)
_any_json = st.recursive(
    st.none() | _plain_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=12,
)


def _merge_diff(source: Any, target: Any) -> Any:
    """The merge patch that turns ``source`` into ``target`` (which holds no nulls)."""
    if not (isinstance(source, dict) and isinstance(target, dict)):
        return target
    patch: dict[str, Any] = {key: None for key in source if key not in target}
    for key, value in target.items():
        if key not in source or _canon(source[key]) != _canon(value):
            patch[key] = _merge_diff(source.get(key), value)
    return patch


@given(_docs, _docs)
def test_merge_patch_from_a_diff_yields_the_target(source: Any, target: Any) -> None:
    assert _canon(json_merge_patch(source, _merge_diff(source, target))) == _canon(target)


@given(_objects, _objects)
def test_strategic_patch_without_merge_keys_behaves_like_merge_patch(source: Any, target: Any) -> None:
    assert _canon(strategic_merge_patch(source, _merge_diff(source, target), {})) == _canon(target)


_POINTERS = st.lists(st.sampled_from(["a", "b", "0", "1", "-", "~0", "~1", "x~1y", "01", ""]), max_size=3).map(
    lambda parts: "".join("/" + p for p in parts)
)
_operations = st.lists(
    st.fixed_dictionaries(
        {"op": st.sampled_from(["add", "remove", "replace", "move", "copy", "test", "nope"])},
        optional={"path": _POINTERS | _any_json, "from": _POINTERS, "value": _any_json},
    )
    | _any_json,
    max_size=4,
)
_SMP_KEYS: MergeKeys = {("items",): "name", ("items", "sub"): "id", ("tags",): MERGE_BY_VALUE}
_SMP_DIRECTIVES = ["$patch", "$retainKeys", "$setElementOrder/items", "$setElementOrder/tags"]
_SMP_DIRECTIVES += ["$deleteFromPrimitiveList/tags", "$bogus"]
_smp_field = st.sampled_from(["items", "tags", "sub", "name", "id", "x", *_SMP_DIRECTIVES])
_smp_values = st.recursive(
    st.none() | st.sampled_from(["a", "b", "replace", "delete", "merge", "items", "name"]) | st.integers(0, 2),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_smp_field, children, max_size=3),
    max_leaves=12,
)
_smp_patches = st.dictionaries(_smp_field, _smp_values, max_size=4)
_smp_target_fields = st.sampled_from(["items", "tags", "sub", "name", "id", "x"])
_smp_targets = st.dictionaries(
    _smp_target_fields,
    st.recursive(
        st.sampled_from(["a", "b"]) | st.integers(0, 2),
        lambda children: st.lists(children, max_size=3) | st.dictionaries(_smp_target_fields, children, max_size=3),
        max_leaves=12,
    ),
    max_size=4,
)


@given(_any_json, _operations)
def test_json_patch_of_garbage_raises_only_api_errors_and_mutates_nothing(doc: Any, operations: Any) -> None:
    before_doc, before_ops = copy.deepcopy(doc), copy.deepcopy(operations)
    try:
        result = json_patch(doc, operations)
    except ApiError as exc:
        assert exc.code in (400, 422)
    else:
        assert not set(_containers(result)) & (set(_containers(doc)) | set(_containers(operations)))
    assert _canon(doc) == _canon(before_doc)
    assert _canon(operations) == _canon(before_ops)


@given(_any_json, _any_json)
def test_merge_patch_never_mutates_or_aliases_its_inputs(target: Any, patch: Any) -> None:
    before_target, before_patch = copy.deepcopy(target), copy.deepcopy(patch)
    result = json_merge_patch(target, patch)
    assert _canon(target) == _canon(before_target)
    assert _canon(patch) == _canon(before_patch)
    assert not set(_containers(result)) & (set(_containers(target)) | set(_containers(patch)))


@given(_smp_targets, _smp_patches)
def test_strategic_patch_of_garbage_raises_only_api_errors_and_mutates_nothing(
    target: dict[str, Any], patch: dict[str, Any]
) -> None:
    before_target, before_patch = copy.deepcopy(target), copy.deepcopy(patch)
    try:
        result = strategic_merge_patch(target, patch, _SMP_KEYS)
    except ApiError as exc:
        assert exc.code in (400, 422)
    else:
        assert not set(_containers(result)) & (set(_containers(target)) | set(_containers(patch)))
        assert "$" not in json.dumps(result)
    assert _canon(target) == _canon(before_target)
    assert _canon(patch) == _canon(before_patch)
