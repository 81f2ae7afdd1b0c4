"""The topology page's web server (``ambit dashboard``): one page and a read-only JSON API over the proxies' flows.

Theory of operation
-------------------
Sources feed a :class:`DashboardState`: :class:`AdminSource` polls one proxy's admin port (``GET /flows?after=N``
with a cursor, ``GET /config_dump`` every few polls); ``ambit dashboard`` adds the lab's sources (children that read
the node proxies from their network namespaces). The state keeps the flows in a bounded
:class:`~ambit.telemetry.topology.FlowStore` and each source's inventory; the pure model
(:mod:`ambit.telemetry.topology`) turns them into a graph on each request.

The API (all ``GET``, all JSON):

- ``/api/graph[?window=SECONDS]``: nodes and edges of the last ``window`` seconds (1 to 3600, default 300), each
  edge with its rates (``rate``: requests, bytes and connections per second, 5xx ratio, mTLS) over the last
  ``rateWindow`` seconds (the window, at most :data:`RATE_WINDOW`) from the proxies' metrics, which a
  :class:`~ambit.observe.scraper.MetricsScraper` reads into the state's rate book (``null``: no metrics name it);
- ``/api/edge?src=ID&dst=ID[&window=SECONDS]``: that edge's recent flows, newest first, with their verdicts;
- ``/api/explain?src=NS/POD&dst=NS/NAME&port=N``: ``ambit policy explain``'s verdict, when the server was given an
  explainer (a kubeconfig); 404 otherwise;
- ``/api/sources``: each source and its last error.

Security: the server binds 127.0.0.1 unless told otherwise, changes nothing (GET only), and answers 400 with one
line for any malformed parameter. It answers only requests whose ``Host`` header names the address it serves (or
``localhost``): a web page the operator visits cannot read the mesh's topology through DNS rebinding. The page is
served with a Content-Security-Policy that allows only its own script and style (no inline script), and it sets
every text it shows with ``textContent``, never as markup.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import aiohttp
from aiohttp import web

from ambit.httpfetch import HttpFetchError, fetch_body
from ambit.observe.admin_client import config_dump_url
from ambit.telemetry.connection_limits import ADMIN_LIMITS
from ambit.telemetry.flows import MAX_PAGE, MAX_PAGE_BYTES, Flow, FlowError, read_page
from ambit.telemetry.limited_site import LimitedSite
from ambit.telemetry.rates import RateBook
from ambit.telemetry.topology import (
    DEFAULT_WINDOW,
    FlowStore,
    Inventory,
    TopologyError,
    build_graph,
    edge_flows,
    flows_to_json,
    graph_to_json,
    read_inventory,
)

MAX_DUMP_BYTES = 32 * 1024 * 1024
RATE_WINDOW = 60.0
"""Seconds the edges' rates are taken over (at most the page's window), as Kiali's default ``rate(...[1m])``."""
MAX_WINDOW = 3600
MAX_ID = 2100
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_ID_KINDS = ("wl:", "svc:", "ip:")
STATIC_FILES = {
    "/": ("index.html", "text/html"),
    "/app.js": ("app.js", "application/javascript"),
    "/app.css": ("app.css", "text/css"),
    "/favicon.svg": ("favicon.svg", "image/svg+xml"),
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

Explainer = Callable[[str, str, int], Awaitable[dict[str, Any]]]
"""``(source pod, destination, port)`` → ``ambit policy explain``'s JSON; raises ValueError for an unknown name."""


class BadQuery(ValueError):
    """A query parameter the API refuses (400)."""


@dataclass(slots=True)
class SourceStatus:
    name: str
    flows: int = 0
    error: str = ""
    last_ok: float = 0.0


@dataclass(slots=True)
class DashboardState:
    """What the sources have seen: flows, and each source's inventory."""

    store: FlowStore = field(default_factory=FlowStore)
    rates: RateBook = field(default_factory=RateBook)
    inventories: dict[str, Inventory] = field(default_factory=dict)
    sources: dict[str, SourceStatus] = field(default_factory=dict)
    clock: Callable[[], float] = time.time

    def status(self, name: str) -> SourceStatus:
        return self.sources.setdefault(name, SourceStatus(name))

    def add_flows(self, name: str, flows: tuple[Flow, ...] | list[Flow]) -> None:
        self.store.add(flows)
        self.status(name).flows += len(flows)

    def inventory(self) -> Inventory:
        merged = Inventory()
        for name in sorted(self.inventories):
            merged = merged.merge(self.inventories[name])
        return merged


class AdminSource:
    """Polls one proxy's admin port: its new flows every ``interval``, its config dump every ``dump_every`` polls."""

    def __init__(self, admin_url: str, name: str, *, interval: float = 1.0, within: float = 10.0) -> None:
        self.flows_base = config_dump_url(admin_url).removesuffix("/config_dump")  # checks the URL
        self.admin_url = admin_url
        self.name = name
        self.interval = interval
        self.within = within
        self.dump_every = 5

    async def run(self, state: DashboardState) -> None:
        after, polls = 0, 0
        status = state.status(self.name)
        async with aiohttp.ClientSession(trust_env=False) as session:
            while True:
                try:
                    if polls % self.dump_every == 0:
                        body = await fetch_body(
                            session, f"{self.flows_base}/config_dump", within=self.within, max_bytes=MAX_DUMP_BYTES
                        )
                        state.inventories[self.name] = read_inventory(_json_object(body))
                    polls += 1
                    while True:
                        url = f"{self.flows_base}/flows?after={after}&limit={MAX_PAGE}"
                        page = read_page(
                            await fetch_body(session, url, within=self.within, max_bytes=MAX_PAGE_BYTES), self.name
                        )
                        state.add_flows(self.name, page.flows)
                        after = page.next
                        if len(page.flows) < MAX_PAGE:
                            break
                    status.error, status.last_ok = "", state.clock()
                except (HttpFetchError, FlowError, TopologyError) as exc:
                    status.error = str(exc)[:500]
                await asyncio.sleep(self.interval)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise TopologyError(f"config_dump is not JSON: {str(exc)[:200]}") from None
    if not isinstance(value, dict):
        raise TopologyError("config_dump is not an object")
    return value


# --- query parameters --------------------------------------------------------------------------------------------


def parse_window(query: dict[str, str] | Any) -> float:
    text = query.get("window", "")
    if not text:
        return DEFAULT_WINDOW
    if not (text.isascii() and text.isdigit() and len(text) <= 6 and 1 <= int(text) <= MAX_WINDOW):
        raise BadQuery(f"window must be whole seconds from 1 to {MAX_WINDOW}")
    return float(text)


def parse_node_id(query: dict[str, str] | Any, name: str) -> str:
    text = query.get(name, "")
    if not text:
        raise BadQuery(f"{name} is required")
    if len(text) > MAX_ID or not text.startswith(_ID_KINDS) or not text.isprintable():
        raise BadQuery(f"{name} must be a node id (wl:NAMESPACE/NAME, svc:HOST or ip:ADDRESS)")
    return str(text)


def parse_ref(query: dict[str, str] | Any, name: str) -> str:
    """``NAMESPACE/NAME`` with Kubernetes names on both sides."""
    text = query.get(name, "")
    namespace, slash, rest = text.partition("/")
    if not (slash and _NAME.fullmatch(namespace) and _NAME.fullmatch(rest) and len(namespace) <= 63):
        raise BadQuery(f"{name} must be NAMESPACE/NAME (Kubernetes names)")
    return str(text)


def parse_port(query: dict[str, str] | Any) -> int:
    text = query.get("port", "")
    if not (text.isascii() and text.isdigit() and len(text) <= 5 and 1 <= int(text) <= 65535):
        raise BadQuery("port must be 1 to 65535")
    return int(text)


# --- the web app ---------------------------------------------------------------------------------------------------


def allowed_hosts(host: str, port: int) -> set[str] | None:
    """The ``Host`` header values a server bound to ``host:port`` answers; None: any (bound to every address)."""
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).is_unspecified:
            return None
    shown = f"[{host}]" if ":" in host else host
    return {f"{name}:{port}" for name in (shown, "localhost", "127.0.0.1", "[::1]")}


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(value, separators=(",", ":")), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


