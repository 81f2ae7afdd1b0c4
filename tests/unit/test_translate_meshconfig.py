"""The mesh config parser and its memory (:mod:`ambit.controlplane.translate.meshconfig`): the YAML a mesh
administrator writes into the ``istio`` ConfigMap's ``mesh`` key, as istiod reads it, and hostile or broken text."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.translate.meshconfig import (
    DEFAULT_MESH_CONFIG,
    MAX_MESH_BYTES,
    MAX_POLICIES,
    MeshConfig,
    MeshConfigError,
    MeshConfigMemo,
    MeshVisibility,
    mesh_config_of,
    parse_mesh_config,
)
from ambit.controlplane.translate.skips import Skipped

UPSTREAM_PATCH = """
serviceEntryVisibility:
  applyToSidecars: true
  defaultVisibility: NAMESPACE
  policies:
  - visibility: PUBLIC
    matchingRules:
    - namespaceSelector:
        matchLabels:
          se-visibility: public"""
"""The patch of Istio's TestServiceEntryVisibility, as it writes it."""

ISTIOD_DEFAULTS = """
accessLogFile: /dev/stdout
defaultConfig:
  discoveryAddress: istiod.istio-system.svc:15012
  proxyMetadata: {}
enablePrometheusMerge: true
rootNamespace: istio-system
trustDomain: cluster.local
"""
"""What the ``mesh`` key of a stock install holds: fields Ambit does not apply."""


def config_map(mesh: str | None, *, version: str = "1", namespace: str = "istio-system") -> dict[str, Any]:
    data = {} if mesh is None else {"mesh": mesh}
    meta = {"name": "istio", "namespace": namespace, "uid": "u-1", "resourceVersion": version}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def test_the_upstream_patch_makes_labelled_namespaces_public_and_the_rest_namespace_only() -> None:
    mesh = parse_mesh_config(ISTIOD_DEFAULTS + UPSTREAM_PATCH)
    sev = mesh.service_entry_visibility
    assert sev is not None and sev.apply_to_sidecars
    assert mesh.entry_visibility({"se-visibility": "public", "istio.io/dataplane-mode": "ambient"}) is (
        MeshVisibility.PUBLIC
    )
    assert mesh.entry_visibility({"se-visibility": "private"}) is MeshVisibility.NAMESPACE
    assert mesh.entry_visibility({}) is MeshVisibility.NAMESPACE


@pytest.mark.parametrize("text", ["", "   \n", "# only a comment\n", "{}", ISTIOD_DEFAULTS, "null"])
def test_a_mesh_without_the_fields_is_the_unset_default(text: str) -> None:
    mesh = parse_mesh_config(text)
    assert mesh == DEFAULT_MESH_CONFIG
    assert mesh.entry_visibility({"any": "thing"}) is None


def test_an_empty_service_entry_visibility_is_configured_and_public() -> None:
    mesh = parse_mesh_config("serviceEntryVisibility: {}")
    assert mesh.service_entry_visibility is not None
    assert mesh.entry_visibility({}) is MeshVisibility.PUBLIC


def test_policies_are_tried_in_order_and_all_rules_of_one_must_match() -> None:
    mesh = parse_mesh_config(
        """
service_entry_visibility:            # snake_case names are accepted too
  default_visibility: PUBLIC
  policies:
  - visibility: NONE
    matching_rules:
    - namespace_selector: {matchLabels: {tier: secret}}
    - namespaceSelector:
        matchExpressions:
        - {key: team, operator: In, values: [a, b]}
  - visibility: NAMESPACE
    matchingRules:
    - namespaceSelector: {matchExpressions: [{key: tier, operator: Exists}]}
  - visibility: PUBLIC
    matchingRules: []
"""
    )
    assert mesh.entry_visibility({"tier": "secret", "team": "a"}) is MeshVisibility.NONE
    assert mesh.entry_visibility({"tier": "secret", "team": "c"}) is MeshVisibility.NAMESPACE
    assert mesh.entry_visibility({"tier": "open"}) is MeshVisibility.NAMESPACE
    assert mesh.entry_visibility({}) is MeshVisibility.PUBLIC  # the catch-all policy


