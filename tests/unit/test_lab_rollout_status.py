"""``ambit lab restart``'s judgement of a rollout (pure, :mod:`ambit.lab.cluster.rollout`): kubectl's restart patch
and ``kubectl rollout status``'s verdicts, cases after kubectl's rollout_status_test.go."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.lab.cluster.rollout import (
    COMPONENTS,
    RESTARTED_AT,
    RolloutError,
    RolloutProgress,
    daemon_set_progress,
    deployment_progress,
    restart_patch,
    rollout_progress,
)


def daemon_set(generation: int, observed: int, desired: int, updated: int, available: int, **spec: Any) -> dict:
    return {
        "metadata": {"name": "ztunnel", "generation": generation},
        "spec": spec,
        "status": {
            "observedGeneration": observed,
            "desiredNumberScheduled": desired,
            "updatedNumberScheduled": updated,
            "numberAvailable": available,
        },
    }


def deployment(generation: int, observed: int, wanted: int | None, **status: Any) -> dict:
    spec = {} if wanted is None else {"replicas": wanted}
    return {
        "metadata": {"name": "istiod", "generation": generation},
        "spec": spec,
        "status": {"observedGeneration": observed, **status},
    }


def test_the_restart_patch_is_kubectls_annotation_on_the_pod_template_in_utc_seconds() -> None:
    patch = restart_patch(1_796_409_900.75)  # 2026-12-04T18:45:00.75Z
    assert patch == {"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: "2026-12-04T18:45:00Z"}}}}}
    assert RESTARTED_AT == "kubectl.kubernetes.io/restartedAt"
    assert restart_patch(1_796_409_901.0) != patch  # a second restart a second later is a new template


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (
            daemon_set(0, 0, 1, 0, 0),
            RolloutProgress(
                False, 'Waiting for daemon set "ztunnel" rollout to finish: 0 out of 1 new pods have been updated...'
            ),
        ),
        (
            daemon_set(1, 1, 2, 1, 0),
            RolloutProgress(
                False, 'Waiting for daemon set "ztunnel" rollout to finish: 1 out of 2 new pods have been updated...'
            ),
        ),
        (
            daemon_set(1, 1, 2, 2, 0),
            RolloutProgress(
                False, 'Waiting for daemon set "ztunnel" rollout to finish: 0 of 2 updated pods are available...'
            ),
        ),
        (daemon_set(1, 1, 2, 2, 2), RolloutProgress(True, 'daemon set "ztunnel" successfully rolled out')),
        (
            daemon_set(2, 1, 2, 2, 2),
            RolloutProgress(False, "Waiting for daemon set spec update to be observed..."),
        ),
    ],
)
def test_a_daemon_set_is_rolled_out_once_its_generation_is_observed_and_every_node_runs_an_available_new_pod(
    obj: dict, expected: RolloutProgress
) -> None:
    assert daemon_set_progress(obj) == expected


def test_a_daemon_set_updated_on_delete_cannot_be_watched() -> None:
    with pytest.raises(RolloutError, match="only available for RollingUpdate strategy type"):
        daemon_set_progress(daemon_set(1, 1, 2, 2, 2, updateStrategy={"type": "OnDelete"}))


@pytest.mark.parametrize(
    ("obj", "done", "message"),
    [
        (deployment(2, 1, 1), False, "Waiting for deployment spec update to be observed..."),
        (
            deployment(1, 1, 1, replicas=1, updatedReplicas=0),
            False,
            "rollout to finish: 0 out of 1 new replicas have been updated...",
        ),
        (
            deployment(1, 1, 1, replicas=2, updatedReplicas=1, availableReplicas=1),
            False,
            "rollout to finish: 1 old replicas are pending termination...",
        ),
        (
            deployment(1, 1, 2, replicas=2, updatedReplicas=2, availableReplicas=1),
            False,
            "rollout to finish: 1 of 2 updated replicas are available...",
        ),
        (
            deployment(1, 1, 2, replicas=2, updatedReplicas=2, availableReplicas=2),
            True,
            'deployment "istiod" successfully rolled out',
        ),
        # No spec.replicas means one, as the API server defaults it.
        (deployment(3, 3, None, replicas=1, updatedReplicas=1, availableReplicas=1), True, "successfully rolled out"),
        (deployment(3, 3, None, replicas=0, updatedReplicas=0), False, "0 out of 1 new replicas"),
    ],
)
def test_a_deployment_is_rolled_out_once_every_replica_is_new_and_available_and_no_old_one_is_left(
    obj: dict, done: bool, message: str
) -> None:
    progress = deployment_progress(obj)
    assert progress.done is done and message in progress.message, progress


def test_a_deployment_past_its_progress_deadline_is_an_error() -> None:
    conditions = [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]
    with pytest.raises(RolloutError, match='deployment "istiod" exceeded its progress deadline'):
        deployment_progress(deployment(1, 1, 1, replicas=1, updatedReplicas=0, conditions=conditions))


def test_each_component_is_judged_by_its_workloads_kind() -> None:
    workloads = [str(w) for w in COMPONENTS.values()]
    assert workloads == ["daemonset/ztunnel", "daemonset/istio-cni-node", "deployment/istiod"]
    assert rollout_progress(COMPONENTS["nodeproxy"], daemon_set(1, 1, 2, 2, 2)).done
    assert rollout_progress(COMPONENTS["controlplane"], deployment(1, 1, 1, replicas=1)).message.startswith(
        'Waiting for deployment "istiod"'
    )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=24), inner, max_size=4),
    max_leaves=20,
)
fields = st.sampled_from(
    ["metadata", "spec", "status", "generation", "observedGeneration", "desiredNumberScheduled", "numberAvailable",
     "updatedNumberScheduled", "replicas", "updatedReplicas", "availableReplicas", "conditions", "updateStrategy",
     "type", "reason", "name"]
)  # fmt: skip
objects = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(fields, inner, max_size=5),
    max_leaves=30,
)


@given(st.dictionaries(fields, objects, max_size=4) | st.dictionaries(st.text(max_size=8), json_values, max_size=3))
def test_any_object_the_server_returns_is_judged_or_refused_with_one_line(obj: dict) -> None:
    for judge in (daemon_set_progress, deployment_progress):
        try:
            progress = judge(obj)
        except RolloutError as exc:
            assert "\n" not in str(exc)
        else:
            assert isinstance(progress.done, bool) and "\n" not in progress.message
