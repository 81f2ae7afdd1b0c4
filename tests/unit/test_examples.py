"""The demo manifests in examples/ must be accepted by the server and hang together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ambit.apiserver.validation import validate_object
from ambit.model.labels import selector_matches

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    (path.name, doc)
    for path in sorted((ROOT / "examples").rglob("*.yaml"))
    for doc in yaml.safe_load_all(path.read_text())
    if doc is not None
]


def group_of(doc: dict[str, Any]) -> str:
    group, _, _ = doc["apiVersion"].rpartition("/")
    return group


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in DOCS if doc["kind"] == kind]


def test_there_are_examples() -> None:
    assert len(DOCS) >= 10


@pytest.mark.parametrize(
    ("name", "doc"), DOCS, ids=[f"{name}:{doc['kind']}/{doc['metadata']['name']}" for name, doc in DOCS]
)
def test_every_manifest_validates(name: str, doc: dict[str, Any]) -> None:
    assert validate_object(doc["kind"], group_of(doc), doc) == []


def test_custom_resources_use_a_served_version_of_an_installed_crd() -> None:
    served = {}
    for path in (p for p in (ROOT / "deploy" / "crds").glob("*.yaml") if p.name != "kustomization.yaml"):
        for crd in yaml.safe_load_all(path.read_text()):
            for version in crd["spec"]["versions"]:
                served[(f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])] = True
    for _, doc in DOCS:
        if "." in group_of(doc) and group_of(doc) != "apps":
            assert (doc["apiVersion"], doc["kind"]) in served


def test_demo_namespace_is_in_ambient_mode() -> None:
    (namespace,) = [ns for ns in of_kind("Namespace") if ns["metadata"]["name"] == "demo"]
    assert namespace["metadata"]["labels"]["istio.io/dataplane-mode"] == "ambient"


def test_deployments_use_existing_service_accounts_and_config() -> None:
    accounts = {sa["metadata"]["name"] for sa in of_kind("ServiceAccount")} | {"default"}
    config_maps = {cm["metadata"]["name"]: cm["data"] for cm in of_kind("ConfigMap")}
    for deployment in of_kind("Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod.get("serviceAccountName", "default") in accounts
        for container in pod["containers"]:
            assert container["command"][0] == "python3"
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("configMapKeyRef")
                if ref:
                    assert ref["key"] in config_maps[ref["name"]]


def test_every_service_selects_a_deployment_and_a_named_port() -> None:
    for service in of_kind("Service"):
        matching = [
            d
            for d in of_kind("Deployment")
            if selector_matches(
                {"matchLabels": service["spec"]["selector"]}, d["spec"]["template"]["metadata"]["labels"]
            )
        ]
        assert len(matching) == 1, service["metadata"]["name"]
        port_names = {p["name"] for c in matching[0]["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names


def test_policy_allows_the_frontend_identity_to_reach_the_backend() -> None:
    (policy,) = [p for p in of_kind("AuthorizationPolicy") if p["metadata"]["namespace"] == "demo"]
    assert policy["spec"]["action"] == "ALLOW"
    assert policy["spec"]["selector"]["matchLabels"] == {"app": "backend"}
    principals = policy["spec"]["rules"][0]["from"][0]["source"]["principals"]
    assert principals == ["cluster.local/ns/demo/sa/frontend"]
    (peer,) = of_kind("PeerAuthentication")
    assert peer["spec"]["mtls"]["mode"] == "STRICT"
