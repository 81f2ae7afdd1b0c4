"""Who may read the sync status (rules of :mod:`ambit.controlplane.debug_access`), with a recording API stand-in."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from ambit.controlplane.debug_access import DebugAccessChecker, access_review, account_of, review_allows
from ambit.k8s.errors import KubeClientError
from ambit.k8s.kinds import ResourceKind
from ambit.xds.callers import Caller

ISTIOD = Caller("system:serviceaccount:istio-system:istiod", "Kubernetes")
WORKLOAD = Caller("system:serviceaccount:shop:web", "Kubernetes")


class RecordingReviews:
    """Answers every SubjectAccessReview with ``allowed`` (or raises ``error``), and keeps what it was asked."""

    def __init__(self, allowed: object = False, error: Exception | None = None) -> None:
        self.allowed, self.error = allowed, error
        self.asked: list[Mapping[str, Any]] = []

    async def create(self, kind: ResourceKind, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        assert kind.plural == "subjectaccessreviews" and namespace is None
        self.asked.append(obj)
        if self.error is not None:
            raise self.error
        return {**obj, "status": {"allowed": self.allowed}}


def test_the_review_asks_for_get_on_the_debug_url_as_the_service_account_with_its_groups() -> None:
    assert access_review(WORKLOAD)["spec"] == {
        "user": "system:serviceaccount:shop:web",
        "groups": ["system:serviceaccounts", "system:serviceaccounts:shop", "system:authenticated"],
        "nonResourceAttributes": {"path": "/debug/syncz", "verb": "get"},
    }


@pytest.mark.parametrize(
    ("answer", "allowed"),
    [
        ({"status": {"allowed": True}}, True),
        ({"status": {"allowed": False, "reason": "no"}}, False),
        ({"status": {"allowed": "true"}}, False),
        ({"status": None}, False),
        ({}, False),
    ],
)
def test_only_an_explicit_true_allows(answer: Mapping[str, Any], allowed: bool) -> None:
    assert review_allows(answer) is allowed


@pytest.mark.parametrize(
    ("name", "account"),
    [
        ("system:serviceaccount:istio-system:istiod", "istio-system/istiod"),
        ("system:serviceaccount:istio-system", None),
        ("system:serviceaccount:a:b:c", None),
        ("admin", None),
    ],
)
def test_accounts_are_read_only_from_well_formed_service_account_names(name: str, account: str | None) -> None:
    assert account_of(Caller(name)) == account


async def test_the_control_planes_own_account_reads_without_asking_the_api_server() -> None:
    reviews = RecordingReviews(allowed=False)
    assert await DebugAccessChecker(reviews)(ISTIOD) is True
    assert reviews.asked == []


async def test_a_workload_is_refused_when_rbac_does_not_allow_it() -> None:
    reviews = RecordingReviews(allowed=False)
    assert await DebugAccessChecker(reviews)(WORKLOAD) is False
    assert len(reviews.asked) == 1


async def test_an_account_rbac_allows_may_read() -> None:
    assert await DebugAccessChecker(RecordingReviews(allowed=True))(WORKLOAD) is True


async def test_a_failed_review_refuses() -> None:
    reviews = RecordingReviews(error=KubeClientError("POST subjectaccessreviews: 403 Forbidden"))
    assert await DebugAccessChecker(reviews)(WORKLOAD) is False
