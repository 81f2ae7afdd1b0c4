"""A rig for the ingress gateway's TLS passthrough, TCP and HTTP/2 listeners on loopback, real sockets throughout.

The mesh: one workload, 127.0.0.2, behind an HBONE server (what its node proxy's inbound does) that relays each
CONNECT to a local server chosen by the CONNECT's target port. Services ``one`` and ``two`` (port 443) are TLS
servers terminating with a certificate for ``*.example.com`` from :data:`EDGE_CA` and answering their own name;
``tcp`` (port 9000) echoes bytes; ``web`` (port 80) is an HTTP/1.1 server answering the path and host as JSON (a
request for ``/hold`` waits for :attr:`Hold.release`);
``web2`` (port 80, declared HTTP/2) an h2c server that also answers HTTP/1.1, saying which version it got;
``secure`` (port 443, named ``https``) is the same HTTP/1.1 server as ``web`` behind TLS (the ``*.example.com``
certificate), answering ``"tls": true`` too; ``mutual`` (port 443) likewise, but it requires a client certificate
from :data:`EDGE_CA` and answers its subject's common name as ``client``; ``h2c`` (port 80, protocol not declared)
an h2c server answering HTTP/1.1 with 505 (a request that was not upgraded shows); ``grpc`` (port 9090, declared
gRPC) a grpcio server of ``echo.Echo`` (:func:`grpc_echo_server`).
The gateway listens on 127.0.0.1 with a :class:`GatewayConfig` applied as its xDS client would.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import socket
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from aiohttp import web
from tests.ingress_pki import opaque_secret
from tests.integration.waypoint_rig import H2cBackend, free_port, start_h2c_server

from ambit.controlplane.translate import translate_all
from ambit.hbone.headers import parse_authority
from ambit.identity.localca import LocalCa
from ambit.model.identity import SpiffeId
from ambit.model.ingress import GatewayConfig
from ambit.model.localconfig import LocalConfig, render_local_config
from ambit.model.routes import BackendService
from ambit.model.workload import AppProtocol, NetworkAddress, PortMapping, Service, TunnelProtocol, Workload
from ambit.proxy.hbone_server import HboneServer, InboundRequest, TunnelResponder
from ambit.proxy.sockets import HostSocketFactory, connect
from ambit.proxy.streams import SocketStream
from ambit.tls.certs import KeyPair, issue_server_cert, new_ca
from ambit.waypoint.ingress import IngressGateway
from ambit.waypoint.settings import WaypointLimits, WaypointSettings
from ambit.waypoint.tcp import relay
from ambit.xds.gateway import decode_gateway_config, gateway_config_to_proto, pack_gateway_config

TD = "cluster.local"
GATEWAY_ID = SpiffeId(TD, "edge", "edge-istio")
EDGE_CA = new_ca("passthrough test CA", now=time.time())
BACKEND_CERT = issue_server_cert(
    EDGE_CA, common_name="example.com", dns_names=["*.example.com"], ip_addresses=[], now=time.time()
)
FACTORY = HostSocketFactory(mark=None)
TARGET_PORTS = {
    "one": 8441,
    "two": 8442,
    "tcp": 9001,
    "web": 8080,
    "web2": 8083,
    "secure": 8443,
    "mutual": 8444,
    "h2c": 8082,
    "grpc": 8090,
}
SERVICE_PORTS = {
    "one": 443,
    "two": 443,
    "tcp": 9000,
    "web": 80,
    "web2": 80,
    "secure": 443,
    "mutual": 443,
    "h2c": 80,
    "grpc": 9090,
}
PROTOCOLS = {"web2": AppProtocol.HTTP2, "grpc": AppProtocol.GRPC}
"""Ports declared other than unknown: ``web2`` is an h2c server (``waypoint_rig.start_h2c_server``), ``grpc`` a
gRPC server."""


def backend(name: str) -> BackendService:
    return BackendService("app", f"{name}.app.svc.cluster.local", SERVICE_PORTS[name])


def mesh() -> LocalConfig:
    return LocalConfig(
        workloads=(
            Workload(
                uid="Kubernetes//Pod/app/multi-1",
                name="multi-1",
                namespace="app",
                addresses=(ipaddress.ip_address("127.0.0.2"),),
                tunnel_protocol=TunnelProtocol.HBONE,
                service_account="multi",
                services={
                    f"app/{name}.app.svc.cluster.local": (PortMapping(SERVICE_PORTS[name], target),)
                    for name, target in TARGET_PORTS.items()
                },
            ),
        ),
        services=tuple(
            Service(
                name=name,
                namespace="app",
                hostname=f"{name}.app.svc.cluster.local",
                vips=(NetworkAddress("", ipaddress.ip_address(f"198.18.2.{i + 1}")),),
                ports=(PortMapping(SERVICE_PORTS[name], target, PROTOCOLS.get(name, AppProtocol.UNKNOWN)),),
            )
            for i, (name, target) in enumerate(TARGET_PORTS.items())
        ),
    )


@dataclass
class MeshEndpoint:
    """The HBONE side of the workload: CONNECT ``127.0.0.2:<target port>`` → the local server of that role."""

    hbone_port: int
    local_ports: dict[int, int]
    peers: list[SpiffeId] = field(default_factory=list)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self, ca: LocalCa) -> None:
        self.cert = await ca.fetch_certificate(SpiffeId(TD, "app", "multi"))
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.2", self.hbone_port))
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.accepting = asyncio.create_task(self._accept())

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(self.listener)
            task = asyncio.create_task(
                HboneServer.serve(sock, self._certificate, trust_domain=TD, handler=self._handle)
            )
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _certificate(self) -> object:
        return self.cert

    async def _handle(self, request: InboundRequest, responder: TunnelResponder) -> None:
        self.peers.append(request.peer_identity)
        host, port = parse_authority(request.authority)
        local = self.local_ports.get(port)
        if host != "127.0.0.2" or local is None:
            responder.reject(400)
            return
        upstream = SocketStream(await connect(FACTORY, ("127.0.0.1", local)))
        await relay(responder.accept(), upstream, 30.0)
        with contextlib.suppress(Exception):
            await upstream.aclose()

    async def aclose(self) -> None:
        self.accepting.cancel()
        await asyncio.gather(self.accepting, return_exceptions=True)
        self.listener.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def _tls_backend(name: str) -> asyncio.Server:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*_pem_files())

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            line = await reader.readline()
            writer.write(f"{name} {line.decode().strip()}\n".encode())
            await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)


_PEM: list[str] = []


def _pem_files() -> tuple[str, str]:
    """The backend's certificate and key as files (ssl loads chains from paths), written once per process."""
    if not _PEM:
        import atexit
        import shutil
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="ambit-passthrough-"))
        atexit.register(shutil.rmtree, folder, True)  # the process's own: no key files left in /tmp after it
        (folder / "cert.pem").write_bytes(BACKEND_CERT.cert_pem)
        (folder / "key.pem").write_bytes(BACKEND_CERT.key_pem)
        _PEM.extend([str(folder / "cert.pem"), str(folder / "key.pem")])
    return _PEM[0], _PEM[1]


