"""The node proxy's HTTP endpoints: admin (15000, localhost), stats (15020) and readiness (15021).

Theory of operation
-------------------
Three route tables, each served by its own :class:`~ambit.telemetry.http_server.HttpServer` (h11 on asyncio: the
node proxy imports no aiohttp) so each binds its own address; ``start()`` binds them in order (admin, stats,
readiness) and ``aclose()`` closes all. A bind failure (port taken, address not local) closes whatever was already
started and raises :class:`~ambit.telemetry.TelemetryError` naming the server and the address. There is no access
log: these are scraped every few seconds. Each server limits its connections (in total, per peer address, and in
lifetime: :mod:`ambit.telemetry.connection_limits`), its request heads and bodies, and how many pipelined requests
it answers at once (:mod:`ambit.telemetry.http_server`), so neither idle, slow, flooding nor non-reading clients can
exhaust the proxy.

Routes (anything else is 404; a known path with another method is 405)::

    admin      GET  /              plain-text index of these endpoints
               GET  /config_dump   JSON (indent 2) of config_dump()
               GET  /flows?after=N&limit=M   the flows after sequence N (ambit.telemetry.flows), when given a ring
               POST /quitquitquit  200 "OK\\n", then quit()
               GET  /logging       the current levels, one "logger: level" line each
               POST /logging?level=SPEC   SPEC is "debug" (the "ambit" logger) or "access:debug,ambit.proxy:info"
    stats      GET  /metrics, /stats/prometheus    ProxyMetrics.render()
    readiness  GET  /healthz/ready 200 "ready\\n", or 500 "not ready, pending: a, b"

``GET /flows`` answers 404 when the owner keeps no flow ring, 400 for a malformed ``after``/``limit``; a page is
at most 1,000 flows, built from the ring in O(limit).

The mutating admin requests (``POST /quitquitquit``, ``POST /logging``) need ``Authorization: Bearer <token>``,
the admin token the owner passes in (the node proxy writes it to a file only root reads, see
:func:`write_admin_token`): the admin port is on the host's loopback, which every host-network pod reaches. No
credential is 401 (with ``WWW-Authenticate: Bearer``), a wrong one 403; the token is compared in constant time. The
GETs stay open: they read, and the stats and readiness ports are scraped without credentials anyway.

The handlers only read the pure objects they were given (:class:`ProxyMetrics`, :class:`Readiness`) and call the
two callbacks; :func:`parse_log_levels` is pure and raises :class:`~ambit.telemetry.BadLogLevelError`.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import re
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ambit.telemetry import BadLogLevelError, TelemetryError
from ambit.telemetry.connection_limits import ADMIN_LIMITS, PUBLIC_LIMITS
from ambit.telemetry.flows import FlowError, FlowRing, page_json, parse_query
from ambit.telemetry.http_server import JSON, HttpServer, Request, Response
from ambit.telemetry.metrics import ProxyMetrics
from ambit.telemetry.readiness import Readiness

log = logging.getLogger("ambit.telemetry.endpoints")

ROOT_LOGGER = "ambit"
ACCESS_LOGGER = "access"
_OFF = logging.CRITICAL + 10
_LEVELS: dict[str, int] = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "off": _OFF,
}
_LEVEL_NAMES = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning", logging.ERROR: "error"}
_LEVEL_NAMES |= {logging.CRITICAL: "critical", _OFF: "off"}
_LOGGER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z_][A-Za-z0-9_\-]*)*")

INDEX = """\
ambit node proxy admin
  GET  /config_dump         proxy state and configuration (JSON)
  GET  /flows?after=N       the connections ended since flow N (JSON; `ambit flows`)
  GET  /logging             current log levels
  POST /logging?level=L     set levels: "debug", or "access:debug,ambit.proxy:info"
  POST /quitquitquit        graceful shutdown
  (POSTs need "Authorization: Bearer <admin token>")
