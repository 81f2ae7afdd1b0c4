from __future__ import annotations

import asyncio
import logging

import pytest

from ambit.supervision import TaskEndedError, poll_every, watch


async def _fail() -> None:
    await asyncio.sleep(0)
    raise ConnectionResetError("peer went away")


async def _return() -> None:
    await asyncio.sleep(0)


async def test_a_task_ended_by_an_error_is_logged_at_once_with_its_name(caplog: pytest.LogCaptureFixture) -> None:
    task = watch(asyncio.create_task(_fail(), name="zds client /run/zds"))
    await asyncio.wait([task])
    await asyncio.sleep(0)  # done callbacks run on the next turn
    assert task.exception() is not None
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "zds client /run/zds" in errors[0].getMessage()
    assert errors[0].exc_info is not None


async def test_an_essential_task_that_fails_or_returns_tells_its_owner() -> None:
    told: list[TaskEndedError] = []
    failed = watch(asyncio.create_task(_fail(), name="failing"), on_failure=told.append)
    returned = watch(asyncio.create_task(_return(), name="returning"), on_failure=told.append)
    await asyncio.wait([failed, returned])
    await asyncio.sleep(0)
    messages = sorted(str(error) for error in told)
    assert len(messages) == 2
    assert "'failing' ended by an error: ConnectionResetError" in messages[0]
    assert messages[1] == "task 'returning' ended"


async def test_a_cancelled_task_is_neither_logged_nor_reported(caplog: pytest.LogCaptureFixture) -> None:
    told: list[TaskEndedError] = []
    task = watch(asyncio.create_task(asyncio.sleep(10), name="sleeper"), on_failure=told.append)
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.wait([task])
    await asyncio.sleep(0)
    assert told == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_poll_that_fails_is_logged_once_and_polled_again(caplog: pytest.LogCaptureFixture) -> None:
    outcomes: list[Exception | None] = [PermissionError(13, "denied"), PermissionError(13, "denied"), None, None]
    calls = 0
    done = asyncio.Event()

    def poll() -> None:
        nonlocal calls
        outcome = outcomes[min(calls, len(outcomes) - 1)]
        calls += 1
        if calls == len(outcomes):
            done.set()
        if outcome is not None:
            raise outcome

    with caplog.at_level(logging.INFO, logger="ambit.supervision"):
        task = asyncio.create_task(poll_every(0.001, poll, "the CNI install watcher"))
        await asyncio.wait_for(done.wait(), 5)
        task.cancel()
        await asyncio.wait([task])
    assert task.cancelled()
    lines = [r.getMessage() for r in caplog.records if r.name == "ambit.supervision"]
    assert lines == [
        "the CNI install watcher failed: PermissionError: [Errno 13] denied",
        "the CNI install watcher works again",
    ]
    assert all(r.exc_info is None for r in caplog.records)  # an OSError is one line, no traceback


async def test_a_poll_with_a_defect_gets_its_traceback_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0
    thrice = asyncio.Event()

    def poll() -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            thrice.set()
        raise KeyError("pod-uid")

    task = asyncio.create_task(poll_every(0.001, poll, "the CRL watcher"))
    await asyncio.wait_for(thrice.wait(), 5)
    task.cancel()
    await asyncio.wait([task])
    assert task.cancelled()
    records = [r for r in caplog.records if r.name == "ambit.supervision"]
    assert len(records) == 1
    assert records[0].exc_info is not None
