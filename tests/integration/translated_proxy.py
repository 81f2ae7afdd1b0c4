"""A node proxy fed by the control plane's translation of API objects (shared by the ServiceEntry tests).

:func:`translated_proxy` builds one node proxy serving pod ``apps/client-0`` (at :data:`CLIENT_IP`), whose hostname
endpoints are resolved through a scripted DNS server on loopback. :meth:`TranslatedProxy.apply` translates API
objects (:func:`ambit.controlplane.translate.translate_all`), sends every Address over its wire form (encoded and
decoded as an xDS client reads it) and makes that, plus the client pod, the proxy's state; :meth:`TranslatedProxy.call`
carries one connection the pod opens through the outbound handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.dns_upstream import HOST, Behaviour, ScriptedDns, scripted_dns
from tests.integration.fake_waypoint import call_outbound
from tests.unit.workload_builders import pod

from ambit.controlplane.translate import translate_all
from ambit.identity.localca import LocalCa
from ambit.identity.manager import CertificateManager
from ambit.model.state import WorkloadState
from ambit.model.workload import Service, Workload
from ambit.proxy.context import LocalPod, ProxyContext
from ambit.proxy.hostnames import HostnameResolver, upstream_lookup
from ambit.proxy.pool import ConnectionPool
from ambit.proxy.settings import ProxySettings
from ambit.proxy.sockets import HostSocketFactory
from ambit.telemetry.accesslog import AccessLog
from ambit.telemetry.metrics import ProxyMetrics
from ambit.xds.convert import address_of, decode_address, pack_address, resource_name
from ambit.zds.protocol import WorkloadInfo

TD = "cluster.local"
CLIENT_IP = "127.0.0.31"


def over_the_wire(items: tuple[Workload | Service, ...]) -> list[Workload | Service]:
    """Each item as a node proxy's xDS client decodes it."""
    return [decode_address(resource_name(address_of(i)), pack_address(address_of(i))) for i in items]


@dataclass
class TranslatedProxy:
    ctx: ProxyContext
    pod: LocalPod
    dns: ScriptedDns

    def apply(self, objects: Mapping[str, list[dict[str, Any]]]) -> list[Workload | Service]:
        """Translate ``objects`` (keyword arguments of ``translate_all``) into the proxy's state; the items sent."""
        translation = translate_all([], [], [], [], **objects)
        items = over_the_wire((*translation.config.workloads, *translation.config.services))
        client = pod("client-0", CLIENT_IP, services={}, service_account="client")
        self.ctx.state.replace_all(
            [client, *(i for i in items if isinstance(i, Workload))], [i for i in items if isinstance(i, Service)]
        )
        self.ctx.state_changed()
        return items

    async def call(self, dst: tuple[str, int], payload: bytes) -> bytes:
        """What the pod gets back from a connection to ``dst`` (b"" if reset)."""
        return await call_outbound(self.ctx, self.pod, CLIENT_IP, dst, payload)


@contextlib.asynccontextmanager
async def translated_proxy(
    tmp_path: Path, script: dict[str, Behaviour] | None = None
) -> AsyncIterator[TranslatedProxy]:
    async with scripted_dns(script or {}, ttl=30) as dns:
        ctx = ProxyContext(
            settings=ProxySettings(node="node1", trust_domain=TD),
            state=WorkloadState(),
            certs=CertificateManager(LocalCa(tmp_path / "ca", trust_domain=TD)),
            pool=ConnectionPool(),
            metrics=ProxyMetrics(),
            access_log=AccessLog(logger=logging.getLogger("tests.translated_proxy.access")),
            hostnames=HostnameResolver(
                upstream_lookup((HOST,), port=dns.port, timeout=2.0), clock=asyncio.get_running_loop().time
            ),
        )
        local = LocalPod("uid-client", WorkloadInfo("client-0", "apps", "client"), HostSocketFactory(mark=None), TD)
        ctx.add_pod(local)
        try:
            yield TranslatedProxy(ctx, local, dns)
        finally:
            await ctx.pool.aclose()
            await ctx.certs.aclose()


@contextlib.asynccontextmanager
async def tcp_echo(host: str, prefix: bytes) -> AsyncIterator[tuple[int, list[str]]]:
    """A one-shot TCP server on ``host`` answering ``prefix`` + what it read: its port and the peers it saw."""
    seen: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(str(writer.get_extra_info("peername")[0]))
        writer.write(prefix + await reader.read(1024))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, host, 0)
    try:
        yield server.sockets[0].getsockname()[1], seen
    finally:
        server.close()
        await server.wait_closed()
