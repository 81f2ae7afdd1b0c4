"""Probe specs and the consecutive-outcome tracker (pure), and the probe worker's schedule with fake attempts."""

from __future__ import annotations

import asyncio

import pytest

from ambit.lab.runtime.probes import ProbeConfigError, ProbeResult, ProbeSpec, ProbeTarget, ProbeTracker, ProbeWorker

CONTAINER = {"name": "app", "ports": [{"name": "http", "containerPort": 8080}]}
OK, FAIL = ProbeResult.SUCCESS, ProbeResult.FAILURE


def test_a_tcp_probe_gets_the_kubernetes_defaults() -> None:
    spec = ProbeSpec.parse({"tcpSocket": {"port": 80}}, CONTAINER)
    assert (spec.handler, spec.port, spec.host) == ("tcp", 80, "")
    assert (spec.initial_delay, spec.period, spec.timeout) == (0, 10, 1)
    assert (spec.success_threshold, spec.failure_threshold) == (1, 3)


def test_an_http_probe_resolves_a_named_port_and_keeps_headers() -> None:
    probe = {
        "httpGet": {"path": "healthz", "port": "http", "httpHeaders": [{"name": "X-A", "value": "1"}]},
        "periodSeconds": 2,
        "timeoutSeconds": 3,
        "successThreshold": 2,
        "failureThreshold": 5,
        "initialDelaySeconds": 4,
    }
    spec = ProbeSpec.parse(probe, CONTAINER)
    assert (spec.handler, spec.port, spec.path, spec.scheme) == ("http", 8080, "/healthz", "HTTP")
    assert spec.headers == (("X-A", "1"),)
    assert (spec.initial_delay, spec.period, spec.timeout) == (4, 2, 3)
    assert (spec.success_threshold, spec.failure_threshold) == (2, 5)


def test_an_exec_probe_keeps_its_command() -> None:
    spec = ProbeSpec.parse({"exec": {"command": ["true"]}}, CONTAINER)
    assert (spec.handler, spec.command) == ("exec", ("true",))


@pytest.mark.parametrize(
    "probe",
    [
        {},
        {"tcpSocket": {"port": "nope"}},
        {"tcpSocket": {"port": 70000}},
        {"httpGet": {"port": None}},
        {"exec": {"command": []}},
        {"grpc": {"port": 9000}},
    ],
)
def test_probes_that_cannot_run_are_config_errors(probe: dict[str, object]) -> None:
    with pytest.raises(ProbeConfigError):
        ProbeSpec.parse(probe, CONTAINER)


def test_readiness_starts_unready_and_needs_the_success_threshold() -> None:
    t = ProbeTracker(success_threshold=2, failure_threshold=3, healthy=False)
    assert t.observe(OK) is False
    assert t.observe(OK) is True and t.healthy
    assert [t.observe(FAIL), t.observe(FAIL)] == [False, False]
    assert t.observe(OK) is False  # a success breaks the run of failures
    assert [t.observe(FAIL), t.observe(FAIL), t.observe(FAIL)] == [False, False, True]
    assert not t.healthy


def test_liveness_starts_healthy() -> None:
    spec = ProbeSpec.parse({"tcpSocket": {"port": 1}, "failureThreshold": 1, "successThreshold": 5}, CONTAINER)
    t = ProbeTracker.liveness(spec)
    assert t.healthy and t.success_threshold == 1
    assert t.observe(FAIL) is True
    assert t.observe(OK) is True
    assert not ProbeTracker.readiness(spec).healthy


async def test_the_worker_waits_the_initial_delay_then_probes_every_period() -> None:
    spec = ProbeSpec.parse({"tcpSocket": {"port": 1}, "initialDelaySeconds": 5, "periodSeconds": 2}, CONTAINER)
    outcomes = iter([FAIL, OK, OK, FAIL, FAIL, FAIL])
    slept: list[float] = []
    verdicts: list[bool] = []
    failures: list[str] = []

    async def attempt(_spec: ProbeSpec, _target: ProbeTarget) -> tuple[ProbeResult, str]:
        try:
            result = next(outcomes)
        except StopIteration:
            raise asyncio.CancelledError from None
        return result, "" if result is OK else "refused"

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    worker = ProbeWorker(
        spec,
        ProbeTracker.readiness(spec),
        ProbeTarget("10.0.0.1", "", {}),
        lambda healthy, _msg: verdicts.append(healthy),
        on_failure=failures.append,
        sleep=sleep,
        attempt=attempt,
    )
    with pytest.raises(asyncio.CancelledError):
        await worker.run()
    assert slept == [5, 2, 2, 2, 2, 2, 2]
    assert verdicts == [True, False]
    assert failures == ["refused"] * 4


async def run_startup(spec: ProbeSpec, outcomes: list[ProbeResult]) -> tuple[bool, list[float], list[str]]:
    remaining = iter(outcomes)
    slept: list[float] = []
    failures: list[str] = []

    async def attempt(_spec: ProbeSpec, _target: ProbeTarget) -> tuple[ProbeResult, str]:
        result = next(remaining)  # running past the outcomes is a failure of the test (StopIteration)
        return result, "" if result is OK else "refused"

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    def verdict(healthy: bool, message: str) -> None:
        raise AssertionError("a startup probe reports by its return value")

    worker = ProbeWorker(
        spec,
        ProbeTracker.startup(spec),
        ProbeTarget("10.0.0.1", "", {}),
        verdict,
        on_failure=failures.append,
        sleep=sleep,
        attempt=attempt,
    )
    return await worker.run_until_verdict(), slept, failures


async def test_a_startup_probe_runs_until_its_first_success() -> None:
    """Rule 4: one success is enough (a successThreshold above 1 is not the startup probe's), and it stops."""
    probe = {"tcpSocket": {"port": 1}, "initialDelaySeconds": 1, "periodSeconds": 1, "failureThreshold": 30}
    spec = ProbeSpec.parse({**probe, "successThreshold": 3}, CONTAINER)
    passed, slept, failures = await run_startup(spec, [FAIL, FAIL, OK])
    assert passed is True
    assert slept == [1, 1, 1]  # the initial delay, then a period after each failure; none after the success
    assert failures == ["refused", "refused"]


async def test_a_startup_probe_fails_out_after_its_failure_threshold_in_a_row() -> None:
    spec = ProbeSpec.parse({"tcpSocket": {"port": 1}, "periodSeconds": 2, "failureThreshold": 3}, CONTAINER)
    passed, slept, failures = await run_startup(spec, [FAIL, FAIL, FAIL])
    assert passed is False
    assert slept == [2, 2]
    assert len(failures) == 3
