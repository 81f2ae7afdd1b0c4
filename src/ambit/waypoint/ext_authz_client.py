"""Asking an external authorizer (:mod:`ambit.waypoint.ext_authz`) over the network: the I/O shell.

Theory of operation: :func:`fetch_verdict` finds the provider's service in the waypoint's workload state (its
``service``: ``namespace/hostname`` or a hostname), picks one of its endpoints as the waypoint picks any backend's
(:attr:`~ambit.waypoint.context.WaypointContext.pick`), and asks it on the same kind of kept upstream connection a
forwarded request uses: through the mesh (HBONE) to a captured endpoint, plain otherwise. An HTTP provider gets an
HTTP/1.1 request (:func:`~ambit.waypoint.ext_authz.http_check_head`); a gRPC provider a unary HTTP/2 call
``envoy.service.auth.v3.Authorization/Check`` (:mod:`ambit.waypoint.ext_authz_wire`) on the waypoint's shared
HTTP/2 sessions to the endpoint (:mod:`ambit.waypoint.http2_upstream`). The whole exchange, connecting included,
is bounded by the provider's ``timeout``; any failure is turned into the provider's error verdict
(:func:`~ambit.waypoint.ext_authz.on_error`), never raised. :func:`fetch_custom_verdict` is the exchange's whole
CUSTOM step for one request: the applicable CUSTOM policies' trigger, the body read ahead when the provider wants
it, then the check.

Rules:

1. A service the state does not know, or one without an endpoint, is an error (rule 7 of
   :mod:`ambit.waypoint.ext_authz`): the waypoint has nowhere to ask.
2. The answer is read whole, within the bounds of rule 7 there; the connection is kept for the next check only
   when the exchange ended cleanly (an HTTP/2 stream is reset when it did not).
3. A gRPC call carries ``grpc-timeout`` (the provider's timeout), one message each way; a non-OK ``grpc-status``,
   no message or more than one, or a message :mod:`ambit.waypoint.ext_authz_wire` cannot read is an error.
4. A TCP connection is checked only with a gRPC provider (:func:`fetch_connection_verdict`: Envoy's network
   ``ext_authz`` filter, which istiod configures only for one): the ``CheckRequest`` holds the source and
   destination peers and no request.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ambit.errors import AmbitError
from ambit.hbone.errors import HboneError
from ambit.hbone.grpc_calls import MessageReader, call_status, encode_message, request_headers
from ambit.model.extauthz import ExtAuthzProvider, ProviderKind
from ambit.waypoint.authorization import DENIED_BODY, connection_of, edge_client, request_of
from ambit.waypoint.context import Tunnel, WaypointContext
from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.destinations import Endpoint
from ambit.waypoint.ext_authz import (
    MAX_ANSWER_BODY,
    MAX_ANSWER_HEADERS,
    CheckAllowed,
    CheckDenied,
    CustomPolicies,
    DeniedOutright,
    Peers,
    Verdict,
    check_attributes,
    http_check_head,
    judge_grpc_answer,
    judge_http_answer,
    on_error,
)
from ambit.waypoint.ext_authz_body import ReadAhead, read_ahead
from ambit.waypoint.ext_authz_wire import (
    CheckAttributes,
    ExtAuthzWireError,
    decode_check_response,
    encode_check_request,
)
from ambit.waypoint.http1 import BodyData, MessageEnded, RequestStarted, Signal
from ambit.waypoint.http1_events import ResponseStarted
from ambit.waypoint.http2_upstream import http2_connector

if TYPE_CHECKING:
    from ambit.model.requestauth import RequestIdentity
    from ambit.waypoint.downstream import RequestSide

log = logging.getLogger("ambit.waypoint.ext_authz")

__all__ = ["fetch_connection_verdict", "fetch_custom_verdict", "fetch_verdict", "find_authorizer"]


class _AnswerError(AmbitError):
    """The authorizer's answer broke off or went over a bound."""


def find_authorizer(ctx: WaypointContext, provider: ExtAuthzProvider) -> Endpoint | None:
    """One endpoint of the provider's service (rule 1), or None."""
    host, namespace = provider.host_and_namespace
    service = ctx.state.find_service_by_hostname(host)
    if service is None or (namespace not in ("", "*", ".") and service.namespace != namespace):
        return None
    return ctx.pick(ctx.state, service, provider.port, ctx.choose)


