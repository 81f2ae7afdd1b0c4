"""The mesh config's ``serviceEntryVisibility`` in the translation (Istio's TestServiceEntryVisibility, pure form):
a namespace-local entry is invisible outside its namespace and never shadows a public entry that shares its host,
even when it is older; the ``istio.io/VisibilityApplied`` condition says what each entry got, only while the
feature is configured; ``NONE`` leaves an entry out; ``defaultServiceExportTo`` is the default ``exportTo``."""

from __future__ import annotations

import ipaddress
from typing import Any

import dns.message
import pytest
from workload_builders import first

from ambit.controlplane.translate import Translation, TranslationMemo, translate_all
from ambit.controlplane.translate.visibility import VISIBILITY_APPLIED
from ambit.dns.answer import Answered, DnsClient, Forward, decide
from ambit.model.state import WorkloadState
from ambit.model.workload import Service, Visibility
from ambit.proxy.plans import NodeView, OutboundFacts, Plain, Tunnel, plan_outbound

Obj = dict[str, Any]

UPSTREAM_PATCH = """serviceEntryVisibility:
  applyToSidecars: true
  defaultVisibility: NAMESPACE
  policies:
  - visibility: PUBLIC
    matchingRules:
    - namespaceSelector:
        matchLabels:
          se-visibility: public
"""
SHADOW = "visibility-shadow.internal"
LOCAL_ONLY = "visibility-local-only.internal"
PUBLIC_MESSAGE = "ServiceEntry is visible to the entire mesh (PUBLIC)."
NAMESPACE_MESSAGE = (
    "ServiceEntry is visible only within its own namespace (NAMESPACE), per mesh serviceEntryVisibility."
)


def namespace(name: str, **labels: str) -> Obj:
    return {"metadata": {"name": name, "labels": {"istio.io/dataplane-mode": "ambient", **labels}}}


NAMESPACES = [
    namespace("istio-system"),
    namespace("echo"),
    namespace("vis-local"),
    namespace("vis-public", **{"se-visibility": "public"}),
]


def mesh(text: str | None, version: str = "1") -> Obj:
    meta = {"name": "istio", "namespace": "istio-system", "uid": "mesh-uid", "resourceVersion": version}
    return {"metadata": meta, "data": {} if text is None else {"mesh": text}}


def pod(name: str, ns: str, ip: str, app: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": {"app": app}},
        "spec": {"nodeName": "node1", "serviceAccountName": "default"},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def entry(name: str, ns: str, host: str, app: str, created: str, vip: str, **spec: Any) -> Obj:
    """A ServiceEntry as the upstream test writes it, with the address the control plane allocated."""
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "generation": 2,
            "creationTimestamp": created,
        },
        "spec": {
            "hosts": [host],
            "ports": [{"name": "http", "number": 80, "protocol": "HTTP", "targetPort": 8080}],
            "location": "MESH_INTERNAL",
            "resolution": "STATIC",
            "workloadSelector": {"labels": {"app": app}},
            **spec,
        },
        "status": {"addresses": [{"host": host, "value": vip}]},
    }


PODS = [
    pod("client-0", "echo", "198.18.16.2", "captured"),
    pod("shadowlocal-0", "vis-local", "198.18.16.3", "shadowlocal"),
    pod("shadowpublic-0", "vis-public", "198.18.16.4", "shadowpublic"),
]
# Created in the upstream test's order: the namespace-local entry first, so it is the older one.
SHADOW_LOCAL = entry("shadow-local", "vis-local", SHADOW, "shadowlocal", "2026-12-03T10:00:00Z", "240.240.0.1")
SHADOW_PUBLIC = entry("shadow-public", "vis-public", SHADOW, "shadowpublic", "2026-12-03T10:00:01Z", "240.240.0.2")
LOCAL_ONLY_ENTRY = entry("local-only", "vis-local", LOCAL_ONLY, "shadowlocal", "2026-12-03T10:00:02Z", "240.240.0.3")
ENTRIES = [SHADOW_LOCAL, SHADOW_PUBLIC, LOCAL_ONLY_ENTRY]


