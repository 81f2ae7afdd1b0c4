"""The ingress gateway's CPU per HTTPS request on loopback: ``ambit gateway`` as its own process, no lab, no root.

``.venv/bin/python -m bench.ingress_loopback [--rate R] [--requests N] [--seconds S] [--connections C]
[--protocols http1,http2] [--tls-transport loop|socket] [--profile FILE [--top N]]`` starts:

- the gateway in a child process (:class:`~ambit.waypoint.ingress.IngressGateway`, run as ``ambit gateway`` runs
  it: asyncio's own loop, its own logging, no access log), on loopback addresses of its own, with the workload
  state of a local config file and a local CA (the waypoint harness's way, :mod:`bench.waypoint_loopback`),
  serving the config the control plane would translate (:func:`gateway_config`) for a Gateway of class ``istio``
  with one HTTPS listener (a self-signed certificate for ``*.bench.example`` from a Secret) and an HTTPRoute to
  the Service ``echo``; its upstream HBONE leg on ``--tls-transport`` (the loop's by default, as ``ambit gateway``;
  the client's TLS is terminated on the socket transport either way);
- in this process, the mesh endpoint of ``echo`` (the waypoint harness's HBONE server answering every request with
  1 KiB) and a client: ``--connections`` TLS connections to the listener, with SNI ``echo.bench.example``,
  verifying the gateway's certificate, each carrying keep-alive HTTP/1.1 requests (``http1``, ALPN ``http/1.1``)
  or one HTTP/2 connection (``http2``, ALPN ``h2``), one request at a time per connection, all paced together at
  ``--rate`` requests/s.

Measured on the child over the paced part only, as the waypoint harness measures (its docstring says how to read
the figures): CPU seconds per 1,000 requests (vCPU per 1,000 req/s) from ``/proc``, RSS and peak RSS, the achieved
rate, the client's p50/p99, the wake-ups per request and the load average. ``--profile FILE`` runs the child under
cProfile (CPU time) and writes its stats to ``FILE``; with ``--top N`` the N entries of highest own time are
printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import ipaddress
import json
import os
import pstats
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events

from ambit.controlplane.translate import translate_all
from ambit.identity.localca import LocalCa
from ambit.model.ingress import GatewayConfig
from ambit.model.localconfig import LocalConfig, render_local_config
from ambit.model.workload import AppProtocol, NetworkAddress, PortMapping, Service, TunnelProtocol, Workload
from ambit.tls.certs import issue_server_cert, new_ca
from bench.mesh.probes import cpu_seconds
from bench.server_process import free_port
from bench.waypoint_loopback import (
    ENDPOINT_ID,
    ENDPOINT_IP,
    HEADER,
    TD,
    EchoEndpoint,
    Result,
    memory_mib,
    paced_calls,
    status_field,
    stop_child,
    wait_ready,
)

GATEWAY_IP = "127.0.0.65"
CLIENT_IP = "127.0.0.66"
"""Loopback addresses of their own (the waypoint harness's endpoint, 127.0.0.62, is reused as the mesh's)."""
ECHO_VIP = "198.18.65.1"
SERVER_NAME = "echo.bench.example"
WARMUP_REQUESTS = 200


def mesh_config() -> LocalConfig:
    """The gateway's workload state: the echo Service and its one HBONE workload."""
    echo = Workload(
        uid="Kubernetes//Pod/bench/echo",
        name="echo",
        namespace="bench",
        addresses=(ipaddress.ip_address(ENDPOINT_IP),),
        tunnel_protocol=TunnelProtocol.HBONE,
        service_account="echo",
        canonical_name="echo",
        services={f"bench/echo.bench.svc.{TD}": (PortMapping(80, 8080),)},
    )
    service = Service(
        name="echo",
        namespace="bench",
        hostname=f"echo.bench.svc.{TD}",
        vips=(NetworkAddress("", ipaddress.ip_address(ECHO_VIP)),),
        ports=(PortMapping(80, 8080, AppProtocol.HTTP11),),
    )
    return LocalConfig(workloads=(echo,), services=(service,))


