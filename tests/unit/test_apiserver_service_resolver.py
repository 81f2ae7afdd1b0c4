"""Webhook Service references resolve to a ready endpoint and the port the Service targets."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.apiserver.service_resolver import NoEndpointError, resolve_service

SVC: dict[str, Any] = {
    "metadata": {"name": "istiod", "namespace": "istio-system"},
    "spec": {"ports": [{"name": "https-webhook", "port": 443, "targetPort": 15017}, {"name": "grpc", "port": 15012}]},
}


def _slice(*endpoints: tuple[str, bool], port_name: str = "https-webhook", port: int = 15017) -> dict[str, Any]:
    return {
        "ports": [{"name": port_name, "port": port}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}} for ip, ready in endpoints],
    }


def test_the_first_ready_endpoint_and_the_target_port() -> None:
    slices = [_slice(("198.18.1.5", False), ("198.18.2.7", True))]
    assert resolve_service(SVC, slices, "istio-system", "istiod", 443) == "https://198.18.2.7:15017"


def test_a_named_target_port_takes_the_number_from_the_slice() -> None:
    svc = {"spec": {"ports": [{"name": "https-webhook", "port": 443, "targetPort": "webhook"}]}}
    slices = [_slice(("198.18.1.5", True), port=9443)]
    assert resolve_service(svc, slices, "ns", "x", 443) == "https://198.18.1.5:9443"


def test_ipv6_endpoints_are_bracketed() -> None:
    assert resolve_service(SVC, [_slice(("fd00::5", True))], "ns", "x", 443) == "https://[fd00::5]:15017"


@pytest.mark.parametrize(
    ("service", "slices", "port", "message"),
    [
        (None, [], 443, 'service "istiod" not found'),
        (SVC, [], 80, "has no port 80"),
        (SVC, [_slice(("198.18.1.5", False))], 443, "no ready endpoint"),
        ({"spec": {"type": "ExternalName"}}, [], 443, "ExternalName"),
    ],
)
def test_what_cannot_be_dialled_is_a_clear_error(
    service: dict[str, Any] | None, slices: list[dict[str, Any]], port: int, message: str
) -> None:
    with pytest.raises(NoEndpointError, match=message):
        resolve_service(service, slices, "istio-system", "istiod", port)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=10), children, max_size=3),
    max_leaves=15,
)


@given(
    st.fixed_dictionaries({"spec": st.fixed_dictionaries({"ports": json_values, "type": json_values})}),
    st.lists(st.fixed_dictionaries({"ports": json_values, "endpoints": json_values}), max_size=3),
)
def test_any_shapes_resolve_or_raise_the_clear_error(service: Any, slices: Any) -> None:
    with contextlib.suppress(NoEndpointError):
        resolve_service(service, slices, "ns", "x", 443)


def test_the_store_resolver_reads_the_services_labelled_slices(tmp_path: Any) -> None:
    from ambit.apiserver.service_resolver import StoreServiceResolver
    from ambit.apiserver.store import Store

    store = Store(tmp_path / "state.db")
    try:
        svc = {**SVC, "metadata": {"name": "istiod", "namespace": "istio-system"}}
        store.put("ADDED", ("", "services"), "istio-system", "istiod", svc)
        labelled = {
            "metadata": {"name": "istiod-abc", "labels": {"kubernetes.io/service-name": "istiod"}},
            **_slice(("198.18.1.9", True)),
        }
        other = {
            "metadata": {"name": "x", "labels": {"kubernetes.io/service-name": "other"}},
            **_slice(("1.1.1.1", True)),
        }
        store.put("ADDED", ("discovery.k8s.io", "endpointslices"), "istio-system", "x", other)
        store.put("ADDED", ("discovery.k8s.io", "endpointslices"), "istio-system", "istiod-abc", labelled)
        assert StoreServiceResolver(store)("istio-system", "istiod", 443) == "https://198.18.1.9:15017"
        with pytest.raises(NoEndpointError):
            StoreServiceResolver(store)("istio-system", "missing", 443)
    finally:
        store.close()
