"""Kubernetes objects → Workload API (spec §4.1): golden files, the rules one by one, and a fuzz test.

Golden files: ``golden/translate/<case>-in.yaml`` (API objects, any kinds, one YAML document each) is translated
and rendered with ``render_local_config`` and compared with ``<case>-out.yaml``; ``AMBIT_UPDATE_GOLDEN=1 pytest
...`` rewrites the outputs.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.translate import translate
from ambit.model.localconfig import LocalConfig, parse_local_config, render_local_config
from ambit.model.workload import HealthStatus, PortMapping, TunnelProtocol

GOLDEN = Path(__file__).parent / "golden" / "translate"
CASES = sorted(p.name.removesuffix("-in.yaml") for p in GOLDEN.glob("*-in.yaml"))
KINDS = {"Pod": "pods", "Service": "services", "EndpointSlice": "endpoint_slices", "Namespace": "namespaces"}
Obj = dict[str, Any]


def translate_objects(objects: list[Obj], **options: Any) -> LocalConfig:
    by_kind: dict[str, list[Obj]] = {name: [] for name in KINDS.values()}
    for obj in objects:
        by_kind[KINDS[obj["kind"]]].append(obj)
    return translate(**by_kind, **options)


def test_every_expected_golden_case_exists() -> None:
    expected = {"plain_pods", "named_ports", "headless", "unready", "terminating", "ambient", "no_selector"}
    assert expected <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_translation_matches_its_golden_file(case: str) -> None:
    objects = [doc for doc in yaml.safe_load_all((GOLDEN / f"{case}-in.yaml").read_text()) if doc]
    text = render_local_config(translate_objects(objects))
    path = GOLDEN / f"{case}-out.yaml"
    if os.environ.get("AMBIT_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs (AMBIT_UPDATE_GOLDEN=1 rewrites it)"
    assert parse_local_config(text) == translate_objects(objects), "the rendering does not read back"


# -- the rules, one by one ----------------------------------------------------------------------------------------
def pod(
    name: str = "p",
    namespace: str = "ns",
    *,
    ip: str | None = "198.18.1.5",
    ready: bool = True,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    ports: list[Obj] | None = None,
    **spec: Any,
) -> Obj:
    status: Obj = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {}), "annotations": annotations},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "ports": ports or []}], **spec},
        "status": status,
    }


def service(name: str, namespace: str = "ns", selector: Mapping[str, str] | None = None, **spec: Any) -> Obj:
    return {
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": selector, **spec},
    }


def test_a_pod_becomes_a_workload_with_a_kubernetes_uid() -> None:
    config = translate_objects([pod("web", "shop")], cluster_id="east")
    (workload,) = config.workloads
    assert workload.uid == "east//Pod/shop/web"
    assert workload.addresses == (ipaddress.ip_address("198.18.1.5"),)
    assert workload.cluster_id == "east" and workload.workload_type == "pod" and workload.node == "node-1"


def test_a_pod_without_an_ip_is_not_a_workload_yet() -> None:
    assert translate_objects([pod(ip=None)]).workloads == ()


def test_only_the_enabled_redirection_annotation_means_hbone() -> None:
    pods = [
        pod("a", ip="198.18.1.1", annotations={"ambient.istio.io/redirection": "enabled"}),
        pod("b", ip="198.18.1.2", annotations={"ambient.istio.io/redirection": "pending"}),
        pod("c", ip="198.18.1.3"),
        pod("d", ip="198.18.1.4", annotations={"ambient.istio.io/redirection": "enabled"}, hostNetwork=True),
    ]
    protocols = {w.name: w.tunnel_protocol for w in translate_objects(pods).workloads}
    assert protocols == {
        "a": TunnelProtocol.HBONE,
        "b": TunnelProtocol.NONE,
        "c": TunnelProtocol.NONE,
        "d": TunnelProtocol.NONE,
    }


def test_unready_and_terminating_pods_are_unhealthy() -> None:
    terminating = pod("t", ip="198.18.1.2")
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    pods = [pod("r", ip="198.18.1.1"), terminating, pod("u", ip="198.18.1.3", ready=False)]
    status = {w.name: w.status for w in translate_objects(pods).workloads}
    assert status == {"r": HealthStatus.HEALTHY, "t": HealthStatus.UNHEALTHY, "u": HealthStatus.UNHEALTHY}


def test_canonical_labels_win_over_app_and_version_and_revision_defaults_to_latest() -> None:
    pods = [
        pod("a", ip="198.18.1.1", labels={"app": "shop", "version": "v1"}),
        pod("b", ip="198.18.1.2", labels={"app": "shop", "service.istio.io/canonical-name": "store"}),
        pod("c", ip="198.18.1.3"),
    ]
    names = {w.name: (w.canonical_name, w.canonical_revision) for w in translate_objects(pods).workloads}
    assert names == {"a": ("shop", "v1"), "b": ("store", "latest"), "c": ("c", "latest")}


def test_a_named_target_port_resolves_to_each_pods_own_container_port() -> None:
    svc = service("api", selector={"app": "api"}, clusterIPs=["198.19.0.9"], ports=[{"port": 80, "targetPort": "web"}])
    pods = [
        pod("a", ip="198.18.1.1", labels={"app": "api"}, ports=[{"name": "web", "containerPort": 8080}]),
        pod("b", ip="198.18.1.2", labels={"app": "api"}, ports=[{"name": "web", "containerPort": 9090}]),
        pod("c", ip="198.18.1.3", labels={"app": "api"}),
    ]
    config = translate_objects([svc, *pods], domain="example.org")
    key = "ns/api.ns.svc.example.org"
    assert {w.name: w.services[key] for w in config.workloads} == {
        "a": (PortMapping(80, 8080),),
        "b": (PortMapping(80, 9090),),
        "c": (),
    }
    (translated,) = config.services
    assert translated.hostname == "api.ns.svc.example.org" and translated.ports == (PortMapping(80, 0),)


def test_a_headless_service_has_no_vips() -> None:
    (svc,) = translate_objects([service("db", clusterIP="None", clusterIPs=["None"], ports=[])]).services
    assert svc.vips == ()


def test_an_empty_selector_selects_nothing_and_external_names_are_skipped() -> None:
    objects = [
        service("empty", selector={}, clusterIPs=["198.19.0.1"], ports=[{"port": 80}]),
        service("ext", type="ExternalName", externalName="example.org"),
        pod(labels={"app": "x"}),
    ]
    config = translate_objects(objects)
    assert [s.name for s in config.services] == ["empty"]
    assert config.workloads[0].services == {}


# -- fuzz: any well-shaped objects translate without an exception --------------------------------------------------
_text = st.text(alphabet="abcxyz-0123456789.:/", max_size=12)
_port = st.one_of(st.integers(-5, 70000), _text, st.none())
_labels = st.dictionaries(st.sampled_from(["app", "version", "tier"]), st.sampled_from(["a", "b", ""]), max_size=3)


@st.composite
def _pods(draw: st.DrawFn) -> Obj:
    ports = draw(st.lists(st.fixed_dictionaries({"name": _text, "containerPort": _port}), max_size=3))
    ip = draw(st.one_of(st.none(), _text, st.ip_addresses().map(str)))
    obj = pod(draw(_text) or "p", labels=draw(_labels), ip=ip, ports=ports)
    if draw(st.booleans()):
        obj["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": draw(_text), "controller": True}]
    return obj


@st.composite
def _services(draw: st.DrawFn) -> Obj:
    ports = draw(st.lists(st.fixed_dictionaries({"port": _port, "targetPort": _port}), max_size=3))
    selector = draw(st.one_of(st.none(), _labels))
    ips = draw(st.lists(st.one_of(_text, st.just("None"), st.ip_addresses().map(str)), max_size=2))
    return service(draw(_text) or "s", selector=selector, clusterIPs=ips, ports=ports)


@settings(max_examples=200, deadline=None)
@given(st.lists(_pods(), max_size=4), st.lists(_services(), max_size=3))
def test_translating_arbitrary_pods_and_services_never_raises_and_renders(pods: list[Obj], svcs: list[Obj]) -> None:
    config = translate_objects([*pods, *svcs])
    render_local_config(config)
    for workload in config.workloads:
        for ports in workload.services.values():
            assert all(0 < p.service_port < 65536 and 0 < p.target_port < 65536 for p in ports)
