"""Who is calling the CA: a bearer service-account token, checked by the API server's TokenReview (spec §5.3).

Theory of operation: every CreateCertificate call carries ``authorization: Bearer <JWT>`` and ``clusterid`` in its
gRPC metadata (spec §5.2). :func:`bearer_token` pulls the token out of the metadata and checks the cluster;
:class:`KubeAuthenticator` asks the API server (embedded or real) for a TokenReview with audiences
``["istio-ca"]``, so the API server does every cryptographic and liveness check (signature, expiry, audience,
bound pod and service account still existing with the same uids). :func:`caller_from_review` then reads the
answer, purely:

1. ``status.authenticated`` must be true, and ``status.user.groups`` must include ``system:serviceaccounts``.
2. ``status.user.username`` must be ``system:serviceaccount:<ns>:<sa>``: exactly four colon-separated parts.
3. The pod the token is bound to, when it is, comes from ``user.extra`` keys
   ``authentication.kubernetes.io/pod-name`` and ``.../pod-uid`` (the first value of each).

The result is a :class:`Caller`; every failure is an :class:`AuthenticationError` whose message says why (for
our logs: the caller is told only that authentication failed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ambit.controlplane.ca.errors import AuthenticationError
from ambit.k8s.errors import KubeClientError
from ambit.model.identity import IdentityError, SpiffeId, check_path_segment

TOKEN_AUDIENCE = "istio-ca"
"""What CA tokens must be issued for (istiod's ``TOKEN_AUDIENCES`` default)."""
DEFAULT_CLUSTER_ID = "Kubernetes"
"""The cluster a node proxy claims when it names none (ztunnel's ``CLUSTER_ID`` default)."""

SERVICE_ACCOUNTS_GROUP = "system:serviceaccounts"
POD_NAME_KEY = "authentication.kubernetes.io/pod-name"
POD_UID_KEY = "authentication.kubernetes.io/pod-uid"
_BEARER = "bearer "

Metadata = Iterable[tuple[str, str | bytes]]
"""gRPC invocation metadata: (lower-case key, value) pairs."""


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated service account, and the pod its token is bound to (if it is)."""

    namespace: str
    service_account: str
    pod_name: str | None = None
    pod_uid: str | None = None

    def identity(self, trust_domain: str) -> SpiffeId:
        """The caller's own SPIFFE id, which is what it gets unless it impersonates."""
        return SpiffeId(trust_domain, self.namespace, self.service_account)

    def __str__(self) -> str:
        pod = f" (pod {self.pod_name})" if self.pod_name else ""
        return f"{self.namespace}/{self.service_account}{pod}"


def bearer_token(metadata: Metadata, *, cluster_id: str = DEFAULT_CLUSTER_ID) -> str:
    """The token of the one ``authorization: Bearer`` entry; the ``clusterid`` entry, if any, must be ours."""
    tokens: list[str] = []
    for key, raw in metadata:
        value = raw.decode("latin-1") if isinstance(raw, bytes) else raw
        name = key.lower()
        if name == "clusterid" and value and value != cluster_id:
            raise AuthenticationError(f"caller claims cluster {value!r}; this CA serves only {cluster_id!r}")
        if name == "authorization":
            if value[: len(_BEARER)].lower() != _BEARER:
                raise AuthenticationError("authorization metadata is not a Bearer token")
            tokens.append(value[len(_BEARER) :].strip())
    if not tokens:
        raise AuthenticationError("no authorization metadata: a Bearer service-account token is required")
    if len(tokens) > 1:
        raise AuthenticationError(f"{len(tokens)} authorization entries; exactly one is allowed")
    if not tokens[0]:
        raise AuthenticationError("the Bearer token is empty")
    return tokens[0]


def caller_from_review(review: Mapping[str, Any]) -> Caller:
    """Read a TokenReview answer (the whole object or its ``status``) by rules 1-3 of the module docstring."""
    status = review.get("status", review)
    if not isinstance(status, Mapping):
        raise AuthenticationError("TokenReview answer has no status object")
    if status.get("authenticated") is not True:
        reason = status.get("error") or "not authenticated"
        raise AuthenticationError(f"token review failed: {reason}")
    user = status.get("user")
    if not isinstance(user, Mapping):
        raise AuthenticationError("TokenReview status has no user")
    groups = user.get("groups")
    if not isinstance(groups, list) or SERVICE_ACCOUNTS_GROUP not in groups:
        raise AuthenticationError(f"the token's user is not in group {SERVICE_ACCOUNTS_GROUP}")
    namespace, service_account = _service_account(user.get("username"))
    extra = user.get("extra")
    extra = extra if isinstance(extra, Mapping) else {}
    return Caller(
        namespace=namespace,
        service_account=service_account,
        pod_name=_first(extra, POD_NAME_KEY),
        pod_uid=_first(extra, POD_UID_KEY),
    )


class TokenReviewer(Protocol):
    """What :class:`KubeAuthenticator` needs of the API client (``ambit.k8s.KubeClient`` has it)."""

    async def token_review(self, token: str, audiences: Sequence[str] | None = None) -> dict[str, Any]: ...


class KubeAuthenticator:
    """Authenticates CA callers by TokenReview against one API server."""

    def __init__(
        self,
        reviewer: TokenReviewer,
        *,
        audiences: Sequence[str] = (TOKEN_AUDIENCE,),
        cluster_id: str = DEFAULT_CLUSTER_ID,
    ) -> None:
        if not audiences:
            raise ValueError("a CA authenticator needs at least one token audience")
        self._reviewer = reviewer
        self._audiences = tuple(audiences)
        self._cluster_id = cluster_id

    async def authenticate(self, metadata: Metadata) -> Caller:
        """The caller named by the metadata's bearer token, else :class:`AuthenticationError`."""
        token = bearer_token(metadata, cluster_id=self._cluster_id)
        try:
            review = await self._reviewer.token_review(token, self._audiences)
        except KubeClientError as exc:
            raise AuthenticationError(f"TokenReview request failed: {exc}") from None
        return caller_from_review(review)


def _service_account(username: object) -> tuple[str, str]:
    if not isinstance(username, str):
        raise AuthenticationError("the token's user has no username")
    parts = username.split(":")
    if len(parts) != 4 or parts[0] != "system" or parts[1] != "serviceaccount":
        raise AuthenticationError(f"user {username!r} is not system:serviceaccount:<namespace>:<name>")
    try:
        check_path_segment("namespace", parts[2])
        check_path_segment("service account", parts[3])
    except IdentityError as exc:
        raise AuthenticationError(f"user {username!r}: {exc}") from None
    return parts[2], parts[3]


def _first(extra: Mapping[str, Any], key: str) -> str | None:
    values = extra.get(key)
    if isinstance(values, list) and values and isinstance(values[0], str) and values[0]:
        return values[0]
    return None