async def fetch_verdict(
    ctx: WaypointContext,
    tunnel: Tunnel,
    provider: ExtAuthzProvider,
    head: RequestHead,
    version: str = "1.1",
    body: ReadAhead | None = None,
) -> Verdict:
    """Ask ``provider`` about ``head`` (rules 1-2), with the ``body`` read ahead when it wants one; every failure is
    the provider's error verdict."""
    endpoint = find_authorizer(ctx, provider)
    if endpoint is None:
        return on_error(provider, f"ext_authz_error: no endpoint of {provider.service}:{provider.port}")
    try:
        async with asyncio.timeout(provider.timeout):
            if provider.kind is ProviderKind.GRPC:
                protocol = "HTTP/2" if version == "2" else f"HTTP/{version}"
                attributes = check_attributes(
                    head,
                    protocol,
                    _peers(ctx, tunnel),
                    body.body if body is not None else b"",
                    raw_body=provider.pack_as_bytes,
                    partial=None if body is None else body.longer,
                )
                return await _grpc_check(ctx, tunnel, endpoint, provider, attributes)
            return await _http_check(ctx, tunnel, endpoint, provider, head, body)
    except TimeoutError:
        return on_error(provider, f"ext_authz_error: {provider.name} did not answer within {provider.timeout:g}s")
    except (AmbitError, HboneError, OSError) as exc:
        return on_error(provider, f"ext_authz_error: {provider.name}: {exc}")


async def fetch_custom_verdict(
    ctx: WaypointContext,
    tunnel: Tunnel,
    custom: CustomPolicies,
    head: RequestHead,
    identity: RequestIdentity | None,
    started: RequestStarted,
    down: RequestSide,
) -> tuple[Verdict | None, RequestSide]:
    """The CUSTOM step of one request (:mod:`ambit.waypoint.ext_authz`): None when no CUSTOM rule matches it; and
    the client's side to read the body through from now on (:mod:`ambit.waypoint.ext_authz_body`)."""
    edge = edge_client(ctx, tunnel, head)
    step = custom.step(connection_of(tunnel), request_of(head, identity, edge[1] if edge else None))
    if step is None:
        return None, down
    if isinstance(step, DeniedOutright):  # rule 3: istiod's deny configs
        reason = f"rbac_access_denied_matched_policy[{step.policy}]: several CUSTOM providers"
        return CheckDenied(403, (), DENIED_BODY, reason, flags="-"), down
    body = None
    if step.max_request_bytes is not None and started.has_body:
        body = await read_ahead(down, step.max_request_bytes)
        down = body.side
        if body.longer and not step.allow_partial_message:  # ext_authz_body rule 2
            return CheckDenied(413, (), b"Payload Too Large", "request_payload_too_large", flags="-"), down
    verdict = await fetch_verdict(ctx, tunnel, step, head, started.version, body)
    if isinstance(verdict, CheckAllowed) and verdict.reason:
        log.info("ext_authz: %s", verdict.reason)
    return verdict, down


async def _http_check(
    ctx: WaypointContext,
    tunnel: Tunnel,
    endpoint: Endpoint,
    provider: ExtAuthzProvider,
    head: RequestHead,
    body: ReadAhead | None,
) -> Verdict:
    data = body.body if body is not None else b""
    check = http_check_head(provider, head, data, body is not None and body.longer)
    up = ctx.upstreams.take_idle(endpoint) or await ctx.upstreams.open_http(endpoint, tunnel.peer_addr)
    clean = False
    try:
        request = up.http.send_request(check, body=bool(data))
        await up.stream.write(request + up.http.send_body(data) + up.http.end_request())
        status, size = 0, 0
        headers: tuple[tuple[str, str], ...] = ()
        chunks: list[bytes] = []
        while True:
            event = up.http.next_event()
            if event is Signal.NEED_DATA:
                up.http.receive_data(await up.stream.read())
            elif isinstance(event, ResponseStarted):
                if len(event.headers) > MAX_ANSWER_HEADERS:
                    raise _AnswerError(f"more than {MAX_ANSWER_HEADERS} headers in the answer")
                status, headers = event.status, event.headers
            elif isinstance(event, BodyData):
                size += len(event.data)
                if size > MAX_ANSWER_BODY:
                    raise _AnswerError(f"an answer body over {MAX_ANSWER_BODY} bytes")
                chunks.append(event.data)
            elif isinstance(event, MessageEnded):
                break
            elif event in (Signal.CLOSED, Signal.PAUSED):
                raise _AnswerError("the authorizer closed before answering")
        clean = up.http.next_cycle()
    finally:
        if clean:
            ctx.upstreams.put_idle(up, ctx.clock())
        else:
            up.discard()
    return judge_http_answer(provider, status, headers, b"".join(chunks))


