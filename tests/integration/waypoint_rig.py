"""A waypoint on loopback with real sockets: the waypoint process in-process (local CA, a local config file),
two endpoints (each an HBONE server in front of an HTTP echo server, as a node proxy would be) and a client that
speaks HBONE to the waypoint with a mesh identity.

Addresses: the waypoint is 127.0.0.1, the endpoints 127.0.0.2 and 127.0.0.3 (same HBONE port), a dead endpoint
127.0.0.5, the client 127.0.0.4; Service VIPs are lab addresses (198.18.x, never dialled: the waypoint resolves
them from its state).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import itertools
import json
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import grpc.aio
import h2.config
import h2.connection
import h2.events
import h11
from aiohttp import web
from aiohttp.typedefs import Handler
from bench.server_process import free_port as harness_free_port

from ambit.hbone.headers import parse_authority
from ambit.identity.localca import LocalCa
from ambit.model.identity import SpiffeId
from ambit.model.localconfig import LocalConfig, render_local_config
from ambit.model.route_matches import RouteMatch
from ambit.model.routes import BackendService, RequestMirror, RouteRule, RouteTable, WeightedBackend
from ambit.model.workload import (
    AppProtocol,
    GatewayAddress,
    NamespacedHostname,
    NetworkAddress,
    PortMapping,
    Service,
    TunnelProtocol,
    Workload,
)
from ambit.proxy.hbone_client import HboneClient
from ambit.proxy.hbone_server import HboneServer, InboundRequest, TunnelResponder
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.sockets import HostSocketFactory, connect
from ambit.proxy.streams import SocketStream
from ambit.tls.socket_transport import TlsTransportKind
from ambit.tls.workload import WorkloadCertificate
from ambit.waypoint.decisions import Decision, RequestHead
from ambit.waypoint.process import Waypoint
from ambit.waypoint.routing import waypoint_route
from ambit.waypoint.settings import WaypointLimits, WaypointSettings
from ambit.waypoint.tcp import relay

TD = "cluster.local"
CLIENT_IP = "127.0.0.4"
CLIENT_ID = SpiffeId(TD, "app", "client")
WAYPOINT_ID = SpiffeId(TD, "app", "waypoint")
ECHO_VIP = "198.18.1.1"
DEAD_VIP = "198.18.1.5"
TCP_VIP = "198.18.1.6"
PLAIN_VIP = "198.18.1.2"
RAW_VIP = "198.18.1.7"
RAW_DEAD_VIP = "198.18.1.8"
MIXED_VIP = "198.18.1.9"
GRPC_VIP = "198.18.1.10"
GRPC_TWO_VIP = "198.18.1.11"
GRPC_MIXED_VIP = "198.18.1.12"
TLS_VIP = "198.18.1.13"
RAW_TWO_VIP = "198.18.1.14"
GRPC_PORT = 50051
GRPC_TARGET_PORT = 9090
WAYPOINT_ADDR = GatewayAddress(NamespacedHostname("app", "waypoint.app.svc.cluster.local"))
FACTORY = HostSocketFactory(mark=None)
_GRPC_PORTS = (GRPC_PORT, GRPC_TARGET_PORT)
SECURE_VIP = "198.18.1.15"
SECURE_HTTP_VIP = "198.18.1.16"
H2C_VIP = "198.18.1.17"
WEB2_VIP = "198.18.1.18"
TLS_TARGET_PORT = 8443
H2C_TARGET_PORT = 8082
_EXTRA_PORTS = {
    "secure": (443, TLS_TARGET_PORT),
    "secure-http": (80, TLS_TARGET_PORT),
    "h2c": (80, H2C_TARGET_PORT),
    "web2": (80, H2C_TARGET_PORT),
}
"""Services whose endpoints' servers a test starts itself (:attr:`Endpoint.extra`): TLS and h2c backends."""


def mirroring_router(table: RouteTable | None, destination: BackendService, request: RequestHead, r: float) -> Decision:
    """A router that takes every request to its destination and mirrors it there too, through the real routing
    engine (which gives the copy its ``-shadow`` authority)."""
    rule = RouteRule(
        route="HTTPRoute/app/mirror",
        match=RouteMatch(),
        backends=(WeightedBackend(destination),),
        mirrors=(RequestMirror(destination),),
    )
    return waypoint_route(RouteTable(destination.service_key, destination.port, http=(rule,)), destination, request, r)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host``, below the ephemeral range (:func:`bench.server_process.free_port`): a port from
    ``bind(0)`` could be any outgoing connection's source port by the time the rig binds it."""
    return harness_free_port(host)


