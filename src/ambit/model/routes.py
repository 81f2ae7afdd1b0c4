"""What a waypoint knows about routing: Gateway API routes, translated, in the form the L7 engine runs them.

The control plane translates ``HTTPRoute``, ``GRPCRoute``, ``TCPRoute`` and ``TLSRoute`` objects (Gateway API;
spec §1.4, §7.5, §10.3) into these values and serves them to waypoints over delta ADS; the waypoint never reads the
Kubernetes API. The L7 engine (``ambit.waypoint``) reads only these values and the workload state.

Theory of operation:

- A waypoint serves **destinations**: a Service port (``ServiceKey`` ``namespace/hostname`` and a port) whose
  Service, or a workload whose pod, names the waypoint in its ``waypoint`` field. Each destination has one
  :class:`RouteTable`. A table without rules (or no table at all) means Istio's default: a Service routes to
  itself (every request to one endpoint of the addressed Service, chosen per request).
- A :class:`RouteTable` holds HTTP rules already **flattened and ordered by Gateway API precedence** (the
  translator sorts; the engine takes the first entry whose match holds):
  1. an Exact path match before a PathPrefix one before a RegularExpression one (Gateway API ranks Exact over
     PathPrefix and leaves regular expressions to the implementation; istiod ranks them last), then the longer
     path value first (for prefixes: the longest prefix wins);
  2. then a method match before none; 3. then more header matches first; 4. then more query-param matches first;
  5. ties: the older route first (creation timestamp), then ``namespace/name`` alphabetically, then rule order,
     then match order within the rule.
  A rule with no ``matches``, like a match with no ``path``, stands for ``PathPrefix /`` (the CRDs' defaults).
- A request that no entry matches gets 404 (Gateway API: no route matched) once any HTTP route is attached to the
  destination; with none attached, the default route applies.
- ``backends`` are weighted (weight 0 is never chosen; all zero, or none, answers 500, as does a backend whose
  Service the waypoint does not know: "a route to a missing backend answers 500"). The engine picks a backend per
  request by weight, then an endpoint of that backend's Service.
- TCP traffic (a port declared TCP or TLS, or anything not sniffed as HTTP) uses ``tcp_backends`` from a
  ``TLSRoute`` (which wins) or ``TCPRoute`` when one is attached, else the default route. The waypoint reads no
  SNI: the translator keeps only the TLSRoutes whose hostnames could only mean the destination's host.

Every value is frozen and hashable, so tables can be compared to detect a change and shared between requests.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ambit.model.metric_overrides import ServiceMetrics
from ambit.model.policy import Policy
from ambit.model.requestauth import RequestAuthentication


class PathMatchType(enum.Enum):
    """Gateway API ``HTTPPathMatch.type``."""

    EXACT = "Exact"
    PATH_PREFIX = "PathPrefix"
    REGULAR_EXPRESSION = "RegularExpression"


class ValueMatchType(enum.Enum):
    """Gateway API ``HTTPHeaderMatch.type`` / ``HTTPQueryParamMatch.type`` / ``GRPCMethodMatch.type``."""

    EXACT = "Exact"
    REGULAR_EXPRESSION = "RegularExpression"


@dataclass(frozen=True, slots=True)
class PathMatch:
    kind: PathMatchType
    value: str
    """For PathPrefix, matched element-wise: ``/foo`` matches ``/foo`` and ``/foo/bar``, not ``/foobar``."""


@dataclass(frozen=True, slots=True)
class ValueMatch:
    """A header (name compared case-insensitively) or query parameter (name compared exactly) match."""

    name: str
    value: str
    kind: ValueMatchType = ValueMatchType.EXACT


@dataclass(frozen=True, slots=True)
class RouteMatch:
    """One ``HTTPRouteMatch``: every present part must hold. For GRPCRoute the translator writes the method match
    as an Exact (or RegularExpression) path ``/<service>/<method>`` and a ``POST`` method."""

    path: PathMatch | None = None
    headers: tuple[ValueMatch, ...] = ()
    query_params: tuple[ValueMatch, ...] = ()
    method: str | None = None


@dataclass(frozen=True, slots=True)
class HeaderModifier:
    """``RequestHeaderModifier`` / ``ResponseHeaderModifier``: ``set`` replaces, ``add`` appends, ``remove``
    drops (names lower-case)."""

    set: tuple[tuple[str, str], ...] = ()
    add: tuple[tuple[str, str], ...] = ()
    remove: tuple[str, ...] = ()


class PathModifierType(enum.Enum):
    REPLACE_FULL_PATH = "ReplaceFullPath"
    REPLACE_PREFIX_MATCH = "ReplacePrefixMatch"


@dataclass(frozen=True, slots=True)
class PathModifier:
    kind: PathModifierType
    value: str


@dataclass(frozen=True, slots=True)
class RequestRedirect:
    """``RequestRedirect``: answered by the waypoint itself; unset parts keep the request's own."""

    scheme: str | None = None
    hostname: str | None = None
    path: PathModifier | None = None
    port: int | None = None
    status_code: int = 302


