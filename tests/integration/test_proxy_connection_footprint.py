"""What an idle proxied connection holds, and the accept loop's bookkeeping that replaced its wrapper coroutine.

The node proxy's memory per idle connection (issue 7) is the objects each connection keeps alive: these tests pin
the shapes that keep it small (slotted streams and accounting, shared label objects and principal strings) and
that a connection's task still logs a handler's bug, closes its socket and leaves the pod's task set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import pytest

from ambit.inpod.workloads import PodListenerManager, PodProxy
from ambit.model.identity import SpiffeId
from ambit.proxy.accounting import Accounting, principal, traffic_labels
from ambit.proxy.streams import SocketStream
from ambit.telemetry.accesslog import AccessLog, ConnectionRecord
from ambit.telemetry.metrics import ProxyMetrics, Reporter, TrafficLabels
from ambit.zds.protocol import WorkloadInfo

CLIENT = SpiffeId("cluster.local", "apps", "web")
SERVER = SpiffeId("cluster.local", "apps", "db")


def _labels() -> TrafficLabels:
    return traffic_labels(
        Reporter.SOURCE,
        source=None,
        source_identity=CLIENT,
        destination=None,
        destination_identity=SERVER,
        service=None,
        mtls=True,
    )


def test_equal_identities_give_the_very_same_principal_string() -> None:
    a, b = SpiffeId("cluster.local", "apps", "web"), SpiffeId("cluster.local", "apps", "web")
    assert principal(a) == str(a)
    assert principal(a) is principal(b)


def test_connections_with_equal_labels_share_one_labels_object_and_one_key() -> None:
    metrics = ProxyMetrics()
    first, second = _labels(), _labels()
    assert first == second and first is not second
    log = AccessLog()
    record = ConnectionRecord("outbound", "a", "b")
    accountings = [Accounting(metrics, log, labels, record) for labels in (first, second)]
    for accounting in accountings:
        accounting.opened()
    assert accountings[0]._labels is accountings[1]._labels
    assert accountings[0]._handle is not None and accountings[1]._handle is not None
    assert accountings[0]._handle._key is accountings[1]._handle._key
    for accounting in accountings:
        accounting.finish()
    assert b"istio_tcp_connections_closed_total{" in metrics.render()


async def test_socket_streams_and_accounting_have_no_instance_dict() -> None:
    left, right = socket.socketpair()
    stream = SocketStream(left)
    try:
        assert not hasattr(stream, "__dict__")
        assert stream.flushed and stream.buffered == 0
        accounting = Accounting(ProxyMetrics(), AccessLog(), _labels(), ConnectionRecord("outbound", "a", "b"))
        assert not hasattr(accounting, "__dict__")
    finally:
        await stream.aclose()
        right.close()


async def test_a_failing_handler_is_logged_its_socket_closed_and_its_task_forgotten(
    caplog: pytest.LogCaptureFixture,
) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    accepted: list[socket.socket] = []

    async def handler(conn: socket.socket, ticket: object = None) -> None:
        accepted.append(conn)
        raise RuntimeError("handler bug")

    pod = PodProxy("uid-1", WorkloadInfo("web-0", "apps", "web"))
    accepting = asyncio.create_task(PodListenerManager._accept_loop(pod, listener, handler))
    client = socket.socket()
    client.setblocking(False)
    try:
        with caplog.at_level(logging.ERROR, logger="ambit.inpod.workloads"):
            await asyncio.get_running_loop().sock_connect(client, listener.getsockname())
            async with asyncio.timeout(5):
                assert await asyncio.get_running_loop().sock_recv(client, 1) == b""  # closed by the proxy
        assert not pod.connections  # forgotten by the same done callback that closed the socket
        assert accepted and accepted[0].fileno() == -1
        assert any("connection handler failed" in r.getMessage() and r.exc_info for r in caplog.records)
    finally:
        accepting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await accepting
        client.close()
        listener.close()
