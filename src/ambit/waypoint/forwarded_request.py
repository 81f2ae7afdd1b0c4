"""What a forwarded HTTP request sends upstream on each try: the route's plan, the body kept for replay, and the head
as each try writes it (pure; the tries themselves are :mod:`ambit.waypoint.forwarding`'s).

Theory of operation: the request path decides once, per request, what goes upstream (:class:`Plan`: the rewritten
request, the response header changes, timeouts, retry policy and where a retry may go). Every try sends the same
request, with two differences: its head says which try it is and how long the endpoint has
(:func:`try_request`), and from the second try on its body is replayed from a :class:`ReplayBuffer` before the rest
is read from the client.

Rules:

1. The body is buffered as it is read from the client, up to :data:`~ambit.waypoint.retries.REPLAY_LIMIT`
   (64 KiB): a retry replays the buffer, then reads on. Past the bound the buffer is dropped at once and the body
   streams on; the retry machine then retries nothing more. The buffer never holds more than the bound.
2. A try's head carries ``x-envoy-attempt-count`` (1, 2, ...) when the plan asks (Envoy's
   ``include_request_attempt_count``); for a route with a timeout, ``x-envoy-expected-rq-timeout-ms``, the time
   left counted from the end of the client's request as Envoy's router counts it
   (:mod:`ambit.waypoint.envoy_request_headers` rule 4), and for gRPC ``grpc-timeout`` of the same time (istiod's
   ``max_grpc_timeout``). Each replaces any value the client sent; the rest of the head is the plan's, unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ambit.model.envoyfilter import HeaderOp
from ambit.model.locality_lb import LocalityChoice
from ambit.model.routes import HeaderModifier, RetryPolicy, Timeouts
from ambit.model.workload import Service, Workload
from ambit.waypoint import retries
from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.destinations import PLAIN, Transport
from ambit.waypoint.envoy_request_headers import expected_timeout
from ambit.waypoint.grpc_timeout import GRPC_TIMEOUT, format_grpc_timeout
from ambit.waypoint.http1 import Headers

__all__ = ["ATTEMPT_COUNT", "Plan", "ReplayBuffer", "try_request"]

ATTEMPT_COUNT = "x-envoy-attempt-count"


@dataclass(frozen=True, slots=True)
class Plan:
    """What goes upstream: the (rewritten) request, the response header changes, timeouts and retry policy, and
    the Service whose endpoints a retry may pick from (None: the one endpoint the request was addressed to)."""

    request: RequestHead
    response_headers: HeaderModifier | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    service: Service | None = None
    port: int = 0
    members: frozenset[str] | None = None
    """A DestinationRule subset's workload uids: a retry picks among those only."""
    locality: LocalityChoice | None = None
    """The rule's ``localityLbSetting``, which a retry's pick applies too."""
    choose: Callable[[Sequence[Workload]], Workload] | None = None
    """The rule's load balancer; None: the context's default choice."""
    transport: Transport = PLAIN
    report: Callable[[str, bool], None] | None = None
    """Told each try's result (workload uid, whether it was not a 5xx or a connect failure): outlier detection."""
    response_ops: tuple[HeaderOp, ...] = ()
    """EnvoyFilter edits of the response, after ``response_headers`` (:mod:`ambit.waypoint.envoy_patches`)."""
    attempt_count: bool = False
    """Each try's request says which try it is in ``x-envoy-attempt-count`` (1, 2, ...; the client's value
    replaced): Envoy's ``include_request_attempt_count``, which istiod sets on a gateway's virtual hosts and not on a
    waypoint's."""
    grpc: bool = False
    """A gRPC request: each try's ``grpc-timeout`` says the time that try has (:mod:`ambit.waypoint.grpc_timeout`
    rule 5; ``timeouts`` already hold its deadline)."""


@dataclass(slots=True)
class ReplayBuffer:
    """The client's request body as read so far, kept for replay while it fits (rule 1): it never holds more
    than :data:`~ambit.waypoint.retries.REPLAY_LIMIT` bytes."""

    chunks: list[bytes] = field(default_factory=list)
    total: int = 0
    ended: bool = False
    trailers: Headers = ()
    replayable: bool = True

    def add(self, data: bytes) -> None:
        self.total += len(data)
        if self.total > retries.REPLAY_LIMIT:
            self.release()
        elif self.replayable:
            self.chunks.append(data)

    def release(self) -> None:
        self.replayable = False
        self.chunks.clear()


def try_request(plan: Plan, attempt: int, elapsed: Callable[[], float]) -> RequestHead:
    """Rule 2: the request as try ``attempt`` sends it. ``elapsed`` says how long ago the client's request ended
    (0 while it has not); it is asked only for a route with a timeout."""
    request, timeouts = plan.request, plan.timeouts
    added: list[tuple[str, str]] = []
    if plan.attempt_count:
        added.append((ATTEMPT_COUNT, str(attempt)))
    if timeouts.request is not None or timeouts.backend_request is not None:
        expected = expected_timeout(timeouts.request, timeouts.backend_request, elapsed())
        if expected is not None:
            added.append(expected)
            if plan.grpc:
                added.append((GRPC_TIMEOUT, format_grpc_timeout(int(expected[1]))))
    if not added:
        return request
    names = {name for name, _ in added}
    return dataclasses.replace(request, headers=(*(f for f in request.headers if f[0] not in names), *added))
