"""The control-plane rig: a real API server, a client of it, the real control plane, and raw delta ADS streams.

The API server is ``server_process`` (tests/conftest.py: a subprocess per module, the CRDs installed). The fixtures
here are made available to the integration tests by tests/integration/conftest.py; a module that needs other
settings defines its own ``plane_options`` fixture (keyword arguments of
:class:`~ambit.controlplane.process.ControlPlaneSettings`, over the rig's: xDS on an ephemeral loopback port, no
webhook, 50 ms debounce). A test that wants to see what the control plane pushes opens :func:`delta_stream` with a
real service-account token: a raw gRPC client that ACKs every response after handing it to the test;
:func:`subscribe` is one such stream recording one type in a :class:`Subscription`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import re
import secrets
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import grpc  # type: ignore[import-untyped]
import pytest
from google.protobuf import any_pb2
from tests.harness import ServerProcess

from ambit.api import discovery_pb2 as dpb
from ambit.controlplane.process import ControlPlane, ControlPlaneSettings
from ambit.k8s import KubeAlreadyExistsError, KubeClient, KubeNotFoundError, kinds

SERVER_NAME = "istiod.istio-system.svc"
"""The name the control plane's xDS certificate is issued for."""
MESH_ACCOUNTS = ("ztunnel", "istiod")
"""Service accounts in istio-system that the rig creates: the node proxy's and the control plane's."""
T = TypeVar("T")
ADS_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"


async def eventually(predicate: Callable[[], Awaitable[Any] | Any], within: float = 20.0) -> Any:
    """The first truthy value of ``predicate`` (a plain or an async callable), polled every 50 ms."""
    async with asyncio.timeout(within):
        while True:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            await asyncio.sleep(0.05)


async def make_pod(kube: KubeClient, namespace: str, name: str, ip: str, labels: dict[str, str]) -> None:
    """A running, ready pod on node-1 with ``ip``, as the kubelet would report it."""
    pod = {
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "app"}]},
    }
    await kube.create(kinds.PODS, pod)
    status = {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}
    await kube.patch_status(kinds.PODS, name, {"status": status}, namespace=namespace)


async def account_token(kube: KubeClient, namespace: str, account: str) -> str:
    """A token of ``namespace/account`` for the control plane's audience (the account is created if missing)."""
    with contextlib.suppress(KubeAlreadyExistsError):
        await kube.create(kinds.SERVICE_ACCOUNTS, {"metadata": {"name": account, "namespace": namespace}}, namespace)
    token: str = (await kube.create_token(namespace, account, ["istio-ca"]))["status"]["token"]
    return token


@pytest.fixture
async def kube(server_process: ServerProcess) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(server_process.kubeconfig) as client:
        yield client


@pytest.fixture
async def namespace(kube: KubeClient) -> AsyncIterator[str]:
    """A fresh namespace for one test, deleted after it."""
    name = f"ns-{secrets.token_hex(3)}"
    await kube.create(kinds.NAMESPACES, {"metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(KubeNotFoundError):
            await kube.delete(kinds.NAMESPACES, name)


@pytest.fixture
def plane_options() -> dict[str, Any]:
    """ControlPlaneSettings fields over the rig's; a module overrides this fixture to change them."""
    return {}


@pytest.fixture
async def plane(
    kube: KubeClient, server_process: ServerProcess, plane_options: dict[str, Any]
) -> AsyncIterator[ControlPlane]:
    with contextlib.suppress(KubeAlreadyExistsError):
        await kube.create(kinds.NAMESPACES, {"metadata": {"name": "istio-system"}})
    for account in MESH_ACCOUNTS:
        with contextlib.suppress(KubeAlreadyExistsError):
            await kube.create(kinds.SERVICE_ACCOUNTS, {"metadata": {"name": account, "namespace": "istio-system"}})
    options: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "webhook_port": None, "debounce": 0.05}
    settings = ControlPlaneSettings(kubeconfig=server_process.kubeconfig, **(options | plane_options))
    control_plane = ControlPlane(settings, kube)
    await control_plane.start()
    try:
        yield control_plane
    finally:
        await control_plane.aclose()


@contextlib.asynccontextmanager
async def control_plane_process(
    kubeconfig: Path, directory: Path, *args: str, env: Mapping[str, str] = {}
) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    """A real ``ambit controlplane`` process (xDS and CA on an ephemeral loopback port, no waypoint deployment, ``args``
    added) and that port, its log in ``directory/controlplane.log`` (printed at the end); terminated on exit."""
    log_path = directory / "controlplane.log"
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT, 0o644)  # closed once the child has it
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ambit.cli", "controlplane",
        "--kubeconfig", str(kubeconfig),
        "--listen", "127.0.0.1:0",
        "--no-deploy-waypoints",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
    )  # fmt: skip
    os.close(log)
    assert process.stdout is not None
    try:
        async with asyncio.timeout(60):
            line = (await process.stdout.readline()).decode()
        match = re.search(r"ready on port (\d+)", line)
        assert match, f"the control plane did not start: {line!r}\n{log_path.read_text()[-3000:]}"
        yield process, int(match.group(1))
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(20):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
        print(log_path.read_text()[-4000:])


