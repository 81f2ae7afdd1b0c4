"""One request through the waypoint, whatever its HTTP version: route it, answer it or forward it, measure it.

Theory of operation: the HTTP/1.1 shell (:mod:`ambit.waypoint.http1_proxy`) and the HTTP/2 shell
(:mod:`ambit.waypoint.http2_proxy`) parse a request head, give it an ``x-request-id`` and hand it here with the
client's end of the request (a :class:`~ambit.waypoint.downstream.RequestSide`: the body source and where the
answer goes) and its version (``RequestStarted.version``). :func:`serve_request`:

0. answers a request in HTTP/1.0 (any HTTP/1.x but 1.1) ``426 Upgrade Required``, no body and no response flag,
   before anything else, unless the context accepts HTTP/1.0: Envoy's connection manager does so in
   ``decodeHeaders`` (details ``low_version``) unless the listener has ``accept_http_10``, which istiod sets only
   with ``PILOT_HTTP10`` or the proxy's ``HTTP10`` metadata (:func:`ambit.waypoint.settings.accepts_http10`); the
   connection stays open only for a client that asked to keep it (``connection: keep-alive``). An accepted
   HTTP/1.0 request without ``Host`` is answered 400, empty (details ``missing_host``: istiod sets no
   ``default_host_for_http_10``). Then it
   replaces the client's ``x-forwarded-client-cert`` with what the waypoint verified
   (:func:`ambit.waypoint.client_cert.plan_client_cert`: removed, or the peer's identity when the waypoint's
   Gateway asks for it; an ingress gateway's connection by its mode,
   :func:`~ambit.waypoint.client_cert.plan_forwarded_client_cert`), so authentication, policies, routes and the
   backend see only that; then authenticates the request (RequestAuthentication,
   :func:`ambit.waypoint.authn.plan_authentication`): a token that no rule accepts is answered 401 (403 for its
   audience) with Envoy's reason, before anything else; then, when a CUSTOM policy's rules match it, asks that
   policy's external authorizer (:mod:`ambit.waypoint.ext_authz`; the body read ahead first when the provider wants
   it, :mod:`ambit.waypoint.ext_authz_body`): a denial is answered with the authorizer's status, headers and body
   and flag ``UAEX``, an allow adds the authorizer's headers to the request and the response (the route is still
   matched on the headers as they were, ext_authz rule 12); then authorizes it
   (:func:`ambit.waypoint.authorization.check_request`, with the token's identity): a denied request is answered
   403 ``RBAC: access denied`` with no response flag (Envoy's HTTP RBAC filter sets none) and the matched policy
   in the log line's error. The rest sees the request as authentication left it (the token removed unless
   ``forwardOriginalToken``, output headers set, the verified token's claims attached for the routes' claim
   matches);
1. asks the :data:`~ambit.waypoint.decisions.Router`, with the destination's route table (a Service target; a
   workload target is forwarded to that workload as addressed): :class:`~ambit.waypoint.decisions.Respond` is
   answered locally (the request body read and dropped first); :class:`~ambit.waypoint.decisions.Forward` goes
   to one endpoint of the backend Service, chosen for this request (so one connection spreads over all
   endpoints);
2. forwards with :func:`ambit.waypoint.forwarding.forward` (the route's retries and timeouts; a gRPC request's
   deadline is its ``grpc-timeout`` capped by the route's timeout, as Envoy's router takes it with istiod's
   ``max_grpc_timeout``: :mod:`ambit.waypoint.grpc_timeout`);
3. answers the route's cluster-not-found code (empty, flag NC: 500 for Gateway API routes, "a route to a missing
   backend answers 500"; 503 for a VirtualService) for a backend Service the state does not know, and 503 ``no
   healthy upstream`` (flag UH) when the backend has no endpoint; a backend naming a
   DestinationRule subset that no rule defines (or a TLS mode the waypoint cannot honour) answers 503 flag NC
   (:func:`ambit.waypoint.traffic_policy.plan_backend`), and the rule's subset, load balancer and transport
   (originated TLS, PROXY header) shape the endpoint choice and the connection;
4. speaks to the endpoint in the HTTP version :func:`ambit.waypoint.traffic_policy.plan_upstream_h2` decides
   from the backend port's declaration (a workload target: the addressed port's, unknown), the client's version
   and the rule's connection pool: the HTTP/2 connector (:mod:`ambit.waypoint.http2_upstream`) or the HTTP/1.1
   one (:mod:`ambit.waypoint.http1_upstream`), whichever shell took the request;
5. forwards a request to a ``DYNAMIC_DNS`` ServiceEntry host (a wildcard, listed in the WaypointConfig's
   ``dynamic_dns``) to the name its ``Host`` gives (:mod:`ambit.waypoint.dynamic_hosts`), resolved per request:
   a ``Host`` the addressed entry's host does not cover (or that is an IP literal, or not a host name) is answered
   404 with flag ``NR`` before any route is looked at, and so is the name a route leaves for a dynamic backend;
   nothing is resolved or dialled for it. A name that does not resolve answers 503 "DNS resolution failure" with
   flag ``DF`` (Envoy's ``DnsResolutionFailed``), not retried; one that resolves to what may not be dialled answers
   503 (flag ``UF``) like any endpoint that cannot be reached.
6. applies the EnvoyFilter patches the waypoint honours (:mod:`ambit.model.envoyfilter`): the HTTP filters'
   request edits after authorization and before routing (the route match sees them), the virtual-host and
   route-configuration edits of the destination's Service and port on the forwarded request after the route's
   own, and the response edits in reverse; a cluster patch asking for HTTP/2 speaks HTTP/2 to a backend the
   waypoint does not serve itself (istiod patches only a waypoint's outbound clusters).
7. finalizes the answers it makes itself as Envoy does its local replies. A local reply from any filter goes
   through the whole encoder chain (Envoy's filter manager starts encoding a local reply at the first encoder
   filter), so every answer gets the HTTP filters' (Lua ``envoy_on_response``) edits. Before that, the filter
   manager runs the matched route entry's ``finalizeResponseHeaders`` on every local reply of a stream whose route
   matched (the router does it itself for a direct response or a redirect), whichever filter answers: so the
   virtual-host and route-configuration edits of EnvoyFilter merges and the matched HTTPRoute rule's
   ``ResponseHeaderModifier`` (istiod's route-level ``response_headers_to_add``; applied first, before the body's
   ``content-type`` and length are set) are on a direct response, a redirect, a fault abort, 500 for a missing
   backend, 503 (no healthy upstream, overflow, an unknown subset, a connect failure), 504, and on the 401 and
   403 of authentication and authorization when the request matches a route (the route the connection manager
   matched on arrival; a destination without routes has its default route). Answers with no route (404, a
   dynamic host the entry does not cover) get none, and neither does a CORS preflight (the CORS filter encodes it
   itself, not as a local reply: :attr:`~ambit.waypoint.decisions.Respond.by_router` False).

:func:`account` counts one finished request once (``istio_requests_total`` and the histograms,
reporter="waypoint", ``request_protocol`` grpc or http) and writes its access-log line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from ambit.model.envoyfilter import HeaderOp
from ambit.model.metric_overrides import RequestAttributes
from ambit.model.routes import HeaderModifier, Timeouts
from ambit.model.workload import AppProtocol, Service, Workload
from ambit.proxy.accounting import principal
from ambit.waypoint.authn import Unauthenticated, plan_authentication
from ambit.waypoint.authorization import (
    DENIED_BODY,
    check_request,
    denial_detail,
    edge_client,
)
from ambit.waypoint.client_cert import plan_client_cert, plan_forwarded_client_cert
from ambit.waypoint.context import Tunnel, WaypointContext
from ambit.waypoint.decisions import RequestHead, Respond
from ambit.waypoint.destinations import (
    PLAIN,
    Endpoint,
    Refusal,
    ServiceTarget,
    find_backend_service,
    in_dialled_family,
    original_destination,
)
from ambit.waypoint.downstream import Outcome, RequestSide, respond
from ambit.waypoint.dynamic_hosts import judge_name, name_of_host, plan_request
from ambit.waypoint.envoy_patches import edit_request
from ambit.waypoint.ext_authz import CheckDenied, apply_allowed
from ambit.waypoint.ext_authz_client import fetch_custom_verdict
from ambit.waypoint.forwarded_for import edge_headers
from ambit.waypoint.forwarded_request import Plan
from ambit.waypoint.forwarding import forward
from ambit.waypoint.grpc_timeout import grpc_timeouts, is_grpc
from ambit.waypoint.http1 import BodyData, MessageEnded, RequestStarted, Signal
from ambit.waypoint.http1_upstream import http1_connector
from ambit.waypoint.http2_upstream import http2_connector
from ambit.waypoint.mirror import start_mirrors
from ambit.waypoint.response_base import OVERLOADED
from ambit.waypoint.retries import RESET_PREFIX
from ambit.waypoint.telemetry import RequestRecord
from ambit.waypoint.traffic_policy import DEFAULT as DEFAULT_BACKEND
from ambit.waypoint.traffic_policy import Admission, BackendPolicy, plan_upstream_h2
from ambit.waypoint.upstream import Connector

log = logging.getLogger("ambit.waypoint.exchange")

DRAIN_LIMIT = 1024 * 1024
"""Request body bytes read and dropped before a local answer; a longer body closes the connection instead."""


def _finalized_by(
    ctx: WaypointContext, tunnel: Tunnel, head: RequestHead, filter_ops: tuple[HeaderOp, ...]
) -> tuple[tuple[HeaderOp, ...], HeaderModifier | None]:
    """Rule 7 for an answer of a filter before the router (401, 403): the edits and the route modifier Envoy's
    filter manager finalizes it with, those of the route ``head`` matches (none when no route does)."""
    target = tunnel.target
    if not isinstance(target, ServiceTarget):
        return filter_ops, None
    table = ctx.routes.find_table(target.service.key, target.port)
    decision = ctx.router(table, target.backend, head, ctx.random())
    if isinstance(decision, Respond) and not decision.route:  # no route matched: nothing to finalize with
        return filter_ops, None
    patches = ctx.routes.current.envoy_patches
    route_ops = patches.route_response_ops(target.service.hostname, target.port) if patches.routes else ()
    return route_ops + filter_ops, decision.response_headers


async def serve_request(
    ctx: WaypointContext,
    tunnel: Tunnel,
    down: RequestSide,
    started: RequestStarted,
    outcome: Outcome,
) -> bool:
    """One request (rules 1-3); True when the connection may carry another. The request is copied to the
    route's mirror backends (over HTTP/1.1, :mod:`ambit.waypoint.mirror`), whichever version the client spoke."""
    outcome.head_at = ctx.clock()
    refusal = _version_refusal(started, accept_http10=ctx.accept_http10)
    if refusal is not None:
        keep = await _drain(down, started)
        await respond(down, refusal[0], (), b"", outcome)  # no body, no flag: Envoy's sendLocalReply(code, "")
        outcome.error = refusal[1]
        return keep
    target = tunnel.target
    config = ctx.routes.current
    key = tunnel.service_key
    if tunnel.forward_client_cert is None:
        head = plan_client_cert(
            started.head, include_identity=config.xfcc_client_identity, local=ctx.identity, peer=tunnel.peer_identity
        )
    else:
        head = plan_forwarded_client_cert(started.head, tunnel.forward_client_cert, tunnel.client_certificate)
    arrived = head  # what Envoy's connection manager matches the route on, before any filter runs
    patches = config.envoy_patches
    filter_ops = patches.filter_response_ops()  # rule 7: on every answer, local or forwarded
    if config.request_authentications:
        step = plan_authentication(head, config, key, await ctx.jwks.fetch_key_sets(), ctx.wall_clock())
        if isinstance(step, Unauthenticated):
            keep = await _drain(down, started)
            answer = step.response
            ops, modifier = _finalized_by(ctx, tunnel, arrived, filter_ops)
            await respond(down, answer.status, answer.headers, answer.body, outcome, edits=ops, route=modifier)
            outcome.error = step.details
            return keep
        head, identity = step.request, step.identity
        if identity is not None:  # route claim matches read the verified payload, never a header
            head = dataclasses.replace(head, jwt_claims=identity.claims)
    else:
        identity = None
    custom = ctx.authorizer.custom(config, key)
    if custom is not None:  # CUSTOM before DENY and ALLOW (ext_authz rule 1)
        checked, down = await fetch_custom_verdict(ctx, tunnel, custom, head, identity, started, down)
        if isinstance(checked, CheckDenied):
            keep = await _drain(down, started)
            ops, modifier = _finalized_by(ctx, tunnel, arrived, filter_ops)
            await respond(
                down,
                checked.status,
                checked.headers,
                checked.body,
                outcome,
                flags=checked.flags,
                edits=ops,
                route=modifier,
            )
            outcome.error = checked.reason
            return keep
        if checked is not None:
            head, filter_ops = apply_allowed(head, checked, filter_ops)
    authz = check_request(ctx, tunnel, head, identity)
    if not authz.allowed:
        keep = await _drain(down, started)
        ops, modifier = _finalized_by(ctx, tunnel, arrived, filter_ops)
        await respond(down, 403, (), DENIED_BODY, outcome, edits=ops, route=modifier)  # no flag: Envoy sets none
        outcome.error = denial_detail(authz)
        return keep
    if authz.audited:
        log.info("audit: %s %s matched %s", head.method, head.path[:200], ", ".join(authz.audited))
    edge = edge_client(ctx, tunnel, head)
    if edge is not None:  # the gateway vouches for the client address it decided on (forwarded_for rule 3)
        peer, client = edge
        head = head.edit_headers(lambda headers: edge_headers(headers, peer, client))
    if patches.filters:  # rule 6: the EnvoyFilters' HTTP filters, after authorization, before routing
        filtered = edit_request(head, patches.filter_request_ops())
        if filtered.headers != head.headers:  # a filter that edits the request clears the route cache
            filtered = dataclasses.replace(filtered, route_headers=None)
        head = filtered
    grpc = is_grpc(head.header("content-type"))  # rule 2: the router's deadline for gRPC (grpc_timeout)
    plan = Plan(head, timeouts=_timeouts(Timeouts(), head, grpc), response_ops=filter_ops, grpc=grpc)
    cluster_not_found = 500
    if isinstance(target, ServiceTarget) and ctx.routes.is_dynamic(key):
        named = _judge_host(head.authority, target.service)
        if isinstance(named, Refusal):  # rule 5: a name the entry's host does not cover matches no route
            keep = await _drain(down, started)
            await respond(down, named.status, (), b"", outcome, flags="NR", edits=filter_ops)
            outcome.error = named.reason
            return keep
    if isinstance(target, ServiceTarget):
        table = ctx.routes.find_table(key, target.port)
        decision = ctx.router(table, target.backend, head, ctx.random())
        outcome.route = decision.route
        hostname, listened = target.service.hostname, target.port
        route_ops = patches.route_response_ops(hostname, listened) if patches.routes else ()
        if decision.delay > 0:
            await asyncio.sleep(decision.delay)
            outcome.delay_injected = True
        if isinstance(decision, Respond):
            keep = await _drain(down, started)
            edits = route_ops + filter_ops if decision.by_router else filter_ops  # rule 7
            await respond(
                down,
                decision.status,
                decision.headers,
                decision.body,
                outcome,
                flags=decision.flags,
                edits=edits,
                route=decision.response_headers,
            )
            return keep
        cluster_not_found = decision.missing_backend_status
        down = start_mirrors(ctx, tunnel, decision.mirrors, down, started.has_body)
        service = find_backend_service(ctx.state, decision.backend)
        outcome.service = service
        port = decision.backend.port
        request, response_ops = decision.request, route_ops + filter_ops  # rule 7: the router's own answers too
        if patches.routes:  # rule 6: virtual-host and route-configuration header merges
            request = edit_request(request, patches.route_request_ops(hostname, listened))
        patched_h2 = (
            bool(patches.upstream_h2)
            and service is not None
            and service.key not in config.services
            and patches.wants_h2(service.hostname, port)
        )
        backend = ctx.routes.plan_backend(decision.backend, upgrade=started.upgrade)
        if isinstance(backend, Refusal):  # rule 3: a subset no DestinationRule defines
            keep = await _drain(down, started)
            await respond(
                down,
                backend.status,
                (),
                b"",
                outcome,
                flags="NC",
                edits=response_ops,
                route=decision.response_headers,
            )
            outcome.error = backend.reason
            return keep
        choose = ctx.choose
        limited = None if backend is DEFAULT_BACKEND else backend
        if backend is not DEFAULT_BACKEND:
            choose = ctx.balancer.chooser(
                backend.policy.load_balancer,
                backend.balance_key,
                ctx.choose,
                ctx.random,
                headers=decision.request.headers,
                path=decision.request.path,
                source_ip=tunnel.peer_addr.rpartition(":")[0].strip("[]"),
            )
        h2 = plan_upstream_h2(
            _declared(service, port),
            client_h2=started.version == "2",
            pool=backend.policy.connection_pool,
            upgraded=backend.transport.h2 or patched_h2,
            upgrade=started.upgrade,
            undeclared_follows_client=ctx.undeclared_follows_client,
        )
        transport = backend.transport if backend.transport.h2 == h2 else dataclasses.replace(backend.transport, h2=h2)
        plan = Plan(
            request,
            decision.response_headers,
            _timeouts(decision.timeouts, head, grpc),
            decision.retry,
            service,
            port,
            members=backend.members,
            locality=backend.locality(ctx.random, config.mesh_locality),
            choose=choose,
            transport=transport,
            report=_outlier_reporter(ctx, backend, service),
            response_ops=response_ops,
            attempt_count=ctx.edge,
            grpc=grpc,
        )
        endpoint = None
        if service is not None and ctx.routes.is_dynamic(service.key):  # rule 5
            found = plan_request(service, port, decision.request.authority, transport)
            if isinstance(found, Refusal):
                keep = await _drain(down, started)
                await respond(down, found.status, (), b"", outcome, flags="NR", edits=filter_ops)
                outcome.error = found.reason
                return keep
            endpoint = in_dialled_family(found, target)
            if endpoint is not None:
                transport = endpoint.transport  # its SNI is the name: a retry keeps it
                plan = dataclasses.replace(plan, transport=transport)
        elif service is not None:
            ejected = _ejected(ctx, backend)
            picking = {"only": backend.members, "near": ctx.near(), "locality": plan.locality}
            if ejected:
                endpoint = ctx.pick(ctx.state, service, port, choose, exclude=ejected, **picking)
            if endpoint is None:  # none ejected, or every one (Envoy's panic threshold: pick among all)
                endpoint = ctx.pick(ctx.state, service, port, choose, **picking)
            if endpoint is None and service.key == target.service.key and port == target.port:
                endpoint = original_destination(target)  # a PASSTHROUGH Service: where the client sent it
            endpoint = in_dialled_family(endpoint, target)
        if endpoint is not None and transport != PLAIN:
            endpoint = dataclasses.replace(endpoint, transport=transport)
    else:  # workload-addressed: to that workload, as addressed
        endpoint = Endpoint(target.workload, target.ip, target.port, None)
        limited = None
        h2 = plan_upstream_h2(
            target.protocol,
            client_h2=started.version == "2",
            pool=None,
            upgrade=started.upgrade,
            undeclared_follows_client=ctx.undeclared_follows_client,
        )
    if endpoint is None:
        keep = await _drain(down, started)
        if isinstance(target, ServiceTarget) and outcome.service is None:  # the route names an unknown Service
            await respond(
                down,
                cluster_not_found,
                (),
                b"",
                outcome,
                flags="NC",
                edits=plan.response_ops,
                route=plan.response_headers,
            )
        else:
            await respond(
                down,
                503,
                (),
                b"no healthy upstream",
                outcome,
                flags="UH",
                edits=plan.response_ops,
                route=plan.response_headers,
            )
        return keep
    outcome.endpoint = endpoint
    connector = http2_connector(ctx, tunnel) if h2 else http1_connector(ctx, tunnel)
    if limited is None:
        return await forward(ctx, tunnel, down, started, plan, endpoint, outcome, connector)
    return await _forward_limited(ctx, tunnel, down, started, plan, endpoint, outcome, connector, limited)


