"""The pure rules of claims and volumes in the lab: binding matches and phases (volume_binding), the local-path
provisioner's decisions and names (local_path), the scheduler's volume filter (volume_scheduling), a StatefulSet's
claims and their retention owner references (stateful_claims), and quantities (ambit.model.quantity)."""

from __future__ import annotations

import contextlib
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.lab.controllers import local_path, stateful_claims, volume_binding, volume_scheduling
from ambit.model.errors import QuantityError
from ambit.model.quantity import parse_quantity

NS = "apps"
Obj = dict[str, Any]


def claim(name: str = "data", size: Any = "1Gi", uid: str = "u1", **spec: Any) -> Obj:
    return {
        "metadata": {"name": name, "namespace": NS, "uid": uid},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}, **spec},
    }


def volume(name: str = "pv", size: Any = "2Gi", **spec: Any) -> Obj:
    body = {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce", "ReadOnlyMany"], **spec}
    return {"metadata": {"name": name, "labels": {"disk": "ssd"}}, "spec": body, "status": {"phase": "Available"}}


def node(name: str) -> Obj:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}


def on_node(name: str) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [name]}]}
    return {"required": {"nodeSelectorTerms": [term]}}


# -- binding (volume_binding) ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("claim_spec", "volume_spec", "available"),
    [
        ({}, {}, True),
        ({"storageClassName": "fast"}, {}, False),
        ({"storageClassName": "fast"}, {"storageClassName": "fast"}, True),
        ({"accessModes": ["ReadWriteMany"]}, {}, False),
        ({"accessModes": ["ReadOnlyMany", "ReadWriteOnce"]}, {}, True),
        ({"resources": {"requests": {"storage": "3Gi"}}}, {}, False),
        ({"resources": {"requests": {"storage": "2Gi"}}}, {}, True),
        ({"resources": {"requests": {"storage": "a lot"}}}, {}, False),
        ({"selector": {"matchLabels": {"disk": "ssd"}}}, {}, True),
        ({"selector": {"matchLabels": {"disk": "hdd"}}}, {}, False),
        ({"volumeName": "other"}, {}, False),
        ({"volumeName": "pv"}, {}, True),
        ({"volumeMode": "Block"}, {}, False),
        ({}, {"claimRef": {"namespace": NS, "name": "data"}}, True),
        ({}, {"claimRef": {"namespace": NS, "name": "data", "uid": "u1"}}, True),
        ({}, {"claimRef": {"namespace": NS, "name": "data", "uid": "old"}}, False),
        ({}, {"claimRef": {"namespace": NS, "name": "else"}}, False),
        ({}, {"capacity": {"storage": "two"}}, False),
    ],
)
def test_a_volume_is_available_to_a_claim_by_class_modes_size_selector_and_name(
    claim_spec: Obj, volume_spec: Obj, available: bool
) -> None:
    assert volume_binding.available_to(volume(**volume_spec), claim(**claim_spec)) is available


def test_the_best_volume_is_the_prebound_one_else_the_smallest_that_fits() -> None:
    volumes = [volume("big", "10Gi"), volume("small", "2Gi"), volume("tiny", "512Mi")]
    assert volume_binding.name_of(volume_binding.best_volume(claim(), volumes) or {}) == "small"
    prebound = volume("huge", "100Gi", claimRef={"namespace": NS, "name": "data"})
    assert volume_binding.name_of(volume_binding.best_volume(claim(), [*volumes, prebound]) or {}) == "huge"
    pinned = [volume("a", nodeAffinity=on_node("node-a")), volume("b", "3Gi", nodeAffinity=on_node("node-b"))]
    assert volume_binding.name_of(volume_binding.best_volume(claim(), pinned, node("node-b")) or {}) == "b"
    assert volume_binding.best_volume(claim(), pinned, node("node-c")) is None


def test_released_and_deleting_volumes_bind_nothing() -> None:
    released = volume()
    released["status"]["phase"] = "Released"
    deleting = volume()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert volume_binding.best_volume(claim(), [released, deleting]) is None


