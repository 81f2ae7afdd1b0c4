"""PersistentVolumeClaims, PersistentVolumes and StorageClasses in the embedded API server, without HTTP: kube's
defaults, validation with its field paths, the claim update rules, the ``kubectl get pvc|pv|sc`` rows, protobuf
bodies (field numbers of k8s.io/api core/v1 and storage/v1), and that no body, however malformed, makes validation
raise."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.protobuf_wire import decode, entry, envelope, ln, meta, num

from ambit.apiserver import claims
from ambit.apiserver.defaults import apply_defaults
from ambit.apiserver.errors import ApiError
from ambit.apiserver.storage_printers import STORAGE_PRINTERS, access_modes
from ambit.apiserver.validation import validate_object

Obj = dict[str, Any]
NOW = 1_800_000_000.0


def pvc(**spec: Any) -> Obj:
    body = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, **spec}
    return {"metadata": {"name": "data", "namespace": "apps"}, "spec": body}


def pv(**spec: Any) -> Obj:
    body = {"capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/srv/a"}, **spec}
    return {"metadata": {"name": "disk"}, "spec": body}


def sc(**fields: Any) -> Obj:
    return {"metadata": {"name": "fast"}, "provisioner": "example.com/disk", **fields}


def causes(kind: str, group: str, obj: Obj) -> list[str]:
    return [f"{path}: {message}" for path, message in validate_object(kind, group, obj)]


def test_defaults_are_kubes_for_claims_volumes_and_classes() -> None:
    claim = pvc()
    apply_defaults("", "PersistentVolumeClaim", claim)
    assert (claim["spec"]["volumeMode"], claim["status"]) == ("Filesystem", {"phase": "Pending"})
    volume = pv()
    apply_defaults("", "PersistentVolume", volume)
    assert volume["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert volume["status"] == {"phase": "Pending"}
    storage_class = sc()
    apply_defaults("storage.k8s.io", "StorageClass", storage_class)
    assert (storage_class["reclaimPolicy"], storage_class["volumeBindingMode"]) == ("Delete", "Immediate")


@pytest.mark.parametrize(
    ("spec", "wanted"),
    [
        ({"accessModes": []}, "spec.accessModes: Required value: at least 1 access mode is required"),
        (
            {"accessModes": ["ReadWriteSometimes"]},
            'spec.accessModes[0]: Unsupported value: "ReadWriteSometimes": supported values: "ReadOnlyMany", '
            '"ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"',
        ),
        ({"resources": {}}, "spec.resources[storage]: Required value"),
        (
            {"resources": {"requests": {"storage": "lots"}}},
            'spec.resources[storage]: Invalid value: "lots": must be a quantity, such as 1Gi or 500M',
        ),
        ({"resources": {"requests": {"storage": "0"}}}, 'spec.resources[storage]: Invalid value: "0": must be greater'),
        ({"volumeMode": "Tape"}, 'spec.volumeMode: Unsupported value: "Tape"'),
        ({"storageClassName": "Fast_Disk"}, 'spec.storageClassName: Invalid value: "Fast_Disk"'),
        (
            {"accessModes": ["ReadWriteOncePod", "ReadWriteOnce"]},
            "spec.accessModes: Forbidden: may not use ReadWriteOncePod with other access modes",
        ),
    ],
)
def test_claim_validation_answers_with_kubes_field_paths(spec: Obj, wanted: str) -> None:
    found = causes("PersistentVolumeClaim", "", pvc(**spec))
    assert any(c.startswith(wanted) for c in found), found


@pytest.mark.parametrize(
    ("spec", "wanted"),
    [
        ({"capacity": None}, "spec.capacity: Required value"),
        ({"capacity": {"storage": "1Gi", "cpu": "1"}}, "spec.capacity: Unsupported value"),
        ({"hostPath": None}, "spec: Required value: must specify a volume type"),
        ({"local": {"path": "/x"}}, "spec.local: Forbidden: may not specify more than 1 volume type"),
        ({"hostPath": {"path": "/srv/../etc"}}, 'spec.hostPath.path: Invalid value: "/srv/../etc": must not contain'),
        ({"hostPath": None, "local": {"path": "/x"}}, "spec.nodeAffinity: Required value: Local volumes require"),
        ({"persistentVolumeReclaimPolicy": "Shred"}, 'spec.persistentVolumeReclaimPolicy: Unsupported value: "Shred"'),
        ({"nodeAffinity": {"required": {"nodeSelectorTerms": []}}}, "spec.nodeAffinity.required.nodeSelectorTerms"),
        ({"claimRef": {"name": "x"}}, "spec.claimRef.namespace: Required value"),
    ],
)
def test_volume_validation_answers_with_kubes_field_paths(spec: Obj, wanted: str) -> None:
    found = causes("PersistentVolume", "", pv(**spec))
    assert any(c.startswith(wanted) for c in found), found


def test_class_validation_needs_a_provisioner_and_known_policies() -> None:
    assert causes("StorageClass", "storage.k8s.io", sc()) == []
    found = causes("StorageClass", "storage.k8s.io", sc(provisioner="", reclaimPolicy="Recycle", volumeBindingMode="x"))
    assert [c.split(":")[0] for c in found] == ["provisioner", "reclaimPolicy", "volumeBindingMode"]


def test_the_default_class_is_the_newest_annotated_one() -> None:
    def made(name: str, when: str, default: bool) -> Obj:
        annotations = {claims.DEFAULT_CLASS_ANNOTATION: "true"} if default else {}
        return {"metadata": {"name": name, "creationTimestamp": when, "annotations": annotations}}

    assert claims.default_class([made("a", "2026-01-01T00:00:00Z", False)]) is None
    both = [made("old", "2026-01-01T00:00:00Z", True), made("new", "2026-02-01T00:00:00Z", True)]
    assert claims.default_class(both) == "new"


class _Store:
    def __init__(self, classes: list[Obj]) -> None:
        self.classes = classes

    def items(self, key: Any, namespace: str | None = None) -> list[Any]:
        return [type("Item", (), {"obj": c}) for c in self.classes]

    def get(self, key: Any, namespace: str, name: str) -> Any:
        found = [c for c in self.classes if c["metadata"]["name"] == name]
        return type("Item", (), {"obj": found[0]}) if found else None


def strategy(classes: list[Obj]) -> claims.ClaimStrategy:
    context = type("Context", (), {"store": _Store(classes)})()
    return claims.ClaimStrategy(context)  # type: ignore[arg-type]


RTYPE = type(
    "RType", (), {"kind": "PersistentVolumeClaim", "group": "", "subresources": frozenset({"status"}), "builtin": True}
)()
STANDARD = {"metadata": {"name": "standard", "annotations": {claims.DEFAULT_CLASS_ANNOTATION: "true"}}}


def test_a_new_claim_gets_the_default_class_and_the_protection_finalizer_unless_it_names_one() -> None:
    new = pvc()
    strategy([STANDARD]).prepare_for_create(RTYPE, new)  # type: ignore[arg-type]
    strategy([STANDARD]).derive(RTYPE, None, new)  # type: ignore[arg-type]
    assert new["spec"]["storageClassName"] == "standard"
    assert new["metadata"]["finalizers"] == ["kubernetes.io/pvc-protection"]
    empty = pvc(storageClassName="")
    strategy([STANDARD]).derive(RTYPE, None, empty)  # type: ignore[arg-type]
    assert empty["spec"]["storageClassName"] == ""


def _bound(size: str = "1Gi", **spec: Any) -> Obj:
    claim = pvc(storageClassName="standard", volumeName="pv-1", **spec)
    claim["spec"]["resources"]["requests"]["storage"] = size
    claim["status"] = {"phase": "Bound"}
    return claim


def test_a_claims_spec_is_fixed_except_its_binding_and_a_growth_the_class_allows() -> None:
    unbound = pvc(storageClassName="standard")
    strategy([STANDARD]).derive(RTYPE, unbound, pvc(storageClassName="standard", volumeName="pv-1"))  # type: ignore[arg-type]
    with pytest.raises(ApiError) as refused:
        strategy([STANDARD]).derive(RTYPE, _bound(), _bound(accessModes=["ReadWriteMany"]))  # type: ignore[arg-type]
    assert refused.value.code == 422
    assert "spec is immutable after creation" in str(refused.value)
    with pytest.raises(ApiError) as shrink:
        strategy([STANDARD]).derive(RTYPE, _bound("2Gi"), _bound("1Gi"))  # type: ignore[arg-type]
    assert "field can not be less than previous value" in str(shrink.value)
    with pytest.raises(ApiError) as grow:
        strategy([STANDARD]).derive(RTYPE, _bound("1Gi"), _bound("2Gi"))  # type: ignore[arg-type]
    assert grow.value.code == 403
    expandable = {**STANDARD, "allowVolumeExpansion": True}
    strategy([expandable]).derive(RTYPE, _bound("1Gi"), _bound("2Gi"))  # type: ignore[arg-type]


def test_kubectl_get_rows_are_kubes() -> None:
    claim = {**pvc(storageClassName="standard", volumeName="pvc-1", volumeMode="Filesystem")}
    claim["metadata"]["creationTimestamp"] = "2027-01-15T08:00:00Z"
    claim["status"] = {"phase": "Bound", "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}
    row = STORAGE_PRINTERS[("", "PersistentVolumeClaim")].cells(claim, NOW)
    assert row[:7] == ["data", "Bound", "pvc-1", "1Gi", "RWO", "standard", "<unset>"]
    assert row[8] == "Filesystem"
    volume = pv(claimRef={"namespace": "apps", "name": "data"}, persistentVolumeReclaimPolicy="Delete")
    volume["spec"]["storageClassName"] = "standard"
    volume["status"] = {"phase": "Bound"}
    row = STORAGE_PRINTERS[("", "PersistentVolume")].cells(volume, NOW)
    assert row[:9] == ["disk", "5Gi", "RWO", "Delete", "Bound", "apps/data", "standard", "<unset>", ""]
    row = STORAGE_PRINTERS[("storage.k8s.io", "StorageClass")].cells({**STANDARD, "provisioner": "p"}, NOW)
    assert row[:5] == ["standard (default)", "p", "Delete", "Immediate", False]
    assert access_modes(["ReadWriteMany", "ReadWriteOnce", "ReadWriteOnce"]) == "RWO,RWX"
    for printer in STORAGE_PRINTERS.values():
        assert len(printer.cells({}, NOW)) == len(printer.columns)


def test_protobuf_bodies_of_claims_volumes_and_classes_decode_as_their_json() -> None:
    claim_spec = ln(1, "ReadWriteOnce") + ln(2, entry(2, "storage", ln(1, "1Gi"))) + ln(5, "standard")
    claim = decode(envelope("v1", "PersistentVolumeClaim", meta("data", "apps"), ln(2, claim_spec)))
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
        "storageClassName": "standard",
    }
    term = ln(1, ln(1, "kubernetes.io/hostname") + ln(2, "In") + ln(3, "node-a"))
    volume_spec = (
        entry(1, "storage", ln(1, "5Gi"))
        + ln(2, ln(3, ln(1, "/srv/a")))
        + ln(3, "ReadWriteOnce")
        + ln(4, ln(2, "apps") + ln(3, "data"))
        + ln(5, "Retain")
        + ln(6, "local")
        + ln(9, ln(1, ln(1, term)))
    )
    volume = decode(envelope("v1", "PersistentVolume", meta("disk"), ln(2, volume_spec)))
    assert volume["spec"] == {
        "capacity": {"storage": "5Gi"},
        "hostPath": {"path": "/srv/a"},
        "accessModes": ["ReadWriteOnce"],
        "claimRef": {"namespace": "apps", "name": "data"},
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": "local",
        "nodeAffinity": {
            "required": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}]}
                ]
            }
        },
    }
    body = envelope(
        "storage.k8s.io/v1",
        "StorageClass",
        meta("fast"),
        ln(2, "rancher.io/local-path"),
        ln(4, "Delete"),
        num(6, 1),
        ln(7, "WaitForFirstConsumer"),
    )
    assert decode(body) == {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": "fast"},
        "provisioner": "rancher.io/local-path",
        "reclaimPolicy": "Delete",
        "allowVolumeExpansion": True,
        "volumeBindingMode": "WaitForFirstConsumer",
    }


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
FIELDS = st.sampled_from(
    [
        "accessModes",
        "resources",
        "capacity",
        "hostPath",
        "local",
        "nodeAffinity",
        "claimRef",
        "volumeMode",
        "storageClassName",
        "selector",
        "persistentVolumeReclaimPolicy",
    ]
)


@settings(max_examples=300)
@given(
    st.dictionaries(FIELDS, JSON),
    st.dictionaries(
        st.sampled_from(["provisioner", "parameters", "reclaimPolicy", "volumeBindingMode", "allowVolumeExpansion"]),
        JSON,
    ),
)
def test_no_claim_volume_or_class_body_makes_validation_raise(spec: Obj, fields: Obj) -> None:
    validate_object("PersistentVolumeClaim", "", {"metadata": {"name": "x", "namespace": "a"}, "spec": spec})
    validate_object("PersistentVolume", "", {"metadata": {"name": "x"}, "spec": spec})
    validate_object("StorageClass", "storage.k8s.io", {"metadata": {"name": "x"}, **fields})
    for printer in STORAGE_PRINTERS.values():
        printer.cells({"metadata": {"name": "x"}, "spec": spec, **fields}, NOW)


@settings(max_examples=200)
@given(st.dictionaries(FIELDS, JSON), JSON)
def test_no_claim_update_makes_the_claim_rules_raise_anything_but_an_api_error(spec: Obj, status: Any) -> None:
    old = _bound()
    new = {"metadata": {"name": "data", "namespace": "apps", "finalizers": status}, "spec": spec, "status": status}
    try:
        strategy([STANDARD]).derive(RTYPE, old, new)  # type: ignore[arg-type]
        strategy([STANDARD]).derive(RTYPE, None, new)  # type: ignore[arg-type]
        strategy([STANDARD]).prepare_for_create(RTYPE, new)  # type: ignore[arg-type]
    except ApiError:
        pass
