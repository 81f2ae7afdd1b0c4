"""The scale harness (bench/scale): its churn (cluster.py) writes what kube's EndpointSlice controller would after each
pod change: the pod's Service's whole slice, with the pod added, removed or not ready; a label change writes none. The
run reads the control plane's convergence histogram off its metrics page."""

from __future__ import annotations

import json
from typing import Any

import pytest
from bench.scale.cluster import ClusterShape, Request, churn, churn_pods, creates, demanded_pods, slice_name
from bench.scale.run import convergence_buckets, convergence_shares, fan_out, series_totals

SHAPE = ClusterShape(namespaces=2, services=4, pods=16, policies=0, nodes=2)


def _chain(request: Request) -> list[Request]:
    out: list[Request] = []
    step: Request | None = request
    while step is not None:
        out.append(step)
        step = step.then
    return out


def _slice_pods(request: Request) -> dict[str, bool]:
    assert request.body is not None
    body: dict[str, Any] = json.loads(request.body)
    return {e["targetRef"]["name"]: e["conditions"]["ready"] for e in body["endpoints"]}


def test_loading_writes_one_slice_per_service_with_its_ready_pods_after_the_pods() -> None:
    phases = creates(SHAPE)
    assert list(phases) == ["namespaces", "services", "pods", "endpoint_slices", "policies"]
    slices = phases["endpoint_slices"]
    assert len(slices) == SHAPE.services
    assert _slice_pods(slices[1]) == {SHAPE.pod_name(i): True for i in (1, 5, 9, 13)}


def test_each_change_is_followed_by_its_services_slice_as_the_controller_would_write_it() -> None:
    requests = churn(SHAPE, 4)  # add pod 16, delete pod 15, unready pod 14, relabel pod 13
    add, delete, unready, relabel = (_chain(r) for r in requests)
    assert [r.method for r in add] == ["POST", "PATCH", "PUT"]  # create, status, slice
    assert add[-1].path.endswith(f"/endpointslices/{slice_name(0)}")
    assert _slice_pods(add[-1]) == {SHAPE.pod_name(i): True for i in (0, 4, 8, 12, 16)}
    assert [r.method for r in delete] == ["DELETE", "PUT"]
    assert _slice_pods(delete[-1]) == {SHAPE.pod_name(i): True for i in (3, 7, 11)}
    assert [r.method for r in unready] == ["PATCH", "PUT"]
    assert _slice_pods(unready[-1]) == {**{SHAPE.pod_name(i): True for i in (2, 6, 10)}, SHAPE.pod_name(14): False}
    assert [r.method for r in relabel] == ["PATCH"]
    assert [r.tag for r in requests] == [SHAPE.workload(i) for i in (16, 15, 14, 13)]


def test_on_demand_clients_look_up_loaded_and_added_pods_and_each_change_names_its_pod() -> None:
    changes = 8
    pods = churn_pods(SHAPE, changes)
    assert [SHAPE.workload(i) for i in pods] == [r.tag for r in churn(SHAPE, changes)]
    assert pods[:4] == [16, 15, 14, 13]
    drawn = [demanded_pods(SHAPE, client, 5, changes) for client in range(3)]
    assert drawn == [demanded_pods(SHAPE, client, 5, changes) for client in range(3)]  # the same in every run
    assert all(len(set(d)) == 5 and all(0 <= i < SHAPE.pods + 2 for i in d) for d in drawn)
    assert demanded_pods(SHAPE, 0, 100, changes) == list(range(SHAPE.pods + 2))  # at most every pod


def test_the_control_planes_convergence_is_read_from_its_metrics_page() -> None:
    page = "\n".join(
        [
            "# TYPE pilot_proxy_convergence_time histogram",
            'pilot_proxy_convergence_time_bucket{le="0.1"} 5',
            'pilot_proxy_convergence_time_bucket{le="0.5"} 10',
            'pilot_proxy_convergence_time_bucket{le="1.0"} 12',
            'pilot_proxy_convergence_time_bucket{le="+Inf"} 20',
            "pilot_proxy_convergence_time_sum 9.5",
            'pilot_xds_push_time_bucket{le="0.5"} 99',
        ]
    )
    before = {0.5: 2.0, 1.0: 2.0, float("inf"): 4.0}
    assert convergence_buckets(page) == {0.1: 5.0, 0.5: 10.0, 1.0: 12.0, float("inf"): 20.0}
    assert convergence_shares(before, convergence_buckets(page)) == {0.5: 0.5, 1.0: 0.625}
    assert convergence_shares(before, before) == {}  # no push between the scrapes


def test_the_churn_s_translations_debounce_and_writes_are_totalled_from_the_metrics_page() -> None:
    page = "\n".join(
        [
            "# TYPE pilot_pushcontext_init_seconds histogram",
            'pilot_pushcontext_init_seconds_bucket{le="0.1"} 3',
            "pilot_pushcontext_init_seconds_sum 0.75",
            "pilot_pushcontext_init_seconds_count 4",
            "pilot_debounce_time_sum 2.5",
            "pilot_debounce_time_count 4",
            'pilot_xds_pushes{type="wds"} 7',
            'pilot_xds_pushes{type="authz"} 3',
            'pilot_xds_push_time_sum{type="wds"} 9',
            "pilot_proxy_convergence_time_sum 9.5",
        ]
    )
    assert series_totals(page) == {
        "pilot_pushcontext_init_seconds_sum": 0.75,
        "pilot_pushcontext_init_seconds_count": 4.0,
        "pilot_debounce_time_sum": 2.5,
        "pilot_debounce_time_count": 4.0,
        "pilot_xds_pushes": 10.0,
    }
    assert series_totals("pilot_xds_pushes_total 2") == {"pilot_xds_pushes": 2.0}


def test_a_change_s_latency_splits_into_its_first_client_and_the_fan_out() -> None:
    spread = fan_out([10.0, 20.0, 30.0], [[10.5, 11.0, None], [None, None, None], [30.2, 30.1, 30.9]])
    assert spread.first == pytest.approx([0.5, 0.1])  # a change nobody read is left out
    assert spread.spread == pytest.approx([0.5, 0.8])
