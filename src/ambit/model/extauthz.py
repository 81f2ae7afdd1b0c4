"""An external authorizer (Istio's ``extensionProviders`` entry ``envoyExtAuthzHttp`` or ``envoyExtAuthzGrpc``), as
the mesh config declares it and an AuthorizationPolicy of action CUSTOM names it.

Theory of operation: the control plane parses the mesh config's providers into :class:`ExtAuthzProvider`
(:mod:`ambit.controlplane.translate.meshconfig` rule 9) and attaches the one a CUSTOM policy names to that policy
(:attr:`ambit.model.policy.Policy.ext_authz`); the waypoint asks it about the requests the policy's rules match
(:mod:`ambit.waypoint.ext_authz`). The fields follow Envoy's ``ext_authz`` filter as istiod fills it
(``pilot/pkg/security/authz/builder/extauthz.go``).

Invariants:

- ``port`` is 1..65535, ``timeout`` positive (istiod's default 600 s), ``status_on_error`` one of the HTTP
  statuses Envoy's ``HttpStatus`` names (default 403).
- Header patterns are Istio's string forms (``x*`` prefix, ``*x`` suffix, else exact), compared without regard to
  case (istiod sets ``ignore_case``); a lone ``*`` is refused, as istiod refuses it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["DEFAULT_TIMEOUT", "MAX_CHECK_BODY", "ExtAuthzProvider", "HeaderPattern", "ProviderKind", "any_matches"]

MAX_CHECK_BODY = 1024 * 1024
"""The most request body bytes a check may carry: a larger ``maxRequestBytes`` is cut to it (the waypoint holds
that much of each checked request's body until the authorizer answers)."""
DEFAULT_TIMEOUT = 600.0
"""istiod's ``timeoutOrDefault``: seconds the waypoint waits for an answer when the provider gives no timeout."""


class ProviderKind(enum.Enum):
    HTTP = "http"
    """``envoyExtAuthzHttp``: the request's head is sent as a plain HTTP/1.1 request."""
    GRPC = "grpc"
    """``envoyExtAuthzGrpc``: ``envoy.service.auth.v3.Authorization/Check``."""


@dataclass(frozen=True, slots=True)
class HeaderPattern:
    """One entry of a provider's header list: exact, prefix (``x*``) or suffix (``*x``), lower-cased."""

    value: str
    prefix: bool = False
    suffix: bool = False

    @classmethod
    def of(cls, pattern: str) -> HeaderPattern:
        lowered = pattern.lower()
        if lowered.startswith("*"):
            return cls(lowered[1:], suffix=True)
        if lowered.endswith("*"):
            return cls(lowered[:-1], prefix=True)
        return cls(lowered)

    def matches(self, name: str) -> bool:
        """Whether header ``name`` (any case) is one this pattern names."""
        name = name.lower()
        if self.prefix:
            return name.startswith(self.value)
        if self.suffix:
            return name.endswith(self.value)
        return name == self.value

    def __str__(self) -> str:
        return f"{self.value}*" if self.prefix else f"*{self.value}" if self.suffix else self.value


def any_matches(patterns: tuple[HeaderPattern, ...], name: str) -> bool:
    return any(p.matches(name) for p in patterns)


@dataclass(frozen=True, slots=True)
class ExtAuthzProvider:
    """One external authorizer (an ``extensionProviders`` entry)."""

    name: str
    kind: ProviderKind
    service: str
    """As written: ``namespace/hostname`` or a hostname (istiod's ``LookupCluster``)."""
    port: int
    timeout: float = DEFAULT_TIMEOUT
    """Seconds."""
    fail_open: bool = False
    """An error or timeout lets the request through (Envoy's ``failure_mode_allow``)."""
    status_on_error: int = 403
    path_prefix: str = ""
    """HTTP only: put before the request's path in the check request."""
    include_request_headers: tuple[HeaderPattern, ...] = ()
    """HTTP only: the request's headers sent in the check (besides the ones Envoy always sends)."""
    include_additional_headers: tuple[tuple[str, str], ...] = ()
    """HTTP only: headers added to every check request, name (lower-case) and value."""
    headers_to_upstream_on_allow: tuple[HeaderPattern, ...] = ()
    """HTTP only: the authorizer's answer headers copied onto the allowed request."""
    headers_to_downstream_on_deny: tuple[HeaderPattern, ...] = ()
    """HTTP only: the authorizer's answer headers sent to the client with a denial (empty: all of them)."""
    headers_to_downstream_on_allow: tuple[HeaderPattern, ...] = ()
    """HTTP only: the authorizer's answer headers added to the allowed request's response."""
    max_request_bytes: int | None = None
    """``includeRequestBodyInCheck.maxRequestBytes``: the check carries the request's body, at most this many bytes;
    None: no body."""
    allow_partial_message: bool = False
    """A longer body is sent cut at :attr:`max_request_bytes` rather than answered 413."""
    pack_as_bytes: bool = False
    """gRPC only: the body goes in ``raw_body`` (bytes) rather than ``body`` (string)."""

    @property
    def host_and_namespace(self) -> tuple[str, str]:
        """(hostname, namespace or ``""``) of :attr:`service`."""
        namespace, slash, host = self.service.partition("/")
        return (host, namespace) if slash else (self.service, "")
