"""The container state machine, restart back-off, container status and pod phase (pure)."""

from __future__ import annotations

import pytest

from ambit.lab.runtime.containers import (
    ConfigFailed,
    ContainerState,
    ContainerStateError,
    Exited,
    Phase,
    Started,
    StartupPassed,
    StopRequested,
    container_status,
    crash_loop_backoff,
    incomplete_init,
    init_restart_policy,
    is_sidecar,
    pod_phase,
    should_restart,
)
from ambit.lab.runtime.processes import container_argv

T0 = 1_700_000_000.0
POD = "web_default(u-1)"


def state(policy: str = "Always", initial: float = 10.0, maximum: float = 300.0) -> ContainerState:
    return ContainerState("app", policy, crash_loop_backoff(initial, maximum))


def test_a_container_starts_and_shows_running_with_its_pid() -> None:
    s = state()
    assert s.apply(Started(42, T0)) is Phase.RUNNING
    status = container_status(s, "img", POD)
    assert status["state"] == {"running": {"startedAt": "2023-11-14T22:13:20Z"}}
    assert status["containerID"] == "ambit://42"
    assert status["started"] is True
    assert status["restartCount"] == 0
    assert status["lastState"] == {}
    assert status["image"] == "img"
    assert status["imageID"] == ""


def test_a_container_with_a_startup_probe_is_started_only_once_it_passed() -> None:
    """Rule 9: the status's ``started`` waits for the startup probe, per instance."""
    s = state()
    s.apply(Started(42, T0, startup_probe=True))
    assert s.phase is Phase.RUNNING
    assert container_status(s, "img", POD)["started"] is False
    s.apply(StartupPassed())
    assert container_status(s, "img", POD)["started"] is True
    s.apply(Exited(1, T0 + 5))
    assert container_status(s, "img", POD)["started"] is False
    s.apply(Started(43, T0 + 6, startup_probe=True))  # the next instance is probed again
    assert container_status(s, "img", POD)["started"] is False
    with pytest.raises(ContainerStateError):
        state().apply(StartupPassed())  # nothing runs yet


@pytest.mark.parametrize(("reported", "started"), [(None, True), (True, True), (False, False)])
def test_restore_keeps_whether_the_instance_had_started(reported: bool | None, started: bool) -> None:
    s = state()
    status: dict[str, object] = {"state": {"running": {"startedAt": "2023-11-14T22:13:20Z"}}}
    if reported is not None:
        status["started"] = reported
    s.restore(status, pid=77)
    assert s.started is started


def test_a_new_container_waits_as_container_creating() -> None:
    status = container_status(state(), "img", POD)
    assert status["state"] == {"waiting": {"reason": "ContainerCreating"}}
    assert status["started"] is False
    assert status["ready"] is False
    assert "containerID" not in status


