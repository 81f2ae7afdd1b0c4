"""The ``x-envoy-*`` request headers: those a client may not send through, and the one the router adds. Pure.

Envoy acts on some ``x-envoy-*`` request headers (a retry policy, a timeout, a forced trace) and believes others
(``x-envoy-internal``), so its HTTP connection manager removes them from a request that does not come from inside
(``ConnectionManagerUtility::mutateRequestHeaders`` and ``cleanInternalHeaders``, conn_manager_utility.cc). With
istiod's settings no request comes from inside: a waypoint's listener does not use the remote address (so its
trusted-address checks are off and every request is external), and a gateway's internal addresses are an empty set
(Envoy 1.33's default; istiod fills them only from ``meshNetworks`` behind ``ENABLE_HCM_INTERNAL_NETWORKS``, which
Ambit does not model).

Rules:

1. On arrival, before authentication, policies or routes see the request, these are removed: ``x-envoy-internal``
   and the router's controls (``x-envoy-retry-on``, ``-retry-grpc-on``, ``-retriable-status-codes``,
   ``-retriable-header-names``, ``-max-retries``, ``-upstream-rq-timeout-ms``, ``-upstream-rq-per-try-timeout-ms``,
   ``-upstream-rq-timeout-alt-response``, ``-expected-rq-timeout-ms``, ``-hedge-on-per-try-timeout``,
   ``-upstream-alt-stat-name``, ``-force-trace``, ``-ip-tags``, ``-original-url``). So a client cannot choose its
   own retries or timeout through the mesh, nor pass them to the backend's proxy.
2. At the gateway (the edge: ``use_remote_address``) also ``x-envoy-decorator-operation``,
   ``x-envoy-downstream-service-cluster`` and ``x-envoy-downstream-service-node``, and the client's
   ``x-request-id``: the edge gives every request a new id (istiod leaves ``preserve_external_request_id`` off).
   A waypoint keeps the id it is given, so one id follows a request from the client's proxy on.
3. A request with none of these is returned as it came (the same tuple): nothing is copied per request.
4. Each try of a request with a timeout carries ``x-envoy-expected-rq-timeout-ms`` (the router's, with its debug
   headers not suppressed: istiod's default), the client's value having been removed by rule 1. It is the per-try
   timeout (``timeouts.backend_request``), or the route's (``timeouts.request``) when there is no per-try timeout
   or it is not shorter; a per-try timeout alone is sent as it is. With a route timeout the value is at most what
   is left of it since the client's request ended (a retry sends less), and at least 1 once it ran out (0 would
   say "no limit"). Neither timeout: no header (``FilterUtility::setTimeoutHeaders``, router.cc).
"""

from __future__ import annotations

__all__ = ["EXPECTED_TIMEOUT", "REQUEST_ID", "expected_timeout", "without_internal_headers"]

REQUEST_ID = "x-request-id"
EXPECTED_TIMEOUT = "x-envoy-expected-rq-timeout-ms"

INTERNAL_ONLY = frozenset(
    {
        "x-envoy-internal",
        "x-envoy-retry-on",
        "x-envoy-retry-grpc-on",
        "x-envoy-retriable-status-codes",
        "x-envoy-retriable-header-names",
        "x-envoy-max-retries",
        "x-envoy-upstream-rq-timeout-ms",
        "x-envoy-upstream-rq-per-try-timeout-ms",
        "x-envoy-upstream-rq-timeout-alt-response",
        EXPECTED_TIMEOUT,
        "x-envoy-hedge-on-per-try-timeout",
        "x-envoy-upstream-alt-stat-name",
        "x-envoy-force-trace",
        "x-envoy-ip-tags",
        "x-envoy-original-url",
    }
)
"""Rule 1: what no request keeps (names lower-case, as both shells give them)."""

EDGE_ONLY = INTERNAL_ONLY | {
    "x-envoy-decorator-operation",
    "x-envoy-downstream-service-cluster",
    "x-envoy-downstream-service-node",
    REQUEST_ID,
}
"""Rule 2: what no request keeps at the gateway."""

Fields = tuple[tuple[str, str], ...]


def without_internal_headers(headers: Fields, *, edge: bool) -> Fields:
    """Rules 1-3: ``headers`` (lower-case names) as the connection manager lets them in."""
    removed = EDGE_ONLY if edge else INTERNAL_ONLY
    for name, _ in headers:
        if name in removed:
            return tuple(f for f in headers if f[0] not in removed)
    return headers


def _millis(seconds: float | None) -> int:
    """A timeout in whole milliseconds, as the route's duration; 0 (or none) is no limit."""
    return 0 if seconds is None or seconds <= 0 else round(seconds * 1000)


def expected_timeout(request: float | None, per_try: float | None, elapsed: float) -> tuple[str, str] | None:
    """Rule 4: the header for a try ``elapsed`` seconds after the client's request ended (0 while it has not),
    with the route's ``request`` and ``per_try`` timeouts in seconds (None: none); None when neither is set."""
    whole, each = _millis(request), _millis(per_try)
    if whole and each >= whole:
        each = 0
    expected = each or whole
    if not expected:
        return None
    if whole:
        spent = int(elapsed * 1000)
        expected = 1 if spent >= whole else min(expected, whole - spent)
    return (EXPECTED_TIMEOUT, str(expected))
