"""The control plane's home namespace on a fresh cluster: created when allowed, else waited for with a clear log line.

A recording stand-in for the API server plays each case (the embedded API server case is in
``tests/integration/test_controlplane_startup.py``); sleeps and the clock are injected, so nothing waits.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from ambit.controlplane.ca.errors import RootCaError
from ambit.controlplane.ca.home import ensure_namespace
from ambit.k8s.errors import (
    KubeAlreadyExistsError,
    KubeApiStatusError,
    KubeClientError,
    KubeForbiddenError,
    KubeNotFoundError,
)
from ambit.k8s.kinds import NAMESPACES, ResourceKind


def _status(error: type[KubeApiStatusError], code: int, message: str) -> KubeApiStatusError:
    return error({"kind": "Status", "code": code, "message": message}, code)


class FakeApi:
    """Namespaces only: ``exists`` flips when someone creates it; ``create_error`` is raised by our creates."""

    def __init__(
        self, *, exists: bool = False, create_error: Exception | None = None, get_error: Exception | None = None
    ):
        self.exists = exists
        self.create_error = create_error
        self.get_error = get_error
        self.calls: list[str] = []

    async def get(self, kind: ResourceKind, name: str, namespace: str | None = None) -> dict[str, Any]:
        assert kind is NAMESPACES
        self.calls.append(f"get {name}")
        if self.get_error is not None:
            raise self.get_error
        if not self.exists:
            raise _status(KubeNotFoundError, 404, f'namespaces "{name}" not found')
        return {"metadata": {"name": name}}

    async def create(self, kind: ResourceKind, obj: Any, namespace: str | None = None) -> dict[str, Any]:
        self.calls.append(f"create {obj['metadata']['name']}")
        if self.create_error is not None:
            raise self.create_error
        if self.exists:
            raise _status(KubeAlreadyExistsError, 409, "already exists")
        self.exists = True
        return dict(obj)


async def test_an_existing_namespace_is_left_alone() -> None:
    api = FakeApi(exists=True)
    assert await ensure_namespace(api, "istio-system") is False
    assert api.calls == ["get istio-system"]


async def test_a_missing_namespace_is_created_when_allowed(caplog: pytest.LogCaptureFixture) -> None:
    api = FakeApi()
    with caplog.at_level(logging.INFO, "ambit.controlplane.ca.home"):
        assert await ensure_namespace(api, "istio-system") is True
    assert api.calls == ["get istio-system", "create istio-system"] and api.exists
    assert "namespace istio-system did not exist: created it" in caplog.text


async def test_a_race_to_create_it_is_the_same_outcome() -> None:
    api = FakeApi(create_error=_status(KubeAlreadyExistsError, 409, "already exists"))
    assert await ensure_namespace(api, "istio-system") is False


async def test_without_permission_to_create_it_the_control_plane_waits_with_one_clear_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = FakeApi(create_error=_status(KubeForbiddenError, 403, "namespaces is forbidden"))
    now = [0.0]
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds
        if len(sleeps) == 40:  # an administrator creates it after 80 s
            api.exists = True

    with caplog.at_level(logging.INFO, "ambit.controlplane.ca.home"):
        created = await ensure_namespace(
            api, "istio-system", retry_delay=2.0, log_every=60.0, sleep=sleep, clock=lambda: now[0]
        )
    assert created is False and sleeps == [2.0] * 40
    waiting = [r for r in caplog.records if "waiting for it" in r.getMessage()]
    assert len(waiting) == 2, "once at first, once more after a minute"
    assert waiting[0].levelno == logging.WARNING
    assert "kubectl create namespace istio-system" in waiting[0].getMessage()
    assert caplog.records[-1].getMessage() == "namespace istio-system exists now; going on"


async def test_without_permission_to_read_it_the_next_write_reports() -> None:
    api = FakeApi(get_error=_status(KubeForbiddenError, 403, "forbidden"))
    assert await ensure_namespace(api, "istio-system") is False
    assert api.calls == ["get istio-system"]


@pytest.mark.parametrize(
    ("api", "message"),
    [
        (FakeApi(get_error=KubeClientError("connection refused")), "cannot read namespace istio-system"),
        (
            FakeApi(create_error=_status(KubeApiStatusError, 500, "etcd down")),
            "namespace istio-system does not exist and creating it failed",
        ),
    ],
)
async def test_other_api_failures_fail_the_start_with_the_api_servers_message(api: FakeApi, message: str) -> None:
    with pytest.raises(RootCaError, match=message):
        await ensure_namespace(api, "istio-system")
