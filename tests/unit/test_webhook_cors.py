"""The webhook's checks of an HTTPRoute ``CORS`` filter (ambit.controlplane.webhook.gateway), as the Gateway API CRD
validates it: the conformance manifests and other valid filters are admitted; each CRD rule refuses its own bad
object with the field named; an AdmissionReview is denied with that line; hostile and arbitrary input (hypothesis)
gives field errors only, and what is admitted is translated with every origin kept."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.unit.json_strategies import cors_filter_specs, perturbed

from ambit.controlplane.translate.cors_filter import cors_policy
from ambit.controlplane.webhook import FieldError, answer, parse_review, validate


def route(*filters: dict[str, Any], on_backend: bool = False) -> dict[str, Any]:
    backend: dict[str, Any] = {"name": "web", "port": 80}
    rule: dict[str, Any] = {"backendRefs": [backend]}
    if on_backend:
        backend["filters"] = list(filters)
    else:
        rule["filters"] = list(filters)
    return {
        "kind": "HTTPRoute",
        "metadata": {"name": "r", "namespace": "default"},
        "spec": {"parentRefs": [{"name": "gw"}], "rules": [rule]},
    }


def cors(**fields: Any) -> dict[str, Any]:
    return {"type": "CORS", "cors": fields}


METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"]


def errors(obj: dict[str, Any]) -> list[FieldError]:
    return [e for e in validate("HTTPRoute", obj) if not e.warning]


# The manifests of HTTPRouteCORS (conformance/tests/httproute-cors.yaml), as written there.
UPSTREAM_FILTERS = [
    cors(
        allowOrigins=["https://www.foo.com", "https://*.bar.com"],
        allowMethods=["GET", "OPTIONS"],
        allowHeaders=["x-header-1", "x-header-2"],
        exposeHeaders=["x-header-3", "x-header-4"],
        allowCredentials=True,
        maxAge=3600,
    ),
    cors(allowOrigins=["https://www.foo.com"], allowMethods=["*"]),
    cors(allowOrigins=["*"], allowMethods=["PUT"], allowCredentials=False),
    cors(allowOrigins=["*"], allowMethods=["*"], allowHeaders=["*"], allowCredentials=True),
]


@pytest.mark.parametrize(
    "obj",
    [
        *(route(f) for f in UPSTREAM_FILTERS),
        route(cors()),  # every field is optional
        route(cors(allowOrigins=["http://localhost:8080", "https://*", "https://a-b.example.org:1"], maxAge=1)),
        route(cors(exposeHeaders=["*", "x-a"])),  # '*' beside others is refused for the three others only
        route(cors(allowOrigins=["https://a.com"]), {"type": "RequestHeaderModifier", "requestHeaderModifier": {}}),
        route(cors(allowOrigins=["https://a.com"]), on_backend=True),  # the CRD admits it; the translation refuses
    ],
)
def test_valid_cors_filters_are_admitted(obj: dict[str, Any]) -> None:
    assert errors(obj) == []


@pytest.mark.parametrize(
    ("obj", "path", "message"),
    [
        (route({"type": "CORS"}), "spec.rules[0].filters[0].cors", "required"),
        (
            route({"type": "URLRewrite", "urlRewrite": {}, "cors": {}}),
            "spec.rules[0].filters[0].cors",
            "must not be set when the filter type is URLRewrite",
        ),
        (
            route(cors(), {"type": "CORS", "cors": {}, "requestRedirect": {}}),
            "spec.rules[0].filters[1].requestRedirect",
            "must not be set",
        ),
        (route(cors(), cors()), "spec.rules[0].filters[1].type", "CORS filter cannot be repeated"),
        (route(cors(), cors(), on_backend=True), "spec.rules[0].backendRefs[0].filters[1].type", "cannot be repeated"),
        (route(cors(allowOrigins="https://a.com")), "spec.rules[0].filters[0].cors.allowOrigins", "expected an array"),
        (route(cors(allowOrigins=[""])), "spec.rules[0].filters[0].cors.allowOrigins[0]", "must not be empty"),
        (route(cors(allowOrigins=[7])), "spec.rules[0].filters[0].cors.allowOrigins[0]", "expected a string"),
        (route(cors(allowOrigins=["a.com"])), "spec.rules[0].filters[0].cors.allowOrigins[0]", "is not an origin"),
        (
            route(cors(allowOrigins=["https://a.*.com"])),
            "spec.rules[0].filters[0].cors.allowOrigins[0]",
            "is not an origin",
        ),
        (
            route(cors(allowOrigins=["ftp://a.com"])),
            "spec.rules[0].filters[0].cors.allowOrigins[0]",
            "is not an origin",
        ),
        (
            route(cors(allowOrigins=["https://a.com/"])),
            "spec.rules[0].filters[0].cors.allowOrigins[0]",
            "is not an origin",
        ),
        (
            route(cors(allowOrigins=["https://" + "a" * 250])),
            "spec.rules[0].filters[0].cors.allowOrigins[0]",
            "longer than 253",
        ),
        (
            route(cors(allowOrigins=["https://a.com", "https://a.com"])),
            "spec.rules[0].filters[0].cors.allowOrigins[1]",
            "duplicate value",
        ),
        (
            route(cors(allowOrigins=[f"https://a{i}.com" for i in range(65)])),
            "spec.rules[0].filters[0].cors.allowOrigins",
            "at most 64 items",
        ),
        (
            route(cors(allowOrigins=["*", "https://a.com"])),
            "spec.rules[0].filters[0].cors.allowOrigins",
            "'*' cannot be used alongside",
        ),
        (route(cors(allowMethods=["FETCH"])), "spec.rules[0].filters[0].cors.allowMethods[0]", "unsupported value"),
        (route(cors(allowMethods=["get"])), "spec.rules[0].filters[0].cors.allowMethods[0]", "unsupported value"),
        (route(cors(allowMethods=["*", "GET"])), "spec.rules[0].filters[0].cors.allowMethods", "alongside"),
        (
            route(cors(allowMethods=[*METHODS, "*"])),
            "spec.rules[0].filters[0].cors.allowMethods",
            "at most 9 items",
        ),
        (route(cors(allowHeaders=["x a"])), "spec.rules[0].filters[0].cors.allowHeaders[0]", "not a header name"),
        (route(cors(allowHeaders=["*", "x-a"])), "spec.rules[0].filters[0].cors.allowHeaders", "alongside"),
        (route(cors(exposeHeaders=["x:a"])), "spec.rules[0].filters[0].cors.exposeHeaders[0]", "not a header name"),
        (
            route(cors(exposeHeaders=["x" * 257])),
            "spec.rules[0].filters[0].cors.exposeHeaders[0]",
            "longer than 256",
        ),
        (route(cors(exposeHeaders=["a", "a"])), "spec.rules[0].filters[0].cors.exposeHeaders[1]", "duplicate"),
        (route(cors(allowCredentials="true")), "spec.rules[0].filters[0].cors.allowCredentials", "a boolean"),
        (route(cors(maxAge=0)), "spec.rules[0].filters[0].cors.maxAge", "out of range"),
        (route(cors(maxAge=2**31)), "spec.rules[0].filters[0].cors.maxAge", "out of range"),
        (route(cors(maxAge="60")), "spec.rules[0].filters[0].cors.maxAge", "expected an integer"),
        (
            route({"type": "CORS", "cors": []}),
            "spec.rules[0].filters[0].cors",
            "expected an object",
        ),
    ],
)
def test_each_crd_rule_refuses_its_bad_cors_filter_naming_the_field(
    obj: dict[str, Any], path: str, message: str
) -> None:
    found = errors(obj)
    assert any(e.path == path and message in e.message for e in found), found


def test_a_grpc_route_takes_no_cors_filter() -> None:
    obj = route(cors())
    obj["kind"] = "GRPCRoute"
    found = [e for e in validate("GRPCRoute", obj) if not e.warning]
    assert [(e.path, "unsupported value 'CORS'" in e.message) for e in found] == [
        ("spec.rules[0].filters[0].type", True)
    ]


def test_a_bad_cors_filter_is_denied_with_the_field_in_the_message() -> None:
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "1",
            "kind": {"group": "gateway.networking.k8s.io", "version": "v1", "kind": "HTTPRoute"},
            "operation": "CREATE",
            "object": route(cors(allowOrigins=["https://*.*.evil"])),
        },
    }
    response = answer(parse_review(json.dumps(review).encode()))["response"]
    assert response["allowed"] is False
    assert (
        "spec.rules[0].filters[0].cors.allowOrigins[0]: 'https://*.*.evil' is not an origin"
        in (response["status"]["message"])
    )


@pytest.mark.parametrize(
    "origin",
    ["https://" + "a" * 1_000_000 + "!", "https://" + "a." * 500_000 + "!", "https://" + "a-" * 500_000],
)
def test_a_huge_origin_is_refused_by_its_length(origin: str) -> None:
    """A megabyte origin costs one length check, not a pattern search."""
    found = errors(route(cors(allowOrigins=[origin])))
    assert [e.message.split(" (")[0] for e in found] == ["longer than 253 characters"]


@settings(max_examples=300, deadline=None)
@given(spec=perturbed(cors_filter_specs()), where=st.sampled_from(["rule", "backend"]))
@example(spec={"allowOrigins": None}, where="rule")  # CI found it: a null list is admitted, as an absent one
def test_any_cors_filter_gives_field_errors_only_and_an_admitted_one_keeps_every_origin(spec: Any, where: str) -> None:
    obj = route({"type": "CORS", "cors": spec}, on_backend=where == "backend")
    found = validate("HTTPRoute", obj)
    assert all(isinstance(e, FieldError) and e.path.startswith("spec.rules[0]") for e in found)
    if not found:
        assert len(cors_policy(spec).allow_origins) == len(spec.get("allowOrigins") or [])  # null: as absent
