"""The ``admission.k8s.io/v1`` AdmissionReview exchange with a webhook, and the errors it ends in; pure.

Theory of operation: :func:`build_admission_review` makes the request body from :class:`AdmissionAttributes`
and a fresh uid; :func:`read_admission_response` checks the answer the way kube-apiserver's
``VerifyAdmissionResponse`` does (a ``response``, the same uid, ``apiVersion``/``kind``, patch and patchType
together and only from a mutating webhook) before anything in it is used. Anything wrong with the exchange is a
:class:`WebhookCallError`, which the caller turns into a 500 or ignores according to failurePolicy.

Errors are worded as kube-apiserver words them, so users can search for them:

- a denial keeps the webhook's Status, its ``code`` raised to at least 400 (400 when absent) and its message
  prefixed ``admission webhook "<name>" denied the request: ``;
- a failure to call under ``failurePolicy: Fail`` is ``Internal error occurred: failed calling webhook
  "<name>": <why>``, where ``<why>`` starts ``failed to call webhook:`` for transport and decoding trouble and
  ``received invalid webhook response:`` for a well-formed answer that breaks the protocol.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ambit.apiserver.admission_match import AdmissionAttributes
from ambit.apiserver.errors import ApiError
from ambit.errors import AmbitError

REVIEW_API_VERSION = "admission.k8s.io/v1"
_OPTIONS_KINDS = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}
_INVALID = "received invalid webhook response"


class WebhookCallError(AmbitError):
    """A webhook could not be called or answered nonsense (kube's ErrCallingWebhook); failurePolicy decides."""


@dataclass(frozen=True, slots=True)
class WebhookResponse:
    """The checked ``response`` of a webhook's AdmissionReview; ``patch`` is the base64-decoded bytes."""

    allowed: bool
    status: Mapping[str, Any] | None
    patch: bytes
    patch_type: str | None
    warnings: tuple[str, ...]


def build_admission_review(attrs: AdmissionAttributes, uid: str) -> dict[str, Any]:
    """The AdmissionReview sent to a webhook; empty optional fields are left out, as Go's omitempty does."""
    kind = {"group": attrs.kind_group, "version": attrs.kind_version, "kind": attrs.kind}
    resource = {"group": attrs.group, "version": attrs.version, "resource": attrs.resource}
    # Go's omitempty: empty fields of UserInfo are left out.
    user = {key: value for key, value in attrs.user_info.items() if value}
    request: dict[str, Any] = {
        "uid": uid,
        "kind": kind,
        "resource": resource,
        "requestKind": dict(kind),
        "requestResource": dict(resource),
        "operation": attrs.operation,
        "userInfo": user,
        "object": attrs.object,
        "oldObject": attrs.old_object,
        "dryRun": attrs.dry_run,
        "options": dict(attrs.options) if attrs.options is not None else _default_options(attrs),
    }
    if attrs.subresource:
        request["subResource"] = request["requestSubResource"] = attrs.subresource
    if attrs.name:
        request["name"] = attrs.name
    if attrs.namespace:
        request["namespace"] = attrs.namespace
    return {"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "request": request}


def _default_options(attrs: AdmissionAttributes) -> dict[str, Any] | None:
    kind = _OPTIONS_KINDS.get(attrs.operation)
    if kind is None:
        return None
    options: dict[str, Any] = {"kind": kind, "apiVersion": "meta.k8s.io/v1"}
    if attrs.dry_run:
        options["dryRun"] = ["All"]
    return options


def read_admission_response(body: bytes, uid: str, *, mutating: bool) -> WebhookResponse:
    """Decode and check a webhook's answer; raises :class:`WebhookCallError` saying what is wrong with it."""
    try:
        review = json.loads(body)
    except ValueError as exc:
        raise WebhookCallError(f"failed to call webhook: the response is not JSON: {exc}") from None
    response = review.get("response") if isinstance(review, dict) else None
    if not isinstance(response, dict):
        raise WebhookCallError(f"{_INVALID}: webhook response was absent")
    if response.get("uid") != uid:
        got = json.dumps(response.get("uid"))
        raise WebhookCallError(f'{_INVALID}: expected response.uid="{uid}", got {got}')
    if review.get("apiVersion") != REVIEW_API_VERSION or review.get("kind") != "AdmissionReview":
        raise WebhookCallError(
            f"{_INVALID}: expected webhook response of {REVIEW_API_VERSION}, Kind=AdmissionReview, "
            f"got {review.get('apiVersion')}, Kind={review.get('kind')}"
        )
    allowed = response.get("allowed", False)
    status = response.get("status")
    warnings = response.get("warnings") or []
    patch_text = response.get("patch") or ""
    patch_type = response.get("patchType")
    if (
        not isinstance(allowed, bool)
        or not isinstance(status, dict | None)
        or not isinstance(warnings, list)
        or not all(isinstance(w, str) for w in warnings)
        or not isinstance(patch_text, str)
        or not isinstance(patch_type, str | None)
    ):
        raise WebhookCallError("failed to call webhook: fields of the response have the wrong JSON types")
    try:
        patch = base64.b64decode(patch_text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise WebhookCallError(f"failed to call webhook: response.patch is not base64: {exc}") from None
    if mutating:
        if patch and patch_type is None:
            raise WebhookCallError(f"{_INVALID}: webhook returned response.patch but not response.patchType")
        if not patch and patch_type is not None:
            raise WebhookCallError(f"{_INVALID}: webhook returned response.patchType but not response.patch")
        if patch_type == "":
            raise WebhookCallError(f'{_INVALID}: webhook returned invalid response.patchType of ""')
    elif patch:
        raise WebhookCallError(f"{_INVALID}: validating webhook may not return response.patch")
    elif patch_type is not None:
        raise WebhookCallError(f"{_INVALID}: validating webhook may not return response.patchType")
    return WebhookResponse(allowed, status, patch, patch_type, tuple(warnings))


def denial_error(webhook_name: str, status: Mapping[str, Any] | None) -> ApiError:
    """The error for ``allowed: false``: the webhook's Status, made a failure of at least 400."""
    status = status or {}
    code = status.get("code")
    # kube-apiserver raises codes below 400 to 400; codes past 599 are not HTTP error codes, so they go too.
    if not isinstance(code, int) or isinstance(code, bool) or not 400 <= code <= 599:
        code = 400
    reason = status.get("reason")
    reason = reason if isinstance(reason, str) else ""
    message = status.get("message")
    message = message if isinstance(message, str) else ""
    denied = f'admission webhook "{webhook_name}" denied the request'
    if message:
        text = f"{denied}: {message}"
    elif reason:
        text = f"{denied}: {reason}"
    else:
        text = f"{denied} without explanation"
    details = status.get("details")
    return ApiError(code, reason, text, details=details if isinstance(details, dict) else None)


def internal_error(why: str) -> ApiError:
    """kube-apiserver's ``NewInternalError``: 500, the cause repeated in ``details.causes``."""
    return ApiError(500, "InternalError", f"Internal error occurred: {why}", details={"causes": [{"message": why}]})


def calling_error(webhook_name: str, failure: WebhookCallError) -> ApiError:
    """A failure to call a webhook whose failurePolicy is ``Fail``."""
    return internal_error(f'failed calling webhook "{webhook_name}": {failure}')
