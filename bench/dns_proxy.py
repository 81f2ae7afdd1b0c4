"""The DNS proxy under test, as the benchmark's child process: one pod's :class:`~ambit.dns.server.DnsServer`.

``python -m bench.dns_proxy --listen 127.0.0.1:15053 --upstream 198.18.253.53:53 --services N --namespaces M``
builds what a node proxy builds for one enrolled pod (``ambit.inpod.workloads``: the workload state as the pod's
service view, a :class:`~ambit.dns.forwarder.Forwarder` with host sockets, the node proxy's metrics, default
:class:`~ambit.dns.server.DnsServerSettings`), fills the state with :func:`mesh_services`, binds the UDP listener
and runs on uvloop (the node proxy's default loop) until SIGTERM or SIGINT. Its stdout carries one line,
``ready udp HOST:PORT``; on the way out its DNS counters go to stderr. The client is a pod in namespace ``ns-0``.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import signal
import socket
import sys

from ambit.dns.answer import DnsClient
from ambit.dns.forwarder import Forwarder
from ambit.dns.server import DnsServer
from ambit.dns.settings import Upstream
from ambit.inpod import eventloop
from ambit.model.state import WorkloadState
from ambit.model.workload import NetworkAddress, PortMapping, Service
from ambit.proxy.sockets import HostSocketFactory
from ambit.telemetry.metrics import ProxyMetrics

CLIENT = DnsClient("ns-0", "", "bench-client")
FIRST_VIP = ipaddress.IPv4Address("198.19.0.0")


def mesh_name(index: int, namespaces: int) -> str:
    """The FQDN of the ``index``-th mesh Service (``svc-I.ns-J.svc.cluster.local``)."""
    return f"svc-{index}.ns-{index % namespaces}.svc.cluster.local"


def mesh_vip(index: int) -> str:
    return str(FIRST_VIP + index)


def mesh_services(count: int, namespaces: int) -> list[Service]:
    """``count`` Kubernetes Services spread over ``namespaces`` namespaces, one VIP each (canonical, as istiod)."""
    return [
        Service(
            name=f"svc-{i}",
            namespace=f"ns-{i % namespaces}",
            hostname=mesh_name(i, namespaces),
            vips=(NetworkAddress("", ipaddress.ip_address(mesh_vip(i))),),
            ports=(PortMapping(80, 8080),),
            canonical=True,
        )
        for i in range(count)
    ]


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    try:
        ipaddress.ip_address(host)
        return host, int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected IP:PORT, not {text!r}") from None


async def serve(listen: tuple[str, int], upstream: tuple[str, int], services: int, namespaces: int) -> None:
    state = WorkloadState()
    state.replace_all([], mesh_services(services, namespaces))
    where = Upstream((upstream[0],), timeout=2.0, attempts=1, port=upstream[1])

    async def find_upstream() -> Upstream:
        return where

    # No SO_MARK: nothing here redirects the proxy's own queries (a pod's capture rules would).
    metrics = ProxyMetrics()
    server = DnsServer(state, lambda: CLIENT, Forwarder(HostSocketFactory(mark=None)), find_upstream, metrics)
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(listen)
    sock.setblocking(False)
    transport, _ = await loop.create_datagram_endpoint(server.datagram_protocol, sock=sock)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    host, port = sock.getsockname()[:2]
    print(f"ready udp {host}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        transport.close()
        await server.aclose()
        counters = [line for line in metrics.render().decode().splitlines() if _is_dns_counter(line)]
        print("\n".join(counters), file=sys.stderr, flush=True)


def _is_dns_counter(line: str) -> bool:
    return "dns" in line and not line.startswith("#") and "_bucket" not in line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dns_proxy", description=__doc__.split("\n")[0])
    parser.add_argument("--listen", type=_host_port, required=True, help="IP:PORT of the UDP listener")
    parser.add_argument("--upstream", type=_host_port, required=True, help="IP:PORT of the resolver to forward to")
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--event-loop", choices=eventloop.EVENT_LOOPS, default="uvloop")
    args = parser.parse_args(argv)
    try:
        eventloop.run(lambda: serve(args.listen, args.upstream, args.services, args.namespaces), args.event_loop)
    except (OSError, eventloop.EventLoopError) as exc:
        print(f"bench.dns_proxy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