def shared_free_port(hosts: tuple[str, ...]) -> int:
    """A port free on every one of ``hosts`` (the endpoints share one HBONE port, as pods all use 15008)."""
    for _ in range(50):
        port = free_port(hosts[0])
        try:
            for host in hosts[1:]:
                with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
                    sock.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no port free on all hosts")


def _workload(name: str, ip: str, *services: str, waypoint: GatewayAddress | None = None) -> Workload:
    def ports(service: str) -> tuple[PortMapping, ...]:
        if service in _EXTRA_PORTS:
            return (PortMapping(*_EXTRA_PORTS[service]),)
        return (PortMapping(GRPC_PORT, GRPC_TARGET_PORT),) if service.startswith("grpc") else (PortMapping(80, 8080),)

    return Workload(
        uid=f"Kubernetes//Pod/app/{name}",
        name=name,
        namespace="app",
        addresses=(ipaddress.ip_address(ip),),
        tunnel_protocol=TunnelProtocol.HBONE,
        service_account=name,
        canonical_name=name.rsplit("-", 1)[0],
        services={f"app/{service}.app.svc.cluster.local": ports(service) for service in services},
        waypoint=waypoint,
    )


def _service(
    name: str, vip: str, *, protocol: AppProtocol, waypoint: GatewayAddress | None, port: tuple[int, int] = (80, 8080)
) -> Service:
    return Service(
        name=name,
        namespace="app",
        hostname=f"{name}.app.svc.cluster.local",
        vips=(NetworkAddress("", ipaddress.ip_address(vip)),),
        ports=(PortMapping(*port, protocol),),
        waypoint=waypoint,
    )


def mesh_config() -> LocalConfig:
    return LocalConfig(
        workloads=(
            _workload("client", CLIENT_IP),
            _workload(
                "echo-1",
                "127.0.0.2",
                *("echo", "tcp", "raw", "mixed", "grpc", "grpc-mixed", "tls"),
                *("secure", "secure-http", "h2c", "web2"),
            ),
            _workload(
                "echo-2", "127.0.0.3", "echo", "grpc", "grpc-two", "raw-two", "h2c", "web2", waypoint=WAYPOINT_ADDR
            ),  # also pod-IP traffic via the waypoint
            _workload("dead-1", "127.0.0.5", "dead", "rawdead", "mixed", "grpc-mixed"),
        ),
        services=(
            _service("echo", ECHO_VIP, protocol=AppProtocol.HTTP11, waypoint=WAYPOINT_ADDR),
            _service("tcp", TCP_VIP, protocol=AppProtocol.UNKNOWN, waypoint=WAYPOINT_ADDR),
            _service("dead", DEAD_VIP, protocol=AppProtocol.HTTP11, waypoint=WAYPOINT_ADDR),
            _service("raw", RAW_VIP, protocol=AppProtocol.TCP, waypoint=WAYPOINT_ADDR),
            _service("rawdead", RAW_DEAD_VIP, protocol=AppProtocol.TCP, waypoint=WAYPOINT_ADDR),
            _service("raw-two", RAW_TWO_VIP, protocol=AppProtocol.TCP, waypoint=WAYPOINT_ADDR),  # echo-2 only
            _service("tls", TLS_VIP, protocol=AppProtocol.TLS, waypoint=WAYPOINT_ADDR),
            _service("mixed", MIXED_VIP, protocol=AppProtocol.HTTP11, waypoint=WAYPOINT_ADDR),  # echo-1 and dead-1
            _service("plain", PLAIN_VIP, protocol=AppProtocol.HTTP11, waypoint=None),
            # gRPC on both endpoints (declared GRPC), and on echo-2 only (undeclared: sniffed as HTTP/2)
            _service("grpc", GRPC_VIP, protocol=AppProtocol.GRPC, waypoint=WAYPOINT_ADDR, port=_GRPC_PORTS),
            _service("grpc-two", GRPC_TWO_VIP, protocol=AppProtocol.UNKNOWN, waypoint=WAYPOINT_ADDR, port=_GRPC_PORTS),
            # gRPC on echo-1 and on dead-1, which nothing answers for
            _service("grpc-mixed", GRPC_MIXED_VIP, protocol=AppProtocol.GRPC, waypoint=WAYPOINT_ADDR, port=_GRPC_PORTS),
            # DestinationRule backends (servers started by the tests): TLS on echo-1, h2c on echo-1 and echo-2
            _service(
                "secure", SECURE_VIP, protocol=AppProtocol.TLS, waypoint=WAYPOINT_ADDR, port=(443, TLS_TARGET_PORT)
            ),
            _service(
                "secure-http", SECURE_HTTP_VIP, protocol=AppProtocol.HTTP11, waypoint=WAYPOINT_ADDR, port=(80, 8443)
            ),
            _service("h2c", H2C_VIP, protocol=AppProtocol.HTTP11, waypoint=WAYPOINT_ADDR, port=(80, H2C_TARGET_PORT)),
            # the same h2c servers behind a port declared HTTP/2 (istio's ``http2`` port: appProtocol http2)
            _service("web2", WEB2_VIP, protocol=AppProtocol.HTTP2, waypoint=WAYPOINT_ADDR, port=(80, H2C_TARGET_PORT)),
        ),
    )


