"""What the waypoint does with one request: the values the routing engine returns and the shell carries out.

The shell parses a request head into a :class:`RequestHead` (names lower-case, values as received, in order) and
asks a :data:`Router` what to do, given the destination's route table (None when no route is attached) and a
random number in [0, 1) for weighted choices (the shell owns randomness, so the engine stays pure). The answer is:

- :class:`Forward`: send ``request`` (already rewritten by the rule's filters) to one endpoint of ``backend``,
  add ``response_headers`` changes to the answer, apply ``timeouts`` and ``retry``, and copy the request to each
  of ``mirrors`` (answers dropped).
- :class:`Respond`: answer locally (a redirect, a direct response or fault abort, 404 when no route matches, 500
  or 503 for a missing backend).

Either may carry a ``delay`` (a fault delay) the shell waits out first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ambit.model.routes import BackendService, HeaderModifier, RetryPolicy, RouteTable, Timeouts

Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class RequestHead:
    method: str
    path: str
    """The request target as received (path and query), e.g. ``/reviews/1?x=y``."""
    authority: str
    """HTTP/1.1 ``Host`` or HTTP/2 ``:authority``."""
    headers: tuple[tuple[str, str], ...] = ()
    """Every other header, names lower-case, in the order received (pseudo-headers excluded)."""
    scheme: str = "http"
    jwt_claims: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    """The payload of the request's verified JWT (Envoy's ``jwt_authn`` metadata), set by the waypoint's
    authentication only, never from what the request carries; None without one. Route claim matches read it."""
    route_headers: tuple[tuple[str, str], ...] | None = field(default=None, compare=False, repr=False)
    """The headers route matches read when they are not :attr:`headers`; None: they are. Set when an external
    authorizer edited the headers: istiod leaves ``clear_route_cache`` off on its ``ext_authz`` filter, so Envoy
    routes on the route it picked before the check (:mod:`ambit.waypoint.ext_authz` rule 12)."""

    def edit_headers(self, edit: Callable[[Headers], Headers]) -> RequestHead:
        """This request with ``edit`` applied to its headers, and to :attr:`route_headers` when set (an edit made
        before routing that the route match sees, such as ``x-forwarded-proto`` or the gateway's edge headers)."""
        routed = None if self.route_headers is None else edit(self.route_headers)
        return replace(self, headers=edit(self.headers), route_headers=routed)

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (lower-case), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


@dataclass(frozen=True, slots=True)
class Forward:
    backend: BackendService
    request: RequestHead
    response_headers: HeaderModifier | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    mirrors: tuple[tuple[BackendService, RequestHead], ...] = ()
    route: str = ""
    """``kind/namespace/name`` of the route that matched; empty for the default route (telemetry, logs)."""
    delay: float = 0.0
    """Seconds to wait before forwarding (a VirtualService fault delay)."""
    missing_backend_status: int = 500
    """The answer (empty, flag ``NC``) when ``backend`` names a Service the waypoint does not know: Envoy's
    cluster-not-found code, which istiod sets to 500 for Gateway API routes and leaves at 503 for VirtualServices
    (:attr:`ambit.model.routes.RouteRule.missing_backend_status`)."""


@dataclass(frozen=True, slots=True)
class Respond:
    status: int
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    route: str = ""
    delay: float = 0.0
    """Seconds to wait before answering (a VirtualService fault delay)."""
    response_headers: HeaderModifier | None = None
    """The matched rule's ``ResponseHeaderModifier``: Envoy applies the route's response header changes to every
    local reply of a stream whose route matched (the filter manager runs the route entry's
    ``finalizeResponseHeaders`` on it; the router does it itself for a direct response or a redirect), so an
    abort, a redirect, a direct response and the router's 500/503/504 carry them. None for 404 with no route and
    for a CORS preflight (the CORS filter encodes that answer itself, not as a local reply)."""
    flags: str = "-"
    """Envoy's response flag for this answer: ``NR`` for 404 with no route, ``FI`` for a fault abort."""
    by_router: bool = True
    """Envoy finalizes this answer with the matched route (exchange rule 7): the router for a direct response or a
    redirect, the filter manager for any other local reply of a routed stream (a fault abort, a missing backend),
    so the route-level response edits of EnvoyFilter merges run on it; False for 404 with no route, for a CORS
    preflight (encoded by the CORS filter itself) and for an HTTPS redirect of a virtual host."""


Decision = Forward | Respond

Router = Callable[[RouteTable | None, BackendService, RequestHead, float], Decision]
"""``router(table, destination, request, random)``: the destination is the Service port the request was sent to
(the CONNECT authority, resolved); the default route forwards to it unchanged."""