@contextlib.asynccontextmanager
async def delta_stream(
    plane: ControlPlane,
    token: str,
    requests: Sequence[dpb.DeltaDiscoveryRequest],
    on_response: Callable[[dpb.DeltaDiscoveryResponse], None] = lambda response: None,
) -> AsyncIterator[None]:
    """A delta ADS stream to ``plane`` with ``token``: sends ``requests``, then hands every response to
    ``on_response`` and ACKs it, until the block ends."""
    assert plane.root is not None and plane.server is not None
    credentials = grpc.ssl_channel_credentials(root_certificates=plane.root.root_pem)
    options = [("grpc.ssl_target_name_override", SERVER_NAME)]
    async with grpc.aio.secure_channel(f"127.0.0.1:{plane.server.port}", credentials, options) as channel:
        call = channel.stream_stream(
            ADS_METHOD,
            request_serializer=dpb.DeltaDiscoveryRequest.SerializeToString,
            response_deserializer=dpb.DeltaDiscoveryResponse.FromString,
        )(metadata=(("authorization", f"Bearer {token}"), ("clusterid", "Kubernetes")))
        for request in requests:
            await call.write(request)

        async def read() -> None:
            while (response := await call.read()) is not grpc.aio.EOF:
                on_response(response)
                await call.write(dpb.DeltaDiscoveryRequest(type_url=response.type_url, response_nonce=response.nonce))

        reader = asyncio.create_task(read(), name="delta ADS reader")
        try:
            yield
        finally:
            call.cancel()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)


@dataclass
class Subscription(Generic[T]):
    """What one stream was sent of ``type_url``: the latest body per name, every name sent or removed, in order."""

    type_url: str
    decode: Callable[[str, any_pb2.Any], T]
    held: dict[str, any_pb2.Any] = field(default_factory=dict)
    sent: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    responses: int = 0
    """Responses of ``type_url``."""
    others: int = 0
    """Responses of the other types the stream asked for."""

    def config(self, name: str) -> T | None:
        body = self.held.get(name)
        return None if body is None else self.decode(name, body)

    def record(self, response: dpb.DeltaDiscoveryResponse) -> None:
        if response.type_url != self.type_url:
            self.others += 1
            return
        for resource in response.resources:
            self.held[resource.name] = resource.resource
            self.sent.append(resource.name)
        for name in response.removed_resources:
            self.held.pop(name, None)
            self.removed.append(name)
        self.responses += 1


@contextlib.asynccontextmanager
async def subscribe(
    kube: KubeClient,
    plane: ControlPlane,
    account: tuple[str, str],
    subscription: Subscription[T],
    names: list[str],
    *,
    also: Sequence[str] = (),
) -> AsyncIterator[Subscription[T]]:
    """A stream as ``(namespace, account)`` that opens the wildcard types ``also``, then ``subscription``'s type
    for ``names``; entered once the first response of each has been recorded."""
    token = await account_token(kube, *account)
    requests = [dpb.DeltaDiscoveryRequest(type_url=t) for t in also]
    requests.append(dpb.DeltaDiscoveryRequest(type_url=subscription.type_url, resource_names_subscribe=names))
    async with delta_stream(plane, token, requests, subscription.record):
        await eventually(lambda: subscription.responses >= 1 and subscription.others >= len(also))
        yield subscription
