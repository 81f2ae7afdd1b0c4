"""How a Service's DestinationRule shapes one forwarded request: which endpoints, chosen how, reached how.

Theory of operation: :func:`plan_backend` reads the waypoint's
:class:`~ambit.model.destination_policy.DestinationPolicy` for the backend's Service (sent by the control plane, already
chosen and merged) and returns a :class:`BackendPolicy` (or a :class:`~ambit.waypoint.destinations.Refusal`);
:class:`Balancer` turns its load-balancer setting into the ``choose`` function the endpoint pickers take. Pure: no I/O;
randomness and in-flight counts come in.

Rules:

1. No rule for the Service: every endpoint, the waypoint's default choice, the default transport (HBONE to a
   meshed endpoint, plain TCP to another); the request names no subset.
2. A backend naming a subset: only the subset's workloads. A subset no rule defines (or no rule at all) is refused
   503, as Envoy answers a route to a cluster it does not have (flag ``NC``); it never falls back to every
   endpoint. A defined subset that selects no healthy endpoint answers 503 ``no healthy upstream`` like any backend.
3. The effective policy is :meth:`~ambit.model.destination_policy.DestinationPolicy.policy_for` the backend's port and
   subset.
4. Transport (:class:`~ambit.waypoint.destinations.Transport`): ``tls.mode`` SIMPLE originates TLS to the endpoint
   (inside its HBONE tunnel when it has one), MUTUAL the same presenting the rule's client certificate (one that
   is missing or does not load fails the connection, a 503: :mod:`ambit.waypoint.origination`, never the
   request in the clear); ISTIO_MUTUAL and DISABLE change nothing (HBONE is already mutual TLS, and istiod builds
   no TLS context for ISTIO_MUTUAL at a waypoint). ``h2UpgradePolicy: UPGRADE`` sends HTTP/1.1 requests
   upstream as HTTP/2 (h2c with prior knowledge, or ALPN h2 over originated TLS); a protocol upgrade request
   (WebSocket) is never sent as HTTP/2. ``proxyProtocol`` writes a PROXY header first on each new connection.
5. Load balancing (:class:`Balancer`): ``ROUND_ROBIN`` cycles through the candidates (sorted by uid) per Service
   and subset; ``RANDOM`` picks uniformly; ``LEAST_REQUEST`` (Istio's default, and ``UNSPECIFIED``,
   ``LEAST_CONN``) picks the one with fewer requests in flight of two random candidates (Envoy's power of two
   choices), so a slow endpoint gets less; ``PASSTHROUGH`` is the default choice. ``consistentHash`` on a header,
   a query parameter or the source IP maps equal keys to the same endpoint while the set of endpoints holds
   (rendezvous hashing: an endpoint leaving moves only its own keys); a request without the key gets the default.
6. Connection pool limits, per Service and subset (Envoy's circuit breakers; 0 is no limit): ``http2MaxRequests``
   bounds the requests in flight whatever the protocol; ``maxConnections`` bounds them for HTTP/1.1 upstreams (one
   connection per request in flight) and for TCP; a request over ``maxConnections`` waits for one to finish,
   unless ``http1MaxPendingRequests`` are waiting already. Over a limit: 503 with flag ``UO`` (a TCP connection is
   refused). ``maxRequestsPerConnection`` closes a kept HTTP/1.1 connection after that many requests, and retires
   an HTTP/2 session once it has carried that many streams (Envoy's ``max_requests_per_connection`` in the
   cluster's common HTTP options, which istiod sets from it: pilot/pkg/networking/core/cluster_traffic_policy.go).
7. Outlier detection, per Service and subset: a workload whose tries fail ``consecutive5xxErrors`` times in a row
   (a 5xx answer or a connect failure) is ejected for ``baseEjectionTime`` times its number of ejections; while
   ejected no request picks it, unless every candidate is ejected (then any may be picked, as Envoy's panic
   threshold does). At most ``maxEjectionPercent`` of the Service's endpoints are out at once, and always at
   least one may be. A success resets the count; an endpoint healthy for ``interval`` times its ejections
   starts afresh. State is kept for at most ``max_keys`` workloads per Service/subset.
8. The HTTP version spoken to the endpoint (:func:`plan_upstream_h2`, Istio's cluster protocol: the port's
   declaration, then the rule's connection pool): a protocol upgrade request (WebSocket) goes as HTTP/1.1;
   ``useClientProtocol`` speaks the client's version (overriding the declaration and ``h2UpgradePolicy``, as
   Envoy's ``use_downstream_protocol_config`` does); else a port declared HTTP/2 or gRPC is spoken HTTP/2 (h2c,
   or ALPN h2 over originated TLS) whatever the client spoke; else ``h2UpgradePolicy: UPGRADE`` upgrades
   (rule 4); else a port of unknown protocol at a waypoint speaks the client's version (a gateway speaks
   HTTP/1.1, as istiod sets downstream protocol only for sidecars and waypoints); else HTTP/1.1.
9. A Service whose ServiceEntry asks for ``RACE_FIRST_TCP_CONNECT`` (``racing``) gets
   :attr:`~ambit.waypoint.destinations.Transport.race_first_connect`, with or without a rule (rule 1 otherwise).
10. ``loadBalancer.localityLbSetting`` of the effective policy (rule 3) goes to the endpoint pickers with whether
   that policy has ``outlierDetection`` (:meth:`BackendPolicy.locality`; :mod:`ambit.model.locality_lb` decides);
   a policy with no setting, or no policy, gets the mesh config's (its rule 7: ``enabled: false`` there leaves
   locality out; otherwise it goes to the pickers when it has ``distribute`` or the policy has
   ``outlierDetection``, the only cases where it can change a pick).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

from ambit.model.destination_policy import (
    ConnectionPool,
    ConsistentHash,
    DestinationPolicy,
    H2Upgrade,
    LoadBalancer,
    LoadBalancerType,
    OutlierDetection,
    TlsMode,
    TrafficPolicy,
)
from ambit.model.locality_lb import MESH_DEFAULT, LocalityChoice, LocalityLbSetting
from ambit.model.routes import BackendService
from ambit.model.workload import AppProtocol, Workload
from ambit.waypoint.destinations import PLAIN, Refusal, Transport

Choose = Callable[[Sequence[Workload]], Workload]
_ORIGINATED = (TlsMode.SIMPLE, TlsMode.MUTUAL)


@dataclass(frozen=True, slots=True)
class BackendPolicy:
    """What the rule says about one backend (rule 1-4)."""

    members: frozenset[str] | None = None
    """The subset's workload uids; None: every endpoint of the Service."""
    policy: TrafficPolicy = field(default_factory=TrafficPolicy)
    transport: Transport = PLAIN
    balance_key: str = ""
    """Whose round-robin position this is: ``service key/subset``."""

    def locality(self, random: Callable[[], float], mesh: LocalityLbSetting = MESH_DEFAULT) -> LocalityChoice | None:
        """The rule's ``localityLbSetting`` for the pickers, else the mesh config's ``mesh`` (rule 10); None when
        locality has no part in the pick."""
        balancer = self.policy.load_balancer
        failing_over = self.policy.outlier_detection is not None
        if balancer is not None and balancer.locality is not None:
            return LocalityChoice(balancer.locality, failing_over, random)
        if mesh.enabled and (failing_over or mesh.distribute):
            return LocalityChoice(mesh, failing_over, random, mesh_default=True)
        return None


