"""The CA's caller authentication rules (spec §5.3 steps 1-2): bearer metadata and TokenReview answers, purely."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from json_strategies import json_values

from ambit.controlplane.ca.authn import (
    POD_NAME_KEY,
    POD_UID_KEY,
    Caller,
    KubeAuthenticator,
    bearer_token,
    caller_from_review,
)
from ambit.controlplane.ca.errors import AuthenticationError
from ambit.k8s.errors import KubeClientError
from ambit.model.identity import SpiffeId


def review(
    *,
    authenticated: bool = True,
    username: str = "system:serviceaccount:istio-system:ztunnel",
    groups: Sequence[str] = ("system:serviceaccounts", "system:serviceaccounts:istio-system", "system:authenticated"),
    extra: dict[str, Any] | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"authenticated": authenticated}
    if authenticated:
        status["user"] = {"username": username, "groups": list(groups), "extra": extra or {}}
    if error:
        status["error"] = error
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {}, "status": status}


def test_bearer_token_is_taken_from_the_authorization_metadata() -> None:
    assert bearer_token([("authorization", "Bearer abc.def.ghi"), ("clusterid", "Kubernetes")]) == "abc.def.ghi"


def test_bearer_token_accepts_bytes_values_and_any_case_scheme() -> None:
    assert bearer_token([("authorization", b"bearer tok")]) == "tok"


@pytest.mark.parametrize(
    "metadata",
    [
        [],
        [("clusterid", "Kubernetes")],
        [("authorization", "Basic dXNlcjpwYXNz")],
        [("authorization", "Bearer ")],
        [("authorization", "Bearer a"), ("authorization", "Bearer b")],
        [("authorization", "Bearer a"), ("clusterid", "elsewhere")],
    ],
    ids=["none", "no-authorization", "basic", "empty", "two-tokens", "other-cluster"],
)
def test_bad_authorization_metadata_is_unauthenticated(metadata: list[tuple[str, str]]) -> None:
    with pytest.raises(AuthenticationError):
        bearer_token(metadata)


def test_a_bound_service_account_token_review_names_the_caller_and_its_pod() -> None:
    caller = caller_from_review(review(extra={POD_NAME_KEY: ["ztunnel-x"], POD_UID_KEY: ["uid-1"]}))
    assert caller == Caller("istio-system", "ztunnel", "ztunnel-x", "uid-1")
    assert caller.identity("cluster.local") == SpiffeId("cluster.local", "istio-system", "ztunnel")


def test_an_unbound_token_has_no_pod() -> None:
    caller = caller_from_review(review()["status"])
    assert caller.pod_name is None and caller.pod_uid is None


@pytest.mark.parametrize(
    "answer",
    [
        review(authenticated=False, error="invalid signature"),
        review(groups=["system:authenticated"]),
        review(username="system:serviceaccount:ns"),
        review(username="system:serviceaccount:ns:sa:extra"),
        review(username="system:node:node-1:x"),
        review(username="alice"),
        review(username="system:serviceaccount::sa"),
        {"status": "yes"},
        {"status": {"authenticated": True}},
    ],
    ids=[
        "not-authenticated",
        "not-a-service-account-group",
        "three-parts",
        "five-parts",
        "a-node-user",
        "a-human",
        "empty-namespace",
        "status-not-object",
        "no-user",
    ],
)
def test_reviews_that_do_not_name_a_service_account_are_unauthenticated(answer: dict[str, Any]) -> None:
    with pytest.raises(AuthenticationError):
        caller_from_review(answer)


@given(json_values())
def test_any_review_answer_gives_a_caller_or_authentication_error(answer: Any) -> None:
    if not isinstance(answer, dict):
        answer = {"status": answer}
    with contextlib.suppress(AuthenticationError):
        caller_from_review(answer)


@given(st.lists(st.tuples(st.sampled_from(["authorization", "clusterid", "x"]), st.text() | st.binary())))
def test_any_metadata_gives_a_token_or_authentication_error(metadata: list[tuple[str, str | bytes]]) -> None:
    with contextlib.suppress(AuthenticationError):
        assert bearer_token(metadata)


class _Reviewer:
    def __init__(self, answer: dict[str, Any] | Exception) -> None:
        self.answer = answer
        self.asked: list[tuple[str, tuple[str, ...]]] = []

    async def token_review(self, token: str, audiences: Sequence[str] | None = None) -> dict[str, Any]:
        self.asked.append((token, tuple(audiences or ())))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def test_the_authenticator_reviews_the_token_for_the_istio_ca_audience() -> None:
    reviewer = _Reviewer(review(username="system:serviceaccount:shop:web"))
    caller = await KubeAuthenticator(reviewer).authenticate([("authorization", "Bearer t0k")])
    assert caller == Caller("shop", "web")
    assert reviewer.asked == [("t0k", ("istio-ca",))]


async def test_an_unreachable_api_server_is_an_authentication_error() -> None:
    authenticator = KubeAuthenticator(_Reviewer(KubeClientError("connection refused")))
    with pytest.raises(AuthenticationError, match="connection refused"):
        await authenticator.authenticate([("authorization", "Bearer t0k")])
