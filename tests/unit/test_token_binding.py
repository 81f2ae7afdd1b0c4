"""TokenRequest's validation and binding rules (ambit.apiserver.token_binding), as tables."""

from __future__ import annotations

from typing import Any

import pytest

from ambit.apiserver.errors import ApiError
from ambit.apiserver.token_binding import (
    DEFAULT_MAX_TOKEN_EXPIRATION,
    bound_pod_name,
    check_bound_pod,
    granted_expiration,
    requested_expiration,
)


def pod(sa: str | None = "ztunnel", uid: str = "uid-1") -> dict[str, Any]:
    spec = {} if sa is None else {"serviceAccountName": sa}
    return {"metadata": {"name": "p", "uid": uid}, "spec": spec}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [({}, 3600), ({"expirationSeconds": 600}, 600), ({"expirationSeconds": 2**32}, 2**32)],
)
def test_expiration_within_bounds_is_taken_as_asked(spec: dict[str, Any], expected: int) -> None:
    assert requested_expiration(spec) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (599, "Invalid value: 599: may not specify a duration less than 10 minutes"),
        (0, "may not specify a duration less than 10 minutes"),
        (-1, "may not specify a duration less than 10 minutes"),
        (2**32 + 1, "may not specify a duration larger than 2^32 seconds"),
        ("3600", "must be an integer"),
        (True, "must be an integer"),
        (3600.5, "must be an integer"),
    ],
)
def test_expiration_out_of_bounds_is_invalid(value: object, message: str) -> None:
    with pytest.raises(ApiError) as caught:
        requested_expiration({"expirationSeconds": value})
    assert caught.value.code == 422 and message in str(caught.value)
    assert "spec.expirationSeconds" in str(caught.value)


@pytest.mark.parametrize(
    ("requested", "maximum", "granted", "warned"),
    [
        (3600, DEFAULT_MAX_TOKEN_EXPIRATION, 3600, False),
        (DEFAULT_MAX_TOKEN_EXPIRATION, DEFAULT_MAX_TOKEN_EXPIRATION, DEFAULT_MAX_TOKEN_EXPIRATION, False),
        (2**32, DEFAULT_MAX_TOKEN_EXPIRATION, DEFAULT_MAX_TOKEN_EXPIRATION, True),
        (2**32, 0, 2**32, False),
    ],
)
def test_the_granted_lifetime_is_capped_with_a_warning(
    requested: int, maximum: int, granted: int, warned: bool
) -> None:
    got, warning = granted_expiration(requested, maximum)
    assert got == granted and (warning is not None) == warned
    if warning:
        assert warning == f"requested expiration of {requested} seconds shortened to {maximum} seconds"


@pytest.mark.parametrize(
    ("ref", "code", "message"),
    [
        ({"kind": "Secret", "apiVersion": "v1", "name": "s"}, 400, 'to object of type "/v1, Kind=Secret"'),
        ({"kind": "Node", "name": "n"}, 400, 'to object of type "/v1, Kind=Node"'),
        ({"kind": "Pod", "apiVersion": "apps/v1", "name": "p"}, 400, 'to object of type "apps/v1, Kind=Pod"'),
        ({"kind": "Pod"}, 422, "spec.boundObjectRef.name"),
        ("Pod/p", 422, "spec.boundObjectRef"),
    ],
)
def test_only_core_pods_can_be_bound(ref: Any, code: int, message: str) -> None:
    with pytest.raises(ApiError) as caught:
        bound_pod_name("ztunnel", ref)
    assert caught.value.code == code and message in str(caught.value)


def test_a_core_pod_reference_names_the_pod() -> None:
    assert bound_pod_name("ztunnel", {"kind": "Pod", "apiVersion": "v1", "name": "p"}) == "p"
    assert bound_pod_name("ztunnel", {"kind": "Pod", "name": "p"}) == "p"


@pytest.mark.parametrize(
    ("sa", "ref", "found", "code", "message"),
    [
        ("ztunnel", {"name": "p"}, None, 404, 'pods "p" not found'),
        ("ztunnel", {"name": "p"}, pod("web"), 400, "to pod running with different serviceaccount name."),
        ("ztunnel", {"name": "p"}, pod(None), 400, "to pod running with different serviceaccount name."),
        ("ztunnel", {"name": "p", "uid": "uid-0"}, pod(), 409, "the UID in the bound object reference (uid-0)"),
    ],
    ids=["missing", "another-account", "default-account", "replaced"],
)
def test_a_pod_binding_is_refused_as_kube_refuses_it(
    sa: str, ref: dict[str, Any], found: dict[str, Any] | None, code: int, message: str
) -> None:
    with pytest.raises(ApiError) as caught:
        check_bound_pod(sa, ref, found)
    assert caught.value.code == code and message in str(caught.value)


@pytest.mark.parametrize(
    ("sa", "ref", "found"),
    [
        ("ztunnel", {"name": "p"}, pod()),
        ("ztunnel", {"name": "p", "uid": "uid-1"}, pod()),
        ("default", {"name": "p"}, pod(None)),
    ],
)
def test_a_pod_running_as_the_account_can_be_bound(sa: str, ref: dict[str, Any], found: dict[str, Any]) -> None:
    assert check_bound_pod(sa, ref, found) == "uid-1"