DEFAULT = BackendPolicy()
RACING = Transport(race_first_connect=True)


def plan_backend(
    rules: Mapping[str, DestinationPolicy],
    backend: BackendService,
    *,
    upgrade: bool = False,
    racing: Container[str] = (),
) -> BackendPolicy | Refusal:
    """Rules 1-4 for one request to ``backend``; ``rules``: the waypoint's DestinationRules by service key;
    ``upgrade``: the request asks for a protocol upgrade; ``racing``: the service keys whose hostname endpoints
    race their addresses (:attr:`~ambit.waypoint.destinations.Transport.race_first_connect`)."""
    race = backend.service_key in racing
    rule = rules.get(backend.service_key)
    if rule is None:
        if backend.subset:
            return Refusal(503, f"subset {backend.subset} of {backend.service_key}: no DestinationRule defines it")
        if race:
            return BackendPolicy(transport=RACING, balance_key=f"{backend.service_key}/")
        return DEFAULT
    members: frozenset[str] | None = None
    if backend.subset:
        subset = rule.find_subset(backend.subset)
        if subset is None:
            return Refusal(503, f"subset {backend.subset} of {backend.service_key}: not defined by {rule.rule}")
        members = subset.workloads
    policy = rule.policy_for(backend.port, backend.subset)
    tls = policy.tls if policy.tls is not None and policy.tls.mode in _ORIGINATED else None
    pool = policy.connection_pool
    transport = Transport(
        max_requests_per_connection=pool.max_requests_per_connection if pool is not None else 0,
        tls=tls,
        h2=pool is not None and pool.h2_upgrade is H2Upgrade.UPGRADE and not pool.use_client_protocol and not upgrade,
        proxy_protocol=policy.proxy_protocol,
        sni=(tls.sni or backend.hostname) if tls is not None else "",
        race_first_connect=race,
    )
    return BackendPolicy(members, policy, transport, f"{backend.service_key}/{backend.subset}")