CHECK_PATH = "/envoy.service.auth.v3.Authorization/Check"


async def fetch_connection_verdict(ctx: WaypointContext, tunnel: Tunnel, provider: ExtAuthzProvider) -> Verdict:
    """Rule 4: a TCP connection's check with a gRPC ``provider`` (the peers only, as Envoy's network filter)."""
    endpoint = find_authorizer(ctx, provider)
    if endpoint is None:
        return on_error(provider, f"ext_authz_error: no endpoint of {provider.service}:{provider.port}")
    (source_ip, source_port, source_id), (dest_ip, dest_port, dest_id) = _peers(ctx, tunnel)
    attributes = CheckAttributes(
        "",
        "",
        "",
        (),
        scheme="",
        protocol="",
        size=0,
        source_address=source_ip,
        source_port=source_port,
        source_principal=source_id,
        destination_address=dest_ip,
        destination_port=dest_port,
        destination_principal=dest_id,
        http=False,
    )
    try:
        async with asyncio.timeout(provider.timeout):
            return await _grpc_check(ctx, tunnel, endpoint, provider, attributes)
    except TimeoutError:
        return on_error(provider, f"ext_authz_error: {provider.name} did not answer within {provider.timeout:g}s")
    except (AmbitError, HboneError, OSError) as exc:
        return on_error(provider, f"ext_authz_error: {provider.name}: {exc}")


def _peers(ctx: WaypointContext, tunnel: Tunnel) -> Peers:
    """(address, port, principal) of the source (the tunnel's peer) and the destination (what it addressed, the
    waypoint's own identity), as Envoy fills ``AttributeContext.source`` and ``destination``."""
    source_ip, _, source_port = tunnel.peer_addr.rpartition(":")
    conn = connection_of(tunnel)
    return (
        (source_ip.strip("[]"), int(source_port) if source_port.isdigit() else 0, str(tunnel.peer_identity or "")),
        (str(conn.destination_ip), conn.destination_port, str(ctx.identity or "")),
    )


async def _grpc_check(
    ctx: WaypointContext,
    tunnel: Tunnel,
    endpoint: Endpoint,
    provider: ExtAuthzProvider,
    attributes: CheckAttributes,
) -> Verdict:
    payload = encode_check_request(attributes)
    host, _ = provider.host_and_namespace
    call = RequestHead(
        "POST",
        CHECK_PATH,
        f"{host}:{provider.port}",
        tuple(request_headers(CHECK_PATH, timeout=provider.timeout)),
    )
    up = await http2_connector(ctx, tunnel)(endpoint, False)
    done = False
    try:
        await up.send_request(call, body=True)
        await up.send_body(encode_message(payload))
        await up.end_request()
        reader = MessageReader(MAX_ANSWER_BODY)
        messages: list[bytes] = []
        http_status = 0
        fields: tuple[tuple[str, str], ...] = ()
        trailers: tuple[tuple[str, str], ...] = ()
        while True:
            event = await up.next_event()
            if isinstance(event, ResponseStarted):
                if len(event.headers) > MAX_ANSWER_HEADERS:
                    raise _AnswerError(f"more than {MAX_ANSWER_HEADERS} headers in the answer")
                http_status, fields = event.status, event.headers
            elif isinstance(event, BodyData):
                messages.extend(reader.feed(event.data))
                if len(messages) > 1:
                    raise _AnswerError("more than one message in a unary answer")
            elif isinstance(event, MessageEnded):
                trailers = event.trailers
                break
            elif event in (Signal.CLOSED, Signal.PAUSED):
                raise _AnswerError("the authorizer closed before answering")
        done = True
    finally:
        if done:
            up.finish(ctx.clock())
        else:
            up.abort()
    status = call_status(trailers or fields, http_status)
    if not status.ok:
        return on_error(provider, f"ext_authz_error: {provider.name}: the call failed: {status}")
    if len(messages) != 1:
        return on_error(provider, f"ext_authz_error: {provider.name}: no answer message")
    try:
        answer = decode_check_response(messages[0])
    except ExtAuthzWireError as exc:
        return on_error(provider, f"ext_authz_error: {provider.name}: {exc}")
    return judge_grpc_answer(provider, answer)
