"""The ingress gateway's routing: which listener a connection or request belongs to, which virtual host serves a
request, and then the waypoint's own engine (:func:`ambit.waypoint.routing.route`) on that host's rules. Pure.

Theory of operation: :class:`IngressRouter` is built once per :class:`~ambit.model.ingress.GatewayConfig` (the
shell swaps it whole when a new one arrives, so a request sees one configuration) and precomputes, per port, the
listeners there and, per virtual host, a :class:`~ambit.model.routes.RouteTable` whose identity the engine's
compile cache keys on.

Rules:

1. A listener is picked among those on the connection's port by a name (the TLS server name for HTTPS, the
   request's host for HTTP): the listener whose hostname covers it most specifically
   (:func:`~ambit.model.ingress.host_matches`); with no name (or none covering it), a listener without hostname;
   else none. For HTTPS the pick is made once, at the handshake, and holds for the connection.
2. Within the listener, the request's host (``Host``/``:authority`` without port, lower-case) picks the virtual
   host that covers it most specifically. No listener, no virtual host, or a virtual host without rules answers
   404 with no body (Envoy's router: ``route_not_found`` is its log detail, not its answer); the default route of
   a waypoint (to the addressed Service itself) never applies at an ingress: the addressed "Service" is the
   gateway.
3. A virtual host with ``https_redirect`` (only HTTP listeners have one) answers 301 with ``location:
   https://<Host as sent><path as sent>`` and no body, whatever its rules (Envoy's ``require_tls: ALL``, whose
   ``SslRedirector`` keeps the host and path verbatim); it comes before rule 2's 404 for a host without rules.
   A request whose scheme is ``https`` already is not redirected. The scheme is the connection's (``https`` over
   TLS the gateway terminated) unless the gateway trusts edge proxies in front of it (an EnvoyFilter set the
   connection manager's ``xff_num_trusted_hops`` above 0): then a valid ``X-Forwarded-Proto`` (``http`` or
   ``https``) gives it, as Envoy sets ``:scheme`` from that header only then; routes and redirects see it too,
   and the request carries ``X-Forwarded-Proto`` with it (the client's own replaced, as Envoy's edge does).
4. Otherwise the waypoint engine decides with that host's table: its first matching rule, filters, weighted
   backends, redirects; a request no rule matches is 404.
5. :meth:`IngressRouter.decide` is a :data:`~ambit.waypoint.decisions.Router`: the destination it is given names
   the connection's port and, in its hostname, the listener picked at the handshake (empty for HTTP).
6. A connection on a TLS (passthrough) or TCP port: :meth:`IngressRouter.find_connection_route` picks the listener
   by the ClientHello's server name (empty for TCP, or a hello without one) as in rule 1, then the virtual host
   that covers the name most specifically (``*`` covers a missing name too); it must have backends. Which backend
   takes the connection is the weighted draw of :func:`~ambit.waypoint.destinations.choose_weighted`. On a
   TLS_TERMINATE port the handshake has picked the listener already (as for HTTPS): that listener, named, is
   taken instead of picking again, and its virtual host is chosen the same way, by the server name the handshake
   read (a listener's TLSRoutes are matched against it, as on a passthrough listener).
7. Listeners on one port share a protocol (the control plane sees to it), except that TLS listeners passing through
   and terminating may share a port: such a port is a TLS port (:meth:`IngressRouter.ports`), whose ClientHello is
   read first; the listener its server name picks (rule 1) then says whether the gateway relays the connection
   as it is or terminates it (:meth:`IngressRouter.terminates_on` says the port needs certificates).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ambit.model.ingress import GatewayConfig, IngressListener, ListenerProtocol, VirtualHost, host_matches
from ambit.model.routes import BackendService, RouteTable
from ambit.waypoint.decisions import Decision, RequestHead, Respond
from ambit.waypoint.routing import route

__all__ = ["IngressRouter", "https_redirect", "request_host"]

NOT_FOUND = Respond(404, flags="NR", by_router=False)


def request_host(authority: str) -> str:
    """The host of a ``Host`` header or ``:authority``, without port, lower-case."""
    text = authority.strip().lower()
    if text.startswith("["):
        return text[1 : text.find("]")] if "]" in text else ""
    host, colon, port = text.rpartition(":")
    return (host if colon and port.isdigit() else text).rstrip(".")


def _pick(listeners: tuple[IngressListener, ...], name: str) -> IngressListener | None:
    best: tuple[int, IngressListener] | None = None
    for listener in listeners:
        score = host_matches(listener.hostname, name)
        if score and (best is None or score > best[0]):
            best = (score, listener)
    return best[1] if best is not None else None


def _port_protocol(listeners: tuple[IngressListener, ...]) -> ListenerProtocol:
    """Rule 7."""
    protocols = {item.protocol for item in listeners}
    return ListenerProtocol.TLS if ListenerProtocol.TLS in protocols else listeners[0].protocol


@dataclass(frozen=True, slots=True)
class _Host:
    hostname: str
    table: RouteTable
    https_redirect: bool = False


def https_redirect(request: RequestHead) -> Respond:
    """Rule 3's answer."""
    path = request.path if request.path.startswith("/") else f"/{request.path}"
    return Respond(301, (("location", f"https://{request.authority}{path}"),), b"", by_router=False)