_DECLARED_H2 = (AppProtocol.HTTP2, AppProtocol.GRPC)


def plan_upstream_h2(
    declared: AppProtocol,
    *,
    client_h2: bool,
    pool: ConnectionPool | None,
    upgraded: bool = False,
    upgrade: bool = False,
    undeclared_follows_client: bool = True,
) -> bool:
    """Rule 8: whether one request goes to the endpoint as HTTP/2. ``declared``: the backend port's protocol;
    ``client_h2``: the client spoke HTTP/2; ``pool``: the rule's connection pool; ``upgraded``: the rule's
    ``h2UpgradePolicy`` asks for HTTP/2 (the transport :func:`plan_backend` made); ``upgrade``: the request asks
    for a protocol upgrade; ``undeclared_follows_client``: a port of unknown protocol speaks the client's version
    (a waypoint) rather than HTTP/1.1 (a gateway)."""
    if upgrade:
        return False
    if pool is not None and pool.use_client_protocol:
        return client_h2
    if declared in _DECLARED_H2 or upgraded:
        return True
    return client_h2 and undeclared_follows_client and declared is AppProtocol.UNKNOWN


def _hash_key(consistent: ConsistentHash, headers: Sequence[tuple[str, str]], path: str, source_ip: str) -> str:
    if consistent.use_source_ip:
        return source_ip
    if consistent.header_name:
        return next((v for n, v in headers if n.lower() == consistent.header_name), "")
    if consistent.query_parameter:
        query = urlsplit(path).query
        return next((v for n, v in parse_qsl(query, keep_blank_values=True) if n == consistent.query_parameter), "")
    return ""


def _weight(key: str, uid: str) -> bytes:
    return hashlib.blake2b(f"{key}\0{uid}".encode(), digest_size=8).digest()


@dataclass(slots=True)
class _Outlier:
    failures: int = 0
    ejections: int = 0
    until: float = 0.0


class Admission(enum.Enum):
    """What the connection pool limits say of one more request (rule 6)."""

    GO = "go"
    WAIT = "wait"
    OVERFLOW = "overflow"


