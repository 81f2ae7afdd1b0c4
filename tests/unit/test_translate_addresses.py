"""Kubernetes objects → the Address resources the control plane serves (spec §4.1, §4.2): golden files.

Each ``golden/translate/<case>-in.yaml`` (the inputs of ``test_translate_workloads.py``) is translated, turned into
named, versioned ``istio.workload.Address`` protos by :func:`ambit.controlplane.addresses.addresses`, and rendered
with ``MessageToDict(preserving_proto_field_name=True)``, sorted by resource name, into ``<case>-addresses.yaml``.
Bytes fields (IPs) appear in base64, as proto3 JSON writes them; default values are elided, as on the wire.
``AMBIT_UPDATE_GOLDEN=1 pytest ...`` rewrites the files.
"""

from __future__ import annotations

import base64
import ipaddress
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf.json_format import MessageToDict

from ambit.api import discovery_pb2 as dpb
from ambit.controlplane.addresses import addresses, authorizations
from ambit.controlplane.translate import translate
from ambit.xds.convert import ADDRESS_TYPE_URL
from ambit.xds.session import ServerSession
from ambit.xds.table import AddressTable

GOLDEN = Path(__file__).parent / "golden" / "translate"
CASES = sorted(p.name.removesuffix("-in.yaml") for p in GOLDEN.glob("*-in.yaml"))
KINDS = {
    "Pod": "pods",
    "Service": "services",
    "EndpointSlice": "endpoint_slices",
    "Namespace": "namespaces",
    "ServiceEntry": "service_entries",
    "WorkloadEntry": "workload_entries",
    "AuthorizationPolicy": "authorization_policies",
    "PeerAuthentication": "peer_authentications",
    "Node": "nodes",
    "Gateway": "gateways",
    "GatewayClass": "gateway_classes",
}
CASE_OPTIONS: dict[str, dict[str, Any]] = {"policy_dry_run": {"enable_dry_run": True}}


def render_addresses(case: str) -> tuple[str, dict[str, Any]]:
    by_kind: dict[str, list[dict[str, Any]]] = {name: [] for name in KINDS.values()}
    for doc in yaml.safe_load_all((GOLDEN / f"{case}-in.yaml").read_text()):
        if doc:
            by_kind[KINDS[doc["kind"]]].append(doc)
    resources = addresses(translate(**by_kind, **CASE_OPTIONS.get(case, {})))
    rows = [
        {"name": name, "version": version, "address": MessageToDict(address, preserving_proto_field_name=True)}
        for name, (version, address) in sorted(resources.items())
    ]
    return yaml.safe_dump(rows, sort_keys=True, width=200), {row["name"]: row["address"] for row in rows}


