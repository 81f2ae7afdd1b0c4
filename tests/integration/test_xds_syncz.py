"""The sync status over a real xDS server: a real node-proxy client shows SYNCED, a client that stops ACKing turns
STALE, and the debug type is served only to callers the control plane's rules allow (TokenReview and
SubjectAccessReview against a real embedded API server), without growing with a flood of requests."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest

import ambit
from ambit.api import discovery_pb2 as dpb
from ambit.apiserver.server import ApiServer
from ambit.cli.sync_status import parse_document, status_table
from ambit.controlplane.addresses import addresses
from ambit.controlplane.ca.authn import KubeAuthenticator
from ambit.controlplane.ca.errors import CaServerError
from ambit.controlplane.debug_access import DebugAccessChecker
from ambit.k8s import KubeClient, kinds
from ambit.k8s.kinds import ResourceKind
from ambit.model.localconfig import LocalConfig
from ambit.model.state import WorkloadState
from ambit.model.workload import Workload
from ambit.tls.certs import issue_server_cert, new_ca
from ambit.xds.callers import Caller
from ambit.xds.client import Backoff, XdsClient
from ambit.xds.convert import ADDRESS_TYPE_URL
from ambit.xds.server import XdsServer
from ambit.xds.session import METHOD, SERVICE_NAME
from ambit.xds.sync import SYNCZ_TYPE_URL
from ambit.xds.sync_client import SyncReadError, fetch_sync_document
from ambit.xds.table import AddressTable

SERVER_NAME = "istiod.istio-system.svc"
STALE_AFTER = 1.0
CLUSTER_ROLES = ResourceKind("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False)
CLUSTER_ROLE_BINDINGS = ResourceKind(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
)
ACCOUNTS = (("istio-system", "istiod"), ("istio-system", "ztunnel"), ("shop", "web"), ("ops", "reader"))


def _pod(name: str, ip: str) -> Workload:
    return Workload(
        uid=f"Kubernetes//Pod/shop/{name}", name=name, namespace="shop", addresses=(ipaddress.ip_address(ip),)
    )


def _resources(*pods: Workload) -> dict[str, Any]:
    return addresses(LocalConfig(tuple(pods), ()))


@dataclass
class Mesh:
    server: XdsServer
    table: AddressTable
    root_pem: bytes
    root_file: Path
    tokens: dict[str, str]
    client: KubeClient
    kubeconfig: Path

    async def syncz(self, account: str = "istio-system/istiod") -> dict[str, Any]:
        return await fetch_sync_document(
            f"127.0.0.1:{self.server.port}", root_pem=self.root_pem, token=self.tokens[account], server_name=SERVER_NAME
        )


@pytest.fixture
async def mesh(apiserver: ApiServer, tmp_path: Path) -> AsyncIterator[Mesh]:
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as client:
        existing = {n["metadata"]["name"] for n in (await client.list(kinds.NAMESPACES))[0]}
        tokens = {}
        for namespace in {ns for ns, _ in ACCOUNTS} - existing:
            await client.create(kinds.NAMESPACES, {"metadata": {"name": namespace}})
        for namespace, account in ACCOUNTS:
            await client.create(kinds.SERVICE_ACCOUNTS, {"metadata": {"name": account}}, namespace)
            issued = await client.create_token(namespace, account, ["istio-ca"], 3600)
            tokens[f"{namespace}/{account}"] = issued["status"]["token"]
        authenticator = KubeAuthenticator(client)

        async def authenticate(metadata: Any) -> Caller | None:
            try:
                who = await authenticator.authenticate(metadata)
            except CaServerError:
                return None
            return Caller(f"system:serviceaccount:{who.namespace}:{who.service_account}", "Kubernetes")

        now = time.time()
        ca = new_ca("test mesh root", now=now)
        serving = issue_server_cert(ca, common_name="istiod", dns_names=[SERVER_NAME], ip_addresses=[], now=now)
        (tmp_path / "root.pem").write_bytes(ca.cert_pem)
        table = AddressTable(_resources(_pod("web-1", "198.18.200.1")))
        server = XdsServer(
            table,
            authenticate,
            cert_chain_pem=serving.cert_pem + ca.cert_pem,
            key_pem=serving.key_pem,
            host="127.0.0.1",
            port=0,
            debug_access=DebugAccessChecker(client),
            control_plane="istiod-test",
            stale_after=STALE_AFTER,
        )
        await server.start()
        try:
            yield Mesh(server, table, ca.cert_pem, tmp_path / "root.pem", tokens, client, apiserver.kubeconfig)
        finally:
            await server.aclose(grace=1.0)


async def _until(condition: Callable[[], Any], what: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not in {within:.0f} s: {what}; last: {_LAST}")
        await asyncio.sleep(0.05)


def _status_of(document: dict[str, Any], node: str, type_url: str = ADDRESS_TYPE_URL) -> str | None:
    for client in document["clients"]:
        if client["node"] == node:
            entry = client["types"].get(type_url)
            return str(entry["status"]) if entry else "NOT SENT"
    return None


class RawStream:
    """A delta ADS client under the test's control: it writes what it is told and reads only when asked."""

    def __init__(self, mesh: Mesh, token: str) -> None:
        credentials = grpc.ssl_channel_credentials(root_certificates=mesh.root_pem)
        options = [("grpc.ssl_target_name_override", SERVER_NAME)]
        self.channel = grpc.aio.secure_channel(f"127.0.0.1:{mesh.server.port}", credentials, options)
        self.call = self.channel.stream_stream(
            f"/{SERVICE_NAME}/{METHOD}",
            request_serializer=dpb.DeltaDiscoveryRequest.SerializeToString,
            response_deserializer=dpb.DeltaDiscoveryResponse.FromString,
        )(metadata=(("authorization", f"Bearer {token}"),))

    async def send(self, request: dpb.DeltaDiscoveryRequest) -> None:
        await self.call.write(request)

    async def read(self) -> dpb.DeltaDiscoveryResponse:
        async with asyncio.timeout(10):
            response = await self.call.read()
        assert response is not grpc.aio.EOF
        return response

    async def aclose(self) -> None:
        self.call.cancel()
        await self.channel.close()


