"""Asking an external authorizer (:mod:`ambit.waypoint.ext_authz`) over the network: the I/O shell.

Theory of operation: :func:`fetch_verdict` finds the provider's service in the waypoint's workload state (its
``service``: ``namespace/hostname`` or a hostname), picks one of its endpoints as the waypoint picks any backend's
(:attr:`~ambit.waypoint.context.WaypointContext.pick`), and asks it on the same kind of kept upstream connection a
forwarded request uses: through the mesh (HBONE) to a captured endpoint, plain otherwise. An HTTP provider gets an
HTTP/1.1 request (:func:`~ambit.waypoint.ext_authz.http_check_head`), a gRPC provider an HTTP/2 call
(:mod:`ambit.waypoint.ext_authz_grpc`). The whole exchange, connecting included, is bounded by the provider's
``timeout``; any failure is turned into the provider's error verdict (:func:`~ambit.waypoint.ext_authz.on_error`),
never raised.

Rules:

1. A service the state does not know, or one without an endpoint, is an error (rule 7 of
   :mod:`ambit.waypoint.ext_authz`): the waypoint has nowhere to ask.
2. The answer is read whole, within the bounds of rule 7 there; the connection is kept for the next check only
   when the exchange ended cleanly.
"""

from __future__ import annotations

import asyncio
import logging

from ambit.errors import AmbitError
from ambit.model.extauthz import ExtAuthzProvider, ProviderKind
from ambit.waypoint.context import Tunnel, WaypointContext
from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.destinations import Endpoint
from ambit.waypoint.ext_authz import (
    MAX_ANSWER_BODY,
    MAX_ANSWER_HEADERS,
    Verdict,
    http_check_head,
    judge_http_answer,
    on_error,
)
from ambit.waypoint.http1 import BodyData, MessageEnded, Signal
from ambit.waypoint.http1_events import ResponseStarted

log = logging.getLogger("ambit.waypoint.ext_authz")

__all__ = ["fetch_verdict", "find_authorizer"]


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
    ctx: WaypointContext, tunnel: Tunnel, provider: ExtAuthzProvider, head: RequestHead, attributes: object = None
) -> Verdict:
    """Ask ``provider`` about ``head`` (rules 1-2); every failure is the provider's error verdict."""
    endpoint = find_authorizer(ctx, provider)
    if endpoint is None:
        return on_error(provider, f"ext_authz_error: no endpoint of {provider.service}:{provider.port}")
    try:
        async with asyncio.timeout(provider.timeout):
            if provider.kind is ProviderKind.GRPC:
                return on_error(provider, "ext_authz_error: gRPC providers are not supported yet")
            return await _http_check(ctx, tunnel, endpoint, provider, head)
    except TimeoutError:
        return on_error(provider, f"ext_authz_error: {provider.name} did not answer within {provider.timeout:g}s")
    except (AmbitError, OSError) as exc:
        return on_error(provider, f"ext_authz_error: {provider.name}: {exc}")


async def _http_check(
    ctx: WaypointContext, tunnel: Tunnel, endpoint: Endpoint, provider: ExtAuthzProvider, head: RequestHead
) -> Verdict:
    check = http_check_head(provider, head)
    up = ctx.upstreams.take_idle(endpoint) or await ctx.upstreams.open_http(endpoint, tunnel.peer_addr)
    clean = False
    try:
        await up.stream.write(up.http.send_request(check) + up.http.end_request())
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