def _judge_host(host: str, service: Service) -> str | Refusal:
    """Rule 5's first check: the name in ``host`` when the Service's (wildcard) host covers it."""
    name = name_of_host(host)
    return name if isinstance(name, Refusal) else judge_name(name, service.hostname)


def _declared(service: Service | None, port: int) -> AppProtocol:
    """The protocol the backend Service declares for ``port`` (unknown when it or the port is)."""
    if service is None:
        return AppProtocol.UNKNOWN
    for mapping in service.ports:
        if mapping.service_port == port:
            return mapping.app_protocol
    return AppProtocol.UNKNOWN


def _ejected(ctx: WaypointContext, backend: BackendPolicy) -> frozenset[str]:
    detection = backend.policy.outlier_detection
    if detection is None or not detection.consecutive_5xx:
        return frozenset()
    return ctx.balancer.ejected(backend.balance_key, ctx.clock())


def _outlier_reporter(
    ctx: WaypointContext, backend: BackendPolicy, service: Service | None
) -> Callable[[str, bool], None] | None:
    detection = backend.policy.outlier_detection
    if detection is None or not detection.consecutive_5xx or service is None:
        return None
    endpoints = len(ctx.state.find_endpoints(service))
    key = backend.balance_key

    def report(uid: str, ok: bool) -> None:
        ctx.balancer.record(key, uid, ok, ctx.clock(), detection, endpoints)

    return report