def gateway_config(port: int, cert_pem: bytes, key_pem: bytes) -> GatewayConfig:
    """What the control plane serves the gateway ``bench/edge`` for an HTTPS listener on ``port`` with the
    certificate of Secret ``bench/edge-cert`` and an HTTPRoute to ``echo:80``."""
    import base64

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "edge", "namespace": "bench"},
        "spec": {
            "gatewayClassName": "istio",
            "listeners": [
                {
                    "name": "https",
                    "port": port,
                    "protocol": "HTTPS",
                    "hostname": "*.bench.example",
                    "tls": {"mode": "Terminate", "certificateRefs": [{"name": "edge-cert"}]},
                }
            ],
        },
    }
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "echo", "namespace": "bench"},
        "spec": {"parentRefs": [{"name": "edge"}], "rules": [{"backendRefs": [{"name": "echo", "port": 80}]}]},
    }
    secret = {
        "metadata": {"name": "edge-cert", "namespace": "bench"},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": b64(cert_pem), "tls.key": b64(key_pem)},
    }
    translation = translate_all(
        pods=(),
        services=[
            {
                "metadata": {"name": "echo", "namespace": "bench"},
                "spec": {"clusterIP": ECHO_VIP, "ports": [{"port": 80}]},
            }
        ],
        endpoint_slices=(),
        namespaces=[{"metadata": {"name": "bench"}}],
        gateways=[gateway],
        http_routes=[route],
        secrets=[secret],
    )
    (config,) = translation.gateway_configs
    return config


# --- the gateway child ----------------------------------------------------------------------------------------------


def run_child(spec: dict[str, Any], profile: str | None) -> None:
    """The gateway process: local state and CA, the translated config applied as its xDS client would."""
    from ambit.cli.process_logging import configure_logging
    from ambit.heap import tune_collector
    from ambit.inpod import eventloop
    from ambit.waypoint.settings import WaypointLimits, WaypointSettings

    configure_logging()
    tune_collector()  # as ``run_l7`` does for ``ambit waypoint proxy`` and ``ambit gateway``
    settings = WaypointSettings(
        namespace="bench",
        gateway_name="edge",
        service_account="edge-istio",
        pod_name="edge-istio-0",
        instance_ip=GATEWAY_IP,
        config_file=Path(spec["config"]),
        local_ca_dir=Path(spec["ca"]),
        admin_port=free_port(),
        stats_port=free_port(),
        readiness_port=int(spec["readiness_port"]),
        upstream_hbone_port=int(spec["upstream_port"]),
        limits=WaypointLimits(drain_time=0.0),
        tls_transport="socket" if spec.get("tls_transport") == "socket" else "loop",
    )
    config = gateway_config(int(spec["port"]), Path(spec["cert"]).read_bytes(), Path(spec["key"]).read_bytes())
    profiler = cProfile.Profile(time.process_time) if profile else None
    if profiler is not None:
        profiler.enable()
    try:
        eventloop.run(lambda: _serve(settings, config), "asyncio")  # as ambit.cli.l7_proxy runs the gateway
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)


async def _serve(settings: Any, config: GatewayConfig) -> None:
    from ambit.waypoint.ingress import IngressGateway

    gateway = IngressGateway(settings)
    gateway.apply(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, gateway.stopped.set)
    await gateway.start()
    try:
        await gateway.stopped.wait()
    finally:
        await gateway.aclose()


# --- the client -----------------------------------------------------------------------------------------------------


class Http1Client:
    """Keep-alive GETs on one TLS connection; each answer read up to its content-length."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.request = f"GET /echo HTTP/1.1\r\nhost: {SERVER_NAME}\r\nuser-agent: bench\r\n\r\n".encode()

    async def call(self) -> None:
        self.writer.write(self.request)
        head = (await self.reader.readuntil(b"\r\n\r\n")).lower()
        if not head.startswith(b"http/1.1 200"):
            raise RuntimeError(f"unexpected answer {head[:80]!r}")
        await self.reader.readexactly(content_length(head))


def content_length(head: bytes) -> int:
    """The content-length of a lower-cased response head (0 without one)."""
    at = head.find(b"\r\ncontent-length:")
    return int(head[at + 17 :].split(b"\r\n", 1)[0]) if at >= 0 else 0


class Http2Client:
    """One HTTP/2 connection (ALPN h2), one GET at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.h2.initiate_connection()

    async def call(self) -> None:
        sid = self.h2.get_next_available_stream_id()
        request = [(":method", "GET"), (":scheme", "https"), (":authority", SERVER_NAME), (":path", "/echo")]
        self.h2.send_headers(sid, request, end_stream=True)
        self.writer.write(self.h2.data_to_send())
        while True:
            data = await self.reader.read(65536)
            if not data:
                raise RuntimeError("the gateway closed the connection")
            done = False
            for event in self.h2.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamReset) and event.stream_id == sid:
                    raise RuntimeError("the gateway reset the stream")
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == sid:
                    done = True
            if pending := self.h2.data_to_send():
                self.writer.write(pending)
            if done:
                return