@dataclass
class Endpoint:
    """One endpoint: an HTTP echo server behind an HBONE server (the node proxy's inbound, in miniature)."""

    name: str
    ip: str
    hbone_port: int
    cert: WorkloadCertificate
    tunnels: int = 0
    authorities: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    """The Host of every request served."""
    bodies: list[tuple[str, str]] = field(default_factory=list)
    """The Host and the body's SHA-256 of every request ``/echo`` served."""
    seen: list[str] = field(default_factory=list)
    """``METHOD /path`` of every request that reached the HTTP server, in order."""
    fail_status: int | None = None
    """When set, ``/echo`` answers this status (after reading the body) instead of echoing."""
    grpc_calls: list[str] = field(default_factory=list)
    """The method of every gRPC call that reached the gRPC server."""
    grpc_cancelled: int = 0
    """gRPC calls that ended cancelled (the caller went away)."""
    grpc_unavailable: bool = False
    """When set, ``Say`` answers UNAVAILABLE."""
    extra: dict[int, int] = field(default_factory=dict)
    """Target port → a local port a test serves it on (TLS, h2c backends)."""

    async def start(self) -> None:
        app = web.Application(middlewares=[self._record])
        app.router.add_route("*", "/echo", self._echo)
        app.router.add_get("/slow", self._slow)
        app.router.add_get("/drip", self._drip)
        app.router.add_get("/chunked", self._chunked)
        app.router.add_get("/ws", self._websocket)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        self.http_port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.http_port).start()
        self.grpc_server = grpc.aio.server()
        self.grpc_server.add_generic_rpc_handlers((grpc_echo_handler(self),))
        self.grpc_port = self.grpc_server.add_insecure_port("127.0.0.1:0")
        await self.grpc_server.start()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((self.ip, self.hbone_port))
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._serving: set[asyncio.Task[None]] = set()
        self._accepting = asyncio.create_task(self._accept())

    @web.middleware
    async def _record(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.seen.append(f"{request.method} {request.path}")
        return await handler(request)

    async def _echo(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.hosts.append(request.headers.get("host", ""))
        self.bodies.append((request.headers.get("host", ""), hashlib.sha256(body).hexdigest()))
        if self.fail_status is not None:
            return web.Response(status=self.fail_status, text=f"{self.name} fails")
        if request.query.get("raw") == "tcp":
            return web.Response(text="tcp")
        answer = {
            "endpoint": self.name,
            "request_id": request.headers.get("x-request-id", ""),
            "method": request.method,
            "host": request.headers.get("host", ""),
            "authorization": request.headers.get("authorization", ""),
            "jwt_payload": request.headers.get("x-jwt-payload", ""),
            "xfcc": request.headers.getall("x-forwarded-client-cert", []),
            "headers": {name.lower(): value for name, value in request.headers.items()},
            "body": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
        }
        return web.json_response(answer)

    async def _websocket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            await ws.send_str(message.data)
        return ws

    async def _slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response(text="late")

    async def _drip(self, request: web.Request) -> web.StreamResponse:
        """A 200 whose body starts at once and then stalls (the rest would come after 5 s)."""
        response = web.StreamResponse(headers={"content-length": "20"})
        await response.prepare(request)
        await response.write(b"first half")
        await asyncio.sleep(5)
        await response.write(b"other half")
        return response

    async def _chunked(self, request: web.Request) -> web.StreamResponse:
        """A 200 framed chunked (no content-length), in two chunks."""
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(b"one,")
        await response.write(b"two")
        await response.write_eof()
        return response

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(self._listener)
            task = asyncio.create_task(
                HboneServer.serve(sock, self._cert, trust_domain=TD, handler=self._handle, tls_transport="loop")
            )
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)

    async def _cert(self) -> WorkloadCertificate:
        return self.cert

    async def _handle(self, request: InboundRequest, responder: TunnelResponder) -> None:
        assert request.peer_identity == WAYPOINT_ID
        self.tunnels += 1
        self.authorities.append(request.authority)
        host, port = parse_authority(request.authority)
        if host != self.ip or port not in (8080, GRPC_TARGET_PORT, *self.extra):
            responder.reject(400)
            return
        local_port = self.extra.get(port) or (self.http_port if port == 8080 else self.grpc_port)
        upstream = SocketStream(await connect(FACTORY, ("127.0.0.1", local_port)))
        await relay(responder.accept(), upstream, 30.0)
        with contextlib.suppress(Exception):
            await upstream.aclose()

    async def aclose(self) -> None:
        self._accepting.cancel()
        await asyncio.gather(self._accepting, return_exceptions=True)
        self._listener.close()
        for task in list(self._serving):
            task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)
        await self._runner.cleanup()
        await self.grpc_server.stop(0)