@dataclass(slots=True)
class Balancer:
    """Load-balancer state of one waypoint (rule 5): round-robin positions and requests in flight per workload.
    The bookkeeping is synchronous; positions are kept for at most ``max_keys`` Service/subset pairs."""

    max_keys: int = 10_000
    positions: dict[str, int] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    """Requests in flight per workload uid (LEAST_REQUEST)."""
    active: dict[str, int] = field(default_factory=dict)
    """Requests (or TCP connections) in flight per Service/subset (the connection pool limits)."""
    pending: dict[str, int] = field(default_factory=dict)
    """Requests waiting for an HTTP/1.1 connection per Service/subset."""
    outliers: dict[str, dict[str, _Outlier]] = field(default_factory=dict)
    """Outlier detection per Service/subset: failures in a row and ejections per workload uid."""

    def admit(self, key: str, pool: ConnectionPool | None, *, http1: bool, can_wait: bool = True) -> Admission:
        """Rule 6 for one more request to ``key`` (not counted: :meth:`enter` does that)."""
        if pool is None:
            return Admission.GO
        active = self.active.get(key, 0)
        if pool.http2_max_requests and active >= pool.http2_max_requests:
            return Admission.OVERFLOW
        if http1 and pool.max_connections and active >= pool.max_connections:
            waiting = self.pending.get(key, 0)
            if not can_wait or (pool.http1_max_pending_requests and waiting >= pool.http1_max_pending_requests):
                return Admission.OVERFLOW
            return Admission.WAIT
        return Admission.GO

    def ejected(self, key: str, now: float) -> frozenset[str]:
        """The workloads outlier detection keeps out of ``key`` now (rule 7)."""
        states = self.outliers.get(key)
        if not states:
            return frozenset()
        return frozenset(uid for uid, state in states.items() if state.until > now)

    def record(
        self, key: str, uid: str, ok: bool, now: float, detection: OutlierDetection | None, endpoints: int
    ) -> None:
        """One try's result for outlier detection (rule 7); ``endpoints``: how many the Service has."""
        if detection is None or not detection.consecutive_5xx:
            return
        states = self.outliers.setdefault(key, {})
        state = states.get(uid)
        if ok:
            if state is not None:
                state.failures = 0
                if state.until <= now and now - state.until > detection.interval * state.ejections:
                    del states[uid]  # healthy long enough: its ejection count starts again
            return
        if state is None:
            if len(states) >= self.max_keys:
                return
            state = states[uid] = _Outlier()
        state.failures += 1
        if state.failures < detection.consecutive_5xx or state.until > now:
            return
        out = sum(1 for s in states.values() if s.until > now)
        if (out + 1) * 100 > detection.max_ejection_percent * max(endpoints, 1) and out > 0:
            return  # max_ejection_percent, but one endpoint may always be ejected
        state.ejections += 1
        state.failures = 0
        state.until = now + detection.base_ejection_time * state.ejections

    def has_room(self, key: str, pool: ConnectionPool | None, *, http1: bool) -> bool:
        """Whether a waiting request may go now (the pending count aside)."""
        return self.admit(key, pool, http1=http1, can_wait=False) is Admission.GO

    def enter(self, key: str) -> None:
        self.active[key] = self.active.get(key, 0) + 1

    def leave(self, key: str) -> None:
        _decrement(self.active, key)

    def chooser(
        self,
        balancer: LoadBalancer | None,
        key: str,
        default: Choose,
        random: Callable[[], float],
        *,
        headers: Sequence[tuple[str, str]] = (),
        path: str = "/",
        source_ip: str = "",
    ) -> Choose:
        """The ``choose`` for one request; ``default`` when the rule sets no load balancer (or PASSTHROUGH)."""
        if balancer is None:
            return default
        if balancer.consistent_hash is not None:
            hashed = _hash_key(balancer.consistent_hash, headers, path, source_ip)
            if hashed:
                return lambda candidates: max(candidates, key=lambda w: _weight(hashed, w.uid))
            return default
        kind = balancer.simple
        if kind is LoadBalancerType.ROUND_ROBIN:
            return lambda candidates: self._round_robin(key, candidates)
        if kind is LoadBalancerType.RANDOM:
            return lambda candidates: candidates[min(int(random() * len(candidates)), len(candidates) - 1)]
        if kind is LoadBalancerType.LEAST_REQUEST:
            return lambda candidates: self._least_request(candidates, random)
        return default

    def _round_robin(self, key: str, candidates: Sequence[Workload]) -> Workload:
        ordered = sorted(candidates, key=lambda w: w.uid)
        if key not in self.positions and len(self.positions) >= self.max_keys:
            self.positions.pop(next(iter(self.positions)))
        position = self.positions.get(key, -1) + 1
        self.positions[key] = position % len(ordered)
        return ordered[position % len(ordered)]

    def _least_request(self, candidates: Sequence[Workload], random: Callable[[], float]) -> Workload:
        n = len(candidates)
        if n == 1:
            return candidates[0]
        first = min(int(random() * n), n - 1)
        second = min(int(random() * (n - 1)), n - 2)
        if second >= first:
            second += 1
        a, b = candidates[first], candidates[second]
        return b if self.in_flight.get(b.uid, 0) < self.in_flight.get(a.uid, 0) else a

    def started(self, uid: str) -> None:
        self.in_flight[uid] = self.in_flight.get(uid, 0) + 1

    def finished(self, uid: str) -> None:
        _decrement(self.in_flight, uid)


def _decrement(counts: dict[str, int], key: str) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