async def drive(
    connect: Callable[[str], Awaitable[Http1Client | Http2Client]], protocol: str, args: argparse.Namespace, pid: int
) -> Result:
    clients = [await connect(protocol) for _ in range(args.connections)]
    for _ in range(WARMUP_REQUESTS // args.connections):
        await asyncio.gather(*(c.call() for c in clients))
    cpu_before, switches_before = cpu_seconds([pid]), status_field(pid, "voluntary_ctxt_switches")
    loop = asyncio.get_running_loop()
    began = loop.time()
    latencies = await paced_calls([c.call for c in clients], args.rate, args.requests, args.seconds)
    cpu = cpu_seconds([pid]) - cpu_before
    wakeups = status_field(pid, "voluntary_ctxt_switches") - switches_before
    seconds = loop.time() - began
    latencies.sort()
    for client in clients:
        client.writer.close()
    return Result(
        protocol="HTTPS HTTP/1.1 keep-alive" if protocol == "http1" else "HTTPS HTTP/2",
        requests=len(latencies),
        seconds=seconds,
        cpu=cpu,
        rss_mib=memory_mib(pid, "VmRSS"),
        peak_mib=memory_mib(pid, "VmHWM"),
        p50_ms=1000 * latencies[len(latencies) // 2] if latencies else 0.0,
        p99_ms=1000 * latencies[int(len(latencies) * 0.99)] if latencies else 0.0,
        load=" ".join(f"{x:.2f}" for x in os.getloadavg()),
        wakeups=wakeups,
    )


async def run(args: argparse.Namespace, directory: Path) -> list[Result]:
    ca = LocalCa(directory / "ca", trust_domain=TD)
    endpoint = EchoEndpoint(await ca.fetch_certificate(ENDPOINT_ID), free_port(ENDPOINT_IP))
    await endpoint.start()
    server_ca = new_ca("ingress bench CA", now=time.time())
    server = issue_server_cert(
        server_ca, common_name=SERVER_NAME, dns_names=["*.bench.example"], ip_addresses=[], now=time.time()
    )
    (directory / "cert.pem").write_bytes(server.cert_pem)
    (directory / "key.pem").write_bytes(server.key_pem)
    config = directory / "mesh.yaml"
    config.write_text(render_local_config(mesh_config()), encoding="utf-8")
    port = free_port(GATEWAY_IP)
    spec = {
        "config": str(config),
        "ca": str(directory / "ca"),
        "cert": str(directory / "cert.pem"),
        "key": str(directory / "key.pem"),
        "port": port,
        "readiness_port": free_port(GATEWAY_IP),
        "upstream_port": endpoint.port,
        "tls_transport": args.tls_transport,
    }
    command = [sys.executable, "-m", "bench.ingress_loopback", "--child", json.dumps(spec)]
    if args.profile:
        command += ["--profile", args.profile]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: ASYNC220

    async def connect(protocol: str) -> Http1Client | Http2Client:
        context = ssl.create_default_context(cadata=server_ca.cert_pem.decode())
        context.set_alpn_protocols(["h2"] if protocol == "http2" else ["http/1.1"])
        reader, writer = await asyncio.open_connection(
            GATEWAY_IP, port, ssl=context, server_hostname=SERVER_NAME, local_addr=(CLIENT_IP, 0)
        )
        chosen = writer.get_extra_info("ssl_object").selected_alpn_protocol()
        if chosen != ("h2" if protocol == "http2" else "http/1.1"):
            raise RuntimeError(f"the gateway chose ALPN {chosen!r}")
        return Http2Client(reader, writer) if protocol == "http2" else Http1Client(reader, writer)

    results: list[Result] = []
    try:
        await asyncio.to_thread(wait_ready, int(spec["readiness_port"]), child, 30.0, GATEWAY_IP)
        for protocol in args.protocols.split(","):
            results.append(await drive(connect, protocol, args, child.pid))
    finally:
        await stop_child(child)
        await endpoint.aclose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=500.0, help="requests per second, over all connections")
    parser.add_argument("--requests", type=int, default=10_000, help="requests per protocol")
    parser.add_argument("--seconds", type=float, default=30.0, help="at most this long per protocol")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--protocols", default="http1,http2")
    parser.add_argument(
        "--tls-transport",
        choices=("loop", "socket"),
        default="loop",
        help="the gateway's upstream HBONE TLS transport (socket: with the native TLS records when they load)",
    )
    parser.add_argument("--profile", help="run the gateway under cProfile, stats to this file")
    parser.add_argument("--top", type=int, default=0, help="with --profile: print the N entries of most own time")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(json.loads(args.child), args.profile)
        return
    if args.profile:
        args.profile = str(Path(args.profile).resolve())
    with tempfile.TemporaryDirectory(prefix="ambit-ingress-bench-") as tmp:
        results = asyncio.run(run(args, Path(tmp)))
    print(f"ingress gateway on loopback: {args.rate:,.0f} req/s paced over {args.connections} TLS connections, 1 KiB")
    print(HEADER)
    for result in results:
        print(result.row())
    if args.profile and args.top:
        pstats.Stats(args.profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
