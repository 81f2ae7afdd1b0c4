"""Node-proxy telemetry: Istio's TCP metrics, the access log, readiness, and the admin/stats/readiness servers.

Modules (all but :mod:`endpoints` are pure: no sockets, no event loop)::

    metrics     ProxyMetrics: istio_tcp_* counters and friends in a private registry, rendered as Prometheus text
    accesslog   ConnectionRecord -> one "connection complete" line (text or JSON), written to the "access" logger
    readiness   Readiness: the set of start-up tasks still pending (ready when it is empty)
    endpoints   ProxyEndpoints: aiohttp servers on 15000 (admin), 15020 (metrics) and 15021 (readiness)

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
