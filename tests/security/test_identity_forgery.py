"""Nobody becomes somebody else: the identity attacks of issue 14 replayed against the real API server (in this
process), the real gRPC CA over loopback TLS and the real node agent's plugin-event socket, each refused.

- TokenRequest: a token bound to a pod of another service account (400, kube's message); a token for 2^32 s
  (granted 48 h, and the answer says so).
- The CA: one caller's flood (RESOURCE_EXHAUSTED beyond a burst of 50 at 10/s: at most 50 + 10/s x elapsed
  signed); a 3.9 MB CSR (gRPC's 1 MiB receive limit: never handed to the service) and a 100 KiB one
  (INVALID_ARGUMENT before parsing: the signer is never called); impersonation by a ``ztunnel`` account in a
  workload namespace, with its pod on the victim's node (UNAUTHENTICATED).
- The node agent (root: real namespaces): ``/cmdadd`` for a pod on another node and with the host's netns path
  (403, nothing enrolled), while the pod's own sandbox is accepted.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc  # type: ignore[import-untyped]
import grpc.aio  # type: ignore[import-untyped]
import pytest
from google.protobuf import struct_pb2

from ambit.api import ca_pb2
from ambit.apiserver.server import ApiServer
from ambit.cni.agent import NodeAgent, NodeAgentSettings
from ambit.cni.enrolment import EnrolmentManager, EnrolmentSettings
from ambit.commands import RecordingRunner
from ambit.controlplane.ca.authn import KubeAuthenticator
from ambit.controlplane.ca.nodeauth import InformerPodIndex, NodeAuthorizer
from ambit.controlplane.ca.root import load_or_create_root_secret
from ambit.controlplane.ca.server import GRPC_SERVER_OPTIONS, METHOD_PATH, CaService, RootSigner
from ambit.k8s import EventRecorder, EventRecorderSettings, KubeBadRequestError, KubeClient, kinds
from ambit.model.identity import SpiffeId
from ambit.tls.certs import issue_server_cert
from ambit.tls.spiffe import make_csr

TD = "cluster.local"
NODE = "node-1"


def pod(name: str, namespace: str, sa: str, node: str = NODE) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"serviceAccountName": sa, "nodeName": node, "containers": [{"name": "c", "image": "x"}]},
    }


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as client:
        for ns in ("istio-system", "apps", "prod"):
            await client.create(kinds.NAMESPACES, {"metadata": {"name": ns}})
        for ns, sa in (("istio-system", "ztunnel"), ("apps", "ztunnel"), ("apps", "app"), ("prod", "backend")):
            await client.create(kinds.SERVICE_ACCOUNTS, {"metadata": {"name": sa, "namespace": ns}})
        for node in (NODE, "node-2"):
            await client.create(kinds.NODES, {"metadata": {"name": node}})
        await client.create(kinds.PODS, pod("ztunnel-1", "istio-system", "ztunnel"))
        await client.create(kinds.PODS, pod("backend-1", "prod", "backend"))
        await client.create(kinds.PODS, pod("app-1", "apps", "app"))
        yield client


async def bound_token(kube: KubeClient, namespace: str, name: str, audience: str = "istio-ca") -> str:
    obj = await kube.get(kinds.PODS, name, namespace)
    answer = await kube.create_token(namespace, obj["spec"]["serviceAccountName"], [audience], bound_pod=obj)
    return str(answer["status"]["token"])


# -- TokenRequest -----------------------------------------------------------------------------------------------


async def test_a_token_bound_to_a_pod_of_another_service_account_is_refused(kube: KubeClient) -> None:
    app = await kube.get(kinds.PODS, "app-1", "apps")
    with pytest.raises(KubeBadRequestError, match="to pod running with different serviceaccount name"):
        await kube.create_token("apps", "ztunnel", ["istio-ca"], bound_pod=app)  # apps/ztunnel, pod runs as app
    ztunnel = await kube.get(kinds.PODS, "ztunnel-1", "istio-system")
    with pytest.raises(KubeBadRequestError, match="to pod running with different serviceaccount name"):
        await kube.create_token("istio-system", "default", ["istio-ca"], bound_pod=ztunnel)


async def test_a_token_for_two_to_the_32_seconds_is_granted_48_hours(kube: KubeClient) -> None:
    answer = await kube.create_token("apps", "app", ["istio-ca"], expiration_seconds=2**32)
    assert answer["spec"]["expirationSeconds"] == 48 * 3600
    payload = answer["status"]["token"].split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["exp"] - claims["iat"] == 48 * 3600


# -- the CA -----------------------------------------------------------------------------------------------------


class CountingSigner:
    def __init__(self, inner: RootSigner) -> None:
        self.inner = inner
        self.calls = 0

    def sign(self, csr_pem: bytes, identity: SpiffeId, ttl_seconds: int) -> list[bytes]:
        self.calls += 1
        return self.inner.sign(csr_pem, identity, ttl_seconds)


@dataclass
class Ca:
    address: str
    root_pem: bytes
    signer: CountingSigner

    async def call(
        self, token: str, csr: str, *, impersonate: str | None = None
    ) -> ca_pb2.IstioCertificateResponse | grpc.aio.AioRpcError:
        request = ca_pb2.IstioCertificateRequest(csr=csr)
        if impersonate:
            request.metadata.CopyFrom(
                struct_pb2.Struct(fields={"ImpersonatedIdentity": struct_pb2.Value(string_value=impersonate)})
            )
        async with grpc.aio.secure_channel(self.address, grpc.ssl_channel_credentials(self.root_pem)) as channel:
            method = channel.unary_unary(
                METHOD_PATH,
                request_serializer=ca_pb2.IstioCertificateRequest.SerializeToString,
                response_deserializer=ca_pb2.IstioCertificateResponse.FromString,
            )
            try:
                return await method(request, metadata=(("authorization", f"Bearer {token}"),), timeout=20)
            except grpc.aio.AioRpcError as exc:
                return exc


@pytest.fixture
async def ca(kube: KubeClient) -> AsyncIterator[Ca]:
    root = await load_or_create_root_secret(kube)
    cert = issue_server_cert(
        root.signer, common_name="istiod", dns_names=[], ip_addresses=["127.0.0.1"], now=time.time()
    )
    signer = CountingSigner(RootSigner(root))
    async with InformerPodIndex(kube) as index:
        service = CaService(KubeAuthenticator(kube), NodeAuthorizer(index, trust_domain=TD), signer)
        server = grpc.aio.server(options=GRPC_SERVER_OPTIONS)
        service.add_to_server(server)
        port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(cert.key_pem, cert.cert_pem)]))
        await server.start()
        async with asyncio.timeout(10):
            for _ in itertools.count():  # the node index is eventually consistent
                if index.find_pods_on_node((NODE, "prod", "backend")):
                    break
                await asyncio.sleep(0.02)
        try:
            yield Ca(f"127.0.0.1:{port}", root.root_pem, signer)
        finally:
            await server.stop(None)


def csr_for(namespace: str, sa: str) -> str:
    return make_csr(SpiffeId(TD, namespace, sa))[0].decode()


async def test_one_callers_flood_is_refused_beyond_its_burst_and_others_are_still_served(
    kube: KubeClient, ca: Ca
) -> None:
    token = await bound_token(kube, "apps", "app-1")
    csr = csr_for("apps", "app")
    started = time.monotonic()
    answers = await asyncio.gather(*(ca.call(token, csr) for _ in range(150)))
    elapsed = time.monotonic() - started
    exhausted = [a for a in answers if isinstance(a, grpc.aio.AioRpcError)]
    signed = len(answers) - len(exhausted)
    assert all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for e in exhausted)
    assert exhausted and signed <= 50 + 10 * elapsed + 1, (signed, elapsed)
    assert ca.signer.calls == signed
    other = await ca.call(await bound_token(kube, "prod", "backend-1"), csr_for("prod", "backend"))
    assert isinstance(other, ca_pb2.IstioCertificateResponse)  # buckets are per caller


async def test_a_huge_csr_is_refused_without_being_parsed(kube: KubeClient, ca: Ca) -> None:
    token = await bound_token(kube, "apps", "app-1")
    huge = await ca.call(token, "A" * 3_900_000)
    assert isinstance(huge, grpc.aio.AioRpcError) and huge.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    padded = await ca.call(token, csr_for("apps", "app") + " " * (100 * 1024))
    assert isinstance(padded, grpc.aio.AioRpcError) and padded.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "the limit is 65536" in (padded.details() or "")
    assert ca.signer.calls == 0


async def test_a_ztunnel_account_in_a_workload_namespace_may_not_impersonate(kube: KubeClient, ca: Ca) -> None:
    await kube.create(kinds.PODS, pod("fake-ztunnel", "apps", "ztunnel"))  # on the victim's node
    token = await bound_token(kube, "apps", "fake-ztunnel")
    backend = str(SpiffeId(TD, "prod", "backend"))
    answer = await ca.call(token, csr_for("prod", "backend"), impersonate=backend)
    assert isinstance(answer, grpc.aio.AioRpcError) and answer.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "backend" not in (answer.details() or "")
    assert ca.signer.calls == 0
    # The real node proxy of that node is granted it: the refusal is about the caller, not the target.
    real = await ca.call(
        await bound_token(kube, "istio-system", "ztunnel-1"), csr_for("prod", "backend"), impersonate=backend
    )
    assert isinstance(real, ca_pb2.IstioCertificateResponse)


# -- the node agent's /cmdadd -----------------------------------------------------------------------------------


class NoProxy:
    def __init__(self) -> None:
        self.added: list[str] = []

    async def add(self, pod_uid: str, netns_path: str, workload: dict[str, Any]) -> None:
        self.added.append(pod_uid)

    async def delete(self, pod_uid: str) -> None:
        pass


@pytest.fixture
def sandbox() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root (a real network namespace)")
    name = f"ambit-sec-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


async def post(socket_path: str, event: dict[str, Any]) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=socket_path)) as session,
        session.post("http://localhost/cmdadd", json=event) as response,
    ):
        return response.status, await response.text()


async def test_cmdadd_for_another_nodes_pod_or_the_hosts_netns_is_refused(
    kube: KubeClient, sandbox: str, tmp_path: Path
) -> None:
    await kube.patch(kinds.NAMESPACES, "apps", {"metadata": {"labels": {"istio.io/dataplane-mode": "ambient"}}})
    local = await kube.get(kinds.PODS, "app-1", "apps")
    remote = await kube.create(kinds.PODS, pod("app-2", "apps", "app", node="node-2"))
    sandboxes = {local["metadata"]["uid"]: f"/run/netns/{sandbox}"}
    recorder = EventRecorder(kube, EventRecorderSettings("ambit.dev/nodeagent", NODE))
    proxy, runner = NoProxy(), RecordingRunner()
    manager = EnrolmentManager(kube, recorder, runner, proxy, EnrolmentSettings(node_name=NODE))
    socket_path = str(tmp_path / "pluginevent.sock")
    agent = NodeAgent(
        kube,
        manager,
        NodeAgentSettings(node_name=NODE, socket_path=socket_path, retry_interval=60),
        lambda p: sandboxes.get(p["metadata"]["uid"]),
    )
    recorder.start()
    await agent.start()
    try:

        def event(p: dict[str, Any], netns: str) -> dict[str, Any]:
            meta = p["metadata"]
            return {"netns": netns, "podName": meta["name"], "podNamespace": "apps", "podUid": meta["uid"]}

        outside = ("not in a pod sandbox netns directory", "cannot be inspected")  # pid 1's may not be stat-able
        for attempt, why in [
            (event(remote, f"/run/netns/{sandbox}"), ("is on node node-2, not on this node node-1",)),
            (event(local, "/proc/1/ns/net"), outside),
            (event(local, f"/proc/{os.getpid()}/ns/net"), outside),
            (event(local, "/etc/hostname"), outside),
        ]:
            status, text = await post(socket_path, attempt)
            assert status == 403 and any(w in text for w in why), (status, text)
        assert proxy.added == [] and not any("nsenter" in c or "netns exec" in c for c in runner.commands)
        status, text = await post(socket_path, event(local, f"/var/run/netns/{sandbox}"))
        assert (status, proxy.added) == (200, [local["metadata"]["uid"]]), text
    finally:
        await agent.aclose()
        await recorder.aclose()
