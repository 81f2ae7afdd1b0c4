"""``kubectl port-forward``: the real kubectl against the embedded API server, which relays ``pods/portforward`` to a
kubelet server on a unix socket (:mod:`ambit.lab.runtime.kubelet_server`) whose pods' localhost is this machine's
(:class:`~ambit.lab.runtime.port_forward.LocalDialer`, mapping the pod's port 80 to a real listener)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import ssl
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from tests.integration.kubelet_fakes import FakePods, NoExec, short_directory
from tests.integration.spdy_client import ForwardClient

from ambit.apiserver.limits import LimitSettings
from ambit.apiserver.server import ApiServer, ApiServerSettings
from ambit.k8s import KubeClient, kinds
from ambit.k8s.portforward import WEBSOCKET_PROTOCOL
from ambit.lab.runtime.kubelet_server import KubeletServer
from ambit.lab.runtime.port_forward import LocalDialer

pytestmark = pytest.mark.kubectl

FORWARDS_PER_USER = 3
ROLE_BINDINGS = kinds.ResourceKind("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")


async def _http_hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The pod's HTTP port: one response per connection, naming the path asked for."""
    request = await reader.readuntil(b"\r\n\r\n")
    path = request.split(b" ")[1]
    body = b"hello from the pod at " + path + b"\n"
    writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    writer.close()


@dataclass
class Rig:
    kube: KubeClient
    config: Path
    pods: FakePods
    server: ApiServer

    async def pod(self, name: str, labels: Mapping[str, str] | None = None, phase: str = "Running") -> dict[str, Any]:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": dict(labels or {})},
            "spec": {
                "nodeName": "node-a",
                "containers": [{"name": "web", "image": "registry.example/web:1", "ports": [{"containerPort": 80}]}],
            },
        }
        await self.kube.create(kinds.PODS, body, "default")
        running = [{"name": "web", "ready": True, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]
        status = {"phase": phase, "containerStatuses": running}
        pod = await self.kube.patch_status(kinds.PODS, name, {"status": status}, "default")
        self.pods.pods[("default", name)] = pod
        return pod

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.server.settings.data_dir / "pki" / "ca.crt"))


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    with short_directory("kf") as path:
        yield path


@pytest.fixture
async def rig(tmp_path: Path, socket_dir: Path) -> AsyncIterator[Rig]:
    limits = LimitSettings(max_pod_streams_per_user=FORWARDS_PER_USER)
    settings = ApiServerSettings(data_dir=tmp_path / "apiserver", port=0, kubelet_socket_dir=socket_dir, limits=limits)
    server = ApiServer(settings)
    await server.start()
    web_server = await asyncio.start_server(_http_hello, "127.0.0.1", 0)
    pods = FakePods()
    dialer = LocalDialer({80: web_server.sockets[0].getsockname()[1]})
    kubelet = KubeletServer(pods, NoExec(), lambda uid, c: tmp_path / "logs", dialer=dialer)
    await kubelet.serve(socket_dir / "node-a" / "kubelet.sock")
    try:
        async with KubeClient.from_kubeconfig(server.kubeconfig) as kube:
            yield Rig(kube, server.kubeconfig, pods, server)
    finally:
        await kubelet.aclose()
        web_server.close()
        await server.aclose()


@contextlib.asynccontextmanager
async def port_forward(rig: Rig, *args: str) -> AsyncIterator[int]:
    """``kubectl port-forward ARGS`` running; yields the local port it reports for the first forward."""
    env = dict(os.environ, KUBECONFIG=str(rig.config), KUBECACHEDIR=str(rig.config.parent / "kubecache"))
    proc = await asyncio.create_subprocess_exec(
        "kubectl", "port-forward", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        found = re.match(r"Forwarding from 127\.0\.0\.1:(\d+) ->", line)
        if found is None:
            raise AssertionError(f"kubectl said {line!r}: {(await proc.stderr.read()).decode()}")
        yield int(found.group(1))
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        await proc.wait()


async def http_get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    response = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    return response


async def test_kubectl_port_forward_to_a_pod_carries_http_both_ways(rig: Rig) -> None:
    await rig.pod("web")
    async with port_forward(rig, "pod/web", ":80") as local:
        for path in ("/one", "/two"):  # two connections over one session
            response = await http_get(local, path)
            assert response.startswith(b"HTTP/1.0 200 OK")
            assert response.endswith(b"hello from the pod at " + path.encode() + b"\n")


async def test_kubectl_port_forward_to_a_service_reaches_one_of_its_pods(rig: Rig) -> None:
    await rig.pod("web-1", labels={"app": "web"})
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 8080, "targetPort": 80}]},
    }
    await rig.kube.create(kinds.SERVICES, service, "default")
    async with port_forward(rig, "svc/web", ":8080") as local:
        assert (await http_get(local, "/svc")).endswith(b"hello from the pod at /svc\n")


