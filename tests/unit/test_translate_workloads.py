"""Kubernetes objects → Workload API (spec §4.1): golden files, the rules one by one, and a fuzz test.

Golden files: ``golden/translate/<case>-in.yaml`` (API objects, any kinds, one YAML document each) is translated
and rendered with ``render_local_config`` and compared with ``<case>-out.yaml``; what the translation left out is
compared with ``<case>-skipped.yaml`` (which exists only for cases that skip something), and the ``ZtunnelAccepted``
status of each AuthorizationPolicy with ``<case>-status.yaml`` (only for cases with policies). Cases listed in
``CASE_OPTIONS`` translate with those options. ``AMBIT_UPDATE_GOLDEN=1 pytest ...`` rewrites the outputs.
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

from ambit.controlplane.translate import SkipMemory, Skipped, Translation, translate, translate_all
from ambit.model.localconfig import LocalConfig, parse_local_config, render_local_config
from ambit.model.workload import HealthStatus, PortMapping, TunnelProtocol

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
Obj = dict[str, Any]


def by_kind(objects: list[Obj]) -> dict[str, list[Obj]]:
    out: dict[str, list[Obj]] = {name: [] for name in KINDS.values()}
    for obj in objects:
        out[KINDS[obj["kind"]]].append(obj)
    return out


def translate_objects(objects: list[Obj], **options: Any) -> LocalConfig:
    return translate(**by_kind(objects), **options)


def translate_all_objects(objects: list[Obj], **options: Any) -> Translation:
    return translate_all(**by_kind(objects), **options)


def render_skipped(skipped: tuple[Skipped, ...]) -> str:
    rows = [{"object": f"{s.kind} {s.namespace}/{s.name}", "field": s.field, "reason": s.reason} for s in skipped]
    return yaml.safe_dump(rows, sort_keys=False, width=200)


def test_every_expected_golden_case_exists() -> None:
    expected = {
        "plain_pods",
        "named_ports",
        "headless",
        "unready",
        "terminating",
        "ambient",
        "no_selector",
        "serviceentry_inline",
        "serviceentry_selector",
        "workloadentry",
        "skipped",
        "policy_l4",
        "policy_unsupported",
        "policy_dry_run",
        "peerauth_levels",
        "peerauth_ports",
        "locality",
        "ip_families",
        "app_protocols",
        "host_network",
        "canonical",
        "waypoint",
        "waypoint_canary",
    }
    assert expected <= set(CASES)


def render_status(translation: Translation) -> str:
    rows = [
        {
            "policy": s.key,
            "type": s.type,
            "status": "True" if s.accepted else "False",
            "reason": s.reason,
            "message": s.message,
            "observedGeneration": s.generation,
        }
        for s in translation.policy_status
    ]
    for what, statuses in (("service", translation.service_status), ("serviceEntry", translation.service_entry_status)):
        rows.extend(
            {
                what: s.key,
                "type": s.type,
                "status": "True" if s.accepted else "False",
                "reason": s.reason,
                "message": s.message,
                "observedGeneration": s.generation,
            }
            for s in statuses
        )
    return yaml.safe_dump(rows, sort_keys=False, width=200)


def _has_status(translation: Translation) -> bool:
    return bool(translation.policy_status or translation.service_status or translation.service_entry_status)


@pytest.mark.parametrize("case", CASES)
def test_translation_matches_its_golden_file(case: str) -> None:
    objects = [doc for doc in yaml.safe_load_all((GOLDEN / f"{case}-in.yaml").read_text()) if doc]
    translation = translate_all_objects(objects, **CASE_OPTIONS.get(case, {}))
    text = render_local_config(translation.config)
    path = GOLDEN / f"{case}-out.yaml"
    skipped_path = GOLDEN / f"{case}-skipped.yaml"
    status_path = GOLDEN / f"{case}-status.yaml"
    if os.environ.get("AMBIT_UPDATE_GOLDEN"):
        path.write_text(text)
        if _has_status(translation):
            status_path.write_text(render_status(translation))
        else:
            status_path.unlink(missing_ok=True)
        if translation.skipped:
            skipped_path.write_text(render_skipped(translation.skipped))
        else:
            skipped_path.unlink(missing_ok=True)
    assert text == path.read_text(), f"{path} differs (AMBIT_UPDATE_GOLDEN=1 rewrites it)"
    assert parse_local_config(text) == translation.config, "the rendering does not read back"
    if translation.skipped:
        assert skipped_path.exists(), f"{skipped_path} is missing (AMBIT_UPDATE_GOLDEN=1 writes it)"
        assert render_skipped(translation.skipped) == skipped_path.read_text(), f"{skipped_path} differs"
    else:
        assert not skipped_path.exists(), f"{case} skips nothing, but {skipped_path} exists"
    if _has_status(translation):
        assert render_status(translation) == status_path.read_text(), f"{status_path} differs"
    else:
        assert not status_path.exists(), f"{case} has no policy status, but {status_path} exists"


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


def test_the_http_tunnel_label_means_hbone_as_istiods_supports_tunnel() -> None:
    tunnel = "networking.istio.io/tunnel"
    pods = [
        pod("ztunnel", ip="198.18.1.1", labels={tunnel: "http"}),
        pod("listed", ip="198.18.1.2", labels={tunnel: "h2,http"}),
        pod("other", ip="198.18.1.3", labels={tunnel: "https"}),
        pod("host", ip="198.18.1.4", labels={tunnel: "http"}, hostNetwork=True),
    ]
    protocols = {w.name: w.tunnel_protocol for w in translate_objects(pods).workloads}
    assert protocols == {
        "ztunnel": TunnelProtocol.HBONE,
        "listed": TunnelProtocol.HBONE,
        "other": TunnelProtocol.NONE,
        "host": TunnelProtocol.NONE,
    }


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


# -- ServiceEntries, WorkloadEntries and what is skipped -----------------------------------------------------------
def service_entry(name: str = "se", namespace: str = "ns", **spec: Any) -> Obj:
    return {
        "kind": "ServiceEntry",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": spec,
    }


def workload_entry(name: str = "wle", namespace: str = "ns", **spec: Any) -> Obj:
    return {"kind": "WorkloadEntry", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def test_an_inline_endpoint_gets_the_service_entry_uid_with_its_address() -> None:
    se = service_entry(
        hosts=["a.example"], ports=[{"number": 80, "name": "http"}], endpoints=[{"address": "198.18.9.9"}]
    )
    (workload,) = translate_objects([se], cluster_id="east").workloads
    assert workload.uid == "east/networking.istio.io/ServiceEntry/ns/se/198.18.9.9"
    assert workload.services == {"ns/a.example": (PortMapping(80, 80),)}


def test_a_workload_entry_gets_its_uid_and_is_selected_by_a_service_entry() -> None:
    se = service_entry(
        hosts=["a.example"],
        ports=[{"number": 80, "name": "http", "targetPort": 8080}],
        workloadSelector={"labels": {"app": "a"}},
    )
    wle = workload_entry(address="198.18.9.1", labels={"app": "a"}, ports={"http": 18080})
    (workload,) = translate_objects([se, wle]).workloads
    assert workload.uid == "Kubernetes/networking.istio.io/WorkloadEntry/ns/wle"
    assert workload.services == {"ns/a.example": (PortMapping(80, 18080),)}


def test_a_dns_service_entry_endpoint_with_a_zone_id_is_neither_an_address_nor_a_host_name() -> None:
    se = service_entry(
        hosts=["a.example"],
        ports=[{"number": 80, "name": "http"}],
        resolution="DNS",
        endpoints=[{"address": "fe80::1%eth0"}, {"address": "198.18.9.9"}],
    )
    translation = translate_all_objects([se])
    assert [w.uid.rsplit("/", 1)[1] for w in translation.config.workloads] == ["198.18.9.9"]
    (skip,) = translation.skipped
    assert (skip.field, skip.reason) == (
        "spec.endpoints[0].address",
        "'fe80::1%eth0' is neither an IP address nor a host name; the endpoint is left out",
    )


def test_a_service_entry_host_cannot_take_a_kubernetes_services_key() -> None:
    svc = service("web", clusterIPs=["198.19.0.1"], ports=[{"port": 80}])
    se = service_entry(hosts=["web.ns.svc.cluster.local"], addresses=["198.19.0.2"], ports=[{"number": 80}])
    translation = translate_all_objects([svc, se])
    assert [s.name for s in translation.config.services] == ["web"]
    assert [(s.kind, s.field) for s in translation.skipped] == [("ServiceEntry", "spec.hosts[0]")]


def test_a_skip_names_the_object_the_field_and_the_reason() -> None:
    translation = translate_all_objects([service_entry("empty", ports=[{"number": 80}])])
    assert translation.config.services == ()
    (skip,) = translation.skipped
    assert (skip.kind, skip.namespace, skip.name, skip.field) == ("ServiceEntry", "ns", "empty", "spec.hosts")
    assert skip.api_version == "networking.istio.io/v1" and skip.uid == "uid-empty"
    assert skip.note.startswith("spec.hosts: required")
    assert skip.regarding() == {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": "empty", "namespace": "ns", "uid": "uid-empty"},
    }


def test_skip_memory_reports_a_problem_once_while_it_lasts_and_again_when_it_returns() -> None:
    a = Skipped("Pod", "ns", "p", "status.podIP", "bad")
    b = Skipped("WorkloadEntry", "ns", "w", "spec.address", "bad")
    memory = SkipMemory()
    assert memory.news([a]) == [a]
    assert memory.news([a, b]) == [b]
    assert memory.news([a, b]) == []
    assert memory.news([b]) == []
    assert memory.news([a, b]) == [a]
    assert memory.news([a, Skipped("Pod", "ns", "p", "status.podIP", "worse")]) != []


def test_a_translation_that_skips_nothing_reports_nothing() -> None:
    assert translate_all_objects([pod(), service("s", selector={"app": "x"}, ports=[{"port": 80}])]).skipped == ()


_maybe_ip = st.one_of(st.none(), _text, st.ip_addresses().map(str), st.just("unix:///s.sock"))


@st.composite
def _service_entries(draw: st.DrawFn) -> Obj:
    ports = draw(st.lists(st.fixed_dictionaries({"number": _port, "name": _text, "targetPort": _port}), max_size=3))
    endpoints = draw(
        st.lists(
            st.fixed_dictionaries(
                {"address": _maybe_ip, "labels": _labels, "ports": st.dictionaries(_text, _port, max_size=2)}
            ),
            max_size=3,
        )
    )
    spec: Obj = {
        "hosts": draw(st.lists(st.one_of(_text, st.just("*.x"), st.just("s.ns.svc.cluster.local")), max_size=2)),
        "addresses": draw(st.lists(st.one_of(_text, st.ip_addresses().map(str), st.just("198.19.0.0/30")), max_size=2)),
        "ports": ports,
        "resolution": draw(st.sampled_from(["STATIC", "DNS", "NONE"])),
    }
    if draw(st.booleans()):
        spec["workloadSelector"] = {"labels": draw(_labels)}
    else:
        spec["endpoints"] = endpoints
    return service_entry(draw(_text) or "se", **spec)


@st.composite
def _workload_entries(draw: st.DrawFn) -> Obj:
    ports = draw(st.one_of(st.none(), st.dictionaries(_text, _port, max_size=2), _text))
    return workload_entry(draw(_text) or "w", address=draw(_maybe_ip), labels=draw(_labels), ports=ports)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(_pods(), max_size=2),
    st.lists(_services(), max_size=2),
    st.lists(_service_entries(), max_size=3),
    st.lists(_workload_entries(), max_size=3),
)
def test_translating_arbitrary_istio_entries_never_raises_and_renders(
    pods: list[Obj], svcs: list[Obj], entries: list[Obj], wles: list[Obj]
) -> None:
    # An informer's cache holds one object per (kind, namespace, name), as does a real cluster.
    unique = {
        (o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o for o in [*pods, *svcs, *entries, *wles]
    }
    translation = translate_all_objects(list(unique.values()))
    text = render_local_config(translation.config)
    assert parse_local_config(text) == translation.config
    keys = [s.key for s in translation.config.services]
    assert len(keys) == len(set(keys)), "two services share a resource name"
    assert all(s.field and s.reason for s in translation.skipped)