metrics:   GET /metrics, GET /stats/prometheus (stats port)
readiness: GET /healthz/ready (readiness port)
"""


def parse_log_levels(spec: str) -> dict[str, int]:
    """``"debug"`` or ``"access:debug,ambit.proxy:info"`` → ``{logger name: logging level}``.

    A bare level applies to the ``ambit`` logger. Raises :class:`BadLogLevelError` with one line on bad input.
    """
    if not spec.strip():
        raise BadLogLevelError("bad log level: empty; expected e.g. 'debug' or 'access:debug,ambit:info'")
    out: dict[str, int] = {}
    for item in spec.split(","):
        name, sep, level = item.strip().rpartition(":")
        if not sep:
            name = ROOT_LOGGER
        if not _LOGGER_NAME.fullmatch(name):
            raise BadLogLevelError(f"bad log level {item.strip()!r}: {name!r} is not a logger name")
        value = _LEVELS.get(level.strip().lower())
        if value is None:
            raise BadLogLevelError(f"bad log level {item.strip()!r}: expected one of {', '.join(_LEVELS)}")
        out[name] = value
    return out


def new_admin_token() -> str:
    """A fresh admin token: 256 random bits, URL-safe text."""
    return secrets.token_urlsafe(32)


def write_admin_token(path: Path, token: str) -> None:
    """Write ``token`` to ``path`` readable by its owner only (0600 whatever the umask), replacing any old file.

    Written under a temporary name and renamed, so that nobody ever reads a half-written or more open file.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, token.encode("ascii") + b"\n")
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_admin_token(path: Path) -> str:
    """The token :func:`write_admin_token` wrote (for the CLI and tests)."""
    return path.read_text(encoding="ascii").strip()


def _level_name(level: int) -> str:
    return _LEVEL_NAMES.get(level, logging.getLevelName(level).lower())