async def test_a_node_proxy_shows_synced_and_a_client_that_stops_acking_turns_stale(mesh: Mesh, tmp_path: Path) -> None:
    token_file = tmp_path / "ztunnel.token"
    token_file.write_text(mesh.tokens["istio-system/ztunnel"])
    node = XdsClient(
        f"127.0.0.1:{mesh.server.port}",
        WorkloadState(),
        lambda: None,
        root_cert_file=mesh.root_file,
        token_file=token_file,
        cluster_id="Kubernetes",
        node_id="node-a",
        server_name=SERVER_NAME,
        backoff=Backoff(initial=0.05, maximum=0.3),
    )
    stuck = RawStream(mesh, mesh.tokens["istio-system/ztunnel"])
    await node.start()
    try:
        await _until(lambda: _async(_status_of, mesh, "node-a", expect="SYNCED"), "node-a SYNCED in the sync document")
        await stuck.send(dpb.DeltaDiscoveryRequest(type_url=ADDRESS_TYPE_URL, node=dpb.Node(id="node-stuck")))
        first = await stuck.read()
        await stuck.send(dpb.DeltaDiscoveryRequest(type_url=ADDRESS_TYPE_URL, response_nonce=first.nonce))
        await _until(lambda: _async(_status_of, mesh, "node-stuck", expect="SYNCED"), "node-stuck SYNCED")

        # A change is pushed to both; node-a ACKs it, node-stuck never reads or answers it.
        blocked_at = time.monotonic()
        mesh.table.replace(_resources(_pod("web-1", "198.18.200.1"), _pod("web-2", "198.18.200.2")))
        await _until(lambda: _async(_status_of, mesh, "node-stuck", expect="STALE"), "node-stuck STALE")
        stale_after = time.monotonic() - blocked_at
        document = await mesh.syncz()
        assert _status_of(document, "node-a") == "SYNCED"
        headers, rows = status_table(parse_document(document))
        by_name = {row[0]: dict(zip(headers, row, strict=True)) for row in rows}
        assert by_name["node-a"]["ADDRESSES"].startswith("SYNCED (")
        assert by_name["node-stuck"]["ADDRESSES"].startswith("STALE (")
        assert by_name["node-a"]["ISTIOD"] == "istiod-test" and by_name["node-a"]["CLUSTER"] == "Kubernetes"
        assert by_name["node-a"]["VERSION"] == ambit.ISTIO_VERSION  # the node's ISTIO_VERSION metadata
        assert by_name["node-stuck"]["VERSION"] == "-"  # a client that states no version
        print(f"\nnode-stuck turned STALE {stale_after:.2f} s after the push (stale_after {STALE_AFTER} s)")
        assert stale_after >= STALE_AFTER
    finally:
        await stuck.aclose()
        await node.aclose()
    await _until(lambda: _async(lambda d, *_: not d["clients"], mesh), "records dropped after the streams ended")