class IngressRouter:
    """The routing of one :class:`GatewayConfig` (rules 1-7)."""

    __slots__ = ("_hosts", "_ports", "config")

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        ports: dict[int, list[IngressListener]] = {}
        hosts: dict[str, tuple[_Host, ...]] = {}
        for listener in config.listeners:
            ports.setdefault(listener.port, []).append(listener)
            hosts[listener.name] = tuple(
                _Host(
                    v.hostname,
                    RouteTable(service_key="", port=listener.port, http=v.http, hostnames=(v.hostname,)),
                    v.https_redirect,
                )
                for v in listener.virtual_hosts
            )
        self._ports = {port: tuple(items) for port, items in ports.items()}
        self._hosts = hosts

    def ports(self) -> dict[int, ListenerProtocol]:
        """Each port served, with its protocol (rule 7)."""
        return {port: _port_protocol(items) for port, items in self._ports.items()}

    def terminates_on(self, port: int) -> bool:
        """Some listener on ``port`` terminates TLS (HTTPS, TLS_TERMINATE): the port needs certificates."""
        return any(item.protocol.terminates_tls for item in self._ports.get(port, ()))

    def listeners_on(self, port: int) -> tuple[IngressListener, ...]:
        return self._ports.get(port, ())

    def pick_listener(self, port: int, name: str) -> IngressListener | None:
        """Rule 1."""
        return _pick(self._ports.get(port, ()), name.lower().rstrip("."))

    def find_connection_route(self, port: int, server_name: str, listener_name: str = "") -> VirtualHost | None:
        """Rule 6: the virtual host whose ``tcp_backends`` take a connection on ``port`` asking for
        ``server_name`` (lower-case; empty for none), or None: no listener or route takes it. ``listener_name``:
        the listener a TLS handshake picked (TLS_TERMINATE), else empty."""
        listener = next((item for item in self.listeners_on(port) if item.name == listener_name), None)
        if listener is None:
            listener = self.pick_listener(port, server_name)
        if listener is None or listener.protocol.carries_http:
            return None
        best: tuple[int, VirtualHost] | None = None
        for candidate in listener.virtual_hosts:
            score = host_matches(candidate.hostname, server_name)
            if score and (best is None or score > best[0]):
                best = (score, candidate)
        return best[1] if best is not None and best[1].tcp_backends else None

    def _with_scheme(self, request: RequestHead) -> RequestHead:
        """Rule 3's scheme: the connection's, or behind trusted edge proxies the one their ``X-Forwarded-Proto``
        states (``http`` or ``https``), as Envoy sets ``:scheme`` for an HTTP/1 request; and ``X-Forwarded-Proto``
        set to it, so a client cannot tell the backend it came over TLS when it did not."""
        scheme = request.scheme
        if self.config.envoy_patches.trusts_forwarded_proto:
            forwarded = (request.header("x-forwarded-proto") or "").strip().lower()
            if forwarded in ("http", "https"):
                scheme = forwarded

        def stated(headers: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
            return (*((n, v) for n, v in headers if n != "x-forwarded-proto"), ("x-forwarded-proto", scheme))

        return dataclasses.replace(request, scheme=scheme).edit_headers(stated)

    def decide(
        self, table: RouteTable | None, destination: BackendService, request: RequestHead, random: float
    ) -> Decision:
        """Rules 2-5 for one request on the connection ``destination`` describes."""
        request = self._with_scheme(request)
        host = request_host(request.authority)
        listener = None
        if destination.hostname:
            listener = next(
                (item for item in self.listeners_on(destination.port) if item.name == destination.hostname), None
            )
        if listener is None:
            listener = self.pick_listener(destination.port, host)
        if listener is None:
            return NOT_FOUND
        best: tuple[int, _Host] | None = None
        for candidate in self._hosts.get(listener.name, ()):
            score = host_matches(candidate.hostname, host)
            if score and (best is None or score > best[0]):
                best = (score, candidate)
        if best is not None and best[1].https_redirect and request.scheme != "https":
            return https_redirect(request)
        if best is None or not best[1].table.http:
            return NOT_FOUND
        return route(best[1].table, destination, request, random)
