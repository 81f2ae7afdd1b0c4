"""Hand-added EndpointSlice endpoints become HOST_NETWORK workloads (controlplane/translate/endpointslices.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.endpointslices import endpoint_slice_workloads, gives_workloads
from ambit.controlplane.translate.skips import Skipped
from ambit.model.workload import HealthStatus, NetworkMode, PortMapping, TunnelProtocol, parse_ip

KUBERNETES = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "kubernetes", "namespace": "default"},
    "spec": {"clusterIP": "198.19.0.1", "clusterIPs": ["198.19.0.1"], "ports": [{"name": "https", "port": 443}]},
}


def api_slice(*endpoints: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kubernetes",
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": "kubernetes"},
        },
        "addressType": "IPv4",
        "endpoints": list(endpoints),
        "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
        **extra,
    }


def workloads(
    slices: list[dict[str, Any]], services: list[dict[str, Any]] | None = None
) -> tuple[list[Any], list[Skipped]]:
    skips: list[Skipped] = []
    out = list(
        endpoint_slice_workloads(
            slices,
            [KUBERNETES] if services is None else services,
            domain="cluster.local",
            cluster_id="Kubernetes",
            trust_domain="cluster.local",
            network="",
            skips=skips,
        )
    )
    return out, skips


def test_the_api_servers_endpoint_is_a_host_network_workload_of_the_kubernetes_service() -> None:
    (w,), skips = workloads([api_slice({"addresses": ["198.18.0.1"]})])
    assert skips == []
    assert w.uid == "Kubernetes/discovery.k8s.io/EndpointSlice/default/kubernetes/198.18.0.1"
    assert (w.name, w.namespace, w.addresses) == ("kubernetes", "default", (parse_ip("198.18.0.1"),))
    assert w.network_mode is NetworkMode.HOST_NETWORK and w.tunnel_protocol is TunnelProtocol.NONE
    assert w.status is HealthStatus.HEALTHY and w.waypoint is None and w.authorization_policies == ()
    assert w.services == {"default/kubernetes.default.svc.cluster.local": (PortMapping(443, 6443),)}


def test_pod_endpoints_fqdn_slices_and_slices_of_no_service_add_nothing() -> None:
    pod = {"addresses": ["198.18.1.5"], "targetRef": {"kind": "Pod", "name": "p", "namespace": "default"}}
    assert workloads([api_slice(pod)])[0] == []
    assert workloads([api_slice({"addresses": ["api.example.com"]}, addressType="FQDN")])[0] == []
    orphan = api_slice({"addresses": ["198.18.0.1"]})
    orphan["metadata"]["labels"] = {"kubernetes.io/service-name": "missing"}
    assert workloads([orphan])[0] == []
    unlabelled = api_slice({"addresses": ["198.18.0.1"]})
    unlabelled["metadata"]["labels"] = {}
    assert workloads([unlabelled])[0] == []
    external_name = {**KUBERNETES, "spec": {"type": "ExternalName", "externalName": "example.com"}}
    assert workloads([api_slice({"addresses": ["198.18.0.1"]})], [external_name])[0] == []


def test_readiness_duplicates_and_bad_addresses() -> None:
    out, skips = workloads(
        [
            api_slice(
                {"addresses": ["198.18.0.1"], "conditions": {"ready": False}},
                {"addresses": ["198.18.0.1"]},
                {"addresses": ["not-an-ip"]},
                {"addresses": []},
                {"addresses": ["198.18.0.2"], "conditions": {"ready": True}},
            )
        ]
    )
    assert [(str(w.addresses[0]), w.status) for w in out] == [
        ("198.18.0.1", HealthStatus.UNHEALTHY),
        ("198.18.0.2", HealthStatus.HEALTHY),
    ]
    assert [s.field for s in skips] == ["endpoints[2].addresses"]


def test_only_named_tcp_ports_of_the_service_map() -> None:
    svc = {
        **KUBERNETES,
        "spec": {"ports": [{"name": "https", "port": 443}, {"name": "dns", "port": 53, "protocol": "UDP"}]},
    }
    eps = api_slice(
        {"addresses": ["198.18.0.1"]},
        ports=[
            {"name": "https", "port": 6443},
            {"name": "dns", "port": 5353, "protocol": "UDP"},
            {"port": 7000},
            {"name": "other", "port": 7001},
        ],
    )
    (w,), _ = workloads([eps], [svc])
    assert w.services == {"default/kubernetes.default.svc.cluster.local": (PortMapping(443, 6443),)}


def test_translate_all_serves_the_endpoint_beside_the_service() -> None:
    translation = translate_all(
        pods=[], services=[KUBERNETES], endpoint_slices=[api_slice({"addresses": ["198.18.0.1"]})], namespaces=[]
    )
    uids = [w.uid for w in translation.config.workloads]
    assert uids == ["Kubernetes/discovery.k8s.io/EndpointSlice/default/kubernetes/198.18.0.1"]


junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


@given(
    endpoints=st.lists(st.dictionaries(st.sampled_from(["addresses", "conditions", "targetRef"]), junk), max_size=4),
    ports=junk,
    address_type=junk,
)
def test_hostile_slices_never_raise(endpoints: list[dict[str, Any]], ports: Any, address_type: Any) -> None:
    eps = api_slice(*endpoints, ports=ports if isinstance(ports, list) else [], addressType=address_type)
    out, skips = workloads([eps])  # no exception, whatever the slice holds
    assert len(out) + len(skips) <= len(endpoints)


@given(
    endpoints=st.lists(
        st.dictionaries(st.sampled_from(["addresses", "conditions", "targetRef"]), junk) | junk, max_size=4
    ),
    ports=junk,
)
def test_a_slice_said_to_give_nothing_gives_no_workload_and_no_skip(endpoints: list[Any], ports: Any) -> None:
    eps = api_slice(*endpoints, ports=ports if isinstance(ports, list) else [])
    out, skips = workloads([eps])  # rule 6: the stage memo relies on this to keep the previous output
    if not gives_workloads(eps):
        assert not out and not skips


def test_only_an_endpoint_without_a_pod_behind_it_makes_a_slice_give_workloads() -> None:
    pod = {"addresses": ["198.18.0.5"], "targetRef": {"kind": "Pod", "name": "p"}}
    assert not gives_workloads(api_slice(pod, pod))
    assert gives_workloads(api_slice(pod, {"addresses": ["10.9.9.9"]}))
    assert gives_workloads(api_slice({"addresses": ["10.9.9.9"], "targetRef": {"kind": "Node", "name": "n"}}))