OVERFLOW_BODY = RESET_PREFIX + b"reset reason: overflow"


async def _forward_limited(
    ctx: WaypointContext,
    tunnel: Tunnel,
    down: RequestSide,
    started: RequestStarted,
    plan: Plan,
    endpoint: Endpoint,
    outcome: Outcome,
    connector: Connector,
    backend: BackendPolicy,
) -> bool:
    """Forward under the DestinationRule's connection pool limits, counting requests in flight (LEAST_REQUEST)."""
    balancer, key, pool = ctx.balancer, backend.balance_key, backend.policy.connection_pool
    http1 = not endpoint.transport.h2
    verdict = balancer.admit(key, pool, http1=http1)
    if verdict is Admission.WAIT:
        condition = ctx.admission.setdefault(key, asyncio.Condition())
        balancer.pending[key] = balancer.pending.get(key, 0) + 1
        try:
            async with asyncio.timeout(plan.timeouts.request or ctx.limits.connect_timeout), condition:
                await condition.wait_for(lambda: balancer.has_room(key, pool, http1=http1))
        except TimeoutError:
            pass  # waited as long as a connection may take to open: overflow
        finally:
            balancer.pending[key] -= 1
        verdict = balancer.admit(key, pool, http1=http1, can_wait=False)
    if verdict is Admission.OVERFLOW:
        keep = await _drain(down, started)
        await respond(
            down,
            503,
            (OVERLOADED,),
            OVERFLOW_BODY,
            outcome,
            flags="UO",
            edits=plan.response_ops,
            route=plan.response_headers,
        )
        return keep
    uid = endpoint.workload.uid
    balancer.enter(key)
    balancer.started(uid)
    try:
        return await forward(ctx, tunnel, down, started, plan, endpoint, outcome, connector)
    finally:
        balancer.finished(uid)
        balancer.leave(key)
        waiting = ctx.admission.get(key)
        if waiting is not None:
            async with waiting:
                waiting.notify()