async def test_kubectl_port_forward_to_a_port_nobody_listens_on_reports_kubes_error(rig: Rig) -> None:
    await rig.pod("web")
    env = dict(os.environ, KUBECONFIG=str(rig.config), KUBECACHEDIR=str(rig.config.parent / "kubecache"))
    proc = await asyncio.create_subprocess_exec(
        "kubectl",
        "port-forward",
        "pod/web",
        ":1",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        local = int(re.findall(r"127\.0\.0\.1:(\d+)", line)[0])
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(http_get(local, "/"), 10)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)  # kubectl 1.32 gives up on the pod after a forward's error
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        err = (await proc.stderr.read()).decode()
        await proc.wait()
    assert "error forwarding port 1 to pod " in err
    assert "failed to connect to localhost:1 inside namespace" in err


async def test_port_forward_is_refused_for_a_pod_that_is_not_running_or_has_no_node(rig: Rig) -> None:
    await rig.pod("done", phase="Succeeded")
    await rig.kube.create(
        kinds.PODS, {"metadata": {"name": "pending"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}, "default"
    )
    async with aiohttp.ClientSession() as session:
        for name, message in (
            ("done", "unable to forward port because pod is not running. Current status=Succeeded"),
            ("pending", "pod pending does not have a host assigned"),
        ):
            async with session.post(
                f"{rig.server.url}/api/v1/namespaces/default/pods/{name}/portforward",
                headers={"Authorization": f"Bearer {rig.server.admin_token}"},
                ssl=rig.context(),
            ) as reply:
                assert reply.status == 400
                assert (await reply.json())["message"] == message


async def _user_token(rig: Rig, name: str) -> str:
    await rig.kube.create(kinds.SERVICE_ACCOUNTS, {"metadata": {"name": name}}, "default")
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{name}-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}],
    }
    await rig.kube.create(ROLE_BINDINGS, binding, "default")
    reply = await rig.kube.create_token("default", name, ())
    return str(reply["status"]["token"])


async def test_a_user_holds_a_bounded_number_of_port_forwards(rig: Rig) -> None:
    await rig.pod("web")
    token = await _user_token(rig, "forwarder")
    url = f"{rig.server.url}/api/v1/namespaces/default/pods/web/portforward"
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as session:

        async def forward() -> aiohttp.ClientWebSocketResponse:
            return await session.ws_connect(url, protocols=(WEBSOCKET_PROTOCOL,), headers=headers, ssl=rig.context())

        held = [await forward() for _ in range(FORWARDS_PER_USER)]
        flood = await asyncio.gather(*(forward() for _ in range(20)), return_exceptions=True)
        assert all(isinstance(r, aiohttp.WSServerHandshakeError) and r.status == 429 for r in flood), flood
        # The held sessions work, and one ending frees its place.
        client = ForwardClient(held[0])
        _, data = await client.forward(80, "0")
        await client.send(data, b"GET /held HTTP/1.0\r\n\r\n", fin=True)
        assert (await client.until_ended(data)).endswith(b"hello from the pod at /held\n")
        await held[0].close()
        deadline = asyncio.get_running_loop().time() + 30  # the server sees the session end, then frees its place
        while True:
            with contextlib.suppress(aiohttp.WSServerHandshakeError):
                held[0] = await forward()
                break
            assert asyncio.get_running_loop().time() < deadline, "the ended session was never given back"
            await asyncio.sleep(0.1)
        assert not held[0].closed
        for ws in held:
            await ws.close()
