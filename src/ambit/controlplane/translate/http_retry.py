"""Istio's ``HTTPRetry`` (a VirtualService rule's ``retries``, the mesh config's ``defaultHttpRetryPolicy``) read into
an :class:`~ambit.model.routes.HttpRetry`, as istiod's ``retry.ConvertPolicy`` turns it into Envoy's retry policy.
Pure; bad content raises :class:`~ambit.controlplane.translate.virtualservice_values.BadField` naming the field.

Rules:

1. Absent (``None``): the caller's default: the mesh config's ``defaultHttpRetryPolicy`` for a route, Istio's
   own default (2 retries on a connection failure and 503) for the mesh config itself.
2. ``attempts`` 0 (or unset) disables retries (``ConvertPolicy``: ``attempts <= 0`` gives no policy); at most 100.
3. ``perTryTimeout`` bounds each try; ``backoff`` is the first wait between tries.
4. ``retryOn``: status codes, ``5xx``, ``gateway-error``, ``retriable-4xx``, ``connect-failure``/``refused-stream``/
   ``reset``/``reset-before-request``; ``5xx`` and ``gateway-error`` also retry a connection failure, as Envoy counts
   an upstream reset as a 5xx for both. gRPC conditions cannot be judged by status and are ignored; another word is
   an error. Unset: Istio's default conditions (a connection failure, 503).
5. ``retryRemoteLocalities`` and ``retryIgnorePreviousHosts`` choose among endpoints, which the waypoint's
   balancer does per try already; they are accepted and not applied.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ambit.controlplane.translate.virtualservice_values import (
    BadField,
    parse_duration,
    read_int,
    read_mapping,
    read_text,
)
from ambit.model.routes import HttpRetry, RetryPolicy

__all__ = ["MAX_ATTEMPTS", "read_http_retry"]

MAX_ATTEMPTS = 100
_CONNECT_FAILURES = frozenset(("connect-failure", "refused-stream", "reset", "reset-before-request"))
_GRPC_CONDITIONS = frozenset(("cancelled", "deadline-exceeded", "internal", "resource-exhausted", "unavailable"))


def read_http_retry(value: Any, field: str, default: HttpRetry) -> HttpRetry:
    """The ``HTTPRetry`` at ``field`` (rules 1-5); ``default`` when it is absent."""
    if value is None:
        return default
    spec = read_mapping(value, field)
    attempts = read_int(spec.get("attempts"), f"{field}.attempts") or 0
    if not 0 <= attempts <= MAX_ATTEMPTS:
        raise BadField(f"{field}.attempts", f"expected 0 to {MAX_ATTEMPTS}")
    per_try = parse_duration(spec["perTryTimeout"], f"{field}.perTryTimeout") if spec.get("perTryTimeout") else None
    backoff = parse_duration(spec["backoff"], f"{field}.backoff") if spec.get("backoff") else None
    base = RetryPolicy(attempts=attempts) if backoff is None else RetryPolicy(attempts=attempts, backoff=backoff)
    retry_on = read_text(spec.get("retryOn"), f"{field}.retryOn")
    if not retry_on:
        return HttpRetry(base, per_try or None)
    codes: set[int] = set()
    connect = False
    for condition in (c.strip() for c in retry_on.split(",") if c.strip()):
        if condition.isdigit():
            if not 100 <= int(condition) <= 599:
                raise BadField(f"{field}.retryOn", f"not an HTTP status: {condition[:8]}")
            codes.add(int(condition))
        elif condition == "5xx":
            codes.update(range(500, 600))
            connect = True
        elif condition == "gateway-error":  # Envoy counts an upstream reset as a 5xx for it too
            codes.update((502, 503, 504))
            connect = True
        elif condition == "retriable-4xx":
            codes.add(409)
        elif condition in _CONNECT_FAILURES:
            connect = True
        elif condition not in _GRPC_CONDITIONS and condition != "retriable-status-codes":
            raise BadField(f"{field}.retryOn", f"unknown retry condition {condition!r}")
    return HttpRetry(replace(base, codes=tuple(sorted(codes)), on_connect_failure=connect), per_try or None)