_LAST: list[Any] = []


async def _async(check: Callable[..., Any], mesh: Mesh, node: str = "", *, expect: str = "") -> bool:
    document = await mesh.syncz()
    _LAST[:] = [document]
    if expect:
        return bool(check(document, node) == expect)
    return bool(check(document))


async def test_the_proxy_status_command_mints_a_token_with_the_kubeconfig_and_prints_the_table(
    mesh: Mesh, tmp_path: Path
) -> None:
    stream = RawStream(mesh, mesh.tokens["istio-system/ztunnel"])
    try:
        await stream.send(dpb.DeltaDiscoveryRequest(type_url=ADDRESS_TYPE_URL, node=dpb.Node(id="node-cli")))
        first = await stream.read()
        await stream.send(dpb.DeltaDiscoveryRequest(type_url=ADDRESS_TYPE_URL, response_nonce=first.nonce))
        await _until(lambda: _async(_status_of, mesh, "node-cli", expect="SYNCED"), "node-cli SYNCED")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "ambit.cli",
            "proxy-status",
            "--kubeconfig",
            str(mesh.kubeconfig),
            "--xds-address",
            f"127.0.0.1:{mesh.server.port}",
            "--root-cert",
            str(mesh.root_file),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "COLUMNS": "200"},
        )
        async with asyncio.timeout(60):
            out, err = await proc.communicate()
    finally:
        await stream.aclose()
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[0].split() == ["NAME", "CLUSTER", "ISTIOD", "VERSION", "ADDRESSES", "LAST", "PUSH"]
    assert lines[1].split()[:5] == ["node-cli", "Kubernetes", "istiod-test", "-", "SYNCED"]


async def test_only_the_control_planes_account_and_accounts_rbac_allows_read_the_sync_status(mesh: Mesh) -> None:
    for account in ("shop/web", "istio-system/ztunnel", "ops/reader"):
        with pytest.raises(SyncReadError, match="may not read the sync status"):
            await mesh.syncz(account)
    with pytest.raises(SyncReadError, match="refused the token"):
        await fetch_sync_document(
            f"127.0.0.1:{mesh.server.port}", root_pem=mesh.root_pem, token="forged", server_name=SERVER_NAME
        )
    assert mesh.server.service.stats.debug_answers == 0 and mesh.server.service.stats.debug_refused == 3

    await mesh.client.create(
        CLUSTER_ROLES,
        {"metadata": {"name": "syncz-reader"}, "rules": [{"verbs": ["get"], "nonResourceURLs": ["/debug/syncz"]}]},
    )
    await mesh.client.create(
        CLUSTER_ROLE_BINDINGS,
        {
            "metadata": {"name": "syncz-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "syncz-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "ops"}],
        },
    )
    assert (await mesh.syncz("ops/reader"))["controlPlane"] == "istiod-test"
    assert (await mesh.syncz("istio-system/istiod"))["clients"] == []
    with pytest.raises(SyncReadError, match="may not read the sync status"):
        await mesh.syncz("shop/web")


