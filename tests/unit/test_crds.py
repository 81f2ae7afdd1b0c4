"""The CRDs in deploy/crds are what the server installs at start: they must be well formed and consistent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ambit.apiserver.jsonpath import parse
from ambit.apiserver.tables import to_table
from ambit.apiserver.validation import validate_object

CRD_DIR = Path(__file__).resolve().parents[2] / "deploy" / "crds"
FILES = sorted(p for p in CRD_DIR.glob("*.yaml") if p.name != "kustomization.yaml")


def load(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


CRDS = [(path, crd) for path in FILES for crd in load(path)]
IDS = [crd["metadata"]["name"] for _, crd in CRDS]


def test_one_file_per_group_with_the_expected_kinds() -> None:
    kinds = {path.name: sorted(crd["spec"]["names"]["kind"] for crd in load(path)) for path in FILES}
    assert kinds == {
        "extensions.istio.io.yaml": ["WasmPlugin"],
        "gateway.networking.k8s.io.yaml": [
            "BackendTLSPolicy",
            "GRPCRoute",
            "Gateway",
            "GatewayClass",
            "HTTPRoute",
            "ListenerSet",
            "ReferenceGrant",
            "TCPRoute",
            "TLSRoute",
        ],
        "gateway.networking.x-k8s.io.yaml": ["XListenerSet"],
        "networking.istio.io.yaml": [
            "DestinationRule",
            "EnvoyFilter",
            "Gateway",
            "ProxyConfig",
            "ServiceEntry",
            "Sidecar",
            "VirtualService",
            "WorkloadEntry",
            "WorkloadGroup",
        ],
        "security.istio.io.yaml": ["AuthorizationPolicy", "PeerAuthentication", "RequestAuthentication"],
        "telemetry.istio.io.yaml": ["Telemetry"],
    }


@pytest.mark.parametrize(("path", "crd"), CRDS, ids=IDS)
def test_names_are_consistent(path: Path, crd: dict[str, Any]) -> None:
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    spec = crd["spec"]
    names = spec["names"]
    assert path.name == f"{spec['group']}.yaml"
    assert crd["metadata"]["name"] == f"{names['plural']}.{spec['group']}"
    assert names["plural"] == names["plural"].lower()
    assert names["singular"] == names["kind"].lower()
    assert names["listKind"] == f"{names['kind']}List"
    assert all(short == short.lower() for short in names.get("shortNames", []))


@pytest.mark.parametrize(("path", "crd"), CRDS, ids=IDS)
def test_exactly_one_storage_version_and_all_served(path: Path, crd: dict[str, Any]) -> None:
    versions = crd["spec"]["versions"]
    # The newest version is stored and listed first (v1, or the only version of a kind upstream never promoted).
    assert [v["name"] for v in versions if v["storage"]] == [versions[0]["name"]]
    assert versions[0]["name"] == "v1" or len(versions) == 1
    assert all(v["served"] for v in versions)
    assert len({v["name"] for v in versions}) == len(versions)


@pytest.mark.parametrize(("path", "crd"), CRDS, ids=IDS)
def test_the_server_accepts_it(path: Path, crd: dict[str, Any]) -> None:
    assert validate_object("CustomResourceDefinition", "apiextensions.k8s.io", crd) == []


def assert_structural(schema: dict[str, Any], where: str) -> None:
    """Every node says its type, every array its items: what apiextensions calls a structural schema."""
    assert "type" in schema or schema.get("x-kubernetes-int-or-string"), where
    if schema.get("type") == "array":
        assert "items" in schema, where
        assert_structural(schema["items"], f"{where}[]")
    for name, sub in schema.get("properties", {}).items():
        assert_structural(sub, f"{where}.{name}")
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        assert_structural(extra, f"{where}{{}}")


@pytest.mark.parametrize(("path", "crd"), CRDS, ids=IDS)
def test_schemas_are_structural_and_keep_unknown_fields(path: Path, crd: dict[str, Any]) -> None:
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        assert schema["type"] == "object"
        assert_structural(schema, version["name"])
        for part in ("spec", "status"):
            assert schema["properties"][part]["type"] == "object"
            assert schema["properties"][part]["x-kubernetes-preserve-unknown-fields"] is True
        assert version["subresources"] == {"status": {}}


@pytest.mark.parametrize(("path", "crd"), CRDS, ids=IDS)
def test_versions_share_schema_and_columns(path: Path, crd: dict[str, Any]) -> None:
    # With the None conversion strategy, only apiVersion changes between versions.
    first, *rest = crd["spec"]["versions"]
    for version in rest:
        assert version["schema"] == first["schema"]
        assert version.get("additionalPrinterColumns") == first.get("additionalPrinterColumns")


def test_short_names_are_unique_and_as_upstream() -> None:
    shorts = {crd["metadata"]["name"]: crd["spec"]["names"].get("shortNames", []) for _, crd in CRDS}
    assert len({s for names in shorts.values() for s in names}) == sum(map(len, shorts.values()))
    shorts = {crd["spec"]["names"]["kind"]: crd["spec"]["names"].get("shortNames", []) for _, crd in CRDS}
    shorts.pop("Gateway")  # two kinds of that name, checked here
    by_name = {crd["metadata"]["name"]: crd["spec"]["names"].get("shortNames") for _, crd in CRDS}
    assert by_name["gateways.gateway.networking.k8s.io"] == ["gtw"]
    assert by_name["gateways.networking.istio.io"] == ["gw"]
    assert shorts == {
        "AuthorizationPolicy": ["ap"],
        "Telemetry": ["telemetry"],
        "PeerAuthentication": ["pa"],
        "RequestAuthentication": ["ra"],
        "ServiceEntry": ["se"],
        "WorkloadEntry": ["we"],
        "DestinationRule": ["dr"],
        "VirtualService": ["vs"],
        "GatewayClass": ["gc"],
        "HTTPRoute": [],
        "GRPCRoute": [],
        "TCPRoute": [],
        "TLSRoute": [],
        "ReferenceGrant": ["refgrant"],
        "BackendTLSPolicy": ["btlspolicy"],
        "ListenerSet": ["lset"],
        "XListenerSet": [],
        "EnvoyFilter": [],
        "Sidecar": [],
        "WorkloadGroup": ["wg"],
        "ProxyConfig": [],
        "WasmPlugin": [],
    }


def test_scopes() -> None:
    scopes = {crd["spec"]["names"]["kind"]: crd["spec"]["scope"] for _, crd in CRDS}
    assert scopes.pop("GatewayClass") == "Cluster"
    assert set(scopes.values()) == {"Namespaced"}


def test_served_versions_of_the_istio_kinds() -> None:
    versions = {
        crd["spec"]["names"]["kind"]: [v["name"] for v in crd["spec"]["versions"]]
        for _, crd in CRDS
        if crd["spec"]["group"].endswith("istio.io")
    }
    assert versions == {
        "AuthorizationPolicy": ["v1", "v1beta1"],
        "PeerAuthentication": ["v1", "v1beta1"],
        "RequestAuthentication": ["v1", "v1beta1"],
        "ServiceEntry": ["v1", "v1beta1", "v1alpha3"],
        "WorkloadEntry": ["v1", "v1beta1", "v1alpha3"],
        "DestinationRule": ["v1", "v1beta1", "v1alpha3"],
        "VirtualService": ["v1", "v1beta1", "v1alpha3"],
        "Gateway": ["v1", "v1beta1", "v1alpha3"],
        "Sidecar": ["v1", "v1beta1", "v1alpha3"],
        "WorkloadGroup": ["v1", "v1beta1", "v1alpha3"],
        "EnvoyFilter": ["v1alpha3"],
        "ProxyConfig": ["v1beta1"],
        "WasmPlugin": ["v1alpha1"],
        "Telemetry": ["v1", "v1alpha1"],
    }


def test_gateway_api_kinds_serve_the_versions_clusters_serve() -> None:
    versions = {
        crd["spec"]["names"]["kind"]: [v["name"] for v in crd["spec"]["versions"]]
        for _, crd in CRDS
        if crd["spec"]["group"] == "gateway.networking.k8s.io"
    }
    assert versions == {
        "GatewayClass": ["v1", "v1beta1"],
        "Gateway": ["v1", "v1beta1"],
        "HTTPRoute": ["v1", "v1beta1"],
        "GRPCRoute": ["v1"],
        "TCPRoute": ["v1", "v1alpha2"],
        "TLSRoute": ["v1", "v1alpha3", "v1alpha2"],
        "ReferenceGrant": ["v1", "v1beta1"],
        "BackendTLSPolicy": ["v1", "v1alpha3"],
        "ListenerSet": ["v1"],
    }


def columns_of(kind: str, group: str = "") -> list[dict[str, Any]]:
    crd = next(
        crd for _, crd in CRDS if crd["spec"]["names"]["kind"] == kind and (not group or crd["spec"]["group"] == group)
    )
    columns: list[dict[str, Any]] = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    for column in columns:
        parse(column["jsonPath"])
    return columns


def test_service_entry_prints_hosts_location_resolution() -> None:
    entry = {
        "metadata": {"name": "api", "creationTimestamp": "2024-05-01T11:59:00Z"},
        "spec": {"hosts": ["api.example.com"], "location": "MESH_EXTERNAL", "resolution": "DNS"},
    }
    now = 1714564800.0  # 2024-05-01T12:00:00Z
    result = to_table(
        "ServiceEntry",
        "networking.istio.io",
        [entry],
        now=now,
        list_metadata={},
        printer_columns=columns_of("ServiceEntry"),
    )
    assert [c["name"] for c in result["columnDefinitions"]] == ["Name", "Hosts", "Location", "Resolution", "Age"]
    assert result["rows"][0]["cells"] == ["api", '["api.example.com"]', "MESH_EXTERNAL", "DNS", "60s"]


def test_gateway_prints_class_address_programmed() -> None:
    gateway = {
        "metadata": {"name": "waypoint"},
        "spec": {"gatewayClassName": "istio-waypoint"},
        "status": {
            "addresses": [{"type": "IPAddress", "value": "10.96.0.20"}],
            "conditions": [{"type": "Accepted", "status": "True"}, {"type": "Programmed", "status": "True"}],
        },
    }
    result = to_table(
        "Gateway",
        "gateway.networking.k8s.io",
        [gateway],
        now=0.0,
        list_metadata={},
        printer_columns=columns_of("Gateway", "gateway.networking.k8s.io"),
    )
    assert result["rows"][0]["cells"][:4] == ["waypoint", "istio-waypoint", "10.96.0.20", "True"]


def test_destination_rule_and_virtual_service_print_istio_s_columns() -> None:
    rule = {"metadata": {"name": "one-request"}, "spec": {"host": "*.svc.cluster.local"}}
    result = to_table(
        "DestinationRule",
        "networking.istio.io",
        [rule],
        now=0.0,
        list_metadata={},
        printer_columns=columns_of("DestinationRule"),
    )
    assert [c["name"] for c in result["columnDefinitions"]] == ["Name", "Host", "Age"]
    assert result["rows"][0]["cells"][:2] == ["one-request", "*.svc.cluster.local"]
    service = {"metadata": {"name": "reviews"}, "spec": {"hosts": ["reviews"], "gateways": ["mesh"]}}
    result = to_table(
        "VirtualService",
        "networking.istio.io",
        [service],
        now=0.0,
        list_metadata={},
        printer_columns=columns_of("VirtualService"),
    )
    assert [c["name"] for c in result["columnDefinitions"]] == ["Name", "Gateways", "Hosts", "Age"]
    assert result["rows"][0]["cells"][:3] == ["reviews", '["mesh"]', '["reviews"]']
