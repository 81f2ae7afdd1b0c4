"""RequestAuthentication (JWT) as a waypoint or gateway enforces it (spec §7.5, issue 18).

Theory of operation: the control plane turns each RequestAuthentication attached to a waypoint or gateway (by
``targetRefs``; a ``selector`` one is ignored there, as upstream) into a :class:`RequestAuthentication` of
:class:`JwtRule`; the waypoint validates the tokens of each request against the rules that apply to its destination
(:mod:`ambit.requestauth`) and hands the result, a :class:`RequestIdentity` or None, to the authorization engine
(:class:`ambit.rbac.Request`), where ``requestPrincipals`` and ``request.auth.*`` conditions read it.

Rules (Istio's semantics):

1. A request without a token passes authentication (identity None); a policy that needs a request principal then
   denies it (403).
2. A request with a token that no rule accepts (bad signature, expired, not yet valid, untrusted issuer, wrong
   audience) is refused with 401, whatever the authorization policies say.
3. The principal is ``<iss>/<sub>``.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MAX_JWKS_BYTES",
    "ClaimToHeader",
    "JwtHeader",
    "JwtRule",
    "RequestAuthentication",
    "RequestIdentity",
    "jwks_uri_problem",
]

MAX_JWKS_BYTES = 256 * 1024
"""The longest key set, inline or fetched; public key sets are a few KiB."""


def jwks_uri_problem(uri: str) -> str | None:
    """Why ``uri`` cannot be a ``jwksUri`` (only http and https URLs with a host and a valid port), or None."""
    try:
        parts = urllib.parse.urlsplit(uri)
        _ = parts.port
    except ValueError:
        return f"{uri!r} is not an http or https URL with a host"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{uri!r} is not an http or https URL with a host"
    return None


@dataclass(frozen=True, slots=True)
class JwtHeader:
    """Where a token is read from: header ``name`` (lower-case), after stripping ``prefix``."""

    name: str
    prefix: str = ""


DEFAULT_HEADER = JwtHeader("authorization", "Bearer ")
DEFAULT_PARAM = "access_token"


@dataclass(frozen=True, slots=True)
class ClaimToHeader:
    header: str
    claim: str


@dataclass(frozen=True, slots=True)
class JwtRule:
    issuer: str
    audiences: tuple[str, ...] = ()
    """Empty: any audience is accepted."""
    jwks: str = ""
    """An inline JSON Web Key Set (JSON text); empty when ``jwks_uri`` is used."""
    jwks_uri: str = ""
    from_headers: tuple[JwtHeader, ...] = ()
    """Empty with empty ``from_params``: the default locations (``Authorization: Bearer`` and ``access_token``)."""
    from_params: tuple[str, ...] = ()
    from_cookies: tuple[str, ...] = ()
    output_payload_to_header: str = ""
    output_claim_to_headers: tuple[ClaimToHeader, ...] = ()
    forward_original_token: bool = False
    timeout_seconds: float = 5.0
    """How long fetching ``jwks_uri`` may take."""
    space_delimited_claims: tuple[str, ...] = ()
    """Claims besides ``scope`` and ``permission`` whose space-delimited string values ``request.auth.claims``
    reads as lists."""


@dataclass(frozen=True, slots=True)
class RequestAuthentication:
    name: str
    namespace: str
    rules: tuple[JwtRule, ...] = ()
    services: tuple[str, ...] = ()
    """Service keys (``namespace/hostname``) it targets; empty: every request of the waypoint or gateway."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class RequestIdentity:
    """What a validated token says, as ``request.auth.*`` attributes read it."""

    issuer: str
    subject: str
    audiences: tuple[str, ...] = ()
    presenter: str = ""
    """The ``azp`` claim, empty without one."""
    claims: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """The whole payload, as decoded JSON."""

    @property
    def principal(self) -> str:
        return f"{self.issuer}/{self.subject}"