class DashboardApp:
    """The aiohttp application over a :class:`DashboardState`."""

    def __init__(self, state: DashboardState, *, explainer: Explainer | None = None) -> None:
        self.state = state
        self.explainer = explainer
        self.hosts: set[str] | None = set()
        self._explain_lock = asyncio.Lock()
        files = resources.files("ambit.observe").joinpath("dashboard_static")
        self._static = {path: (files.joinpath(name).read_bytes(), kind) for path, (name, kind) in STATIC_FILES.items()}

    def build(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=4096)
        for path in STATIC_FILES:
            app.router.add_get(path, self._static_file, allow_head=False)
        app.router.add_get("/api/graph", self._graph, allow_head=False)
        app.router.add_get("/api/edge", self._edge, allow_head=False)
        app.router.add_get("/api/explain", self._explain, allow_head=False)
        app.router.add_get("/api/sources", self._sources, allow_head=False)
        return app

    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self.hosts is not None and request.host not in self.hosts:
            response: web.StreamResponse = web.Response(status=421, text="misdirected: unknown Host\n")
        else:
            try:
                response = await handler(request)
            except BadQuery as exc:
                response = _error(400, str(exc))
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-store"
        return response

    async def _static_file(self, request: web.Request) -> web.Response:
        body, kind = self._static[request.path]
        return web.Response(body=body, content_type=kind, charset="utf-8" if kind != "image/svg+xml" else None)

    async def _graph(self, request: web.Request) -> web.Response:
        window = parse_window(request.query)
        now = self.state.clock()
        rate_window = min(window, RATE_WINDOW)
        rates = self.state.rates.rates(now, rate_window)
        flows = self.state.store.recent(now, window)
        graph = build_graph(flows, self.state.inventory(), now=now, window=window, rates=rates)
        return _json(graph_to_json(graph) | {"explain": self.explainer is not None, "rateWindow": rate_window})

    async def _edge(self, request: web.Request) -> web.Response:
        src, dst = parse_node_id(request.query, "src"), parse_node_id(request.query, "dst")
        window = parse_window(request.query)
        now = self.state.clock()
        flows = edge_flows(self.state.store.recent(now, window), src, dst, now=now, window=window)
        return _json({"src": src, "dst": dst, "flows": flows_to_json(flows)})

    async def _explain(self, request: web.Request) -> web.Response:
        src, dst = parse_ref(request.query, "src"), parse_ref(request.query, "dst")
        port = parse_port(request.query)
        if self.explainer is None:
            return _error(404, "policy explain is not available: start ambit dashboard with --kubeconfig")
        async with self._explain_lock:  # one at a time: each reads the API server's objects
            try:
                return _json(await self.explainer(src, dst, port))
            except ValueError as exc:
                return _error(422, str(exc)[:500])

    async def _sources(self, request: web.Request) -> web.Response:
        return _json(
            [
                {"name": s.name, "flows": s.flows, "error": s.error, "lastOk": s.last_ok}
                for s in sorted(self.state.sources.values(), key=lambda s: s.name)
            ]
        )


async def serve(app: DashboardApp, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving on ``host:port`` (0: the kernel picks); the runner (to clean up) and the port."""
    runner = web.AppRunner(app.build(), access_log=None)
    await runner.setup()
    # An operator's page: a few browser tabs. The admin ports' limits bound what a local client that opens
    # connections and never reads can pin (each is closed after 30 s; the page's next poll reopens one).
    site = LimitedSite(runner, host, port, ADMIN_LIMITS)
    await site.start()
    server = site._server
    assert server is not None
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    app.hosts = allowed_hosts(host, bound)
    return runner, bound


__all__ = [
    "AdminSource",
    "BadQuery",
    "DashboardApp",
    "DashboardState",
    "Explainer",
    "allowed_hosts",
    "parse_node_id",
    "parse_port",
    "parse_ref",
    "parse_window",
    "serve",
]