@pytest.mark.parametrize(
    ("ref", "found", "phase"),
    [
        (None, None, "Available"),
        ({"namespace": NS, "name": "data", "uid": "u1"}, claim(), "Bound"),
        ({"namespace": NS, "name": "data", "uid": "u1"}, None, "Released"),
        ({"namespace": NS, "name": "data", "uid": "u1"}, claim(uid="u2"), "Released"),
        ({"namespace": NS, "name": "data"}, None, "Available"),
    ],
)
def test_a_volumes_phase_follows_its_claim_ref(ref: Obj | None, found: Obj | None, phase: str) -> None:
    spec = {"claimRef": ref} if ref else {}
    assert volume_binding.volume_phase(volume(**spec), found) == phase


def test_a_claims_phase_is_pending_bound_or_lost() -> None:
    assert volume_binding.claim_phase(claim(), None) == "Pending"
    assert volume_binding.claim_phase(claim(volumeName="pv"), None) == "Lost"
    mine = volume(claimRef={"namespace": NS, "name": "data", "uid": "u1"})
    assert volume_binding.claim_phase(claim(volumeName="pv"), mine) == "Bound"
    assert volume_binding.claim_phase(claim(volumeName="pv"), volume()) == "Pending"
    assert volume_binding.bound_status(mine) == {
        "phase": "Bound",
        "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
        "capacity": {"storage": "2Gi"},
    }


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
SPECS = st.fixed_dictionaries(
    {},
    optional={
        "accessModes": st.lists(st.sampled_from(["ReadWriteOnce", "ReadOnlyMany", "x"])) | JSON,
        "resources": st.fixed_dictionaries({"requests": st.fixed_dictionaries({"storage": JSON})}) | JSON,
        "capacity": st.fixed_dictionaries({"storage": JSON | st.sampled_from(["1Gi", "1e3", "5m"])}) | JSON,
        "storageClassName": JSON,
        "volumeName": JSON,
        "selector": JSON,
        "claimRef": JSON,
        "nodeAffinity": JSON,
        "hostPath": JSON,
        "volumeMode": JSON,
    },
)
OBJECTS = st.fixed_dictionaries(
    {"metadata": st.fixed_dictionaries({"name": st.text(min_size=1, max_size=5)}, optional={"uid": JSON})},
    optional={"spec": SPECS | JSON, "status": JSON},
)


@settings(max_examples=300)
@given(OBJECTS, OBJECTS, OBJECTS)
def test_the_binding_rules_never_raise_on_any_claim_or_volume(a: Obj, b: Obj, n: Obj) -> None:
    volume_binding.available_to(b, a)
    volume_binding.best_volume(a, [b], n)
    volume_binding.volume_phase(b, a)
    volume_binding.claim_phase(a, b)
    volume_binding.node_admits(b, n)
    classes = {"provisioner": local_path.PROVISIONER, "volumeBindingMode": "WaitForFirstConsumer"}
    local_path.provisioning(a, classes, {"n"})
    local_path.reclaimable(b)
    local_path.volume_node(b)
    local_path.volume_path(b)
    view = volume_scheduling.VolumeView(lambda name: a, lambda name: b, lambda name: classes, [b])
    volume_scheduling.pod_claims(a)
    volume_scheduling.fit({"spec": {"volumes": [{"persistentVolumeClaim": {"claimName": "x"}}]}}, n, view)


# -- the local-path provisioner (local_path) --------------------------------------------------------------------------
WAIT = {"metadata": {"name": "standard"}, "provisioner": local_path.PROVISIONER, "reclaimPolicy": "Delete"}
WAIT["volumeBindingMode"] = "WaitForFirstConsumer"


def selected(on: str, **spec: Any) -> Obj:
    made = claim(**spec)
    made["metadata"]["annotations"] = {volume_binding.SELECTED_NODE: on}
    return made