async def test_a_refused_debug_request_on_a_proxy_stream_ends_that_stream_and_its_record(mesh: Mesh) -> None:
    stream = RawStream(mesh, mesh.tokens["shop/web"])
    try:
        await stream.send(dpb.DeltaDiscoveryRequest(type_url=ADDRESS_TYPE_URL, node=dpb.Node(id="web")))
        await stream.read()
        assert _status_of(await mesh.syncz(), "web") == "PENDING"
        await stream.send(dpb.DeltaDiscoveryRequest(type_url=SYNCZ_TYPE_URL))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async with asyncio.timeout(10):
                while (await stream.call.read()) is not grpc.aio.EOF:
                    pass
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await stream.aclose()
    await _until(lambda: _async(lambda d, *_: not d["clients"], mesh), "the refused stream's record dropped")


FLOOD_REQUESTS = 500
FLOOD_STREAMS = 50
FLOOD_BOUND = 1024 * 1024
"""Python heap the server may keep after the flood (bytes): the registry holds nothing for debug streams."""


async def test_a_flood_of_debug_requests_does_not_grow_the_servers_state(mesh: Mesh) -> None:
    proxy = RawStream(mesh, mesh.tokens["istio-system/ztunnel"])
    await proxy.send(dpb.DeltaDiscoveryRequest(type_url=ADDRESS_TYPE_URL, node=dpb.Node(id="node-a")))
    await proxy.read()
    service = mesh.server.service
    await mesh.syncz()  # warm caches (gRPC, TokenReview path) before measuring
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        admin = RawStream(mesh, mesh.tokens["istio-system/istiod"])
        started = time.monotonic()
        for _ in range(FLOOD_REQUESTS):
            await admin.send(dpb.DeltaDiscoveryRequest(type_url=SYNCZ_TYPE_URL))
            assert (await admin.read()).resources[0].name == "syncz"
        elapsed = time.monotonic() - started
        await admin.aclose()
        for _ in range(FLOOD_STREAMS):
            with pytest.raises(SyncReadError):
                await mesh.syncz("shop/web")
        await _until(lambda: _async(lambda d, *_: len(d["clients"]) == 1, mesh), "only the proxy has a record")
        await _until(_clients_settled(service, 1), "debug streams gone from the server")
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
        await proxy.aclose()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    print(
        f"\n{FLOOD_REQUESTS} debug answers in {elapsed:.2f} s ({FLOOD_REQUESTS / elapsed:.0f}/s) and "
        f"{FLOOD_STREAMS} refused streams: Python heap grew {grown / 1024:.0f} KiB (bound {FLOOD_BOUND // 1024} KiB)"
    )
    assert len(service.sync) <= 1 and service.stats.debug_refused == FLOOD_STREAMS
    assert grown < FLOOD_BOUND


def _clients_settled(service: Any, count: int) -> Callable[[], Any]:
    async def check() -> bool:
        return len(service.clients) <= count

    return check


async def test_a_client_naming_made_up_types_gets_no_entries_for_them(mesh: Mesh) -> None:
    stream = RawStream(mesh, mesh.tokens["istio-system/ztunnel"])
    try:
        await stream.send(dpb.DeltaDiscoveryRequest(type_url=ADDRESS_TYPE_URL, node=dpb.Node(id="node-x" * 1000)))
        await stream.read()
        for index in range(100):
            await stream.send(dpb.DeltaDiscoveryRequest(type_url=f"type.googleapis.com/made.Up{index}"))
            await stream.read()
        (client,) = (await mesh.syncz())["clients"]
        assert list(client["types"]) == [ADDRESS_TYPE_URL] and len(client["node"]) == 256
    finally:
        await stream.aclose()
