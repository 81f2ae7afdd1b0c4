"""The control plane's monitoring port (istiod's 15014, ``http-monitoring``): ``GET /metrics`` and ``GET /version``.

Theory of operation
-------------------
One aiohttp application behind :class:`~ambit.telemetry.limited_site.LimitedSite`, as the node proxy's stats
port: metrics are read without credentials by anyone on the pod network (istiod serves them the same way), so the
server only bounds what a client can cost it:

1. At most :data:`MONITORING_LIMITS` connections (in total and per peer address), each asked to close after its
   lifetime and aborted a grace period later (:mod:`ambit.telemetry.connection_limits`).
2. Request heads are small: a request line of at most 1 KiB, at most 32 header fields of at most 2 KiB each
   (aiohttp answers 400 beyond them, before any handler runs).
3. Only ``GET`` (no ``HEAD``): any other method on a known path is 405. A request with a body (a
   ``Content-Length`` other than 0, or ``Transfer-Encoding``) is 400 without the body being read; aiohttp's
   ``client_max_size`` is 0 as well.
4. Anything but the two paths is 404. ``/metrics`` renders the metrics now; ``/version`` is the package's version
   (istiod writes ``<version>-<git revision>-<build status>`` there; a Python package has only the first).

The handlers only read :class:`~ambit.controlplane.monitoring.metrics.ControlPlaneMetrics`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from ambit.controlplane.monitoring.metrics import ControlPlaneMetrics
from ambit.telemetry import TelemetryError, unparsed_requests
from ambit.telemetry.connection_limits import ConnectionLimits
from ambit.telemetry.limited_site import LimitedSite

log = logging.getLogger("ambit.controlplane.monitoring")

MONITORING_PORT = 15014
METRICS_PATH = "/metrics"
VERSION_PATH = "/version"
MONITORING_LIMITS = ConnectionLimits(total=32, per_address=8, lifetime=30.0)
"""Scrapers (Prometheus, an operator's curl) open one connection each every few seconds."""
MAX_LINE_SIZE = 1024
MAX_FIELD_SIZE = 2048
MAX_HEADERS = 32


@web.middleware
async def _no_body(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Refuse a request that carries a body, before anything reads it (rule 3)."""
    if request.headers.get("Transfer-Encoding") or request.content_length not in (None, 0):
        response = web.Response(status=400, text="a request to the monitoring port carries no body\n")
        response.force_close()  # the body is never read: the connection ends with the answer
        return response
    return await handler(request)


class MonitoringServer:
    """``/metrics`` and ``/version`` on ``host:port``; ``start()`` then ``aclose()``."""

    def __init__(
        self,
        metrics: ControlPlaneMetrics,
        *,
        host: str,
        port: int,
        version: str,
        limits: ConnectionLimits = MONITORING_LIMITS,
        reuse_port: bool = False,
    ) -> None:
        self._metrics = metrics
        self._version = version
        self._host, self._port = host, port
        self._limits, self._reuse_port = limits, reuse_port
        app = web.Application(client_max_size=0, middlewares=[_no_body], handler_args=_HANDLER_ARGS)
        app.router.add_get(METRICS_PATH, self._render_metrics, allow_head=False)
        app.router.add_get(VERSION_PATH, self._render_version, allow_head=False)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        self.site: LimitedSite | None = None
        self.port = 0
        """The bound port, after :meth:`start`."""

    async def start(self) -> None:
        """Bind; a failure raises :class:`~ambit.telemetry.TelemetryError` naming the address."""
        unparsed_requests.install()  # a malformed head is one log line, without its bytes
        await self._runner.setup()
        site = LimitedSite(self._runner, self._host, self._port, self._limits, reuse_port=self._reuse_port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            reason = exc.strerror or str(exc)
            raise TelemetryError(f"cannot start the monitoring server on {self._host}:{self._port}: {reason}") from None
        self.site = site
        self.port = int(self._runner.addresses[0][1])
        log.info("monitoring (/metrics, /version) on %s:%d", self._host, self.port)

    async def aclose(self) -> None:
        await self._runner.cleanup()

    async def _render_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self._metrics.render(), headers={"Content-Type": self._metrics.content_type})

    async def _render_version(self, request: web.Request) -> web.Response:
        return web.Response(text=self._version)


_HANDLER_ARGS = {
    "max_line_size": MAX_LINE_SIZE,
    "max_field_size": MAX_FIELD_SIZE,
    "max_headers": MAX_HEADERS,
    "keepalive_timeout": 15.0,
    "lingering_time": 0.0,
}
"""aiohttp's request-head limits (rule 2), how long an idle keep-alive connection is kept, and no lingering to
drain an unread body (rule 3: the connection closes instead)."""
