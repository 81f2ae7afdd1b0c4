"""What can go wrong talking to an API server, translated from httpx at the client's boundary.

::

    KubeClientError              a request to an API server failed (connect, TLS, timeout, broken or undecodable
    │                            response): nothing is known about whether the server acted on it
    ├── KubeConfigError          local misuse: no usable kubeconfig or in-cluster configuration
    └── KubeApiStatusError       the server answered with a Status (``code``, ``reason``, ``message``)
        ├── KubeBadRequestError      400
        ├── KubeUnauthorizedError    401  our credentials were not accepted
        ├── KubeForbiddenError       403
        ├── KubeNotFoundError        404
        ├── KubeAlreadyExistsError   409  reason AlreadyExists (create of an existing name)
        ├── KubeConflictError        409  reason Conflict (stale resourceVersion: re-read and retry)
        ├── KubeGoneError            410  the resourceVersion is older than the server's history: relist
        └── KubeInvalidError         422  the object failed validation (``causes`` has the fields)

The HTTP code of each Status subclass is its ``code`` class attribute; :func:`status_error` picks the class for a
Status document. A watch reports 410 either as an HTTP 410 or as an ``ERROR`` event carrying a Status: both
raise :class:`KubeGoneError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from ambit.errors import AmbitError


class KubeClientError(AmbitError):
    """A request to an API server failed before a Status came back."""


class KubeConfigError(KubeClientError):
    """The client could not be configured (kubeconfig or in-cluster files missing or malformed)."""


class KubeApiStatusError(KubeClientError):
    """The server refused a request and said why in a ``Status``."""

    code: ClassVar[int] = 0
    """The HTTP code this class stands for (0 on the base class: any code)."""

    def __init__(self, status: Mapping[str, Any], http_code: int | None = None) -> None:
        self.status: dict[str, Any] = dict(status)
        code = status.get("code")
        self.status_code: int = code if isinstance(code, int) and code else (http_code or self.code)
        self.reason: str = str(status.get("reason") or "")
        self.message: str = str(status.get("message") or "")
        super().__init__(f"{self.status_code} {self.reason or 'Error'}: {self.message}")

    @property
    def details(self) -> dict[str, Any]:
        details = self.status.get("details")
        return details if isinstance(details, dict) else {}

    @property
    def causes(self) -> list[dict[str, Any]]:
        causes = self.details.get("causes")
        return [c for c in causes if isinstance(c, dict)] if isinstance(causes, list) else []

    @property
    def is_not_found(self) -> bool:
        return self.status_code == 404

    @property
    def is_already_exists(self) -> bool:
        return self.status_code == 409 and self.reason == "AlreadyExists"

    @property
    def is_conflict(self) -> bool:
        return self.status_code == 409 and self.reason != "AlreadyExists"

    @property
    def is_gone(self) -> bool:
        return self.status_code == 410

    @property
    def is_invalid(self) -> bool:
        return self.status_code == 422

    @property
    def is_forbidden(self) -> bool:
        return self.status_code == 403

    @property
    def is_unauthorized(self) -> bool:
        return self.status_code == 401


class KubeBadRequestError(KubeApiStatusError):
    code = 400


class KubeUnauthorizedError(KubeApiStatusError):
    code = 401


class KubeForbiddenError(KubeApiStatusError):
    code = 403


class KubeNotFoundError(KubeApiStatusError):
    code = 404


class KubeAlreadyExistsError(KubeApiStatusError):
    code = 409


class KubeConflictError(KubeApiStatusError):
    code = 409


class KubeGoneError(KubeApiStatusError):
    code = 410


class KubeInvalidError(KubeApiStatusError):
    code = 422


_BY_CODE: dict[int, type[KubeApiStatusError]] = {
    400: KubeBadRequestError,
    401: KubeUnauthorizedError,
    403: KubeForbiddenError,
    404: KubeNotFoundError,
    409: KubeConflictError,
    410: KubeGoneError,
    422: KubeInvalidError,
}


def status_error(status: Mapping[str, Any], http_code: int | None = None) -> KubeApiStatusError:
    """The exception for a ``Status`` document (``http_code`` fills in a Status without ``code``)."""
    code = status.get("code")
    if not isinstance(code, int) or not code:
        code = http_code or 0
    cls = _BY_CODE.get(code, KubeApiStatusError)
    if code == 409 and status.get("reason") == "AlreadyExists":
        cls = KubeAlreadyExistsError
    return cls(status, http_code)


def response_error(http_code: int, reason_phrase: str, body: bytes) -> KubeApiStatusError:
    """The exception for an error response: its Status, or one made up from the code and body (a proxy's page)."""
    if body:
        try:
            doc = msgspec.json.decode(body)
        except msgspec.DecodeError:
            doc = None
        if isinstance(doc, dict) and doc.get("kind") == "Status":
            return status_error(doc, http_code)
    text = body[:512].decode("utf-8", "replace").strip()
    reason = reason_phrase or "Error"
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": http_code, "reason": reason}
    status["message"] = text or reason
    return status_error(status, http_code)
