"""Node-proxy telemetry: Istio's TCP metrics, the access log, readiness, and the admin/stats/readiness servers.

Modules (all but :mod:`endpoints`, :mod:`http_server` and :mod:`limited_site` are pure: no sockets, no event loop)::

    metrics     ProxyMetrics: istio_tcp_* counters and friends in a private registry, rendered as Prometheus text
    accesslog   ConnectionRecord -> one "connection complete" line (text or JSON), written to the "access" logger
    readiness   Readiness: the set of start-up tasks still pending (ready when it is empty)
    endpoints   ProxyEndpoints: h11 servers on 15000 (admin), 15020 (metrics) and 15021 (readiness)
    http_server HttpServer: a route table of synchronous handlers served over h11, with every bound of its ports
    connection_limits   ConnectionGate: connections in total, per peer address and in lifetime
    limited_site        LimitedSite: the same gate in front of an aiohttp server (dashboard, monitoring)

Errors::

    AmbitError
    └── TelemetryError          a telemetry server could not start (names the port), or other telemetry misuse
        └── BadLogLevelError    a /logging request named a level or logger we cannot set (the caller's fault)
"""

from __future__ import annotations

from ambit.errors import AmbitError


class TelemetryError(AmbitError):
    """A telemetry server could not start, or telemetry was misused."""


class BadLogLevelError(TelemetryError):
    """A ``/logging`` level specification we cannot apply (HTTP 400 to the caller)."""


__all__ = ["BadLogLevelError", "TelemetryError"]