def test_the_provisioner_waits_for_a_selected_node_and_names_the_directory_after_the_claim() -> None:
    assert local_path.provisioning(claim(), WAIT, {"node-a"}) is None
    assert local_path.provisioning(selected("node-a"), WAIT, {"node-a"}) == local_path.Provision("node-a")
    assert isinstance(local_path.provisioning(selected("node-z"), WAIT, {"node-a"}), local_path.Refuse)
    immediate = {**WAIT, "volumeBindingMode": "Immediate"}
    refused = local_path.provisioning(claim(), immediate, {"node-a"})
    assert refused == local_path.Refuse("configuration error, no node was specified")
    assert local_path.provisioning(claim(), {**WAIT, "provisioner": "other.io/x"}, {"node-a"}) is None
    assert local_path.provisioning(selected("node-a", volumeName="pv"), WAIT, {"node-a"}) is None
    assert local_path.volume_name(claim()) == "pvc-u1"
    assert local_path.directory(claim()) == "/var/local-path-provisioner/pvc-u1_apps_data"


def test_a_provisioned_volume_is_prebound_pinned_to_its_node_and_reclaimed_only_when_released() -> None:
    made = local_path.provisioned_volume(selected("node-a", storageClassName="standard"), WAIT, "node-a")
    assert made["metadata"]["annotations"][volume_binding.PROVISIONED_BY] == "rancher.io/local-path"
    assert made["spec"]["capacity"] == {"storage": "1Gi"}
    assert made["spec"]["hostPath"] == {
        "path": "/var/local-path-provisioner/pvc-u1_apps_data",
        "type": "DirectoryOrCreate",
    }
    assert made["spec"]["claimRef"]["uid"] == "u1"
    assert local_path.volume_node(made) == "node-a"
    assert volume_binding.available_to(made, selected("node-a", storageClassName="standard"))
    assert not local_path.reclaimable(made)
    made["status"] = {"phase": "Released"}
    assert local_path.reclaimable(made)
    made["spec"]["persistentVolumeReclaimPolicy"] = "Retain"
    assert not local_path.reclaimable(made)
    assert local_path.default_storage_class()["metadata"]["annotations"] == {
        "storageclass.kubernetes.io/is-default-class": "true"
    }


# -- the scheduler's volume filter (volume_scheduling) ----------------------------------------------------------------
def pod(*claims: str) -> Obj:
    volumes = [{"name": c, "persistentVolumeClaim": {"claimName": c}} for c in claims]
    return {"metadata": {"name": "p", "namespace": NS}, "spec": {"volumes": volumes}}


def view(claims: list[Obj], volumes: list[Obj] = (), classes: list[Obj] = ()) -> volume_scheduling.VolumeView:  # type: ignore[assignment]
    by = {c["metadata"]["name"]: c for c in claims}
    pvs = {v["metadata"]["name"]: v for v in volumes}
    scs = {c["metadata"]["name"]: c for c in classes}
    return volume_scheduling.VolumeView(by.get, pvs.get, scs.get, list(volumes))


def test_the_volume_prefilter_words_missing_deleting_and_unbound_immediate_claims_as_kube() -> None:
    assert volume_scheduling.prefilter(pod("a"), view([])) == 'persistentvolumeclaim "a" not found'
    deleting = claim("a")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert volume_scheduling.prefilter(pod("a"), view([deleting])) == 'persistentvolumeclaim "a" is being deleted'
    assert volume_scheduling.prefilter(pod("a"), view([claim("a")])) == volume_scheduling.UNBOUND_IMMEDIATE
    late = claim("a", storageClassName="standard")
    assert volume_scheduling.prefilter(pod("a"), view([late], classes=[WAIT])) is None
    assert volume_scheduling.prefilter(pod("a"), view([claim("a", volumeName="pv")])) is None


def test_the_volume_filter_follows_bound_volumes_and_plans_late_binding() -> None:
    bound = claim("a", volumeName="pv")
    pinned = volume("pv", nodeAffinity=on_node("node-a"))
    assert volume_scheduling.fit(pod("a"), node("node-a"), view([bound], [pinned])).reason is None
    assert volume_scheduling.fit(pod("a"), node("node-b"), view([bound], [pinned])).reason == (
        volume_scheduling.AFFINITY_CONFLICT
    )
    late = claim("a", storageClassName="standard")
    planned = volume_scheduling.fit(pod("a"), node("node-b"), view([late], classes=[WAIT]))
    assert (planned.reason, planned.select, planned.prebind) == (None, ["a"], [])
    static_class = {"metadata": {"name": "local"}, "provisioner": "", "volumeBindingMode": "WaitForFirstConsumer"}
    static = claim("a", storageClassName="local")
    local = volume("disk", storageClassName="local", nodeAffinity=on_node("node-a"))
    here = volume_scheduling.fit(pod("a"), node("node-a"), view([static], [local], [static_class]))
    assert (here.reason, here.prebind) == (None, [("a", "disk")])
    there = volume_scheduling.fit(pod("a"), node("node-b"), view([static], [local], [static_class]))
    assert there.reason == volume_scheduling.NO_VOLUMES
    chosen = selected("node-a", name="a", storageClassName="standard")
    assert volume_scheduling.fit(pod("a"), node("node-b"), view([chosen], classes=[WAIT])).reason == (
        volume_scheduling.AFFINITY_CONFLICT
    )