def grpc_echo_handler(endpoint: Endpoint) -> grpc.GenericRpcHandler:
    """``echo.Echo`` on raw bytes (no protobuf): ``Say`` answers ``<endpoint>:<request>`` (``fail`` answers
    NOT_FOUND with a message and trailing metadata, ``big`` a 1 MiB answer); ``Chat`` echoes every message of a
    bidirectional stream; ``Hang`` waits until the call is cancelled; ``Deadline`` answers the seconds left of the
    deadline the call arrived with (its ``grpc-timeout``), or ``none``."""

    async def say(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        endpoint.grpc_calls.append("Say")
        version = dict(context.invocation_metadata() or ()).get("x-version", "")
        if endpoint.grpc_unavailable:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{endpoint.name} is unavailable")
        if request == b"fail":
            context.set_trailing_metadata((("x-why", "asked-to"),))
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
        if request == b"big":
            return b"b" * (1024 * 1024)
        return f"{endpoint.name}:{version}:".encode() + request

    async def chat(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        endpoint.grpc_calls.append("Chat")
        async for message in requests:
            yield f"{endpoint.name}:".encode() + message

    async def hang(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        endpoint.grpc_calls.append("Hang")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            endpoint.grpc_cancelled += 1
            raise
        return b"late"

    async def deadline(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        endpoint.grpc_calls.append("Deadline")
        left = context.time_remaining()
        return b"none" if left is None else f"{left:.3f}".encode()

    return grpc.method_handlers_generic_handler(
        "echo.Echo",
        {
            "Deadline": grpc.unary_unary_rpc_method_handler(deadline),
            "Say": grpc.unary_unary_rpc_method_handler(say),
            "Chat": grpc.stream_stream_rpc_method_handler(chat),
            "Hang": grpc.unary_unary_rpc_method_handler(hang),
        },
    )


def waypoint_settings(config: Path, ca_dir: Path, limits: WaypointLimits, **overrides: Any) -> WaypointSettings:
    """The settings of the rigs' waypoint ``app/waypoint`` on 127.0.0.1 (free ports; a local config and CA), with
    ``overrides``."""
    fields: dict[str, Any] = {
        "namespace": "app",
        "gateway_name": "waypoint",
        "service_account": "waypoint",
        "pod_name": "waypoint-0",
        "instance_ip": "127.0.0.1",
        "config_file": config,
        "local_ca_dir": ca_dir,
        "hbone_port": free_port(),
        "admin_port": free_port(),
        "stats_port": free_port(),
        "readiness_port": free_port(),
        "limits": limits,
    }
    return WaypointSettings(**(fields | overrides))


class Rig:
    def __init__(self, tmp: Path, limits: WaypointLimits, tls_transport: TlsTransportKind = "socket") -> None:
        self.tmp = tmp
        self.ca = LocalCa(tmp / "ca", trust_domain=TD)
        config = tmp / "mesh.yaml"
        config.write_text(render_local_config(mesh_config()), encoding="utf-8")
        self.hbone_port = shared_free_port(("127.0.0.2", "127.0.0.3"))
        self.settings = waypoint_settings(
            config, tmp / "ca", limits, upstream_hbone_port=self.hbone_port, tls_transport=tls_transport
        )
        self.waypoint = Waypoint(self.settings)
        self.endpoints: list[Endpoint] = []

    async def start(self) -> None:
        for name, ip in (("echo-1", "127.0.0.2"), ("echo-2", "127.0.0.3")):
            cert = await self.ca.fetch_certificate(SpiffeId(TD, "app", name))
            endpoint = Endpoint(name, ip, self.hbone_port, cert)
            await endpoint.start()
            self.endpoints.append(endpoint)
        self.client_cert = await self.ca.fetch_certificate(CLIENT_ID)
        await self.waypoint.start()

    async def aclose(self) -> None:
        await self.waypoint.aclose()
        for endpoint in self.endpoints:
            await endpoint.aclose()

    async def client(self, identity: SpiffeId = WAYPOINT_ID) -> HboneClient:
        """An HBONE connection from the client's address to the waypoint, verifying its identity."""
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind((CLIENT_IP, 0))
        await loop.sock_connect(sock, ("127.0.0.1", self.settings.hbone_port))
        return await HboneClient.connect(
            sock, self.client_cert, frozenset({identity}), trust_domain=TD, tls_transport="loop"
        )

    async def tunnel(self, authority: str) -> tuple[HboneClient, HboneStream]:
        client = await self.client()
        return client, await client.open_tunnel(authority, [("forwarded", f'for="{CLIENT_IP}:1"')])


@contextlib.asynccontextmanager
async def started_rig(
    tmp: Path, limits: WaypointLimits, tls_transport: TlsTransportKind = "socket"
) -> AsyncIterator[Rig]:
    """A started :class:`Rig` whose waypoint balances round-robin (deterministic per-request balancing), its HBONE
    legs (the listener and the upstream pool) on ``tls_transport`` (the ``tls_transport`` fixture gives each)."""
    rig = Rig(tmp, limits, tls_transport)
    try:
        await rig.start()
        counter = itertools.count()

        def round_robin(candidates: Sequence[Workload]) -> Workload:
            return candidates[next(counter) % len(candidates)]

        rig.waypoint.context.choose = round_robin
        yield rig
    finally:
        await rig.aclose()


async def http_get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


class HttpOverTunnel:
    """An HTTP/1.1 client (h11) on one tunnel."""

    def __init__(self, stream: HboneStream, host: str = "echo.app.svc.cluster.local") -> None:
        self.stream = stream
        self.host = host
        self.h11 = h11.Connection(h11.CLIENT)

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: list[tuple[str, str]] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        fields = [("host", self.host), *(headers or [])]
        if body and not any(name.lower() == "transfer-encoding" for name, _ in fields):
            fields.append(("content-length", str(len(body))))
        data = self.h11.send(h11.Request(method=method, target=path, headers=fields)) or b""
        if body:
            data += self.h11.send(h11.Data(data=body)) or b""
        data += self.h11.send(h11.EndOfMessage()) or b""
        await self.stream.write(data)
        status, answer_headers, parts = 0, {}, []
        async with asyncio.timeout(10):
            while True:
                event = self.h11.next_event()
                if event is h11.NEED_DATA:
                    self.h11.receive_data(await self.stream.read())
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    answer_headers = {k.decode(): v.decode() for k, v in event.headers}
                elif isinstance(event, h11.Data):
                    parts.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:
                    raise AssertionError(f"unexpected {event!r}")
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
        return status, answer_headers, b"".join(parts)


async def read_until_eof(stream: HboneStream) -> bytes:
    parts = []
    async with asyncio.timeout(10):
        while chunk := await stream.read():
            parts.append(chunk)
    return b"".join(parts)


def echo_of(body: bytes) -> dict[str, object]:
    value = json.loads(body)
    assert isinstance(value, dict)
    return value


@dataclass
class H2cBackend:
    name: str
    port: int = 0
    protocols: list[str] = field(default_factory=list)
    """The HTTP version of every request served, in order."""
    request_ids: list[str] = field(default_factory=list)
    """The ``x-request-id`` of every request served."""
    connections: int = 0
    h2_ended: int = 0
    """HTTP/2 connections the client ended (EOF)."""


def _h1_answer(backend: H2cBackend, head: bytes) -> bytes:
    lines = head.decode("latin-1").split("\r\n")
    path = lines[0].split(" ")[1] if lines[0].count(" ") >= 2 else ""
    fields = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
    backend.request_ids.append(next((v.strip() for k, v in fields.items() if k.lower() == "x-request-id"), ""))
    body = json.dumps({"endpoint": backend.name, "proto": "HTTP/1.1", "path": path}).encode()
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)


async def _serve_h2(
    backend: H2cBackend, conn: h2.connection.H2Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    paths: dict[int, str] = {}
    while data := await reader.read(65536):
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                headers = dict(event.headers)  # type: ignore[arg-type]
                paths[event.stream_id] = headers.get(":path", "")
                backend.request_ids.append(headers.get("x-request-id", ""))
            elif isinstance(event, h2.events.StreamEnded):
                backend.protocols.append("HTTP/2.0")
                body = json.dumps({"endpoint": backend.name, "proto": "HTTP/2.0", "path": paths.pop(event.stream_id)})
                conn.send_headers(event.stream_id, [(":status", "200"), ("content-length", str(len(body)))])
                conn.send_data(event.stream_id, body.encode(), end_stream=True)
        writer.write(conn.data_to_send())
        await writer.drain()


async def start_h2c_server(backend: H2cBackend, *, http1: bool = False) -> asyncio.Server:
    """An HTTP server on 127.0.0.1 (its port in ``backend.port``) that answers HTTP/2 (prior knowledge) with what
    it saw, and HTTP/1.1 with 505 (so a request that was not upgraded shows), or with ``http1`` with what it saw
    too."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backend.connections += 1
        first = await reader.read(24)
        if not first.startswith(b"PRI * HTTP/2.0"):
            backend.protocols.append("HTTP/1.1")
            if http1:
                head = first if b"\r\n\r\n" in first else first + await reader.readuntil(b"\r\n\r\n")
                writer.write(_h1_answer(backend, head))
            else:
                writer.write(b"HTTP/1.1 505 Not HTTP/2\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            await writer.drain()
            writer.close()
            return
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        conn.receive_data(first)
        writer.write(conn.data_to_send())
        with contextlib.suppress(ConnectionError):  # the waypoint may reset a kept connection as it closes
            await _serve_h2(backend, conn, reader, writer)
            backend.h2_ended += 1
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    backend.port = server.sockets[0].getsockname()[1]
    return server


@contextlib.asynccontextmanager
async def h2c_backends(rig: Rig, *, http1: bool = False) -> AsyncIterator[list[H2cBackend]]:
    """A :func:`start_h2c_server` on each endpoint's port 8082."""
    backends = [H2cBackend(e.name) for e in rig.endpoints]
    servers = []
    for backend, endpoint in zip(backends, rig.endpoints, strict=True):
        servers.append(await start_h2c_server(backend, http1=http1))
        endpoint.extra[H2C_TARGET_PORT] = backend.port
    try:
        yield backends
    finally:
        for server in servers:
            server.close()


class H2OverTunnelClient:
    """A plain HTTP/2 client (h2, prior knowledge) on one tunnel: one request at a time."""

    def __init__(self, stream: HboneStream, authority: str) -> None:
        self.stream = stream
        self.authority = authority
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.h2.initiate_connection()

    async def get(self, path: str) -> tuple[dict[str, str], bytes]:
        sid = self.h2.get_next_available_stream_id()
        request = [(":method", "GET"), (":scheme", "http"), (":authority", self.authority), (":path", path)]
        self.h2.send_headers(sid, request, end_stream=True)
        await self.stream.write(self.h2.data_to_send())
        headers: dict[str, str] = {}
        body = b""
        async with asyncio.timeout(10):
            while True:
                data = await self.stream.read()
                if not data:
                    raise AssertionError(f"the tunnel ended before stream {sid} did")
                for event in self.h2.receive_data(data):
                    if isinstance(event, h2.events.ResponseReceived) and event.stream_id == sid:
                        headers = dict(event.headers)  # type: ignore[arg-type]
                    elif isinstance(event, h2.events.DataReceived) and event.stream_id == sid:
                        body += event.data
                        self.h2.acknowledge_received_data(event.flow_controlled_length, sid)
                    elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset) and event.stream_id == sid:
                        await self.stream.write(self.h2.data_to_send())
                        return headers, body
                await self.stream.write(self.h2.data_to_send())