class ProxyEndpoints:
    """The admin, stats and readiness servers; ``start()`` then ``aclose()``."""

    def __init__(
        self,
        *,
        metrics: ProxyMetrics,
        readiness: Readiness,
        config_dump: Callable[[], Mapping[str, Any]],
        quit: Callable[[], None],
        admin_token: str,
        admin_address: tuple[str, int] = ("127.0.0.1", 15000),
        stats_address: tuple[str, int] = ("0.0.0.0", 15020),
        readiness_address: tuple[str, int] = ("0.0.0.0", 15021),
        flows: FlowRing | None = None,
        reuse_port: bool = False,
        ipv6: bool = False,
    ) -> None:
        self._metrics = metrics
        self._ipv6 = ipv6
        """Also serve stats and readiness on ``[::]`` when their address is ``0.0.0.0`` (never the admin server)."""
        self._reuse_port = reuse_port
        """Bind with SO_REUSEPORT (a node proxy's successor binds beside it during a hand-over)."""
        self._flows = flows
        self._readiness = readiness
        self._config_dump = config_dump
        self._quit = quit
        if len(admin_token) < 16:
            raise TelemetryError("the admin token must be at least 16 characters")
        self._admin_authorization = f"Bearer {admin_token}".encode()
        self._loggers: list[str] = [ROOT_LOGGER, ACCESS_LOGGER]  # shown by GET /logging, plus any set there

        admin = {
            "/": {"GET": self._index},
            "/config_dump": {"GET": self._config_dump_handler},
            "/flows": {"GET": self._flows_handler},
            "/quitquitquit": {"POST": self._quitquitquit},
            "/logging": {"GET": self._get_logging, "POST": self._set_logging},
        }
        stats = {"/metrics": {"GET": self._render_metrics}, "/stats/prometheus": {"GET": self._render_metrics}}
        ready = {"/healthz/ready": {"GET": self._healthz_ready}}
        self._servers: list[tuple[str, tuple[str, int], HttpServer]] = [
            ("admin", admin_address, HttpServer(admin, ADMIN_LIMITS)),
            ("stats", stats_address, HttpServer(stats, PUBLIC_LIMITS)),
            ("readiness", readiness_address, HttpServer(ready, PUBLIC_LIMITS)),
        ]
        self._started: list[HttpServer] = []

    async def start(self) -> None:
        """Bind all three servers; on failure close those already bound and raise :class:`TelemetryError`."""
        for name, (host, port), server in self._servers:
            try:
                await server.start(host, port, reuse_port=self._reuse_port, ipv6=self._ipv6 and name != "admin")
            except OSError as exc:
                await self.aclose()
                reason = exc.strerror or str(exc)
                raise TelemetryError(f"cannot start the {name} server on {host}:{port}: {reason}") from None
            self._started.append(server)

    async def aclose(self) -> None:
        started, self._started = self._started, []
        for server in started:
            await server.aclose()

    @property
    def ports(self) -> dict[str, int]:
        """The bound port of each started server, by name ("admin", "stats", "readiness")."""
        out: dict[str, int] = {}
        for name, _address, server in self._servers:
            if server in self._started and (port := server.port) is not None:
                out[name] = port
        return out

    @property
    def servers(self) -> dict[str, HttpServer]:
        """Each server by name (its gate counts the open and refused connections)."""
        return {name: server for name, _address, server in self._servers}

    # --- admin -----------------------------------------------------------------------------------------------

    def _index(self, request: Request) -> Response:
        return Response.text(INDEX)

    def _config_dump_handler(self, request: Request) -> Response:
        try:
            body = json.dumps(self._config_dump(), indent=2, default=str)
        except Exception as exc:  # one broken dump must not be a traceback to the caller
            log.exception("config_dump failed")
            return Response.text(f"config_dump failed: {type(exc).__name__}: {exc}\n", 500)
        return Response(body=(body + "\n").encode(), content_type=JSON)

    def _flows_handler(self, request: Request) -> Response:
        if self._flows is None:
            return Response.text("this proxy keeps no flow log\n", 404)
        try:
            after, limit = parse_query(request.query)
        except FlowError as exc:
            return Response.text(f"{exc}\n", 400)
        return Response(body=page_json(self._flows.page(after, limit)).encode(), content_type=JSON)

    def _refused(self, request: Request) -> Response | None:
        """401 without a credential, 403 with a wrong one, None with the admin token."""
        given = request.headers.get("authorization")
        if given is None:
            return Response.text("admin token required\n", 401, (("WWW-Authenticate", "Bearer"),))
        if not hmac.compare_digest(given.encode("utf-8", "replace"), self._admin_authorization):
            log.warning("refused a %s %r with a wrong admin token from %s", request.method, request.path, request.peer)
            return Response.text("wrong admin token\n", 403)
        return None

    def _quitquitquit(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused

        def stop() -> None:  # the caller has its answer before shutdown starts
            log.info("shutdown requested via /quitquitquit")
            self._quit()

        return Response(body=b"OK\n", then=stop)

    def _get_logging(self, request: Request) -> Response:
        lines = [f"{name}: {_level_name(logging.getLogger(name).getEffectiveLevel())}" for name in self._loggers]
        return Response.text("\n".join(lines) + "\n")

    def _set_logging(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        try:
            levels = parse_log_levels(request.query.get("level", ""))
        except BadLogLevelError as exc:
            return Response.text(f"{exc}\n", 400)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
            if name not in self._loggers:
                self._loggers.append(name)
        log.info("log levels set: %s", ", ".join(f"{n}={_level_name(v)}" for n, v in levels.items()))
        return self._get_logging(request)

    # --- stats and readiness ---------------------------------------------------------------------------------

    def _render_metrics(self, request: Request) -> Response:
        return Response(body=self._metrics.render(), content_type=self._metrics.content_type)

    def _healthz_ready(self, request: Request) -> Response:
        if self._readiness.ready:
            return Response.text("ready\n")
        return Response.text(f"not ready, pending: {', '.join(self._readiness.pending())}", 500)
