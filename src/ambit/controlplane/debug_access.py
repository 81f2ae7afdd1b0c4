"""Who may read the control plane's debug state (the sync status behind ``ambit proxy-status``).

Theory of operation: the sync status is served on the xDS port as the debug type ``istio.io/debug/syncz``
(:mod:`ambit.xds.sync`), so every reader has already passed the stream's authentication: a service-account token
with audience ``istio-ca``, checked by TokenReview (:mod:`ambit.controlplane.ca.authn`). What the status tells
(every proxy's node, identity and namespace) is mesh-wide, so, unlike a proxy's own configuration, it is not for
workloads. A caller may read it when, checked in this order:

Rule 1. Its account is one of the debug accounts (default ``istio-system/istiod``, the control plane's own): only
        those RBAC allows to create tokens for that account (cluster administrators) can present one. This is
        the account ``ambit proxy-status`` mints a short-lived token for with the operator's kubeconfig, as
        istioctl does for its xDS debug requests.
Rule 2. Otherwise the API server's RBAC decides: a SubjectAccessReview for the caller's user and its service-
        account groups must allow ``get`` on the non-resource URL ``/debug/syncz`` (``cluster-admin`` has it;
        an operator grants it to another account with a ClusterRole naming that URL). A failed review refuses.

Node proxies, waypoints, gateways and workloads match neither by default and are refused. :func:`access_review`
and :func:`review_allows` are pure; :class:`DebugAccessChecker` is the shell that sends the review.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from ambit.k8s.errors import KubeClientError
from ambit.k8s.kinds import SUBJECT_ACCESS_REVIEWS, ResourceKind
from ambit.xds.callers import Caller

__all__ = ["DEBUG_ACCOUNTS", "DEBUG_PATH", "DebugAccessChecker", "access_review", "review_allows"]

log = logging.getLogger("ambit.controlplane.debug")

DEBUG_PATH = "/debug/syncz"
DEBUG_ACCOUNTS: frozenset[str] = frozenset({"istio-system/istiod"})
"""``namespace/service account`` pairs that may read the debug state without an RBAC rule (rule 1)."""
_SA_PREFIX = "system:serviceaccount:"


def account_of(caller: Caller) -> str | None:
    """``namespace/name`` of a service-account caller, else None."""
    if not caller.name.startswith(_SA_PREFIX):
        return None
    namespace, _, name = caller.name[len(_SA_PREFIX) :].partition(":")
    return f"{namespace}/{name}" if namespace and name and ":" not in name else None


def access_review(caller: Caller, path: str = DEBUG_PATH) -> dict[str, Any]:
    """The SubjectAccessReview of rule 2: may this service account ``get`` the non-resource URL ``path``?"""
    groups = ["system:serviceaccounts", "system:authenticated"]
    account = account_of(caller)
    if account is not None:
        groups.insert(1, f"system:serviceaccounts:{account.partition('/')[0]}")
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": caller.name, "groups": groups, "nonResourceAttributes": {"path": path, "verb": "get"}},
    }


def review_allows(answer: Mapping[str, Any]) -> bool:
    """Whether a SubjectAccessReview answer allows: ``status.allowed`` is exactly true."""
    status = answer.get("status")
    return isinstance(status, Mapping) and status.get("allowed") is True


class ReviewClient(Protocol):
    """What the checker needs of the API client (``ambit.k8s.KubeClient`` has it)."""

    async def create(
        self, kind: ResourceKind, obj: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]: ...


class DebugAccessChecker:
    """Rules 1 and 2 against one API server; call it with the stream's caller."""

    def __init__(self, client: ReviewClient, *, accounts: frozenset[str] = DEBUG_ACCOUNTS) -> None:
        self._client = client
        self._accounts = accounts

    async def __call__(self, caller: Caller) -> bool:
        account = account_of(caller)
        if account is not None and account in self._accounts:
            return True
        try:
            answer = await self._client.create(SUBJECT_ACCESS_REVIEWS, access_review(caller))
        except KubeClientError as exc:
            log.warning("debug access: SubjectAccessReview for %s failed: %s", caller.name, exc)
            return False
        return review_allows(answer)
