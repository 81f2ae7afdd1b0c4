"""What a waypoint knows about routing: Gateway API routes, translated, in the form the L7 engine runs them.

The control plane translates ``HTTPRoute``, ``GRPCRoute``, ``TCPRoute`` and ``TLSRoute`` objects (Gateway API;
spec §1.4, §7.5, §10.3) into these values and serves them to waypoints over delta ADS; the waypoint never reads the
Kubernetes API. The L7 engine (``ambit.waypoint``) reads only these values and the workload state.

Theory of operation:

- A waypoint serves **destinations**: a Service port (``ServiceKey`` ``namespace/hostname`` and a port) whose
  Service, or a workload whose pod, names the waypoint in its ``waypoint`` field. Each destination has one
  :class:`RouteTable`. A table without rules (or no table at all) means Istio's default: a Service routes to
  itself (every request to one endpoint of the addressed Service, chosen per request).
- A :class:`RouteTable` holds HTTP rules already **flattened and ordered** (the translator orders; the engine
  takes the first entry whose match holds). VirtualService rules (:mod:`ambit.controlplane.translate.virtualservices`)
  keep the order they are written in; Gateway API routes are ordered by precedence:
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

- ``DestinationRule`` (Istio's ``networking.istio.io``): one
  :class:`~ambit.model.destination_policy.DestinationPolicy` per Service a waypoint serves
  (:mod:`ambit.model.destination_policy`). The matches a rule holds are :mod:`ambit.model.route_matches`'.

Every value is frozen and hashable, so tables can be compared to detect a change and shared between requests.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from ambit.model.destination_policy import DestinationPolicy
from ambit.model.envoyfilter import NO_PATCHES, ProxyPatches
from ambit.model.locality_lb import MESH_DEFAULT as MESH_LOCALITY
from ambit.model.locality_lb import LocalityLbSetting
from ambit.model.metric_overrides import ServiceMetrics
from ambit.model.policy import Policy
from ambit.model.requestauth import RequestAuthentication
from ambit.model.route_matches import RouteMatch, ValueMatch


@dataclass(frozen=True, slots=True)
class HeaderModifier:
    """``RequestHeaderModifier`` / ``ResponseHeaderModifier``: ``set`` replaces, ``add`` appends, ``remove``
    drops (names lower-case)."""

    set: tuple[tuple[str, str], ...] = ()
    add: tuple[tuple[str, str], ...] = ()
    remove: tuple[str, ...] = ()

    def applied(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """``headers`` (names lower-case) with the changes made: removed and set names dropped, then the set and
        added fields appended."""
        drop = set(self.remove) | {name for name, _ in self.set}
        return [(n, v) for n, v in headers if n not in drop] + list(self.set) + list(self.add)


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
    keeps_host_port: bool = False
    """Envoy's ``RedirectAction`` as a VirtualService gets it from istiod, instead of Gateway API's rules: the
    request's ``Host`` is kept as sent, port and all, unless ``port`` replaces it (a ``port`` that is the final
    scheme's default is no port, as istiod drops it) or the scheme changes from one whose default port it names."""


@dataclass(frozen=True, slots=True)
class URLRewrite:
    hostname: str | None = None
    path: PathModifier | None = None


SUBSET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""A DestinationRule subset's name, as a backend may name it (a DNS label)."""


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
    response_headers: HeaderModifier | None = None
    """The backendRef's own ``ResponseHeaderModifier``, applied after the rule's to the answers it gives (istiod
    puts both on the route's weighted destination)."""


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
class HttpRetry:
    """Istio's ``HTTPRetry`` as a route applies it: the retry policy and the per-try timeout (seconds; None: no
    limit). A route that states no retries takes the mesh config's ``defaultHttpRetryPolicy``, and without one
    Istio's default (:data:`ISTIO_RETRY`)."""

    policy: RetryPolicy = RetryPolicy()
    per_try_timeout: float | None = None


ISTIO_RETRY = HttpRetry()
"""Istio's default when neither the route nor the mesh config says anything: 2 retries, no per-try timeout."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Gateway API ``HTTPRouteTimeouts`` in seconds; None is no limit. ``request`` bounds the whole exchange
    (retries included) and answers 504; ``backend_request`` bounds each try."""

    request: float | None = None
    backend_request: float | None = None


@dataclass(frozen=True, slots=True)
class RegexRewrite:
    """A VirtualService ``rewrite.uriRegexRewrite``: every match of ``pattern`` (RE2) in the path is replaced by
    ``substitution`` (``\\1`` for a group), as Envoy's ``regex_rewrite``; the query is kept."""

    pattern: str
    substitution: str


@dataclass(frozen=True, slots=True)
class Fault:
    """A VirtualService ``fault``: delay ``delay_percent`` of requests by ``delay`` seconds, then answer
    ``abort_percent`` of them with ``abort_status`` instead of forwarding (Envoy's fault filter)."""

    delay: float = 0.0
    delay_percent: float = 0.0
    abort_status: int = 0
    abort_percent: float = 0.0
    abort_grpc_status: int | None = None
    """``abort.grpcStatus`` as its numeric code (:data:`GRPC_STATUS_CODES`): a gRPC request is answered 200 with
    that ``grpc-status`` and no body (trailers only), any other request 200 ``fault filter abort``, as Envoy's
    fault filter does; None: the abort, if any, is ``abort_status``."""