def test_exit_under_always_backs_off_and_the_restart_counts() -> None:
    s = state(initial=10, maximum=300)
    s.apply(Started(42, T0))
    s.ready = True
    assert s.apply(Exited(3, T0 + 5)) is Phase.BACKING_OFF
    assert s.ready is False
    assert s.restart_at == T0 + 5  # the first restart is immediate
    s.apply(Started(43, T0 + 5))
    assert s.restart_count == 1
    assert s.apply(Exited(3, T0 + 6)) is Phase.BACKING_OFF
    assert s.backoff_delay == 10
    status = container_status(s, "img", POD)
    assert status["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert status["state"]["waiting"]["message"] == f"back-off 10s restarting failed container=app pod={POD}"
    assert status["lastState"]["terminated"] == {
        "exitCode": 3,
        "reason": "Error",
        "startedAt": "2023-11-14T22:13:25Z",
        "finishedAt": "2023-11-14T22:13:26Z",
        "containerID": "ambit://43",
    }


@pytest.mark.parametrize(
    ("policy", "code", "restarts"),
    [
        ("Always", 0, True),
        ("Always", 1, True),
        ("OnFailure", 0, False),
        ("OnFailure", 2, True),
        ("OnFailure", None, True),
        ("Never", 0, False),
        ("Never", 1, False),
    ],
)
def test_restart_policy_decides_after_an_exit(policy: str, code: int | None, restarts: bool) -> None:
    assert should_restart(policy, code) is restarts
    s = state(policy)
    s.apply(Started(1, T0))
    assert s.apply(Exited(code, T0 + 1)) is (Phase.BACKING_OFF if restarts else Phase.EXITED)


def test_a_terminated_container_shows_its_exit_and_the_previous_one() -> None:
    s = state("OnFailure")
    s.apply(Started(1, T0))
    s.apply(Exited(1, T0 + 1))
    s.apply(Started(2, T0 + 2))
    s.apply(Exited(0, T0 + 3))
    status = container_status(s, "img", POD)
    assert status["state"]["terminated"]["exitCode"] == 0
    assert status["state"]["terminated"]["reason"] == "Completed"
    assert status["lastState"]["terminated"]["exitCode"] == 1
    assert status["restartCount"] == 1
    assert status["started"] is False


def test_an_unknown_exit_is_reported_as_a_lost_container() -> None:
    s = state("Never")
    s.apply(Started(1, T0))
    s.apply(Exited(None, T0 + 1))
    terminated = container_status(s, "img", POD)["state"]["terminated"]
    assert terminated["exitCode"] == 137
    assert terminated["reason"] == "ContainerStatusUnknown"


def test_backoff_doubles_to_the_cap_and_resets_after_a_long_run() -> None:
    b = crash_loop_backoff(initial=10, maximum=300, reset_after=600)
    delays = [b.delay_after_exit(started=0, now=1) for _ in range(8)]
    assert delays == [0, 10, 20, 40, 80, 160, 300, 300]
    assert b.delay_after_exit(started=0, now=600) == 0
    assert b.delay_after_exit(started=0, now=1) == 10


def test_stop_while_running_ends_in_exited_whatever_the_policy() -> None:
    s = state("Always")
    s.apply(Started(1, T0))
    s.apply(StopRequested())
    assert s.phase is Phase.RUNNING and s.stopping
    assert s.apply(Exited(143, T0 + 1)) is Phase.EXITED


def test_stop_while_backing_off_ends_at_once() -> None:
    s = state("Always")
    s.apply(Started(1, T0))
    s.apply(Exited(1, T0 + 1))
    assert s.apply(StopRequested()) is Phase.EXITED
    assert container_status(s, "img", POD)["state"]["terminated"]["exitCode"] == 1


def test_config_errors_wait_with_the_message() -> None:
    s = state()
    assert s.apply(ConfigFailed("no command")) is Phase.CONFIG_ERROR
    waiting = container_status(s, "img", POD)["state"]["waiting"]
    assert waiting == {"reason": "CreateContainerConfigError", "message": "no command"}
    assert s.apply(Started(5, T0)) is Phase.RUNNING
    assert s.restart_count == 0


def test_an_instance_the_runtime_could_not_create_waits_with_its_reason_and_counts_no_restart() -> None:
    s = state()
    s.apply(Started(5, T0))
    s.apply(Exited(1, T0 + 1))
    s.apply(Started(6, T0 + 2))
    assert s.restart_count == 1
    failed = ConfigFailed("runc run failed: unable to start container process: x", "RunContainerError")
    assert s.apply(failed) is Phase.CONFIG_ERROR
    status = container_status(s, "img", POD)
    assert status["state"]["waiting"] == {"reason": "RunContainerError", "message": failed.message}
    assert status["restartCount"] == 0 and "containerID" not in status
    assert status["lastState"]["terminated"]["exitCode"] == 1  # the last instance that did run
    assert s.apply(Started(7, T0 + 3)) is Phase.RUNNING
    assert s.restart_count == 1


@pytest.mark.parametrize(
    ("phase", "event"),
    [
        (Phase.CREATING, Exited(0, T0)),
        (Phase.RUNNING, Started(1, T0)),
        (Phase.EXITED, Started(1, T0)),
        (Phase.EXITED, ConfigFailed("x")),
    ],
)
def test_events_a_phase_does_not_accept_are_errors(phase: Phase, event: Started | Exited | ConfigFailed) -> None:
    s = state()
    s.phase = phase
    with pytest.raises(ContainerStateError):
        s.apply(event)


def test_restore_takes_over_the_reported_history() -> None:
    s = state()
    s.restore(
        {
            "restartCount": 4,
            "state": {"running": {"startedAt": "2023-11-14T22:13:20Z"}},
            "lastState": {"terminated": {"exitCode": 2, "reason": "Error"}},
        },
        pid=77,
    )
    assert (s.phase, s.pid, s.restart_count, s.started_at) == (Phase.RUNNING, 77, 4, T0)
    assert s.last_termination == {"exitCode": 2, "reason": "Error"}


@pytest.mark.parametrize(("policy", "phase"), [("Never", Phase.EXITED), ("OnFailure", Phase.CREATING)])
def test_a_container_reported_terminated_stays_exited_unless_its_policy_restarts_it(policy: str, phase: Phase) -> None:
    s = state(policy)
    done = {"exitCode": 1, "reason": "Error", "finishedAt": "2023-11-14T22:13:20Z"}
    s.resume_exited({"restartCount": 2, "state": {"terminated": done}, "lastState": {}})
    assert (s.phase, s.restart_count, s.last_termination) == (phase, 2, done)
    if phase is Phase.CREATING:
        s.apply(Started(9, T0))
        assert s.restart_count == 3
    else:
        assert container_status(s, "img", POD)["state"] == {"terminated": done}


def _in(phase: Phase, last_code: int | None = None) -> ContainerState:
    s = state()
    s.phase = phase
    if last_code is not None:
        s.last_termination = {"exitCode": last_code}
    return s


@pytest.mark.parametrize(
    ("policy", "containers", "phase"),
    [
        ("Always", [_in(Phase.CREATING)], "Pending"),
        ("Always", [_in(Phase.RUNNING), _in(Phase.CREATING)], "Pending"),
        ("Always", [_in(Phase.RUNNING)], "Running"),
        ("Always", [_in(Phase.BACKING_OFF, 1)], "Running"),
        ("Never", [_in(Phase.EXITED, 0), _in(Phase.EXITED, 0)], "Succeeded"),
        ("Never", [_in(Phase.EXITED, 0), _in(Phase.EXITED, 1)], "Failed"),
        ("Never", [_in(Phase.EXITED, 0), _in(Phase.RUNNING)], "Running"),
        ("OnFailure", [_in(Phase.EXITED, 0)], "Succeeded"),
        ("OnFailure", [_in(Phase.BACKING_OFF, 1)], "Running"),
        ("Always", [_in(Phase.CONFIG_ERROR)], "Pending"),
        ("Always", [], "Pending"),
    ],
)
def test_pod_phase_follows_the_kubelet(policy: str, containers: list[ContainerState], phase: str) -> None:
    assert pod_phase(policy, containers) == phase


def test_argv_runs_the_command_inside_the_pod_namespace() -> None:
    assert container_argv("ab12-p-1", ["sleep"], ["60"]) == ["ip", "netns", "exec", "ab12-p-1", "sleep", "60"]
    assert container_argv("", ["sleep"], ["60"]) == ["sleep", "60"]
    assert container_argv("ns", ["pwd"], [], "/tmp") == ["ip", "netns", "exec", "ns", "env", "-C", "/tmp", "--", "pwd"]


def test_a_running_containers_main_process_is_the_child_of_its_runc_run() -> None:
    """``container_main_pid`` (the benchmark's and the lab driver's one lookup) names this test's own child when the
    container id names this process; nothing for a stopped container, another runtime's id or a malformed one."""
    import os
    import subprocess
    from pathlib import Path

    from ambit.lab.runtime.processes import container_main_pid

    child = subprocess.Popen(["sleep", "30"])
    try:
        running = {"state": {"running": {}}, "containerID": f"ambit://{os.getpid()}"}
        found = container_main_pid(running)  # this child, or another this worker still has
        assert found is not None
        stat = Path(f"/proc/{found}/stat").read_text()
        assert stat.rsplit(")", 1)[1].split()[1] == str(os.getpid())
        assert container_main_pid({**running, "state": {"terminated": {}}}) is None
        assert container_main_pid({**running, "containerID": f"containerd://{os.getpid()}"}) is None
        assert container_main_pid({**running, "containerID": "ambit://12ab"}) is None
        assert container_main_pid({"state": "running"}) is None
    finally:
        child.kill()
        child.wait()


# -- init containers (rule 10) ------------------------------------------------------------------------------------
def init_state(pod_policy: str, name: str = "init") -> ContainerState:
    return ContainerState(name, init_restart_policy(pod_policy), crash_loop_backoff(10.0, 300.0))


@pytest.mark.parametrize(
    ("pod_policy", "after_failure"),
    [("Always", Phase.BACKING_OFF), ("OnFailure", Phase.BACKING_OFF), ("Never", Phase.EXITED)],
)
def test_an_init_container_is_retried_after_a_failure_unless_the_pod_never_restarts(
    pod_policy: str, after_failure: Phase
) -> None:
    s = init_state(pod_policy)
    s.apply(Started(42, T0))
    assert s.apply(Exited(1, T0 + 1)) is after_failure
    assert not s.completed
    done = init_state(pod_policy)
    done.apply(Started(43, T0))
    assert done.apply(Exited(0, T0 + 1)) is Phase.EXITED  # a completed one never runs again, even with Always
    assert done.completed


def test_an_init_container_waits_as_pod_initializing_and_is_ready_once_completed() -> None:
    s = init_state("Always")
    waiting = container_status(s, "img", POD, init=True)
    assert waiting["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert waiting["ready"] is False
    s.apply(Started(42, T0))
    running = container_status(s, "img", POD, init=True)
    assert "running" in running["state"]
    assert (running["ready"], running["started"]) == (False, True)
    s.apply(Exited(1, T0 + 1))
    crashing = container_status(s, "img", POD, init=True)
    assert crashing["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert crashing["lastState"]["terminated"]["reason"] == "Error"
    assert crashing["ready"] is False
    s.apply(Started(43, T0 + 2))
    s.apply(Exited(0, T0 + 3))
    completed = container_status(s, "img", POD, init=True)
    assert completed["state"]["terminated"]["reason"] == "Completed"
    assert (completed["ready"], completed["started"], completed["restartCount"]) == (True, False, 1)
    # An app container of a pod still initializing waits as PodInitializing, then as ContainerCreating.
    app = state()
    assert container_status(app, "img", POD, initializing=True)["state"]["waiting"]["reason"] == "PodInitializing"
    assert container_status(app, "img", POD)["state"]["waiting"]["reason"] == "ContainerCreating"


def test_the_pod_is_pending_while_initializing_and_failed_by_an_init_container_that_will_not_complete() -> None:
    first, second = init_state("Never", "first"), init_state("Never", "second")
    app = state("Never")
    assert incomplete_init([first, second]) == ["first", "second"]
    assert pod_phase("Never", [app], [first, second]) == "Pending"
    first.apply(Started(42, T0))
    first.apply(Exited(0, T0 + 1))
    assert incomplete_init([first, second]) == ["second"]
    assert pod_phase("Never", [app], [first, second]) == "Pending"
    second.apply(Started(43, T0 + 1))
    second.apply(Exited(2, T0 + 2))
    assert pod_phase("Never", [app], [first, second]) == "Failed"
    retried = init_state("Always")
    retried.apply(Started(44, T0))
    retried.apply(Exited(2, T0 + 1))
    assert pod_phase("Always", [state()], [retried]) == "Pending"  # CrashLoopBackOff: still initializing
    done = init_state("Always")
    done.apply(Started(45, T0))
    done.apply(Exited(0, T0 + 1))
    running = state()
    running.apply(Started(46, T0 + 2))
    assert incomplete_init([done]) == []
    assert pod_phase("Always", [running], [done]) == "Running"


def test_an_init_container_of_an_initialized_pod_is_taken_as_completed() -> None:
    s = init_state("Always")
    s.assume_completed()
    assert s.completed
    assert container_status(s, "img", POD, init=True)["state"]["terminated"]["reason"] == "Completed"


def test_a_native_sidecar_counts_as_initialized_once_started_and_is_ready_by_its_readiness() -> None:
    """Rule 11."""
    sidecar = ContainerState("proxy", "Always", crash_loop_backoff(10.0, 300.0))
    plain = init_state("Always")
    assert is_sidecar(sidecar) and not is_sidecar(plain)
    assert incomplete_init([sidecar, plain]) == ["proxy", "init"]
    sidecar.apply(Started(42, T0, startup_probe=True))
    assert incomplete_init([sidecar, plain]) == ["proxy", "init"]  # running, but its startup probe has not passed
    sidecar.apply(StartupPassed())
    assert incomplete_init([sidecar, plain]) == ["init"]
    assert container_status(sidecar, "img", POD, init=True)["ready"] is False
    sidecar.ready = True
    status = container_status(sidecar, "img", POD, init=True)
    assert (status["ready"], status["started"]) == (True, True)
    assert sidecar.apply(Exited(0, T0 + 5)) is Phase.BACKING_OFF  # restarted whenever it exits
    assert pod_phase("Never", [state("Never")], [sidecar]) == "Pending"  # restarting: never a failed initialization