def _version_refusal(started: RequestStarted, *, accept_http10: bool) -> tuple[int, str] | None:
    """Rule 0: the connection manager's answer (status, response details) to an HTTP/1.0 request, if any."""
    if started.version in ("1.1", "2"):
        return None
    if not accept_http10:
        return (426, "low_version")
    return None if started.head.authority else (400, "missing_host")


def _timeouts(route: Timeouts, head: RequestHead, grpc: bool) -> Timeouts:
    """Rule 2: a gRPC request's deadline is its ``grpc-timeout`` capped by the route's timeout (istiod's
    ``max_grpc_timeout``; :mod:`ambit.waypoint.grpc_timeout`), any other request's the route's."""
    return grpc_timeouts(route, head.headers) if grpc else route


async def _drain(down: RequestSide, started: RequestStarted) -> bool:
    """Read and drop the request body before a local answer; False when it is too long to keep the tunnel."""
    dropped = 0
    while True:
        event = await down.next_event()
        if isinstance(event, MessageEnded):
            return True
        if isinstance(event, BodyData):
            dropped += len(event.data)
            if dropped > DRAIN_LIMIT:
                return False
        elif event is not Signal.PAUSED:
            return False


def account(
    ctx: WaypointContext,
    tunnel: Tunnel,
    head: RequestHead,
    outcome: Outcome,
    duration: float,
    grpc: bool,
    protocol: str = "HTTP/1.1",
) -> None:
    endpoint = outcome.endpoint
    destination: Workload | None = endpoint.workload if endpoint is not None else None
    service = outcome.service or (endpoint.service if endpoint is not None else None)
    if service is None and isinstance(tunnel.target, ServiceTarget) and endpoint is None and not tunnel.self_report:
        # A waypoint names the Service it was addressed; a gateway has none (istiod turns off the stats' host
        # header fallback for gateways: a request no route took has an unknown destination service).
        service = tunnel.target.service
    flags = outcome.reported_flags()
    labels = tunnel.labels(destination, service, flags=flags, protocol="grpc" if grpc else "http", cache=ctx.labels)
    client_principal = labels.source_principal  # the waypoint's source is its client
    if tunnel.self_report is not None:  # a gateway reporting as the source: its client is the downstream peer
        client_principal = principal(tunnel.peer_identity) if tunnel.mtls and tunnel.peer_identity else ""

    def attributes() -> RequestAttributes:
        source_ip, _, source_port = tunnel.peer_addr.rpartition(":")
        return RequestAttributes(
            method=head.method,
            path=head.path,
            host=head.authority,
            headers=head.headers,
            scheme=head.scheme,
            protocol=protocol,
            response_code=outcome.status,
            source_address=source_ip.strip("[]"),
            source_port=int(source_port) if source_port.isdigit() else 0,
            source_principal=client_principal,
            destination_address=endpoint.address.rpartition(":")[0].strip("[]") if endpoint else "",
            destination_port=tunnel.target.port,
            destination_principal=labels.destination_principal,
        )

    ctx.metrics.request(
        labels,
        response_code=outcome.status,
        grpc_status=outcome.grpc_status if grpc else "",
        duration_ms=duration * 1000,
        request_bytes=outcome.bytes_in,
        response_bytes=outcome.bytes_out,
        service_key=tunnel.service_key,
        request=attributes,
        overrides=ctx.routes.current.metrics,
    )
    source = tunnel.source
    ctx.request_log.write(
        RequestRecord(
            src_addr=tunnel.peer_addr,
            src_workload=source.name if source else "",
            src_namespace=source.namespace if source else "",
            src_identity=client_principal,
            dst_addr=endpoint.address if endpoint else "",
            dst_hbone_addr=tunnel.authority,
            dst_service=service.hostname if service else "",
            dst_workload=destination.name if destination else "",
            dst_namespace=destination.namespace if destination else "",
            dst_identity=labels.destination_principal,
            method=head.method,
            path=head.path,
            response_code=outcome.status,
            response_flags=flags,
            request_id=outcome.request_id,
            route=outcome.route,
            bytes_sent=outcome.bytes_in,
            bytes_recv=outcome.bytes_out,
            duration_seconds=duration,
            error=outcome.error,
            attempts=outcome.attempts,
            protocol=protocol,
        )
    )
