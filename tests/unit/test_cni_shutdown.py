"""What a stopping node agent leaves behind (:mod:`ambit.cni.shutdown`): the plugin stays for an upgrade, goes with
the mesh, and stays when the API server cannot say which (fail closed)."""

from __future__ import annotations

from typing import Any

import pytest

from ambit.cni.shutdown import OwnerState, owner_state, plugin_stays
from ambit.k8s import ResourceKind, kinds
from ambit.k8s.errors import (
    KubeApiStatusError,
    KubeClientError,
    KubeForbiddenError,
    KubeNotFoundError,
    KubeUnauthorizedError,
)


class Answers:
    """A client whose ``get`` gives each answer in turn (an object, or an exception to raise)."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[ResourceKind, str, str | None]] = []

    async def get(self, kind: ResourceKind, name: str, namespace: str | None = None) -> dict[str, Any]:
        self.asked.append((kind, name, namespace))
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, dict)
        return answer


def status(code: int) -> dict[str, Any]:
    return {"kind": "Status", "code": code, "message": "x"}


async def state_of(*answers: object) -> tuple[OwnerState, Answers, list[float]]:
    client = Answers(*answers)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    found = await owner_state(client, "istio-system", "istio-cni-node", sleep=sleep)  # type: ignore[arg-type]
    return found, client, slept


async def test_a_present_daemonset_is_an_upgrade_and_the_plugin_stays() -> None:
    found, client, _ = await state_of({"metadata": {"name": "istio-cni-node"}})
    assert found is OwnerState.PRESENT and plugin_stays(found)
    assert client.asked == [(kinds.DAEMON_SETS, "istio-cni-node", "istio-system")]


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ({"metadata": {"deletionTimestamp": "2026-12-05T00:00:00Z"}}, OwnerState.DELETING),
        (KubeNotFoundError(status(404)), OwnerState.GONE),
        (KubeUnauthorizedError(status(401)), OwnerState.REVOKED),
        (KubeForbiddenError(status(403)), OwnerState.REVOKED),
    ],
)
async def test_a_daemonset_gone_or_going_or_out_of_reach_by_rbac_takes_the_plugin_away(
    answer: object, expected: OwnerState
) -> None:
    found, client, slept = await state_of(answer)
    assert found is expected and not plugin_stays(found)
    assert len(client.asked) == 1 and slept == []


async def test_an_unreachable_api_server_is_asked_three_times_then_the_plugin_stays() -> None:
    found, client, slept = await state_of(
        KubeApiStatusError(status(503)), OSError("connection refused"), KubeClientError("timed out")
    )
    assert found is OwnerState.UNKNOWN and plugin_stays(found)
    assert len(client.asked) == 3 and slept == [1.0, 1.0]


async def test_a_transient_failure_then_an_answer_counts_the_answer() -> None:
    found, client, _ = await state_of(OSError("reset"), KubeNotFoundError(status(404)))
    assert found is OwnerState.GONE and len(client.asked) == 2