def translate(
    mesh_text: str | None, entries: list[Obj] = ENTRIES, memo: TranslationMemo | None = None, **kw: Any
) -> Translation:
    return translate_all(
        PODS,
        kw.pop("services", []),
        [],
        kw.pop("namespaces", NAMESPACES),
        service_entries=entries,
        config_maps=[mesh(mesh_text, kw.pop("version", "1"))],
        translation_memo=memo,
        **kw,
    )


def services(translation: Translation) -> dict[str, Service]:
    return {f"{s.namespace}/{s.name}": s for s in translation.config.services}


def conditions(translation: Translation) -> dict[str, tuple[bool, str, str, int]]:
    return {
        s.key: (s.accepted, s.reason, s.message, s.generation)
        for s in translation.service_entry_status
        if s.type == VISIBILITY_APPLIED
    }


def connect(translation: Translation, host: str, client_ns: str = "echo") -> Plain | Tunnel | None:
    """What a pod of ``client_ns`` gets for ``host``:80: the DNS proxy's answer, then the node proxy's plan."""
    state = WorkloadState()
    state.replace_all(translation.config.workloads, translation.config.services)
    answer = decide(state, DnsClient(namespace=client_ns), dns.message.make_query(host, "A"))
    if isinstance(answer, Forward):
        return None
    assert isinstance(answer, Answered)
    (rrset,) = [r for r in answer.response.answer if r.rdtype == 1]
    address = str(rrset[0])
    source = next(w for w in translation.config.workloads if w.namespace == client_ns)
    node = NodeView("", "node1", {source.uid})
    plan = plan_outbound(OutboundFacts(ipaddress.ip_address(address), address, 80, source), state, node, first)
    assert isinstance(plan, Plain | Tunnel)
    return plan


def test_the_upstream_scenario_resolves_the_shared_host_to_the_public_backend() -> None:
    translation = translate(UPSTREAM_PATCH)
    by_name = services(translation)
    assert by_name["vis-local/shadow-local"].visibility is Visibility.NAMESPACE
    assert by_name["vis-local/local-only"].visibility is Visibility.NAMESPACE
    assert by_name["vis-public/shadow-public"].visibility is Visibility.PUBLIC
    # The older entry is namespace-local, so the public one is canonical (istiod's canonical guard).
    assert by_name["vis-public/shadow-public"].canonical and not by_name["vis-local/shadow-local"].canonical

    plan = connect(translation, SHADOW)
    assert plan is not None and plan.destination.workload is not None
    assert plan.destination.workload.name == "shadowpublic-0"
    assert connect(translation, LOCAL_ONLY) is None  # not resolvable outside its namespace: the name goes upstream

    inside = connect(translation, SHADOW, client_ns="vis-local")  # its own namespace still sees the local entry
    assert inside is not None and inside.destination.workload is not None
    assert inside.destination.workload.name == "shadowlocal-0"


def test_without_the_mesh_config_the_older_entry_shadows_and_no_condition_is_written() -> None:
    translation = translate(None)
    by_name = services(translation)
    assert all(s.visibility is Visibility.PUBLIC for s in by_name.values())
    assert by_name["vis-local/shadow-local"].canonical
    assert conditions(translation) == {}


def test_the_condition_says_what_each_entry_got_as_istiod_writes_it() -> None:
    assert conditions(translate(UPSTREAM_PATCH)) == {
        "vis-local/shadow-local": (True, "Namespace", NAMESPACE_MESSAGE, 2),
        "vis-local/local-only": (True, "Namespace", NAMESPACE_MESSAGE, 2),
        "vis-public/shadow-public": (True, "Public", PUBLIC_MESSAGE, 2),
    }


def test_a_mesh_edit_applies_on_the_next_translation_and_a_removal_drops_the_conditions() -> None:
    memo = TranslationMemo()
    assert conditions(translate(UPSTREAM_PATCH, memo=memo))
    public = translate("serviceEntryVisibility: {defaultVisibility: PUBLIC}", memo=memo, version="2")
    assert {c[1] for c in conditions(public).values()} == {"Public"}
    assert all(s.visibility is Visibility.PUBLIC for s in public.config.services)
    cleared = translate("", memo=memo, version="3")
    assert conditions(cleared) == {}


