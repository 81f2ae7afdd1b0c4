"""AdmissionReview v1 in, AdmissionReview v1 out: the webhook's decision, with no I/O (spec §10.4).

Theory of operation. :func:`parse_review` turns the posted bytes into a :class:`ReviewRequest` or raises
:class:`MalformedReviewError` naming what is missing (the server answers that with 400). :func:`answer` decides:

Rule 1, only CREATE and UPDATE are checked; any other operation is allowed.
Rule 2, the annotation ``internal.istio.io/webhook-always-reject`` rejects the object (istiod's self-test).
Rule 3, a (group, kind) without a validator is rejected as an unrecognized type, as istiod does: the webhook's
rules only send kinds it knows, so anything else is a misconfiguration worth noticing.
Rule 4, any field error rejects the object: ``allowed: false`` and a 400 Status whose message is
``configuration is invalid: <path>: <problem>; ...``; warnings ride along as ``response.warnings``.

Invariant: the response's ``uid`` is always the request's.

:func:`verdict` also names, as istiod's ``galley_validation_failed`` metric does, why a request did not pass:
``unsupported_operation`` (any operation but CREATE and UPDATE: allowed, yet not validated), ``unknown_type`` (rule
3) or ``invalid_resource`` (rules 2 and 4); "" when it passed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.webhook.errors import MalformedReviewError
from ambit.controlplane.webhook.validation import VALIDATORS, invalid_message, rejections, validate

API_VERSION = "admission.k8s.io/v1"
ALWAYS_REJECT = "internal.istio.io/webhook-always-reject"
_CHECKED = ("CREATE", "UPDATE")
UNSUPPORTED_OPERATION = "unsupported_operation"
UNKNOWN_TYPE = "unknown_type"
INVALID = "invalid_resource"


@dataclass(frozen=True, slots=True)
class ReviewRequest:
    """The parts of ``AdmissionReview.request`` the decision needs."""

    uid: str
    operation: str
    group: str
    kind: str
    obj: Any
    """The object as sent (CREATE and UPDATE: the new object); None for other operations without one."""
    resource: tuple[str, str, str] = ("", "", "")
    """``request.resource``: the group, version and resource (plural) being admitted, as metrics label them."""
    dry_run: bool = False


def parse_review(body: bytes) -> ReviewRequest:
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedReviewError(f"malformed AdmissionReview: the body is not JSON ({exc})") from None
    if not isinstance(review, dict):
        raise MalformedReviewError("malformed AdmissionReview: expected a JSON object")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        raise MalformedReviewError(
            f"malformed AdmissionReview: expected apiVersion {API_VERSION} and kind AdmissionReview, "
            f"got {review.get('apiVersion')!r} and {review.get('kind')!r}"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise MalformedReviewError("malformed AdmissionReview: request is missing")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReviewError("malformed AdmissionReview: request.uid is missing")
    operation = request.get("operation")
    if not isinstance(operation, str) or not operation:
        raise MalformedReviewError("malformed AdmissionReview: request.operation is missing")
    kind = request.get("kind")
    if not isinstance(kind, dict) or not isinstance(kind.get("kind"), str) or not isinstance(kind.get("group"), str):
        raise MalformedReviewError("malformed AdmissionReview: request.kind must be {group, version, kind}")
    obj = request.get("object")
    if operation in _CHECKED and not isinstance(obj, dict):
        raise MalformedReviewError(f"malformed AdmissionReview: request.object must be an object for {operation}")
    resource = request.get("resource")
    gvr = ("", "", "")
    if isinstance(resource, dict):
        group, version, plural = (str(resource.get(part) or "")[:253] for part in ("group", "version", "resource"))
        gvr = (group, version, plural)
    return ReviewRequest(uid, operation, kind["group"], kind["kind"], obj, gvr, request.get("dryRun") is True)


def answer(request: ReviewRequest) -> dict[str, Any]:
    """The AdmissionReview to send back."""
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": decide(request)}


def decide(request: ReviewRequest) -> dict[str, Any]:
    """The ``AdmissionReview.response`` for one request."""
    return verdict(request)[0]


def verdict(request: ReviewRequest) -> tuple[dict[str, Any], str]:
    """The ``AdmissionReview.response`` for one request, and why it did not pass ("" if it did)."""
    allowed: dict[str, Any] = {"uid": request.uid, "allowed": True}
    if request.operation not in _CHECKED:
        return allowed, UNSUPPORTED_OPERATION
    metadata = request.obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    if isinstance(annotations, dict) and ALWAYS_REJECT in annotations:
        return _denied(request.uid, f"webhook configured to always reject (annotation {ALWAYS_REJECT})"), INVALID
    if (request.group, request.kind) not in VALIDATORS:
        return _denied(request.uid, f"unrecognized type {request.kind}.{request.group}"), UNKNOWN_TYPE
    errors = validate(request.kind, request.obj, group=request.group)
    warnings = [str(e) for e in errors if e.warning]
    rejected = bool(rejections(errors))
    response = _denied(request.uid, invalid_message(errors)) if rejected else allowed
    if warnings:
        response["warnings"] = warnings
    return response, INVALID if rejected else ""


def _denied(uid: str, message: str) -> dict[str, Any]:
    return {"uid": uid, "allowed": False, "status": {"code": 400, "reason": "BadRequest", "message": message}}
