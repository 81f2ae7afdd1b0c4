"""The AdmissionReview exchange: what is sent, which answers are accepted, how denials are worded."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from ambit.apiserver.admission import AdmissionAttributes
from ambit.apiserver.admission_review import (
    WebhookCallError,
    build_admission_review,
    denial_error,
    read_admission_response,
)

UID = "5b3e0c1e-8f7e-4b7a-9d2a-1f0e3c4b5a69"
ATTRS = AdmissionAttributes(
    operation="UPDATE",
    group="apps",
    version="v1",
    resource="deployments",
    subresource="scale",
    kind_group="autoscaling",
    kind_version="v1",
    kind="Scale",
    namespace="default",
    name="api",
    object={"spec": {"replicas": 3}},
    old_object={"spec": {"replicas": 1}},
    user_info={
        "username": "alice",
        "uid": "u-1",
        "groups": ["devs", "system:authenticated"],
        "extra": {"scopes": ["a"]},
    },
    dry_run=True,
)


def answer(response: dict[str, Any] | None, **review: Any) -> bytes:
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response, **review}
    return json.dumps(body).encode()


def test_review_carries_the_request_as_kube_apiserver_sends_it() -> None:
    review = build_admission_review(ATTRS, UID)
    assert review["apiVersion"] == "admission.k8s.io/v1"
    assert review["kind"] == "AdmissionReview"
    assert review["request"] == {
        "uid": UID,
        "kind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "subResource": "scale",
        "requestKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
        "requestResource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "requestSubResource": "scale",
        "name": "api",
        "namespace": "default",
        "operation": "UPDATE",
        "userInfo": {
            "username": "alice",
            "uid": "u-1",
            "groups": ["devs", "system:authenticated"],
            "extra": {"scopes": ["a"]},
        },
        "object": {"spec": {"replicas": 3}},
        "oldObject": {"spec": {"replicas": 1}},
        "dryRun": True,
        "options": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1", "dryRun": ["All"]},
    }


def test_allowed_answer_with_warnings_is_accepted() -> None:
    response = read_admission_response(
        answer({"uid": UID, "allowed": True, "warnings": ["deprecated field"]}), UID, mutating=False
    )
    assert response.allowed
    assert response.warnings == ("deprecated field",)
    assert response.patch == b""


def test_patch_is_base64_decoded() -> None:
    ops = b'[{"op":"add","path":"/x","value":1}]'
    body = answer({"uid": UID, "allowed": True, "patchType": "JSONPatch", "patch": base64.b64encode(ops).decode()})
    response = read_admission_response(body, UID, mutating=True)
    assert response.patch == ops
    assert response.patch_type == "JSONPatch"


@pytest.mark.parametrize(
    ("body", "mutating", "why"),
    [
        (b"<html>oops</html>", False, "failed to call webhook: the response is not JSON"),
        (answer(None), False, "webhook response was absent"),
        (answer({"uid": "other", "allowed": True}), False, f'expected response.uid="{UID}", got "other"'),
        (answer({"allowed": True}), False, f'expected response.uid="{UID}", got null'),
        (
            answer({"uid": UID, "allowed": True}, apiVersion="admission.k8s.io/v1beta1"),
            False,
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview",
        ),
        (answer({"uid": UID, "allowed": "yes"}), False, "wrong JSON types"),
        (answer({"uid": UID, "allowed": True, "patch": "e30="}), True, "response.patch but not response.patchType"),
        (answer({"uid": UID, "allowed": True, "patchType": "JSONPatch"}), True, "patchType but not response.patch"),
        (answer({"uid": UID, "allowed": True, "patch": "e30="}), False, "validating webhook may not return"),
        (answer({"uid": UID, "allowed": True, "patch": "!!"}), True, "not base64"),
    ],
)
def test_broken_answers_are_failures_to_call(body: bytes, mutating: bool, why: str) -> None:
    with pytest.raises(WebhookCallError) as caught:
        read_admission_response(body, UID, mutating=mutating)
    assert why in str(caught.value)


@pytest.mark.parametrize(
    ("status", "code", "reason", "message"),
    [
        (None, 400, "", 'admission webhook "w.example.com" denied the request without explanation'),
        ({"message": "no"}, 400, "", 'admission webhook "w.example.com" denied the request: no'),
        ({"code": 200, "message": "no"}, 400, "", 'admission webhook "w.example.com" denied the request: no'),
        (
            {"code": 403, "reason": "Forbidden", "message": "no"},
            403,
            "Forbidden",
            'admission webhook "w.example.com" denied the request: no',
        ),
        (
            {"reason": "NotAcceptable"},
            400,
            "NotAcceptable",
            'admission webhook "w.example.com" denied the request: NotAcceptable',
        ),
        ({"code": 422, "message": "bad"}, 422, "", 'admission webhook "w.example.com" denied the request: bad'),
    ],
)
def test_denial_keeps_the_webhook_status_with_a_failure_code(
    status: dict[str, Any] | None, code: int, reason: str, message: str
) -> None:
    error = denial_error("w.example.com", status)
    assert (error.code, error.reason, error.message) == (code, reason, message)
