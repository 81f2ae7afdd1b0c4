"""A gRPC request's deadline at the waypoint and gateway, as Envoy's router takes it with istiod's routes. Pure.

istiod gives every route ``max_grpc_timeout`` (``setTimeout`` in pilot/pkg/networking/core/route/route.go): the
route's timeout, or 0 when the route has none. With it set, Envoy's router (``FilterUtility::finalTimeout`` in
source/common/router/router.cc) bounds a gRPC request by the deadline its client sent in ``grpc-timeout`` rather
than by the route's timeout, and ``FilterUtility::setTimeoutHeaders`` tells the endpoint that deadline again.

Rules:

1. A request is gRPC when its ``content-type`` is ``application/grpc`` exactly or begins ``application/grpc+``
   (``Grpc::Common::hasGrpcContentType``; ``application/grpc-web`` is not gRPC). Other requests keep the route's
   timeouts as they are.
2. ``grpc-timeout`` is read as ``Grpc::Common::getGrpcTimeout`` reads it: a value then one unit letter, ``H`` ``M``
   ``S`` ``m`` ``u`` ``n`` (hours down to nanoseconds; micro- and nanoseconds are rounded up to whole
   milliseconds). The value is what ``absl::SimpleAtoi`` takes: blanks around it, a sign, decimal digits; it must
   come to 0 ... 99,999,999. Anything else (empty, no unit, an unknown unit, too large, ``1.5S``) is as if no
   header had been sent. The first ``grpc-timeout`` field counts.
3. The request's deadline is the header's (absent, malformed or 0: none), capped by ``max_grpc_timeout`` (the
   route's timeout; 0 caps nothing): a header longer than the route's timeout, or none, gets the route's. A route
   without a timeout therefore leaves a gRPC request the deadline its client chose, or none.
   ``grpc_timeout_header_offset`` is unset in istiod's routes: nothing is taken off.
4. The per-try timeout stays the route's (``retries.perTryTimeout``); one not shorter than the deadline is no
   per-try timeout (the router's rule, applied by :mod:`ambit.waypoint.envoy_request_headers` rule 4 and
   :mod:`ambit.waypoint.retries`).
5. Each try of a gRPC request with a deadline or a per-try timeout carries ``grpc-timeout`` rewritten to the time
   the try has (the value ``x-envoy-expected-rq-timeout-ms`` carries: the per-try timeout, or what is left of the
   deadline), written as ``Grpc::Common::toGrpcTimeout`` writes it: milliseconds while they fit in 8 digits, then
   seconds, minutes, hours (clipped at 99,999,999 hours). With neither, the client's header goes on unchanged.
6. A gRPC request whose deadline passes gets the router's 504 ``upstream request timeout``, which the connection
   manager converts for gRPC as it converts every local answer (``grpc-status`` 14 UNAVAILABLE,
   ``Grpc::Utility::httpToGrpcStatus``; :mod:`ambit.waypoint.http2_proxy`): Envoy sends no DEADLINE_EXCEEDED.
"""

from __future__ import annotations

from collections.abc import Iterable

from ambit.model.routes import Timeouts

__all__ = ["GRPC_TIMEOUT", "MAX_VALUE", "format_grpc_timeout", "grpc_timeouts", "is_grpc", "parse_grpc_timeout"]

GRPC_TIMEOUT = "grpc-timeout"
MAX_VALUE = 99_999_999
"""The largest value of a ``grpc-timeout`` (8 digits, gRPC's HTTP/2 protocol; Envoy's ``MAX_GRPC_TIMEOUT_VALUE``)."""

_GRPC = "application/grpc"
_BLANKS = " \t\n\v\f\r"
"""What ``absl::SimpleAtoi`` strips around a number (``absl::ascii_isspace``)."""
_MILLIS_PER_UNIT = {"H": 3_600_000, "M": 60_000, "S": 1_000, "m": 1}
_SUB_MILLI = {"u": 1_000, "n": 1_000_000}
"""Units finer than a millisecond, by how many make one; a remainder rounds up (rule 2)."""
_LARGER_UNITS = (("S", 1000), ("M", 60), ("H", 60))


def is_grpc(content_type: str | None) -> bool:
    """Rule 1."""
    if content_type is None or not content_type.startswith(_GRPC):
        return False
    return len(content_type) == len(_GRPC) or content_type[len(_GRPC)] == "+"


def parse_grpc_timeout(value: str) -> int | None:
    """Rule 2: the header's deadline in milliseconds (0 is a deadline of none), or None when it does not read."""
    if len(value) < 2:
        return None
    number, unit = value[:-1].strip(_BLANKS), value[-1]
    if number[:1] in ("+", "-"):
        sign, number = number[0], number[1:]
    else:
        sign = "+"
    if not number or not (number.isascii() and number.isdigit()):
        return None
    digits = number.lstrip("0") or "0"  # bounded work whatever its length: only 8 digits can be in range
    if len(digits) > len(str(MAX_VALUE)):
        return None
    count = int(digits)
    if sign == "-" and count:
        return None  # negative
    if count > MAX_VALUE:
        return None
    if unit in _MILLIS_PER_UNIT:
        return count * _MILLIS_PER_UNIT[unit]
    if unit in _SUB_MILLI:
        return -(-count // _SUB_MILLI[unit])
    return None


def format_grpc_timeout(millis: int) -> str:
    """Rule 5: ``millis`` (> 0) as the rewritten header writes it."""
    amount, unit = millis, "m"
    for larger, factor in _LARGER_UNITS:
        if amount <= MAX_VALUE:
            break
        amount, unit = amount // factor, larger
    return f"{min(amount, MAX_VALUE)}{unit}"


def _millis(seconds: float | None) -> int:
    """A route's timeout in whole milliseconds, as istiod writes its duration; 0: none."""
    return 0 if seconds is None or seconds <= 0 else round(seconds * 1000)


def grpc_timeouts(route: Timeouts, headers: Iterable[tuple[str, str]]) -> Timeouts:
    """Rules 3 and 4: the timeouts of a gRPC request with these headers (lower-case names) under the route's."""
    sent = next((value for name, value in headers if name == GRPC_TIMEOUT), None)
    deadline = (parse_grpc_timeout(sent) if sent is not None else None) or 0
    cap = _millis(route.request)  # max_grpc_timeout: the route's timeout, 0 without one
    if cap and (deadline == 0 or deadline > cap):
        deadline = cap
    request = deadline / 1000 if deadline else None
    if request == route.request:
        return route
    return Timeouts(request=request, backend_request=route.backend_request)
