"""EventRecorder against the real embedded API server: events.k8s.io/v1 Events and series folding."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ambit.apiserver.server import ApiServer, ApiServerSettings
from ambit.k8s import EventRecorder, EventRecorderSettings, KubeClient, kinds

NS = "default"
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
T0 = 1_700_000_000.25


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[KubeClient]:
    async with (
        ApiServer(ApiServerSettings(data_dir=tmp_path / "api", port=0, crd_dir=None)) as server,
        KubeClient.from_kubeconfig(server.kubeconfig) as client,
    ):
        yield client


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def recorder(kube: KubeClient, clock: Clock) -> AsyncIterator[EventRecorder]:
    settings = EventRecorderSettings(reporting_controller="ambit.dev/controlplane", reporting_instance="cp-0")
    async with EventRecorder(kube, settings, clock=clock) as started:
        yield started


async def a_pod(kube: KubeClient, name: str = "web") -> dict[str, Any]:
    spec = {"containers": [{"name": "app", "image": "app"}]}
    return await kube.create(kinds.PODS, {"metadata": {"name": name, "namespace": NS}, "spec": spec})


async def events(kube: KubeClient, namespace: str = NS) -> list[dict[str, Any]]:
    return (await kube.list(kinds.EVENTS, namespace))[0]


async def test_an_event_has_the_events_k8s_io_v1_fields(kube: KubeClient, recorder: EventRecorder) -> None:
    pod = await a_pod(kube)
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1", "uid": "u-1"}}
    recorder.record(pod, "Warning", "PolicyRejected", "deny-all blocks port 80", "Evaluate", related=node)
    await recorder.flush()

    [event] = await events(kube)
    assert event["apiVersion"] == "events.k8s.io/v1" and event["kind"] == "Event"
    assert event["metadata"]["name"] == f"web.{int(T0 * 1e9):x}"
    assert MICRO_TIME.match(event["eventTime"]) and event["eventTime"] == "2023-11-14T22:13:20.250000Z"
    assert event["type"] == "Warning" and event["reason"] == "PolicyRejected" and event["action"] == "Evaluate"
    assert event["note"] == "deny-all blocks port 80"
    assert event["reportingController"] == "ambit.dev/controlplane" and event["reportingInstance"] == "cp-0"
    assert event["regarding"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": NS,
        "name": "web",
        "uid": pod["metadata"]["uid"],
        "resourceVersion": pod["metadata"]["resourceVersion"],
    }
    assert event["related"] == {"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "u-1"}
    assert "series" not in event
    assert recorder.stats.created == 1


async def test_repeats_within_the_window_fold_into_one_series(
    kube: KubeClient, recorder: EventRecorder, clock: Clock
) -> None:
    pod = await a_pod(kube)
    recorder.record(pod, "Normal", "Enrolled", "pod joined the mesh", "Enroll")
    clock.now += 10
    recorder.record(pod, "Normal", "Enrolled", "pod joined the mesh", "Enroll")
    clock.now += 10.5
    recorder.record(pod, "Normal", "Enrolled", "pod joined the mesh", "Enroll")
    recorder.record(pod, "Normal", "Enrolled", "a different note is a different event", "Enroll")
    await recorder.flush()

    folded, other = sorted(await events(kube), key=lambda e: e["note"], reverse=True)
    assert folded["series"] == {"count": 3, "lastObservedTime": "2023-11-14T22:13:40.750000Z"}
    assert folded["eventTime"] == "2023-11-14T22:13:20.250000Z"
    assert "series" not in other
    assert (recorder.stats.created, recorder.stats.patched) == (2, 2)


async def test_a_repeat_after_the_window_starts_a_new_event(
    kube: KubeClient, recorder: EventRecorder, clock: Clock
) -> None:
    pod = await a_pod(kube)
    recorder.record(pod, "Normal", "Enrolled", "joined", "Enroll")
    clock.now += recorder.settings.series_window + 1
    recorder.record(pod, "Normal", "Enrolled", "joined", "Enroll")
    await recorder.flush()
    assert len(await events(kube)) == 2
    assert recorder.stats.patched == 0


async def test_a_series_whose_event_was_deleted_starts_over(kube: KubeClient, recorder: EventRecorder) -> None:
    pod = await a_pod(kube)
    recorder.record(pod, "Normal", "Enrolled", "joined", "Enroll")
    await recorder.flush()
    [first] = await events(kube)
    await kube.delete(kinds.EVENTS, first["metadata"]["name"], NS)  # as its TTL would

    recorder.record(pod, "Normal", "Enrolled", "joined", "Enroll")
    await recorder.flush()
    [second] = await events(kube)
    assert "series" not in second and second["metadata"]["uid"] != first["metadata"]["uid"]
    assert recorder.stats.created == 2


async def test_events_of_cluster_scoped_objects_go_to_the_default_namespace(
    kube: KubeClient, recorder: EventRecorder, clock: Clock
) -> None:
    namespace = await kube.get(kinds.NAMESPACES, "kube-system")
    recorder.record(namespace, "Normal", "Labelled", "ambient mode on", "Label")
    recorder.record(namespace, "Normal", "Labelled", "ambient mode on", "Label")  # same instant: one series
    await recorder.flush()
    [event] = await events(kube)
    assert event["regarding"]["name"] == "kube-system" and "namespace" not in event["regarding"]
    assert event["series"]["count"] == 2


async def test_api_failures_are_logged_and_dropped_never_raised(
    kube: KubeClient, recorder: EventRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    ghost = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ghost", "namespace": "no-such-namespace"}}
    recorder.record(ghost, "Warning", "Failed", "x" * 5000, "Run")  # the namespace does not exist: 404
    await recorder.flush()
    assert recorder.stats.failed == 1 and recorder.stats.created == 0
    assert "cannot create event" in caplog.text
    with pytest.raises(ValueError, match="Normal or Warning"):
        recorder.record(ghost, "Bogus", "Failed", "x", "Run")  # type: ignore[arg-type]


async def test_a_full_queue_drops_events_and_a_closed_recorder_ignores_them(kube: KubeClient, clock: Clock) -> None:
    settings = EventRecorderSettings(reporting_controller="c", reporting_instance="i", queue_size=2)
    recorder = EventRecorder(kube, settings, clock=clock)  # not started: nothing drains the queue
    pod = await a_pod(kube)
    for i in range(4):
        recorder.record(pod, "Normal", "Tick", f"tick {i}", "Tick")
    assert recorder.stats.dropped == 2
    recorder.start()
    await recorder.aclose()  # writes what is queued first
    assert recorder.stats.created == 2
    recorder.record(pod, "Normal", "Tick", "late", "Tick")
    assert recorder.stats.dropped == 3
    assert len(await events(kube)) == 2


async def test_the_fold_cache_is_bounded(kube: KubeClient, clock: Clock) -> None:
    settings = EventRecorderSettings(reporting_controller="c", reporting_instance="i", cache_size=2)
    async with EventRecorder(kube, settings, clock=clock) as recorder:
        pod = await a_pod(kube)
        for note in ("a", "b", "c", "a"):  # "a" was evicted by "c": its repeat is a new Event
            clock.now += 1
            recorder.record(pod, "Normal", "Tick", note, "Tick")
        await recorder.flush()
    assert (recorder.stats.created, recorder.stats.patched) == (4, 0)