async def _echo_backend() -> asyncio.Server:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    return await asyncio.start_server(echo, "127.0.0.1", 0)


@dataclass
class Hold:
    """``web``'s ``/hold``: each such request sets ``arrived`` and waits for ``release`` before it is answered."""

    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)


async def _web_backend(
    tls: bool = False, *, mutual: bool = False, hold: Hold | None = None
) -> tuple[web.AppRunner, int]:
    async def answer(request: web.Request) -> web.Response:
        if hold is not None and request.path == "/hold":
            hold.arrived.set()
            await asyncio.wait_for(hold.release.wait(), 30)
        body: dict[str, object] = {"path": request.path, "host": request.headers.get("host", ""), "tls": tls}
        body["headers"] = {name.lower(): value for name, value in request.headers.items()}
        peer = request.transport.get_extra_info("peercert") if request.transport is not None else None
        if peer:
            body["client"] = next(v for rdn in peer["subject"] for k, v in rdn if k == "commonName")
        return web.json_response(body)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    context = None
    if tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*_pem_files())
    if mutual and context is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=EDGE_CA.cert_pem.decode())
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
    return runner, port


@dataclass
class GrpcCalls:
    """What the gRPC server behind ``grpc`` saw: each call's method and its invocation metadata."""

    calls: list[tuple[str, dict[str, str]]] = field(default_factory=list)


