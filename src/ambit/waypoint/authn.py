"""The waypoint's RequestAuthentication step, between a request's arrival and its authorization and routing.

Theory of operation: :func:`plan_authentication` is pure. Given the request head, the waypoint's current
:class:`~ambit.model.routes.WaypointConfig`, the destination's service key (empty for a workload-addressed
request), the key sets the shell holds (:class:`~ambit.waypoint.jwks.JwksManager`) and the wall-clock time, it
returns :class:`Authenticated` (the head to authorize and route, with the token removed and the output headers
written, and the identity for :class:`ambit.rbac.Request`) or :class:`Unauthenticated` (the 401 to answer and the
reason for the access log). The shell's part is one call and one branch::

    step = plan_authentication(head, ctx.routes.current, key, jwks.find_key_sets(), time.time())
    if isinstance(step, Unauthenticated): answer step.response, log step.reason
    else: authorize and route step.request with identity step.identity

Rules:

1. Only the policies that apply to the destination count (:func:`ambit.requestauth.applicable`); without any,
   the head passes unchanged with no identity.
2. A refusal is 401 (403 for ``Audiences in Jwt are not allowed``, as Envoy's ``jwt_authn`` filter answers it)
   with Envoy's reason as the body (``Jwt is expired``) and no response flag, and the challenge
   ``www-authenticate: Bearer realm="<scheme>://<host><path>", error="invalid_token"``: the filter's realm is the
   request's URI as it arrived, its path (query included) cut at 256 characters; a URI that is not visible ASCII
   is left out (``Bearer error="invalid_token"``) rather than written into a header. For the access log, Envoy's
   response code details ``jwt_authn_access_denied{<reason>}`` (spaces as underscores) are
   :attr:`Unauthenticated.details`.
3. Header changes are applied as a request header modifier (:func:`ambit.waypoint.filters.apply_header_modifier`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ambit.model.requestauth import RequestIdentity
from ambit.model.routes import WaypointConfig
from ambit.requestauth import Authenticated as Verified
from ambit.requestauth import KeySets, Rejected, applicable, authenticate
from ambit.requestauth.reasons import AUDIENCE_NOT_ALLOWED
from ambit.waypoint.decisions import RequestHead, Respond
from ambit.waypoint.filters import apply_header_modifier, is_visible_ascii

__all__ = ["Authenticated", "Unauthenticated", "plan_authentication"]


@dataclass(frozen=True, slots=True)
class Authenticated:
    request: RequestHead
    identity: RequestIdentity | None


@dataclass(frozen=True, slots=True)
class Unauthenticated:
    response: Respond
    reason: str

    @property
    def details(self) -> str:
        """Envoy's response code details for the access log."""
        return f"jwt_authn_access_denied{{{self.reason.replace(' ', '_')}}}"


def plan_authentication(
    head: RequestHead, config: WaypointConfig, service_key: str, keys: KeySets, now: float
) -> Authenticated | Unauthenticated:
    """Rules 1-3 for one request; ``now`` is wall-clock seconds (token times are)."""
    if not config.request_authentications:
        return Authenticated(head, None)
    policies = applicable(config.request_authentications, service_key)
    if not policies:
        return Authenticated(head, None)
    outcome = authenticate(head.method, head.path, head.headers, policies, keys, now)
    if not isinstance(outcome, Verified):
        return Unauthenticated(_refusal(head, outcome), outcome.reason)
    request = head if outcome.request_headers is None else apply_header_modifier(head, outcome.request_headers)
    return Authenticated(request, outcome.identity)


REALM_PATH_LIMIT = 256
"""How much of the path the challenge's realm keeps (Envoy's ``MaximumUriLength`` in its ``jwt_authn`` filter)."""
CHALLENGE = "www-authenticate"


def _refusal(head: RequestHead, rejected: Rejected) -> Respond:
    """Rule 2: the answer to a request whose token was refused."""
    status = 403 if rejected.reason == AUDIENCE_NOT_ALLOWED else rejected.status
    uri = f"{head.scheme}://{head.authority}{head.path[:REALM_PATH_LIMIT]}"
    realm = f'realm="{uri}", ' if is_visible_ascii(uri) else ""
    headers = (*(f for f in rejected.headers if f[0] != CHALLENGE), (CHALLENGE, f'Bearer {realm}error="invalid_token"'))
    return Respond(status, headers, rejected.body)