@pytest.mark.parametrize("case", CASES)
def test_addresses_match_their_golden_file(case: str) -> None:
    text, _ = render_addresses(case)
    path = GOLDEN / f"{case}-addresses.yaml"
    if os.environ.get("AMBIT_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs (AMBIT_UPDATE_GOLDEN=1 rewrites it)"


def test_every_translation_case_has_an_addresses_file() -> None:
    missing = [case for case in CASES if not (GOLDEN / f"{case}-addresses.yaml").exists()]
    assert CASES and not missing, f"no addresses file for {missing} (AMBIT_UPDATE_GOLDEN=1 writes them)"


def test_addresses_are_named_by_uid_and_by_namespace_and_hostname() -> None:
    _, resources = render_addresses("serviceentry_inline")
    endpoint = resources["Kubernetes/networking.istio.io/ServiceEntry/shop/payments/198.18.200.11"]["workload"]
    assert [ipaddress.ip_address(base64.b64decode(a)) for a in endpoint["addresses"]] == [
        ipaddress.ip_address("198.18.200.11")
    ]
    assert endpoint["tunnel_protocol"] == "HBONE" and endpoint["service_account"] == "payments"
    assert "trust_domain" not in endpoint, "the default trust domain is elided on the wire"
    service = resources["shop/payments.example.com"]["service"]
    assert service["hostname"] == "payments.example.com"
    assert [p.get("target_port", 0) for p in service["ports"]] == [0, 9080]


def test_a_workload_entry_with_the_default_service_account_elides_it() -> None:
    _, resources = render_addresses("workloadentry")
    vm = resources["Kubernetes/networking.istio.io/WorkloadEntry/legacy/vm-1"]["workload"]
    assert "service_account" not in vm and vm["network"] == "net-a" and vm["canonical_name"] == "billing"


def test_the_same_inputs_give_the_same_versions() -> None:
    assert render_addresses("serviceentry_selector") == render_addresses("serviceentry_selector")


@pytest.mark.parametrize("case", CASES)
def test_a_table_of_encodings_serves_the_resources_a_table_of_messages_serves_and_holds_each_once(case: str) -> None:
    by_kind: dict[str, list[dict[str, Any]]] = {name: [] for name in KINDS.values()}
    for doc in yaml.safe_load_all((GOLDEN / f"{case}-in.yaml").read_text()):
        if doc:
            by_kind[KINDS[doc["kind"]]].append(doc)
    config = translate(**by_kind, **CASE_OPTIONS.get(case, {}))
    encoded = addresses(config, encoded=True)
    from_messages = AddressTable(addresses(config)).current.by_name
    from_encodings = AddressTable(encoded).current.by_name
    assert from_encodings.keys() == from_messages.keys()
    for name, resource in from_encodings.items():
        assert resource.wire == from_messages[name].wire and resource.parents == from_messages[name].parents
        assert resource is encoded[name][1].resource, "the table keeps the encoding's own resource: one copy"
        assert encoded[name][1].message() == addresses(config)[name][1]


def render_authorizations(case: str) -> str:
    by_kind: dict[str, list[dict[str, Any]]] = {name: [] for name in KINDS.values()}
    for doc in yaml.safe_load_all((GOLDEN / f"{case}-in.yaml").read_text()):
        if doc:
            by_kind[KINDS[doc["kind"]]].append(doc)
    resources = authorizations(translate(**by_kind, **CASE_OPTIONS.get(case, {})))
    rows = [
        {"name": name, "version": version, "authorization": MessageToDict(message, preserving_proto_field_name=True)}
        for name, (version, message) in sorted(resources.items())
    ]
    return yaml.safe_dump(rows, sort_keys=True, width=200) if rows else ""


@pytest.mark.parametrize("case", CASES)
def test_authorizations_match_their_golden_file(case: str) -> None:
    """The Authorization resources served (spec §4.3), for the cases that have policies."""
    text = render_authorizations(case)
    path = GOLDEN / f"{case}-authorizations.yaml"
    if os.environ.get("AMBIT_UPDATE_GOLDEN"):
        if text:
            path.write_text(text)
        else:
            path.unlink(missing_ok=True)
    if text:
        assert text == path.read_text(), f"{path} differs (AMBIT_UPDATE_GOLDEN=1 rewrites it)"
    else:
        assert not path.exists(), f"{case} has no policies, but {path} exists"


ON_DEMAND_LOOKUPS = {
    "vip": "/198.19.0.70",
    "pod_ip": "/198.18.1.71",
    "hostname": "shop/web.shop.svc.cluster.local",
    "uid": "Kubernetes//Pod/shop/db-1",
    "unknown_address": "/198.18.99.99",
}


def render_on_demand_lookups() -> str:
    """What an on-demand client (subscribed to nothing) is answered for each lookup of ``ondemand-in.yaml``."""
    by_kind: dict[str, list[dict[str, Any]]] = {name: [] for name in KINDS.values()}
    for doc in yaml.safe_load_all((GOLDEN / "ondemand-in.yaml").read_text()):
        if doc:
            by_kind[KINDS[doc["kind"]]].append(doc)
    table = AddressTable(addresses(translate(**by_kind)))
    rows = {}
    for label, key in ON_DEMAND_LOOKUPS.items():
        session = ServerSession()
        session.receive(
            dpb.DeltaDiscoveryRequest(
                type_url=ADDRESS_TYPE_URL, resource_names_subscribe=["*"], resource_names_unsubscribe=["*"]
            ),
            table.current,
        )
        (response,) = session.receive(
            dpb.DeltaDiscoveryRequest(type_url=ADDRESS_TYPE_URL, resource_names_subscribe=[key]), table.current
        ).responses
        rows[label] = {
            "subscribe": key,
            "resources": sorted(r.name for r in response.resources),
            "removed": list(response.removed_resources),
        }
    return yaml.safe_dump(rows, sort_keys=True, width=200)


def test_on_demand_lookups_answer_as_istiod_and_match_their_golden_file() -> None:
    """A VIP or hostname: the Service and all its endpoints; a pod IP or uid: that workload; else removed."""
    text = render_on_demand_lookups()
    path = GOLDEN / "ondemand-lookups.yaml"
    if os.environ.get("AMBIT_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs (AMBIT_UPDATE_GOLDEN=1 rewrites it)"