def test_a_bad_mesh_edit_keeps_the_previous_visibility_and_is_reported_on_the_config_map() -> None:
    memo = TranslationMemo()
    translate(UPSTREAM_PATCH, memo=memo)
    broken = translate("serviceEntryVisibility: [", memo=memo, version="2")
    assert services(broken)["vis-local/shadow-local"].visibility is Visibility.NAMESPACE
    assert conditions(broken)["vis-local/shadow-local"][1] == "Namespace"
    (problem,) = [s for s in broken.skipped if s.kind == "ConfigMap"]
    assert (problem.namespace, problem.name, problem.field) == ("istio-system", "istio", "data.mesh")
    assert "not YAML" in problem.reason and "previous mesh config stays in force" in problem.reason


def test_an_entry_the_mesh_makes_none_is_left_out_and_frees_its_host() -> None:
    text = UPSTREAM_PATCH.replace("defaultVisibility: NAMESPACE", "defaultVisibility: NONE")
    translation = translate(text)
    assert set(services(translation)) == {"vis-public/shadow-public"}
    assert "vis-local/shadow-local" not in conditions(translation)
    reasons = [s.reason for s in translation.skipped if s.kind == "ServiceEntry"]
    assert len(reasons) == 2 and all("visible to no one (NONE)" in r for r in reasons)


def test_export_to_still_narrows_a_public_entry() -> None:
    own = entry(
        "own", "vis-public", "own.internal", "shadowpublic", "2026-12-03T10:00:03Z", "240.240.0.4", exportTo=["."]
    )
    translation = translate(UPSTREAM_PATCH, entries=[*ENTRIES, own])
    assert services(translation)["vis-public/own"].visibility is Visibility.NAMESPACE
    assert conditions(translation)["vis-public/own"][1] == "Namespace"  # what the data plane got


@pytest.mark.parametrize(("export", "expected"), [(["."], Visibility.NAMESPACE), (["*"], Visibility.PUBLIC)])
def test_default_service_export_to_applies_to_entries_and_services_that_give_none(
    export: list[str], expected: Visibility
) -> None:
    svc = {
        "metadata": {"name": "web", "namespace": "echo", "uid": "uid-web", "resourceVersion": "1"},
        "spec": {"clusterIP": "198.19.0.10", "ports": [{"port": 80}], "selector": {"app": "captured"}},
    }
    memo = TranslationMemo()
    translation = translate(f"defaultServiceExportTo: {export}", services=[svc], memo=memo)
    by_name = services(translation)
    assert by_name["echo/web"].visibility is expected
    assert by_name["vis-public/shadow-public"].visibility is expected
    assert conditions(translation) == {}  # serviceEntryVisibility is not configured
    # The Service's memoized translation follows a change of the default.
    assert services(translate("", services=[svc], memo=memo, version="2"))["echo/web"].visibility is Visibility.PUBLIC


def test_a_namespace_only_entry_never_binds_to_a_waypoint_in_another_namespace() -> None:
    gateway = {
        "metadata": {"name": "egress", "namespace": "echo"},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [
                {"name": "mesh", "port": 15008, "protocol": "HBONE", "allowedRoutes": {"namespaces": {"from": "All"}}}
            ],
        },
        "status": {"addresses": [{"type": "Hostname", "value": "egress.echo.svc.cluster.local"}]},
    }
    bound = entry("bound", "vis-local", "bound.internal", "shadowlocal", "2026-12-03T10:00:04Z", "240.240.0.5")
    bound["metadata"]["labels"] = {"istio.io/use-waypoint": "egress", "istio.io/use-waypoint-namespace": "echo"}
    translation = translate(UPSTREAM_PATCH, entries=[bound], gateways=[gateway])
    assert services(translation)["vis-local/bound"].waypoint is None
    (status,) = [s for s in translation.service_entry_status if s.type == "istio.io/WaypointBound"]
    assert status.reason == "CrossNamespaceWaypointForbidden"
    # Public by the mesh config: it binds.
    public = translate(None, entries=[bound], gateways=[gateway])
    assert services(public)["vis-local/bound"].waypoint is not None
