"""The headers Envoy's HTTP connection manager puts on every response it sends, as Istio configures it.

Rules (Envoy's connection manager, with the settings istiod gives waypoints and gateways: ``server_name``
``istio-envoy``, ``server_header_transformation`` OVERWRITE; the router's debug headers not suppressed, the mesh's
default ``proxyHeaders``):

1. ``server`` is ours on every response, forwarded or local: whatever the endpoint said is replaced by
   ``istio-envoy``. It is set last, after the route's header changes and EnvoyFilter edits (the connection manager
   writes it as it encodes the head), so neither can change it.
2. ``date`` is added when the response has none (an endpoint's own is kept): the time now, in IMF-fixdate.
3. A forwarded response gets ``x-envoy-upstream-service-time``: the whole milliseconds from the end of the client's
   request to the endpoint's response head, when the request had ended before the head came (the router's rule;
   a response that races a request still streaming up has none). It is set before the route's header changes, so
   a route may remove it.
4. A local 503 for a connection pool's overflow says ``x-envoy-overloaded: true`` (the router's circuit breaker).

All pure: the caller gives the time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from email.utils import formatdate

SERVER_NAME = "istio-envoy"
UPSTREAM_SERVICE_TIME = "x-envoy-upstream-service-time"
OVERLOADED = ("x-envoy-overloaded", "true")

_date_cache: tuple[int, str] = (-1, "")


def http_date(now: float) -> str:
    """``now`` (seconds since the epoch) in IMF-fixdate, as HTTP's ``date`` header writes it; one string per second
    is made, not one per response."""
    global _date_cache
    second = int(now)
    if _date_cache[0] != second:
        _date_cache = (second, formatdate(second, usegmt=True))
    return _date_cache[1]


def finalized(headers: Iterable[tuple[str, str]], now: float | None = None) -> list[tuple[str, str]]:
    """Rules 1 and 2: ``headers`` (lower-case names) with our ``server`` and, when absent, a ``date``."""
    fields = [(n, v) for n, v in headers if n != "server"]
    if not any(n == "date" for n, _ in fields):
        fields.append(("date", http_date(time.time() if now is None else now)))
    fields.append(("server", SERVER_NAME))
    return fields


def service_time(request_ended_at: float | None, head_at: float) -> tuple[str, str] | None:
    """Rule 3: the header for a response head that came at ``head_at``, both on one monotonic clock."""
    if request_ended_at is None:
        return None
    return (UPSTREAM_SERVICE_TIME, str(max(0, int((head_at - request_ended_at) * 1000))))