def test_a_rule_without_a_known_matcher_never_matches() -> None:
    mesh = parse_mesh_config(
        """
serviceEntryVisibility:
  defaultVisibility: NAMESPACE
  policies:
  - visibility: PUBLIC
    matchingRules:
    - hostnameSuffix: .example.com
"""
    )
    assert mesh.entry_visibility({}) is MeshVisibility.NAMESPACE


def test_unset_and_unspecified_visibilities_are_public() -> None:
    mesh = parse_mesh_config("serviceEntryVisibility:\n  defaultVisibility: UNSPECIFIED\n")
    assert mesh.entry_visibility({}) is MeshVisibility.PUBLIC


def test_default_export_to_fields_are_read() -> None:
    mesh = parse_mesh_config("defaultVirtualServiceExportTo: [a]\ndefault_destination_rule_export_to: ['.', b]\n")
    assert mesh.default_virtual_service_export_to == ("a",)
    assert mesh.default_destination_rule_export_to == (".", "b")
    assert mesh.default_service_export_to is None
    with pytest.raises(MeshConfigError, match="defaultDestinationRuleExportTo: expected a list of namespaces"):
        parse_mesh_config("defaultDestinationRuleExportTo: [1]")
    assert parse_mesh_config('defaultServiceExportTo: ["."]').default_service_export_to == (".",)
    assert parse_mesh_config("defaultServiceExportTo: []").default_service_export_to == ()
    assert parse_mesh_config("rootNamespace: x").default_service_export_to is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("serviceEntryVisibility: [1]", "serviceEntryVisibility: expected an object"),
        ("serviceEntryVisibility: {defaultVisibility: SECRET}", "defaultVisibility: 'SECRET' is not one of"),
        ("serviceEntryVisibility: {policies: {a: 1}}", "serviceEntryVisibility.policies: expected a list"),
        ("serviceEntryVisibility: {applyToSidecars: maybe}", "applyToSidecars: expected true or false"),
        (
            "serviceEntryVisibility: {policies: [{visibility: PUBLIC, matchingRules: "
            "[{namespaceSelector: {matchLabels: [x]}}]}]}",
            "policies[0].matchingRules[0].namespaceSelector: expected a label selector",
        ),
        (
            "serviceEntryVisibility: {policies: [{matchingRules: [{namespaceSelector: {matchLabels: {on: true}}}]}]}",
            "label keys and values must be strings",
        ),
        (
            "serviceEntryVisibility: {policies: [{matchingRules: [{namespaceSelector: {matchExpressions: "
            "[{key: a, operator: Like}]}}]}]}",
            "expected a label selector",
        ),
        ("serviceEntryVisibility: {policies: [7]}", "policies[0]: expected an object"),
        ("defaultServiceExportTo: '*'", "defaultServiceExportTo: expected a list of namespaces"),
        ("- a\n- b\n", "expected a YAML object (MeshConfig fields), not list"),
        ("a: [1, 2\n", "not YAML at line 2, column 1"),
        ("a: &x [1]\nb: *x\n", "YAML aliases are not allowed"),
    ],
)
def test_bad_input_is_one_clear_line(text: str, message: str) -> None:
    with pytest.raises(MeshConfigError) as caught:
        parse_mesh_config(text)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_billion_laughs_text_is_refused_before_it_is_expanded() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 12)]
    text = "\n".join(lines) + "\nserviceEntryVisibility: {policies: *a11}\n"
    with pytest.raises(MeshConfigError, match="aliases are not allowed"):
        parse_mesh_config(text)


def test_a_text_over_the_api_servers_object_size_is_refused_unread() -> None:
    with pytest.raises(MeshConfigError, match=f"larger than {MAX_MESH_BYTES} bytes"):
        parse_mesh_config("#" * (MAX_MESH_BYTES + 1))


def test_too_many_policies_or_requirements_are_refused() -> None:
    policies = [{"visibility": "PUBLIC"} for _ in range(MAX_POLICIES + 1)]
    with pytest.raises(MeshConfigError, match="at most 1000"):
        parse_mesh_config(yaml.safe_dump({"serviceEntryVisibility": {"policies": policies}}))
    labels = {f"k{i}": "v" for i in range(200)}
    rules = [{"namespaceSelector": {"matchLabels": dict(labels)}} for _ in range(60)]
    text = yaml.safe_dump({"serviceEntryVisibility": {"policies": [{"matchingRules": rules}]}})
    assert len(text) < MAX_MESH_BYTES
    with pytest.raises(MeshConfigError, match="more than 10000 label requirements"):
        parse_mesh_config(text)