def _raw(data: bytes) -> bytes:
    return data


async def grpc_echo_server(seen: GrpcCalls) -> tuple[grpc.aio.Server, int]:
    """A grpcio server of ``echo.Echo`` on raw bytes, on 127.0.0.1: ``Say`` answers ``said:<request>`` with the
    trailing metadata ``x-served: yes`` (``fail`` answers NOT_FOUND with the message ``no such thing`` and the
    trailing metadata ``x-why: asked-to``); ``Chat`` answers each message of a bidirectional stream."""

    async def say(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        seen.calls.append(("Say", {k: str(v) for k, v in context.invocation_metadata() or ()}))
        if request == b"fail":
            context.set_trailing_metadata((("x-why", "asked-to"),))
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
        context.set_trailing_metadata((("x-served", "yes"),))
        return b"said:" + request

    async def chat(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        seen.calls.append(("Chat", {k: str(v) for k, v in context.invocation_metadata() or ()}))
        async for message in requests:
            yield b"chat:" + message

    handler = grpc.method_handlers_generic_handler(
        "echo.Echo",
        {
            "Say": grpc.unary_unary_rpc_method_handler(say, _raw, _raw),
            "Chat": grpc.stream_stream_rpc_method_handler(chat, _raw, _raw),
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


@dataclass
class IngressRig:
    proc: IngressGateway
    endpoint: MeshEndpoint
    web2: H2cBackend
    hold: Hold = field(default_factory=Hold)
    grpc_calls: GrpcCalls = field(default_factory=GrpcCalls)

    def port(self, listener: str) -> int:
        return next(item.port for item in self.proc.router.config.listeners if item.name == listener)


@dataclass
class MeshBackends:
    """The mesh side: the workload's HBONE endpoint and its servers, the state file and the CA directory the
    gateway is to use."""

    endpoint: MeshEndpoint
    state: Path
    ca_dir: Path
    web2: H2cBackend
    """What the h2c server behind ``web2`` saw."""
    hold: Hold
    grpc_calls: GrpcCalls
    """What the gRPC server behind ``grpc`` saw."""


@contextlib.asynccontextmanager
async def mesh_backends(tmp_path: Path) -> AsyncIterator[MeshBackends]:
    ca = LocalCa(tmp_path / "ca", trust_domain=TD)
    state = tmp_path / "mesh.yaml"
    state.write_text(render_local_config(mesh()), encoding="utf-8")
    servers = {"one": await _tls_backend("one"), "two": await _tls_backend("two"), "tcp": await _echo_backend()}
    hold = Hold()
    runner, web_port = await _web_backend(hold=hold)
    web2 = H2cBackend("web2")
    servers["web2"] = await start_h2c_server(web2, http1=True)
    servers["h2c"] = await start_h2c_server(H2cBackend("h2c"))
    secure_runner, secure_port = await _web_backend(tls=True)
    mutual_runner, mutual_port = await _web_backend(tls=True, mutual=True)
    grpc_calls = GrpcCalls()
    grpc_server, grpc_port = await grpc_echo_server(grpc_calls)
    local = {TARGET_PORTS[n]: s.sockets[0].getsockname()[1] for n, s in servers.items()}
    local[TARGET_PORTS["grpc"]] = grpc_port
    local[TARGET_PORTS["web"]] = web_port
    local[TARGET_PORTS["secure"]] = secure_port
    local[TARGET_PORTS["mutual"]] = mutual_port
    endpoint = MeshEndpoint(free_port("127.0.0.2"), local)
    await endpoint.start(ca)
    try:
        yield MeshBackends(endpoint, state, tmp_path / "ca", web2, hold, grpc_calls)
    finally:
        await endpoint.aclose()
        await grpc_server.stop(0)
        for server in servers.values():
            server.close()
        await runner.cleanup()
        await secure_runner.cleanup()
        await mutual_runner.cleanup()


def gateway_settings(backends: MeshBackends, limits: WaypointLimits | None = None) -> WaypointSettings:
    return WaypointSettings(
        namespace="edge",
        gateway_name="edge",
        service_account="edge-istio",
        pod_name="edge-istio-0",
        instance_ip="127.0.0.1",
        config_file=backends.state,
        local_ca_dir=backends.ca_dir,
        admin_port=free_port(),
        stats_port=free_port(),
        readiness_port=free_port(),
        upstream_hbone_port=backends.endpoint.hbone_port,
        limits=limits or WaypointLimits(),
    )


def as_served(config: GatewayConfig) -> GatewayConfig:
    """``config`` as the gateway's xDS client decodes it (checked to be the same), each listener port moved to a
    free local port (listeners that shared a port still share one)."""
    assert decode_gateway_config(config.gateway, pack_gateway_config(gateway_config_to_proto(config))) == config
    ports = {i.port: free_port() for i in config.listeners}
    return dataclasses.replace(
        config, listeners=tuple(dataclasses.replace(i, port=ports[i.port]) for i in config.listeners)
    )


@contextlib.asynccontextmanager
async def ingress_rig(tmp_path: Path, config: GatewayConfig) -> AsyncIterator[IngressRig]:
    async with mesh_backends(tmp_path) as backends:
        proc = IngressGateway(gateway_settings(backends))
        proc.apply(config)
        await proc.start()
        try:
            async with asyncio.timeout(15):
                await proc.startup.ready.wait()
            yield IngressRig(proc, backends.endpoint, backends.web2, backends.hold, backends.grpc_calls)
        finally:
            await proc.aclose()


async def tls_ask(port: int, server_name: str, line: str = "hello") -> str:
    """A TLS client of 127.0.0.1:port asking for ``server_name``, verifying the backend's certificate against
    :data:`EDGE_CA` (the gateway holds no such key: a good handshake proves the bytes went through untouched)."""
    context = ssl.create_default_context(cadata=EDGE_CA.cert_pem.decode())
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname=server_name)
    try:
        writer.write(f"{line}\n".encode())
        await writer.drain()
        return (await asyncio.wait_for(reader.readline(), 10)).decode().strip()
    finally:
        writer.close()


def translate_edge(gateway: dict[str, Any], server: KeyPair, client_ca: KeyPair) -> GatewayConfig:
    """The control plane's config for ``gateway`` (``edge/edge``) with an HTTPRoute to ``app/web:80``, its serving
    certificate in Secret ``edge/edge-cert`` and the clients' CA in ConfigMap ``edge/client-ca``."""
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "web", "namespace": "app"},
        "spec": {
            "parentRefs": [{"name": "edge", "namespace": "edge"}],
            "rules": [{"backendRefs": [{"name": "web", "port": 80}]}],
        },
    }
    translation = translate_all(
        pods=(),
        services=[
            {
                "metadata": {"name": "web", "namespace": "app"},
                "spec": {"clusterIP": "198.18.2.4", "ports": [{"port": 80}]},
            }
        ],
        endpoint_slices=(),
        namespaces=[{"metadata": {"name": "app"}}, {"metadata": {"name": "edge"}}],
        gateways=[gateway],
        http_routes=[route],
        secrets=[
            opaque_secret("edge-cert", "edge", "kubernetes.io/tls", tls_crt=server.cert_pem, tls_key=server.key_pem)
        ],
        config_maps=[
            {"metadata": {"name": "client-ca", "namespace": "edge"}, "data": {"ca.crt": client_ca.cert_pem.decode()}}
        ],
    )
    (config,) = translation.gateway_configs
    return config
