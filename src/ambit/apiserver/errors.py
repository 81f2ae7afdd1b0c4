"""Errors the API server answers with: each becomes a Kubernetes ``Status`` object with the right HTTP code.

Client mistakes are 4xx and never store anything; a 500 is always our bug, but for one that kube-apiserver answers
with 500 too: an object over etcd's size limit (``etcdserver: request is too large``, no reason).
"""

from __future__ import annotations

from typing import Any

from ambit.errors import AmbitError


class ApiError(AmbitError):
    """A failed request, carried to the client as a ``Status`` (``reason`` is a Kubernetes StatusReason)."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def to_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if not self.reason:  # StatusReasonUnknown, which kube omits (kubectl then says "Error from server: ...")
            del status["reason"]
        if self.details is not None:
            status["details"] = self.details
        return status


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def unauthorized(message: str = "Unauthorized") -> ApiError:
    return ApiError(401, "Unauthorized", message)


def forbidden(message: str) -> ApiError:
    return ApiError(403, "Forbidden", message)


def not_found(resource: str, name: str, group: str = "") -> ApiError:
    shown = f"{resource}.{group}" if group else resource
    return ApiError(
        404,
        "NotFound",
        f'{shown} "{name}" not found',
        details={"name": name, "group": group, "kind": resource},
    )


def no_such_path(path: str) -> ApiError:
    return ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")


def method_not_allowed(message: str) -> ApiError:
    return ApiError(405, "MethodNotAllowed", message)


def already_exists(resource: str, name: str, group: str = "") -> ApiError:
    shown = f"{resource}.{group}" if group else resource
    return ApiError(
        409,
        "AlreadyExists",
        f'{shown} "{name}" already exists',
        details={"name": name, "group": group, "kind": resource},
    )


def conflict(resource: str, name: str, why: str, group: str = "") -> ApiError:
    shown = f"{resource}.{group}" if group else resource
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {shown} "{name}": {why}',
        details={"name": name, "group": group, "kind": resource},
    )


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def too_large(limit: int) -> ApiError:
    return entity_too_large(f"limit is {limit}")


def entity_too_large(message: str) -> ApiError:
    """413 as kube-apiserver words it: ``Request entity too large: limit is 3145728``."""
    return ApiError(413, "RequestEntityTooLarge", f"Request entity too large: {message}")


def unsupported_media_type(content_type: str) -> ApiError:
    return ApiError(415, "UnsupportedMediaType", f"the media type {content_type!r} is not supported here")


def invalid(kind: str, name: str, causes: list[tuple[str, str]], group: str = "") -> ApiError:
    """422 Invalid; ``causes`` are (field path, message) pairs, shown as kube-apiserver shows them."""
    text = ", ".join(f"{field}: {msg}" for field, msg in causes)
    return ApiError(
        422,
        "Invalid",
        f'{kind} "{name}" is invalid: {text}',
        details={
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [{"reason": "FieldValueInvalid", "message": msg, "field": field} for field, msg in causes],
        },
    )


def unprocessable(message: str) -> ApiError:
    return ApiError(422, "Invalid", message)


def internal(message: str) -> ApiError:
    return ApiError(500, "InternalError", message)


def timeout(message: str) -> ApiError:
    return ApiError(504, "Timeout", message)


def too_many_requests(message: str, retry_after: int) -> ApiError:
    """429 as kube-apiserver's API Priority and Fairness answers it; the shell adds ``Retry-After``."""
    return ApiError(429, "TooManyRequests", message, details={"retryAfterSeconds": retry_after})