def test_deeply_nested_yaml_is_an_error_not_a_traceback() -> None:
    depth = 200_000
    with pytest.raises(MeshConfigError, match="not YAML"):
        parse_mesh_config("a: " + "[" * depth + "]" * depth)


@given(st.text(max_size=400))
@settings(max_examples=300, deadline=None)
def test_any_text_gives_a_config_or_a_mesh_config_error(text: str) -> None:
    try:
        assert isinstance(parse_mesh_config(text), MeshConfig)
    except MeshConfigError as exc:
        assert str(exc)


_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.sampled_from(["PUBLIC", "NAMESPACE"])
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "matchLabels",
                    "matchExpressions",
                    "key",
                    "operator",
                    "values",
                    "visibility",
                    "matchingRules",
                    "namespaceSelector",
                    "policies",
                    "defaultVisibility",
                    "In",
                    "x",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@given(st.dictionaries(st.sampled_from(["serviceEntryVisibility", "defaultServiceExportTo", "other"]), _values))
@settings(max_examples=300, deadline=None)
def test_any_shape_of_the_known_fields_gives_a_config_or_a_mesh_config_error(raw: dict[str, Any]) -> None:
    text = yaml.safe_dump(raw)
    try:
        mesh = parse_mesh_config(text)
    except MeshConfigError:
        return
    mesh.entry_visibility({"a": "b"})


# --- the ConfigMap and the memory of the last good config --------------------------------------------------------


def test_the_config_map_of_the_control_planes_namespace_is_read_and_others_are_not() -> None:
    skips: list[Skipped] = []
    elsewhere = config_map(UPSTREAM_PATCH, namespace="default")
    assert mesh_config_of([elsewhere], namespace="istio-system", memo=None, skips=skips) == DEFAULT_MESH_CONFIG
    mesh = mesh_config_of([elsewhere, config_map(UPSTREAM_PATCH)], namespace="istio-system", memo=None, skips=skips)
    assert mesh.entry_visibility({}) is MeshVisibility.NAMESPACE
    assert mesh_config_of([config_map(None)], namespace="istio-system", memo=None, skips=skips) == DEFAULT_MESH_CONFIG
    assert not skips


def test_a_bad_edit_keeps_the_last_good_config_and_is_reported_until_fixed() -> None:
    memo = MeshConfigMemo()
    skips: list[Skipped] = []
    good = mesh_config_of([config_map(UPSTREAM_PATCH)], namespace="istio-system", memo=memo, skips=skips)
    assert good.service_entry_visibility is not None and not skips

    bad = config_map("serviceEntryVisibility: {defaultVisibility: SECRET}", version="2")
    assert mesh_config_of([bad], namespace="istio-system", memo=memo, skips=skips) == good
    (problem,) = skips
    assert (problem.kind, problem.namespace, problem.name, problem.field) == (
        "ConfigMap",
        "istio-system",
        "istio",
        "data.mesh",
    )
    assert "'SECRET' is not one of" in problem.reason and "previous mesh config stays in force" in problem.reason

    again: list[Skipped] = []
    assert mesh_config_of([bad], namespace="istio-system", memo=memo, skips=again) == good
    assert again == [problem]  # reported on every translation while it lasts (the Event is deduplicated)

    fixed: list[Skipped] = []
    mesh = mesh_config_of([config_map("{}", version="3")], namespace="istio-system", memo=memo, skips=fixed)
    assert mesh == DEFAULT_MESH_CONFIG and not fixed


def test_a_deleted_config_map_brings_the_defaults_back() -> None:
    memo = MeshConfigMemo()
    mesh_config_of([config_map(UPSTREAM_PATCH)], namespace="istio-system", memo=memo, skips=[])
    assert mesh_config_of([], namespace="istio-system", memo=memo, skips=[]) == DEFAULT_MESH_CONFIG


def test_a_mesh_value_that_is_not_text_is_reported() -> None:
    cm = config_map(None)
    cm["data"] = {"mesh": 12}
    skips: list[Skipped] = []
    assert mesh_config_of([cm], namespace="istio-system", memo=None, skips=skips) == DEFAULT_MESH_CONFIG
    assert "expected a string" in skips[0].reason