# -- a StatefulSet's claims (stateful_claims) -------------------------------------------------------------------------
def stateful_set(when_deleted: str = "Retain", when_scaled: str = "Retain") -> Obj:
    template = {"metadata": {"name": "data", "labels": {"tier": "db"}}, "spec": {"accessModes": ["ReadWriteOnce"]}}
    return {
        "metadata": {"name": "web", "namespace": NS, "uid": "set-uid"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "volumeClaimTemplates": [template],
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": when_deleted, "whenScaled": when_scaled},
        },
    }


MEMBER = {"metadata": {"name": "web-1", "namespace": NS, "uid": "pod-uid"}}


@pytest.mark.parametrize(
    ("when_deleted", "when_scaled", "scaled_away", "owners"),
    [
        ("Retain", "Retain", False, []),
        ("Retain", "Retain", True, []),
        ("Delete", "Retain", False, ["StatefulSet"]),
        ("Delete", "Retain", True, ["StatefulSet"]),
        ("Retain", "Delete", False, []),
        ("Retain", "Delete", True, ["Pod"]),
        ("Delete", "Delete", False, ["StatefulSet"]),
        ("Delete", "Delete", True, ["Pod"]),
    ],
)
def test_retention_policies_give_a_claim_kubes_owner_references(
    when_deleted: str, when_scaled: str, scaled_away: bool, owners: list[str]
) -> None:
    refs = stateful_claims.retention_refs(stateful_set(when_deleted, when_scaled), MEMBER, scaled_away)
    assert [r["kind"] for r in refs] == owners
    assert all("controller" not in r for r in refs)


def test_a_members_claim_is_named_labelled_and_its_references_updated_only_when_they_differ() -> None:
    sts = stateful_set("Delete")
    [made] = stateful_claims.claims_for(sts, 1, None)
    assert made["metadata"]["name"] == "data-web-1"
    assert made["metadata"]["labels"] == {"tier": "db", "app": "web"}
    assert made["metadata"]["ownerReferences"] == [
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "set-uid"}
    ]
    assert stateful_claims.refs_update(made, sts, MEMBER, scaled_away=False) is None
    foreign = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "other"}
    made["metadata"]["ownerReferences"].append(foreign)
    moved = stateful_claims.refs_update(made, stateful_set("Delete", "Delete"), MEMBER, scaled_away=True)
    assert moved is not None and [r["uid"] for r in moved] == ["other", "pod-uid"]
    assert stateful_claims.pod_volumes(sts, 3) == [
        {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-3"}}
    ]


# -- quantities (ambit.model.quantity) ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "value"),
    [("1Gi", Decimal(2**30)), ("500M", Decimal(5 * 10**8)), ("1.5", Decimal("1.5")), ("1e3", Decimal(1000)), (7, 7)],
)
def test_quantities_parse_to_exact_decimals(text: Any, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text", ["", "-1Gi", "1 Gi", "1GiB", "Gi", True, None, "1e99999999999", "x" * 100, "1Gi\n", "1.5\n", "1e3\n"]
)
def test_what_is_no_quantity_is_a_quantity_error(text: Any) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


@given(st.text(max_size=20) | st.integers() | st.floats(allow_nan=True))
def test_the_quantity_parser_answers_a_decimal_or_a_quantity_error(text: Any) -> None:
    with contextlib.suppress(QuantityError):
        assert parse_quantity(text).is_finite()
