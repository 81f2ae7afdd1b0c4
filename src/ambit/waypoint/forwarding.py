"""One forwarded HTTP/1.1 request: its tries under the route's retry policy and timeouts.

Theory of operation: :func:`forward` drives a :class:`~ambit.waypoint.retries.RetryMachine` (the pure decisions:
when to retry, how long to wait, what to answer) and carries out its commands. The request's own task runs the
tries one after another; the tries, the duplex body task and the timers feed the machine their events as they
happen, and its commands are acted on at once, except the answers (a local response, an abort), which wait until
the try has ended. So the machine sees every fact once and in the order it happened, and a request costs no task
of its own (one per duplex body only).

Rules:

1. Each event goes to the machine when it happens, and its commands are carried out then: a timer is armed,
   the next try noted, the body released, the current try given up. A try given up by its own event (a retriable
   response head) returns; one given up while it waits (a timer fired) is stopped by cancelling the request's
   task, a cancellation that ends where the try began (the task's cancel count tells it from any other, which is
   passed on). A local answer or an abort is carried out by the request's task once the try has ended. A failure
   of the client (its body broke HTTP/1.1, it went away) or a bug in a try is raised to the request loop. The
   client's end is not watched while no try reads or writes it: a client that leaves during a backoff or while
   the endpoint thinks is noticed at the next write (the tries stay bounded by the policy and the timeouts).
2. Timers are loop callbacks armed against the context's clock seam (``deadline - ctx.clock()``): the request
   timer (``timeouts.request``: the whole exchange, retries and the response body included) posts
   :class:`~ambit.waypoint.retries.RequestTimedOut`; the try timer (``timeouts.backend_request``) posts
   :class:`~ambit.waypoint.retries.AttemptTimedOut`. A try's timer is cancelled when the try is stopped, every
   timer when the exchange ends.
3. A try waits its backoff, reports that it started, picks its endpoint, takes a kept connection to it or opens
   one (failure: ``ConnectFailed``), sends the request head and the body, and waits for the response head
   (``ResponseHead``; any failure before it: ``UpstreamReset``). The first try goes to the endpoint the request
   loop picked; a retry picks anew among the Service's healthy endpoints this request has not tried yet, and
   among all of them again once every one was tried. This is Envoy's ``previous_hosts`` retry predicate, which
   Istio turns on for every route by default: a retry hides a failing endpoint instead of hitting it again. A
   workload-addressed request has one endpoint and retries there. A hostname endpoint is resolved in the first
   try's IP version on every try (:func:`~ambit.waypoint.destinations.in_dialled_family`). Each try's head says
   which try it is and how long the endpoint has (:func:`~ambit.waypoint.forwarded_request.try_request`).
4. A kept connection that turns out dead before any answer (the endpoint closed it while idle: the keep-alive
   race) is replaced once by a fresh one within the same try, when the body can still be replayed.
5. The request body is kept for replay as it is read from the client
   (:class:`~ambit.waypoint.forwarded_request.ReplayBuffer`, up to :data:`~ambit.waypoint.retries.REPLAY_LIMIT`),
   and each chunk is reported (``RequestBodySent``): a retry replays the buffer, then reads on.
6. ``ForwardResponse`` lets the try stream its response to the client (:mod:`ambit.waypoint.forwarded_response`:
   the route's response header changes, ``BodyStarted``, then ``ResponseCompleted``, or ``UpstreamReset`` when
   the endpoint fails in the middle; a 101 becomes a raw relay). The status the retry machine judges is
   :func:`~ambit.waypoint.forwarded_response.retry_status` (gRPC CANCELLED and UNAVAILABLE count as 503). A
   retriable status forwarded because the retries ran out carries Envoy's flag ``URX`` (upstream retry limit
   exceeded) in the metrics and the log.
7. ``CancelAttempt`` stops the try (rule 1), which aborts its upstream connection; ``RespondLocally`` stops any
   try and writes Envoy's answer with its response flag (plus ``URX`` for a connection failure or refused stream
   that was retried until the retries ran out: ``UF,URX``, as Envoy logs it); ``AbortResponse`` resets the
   client's stream (a status was already sent, so nothing else can tell the client the response is incomplete).
8. :func:`forward` returns True when the tunnel may carry another request: the exchange was not aborted (the
   request loop then checks with h11 that the whole request was read).
9. On a duplex upstream (HTTP/2, where gRPC streams both ways at once) the request body is sent by a task of its
   own from the request head on, while the try waits for the response head and streams the response; the task
   ends with the try (a response that ended before the client's body did stops it).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from ambit.errors import AmbitError
from ambit.waypoint import retries
from ambit.waypoint.context import Tunnel, WaypointContext
from ambit.waypoint.destinations import Endpoint
from ambit.waypoint.downstream import DownstreamGoneError, Outcome, RequestSide, respond
from ambit.waypoint.errors import HttpProtocolError
from ambit.waypoint.forwarded_request import Plan, ReplayBuffer, try_request
from ambit.waypoint.forwarded_response import client_headers, retry_status, stream_response, switch_protocols
from ambit.waypoint.http1 import BodyData, Event, InterimResponse, MessageEnded, RequestStarted, ResponseStarted
from ambit.waypoint.http1_upstream import http1_connector
from ambit.waypoint.response_base import service_time
from ambit.waypoint.upstream import Connector, UpstreamConnectError, UpstreamDnsError, UpstreamExchange

__all__ = ["forward"]


class _UpstreamFailedError(Exception):
    """The endpoint went away or broke HTTP/1.1."""


async def forward(
    ctx: WaypointContext,
    tunnel: Tunnel,
    down: RequestSide,
    started: RequestStarted,
    plan: Plan,
    endpoint: Endpoint,
    outcome: Outcome,
    connector: Connector | None = None,
) -> bool:
    """Forward one request to ``endpoint`` (then to others as retries say); see the module rules. ``connector``
    gives the upstream end of a try (default: HTTP/1.1, kept connections reused)."""
    body = ReplayBuffer()
    if not started.has_body:
        event = await down.next_event()  # h11 ends a bodiless request at once
        if not isinstance(event, MessageEnded):
            raise HttpProtocolError("request without a body did not end")
        body.ended = True
    connect = connector or http1_connector(ctx, tunnel)
    return await _Exchange(ctx, tunnel, down, started, plan, endpoint, outcome, body, connect).run()


class _Exchange:
    def __init__(
        self,
        ctx: WaypointContext,
        tunnel: Tunnel,
        down: RequestSide,
        started: RequestStarted,
        plan: Plan,
        endpoint: Endpoint,
        outcome: Outcome,
        body: ReplayBuffer,
        connector: Connector,
    ) -> None:
        self.ctx, self.tunnel, self.down, self.started = ctx, tunnel, down, started
        self.connector = connector
        self.plan, self.first, self.outcome, self.body = plan, endpoint, outcome, body
        self.machine = retries.RetryMachine(plan.retry, plan.timeouts, ctx.clock())
        self.owner: asyncio.Task[object] | None = None
        """The request's task: it drives the machine and runs the tries (rule 1)."""
        self.next: retries.StartAttempt | None = None
        """The try to run next (rule 3)."""
        self.later: list[retries.RespondLocally | retries.AbortResponse] = []
        """What the owner carries out once the current try has ended (rule 7)."""
        self.in_try = False
        self.stopping = False
        """The current try was given up (``CancelAttempt``): it returns, or is cancelled when it waits."""
        self.cancelled = False
        """The owner was cancelled to stop its try (told apart from any other cancellation by its count)."""
        self.forwarding = False
        """``ForwardResponse`` came for the current try."""
        self.request_timer: asyncio.TimerHandle | None = None
        self.try_timer: asyncio.TimerHandle | None = None
        self.tried: set[str] = set()
        self.body_task: asyncio.Task[None] | None = None
        """A duplex try's request body, sent while the response comes (rule 9)."""
        self.detail = ""
        """Why the last try failed (the access log's error)."""
        self.aborted = False
        self.request_ended_at: float | None = None
        """When the client's request ended (``ctx.clock``): a response head's service time counts from it, waits
        for the connection pool's room and retries included, as Envoy's router counts it."""
        if body.ended:
            self.request_ended_at = ctx.clock() if outcome.head_at is None else outcome.head_at

    async def run(self) -> bool:
        self.owner = asyncio.current_task()
        try:
            self._dispatch(self.machine.begin())
            while True:
                while self.later:
                    await self._finish(self.later.pop(0))
                start, self.next = self.next, None
                if start is None:
                    break
                await self._run_try(start.attempt, start.delay)
            if not self.machine.done:
                raise AssertionError(f"retries: a try ended while {self.machine.state.value}")
        finally:
            for timer in (self.request_timer, self.try_timer):
                if timer is not None:
                    timer.cancel()
        return not self.aborted and self.outcome.status != 101

    async def _run_try(self, attempt: int, delay: float) -> None:
        """Rule 1: one try in the owner's task; a ``CancelAttempt`` from a timer cancels the task, and that
        cancellation ends here (any other is passed on)."""
        owner = self.owner
        assert owner is not None
        cancelling = owner.cancelling()
        self.in_try, self.stopping, self.cancelled, self.forwarding = True, False, False, False
        try:
            await self._try(attempt, delay)
        except (Exception, asyncio.CancelledError):
            if not self.cancelled:
                raise
            # given up: what the try raised on its way out does not matter
        finally:
            self.in_try = False
        if self.cancelled:
            self.cancelled = False
            if owner.uncancel() > cancelling:  # cancelled from elsewhere as well
                raise asyncio.CancelledError

    def _post(self, event: retries.Event) -> None:
        """Feed the machine an event (from the try, the body task or a timer) and act on its commands now."""
        self._dispatch(self.machine.handle(event))

    def _dispatch(self, commands: list[retries.Command]) -> None:
        for command in commands:
            match command:
                case retries.ArmRequestTimer(deadline=deadline):
                    self.request_timer = self._arm(deadline, self._request_timed_out)
                case retries.StartAttempt():
                    self.next = command
                case retries.ArmAttemptTimer(attempt=attempt, deadline=deadline):
                    self.try_timer = self._arm(deadline, self._try_timed_out, attempt)
                case retries.CancelAttempt():
                    self._stop_try()
                case retries.ForwardResponse():
                    self.forwarding = True
                case retries.RespondLocally() | retries.AbortResponse():
                    self._stop_try()
                    self.later.append(command)
                case retries.ReleaseBody():
                    self.body.release()
                case _:
                    raise AssertionError(f"unknown retry command {command!r}")

    def _arm(self, deadline: float, callback: Callable[..., None], *args: object) -> asyncio.TimerHandle:
        """Rule 2: one timer handle calling ``callback(*args)`` at ``deadline`` on the context's clock."""
        return asyncio.get_running_loop().call_later(max(deadline - self.ctx.clock(), 0.0), callback, *args)

    def _request_timed_out(self) -> None:
        self._post(retries.RequestTimedOut())

    def _try_timed_out(self, attempt: int) -> None:
        self._post(retries.AttemptTimedOut(attempt, self.ctx.clock()))

    def _stop_try(self) -> None:
        """Rule 7: give up the current try. Told so by its own event, it returns; waiting (a timer said so), the
        owner is cancelled, and :meth:`_run_try` ends that cancellation."""
        if self.try_timer is not None:
            self.try_timer.cancel()
            self.try_timer = None
        if not self.in_try or self.stopping:
            return
        self.stopping = True
        owner = self.owner
        if owner is not None and asyncio.current_task() is not owner:
            self.cancelled = True
            owner.cancel()

    async def _finish(self, command: retries.RespondLocally | retries.AbortResponse) -> None:
        """Rule 7: the owner's answer after the try ended."""
        match command:
            case retries.RespondLocally(status=status, body=text, flag=flag):
                if flag in ("UF", "UR") and self.plan.retry.on_connect_failure and self._retries_ran_out():
                    flag = f"{flag},URX"  # rule 7
                ops = self.plan.response_ops  # the router's own answer: exchange rule 7
                await respond(
                    self.down, status, (), text, self.outcome, flags=flag, edits=ops, route=self.plan.response_headers
                )
                if self.detail:
                    self.outcome.error = f"{text.decode()}: {self.detail}"
            case retries.AbortResponse(flag=flag):
                self.outcome.flags, self.aborted = flag, True
                self.outcome.error = self.detail or ("upstream request timeout" if flag == "UT" else "upstream reset")
                self.down.abort()

    def _retries_ran_out(self) -> bool:
        """Every retry the policy allows was made (Envoy's ``URX``, upstream retry limit exceeded)."""
        allowed = self.plan.retry.attempts
        return allowed > 0 and self.outcome.attempts > allowed

    def _endpoint(self, attempt: int) -> Endpoint:
        """Rule 3: the first try's endpoint, or one not tried yet when the Service has one."""
        endpoint = self.first if attempt == 1 else self.outcome.endpoint or self.first
        service = self.plan.service
        if attempt > 1 and service is not None:
            state, choose, only = self.ctx.state, self.plan.choose or self.ctx.choose, self.plan.members
            pick = self.ctx.pick
            picking = {"only": only, "near": self.ctx.near(), "locality": self.plan.locality}
            fresh = pick(state, service, self.plan.port, choose, exclude=frozenset(self.tried), **picking)
            endpoint = fresh or pick(state, service, self.plan.port, choose, **picking) or endpoint
            if endpoint.resolve_hostname and self.first.resolve_hostname:  # the first try's family
                endpoint = dataclasses.replace(endpoint, ip=self.first.ip)
            if endpoint.transport != self.plan.transport:
                endpoint = dataclasses.replace(endpoint, transport=self.plan.transport)
        self.tried.add(endpoint.workload.uid)
        return endpoint

    def _report(self, endpoint: Endpoint, *, ok: bool) -> None:
        if self.plan.report is not None:
            self.plan.report(endpoint.workload.uid, ok)

    async def _try(self, attempt: int, delay: float) -> None:
        clock = self.ctx.clock
        up: UpstreamExchange | None = None
        try:
            if delay > 0:
                await asyncio.sleep(delay)
            self._post(retries.AttemptStarted(attempt, clock()))
            endpoint = self._endpoint(attempt)
            self.outcome.endpoint, self.outcome.attempts = endpoint, attempt
            try:
                up, head = await self._send(endpoint)
            except UpstreamDnsError as exc:
                self.detail = str(exc)
                self._post(retries.DnsFailed(attempt))
                return
            except UpstreamConnectError as exc:
                self.detail = str(exc)
                self._report(endpoint, ok=False)
                self._post(retries.ConnectFailed(attempt, clock()))
                return
            except _UpstreamFailedError as exc:
                self.detail = str(exc)
                self._post(retries.UpstreamReset(attempt))
                return
            status = retry_status(head)
            self._report(endpoint, ok=status < 500)
            self._post(retries.ResponseHead(attempt, status, clock()))
            if not self.forwarding:  # retried: CancelAttempt and the next StartAttempt
                return
            self.detail = ""
            if status in self.plan.retry.codes and self._retries_ran_out():
                self.outcome.flags = "URX"  # rule 6
            if isinstance(head, InterimResponse):
                self._post(retries.ResponseCompleted())
                await switch_protocols(self.down, up, head, self.outcome, self.ctx.limits.idle_timeout)
                up = None  # the relay closed it
            else:
                took = service_time(self.request_ended_at, clock())
                headers = client_headers(head, took, self.plan.response_headers, self.plan.response_ops)
                failed = await stream_response(self.down, up, head, headers, self.outcome, self._post)
                if failed is None:
                    up.finish(clock())
                    up = None
                else:
                    self.detail = failed
                    self._post(retries.UpstreamReset(attempt))
        finally:
            await self._stop_body()
            if up is not None:
                up.abort()

    async def _send(self, endpoint: Endpoint) -> tuple[UpstreamExchange, ResponseStarted | InterimResponse]:
        """Rule 3 and rule 4: send the request on a kept connection or a new one; wait for the response head."""
        fresh = False
        while True:
            up = await self.connector(endpoint, fresh)
            request = try_request(self.plan, self.outcome.attempts, self._since_request_ended)
            try:
                await up.send_request(request, upgrade=self.started.upgrade, body=self.started.has_body)
                if not up.duplex:
                    await self._send_body(up)
                    return up, await _response_head(up)
                return up, await self._duplex_head(up)
            except HttpProtocolError as exc:
                up.abort()
                if not exc.upstream:
                    raise  # the client's request cannot be forwarded
                raise _UpstreamFailedError(str(exc)) from None
            except (AmbitError, OSError, _UpstreamFailedError) as exc:
                up.abort()
                if up.reused and not fresh and self.body.replayable:
                    fresh = True
                    continue
                raise _UpstreamFailedError(str(exc) or type(exc).__name__) from None
            except BaseException:
                up.abort()
                raise

    def _since_request_ended(self) -> float:
        """How long ago the client's request ended (0 while it has not): Envoy's router counts from there."""
        ended = self.request_ended_at
        return 0.0 if ended is None else self.ctx.clock() - ended

    async def _duplex_head(self, up: UpstreamExchange) -> ResponseStarted | InterimResponse:
        """Rule 9: the body goes up in a task of its own while the response head is awaited."""
        self.body_task = body = asyncio.get_running_loop().create_task(self._send_body(up))
        head = asyncio.get_running_loop().create_task(_response_head(up))
        try:
            await asyncio.wait({body, head}, return_when=asyncio.FIRST_COMPLETED)
            if not head.done():
                body.result()  # raises the client's error or the upstream's, if that is why it ended
            return await head
        finally:
            if not head.done():
                head.cancel()
                await asyncio.wait([head])

    async def _stop_body(self) -> None:
        task, self.body_task = self.body_task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])
        elif task is not None and not task.cancelled():
            task.exception()  # retrieved: a body that failed after the response began is the response's business

    async def _send_body(self, up: UpstreamExchange) -> None:
        """Rule 5: the buffered body, then the rest as the client sends it."""
        body = self.body
        if not body.ended or body.chunks:
            if not body.replayable and body.total:
                raise AssertionError("a request body that was not kept cannot be sent again")
            for chunk in body.chunks:
                await up.send_body(chunk)
            await self.down.continue_if_waited()
        while not body.ended:
            event = await self._client_event()
            if isinstance(event, BodyData):
                body.add(event.data)
                self.outcome.bytes_in += len(event.data)
                self._post(retries.RequestBodySent(body.total))
                await up.send_body(event.data)
            elif isinstance(event, MessageEnded):
                body.ended, body.trailers = True, event.trailers
                self.request_ended_at = self.ctx.clock()
            else:
                raise HttpProtocolError("request body ended early")
        await up.end_request(body.trailers)

    async def _client_event(self) -> Event:
        try:
            return await self.down.next_event()
        except HttpProtocolError:
            raise
        except (AmbitError, OSError) as exc:  # the client's tunnel broke or idled: not the endpoint's fault
            raise DownstreamGoneError(f"reading the request body: {exc or type(exc).__name__}") from None


async def _response_head(up: UpstreamExchange) -> ResponseStarted | InterimResponse:
    while True:
        event = await up.next_event()
        if isinstance(event, ResponseStarted):
            return event
        if isinstance(event, InterimResponse):
            if event.status == 101:
                return event
            continue  # other 1xx (103 Early Hints) are not passed on
        raise _UpstreamFailedError("upstream closed the connection before answering")
