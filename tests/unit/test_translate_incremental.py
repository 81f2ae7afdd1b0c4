"""Incremental translation (issue 22): with a :class:`TranslationMemo` and an address cache, a pod change re-translates
and re-encodes that pod only, and the result is always what a translation from scratch gives.

The golden inputs are translated twice through one memo (every pod reused the second time, output unchanged); a
hypothesis sequence of pod and Service changes compares the memoized translation with a fresh one after each step.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.addresses import AddressCache, addresses
from ambit.controlplane.translate import TranslationMemo, translate_all
from ambit.controlplane.translate.index import SERVICE_NAME_LABEL as SLICE_OWNER

GOLDEN = Path(__file__).parent / "golden" / "translate"
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


def _stamp(obj: dict[str, Any], version: int) -> dict[str, Any]:
    meta = obj.setdefault("metadata", {})
    meta.setdefault("uid", f"uid-{meta.get('namespace', '')}-{meta.get('name', '')}")
    meta["resourceVersion"] = str(version)
    return obj


def _golden(case: Path) -> dict[str, list[dict[str, Any]]]:
    by_kind: dict[str, list[dict[str, Any]]] = {name: [] for name in KINDS.values()}
    for doc in yaml.safe_load_all(case.read_text()):
        if doc:
            by_kind[KINDS[doc["kind"]]].append(_stamp(doc, 1))
    return by_kind


def test_every_golden_case_translates_the_same_through_the_memo_and_reuses_every_pod_the_second_time() -> None:
    for case in sorted(GOLDEN.glob("*-in.yaml")):
        inputs = _golden(case)
        memo = TranslationMemo()
        fresh = translate_all(**inputs)
        first = translate_all(**inputs, translation_memo=memo)
        second = translate_all(**inputs, translation_memo=memo)
        assert first == fresh == second, case.name
        assert memo.hits == len(memo.pods) == len(inputs["pods"]), case.name


def _pod(i: int, *, app: str, version: str = "v1", ready: bool = True, rv: int = 1) -> dict[str, Any]:
    return _stamp(
        {
            "metadata": {"name": f"pod-{i}", "namespace": "ns", "labels": {"app": app, "version": version}},
            "spec": {"nodeName": "node-1"},
            "status": {
                "phase": "Running",
                "podIP": f"198.18.0.{i + 1}",
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        },
        rv,
    )


def _service(name: str, app: str, rv: int = 1) -> dict[str, Any]:
    return _stamp(
        {
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"clusterIP": "198.19.0.1", "selector": {"app": app}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
        rv,
    )


NAMESPACE = {"metadata": {"name": "ns", "uid": "ns-uid", "resourceVersion": "1"}}
POLICY = _stamp(
    {
        "metadata": {"name": "allow-a", "namespace": "ns"},
        "spec": {"selector": {"matchLabels": {"app": "a"}}, "rules": [{}]},
    },
    1,
)


def test_a_pod_change_retranslates_that_pod_only_and_a_service_change_retranslates_all() -> None:
    pods = [_pod(i, app="a") for i in range(5)]
    services = [_service("svc", "a")]
    memo, cache = TranslationMemo(), AddressCache()
    translate_all(pods, services, [], [NAMESPACE], authorization_policies=[POLICY], translation_memo=memo)
    pods[2] = _pod(2, app="a", ready=False, rv=2)
    result = translate_all(pods, services, [], [NAMESPACE], authorization_policies=[POLICY], translation_memo=memo)
    assert memo.hits == 4
    assert result == translate_all(pods, services, [], [NAMESPACE], authorization_policies=[POLICY])
    services = [_service("svc", "b", rv=2)]
    result = translate_all(pods, services, [], [NAMESPACE], authorization_policies=[POLICY], translation_memo=memo)
    assert memo.hits == 0
    assert all(not w.services for w in result.config.workloads)
    first = addresses(result.config, cache)
    assert first == addresses(result.config)
    assert addresses(result.config, cache) == first
    assert set(cache) == set(first)


def _slice(service: str, pods: list[int], rv: int) -> dict[str, Any]:
    return _stamp(
        {
            "metadata": {"name": f"{service}-abcde", "namespace": "ns", "labels": {SLICE_OWNER: service}},
            "addressType": "IPv4",
            "endpoints": [
                {
                    "addresses": [f"198.18.0.{i + 1}"],
                    "targetRef": {"kind": "Pod", "name": f"pod-{i}", "namespace": "ns"},
                }
                for i in pods
            ],
        },
        rv,
    )


def test_endpoints_coming_and_going_under_a_selector_service_keep_every_other_pod_memoized() -> None:
    """A pod added behind a Service with a selector changes that Service's EndpointSlice; the other pods' workloads
    do not depend on it (the selector decides), so they stay memoized, as with no slices at all."""
    pods = [_pod(i, app="a") for i in range(5)]
    services = [_service("svc", "a")]
    memo = TranslationMemo()
    translate_all(pods, services, [_slice("svc", [0, 1, 2, 3, 4], 1)], [NAMESPACE], translation_memo=memo)
    pods.append(_pod(5, app="a"))
    slices = [_slice("svc", [0, 1, 2, 3, 4, 5], 2)]
    result = translate_all(pods, services, slices, [NAMESPACE], translation_memo=memo)
    assert memo.hits == 5
    assert result == translate_all(pods, services, slices, [NAMESPACE])


def test_a_selectorless_service_follows_its_endpoint_slices() -> None:
    """Without a selector the slices decide which pods a Service selects: a changed slice changes them."""
    pods = [_pod(i, app="a") for i in range(3)]
    services = [_service("manual", "a")]
    del services[0]["spec"]["selector"]
    memo = TranslationMemo()
    first = translate_all(pods, services, [_slice("manual", [0], 1)], [NAMESPACE], translation_memo=memo)
    assert [bool(w.services) for w in first.config.workloads] == [True, False, False]
    slices = [_slice("manual", [0, 2], 2)]
    second = translate_all(pods, services, slices, [NAMESPACE], translation_memo=memo)
    assert [bool(w.services) for w in second.config.workloads] == [True, False, True]
    assert second == translate_all(pods, services, slices, [NAMESPACE])


CHANGES = st.lists(
    st.tuples(
        st.sampled_from(["ready", "unready", "label", "add", "delete", "service", "policy"]),
        st.integers(min_value=0, max_value=7),
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(CHANGES)
def test_memoized_translation_always_equals_a_fresh_one(changes: list[tuple[str, int]]) -> None:
    pods = {i: _pod(i, app="a" if i % 2 else "b") for i in range(4)}
    services = [_service("svc-a", "a"), _service("svc-b", "b")]
    policies = [copy.deepcopy(POLICY)]
    memo, cache = TranslationMemo(), AddressCache()
    for step, (change, i) in enumerate(changes, start=2):
        if change in ("ready", "unready", "label", "add"):
            old = pods.get(i)
            app = old["metadata"]["labels"]["app"] if old else "a"
            version = "v2" if change == "label" else "v1"
            pods[i] = _pod(i, app=app, version=version, ready=change != "unready", rv=step)
        elif change == "delete":
            pods.pop(i, None)
        elif change == "service":
            services[i % 2] = _service(f"svc-{'ab'[i % 2]}", "ab"[(i // 2) % 2], rv=step)
        else:
            policies = [_stamp(copy.deepcopy(POLICY), step)] if i % 2 else []
        pod_list = list(pods.values())
        memoized = translate_all(
            pod_list, services, [], [NAMESPACE], authorization_policies=policies, translation_memo=memo
        )
        fresh = translate_all(pod_list, services, [], [NAMESPACE], authorization_policies=policies)
        assert memoized == fresh
        assert addresses(memoized.config, cache) == addresses(fresh.config)
