"""The node proxy's inbound side on loopback, for one pod: HBONE (``serve_hbone``) and plaintext (``serve_plaintext``).

:func:`inbound_proxy` serves pod ``apps/web`` at :data:`POD_IP` (a loopback address, so no namespace is needed):
one HBONE listener and one plaintext listener, each handing accepted sockets to the real handlers of
:mod:`ambit.proxy.inbound` with a real :class:`ProxyContext`. The pod's application is whatever the test listens
with on ``POD_IP``.

Without in-pod redirection rules there is no original destination on the plaintext listener, so the rig stands in
for the kernel's REDIRECT: ``plaintext_target`` is what ``original_dst`` reports for every plaintext connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from tests.unit.workload_builders import pod, state_with

from ambit.identity.localca import LocalCa
from ambit.identity.manager import CertificateManager
from ambit.model.identity import SpiffeId
from ambit.model.workload import Workload
from ambit.proxy import inbound as inbound_module
from ambit.proxy.context import LocalPod, ProxyContext
from ambit.proxy.inbound import serve_hbone, serve_plaintext
from ambit.proxy.pool import ConnectionPool
from ambit.proxy.settings import ProxySettings
from ambit.proxy.sockets import HostSocketFactory
from ambit.telemetry.accesslog import AccessLog
from ambit.telemetry.metrics import ProxyMetrics
from ambit.zds.protocol import WorkloadInfo

TD = "cluster.local"
POD_IP = "127.0.0.2"
SERVER = SpiffeId(TD, "apps", "web")
FACTORY = HostSocketFactory(mark=None)
ACCESS_LOGGER = "tests.inbound_rig.access"


@dataclass
class InboundProxy:
    ctx: ProxyContext
    ca: LocalCa
    workload: Workload
    hbone: tuple[str, int]
    plaintext: tuple[str, int]
    aclose: Callable[[], Awaitable[None]]


def _listen() -> socket.socket:
    listener = socket.create_server((POD_IP, 0))
    listener.setblocking(False)
    return listener


@contextlib.asynccontextmanager
async def inbound_proxy(
    tmp_path: Path, workload: Workload | None = None, *, plaintext_target: tuple[str, int] | None = None
) -> AsyncIterator[InboundProxy]:
    """Serve pod ``apps/web`` at ``POD_IP``; the access log goes to logger :data:`ACCESS_LOGGER`."""
    ca = LocalCa(tmp_path / "ca", trust_domain=TD)
    web = workload or pod("web", POD_IP, service_account="web", node="node-1")
    ctx = ProxyContext(
        settings=ProxySettings(node="node-1", trust_domain=TD),
        state=state_with(web),
        certs=CertificateManager(ca),
        pool=ConnectionPool(),
        metrics=ProxyMetrics(),
        access_log=AccessLog(logger=logging.getLogger(ACCESS_LOGGER)),
    )
    local = LocalPod("uid-web", WorkloadInfo("web", "apps", "web"), FACTORY, TD)
    ctx.add_pod(local)
    hbone, plaintext = _listen(), _listen()
    serving: set[asyncio.Task[object]] = set()

    async def accept(listener: socket.socket, serve: Callable[[socket.socket], Awaitable[object]]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(listener)
            task: asyncio.Task[object] = asyncio.create_task(serve(sock))  # type: ignore[arg-type]
            serving.add(task)
            task.add_done_callback(serving.discard)

    accepting = [
        asyncio.create_task(accept(hbone, lambda s: serve_hbone(ctx, local, s))),
        asyncio.create_task(accept(plaintext, lambda s: serve_plaintext(ctx, local, s))),
    ]
    closed = False

    async def aclose() -> None:
        nonlocal closed
        if closed:
            return
        closed = True
        for task in [*accepting, *serving]:
            task.cancel()
        await asyncio.gather(*accepting, *serving, return_exceptions=True)
        ctx.guards.close_all("the test is over")
        hbone.close()
        plaintext.close()
        await ctx.pool.aclose()
        await ctx.certs.aclose()

    redirect = (
        mock.patch.object(inbound_module, "original_dst", lambda sock: plaintext_target)
        if plaintext_target is not None
        else contextlib.nullcontext()
    )
    try:
        with redirect:
            yield InboundProxy(ctx, ca, web, hbone.getsockname()[:2], plaintext.getsockname()[:2], aclose)
    finally:
        await aclose()