@dataclass(frozen=True, slots=True)
class URLRewrite:
    hostname: str | None = None
    path: PathModifier | None = None


@dataclass(frozen=True, slots=True)
class BackendService:
    """A backend: one port of a Service the waypoint knows from its workload state."""

    namespace: str
    hostname: str
    """The Service's hostname, e.g. ``reviews.app.svc.cluster.local`` (a ServiceEntry host for ServiceEntries)."""
    port: int
    subset: str = ""
    """A ``DestinationRule`` subset's name (a ``VirtualService`` destination's ``subset``): only that subset's
    endpoints; empty means every endpoint of the Service."""

    @property
    def service_key(self) -> str:
        """``namespace/hostname``, as :attr:`ambit.model.workload.Service.key`."""
        return f"{self.namespace}/{self.hostname}"


@dataclass(frozen=True, slots=True)
class RequestMirror:
    """Send a copy of each request (its answer is dropped) to ``backend``; ``percent`` of requests (0 to 100)."""

    backend: BackendService
    percent: float = 100.0


Filter = HeaderModifier | RequestRedirect | URLRewrite | RequestMirror
"""What a rule or a backend does to a request; response header changes live in
:attr:`RouteRule.response_headers`."""


@dataclass(frozen=True, slots=True)
class WeightedBackend:
    backend: BackendService | None
    """None: the ``backendRef`` did not resolve (unknown Service, a kind not supported, a cross-namespace reference
    without a ReferenceGrant): the share of requests it would get answers 500."""
    weight: int = 1
    request_headers: HeaderModifier | None = None
    """The backendRef's own ``RequestHeaderModifier``, applied after the rule's."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Gateway API ``HTTPRouteRetry`` (and Istio's default of 2 attempts on connect failure and 503 when a
    route says nothing): ``attempts`` retries after the first try, on the listed status ``codes`` and on a
    connection failure, waiting ``backoff`` seconds (doubling) between tries."""

    attempts: int = 2
    codes: tuple[int, ...] = (503,)
    backoff: float = 0.025
    on_connect_failure: bool = True


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Gateway API ``HTTPRouteTimeouts`` in seconds; None is no limit. ``request`` bounds the whole exchange
    (retries included) and answers 504; ``backend_request`` bounds each try."""

    request: float | None = None
    backend_request: float | None = None


@dataclass(frozen=True, slots=True)
class RouteRule:
    """One entry of a :class:`RouteTable`: one match of one rule of one route, with that rule's actions."""

    route: str
    """``kind/namespace/name`` of the route, for status, logs and config dumps."""
    match: RouteMatch
    backends: tuple[WeightedBackend, ...] = ()
    request_headers: HeaderModifier | None = None
    response_headers: HeaderModifier | None = None
    redirect: RequestRedirect | None = None
    rewrite: URLRewrite | None = None
    mirrors: tuple[RequestMirror, ...] = ()
    timeouts: Timeouts = field(default_factory=Timeouts)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    rule_name: str = ""


@dataclass(frozen=True, slots=True)
class RouteTable:
    """The routes of one destination a waypoint serves: a Service port (or a workload's port, ``service_key``
    empty and ``address`` set)."""

    service_key: str
    """``namespace/hostname`` of the Service; empty for a workload-addressed destination."""
    port: int
    http: tuple[RouteRule, ...] = ()
    """Ordered by precedence (see the module docstring); empty means the default route."""
    tcp_backends: tuple[WeightedBackend, ...] = ()
    """From an attached TLSRoute, else TCPRoute; empty means the default route."""
    hostnames: tuple[str, ...] = ()
    """The attached HTTPRoutes' hostnames, for config dumps; the waypoint matches by destination, not Host."""


@dataclass(frozen=True, slots=True)
class WaypointConfig:
    """Everything one waypoint is told besides the workload state."""

    waypoint: str
    """``namespace/name`` of its Gateway."""
    tables: tuple[RouteTable, ...] = ()
    policies: tuple[Policy, ...] = ()
    """The AuthorizationPolicies bound to it (scope WAYPOINT or SERVICE; spec §7.5), by namespace, name, scope."""
    request_authentications: tuple[RequestAuthentication, ...] = ()
    """The RequestAuthentications attached to it by ``targetRefs``, by key (:mod:`ambit.requestauth` enforces them)."""
    xfcc_client_identity: bool = False
    """Its Gateway (or GatewayClass) says ``ambient.istio.io/xfcc-include-client-identity: "true"``: forwarded
    requests carry the source identity in ``x-forwarded-client-cert`` (:mod:`ambit.waypoint.client_cert`)."""
    metrics: tuple[ServiceMetrics, ...] = ()
    """The Telemetry API's metric overrides, per destination service (``""``: the rest), ``""`` first then by key
    (:mod:`ambit.controlplane.translate.telemetry`; :class:`ambit.waypoint.telemetry.WaypointMetrics` applies them)."""

    def find_table(self, service_key: str, port: int) -> RouteTable | None:
        for table in self.tables:
            if table.service_key == service_key and table.port == port:
                return table
        return None
