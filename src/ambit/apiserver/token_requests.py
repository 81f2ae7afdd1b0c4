"""The TokenRequest and TokenReview endpoints: issuing and reviewing tokens against what the store holds.

Theory of operation: :mod:`ambit.apiserver.tokens` signs and checks tokens and knows nothing of the store; this
module adds what needs it. A TokenRequest (``serviceaccounts/<name>/token``) needs the service account, and for a
token bound to a pod, that pod, running as that service account (with the uid the request names, if it names
one); :mod:`ambit.apiserver.token_binding` holds those rules and the lifetime's bounds and cap. A review
checks, after the signature, expiry and audiences, that the service account and the bound pod still exist with
the token's uids and that the pod is not past its deletion time. Time is the server's clock, read at each call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ambit.apiserver import errors
from ambit.apiserver.node_authorizer import restrict_token_request
from ambit.apiserver.requests import JsonObject, rfc3339, warn
from ambit.apiserver.store import Store
from ambit.apiserver.token_binding import (
    bound_pod_name,
    check_bound_pod,
    granted_expiration,
    requested_expiration,
)
from ambit.apiserver.tokens import (
    BoundObject,
    TokenIdentity,
    TokenIssuer,
    TokenRejected,
    check_bound_objects,
    token_review_status,
)

PODS = ("", "pods")
SERVICE_ACCOUNTS = ("", "serviceaccounts")


class TokenEndpoints:
    def __init__(self, store: Store, issuer: TokenIssuer, *, now: Callable[[], float]) -> None:
        self.store = store
        self.issuer = issuer
        self.now = now

    def request(self, namespace: str, name: str, body: Any, node: str | None = None) -> JsonObject:
        """Issue a TokenRequest; ``node``: the requester is that node, which may only bind tokens to its own pods."""
        sa = self.store.get(SERVICE_ACCOUNTS, namespace, name)
        if sa is None:
            raise errors.not_found("serviceaccounts", name)
        if not isinstance(body, dict):
            raise errors.bad_request("the TokenRequest must be an object")
        spec = body.get("spec", {})
        if spec is None:
            spec = {}
        if not isinstance(spec, dict):
            raise errors.bad_request("spec must be an object")
        audiences = spec.get("audiences") or list(self.issuer.default_audiences)
        if not isinstance(audiences, list) or not all(isinstance(a, str) for a in audiences):
            raise errors.invalid(
                "TokenRequest", name, [("spec.audiences", "must be a list of strings")], "authentication.k8s.io"
            )
        expiration, warning = granted_expiration(requested_expiration(spec), self.issuer.max_expiration_seconds)
        bound: BoundObject | None = None
        ref = spec.get("boundObjectRef")
        if ref:
            pod_name = bound_pod_name(name, ref)
            pod = self.store.get(PODS, namespace, pod_name)
            uid = check_bound_pod(name, ref, pod.obj if pod is not None else None)
            bound = BoundObject(pod_name, uid)
            if node is not None:
                restrict_token_request(node, pod.obj if pod is not None else None)
        elif node is not None:
            restrict_token_request(node, None)
        if warning is not None:
            warn([warning])
        now = self.now()
        issued = self.issuer.issue(
            namespace=namespace,
            service_account=name,
            service_account_uid=sa.obj["metadata"]["uid"],
            audiences=audiences,
            now=now,
            expiration_seconds=expiration,
            bound_pod=bound,
        )
        out_spec = dict(spec)
        out_spec["audiences"] = audiences
        out_spec["expirationSeconds"] = int(issued.expires_at) - int(now)  # the lifetime granted, whole seconds
        return {
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": rfc3339(now)},
            "spec": out_spec,
            "status": {"token": issued.token, "expirationTimestamp": rfc3339(issued.expires_at)},
        }

    def review(self, token: str, audiences: list[str]) -> TokenIdentity | TokenRejected:
        """Authenticate a service-account token: the signature, expiry and audience, and that what it is bound
        to (the service account, the pod) still exists with the same uid."""
        now = self.now()
        result = self.issuer.review(token, audiences=audiences, now=now)
        if isinstance(result, TokenRejected):
            return result
        sa = self.store.get(SERVICE_ACCOUNTS, result.namespace, result.service_account.name)
        pod_uid: str | None = None
        pod_deleting = False
        if result.pod is not None:
            pod = self.store.get(PODS, result.namespace, result.pod.name)
            if pod is not None:
                pod_uid = pod.obj["metadata"].get("uid")
                deletion = pod.obj["metadata"].get("deletionTimestamp")
                pod_deleting = bool(deletion) and str(deletion) < rfc3339(now)
        rejected = check_bound_objects(
            result,
            service_account_uid=sa.obj["metadata"].get("uid") if sa else None,
            pod_uid=pod_uid,
            pod_deleting=pod_deleting,
        )
        return rejected or result

    def token_review(self, body: Any) -> JsonObject:
        if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
            raise errors.bad_request("a TokenReview needs a spec")
        spec = body["spec"]
        token = spec.get("token")
        if not isinstance(token, str) or not token:
            raise errors.invalid("TokenReview", "", [("spec.token", "required")], "authentication.k8s.io")
        audiences = spec.get("audiences") or []
        if not isinstance(audiences, list) or not all(isinstance(a, str) for a in audiences):
            raise errors.invalid(
                "TokenReview", "", [("spec.audiences", "must be a list of strings")], "authentication.k8s.io"
            )
        result = self.review(token, audiences)
        status = token_review_status(result)
        return {
            "kind": "TokenReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": status,
        }