GRPC_STATUS_CODES = {
    "OK": 0,
    "CANCELLED": 1,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "OUT_OF_RANGE": 11,
    "UNIMPLEMENTED": 12,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "DATA_LOSS": 15,
    "UNAUTHENTICATED": 16,
}
"""The gRPC status names a VirtualService fault may give (istio's ``SupportedGRPCStatus``) and their codes."""


MAX_DIRECT_BODY = 64 * 1024
"""A direct response's body is held in every waypoint's memory: bounded like any other configuration value (the
translator refuses longer; the waypoint's reader too)."""


@dataclass(frozen=True, slots=True)
class DirectResponse:
    """A VirtualService ``directResponse``: answered by the waypoint itself."""

    status: int
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class CorsPolicy:
    """A VirtualService ``corsPolicy`` or an HTTPRoute ``CORS`` filter (which istiod turns into one), as istiod
    hands it to Envoy's CORS filter (the header values already joined with ``,``; :mod:`ambit.waypoint.cors`
    applies it)."""

    allow_origins: tuple[ValueMatch, ...] = ()
    """Exact, Prefix or RegularExpression matches of the ``Origin`` value (``name`` is ``origin``); a match that
    also holds for the text ``*`` allows every origin (Envoy's rule)."""
    allow_methods: str = ""
    allow_headers: str = ""
    """``*``: the preflight's ``Access-Control-Request-Headers`` is echoed (as Envoy does)."""
    expose_headers: str = ""
    max_age: int | None = None
    """Seconds; None: no ``Access-Control-Max-Age``."""
    allow_credentials: bool = False
    forward_unmatched_preflights: bool = True
    """``unmatchedPreflights: FORWARD`` (the default): a preflight whose origin does not match goes to the
    backend; ``IGNORE``: the waypoint answers it 200 without ``Access-Control-Allow-Origin``."""


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
    fault: Fault | None = None
    direct_response: DirectResponse | None = None
    """Present: the waypoint answers this itself (after ``redirect``, before any backend)."""
    missing_backend_status: int = 500
    """The answer when the drawn backend did not resolve: 500 for Gateway API routes, 503 for VirtualServices
    (Envoy's cluster-not-found answer, which istiod leaves at its default for them)."""
    regex_rewrite: RegexRewrite | None = None
    """Applied after ``rewrite`` (which then carries at most the authority)."""
    cors: CorsPolicy | None = None
    """A VirtualService ``corsPolicy`` or HTTPRoute ``CORS`` filter: preflights answered, CORS response headers
    added (not for a redirect or a direct response, which Envoy's CORS filter bypasses)."""


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
    default_retry: HttpRetry = ISTIO_RETRY
    """The retries of the default route (``http`` empty): the mesh config's ``defaultHttpRetryPolicy``. Not on the
    wire: the waypoint sets it from :attr:`WaypointConfig.default_retry` (:mod:`ambit.waypoint.config`)."""


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
    destination_rules: tuple[DestinationPolicy, ...] = ()
    """The DestinationRules that apply to the Services it serves, one per Service, ordered by service key."""
    metrics: tuple[ServiceMetrics, ...] = ()
    """The Telemetry API's metric overrides, per destination service (``""``: the rest), ``""`` first then by key
    (:mod:`ambit.controlplane.translate.telemetry`; :class:`ambit.waypoint.telemetry.WaypointMetrics` applies them)."""
    services: tuple[str, ...] = ()
    """``namespace/hostname`` of every Service and ServiceEntry host bound to it (as primary or canary), sorted:
    the binding its tables and policies were chosen by. A waypoint fed by the control plane serves a
    Service-addressed tunnel only for a listed Service, so never before it holds that Service's policies
    (:func:`ambit.waypoint.destinations.plan_tunnel`)."""
    race_first_connect: tuple[str, ...] = ()
    """``namespace/hostname`` of the ServiceEntry hosts it serves whose entry says ``istio.io/connect-strategy:
    RACE_FIRST_TCP_CONNECT``, sorted: their hostname endpoints are dialled at every resolved address at once, the
    first connection to succeed kept (:mod:`ambit.waypoint.racing`)."""
    dynamic_dns: tuple[str, ...] = ()
    """``namespace/hostname`` of the ServiceEntry hosts it serves whose entry resolves ``DYNAMIC_DNS`` (wildcard
    hosts), sorted: a request goes to the name its ``Host`` (a TLS connection to the name its SNI) gives, when that
    name matches the host, resolved as it comes (:mod:`ambit.waypoint.dynamic_hosts`)."""
    envoy_patches: ProxyPatches = NO_PATCHES
    """What it honours of the EnvoyFilters bound to it (:mod:`ambit.model.envoyfilter`)."""
    default_retry: HttpRetry = ISTIO_RETRY
    """The mesh config's ``defaultHttpRetryPolicy``: the retries of its default route (a Service without a table, or
    a table without HTTP rules), as istiod's ``BuildDefaultHTTPOutboundRoute`` applies it."""
    mesh_locality: LocalityLbSetting = MESH_LOCALITY
    """The mesh config's ``localityLbSetting``: the setting of a backend whose DestinationRule states none, or that
    has no rule (:mod:`ambit.model.locality_lb` rule 7)."""

    def find_table(self, service_key: str, port: int) -> RouteTable | None:
        for table in self.tables:
            if table.service_key == service_key and table.port == port:
                return table
        return None

    def find_destination_policy(self, service_key: str) -> DestinationPolicy | None:
        return next((d for d in self.destination_rules if d.service_key == service_key), None)
