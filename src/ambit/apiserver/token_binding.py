"""What a TokenRequest may ask for: kube-apiserver's validation and binding rules, pure.

Theory of operation: :class:`~ambit.apiserver.token_requests.TokenEndpoints` reads the objects a request names
from the store and asks these functions whether the request may be granted; each refusal is the
:class:`~ambit.apiserver.errors.ApiError` kube-apiserver answers (``pkg/apis/authentication/validation`` and
``pkg/registry/core/serviceaccount/storage/token.go``), checked in this order:

Rule 1. ``spec.expirationSeconds`` (default 3600) is an integer of at least 600 and at most 2^32: else 422
        Invalid, ``may not specify a duration less than 10 minutes`` / ``larger than 2^32 seconds``.
Rule 2. A ``boundObjectRef`` names a core (``v1``) Pod; any other kind (Secrets and Nodes included: Ambit cannot
        yet check them at review time) is 400 ``cannot bind token for serviceaccount "sa" to object of type``.
Rule 3. The pod exists in the request's namespace (else 404 ``pods "p" not found``) and runs as the service
        account the token is requested for (``spec.serviceAccountName``, ``default`` when unset), else 400
        ``cannot bind token for serviceaccount "sa" to pod running with different serviceaccount name.``: a token
        bound to a pod is a claim that the pod holds it, and the CA believes that claim.
Rule 4. A ``uid`` in the reference equals the pod's, else 409 ``the UID in the bound object reference (...) does
        not match the UID in record``: the pod was deleted and recreated.
Rule 5. The lifetime granted is the one asked for, capped at the server's maximum
        (``--service-account-max-token-expiration``), silently but for a warning; the answer's ``status``
        (``expirationTimestamp``) and ``spec.expirationSeconds`` say what was granted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ambit.apiserver import errors

MIN_EXPIRATION_SECONDS = 10 * 60
MAX_EXPIRATION_SECONDS = 2**32
DEFAULT_EXPIRATION_SECONDS = 3600
DEFAULT_MAX_TOKEN_EXPIRATION = 48 * 3600
"""The longest token the API server issues (kube's ``--service-account-max-token-expiration``; Ambit's default)."""
GROUP = "authentication.k8s.io"


def requested_expiration(spec: Mapping[str, Any]) -> int:
    """``spec.expirationSeconds`` by rule 1, else the 422 kube answers."""
    value = spec.get("expirationSeconds")
    if value is None:
        return DEFAULT_EXPIRATION_SECONDS
    if not isinstance(value, int) or isinstance(value, bool):
        raise _invalid(f"Invalid value: {value!r}: must be an integer number of seconds")
    if value < MIN_EXPIRATION_SECONDS:
        raise _invalid(f"Invalid value: {value}: may not specify a duration less than 10 minutes")
    if value > MAX_EXPIRATION_SECONDS:
        raise _invalid(f"Invalid value: {value}: may not specify a duration larger than 2^32 seconds")
    return value


def granted_expiration(requested: int, maximum: int) -> tuple[int, str | None]:
    """Rule 5: the lifetime granted and, when it is shorter than asked, kube's warning."""
    if 0 < maximum < requested:
        return maximum, f"requested expiration of {requested} seconds shortened to {maximum} seconds"
    return requested, None


def bound_pod_name(service_account: str, ref: Any) -> str:
    """Rule 2: the name of the pod ``ref`` binds to, else kube's 400 (or 422 for a reference that is no object)."""
    if not isinstance(ref, Mapping):
        raise errors.invalid("TokenRequest", "", [("spec.boundObjectRef", "must be an object")], GROUP)
    api_version, kind = str(ref.get("apiVersion") or "v1"), str(ref.get("kind") or "")
    group = api_version.partition("/")[0] if "/" in api_version else ""
    if group != "" or kind != "Pod":
        gvk = f"{group + '/' if group else '/'}{api_version.rpartition('/')[2]}, Kind={kind}"
        raise errors.bad_request(f'cannot bind token for serviceaccount "{service_account}" to object of type "{gvk}"')
    name = ref.get("name")
    if not isinstance(name, str) or not name:
        raise errors.invalid("TokenRequest", "", [("spec.boundObjectRef.name", "Required value")], GROUP)
    return name


def check_bound_pod(service_account: str, ref: Mapping[str, Any], pod: Mapping[str, Any] | None) -> str:
    """Rules 3 and 4 for the pod the store holds under the reference's name; its uid when the binding holds."""
    name = str(ref.get("name"))
    if pod is None:
        raise errors.not_found("pods", name)
    spec = pod.get("spec") or {}
    runs_as = str(spec.get("serviceAccountName") or "default")
    if runs_as != service_account:
        raise errors.bad_request(
            f'cannot bind token for serviceaccount "{service_account}" to pod running with different '
            "serviceaccount name."
        )
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    wanted = ref.get("uid")
    if wanted and wanted != uid:
        raise errors.conflict(
            "Pod",
            name,
            f"the UID in the bound object reference ({wanted}) does not match the UID in record. "
            "The object might have been deleted and then recreated",
        )
    return uid


def _invalid(message: str) -> errors.ApiError:
    return errors.invalid("TokenRequest", "", [("spec.expirationSeconds", message)], GROUP)
